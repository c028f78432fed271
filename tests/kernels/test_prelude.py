"""The C kernels' shared prelude (kernels/prelude.h): put into each source that includes it,
hashed with it (a changed prelude builds every kernel anew), and the one home of dl_expf;
and the one table of the dtypes the kernels are compiled for (kernels/compiled.py)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

import dynlab.kernels.compiled as compiled

ROOT = Path(__file__).resolve().parents[2]


def test_the_include_line_is_replaced_by_the_prelude_and_nothing_else_changes():
    src = 'int a;\n#include "dl_prelude.h"  /* shared */\nint b;\n'
    out = compiled.kernel_source(src)
    assert out == "int a;\n" + compiled.PRELUDE_SOURCE.rstrip("\n") + "\nint b;\n"
    assert compiled.kernel_source("int a;\n") == "int a;\n"  # no include: unchanged


def test_a_changed_prelude_changes_the_library_file_name(monkeypatch):
    src = '#include "dl_prelude.h"\nfloat f(float x) { return dl_expf(x); }\n'
    before = compiled.library_file_name("probe", src, cc="cc")
    monkeypatch.setattr(compiled, "PRELUDE_SOURCE", compiled.PRELUDE_SOURCE + "/* changed */\n")
    assert compiled.library_file_name("probe", src, cc="cc") != before
    plain = "float f(float x) { return x; }\n"  # a kernel without the prelude keeps its name
    name = compiled.library_file_name("probe", plain, cc="cc")
    monkeypatch.undo()
    assert compiled.library_file_name("probe", plain, cc="cc") == name


def test_dl_expf_has_one_home():
    sources = sorted(p for p in (ROOT / "kernels").rglob("*.c"))
    defining = [p.name for p in sources if "static inline float dl_expf" in p.read_text()]
    users = [p.name for p in sources if compiled.PRELUDE_INCLUDE in p.read_text()]
    assert defining == [] and len(users) >= 4, (defining, users)
    assert "static inline float dl_expf" in (ROOT / "kernels" / "prelude.h").read_text()


def test_typed_library_sets_each_signature_for_every_suffix(tmp_path, monkeypatch):
    if compiled.compiler() is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    src = ("double dl_probe_f32(long long n, double x) { return n * x; }\n"
           "double dl_probe_f64(long long n, double x) { return n + x; }\n")
    sig = {"dl_probe_{suf}": ([ctypes.c_int64, ctypes.c_double], ctypes.c_double)}
    lib = compiled.typed_library("typed_probe", src, sig)
    assert lib is not None
    # without the signature ctypes would pass 2.5 as an int and read the result as an int
    assert lib.dl_probe_f32(3, 2.5) == 7.5 and lib.dl_probe_f64(3, 2.5) == 5.5
    assert compiled.typed_library("typed_probe", src, sig) is lib  # loaded and typed once


def test_a_kernel_call_does_not_expand_and_hash_its_source_again(monkeypatch):
    """The library of a source is looked up by a key made once per process: expanding and
    hashing the source on every call cost a training step of a small LM stack about 7 %.
    A changed prelude is another key (the library is built anew)."""
    src = '#include "dl_prelude.h"\nfloat probe_key(float x) { return dl_expf(x); }\n'
    calls = []
    real = compiled.kernel_source
    monkeypatch.setattr(compiled, "kernel_source", lambda s: calls.append(1) or real(s))
    first = compiled._process_key("probe-key", src)
    for _ in range(5):
        assert compiled._process_key("probe-key", src) == first
    assert len(calls) == 1
    monkeypatch.setattr(compiled, "PRELUDE_SOURCE", compiled.PRELUDE_SOURCE + "/* changed */\n")
    assert compiled._process_key("probe-key", src) != first and len(calls) == 2


def test_c_suffix_names_the_compiled_dtypes_and_other_dtypes_take_the_torch_path():
    """One table of the dtypes the C loops are built for: float32 and float64. Any other dtype
    (here bfloat16) runs each op's torch form, which equals its reference (to bfloat16's
    tolerance: the two sum in their own ways)."""
    import torch

    from dynlab.kernels.compiled import C_SUFFIXES, c_suffix
    from dynlab.kernels.cross_entropy import token_nll, token_nll_ref
    from dynlab.kernels.gated_norm import gated_rms_norm, gated_rms_norm_ref
    from dynlab.kernels.short_conv import causal_conv_silu, causal_conv_silu_ref

    assert (c_suffix(torch.float32), c_suffix(torch.float64)) == ("f32", "f64")
    assert c_suffix(torch.bfloat16) is None and c_suffix(torch.int64) is None and len(C_SUFFIXES) == 2
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=g).to(torch.bfloat16) for s in ((2, 3, 6, 5), (2, 4, 5), (2, 5)))
    torch.testing.assert_close(causal_conv_silu(x, w, b, None), causal_conv_silu_ref(x, w, b, None))  # bf16 tolerance
    y, z = (torch.randn(2, 3, 4, 8, generator=g).to(torch.bfloat16) for _ in range(2))
    nw = torch.randn(2, 8, generator=g).to(torch.bfloat16)
    assert torch.equal(gated_rms_norm(y, z, nw, 1e-6), gated_rms_norm_ref(y, z, nw, 1e-6))
    logits, targets = torch.randn(7, 11, generator=g).to(torch.bfloat16), torch.randint(0, 11, (7,), generator=g)
    assert torch.equal(token_nll(logits, targets), token_nll_ref(logits, targets))
