"""Run mamba-ssm's own Triton SSD kernel (``mamba_chunk_scan_combined``, forward and
backward) on the CPU under Triton's interpreter, through dynlab's adapter, and print the
largest differences from dynlab's torch SSD as JSON. Run in a fresh process with
``TRITON_INTERPRET=1`` (the interpreter is chosen when triton is imported) and
``DYNLAB_MAMBA_REF`` set to an unpacked mamba-ssm source distribution
(``benchmarks/fetch_mamba_ref.sh``); used by ``tests/kernels/test_library_interpreted.py``.

mamba-ssm's package imports its CUDA extension and asks the CUDA runtime for a device
context and the number of SMs; those three are stubbed here (the extension is not used by
the SSD kernels), and its autotuners keep their first configuration (the interpreter cannot
time kernels). Nothing else of the library is changed."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import types

import torch
import triton.runtime.autotuner as autotuner

sys.modules["selective_scan_cuda"] = types.ModuleType("selective_scan_cuda")
torch.cuda.device = lambda *a, **k: contextlib.nullcontext()
torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(multi_processor_count=4)
_init = autotuner.Autotuner.__init__
autotuner.Autotuner.__init__ = lambda self, fn, names, configs, *a, **k: _init(self, fn, names, configs[:1], *a, **k)
sys.path.insert(0, os.environ["DYNLAB_MAMBA_REF"])

from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined  # noqa: E402

from dynlab.kernels import dispatch  # noqa: E402
from dynlab.kernels.ssd.chunked import ssd_chunked  # noqa: E402


def main() -> None:
    dispatch._LIBS["mamba_ssm"] = {"ssd": mamba_chunk_scan_combined}
    g = torch.Generator().manual_seed(0)
    b, t, h, p, n = 2, 40, 2, 8, 8  # T not a multiple of the chunk
    x = torch.randn(b, t, h, p, generator=g)
    dt = torch.nn.functional.softplus(torch.randn(b, t, h, generator=g) - 1)
    A = -torch.exp(torch.randn(h, generator=g))
    B, C = torch.randn(b, t, h, n, generator=g), torch.randn(b, t, h, n, generator=g)
    h0 = torch.randn(b, h, p, n, generator=g)
    w, wf = torch.randn(b, t, h, p, generator=g), torch.randn(b, h, p, n, generator=g)
    out = {}
    for name, fn in (("mamba", dispatch._ssd_mamba), ("dynlab", ssd_chunked)):
        leaves = [z.clone().requires_grad_() for z in (x, dt, A, B, C, h0)]
        y, final = fn(*leaves, True, chunk_size=16)
        grads = torch.autograd.grad((y * w).sum() + (final * wf).sum(), leaves)
        out[name] = [y, final, *grads]
    names = ["y", "final", "dx", "ddt", "dA", "dB", "dC", "dh0"]
    print(json.dumps({k: [float((a - r).abs().max()), float(r.abs().max())]
                      for k, a, r in zip(names, out["mamba"], out["dynlab"])}))


if __name__ == "__main__":
    main()
