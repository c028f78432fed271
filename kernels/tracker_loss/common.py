"""What the fused tracker losses share (:mod:`.dense`, :mod:`.gated`, and the
readout, token bookkeeping, buffers and stack threads also :mod:`.diagonal`).

The dense kernels train a one-layer dense RNN tracker with a linear readout from a zero
initial state, many models at once (a leading model dimension N on every argument), and
differ only in the recurrence.  Shared here:

- the front and back of the public functions (:func:`fused_call`): ``phi`` and shape
  checks (:func:`check_shapes`), the model dimension added for a single model, one dtype
  for every parameter, tokens and labels made time-major ``[N, T, B]``, zero loss and zero
  hits when there are no positions;
- the token bookkeeping: :func:`token_rows` (gather index of each position in the stacked
  per-token tables) and :func:`table_grad` (the matching ``index_add_`` backward);
- the readout and loss: :func:`readout_ce` (logits ``W h_t + c`` in class-major layout
  ``[N, C, T·B]``, summed cross-entropy over valid positions, argmax hits) and
  :func:`readout_ce_grad` (∂L/∂z = softmax − one-hot, ∂L/∂W, ∂L/∂c);
- the scratch-buffer cache :data:`BUFFERS` (state buffers handed from a finished backward
  pass to the next forward pass on the CPU);
- the members of a stack run one at a time on the CPU (:func:`member_groups`), on threads
  (:func:`map_members`);
- the reference loop under autograd that both kernels are tested against
  (:func:`tracker_loss_ref`).

Labels ≥ 0 are class ids; −100 (any negative) marks a position that counts neither in the
loss nor in the hits.  Losses are in nats, summed (not averaged) over valid positions.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from ..compiled import common_dtype

__all__ = [
    "BUFFERS",
    "PHIS",
    "check_shapes",
    "PARALLEL_MEMBERS",
    "fused_call",
    "map_members",
    "member_groups",
    "readout_ce",
    "readout_ce_grad",
    "tracker_loss_ref",
    "table_grad",
    "token_rows",
]

#: nonlinearities phi the fused tracker kernels implement
PHIS = ("identity", "tanh")


class _BufferCache:
    """Large CPU scratch buffers handed back by a finished backward pass, for the next step.

    The state buffer of a training step is N·T·B·S floats (126 MB for 16 models at H=128,
    B=256, T=60).  A fresh allocation of that size is a fresh ``mmap`` whose pages fault in
    on first touch, a measurable share of an ensemble step (``docs/performance.md``).  Only buffers a backward pass has finished with are
    kept, as many per shape and dtype as were handed back (a kernel that runs the members
    of a stack one by one uses one buffer per member), for at most ``keep`` shapes (a
    curriculum changes T; the least recently returned shape goes first); a forward pass
    that finds none allocates.  So the cache never holds more than the largest step's
    buffers.  CUDA has its own caching allocator: not used there.
    """

    def __init__(self, keep: int = 8):
        self.keep = keep
        self._free: dict[tuple, list[torch.Tensor]] = {}
        self.lock = threading.Lock()

    def take(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if device.type == "cpu":
            with self.lock:
                bufs = self._free.get((tuple(shape), dtype))
                buf = bufs.pop() if bufs else None
            if buf is not None:
                return buf
        return torch.empty(shape, dtype=dtype, device=device)

    def give(self, buf: torch.Tensor) -> None:
        if buf.device.type != "cpu" or not buf.is_contiguous():
            return
        key = (tuple(buf.shape), buf.dtype)
        with self.lock:
            self._free.setdefault(key, []).append(buf)
            self._free[key] = self._free.pop(key)  # most recently returned shape last
            while len(self._free) > self.keep:
                self._free.pop(next(iter(self._free)))

    def clear(self) -> None:
        with self.lock:
            self._free.clear()


BUFFERS = _BufferCache()


def token_rows(tokens: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """Row of each token of ``tokens [N, T, B]`` in the stacked tables ``[N·V, …]``:
    ``n·V + x``, flattened to ``[N·T·B]`` (the gather index forward, the scatter index
    backward)."""
    n = tokens.shape[0]
    return (tokens + (torch.arange(n, device=tokens.device) * n_tokens).view(n, 1, 1)).reshape(-1)


def table_grad(rows: torch.Tensor, values: torch.Tensor, n: int, n_tokens: int) -> torch.Tensor:
    """∂L/∂table ``[N, V, S]`` from the per-position gradients ``values [N·T·B, S]`` gathered
    at ``rows`` (:func:`token_rows`): one ``index_add_``."""
    s = values.shape[-1]
    out = torch.zeros(n * n_tokens, s, dtype=values.dtype, device=values.device)
    return out.index_add_(0, rows, values).view(n, n_tokens, s)


def readout_ce(hs: torch.Tensor, W: torch.Tensor, c: torch.Tensor, labels: torch.Tensor):
    """Linear readout and cross-entropy of states ``hs [N, T, B, S]`` (time-major) against
    ``labels [N, T, B]`` (−100 and other negatives: ignored).

    Logits in class-major layout ``[N, C, T·B]`` (one GEMM), so the softmax over a few
    classes is a few contiguous passes.  Returns (summed loss ``[N]``, argmax hits ``[N]``,
    probabilities ``[N, C, T·B]`` for :func:`readout_ce_grad`).
    """
    n, t_len, bsz, s = hs.shape
    rows = t_len * bsz
    z = torch.baddbmm(c[:, :, None], W, hs.view(n, rows, s).mT)  # logits [N, C, T·B]
    lab = labels.reshape(n, 1, rows)
    valid = lab[:, 0] >= 0  # [N, T·B]
    zmax = z.amax(1, keepdim=True)  # [N, 1, T·B]
    z_y = z.gather(1, lab.clamp(min=0))  # [N, 1, T·B]
    correct = _argmax_hits(z, z_y, zmax, lab, valid).sum(1)
    probs = z.sub_(zmax).exp_()  # in place: z is not needed after this
    total = probs.sum(1, keepdim=True)
    probs.div_(total)
    nll = (total.log_() + zmax - z_y)[:, 0]  # [N, T·B]
    return torch.where(valid, nll, 0.0).sum(1), correct, probs


def readout_ce_grad(probs: torch.Tensor, labels: torch.Tensor, grad_loss: torch.Tensor, hs: torch.Tensor):
    """Backward of :func:`readout_ce` up to the states: turns ``probs`` (in place) into
    ∂L/∂z = (softmax − onehot)·valid·grad_loss and returns (∂L/∂z row-major ``[N, T, B, C]``,
    ∂L/∂W ``[N, C, S]``, ∂L/∂c ``[N, C]``).  Call it before ``hs`` is overwritten."""
    n, t_len, bsz, s = hs.shape
    lab = labels.reshape(n, 1, t_len * bsz)
    g = probs
    g.scatter_add_(1, lab.clamp(min=0), torch.full_like(g[:, :1], -1.0))
    g.mul_(torch.where(lab >= 0, grad_loss.view(n, 1, 1).to(g.dtype), 0.0))
    gW = torch.bmm(g, hs.view(n, t_len * bsz, s))  # [N, C, S]
    g_rows = g.mT.contiguous().view(n, t_len, bsz, -1)  # row-major: the per-step readout term is a K = C GEMM
    return g_rows, gW, g.sum(2)


def _argmax_hits(z, z_y, zmax, lab, valid):
    """``argmax_k z[:, k] == label`` at valid positions ``[N, T·B]``, as ``torch.argmax``
    (the first maximum wins a tie), without a slow arg-reduction over the short class
    axis: the label's logit equals the maximum, and exact ties are resolved one by one."""
    hit = (z_y == zmax)[:, 0] & valid
    tied = hit & ((z == zmax).sum(1) > 1)
    if bool(tied.any()):
        cols = z.mT[tied]  # [K, C]
        hit[tied] = cols.argmax(-1) == lab[:, 0][tied]
    return hit


