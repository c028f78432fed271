"""Small C kernels for the CPU, compiled on first use and loaded with ``ctypes``.

Why ``ctypes`` and not ``torch.utils.cpp_extension.load_inline``: measured on the 2-core
test machine, ``load_inline`` takes about 40 s to build even a one-line extension (it
compiles against torch's C++ headers and needs a C++ compiler and ninja), so the three
kernels would cost about two minutes on every CI run with a cold cache, where ``cc`` builds
all three here in about 1.3 s (0.2, 0.4 and 0.7 s) and needs only a C compiler.  The
kernels take raw pointers and sizes, which ``ctypes`` passes without any C++ glue.

Some CPU loops cannot be made fast from Python: a recurrence over time whose every step
is a handful of elementwise operations on cache-sized slices spends its time in per-op
dispatch and in re-reading those slices once per torch operation.  A few dozen lines of C
do the whole step in one pass.  :func:`c_library` builds such a source into a shared
library the first time a process asks for it and caches the file:

- where: ``$XDG_CACHE_HOME/dynlab/kernels`` (default ``~/.cache``), else a private
  directory under the system temp directory; a directory that another user owns or
  others can write to is refused (a library planted there would be loaded);
- shared code: a source line ``#include "dl_prelude.h"`` is replaced by the text of
  ``kernels/prelude.h`` (:data:`PRELUDE_SOURCE`: the float32 ``dl_expf`` and friends that
  several kernels use) before the source is hashed and compiled (:func:`kernel_source`), so
  the build needs no include path and a changed prelude rebuilds every kernel that uses it;
- the file name carries a hash of the source, the flags, the compiler and the CPU model,
  so a changed kernel or machine builds anew; the build writes to a temporary name and
  renames it (atomic), so concurrent processes (Dask workers) never load a half file;
- compiler: ``$CC``, else ``cc``, ``gcc`` or ``clang``; ``-O3 -march=native`` (retried
  without ``-march=native`` where the compiler refuses it) and no contraction of multiply-adds
  (:data:`FLAGS`);
- no compiler, a failed build or ``DYNLAB_C_KERNELS=0``: ``None``, and every caller keeps a
  pure-torch path that computes the same function (tests run both).  A failed build (a
  compiler that runs and fails) warns once per process (:class:`CKernelWarning`, with the
  compiler's message); no compiler at all and ``DYNLAB_C_KERNELS=0`` are silent (the torch
  loops are the documented path there; :func:`c_library_status` says why).
- provenance: :func:`c_kernels_used` says, per library asked for in this process, whether
  the compiled loops ran (``compiled``) or the torch loops (``disabled`` /
  ``unavailable: <why>``); :func:`record_c_kernels` collects the same for one block of work,
  and :func:`compiler` names the compiler and its version.

Every kernel that uses this module is tested against its torch path and its autograd
reference.  This module imports nothing beyond the standard library (:func:`as_rows` uses
only a tensor's own methods).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import stat
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["C_KERNELS_ENV", "C_SUFFIXES", "PRELUDE_INCLUDE", "PRELUDE_SOURCE", "CKernelWarning", "CompileError",
           "as_rows", "c_kernels_used", "c_library", "c_library_status", "c_suffix", "common_dtype", "compiler",
           "kernel_source", "library_file_name", "promoted", "record_c_kernels", "typed_library"]

#: Environment variable: ``0`` turns every compiled kernel off (the torch paths run).
C_KERNELS_ENV = "DYNLAB_C_KERNELS"

#: The line of a kernel source that :func:`kernel_source` replaces by :data:`PRELUDE_SOURCE`.
PRELUDE_INCLUDE = '#include "dl_prelude.h"'

#: The shared prelude of the kernels (``kernels/prelude.h``), read once at import.
PRELUDE_SOURCE = (Path(__file__).parent / "prelude.h").read_text(encoding="utf-8")

#: The dtypes the C kernels are compiled for, by name, and their functions' suffix.
C_SUFFIXES = {"torch.float32": "f32", "torch.float64": "f64"}

#: ``-ffp-contract=off``: no compiler fuses a multiply and an add on its own (GCC does not in
#: ISO C mode, clang would by default), so every product is rounded as the loops are written
#: and ``fma()`` is fused only where a kernel calls it (the AdamW moments, as torch's).
FLAGS = ("-O3", "-fno-trapping-math", "-ffp-contract=off", "-fopenmp-simd", "-std=c99", "-fPIC", "-shared")

_LOADED: dict[str, tuple[ctypes.CDLL | None, str]] = {}
_LOCK = threading.Lock()
_WARNED: list[bool] = [False]

# per library: [0] what ran in this whole process, then one per active record_c_kernels()
_USED: list[dict[str, str]] = [{}]


class CKernelWarning(RuntimeWarning):
    """A compiled kernel could not be built: the torch loops run instead (same numbers, slower)."""


class CompileError(RuntimeError):
    """The compiler ran and failed (its message is the exception's)."""


def _note(name: str, status: str) -> None:
    for seen in _USED:
        seen[name] = status


def c_kernels_used() -> dict[str, str]:
    """Per library asked for in this process: ``"compiled"`` (the C loops ran),
    ``"disabled"`` (``DYNLAB_C_KERNELS=0``) or ``"unavailable: <why>"`` (the torch loops ran)."""
    return dict(sorted(_USED[0].items()))


@contextmanager
def record_c_kernels() -> Iterator[dict[str, str]]:
    """Within the block, collect into the yielded dict what :func:`c_kernels_used` reports."""
    seen: dict[str, str] = {}
    _USED.append(seen)
    try:
        yield seen
    finally:
        _USED[:] = [d for d in _USED if d is not seen]  # by identity: two recordings may hold equal dicts


def kernel_source(source: str) -> str:
    """``source`` with each line that is exactly :data:`PRELUDE_INCLUDE` (after stripping
    spaces and a trailing comment) replaced by :data:`PRELUDE_SOURCE`: the text that is
    hashed and compiled."""
    lines = source.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.split("/*", 1)[0].strip() == PRELUDE_INCLUDE:
            lines[i] = PRELUDE_SOURCE if PRELUDE_SOURCE.endswith("\n") else PRELUDE_SOURCE + "\n"
    return "".join(lines)


#: (name, source, prelude) -> the key of its library in ``_LOADED``: the expanded source is hashed
#: once per process, not on every kernel call (a training step calls the kernels dozens of
#: times, and expanding and hashing a source takes about 0.1 ms).
_KEYS: dict[tuple[str, str, str], str] = {}


def _process_key(name: str, source: str) -> str:
    memo = (name, source, PRELUDE_SOURCE)  # str hashes are cached: a lookup costs no pass over the text
    key = _KEYS.get(memo)
    if key is None:
        key = _KEYS[memo] = f"{name}:{hashlib.sha256(kernel_source(source).encode()).hexdigest()}"
    return key


def c_library(name: str, source: str) -> ctypes.CDLL | None:
    """The library built from C ``source`` (cached per process and on disk), or None when
    compiled kernels are off or it cannot be built (:func:`c_library_status` says why; the
    first failed build of the process warns, :class:`CKernelWarning`).  ``source`` may
    include the shared prelude (:func:`kernel_source`)."""
    if os.environ.get(C_KERNELS_ENV, "1") == "0":
        _note(name, "disabled")
        return None
    key = _process_key(name, source)
    if key not in _LOADED:
        with _LOCK:
            if key not in _LOADED:
                try:
                    path = _build(name, source)
                    _LOADED[key] = (ctypes.CDLL(str(path)), f"compiled: {path}")
                except Exception as err:  # noqa: BLE001 - no compiler, read-only disk, ...: torch takes over
                    _LOADED[key] = (None, f"unavailable: {type(err).__name__}: {err}")
                    if isinstance(err, CompileError) and not _WARNED[0]:
                        _WARNED[0] = True
                        warnings.warn(f"dynlab: the C kernel {name!r} could not be built, the torch loops run instead "
                                      f"(same numbers, slower): {err}", CKernelWarning, stacklevel=2)
    lib, status = _LOADED[key]
    _note(name, "compiled" if lib is not None else status)
    return lib


_TYPED: set[int] = set()  # ids of the loaded libraries whose function signatures are set


def typed_library(name: str, source: str, signatures: dict[str, tuple[list, object]],
                  suffixes: tuple[str, ...] = tuple(C_SUFFIXES.values())) -> ctypes.CDLL | None:
    """:func:`c_library` with the ctypes signature of each of its functions set, once per
    loaded library: ``signatures`` maps a function name holding ``{suf}`` to
    ``(argtypes, restype)``, set for every dtype suffix in ``suffixes``."""
    lib = c_library(name, source)
    if lib is not None and id(lib) not in _TYPED:
        with _LOCK:
            for template, (argtypes, restype) in signatures.items():
                for suf in suffixes:
                    fn = getattr(lib, template.format(suf=suf))
                    fn.argtypes, fn.restype = list(argtypes), restype
            _TYPED.add(id(lib))
    return lib


def _compiler_command() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


_COMPILER: dict[str, str | None] = {}


def compiler() -> str | None:
    """The C compiler the kernels are built with and the first line of its ``--version``
    (``"cc: gcc (Debian 12.2.0-14) 12.2.0"``), or None when there is none."""
    cc = _compiler_command()
    if cc is None:
        return None
    if cc not in _COMPILER:
        try:
            res = subprocess.run([*shlex.split(cc), "--version"], capture_output=True, text=True, timeout=30)
            first = (res.stdout.strip().splitlines() or res.stderr.strip().splitlines() or [""])[0]
            _COMPILER[cc] = f"{cc}: {first}" if res.returncode == 0 and first else f"{cc}: (no version: exit {res.returncode})"
        except (OSError, ValueError, subprocess.SubprocessError) as err:
            _COMPILER[cc] = f"{cc}: (does not run: {type(err).__name__})"
    return _COMPILER[cc]


def c_library_status(name: str, source: str) -> str:
    """``"compiled: <path>"``, ``"disabled: DYNLAB_C_KERNELS=0"`` or ``"unavailable: <why>"``."""
    if os.environ.get(C_KERNELS_ENV, "1") == "0":
        return f"disabled: {C_KERNELS_ENV}=0"
    c_library(name, source)
    return _LOADED[_process_key(name, source)][1]


#: /proc/cpuinfo lines that identify what ``-march=native`` compiles for (x86: model and
#: feature flags; ARM: implementer, part and features).
_CPU_KEYS = ("model name", "flags", "Features", "CPU implementer", "CPU architecture", "CPU part")


def _cpu_model() -> str:
    """The CPU's identifying lines (first processor), so that a library built with
    ``-march=native`` on one machine is never loaded on another with other features (a
    cache shared by a cluster's nodes)."""
    try:
        seen: dict[str, str] = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key = line.split(":", 1)[0].strip()
            if key in _CPU_KEYS and key not in seen:
                seen[key] = line
        if seen:
            return "\n".join(seen[k] for k in sorted(seen))
    except OSError:
        pass
    return f"{platform.processor()} {platform.node()}"  # unknown features: one cache entry per host


def _roots() -> list[Path]:
    uid = os.getuid() if hasattr(os, "getuid") else 0
    roots = []
    try:  # no HOME and no passwd entry (a container with an arbitrary uid): the temp root only
        roots.append(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dynlab" / "kernels")
    except RuntimeError:
        pass
    return [*roots, Path(tempfile.gettempdir()) / f"dynlab-kernels-{uid}"]


def library_file_name(name: str, source: str, cc: str | None = None) -> str:
    """The cache file name of the library built from ``source`` (prelude included) with
    compiler ``cc`` (None: the one :func:`c_library` would use) on this machine."""
    cc = cc or _compiler_command() or ""
    key = hashlib.sha256("\0".join([kernel_source(source), *FLAGS, cc, platform.machine(), _cpu_model()]).encode())
    return f"{name}_{key.hexdigest()[:20]}.so"


def _build(name: str, source: str) -> Path:
    """Build ``source`` (its prelude put in, :func:`kernel_source`) into the cache, or find it there."""
    cc = _compiler_command()
    if cc is None:
        raise RuntimeError("no C compiler found (CC, cc, gcc, clang)")
    lib = library_file_name(name, source, cc)
    errors = []
    for root in _roots():
        try:
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
            _check_private(root)
            if (root / lib).is_file():
                return root / lib
            with tempfile.TemporaryDirectory(dir=root) as tmp:
                src, out = Path(tmp) / f"{name}.c", Path(tmp) / lib
                src.write_text(kernel_source(source))
                for arch in (["-march=native"], []):  # some compilers and targets lack -march=native
                    res = subprocess.run([*shlex.split(cc), *FLAGS, *arch, "-o", str(out), str(src), "-lm"],
                                         capture_output=True, text=True, timeout=300)
                    if res.returncode == 0:
                        break
                else:
                    said = (res.stderr.strip().splitlines() or res.stdout.strip().splitlines() or ["no message"])[-1]
                    raise CompileError(f"{cc} failed (exit {res.returncode}): {said}")
                os.replace(out, root / lib)  # atomic: concurrent builders each write their own copy
            return root / lib
        except (OSError, subprocess.SubprocessError) as err:
            errors.append(f"{root}: {err}")
    raise RuntimeError("; ".join(errors))


def _check_private(root: Path) -> None:
    """Refuse a directory that another user owns or others can write to, or a symlink
    (which could be re-pointed after this check)."""
    st = os.lstat(root)
    if stat.S_ISLNK(st.st_mode):
        raise PermissionError(f"{root} is a symlink, not a private directory of this user")
    if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & 0o022):
        raise PermissionError(f"{root} is not a private directory of this user")


def c_suffix(dtype) -> str | None:
    """The suffix of a C kernel's functions for a tensor ``dtype`` (``"f32"``, ``"f64"``),
    or None where no C loop exists for it (the torch path runs)."""
    return C_SUFFIXES.get(str(dtype))


def common_dtype(*xs):
    """torch's promoted dtype of the tensors among ``xs`` (None entries are skipped): the one
    dtype in which every form of a scan (reference, torch, C) computes mixed inputs, such as
    float32 inputs with a float64 initial state, and by which ``dispatch`` picks its backend."""
    import torch  # here, so that importing this module does not load torch

    dtype = None
    for x in xs:
        if x is not None:
            dtype = x.dtype if dtype is None else torch.promote_types(dtype, x.dtype)
    return dtype


def promoted(*xs):
    """``xs`` (tensors, or None) cast to :func:`common_dtype` of them (a tensor already of
    that dtype is returned as it is)."""
    dtype = common_dtype(*xs)
    return tuple(None if x is None else x.to(dtype) for x in xs)


def data_pointer(x):
    """A tensor's address for a C kernel's pointer argument; None (a null pointer) for None."""
    return None if x is None else x.data_ptr()


def as_rows(x):
    """``(x or a contiguous copy, row stride)`` for a C kernel that reads a tensor as rows:
    element ``(..., d)`` of the result lies at ``data_ptr + (flat row index) · stride + d``.
    A tensor whose last dim is contiguous and whose rows are evenly spaced (a slice of a
    wider last dim, as ``torch.split`` of a linear layer's output gives) is passed as it is;
    anything else is copied to a contiguous tensor (row stride = last dim)."""
    if x.dim() >= 2 and x.stride(-1) == 1 and x.stride(-2) >= x.shape[-1]:
        ld = want = x.stride(-2)
        for i in range(x.dim() - 2, -1, -1):
            if x.shape[i] > 1 and x.stride(i) != want:
                break
            want *= x.shape[i]
        else:
            return x, ld
    x = x.contiguous()
    return x, x.shape[-1]
