"""dynlab's kernels, one folder per op; they import torch (and Triton on use), never dynlab.

- ``scan/`` — the linear (diagonal) scan and the dense RNN scan;
- ``ssd/`` — Mamba-2's state-space duality scan; for the LM stacks on the CPU also its
  single-chunk C loops (``ssd_chunk.c``) and the mixer between its projections as one op,
  whose ``mixer_inner.c`` runs the convolution's, the scan's and the norm's loops block by
  block of sequences;
- ``gla/`` — gated linear attention (and the Triton selective scan, which shares its kernel);
- ``selective_scan/`` — Mamba-1's selective scan, with its C loops (``selective_scan.c``);
- ``tracker_loss/`` — the fused tracker losses (dense, gated, diagonal; ``diagonal.c``);
- ``short_conv/``, ``gated_norm/``, ``cross_entropy/`` — the LM stacks' fused short
  convolution + SiLU, gated RMSNorm and per-token cross-entropy, each with its C loops
  (``short_conv.c``, ``gated_norm.c``, ``cross_entropy.c``) and autograd reference.

Each op folder holds its pure-torch reference (``*_ref``) and torch path (``chunked.py``, or
one module per kind), its Triton kernel (``triton.py``) and its C loop (a ``.c`` file).
Beside them: :mod:`.dispatch` (the backend of each op by device), :mod:`.compiled` (builds
the C sources on first use; :func:`~.compiled.as_rows`, the row layouts they read in place),
:mod:`.first_order` (the guard of every hand-written backward: a second derivative through
one raises instead of coming out silently wrong) and :mod:`.fast_tanh` (the float32 tanh of
the dense kernels, ``fast_tanh.c``).
"""