def fused_call(name, apply, phi, tokens, labels, tables, mats, W, c) -> tuple[torch.Tensor, torch.Tensor]:
    """The front and back shared by the fused tracker losses.

    Checks ``phi`` and the shapes (:func:`check_shapes`), adds the model dimension for a
    single model (``A`` given as ``[S, S]``), answers zero loss and zero hits when there
    are no positions, brings every parameter to one dtype and the tokens and labels to
    time-major ``[N, T, B]``, calls ``apply(tokens, labels, *tables, *mats, W, c)`` (an
    entry of ``mats`` may be None: an absent matrix) and removes the model dimension again.
    """
    single, tokens, labels, tables, mats, W, c = _with_model_dim(name, phi, tokens, labels, tables, mats, W, c)
    check_shapes(tokens, labels, tables, [m for m in mats if m is not None], W, c)
    params = [*tables, *(m for m in mats if m is not None), W, c]
    n = tokens.shape[0]
    if tokens.shape[1] == 0 or tokens.shape[2] == 0:  # no positions: zero loss, zero hits
        zero = sum(p.sum() * 0.0 for p in params)
        loss, correct = zero.expand(n).clone(), torch.zeros(n, dtype=torch.long, device=tokens.device)
    else:
        dtype = common_dtype(*params)
        tables = [t.to(dtype).contiguous() for t in tables]
        mats = [m.to(dtype).contiguous() if m is not None else None for m in mats]
        tok_tm = tokens.transpose(1, 2).contiguous()  # [N, T, B]
        lab_tm = labels.transpose(1, 2).contiguous()
        loss, correct = apply(tok_tm, lab_tm, *tables, *mats, W.to(dtype).contiguous(), c.to(dtype).contiguous())
    return (loss[0], correct[0]) if single else (loss, correct)


def _with_model_dim(name, phi, tokens, labels, tables, mats, W, c):
    """Check ``phi``; for a single model (``mats[0]`` is ``[S, S]``) add the leading model
    dimension to every argument.  Returns ``(single, tokens, labels, tables, mats, W, c)``."""
    if phi not in PHIS:
        raise ValueError(f"unknown phi {phi!r} for the {name} loss; allowed: {', '.join(PHIS)}")
    single = mats[0].dim() == 2
    if single:
        tokens, labels, W, c = (x[None] for x in (tokens, labels, W, c))
        tables = [t[None] for t in tables]
        mats = [m[None] if m is not None else None for m in mats]
    return single, tokens, labels, tables, mats, W, c


def check_shapes(tokens, labels, tables, mats, W, c) -> None:
    """Raise ``ValueError`` (one line, the shapes) unless the arguments of a fused tracker
    loss fit together: tokens/labels ``[N, B, T]``, tables ``[N, V, S]``, state matrices
    ``mats`` ``[N, S, S]``, W ``[N, C, S]``, c ``[N, C]``, and every token id in ``[0, V)``."""
    parts = [tokens, labels, *tables, *mats, W, c]
    shapes = ", ".join(str(tuple(x.shape)) for x in parts)
    ok = tokens.dim() == 3 and labels.shape == tokens.shape and W.dim() == 3 and c.dim() == 2
    ok = ok and all(t.dim() == 3 and t.shape == tables[0].shape for t in tables) and all(m.dim() == 3 for m in mats)
    if ok:
        n, s = tokens.shape[0], mats[0].shape[-1]
        ok = all(x.shape[0] == n for x in parts[2:]) and all(m.shape[1:] == (s, s) for m in mats)
        ok = ok and tables[0].shape[2] == s and W.shape[2] == s and c.shape[1] == W.shape[1]
    if not ok:
        raise ValueError(
            "expected tokens/labels [N, B, T], tables [N, V, S], state matrices [N, S, S], W [N, C, S], c [N, C] "
            f"with one N, S and C; got {shapes}"
        )
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= tables[0].shape[1]):
        raise ValueError(
            f"token ids must lie in [0, {tables[0].shape[1]}); got {int(tokens.min())}..{int(tokens.max())}"
        )


def tracker_loss_ref(name, pre, phi, tokens, labels, tables, mats, W, c) -> tuple[torch.Tensor, torch.Tensor]:
    """The loop shared by the references: for each model m, h_t = phi(pre(h_{t−1}, x_t,
    tables[m], mats[m])) from h_{−1} = 0, then the readout's summed cross-entropy and hits
    (``mats`` entries may be None, as in :func:`fused_call`)."""
    single, tokens, labels, tables, mats, W, c = _with_model_dim(name, phi, tokens, labels, tables, mats, W, c)
    losses, hits = [], []
    for m in range(tokens.shape[0]):
        tabs_m = [t[m] for t in tables]
        mats_m = [x[m] if x is not None else None for x in mats]
        h = tables[0].new_zeros(tokens.shape[1], mats[0].shape[-1])  # [B, S]
        states = []
        for t in range(tokens.shape[2]):
            h = pre(h, tokens[m, :, t], tabs_m, mats_m)
            h = torch.tanh(h) if phi == "tanh" else h
            states.append(h)
        loss_m, hits_m = _ce_ref(torch.stack(states, 1), W[m], c[m], labels[m])  # states [B, T, S]
        losses.append(loss_m)
        hits.append(hits_m)
    loss, correct = torch.stack(losses), torch.stack(hits)
    return (loss[0], correct[0]) if single else (loss, correct)


def _ce_ref(states: torch.Tensor, W: torch.Tensor, c: torch.Tensor, labels: torch.Tensor):
    """Summed cross-entropy and argmax hits of the readout ``states [B, T, S] → [B, T, C]``."""
    z = states @ W.T + c
    valid = labels >= 0
    nll = torch.nn.functional.cross_entropy(z.flatten(0, 1), labels.clamp(min=0).flatten(), reduction="none")
    return torch.where(valid.flatten(), nll, 0.0).sum(), ((z.argmax(-1) == labels) & valid).sum()


def map_members(fn, items: list) -> list:
    """``[fn(x) for x in items]``; on a CPU run with more than one intra-op thread, the
    groups (one member each) run on that many Python threads, one thread each (the C loops
    and torch ops release the GIL), so an ensemble uses every core it is given.  Each
    member's arithmetic is the same as alone, so the numbers do not change.

    ``torch.set_num_threads`` is process-wide: while the members run, the process is on one
    intra-op thread, and the caller's count is restored afterwards.  Do not train two
    ensembles on threads of one process at once (Dask's process workers, dynlab's default,
    are separate processes)."""
    threads = torch.get_num_threads()
    if threads < 2 or len(items) < 2 or not PARALLEL_MEMBERS:
        return [fn(x) for x in items]
    def run(x):  # grad mode is per thread: off, as in the autograd Function that called us
        with torch.no_grad():
            return fn(x)

    torch.set_num_threads(1)  # each member on one core: no nested intra-op parallelism
    try:
        with ThreadPoolExecutor(max_workers=min(threads, len(items))) as pool:
            return list(pool.map(run, items))
    finally:
        torch.set_num_threads(threads)


#: Run a CPU stack's members in parallel threads when the caller gives more than one intra-op thread.
PARALLEL_MEMBERS = True


def member_groups(n: int, device: torch.device) -> list[slice]:
    """The members of a stack of ``n`` that run as one group: one at a time on the CPU (its
    working set stays in cache, and stacking gains nothing for an elementwise recurrence:
    16 members as one group trained each more slowly than one alone; ``docs/performance.md``),
    the whole stack on other devices (one launch per
    step for all members)."""
    return [slice(i, i + 1) for i in range(n)] if device.type == "cpu" else [slice(0, n)]
