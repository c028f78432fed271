"""dynlab's Mamba mixers and LM against transformers' ``Mamba2Mixer`` / ``MambaMixer`` torch paths, and the export.

Skipped when ``transformers`` is absent. Tiny random models, no network.

**Precision.** HF computes some steps in float32 whatever the model's dtype: every RMSNorm
(``hidden_states.to(torch.float32)``), ``A = -exp(A_log.float())``, the Mamba-2 chunked
scan and both decoding steps (``.float()`` on x, B, C, dt), parts of the Mamba-1 scan, and
the logits (``.float()``). In float64 the outputs can therefore only agree to float32
rounding of those steps (relative ~1e-7 per step). The tests check two things:

- *exact*: in float64, with HF's ``.float()`` upcasts made no-ops for float64 tensors and
  each HF RMSNorm's output replaced by the float64 RMSNorm of its own input (with the HF
  module's own weight and epsilon; :func:`hf_in_float64`), every norm input, output, final
  SSM state and convolution window of HF equals dynlab's to ~1e-10. Everything else is HF's
  own code. A separate test checks that HF's norms equal that float64 norm to float32
  rounding, which is what justifies the tolerance of the plain comparison;
- *plain*: HF as it is (float32 inside), in float64 and in float32, equal to dynlab to a
  float32 tolerance relative to the output scale (:data:`F32_TOL`).

Each equality also has a negative control: a model with one weight permuted (every
mapped weight in turn), the halves of ``in_proj`` swapped, or the convolution window
shifted by one step, differs by far more than the tolerance.
"""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest
from helpers.optional import need_transformers
import torch
import torch.nn.functional as F

transformers = need_transformers()

from transformers.models.mamba import modeling_mamba as hf_mamba  # noqa: E402
from transformers.models.mamba2 import modeling_mamba2 as hf_mamba2  # noqa: E402

from dynlab.errors import DynlabInputError  # noqa: E402
from dynlab.lm.hub.export import GLA_REFUSAL, check_exportable, export_hf, hf_config, hf_state_dict, to_hf  # noqa: E402
from dynlab.lm.hub.hf import HFRecurrentLM, load_hf_checkpoint  # noqa: E402
from dynlab.lm.models.model import RecurrentLM  # noqa: E402
from dynlab.lm.models.states import CarriedStates  # noqa: E402

EXACT = 1e-10  # float64 agreement with HF's float32 steps removed
F32_TOL = 1e-5  # float32 rounding of HF's internal float32 steps, relative to the output's largest entry

SIZES = {
    "mamba2": dict(n_heads=2, head_dim=16, d_state=4, chunk_size=8),  # inner width 32 = 2 x d_model
    "mamba1": dict(d_inner=32, n_heads=2, d_state=4),
}


def make_lm(mixer: str, n_layers: int = 2, dtype: torch.dtype = torch.float64, seed: int = 0, **kw) -> RecurrentLM:
    """A tiny exportable LM (d_model 16, no MLP) with every parameter randomised to O(1) effects.

    Norm weights, D and the convolution bias get noise around their init, A_log and the
    step-size biases noise around theirs, and the matrices unit-gain Gaussians, so that
    no weight is constant along any axis and a mis-mapped one changes the output.
    """
    model = RecurrentLM(mixer, d_model=16, n_layers=n_layers, mlp_ratio=0, **{**SIZES[mixer], **kw})
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if name.endswith(("A_log", "dt_bias", "dt_proj.bias")):
                p.add_(0.2 * noise)
            elif p.ndim == 1:
                p.add_(0.3 * noise)
            elif name.endswith("embedding.weight"):
                p.copy_(noise)
            else:
                p.copy_(noise / p[0].numel() ** 0.5)
    return model.to(dtype).eval()


def tokens(b: int = 2, t: int = 13, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 256, (b, t), generator=torch.Generator().manual_seed(seed))


def maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def assert_f32_close(a: torch.Tensor, b: torch.Tensor, tol: float = F32_TOL) -> None:
    scale = max(a.abs().max().item(), 1.0)
    assert maxdiff(a, b) <= tol * scale, (maxdiff(a, b), scale)


# -- HF in float64 -------------------------------------------------------------------------------------------

# the gated norm's class name changed in transformers 5.25 (MambaRMSNormGated -> Mamba2RMSNormGated)
HF_GATED_NORM = getattr(hf_mamba2, "Mamba2RMSNormGated", None) or getattr(hf_mamba2, "MambaRMSNormGated")
HF_NORMS = (hf_mamba2.Mamba2RMSNorm, HF_GATED_NORM, hf_mamba.MambaRMSNorm)


def _rms64(x: torch.Tensor, weight: torch.Tensor, eps: float, group: int | None = None) -> torch.Tensor:
    """Float64 RMSNorm of ``x`` over groups of ``group`` channels (None: all)."""
    shape = x.shape
    xg = x.reshape(*shape[:-1], -1, group or shape[-1])
    return weight * (xg * torch.rsqrt(xg.pow(2).mean(-1, keepdim=True) + eps)).reshape(shape)


def _norm_input(module, args) -> torch.Tensor:
    """The tensor an HF RMSNorm normalises (the gated norm's ``y · silu(gate)``)."""
    x = args[0]
    if isinstance(module, HF_GATED_NORM) and len(args) > 1 and args[1] is not None:
        x = x * F.silu(args[1])
    return x


@contextmanager
def hf_in_float64(model: torch.nn.Module | None = None, record: list | None = None):
    """HF's torch path without its float32 steps, for float64 tensors.

    ``Tensor.float()`` returns a float64 tensor unchanged (scans, ``-exp(A_log)``, decoding
    steps, logits), and every HF RMSNorm of ``model`` returns the float64 RMSNorm of its own
    input with its own weight and epsilon. ``record`` collects each norm's input in call order.
    """
    original = torch.Tensor.float

    def keep64(self, *args, **kwargs):
        return self if self.dtype == torch.float64 else original(self, *args, **kwargs)

    def hook(module, args, output):
        x = _norm_input(module, args)
        if record is not None:
            record.append(x)
        if x.dtype != torch.float64:
            return None
        return _rms64(x, module.weight, module.variance_epsilon, getattr(module, "group_size", None))

    handles = [m.register_forward_hook(hook) for m in (model.modules() if model is not None else ())
               if isinstance(m, HF_NORMS)]
    torch.Tensor.float = keep64
    try:
        yield
    finally:
        torch.Tensor.float = original
        for h in handles:
            h.remove()


@contextmanager
def dynlab_norm_inputs(model: torch.nn.Module, record: list):
    """Collect the input of every RMSNorm of a dynlab model in call order."""
    handles = [m.register_forward_pre_hook(lambda mod, args: record.append(args[0]))
               for m in model.modules() if isinstance(m, torch.nn.RMSNorm)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def hf_cache(hf_model, ssm: list[torch.Tensor] | None = None, windows: list[torch.Tensor] | None = None):
    """A ``DynamicCache`` holding dynlab states: the SSM state as is, the ``K − 1`` window
    behind one unused column (HF's conv cache holds the last ``K`` inputs; the oldest is
    never read, neither by the chunked prefill nor by a decoding step)."""
    cache = transformers.DynamicCache(config=hf_model.config)
    if ssm is not None:
        for i, (s, w) in enumerate(zip(ssm, windows)):
            layer = hf_model.backbone.layers[i].mixer
            full = torch.cat([torch.zeros_like(w[:, :, :1]), w], dim=-1)  # [B, C, K]
            cache.update_conv_state(full.clone(), i, conv_kernel_size=layer.conv_kernel_size)
            s = s.reshape(s.shape[0], -1, s.shape[-1]) if hf_model.config.model_type == "mamba" else s
            cache.update_recurrent_state(s.clone(), i)
    return cache


def random_states(model: RecurrentLM, b: int, seed: int = 3) -> CarriedStates:
    g = torch.Generator().manual_seed(seed)
    dt = model.embedding.weight.dtype
    ssm = [0.5 * torch.randn(b, *s, generator=g, dtype=torch.float64).to(dt) for s in model.state_shapes()]
    conv = [torch.randn(b, *s, generator=g, dtype=torch.float64).to(dt) for s in model.conv_shapes()]
    return CarriedStates(ssm, conv)


# -- the mixers ------------------------------------------------------------------------------------------------


def _mixer_pair(mixer: str, seed: int = 0):
    lm = make_lm(mixer, n_layers=1, seed=seed)
    hf = to_hf(lm)
    return lm, hf, lm.blocks[0].mixer, hf.backbone.layers[0].mixer


def _hf_mixer_run(hf, m, x, cache, decode: bool):
    """HF mixer on ``x`` from ``cache``: one prefill call, or one decoding call per token."""
    if not decode:
        return m(x, cache=cache)
    return torch.cat([m(x[:, i:i + 1], cache=cache) for i in range(x.shape[1])], dim=1)


def _hf_final(hf, cache, lm):
    state = cache.get_recurrent_state(0)
    window = cache.get_conv_state(0)[:, :, 1:]  # drop the unused oldest column
    return state.reshape(state.shape[0], *lm.state_shapes()[0]), window


@pytest.mark.parametrize("start", ["zero", "carried-prefill", "carried-decode"])
def test_mamba2_mixer_equals_hf_float64(start):
    lm, hf, ours, theirs = _mixer_pair("mamba2")
    x = torch.randn(2, 11, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    init = None if start == "zero" else random_states(lm, 2)
    cache = hf_cache(hf) if init is None else hf_cache(hf, list(init), init.conv)
    record: list = []
    with torch.no_grad():
        y, state, window = ours(x, None if init is None else init[0], None if init is None else init.conv[0])
        y_pre, z, _, _ = ours.inner(x, None if init is None else init[0], None if init is None else init.conv[0])
        with hf_in_float64(theirs, record):
            y_hf = _hf_mixer_run(hf, theirs, x, cache, decode=start == "carried-decode")
    state_hf, window_hf = _hf_final(hf, cache, lm)
    # the part before the gated norm: y + D x (scan) times silu(z), per call of the norm
    pre_hf = torch.cat(record, dim=1)
    assert maxdiff(pre_hf, y_pre.reshape(2, 11, -1) * F.silu(z)) < EXACT
    assert maxdiff(y_hf, y) < EXACT
    assert maxdiff(state_hf, state) < EXACT
    assert maxdiff(window_hf, window) < EXACT
    assert y.abs().max() > 0.1 and state.abs().max() > 0.1  # not a comparison of near-zeros
    # HF as it is (float32 norm and scan inside), same inputs
    cache = hf_cache(hf) if init is None else hf_cache(hf, list(init), init.conv)
    with torch.no_grad():
        y_plain = _hf_mixer_run(hf, theirs, x, cache, decode=start == "carried-decode")
    assert_f32_close(y_plain, y)


@pytest.mark.parametrize("start", ["zero", "carried-decode"])
def test_mamba1_mixer_equals_hf_float64(start):
    """From a carried state through HF's decoding step (its multi-token prefill restarts at zero,
    see tests/lm/test_interop_transformers.py); HF's Mamba-1 conv cache also holds ``K`` inputs."""
    lm, hf, ours, theirs = _mixer_pair("mamba1")
    x = torch.randn(2, 11, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    init = None if start == "zero" else random_states(lm, 2)
    cache = hf_cache(hf) if init is None else hf_cache(hf, list(init), init.conv)
    with torch.no_grad():
        y, state, window = ours(x, None if init is None else init[0], None if init is None else init.conv[0])
        with hf_in_float64(theirs):
            y_hf = _hf_mixer_run(hf, theirs, x, cache, decode=start != "zero")
    state_hf, window_hf = _hf_final(hf, cache, lm)
    assert cache.get_conv_state(0).shape[-1] == ours.conv_kernel  # K columns, as Mamba-2's
    assert maxdiff(y_hf, y) < EXACT  # Mamba-1 has no norm inside the mixer
    assert maxdiff(state_hf, state) < EXACT
    assert maxdiff(window_hf, window) < EXACT
    assert y.abs().max() > 0.1 and state.abs().max() > 0.01
    cache = hf_cache(hf) if init is None else hf_cache(hf, list(init), init.conv)
    with torch.no_grad():
        y_plain = _hf_mixer_run(hf, theirs, x, cache, decode=start != "zero")
    assert_f32_close(y_plain, y)


@pytest.mark.parametrize("mixer", ["mamba2", "mamba1"])
def test_conv_window_alignment_matters(mixer):
    """Negative control for the window <-> cache mapping: the window one step off changes the output."""
    lm, hf, ours, theirs = _mixer_pair(mixer)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    init = random_states(lm, 2)
    shifted = [torch.cat([w[:, :, 1:], torch.zeros_like(w[:, :, :1])], -1) for w in init.conv]
    with torch.no_grad():
        y, _, _ = ours(x, init[0], init.conv[0])
        with hf_in_float64(theirs):
            right = _hf_mixer_run(hf, theirs, x, hf_cache(hf, list(init), init.conv), decode=True)
            wrong = _hf_mixer_run(hf, theirs, x, hf_cache(hf, list(init), shifted), decode=True)
    assert maxdiff(right, y) < EXACT
    assert maxdiff(wrong, y) > 1e-3


def test_hf_norms_equal_float64_norm_to_float32_rounding():
    """What the plain tolerance rests on: each HF RMSNorm (float32 inside) of a float64 input
    equals the float64 RMSNorm to float32 rounding (relative ~1e-7), and no better."""
    for mixer in ("mamba2", "mamba1"):
        hf = to_hf(make_lm(mixer))
        seen = []

        def hook(module, args, output):
            x = _norm_input(module, args)
            ref = _rms64(x, module.weight, module.variance_epsilon, getattr(module, "group_size", None))
            seen.append(maxdiff(output, ref) / ref.abs().max().item())

        handles = [m.register_forward_hook(hook) for m in hf.modules() if isinstance(m, HF_NORMS)]
        with torch.no_grad():
            hf(tokens())
        for h in handles:
            h.remove()
        assert len(seen) == (5 if mixer == "mamba2" else 3)
        assert all(d < 1e-6 for d in seen), seen
        assert max(seen) > 1e-10  # float32 inside: not exact in float64


# -- the whole LM ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mixer", ["mamba2", "mamba1"])
def test_lm_equals_hf_causal_lm_float64(mixer):
    lm = make_lm(mixer)
    hf = to_hf(lm)
    tok = tokens()
    ours_in: list = []
    hf_in: list = []
    with torch.no_grad():
        with dynlab_norm_inputs(lm, ours_in):
            logits, _ = lm(tok)
        with hf_in_float64(hf, hf_in):
            exact = hf(tok).logits
        plain = hf(tok).logits
    assert len(ours_in) == len(hf_in) == (5 if mixer == "mamba2" else 3)
    for a, b in zip(hf_in, ours_in):  # the part before each norm
        assert maxdiff(a, b) < EXACT
    assert exact.dtype == torch.float64 and maxdiff(exact, logits) < EXACT
    assert logits.abs().max() > 1.0
    assert plain.dtype == torch.float32  # HF's logits are float32 whatever the model's dtype
    assert_f32_close(plain, logits)


@pytest.mark.parametrize("mixer", ["mamba2", "mamba1"])
def test_lm_equals_hf_causal_lm_float32(mixer):
    lm = make_lm(mixer, dtype=torch.float32)
    with torch.no_grad():
        assert_f32_close(to_hf(lm)(tokens()).logits, lm(tokens())[0])


@pytest.mark.parametrize("mixer", ["mamba2", "mamba1"])
def test_every_mapped_weight_matters(mixer):
    """Negative control: permute any one mapped weight (or swap in_proj's halves) and the logits
    differ from dynlab's by far more than the tolerances above."""
    lm = make_lm(mixer)
    tok = tokens(2, 9)
    weights = hf_state_dict(lm)
    with torch.no_grad():
        logits, _ = lm(tok)
        hf = to_hf(lm)
        with hf_in_float64(hf):
            assert maxdiff(hf(tok).logits, logits) < EXACT
        mutations = {name: w.roll(1, dims=0) for name, w in weights.items()}
        d_inner = lm.blocks[0].mixer.d_inner
        w = weights["backbone.layers.0.mixer.in_proj.weight"]
        mutations["in_proj halves swapped"] = torch.cat([w[d_inner:2 * d_inner], w[:d_inner], w[2 * d_inner:]])
        for name, value in mutations.items():
            key = name if name in weights else "backbone.layers.0.mixer.in_proj.weight"
            hf.load_state_dict({**weights, key: value})
            with hf_in_float64(hf):
                assert maxdiff(hf(tok).logits, logits) > 1e-4, name
    assert len(mutations) == len(hf.state_dict()) + 1


CONFIG_MUTATIONS = {
    "layer_norm_epsilon": 1e-3,  # every RMSNorm, the gated one of Mamba-2 included
    "residual_in_fp32": True,  # float32 residual stream: a float32 rounding in float64
    "time_step_limit": (0.0, 0.05),  # Mamba-2 only: clamps the step sizes
}


@pytest.mark.parametrize(("mixer", "field"), [(m, f) for m in ("mamba2", "mamba1") for f in sorted(CONFIG_MUTATIONS)
                                               if not (m == "mamba1" and f == "time_step_limit")])
def test_config_fields_that_set_the_numbers(mixer, field):
    """Negative control for the config: the same weights under another value of one field differ
    (Mamba-1 has no step-size limit)."""
    lm = make_lm(mixer)
    config = hf_config(lm)
    setattr(config, field, CONFIG_MUTATIONS[field])
    cls = transformers.Mamba2ForCausalLM if mixer == "mamba2" else transformers.MambaForCausalLM
    with torch.device("meta"):
        hf = cls(config)
    hf.load_state_dict(hf_state_dict(lm), strict=True, assign=True)
    tok = tokens()
    with torch.no_grad(), hf_in_float64(hf):
        assert maxdiff(hf.eval()(tok).logits, lm(tok)[0]) > 1e-9, field


# -- export ----------------------------------------------------------------------------------------------------


def _load_exported(path):
    cfg = json.loads((path / "config.json").read_text())
    cls = {"mamba2": transformers.Mamba2ForCausalLM, "mamba": transformers.MambaForCausalLM}[cfg["model_type"]]
    return cls.from_pretrained(str(path), local_files_only=True).eval(), cfg


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mixer", ["mamba2", "mamba1"])
def test_export_folder_loads_back_with_the_same_logits(mixer, dtype, tmp_path):
    lm = make_lm(mixer, dtype=dtype)
    out = export_hf(lm, tmp_path / "hf")
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    hf, cfg = _load_exported(out)
    assert cfg["vocab_size"] == 256 and cfg["tie_word_embeddings"] is False and cfg["residual_in_fp32"] is False
    assert cfg["layer_norm_epsilon"] == 1e-5 and cfg["num_hidden_layers"] == 2 and cfg["expand"] == 2
    if mixer == "mamba2":
        assert cfg["n_groups"] == 1 and cfg["num_heads"] == 2 and cfg["head_dim"] == 16
        assert tuple(hf.config.time_step_limit) == (0.0, float("inf"))  # no clamping of the step sizes
    else:
        assert cfg["intermediate_size"] == 32 and cfg["time_step_rank"] == lm.blocks[0].mixer.dt_rank
    assert hf.dtype == dtype
    for name, value in hf_state_dict(lm).items():
        assert torch.equal(hf.state_dict()[name], value), name
    tok = tokens()
    with torch.no_grad():
        logits, _ = lm(tok)
        assert_f32_close(hf(tok).logits, logits)
        if dtype == torch.float64:
            with hf_in_float64(hf):
                assert maxdiff(hf(tok).logits, logits) < EXACT


def test_export_of_a_run_folder(tmp_path):
    from safetensors.torch import save_file

    from dynlab.lm.run.text import build_model
    from dynlab.lm.spec import LMModelSpec, LMRunSpec

    spec = LMRunSpec(model=LMModelSpec(mixer="mamba2", d_model=16, n_layers=2, n_heads=2, head_dim=16, d_state=4,
                                       mlp_ratio=0, chunk_size=8))
    model = build_model(spec)
    model.load_state_dict(make_lm("mamba2", dtype=torch.float32).state_dict())
    run = tmp_path / "runs" / spec.run_id
    run.mkdir(parents=True)
    (run / "spec.json").write_text(spec.canonical_json())
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(run / "model.safetensors"))
    out = export_hf(run, tmp_path / "hf")
    hf, _ = _load_exported(out)
    with torch.no_grad():
        assert_f32_close(hf(tokens()).logits, model.eval()(tokens())[0])
    hf64, _ = _load_exported(export_hf(run, tmp_path / "hf64", dtype=torch.float64))
    assert hf64.dtype == torch.float64
    with torch.no_grad(), hf_in_float64(hf64):
        assert maxdiff(hf64(tokens()).logits, model.double()(tokens())[0]) < EXACT


@pytest.mark.parametrize("mixer", ["mamba2", "mamba1"])
def test_round_trip_through_the_hf_wrapper(mixer, tmp_path):
    """The export loads through ``load_hf_checkpoint``: same logits, and streaming in two chunks
    (state and convolution window carried) equals one chunk and equals dynlab's streaming."""
    lm = make_lm(mixer, dtype=torch.float32)
    wrapped = load_hf_checkpoint(export_hf(lm, tmp_path / "hf"))
    assert isinstance(wrapped, HFRecurrentLM)
    tok = tokens(2, 21)
    with torch.no_grad():
        whole, _ = lm(tok)
        first, carried = lm(tok[:, :8])
        second, finals = lm(tok[:, 8:], carried)
        w_whole, w_finals_whole = wrapped(tok)
        w_first, w_carried = wrapped(tok[:, :8])
        w_second, w_finals = wrapped(tok[:, 8:], w_carried)
    assert_f32_close(w_whole, whole)
    assert_f32_close(torch.cat([w_first, w_second], 1), whole)
    assert_f32_close(torch.cat([w_first, w_second], 1), torch.cat([first, second], 1))
    for ours, theirs, theirs_whole in zip(finals, w_finals, w_finals_whole):
        assert_f32_close(theirs.reshape(ours.shape), ours)
        assert_f32_close(theirs, theirs_whole)
    for ours, theirs in zip(finals.conv, w_finals.conv):  # Mamba-2's wrapper keeps K columns, Mamba-1's K - 1
        assert_f32_close(theirs[:, :, theirs.shape[-1] - ours.shape[-1]:], ours)


# -- refusals --------------------------------------------------------------------------------------------------

REFUSED = {
    "mixer 'gla'": lambda: RecurrentLM("gla", d_model=16, n_layers=1, mlp_ratio=0, n_heads=2),
    "mlp_ratio": lambda: RecurrentLM("mamba2", d_model=16, n_layers=1, mlp_ratio=2, **SIZES["mamba2"]),
    "conv_kernel = 0": lambda: RecurrentLM("mamba2", d_model=16, n_layers=1, mlp_ratio=0, conv_kernel=0,
                                           **SIZES["mamba2"]),
    "inner norm": lambda: RecurrentLM("mamba1", d_model=16, n_layers=1, mlp_ratio=0, inner_norm=True,
                                      **SIZES["mamba1"]),
    "norm_eps = None": lambda: RecurrentLM("mamba1", d_model=16, n_layers=1, mlp_ratio=0, norm_eps=None,
                                           **SIZES["mamba1"]),
    "integer multiple": lambda: RecurrentLM("mamba2", d_model=16, n_layers=1, mlp_ratio=0, n_heads=3, head_dim=8),
    "not a dynlab RecurrentLM": lambda: torch.nn.Linear(2, 2),
}


@pytest.mark.parametrize("problem", sorted(REFUSED))
def test_unexportable_layouts_are_refused(problem, tmp_path):
    model = REFUSED[problem]()
    for call in (lambda: check_exportable(model), lambda: to_hf(model), lambda: export_hf(model, tmp_path / "x")):
        with pytest.raises(DynlabInputError) as err:
            call()
        msg = str(err.value)
        assert problem in msg and "allowed:" in msg and "\n" not in msg
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("mlp_ratio", [0, 2])  # 2: the GLA of the study presets
def test_gla_refusal_says_why(mlp_ratio, tmp_path):
    """GLA is refused for its mixer (before the MLP check), in one line naming the layout differences
    from fla's GLAForCausalLM that block an exact export."""
    model = RecurrentLM("gla", d_model=16, n_layers=1, mlp_ratio=mlp_ratio, n_heads=2)
    with pytest.raises(DynlabInputError) as err:
        export_hf(model, tmp_path / "x")
    msg = str(err.value)
    assert msg == f"cannot export to Hugging Face: {GLA_REFUSAL}; allowed: mixer mamba2 or mamba1"
    for said in ("GLAForCausalLM", "flash-linear-attention", "before the output gate", "rank-16", "SwiGLU MLP"):
        assert said in msg
    assert "\n" not in msg and not (tmp_path / "x").exists()


def test_export_refuses_a_folder_that_is_not_a_run(tmp_path):
    hf_model = to_hf(make_lm("mamba2", dtype=torch.float32))
    hf_model.save_pretrained(str(tmp_path / "hf"))
    with pytest.raises(DynlabInputError, match="not a dynlab LM run folder"):
        export_hf(tmp_path / "hf", tmp_path / "out")


def test_conv_kernel_one_and_global_rng(tmp_path):
    """The narrowest convolution exports too, and building the HF model draws nothing from the global RNG."""
    lm = make_lm("mamba2", conv_kernel=1)
    before = torch.get_rng_state()
    hf = to_hf(lm)
    assert torch.equal(before, torch.get_rng_state())
    with torch.no_grad(), hf_in_float64(hf):
        assert maxdiff(hf(tokens()).logits, lm(tokens())[0]) < EXACT


@pytest.mark.parametrize("mixer", ["mamba2", "mamba1"])
def test_a_study_run_exports_and_loads_with_the_same_logits(mixer, tmp_path):
    """Every Mamba model a study trains has the real Mamba block (no MLP), so its run
    folder exports as it is: the quick preset's own layout, briefly trained by the study."""
    from dynlab.lm.train.posttrain import load_checkpoint
    from dynlab.runner.driver import run_study
    from dynlab.studies import get_study
    from dynlab.runner.protocol import StudyOptions

    options = StudyOptions(preset="quick", models=(mixer,), seeds=(0,), extra={
        "interventions": ["zero"], "train": {"steps": 3},
        "eval": {"length_multiple": 2, "n_samples": 2, "effrem_points": 2, "effrem_samples": 2, "state_points": 2}})
    run_study(get_study("length-generalization"), options, out=tmp_path / "runs", analyze=False)
    (run,) = (tmp_path / "runs" / "length-generalization" / "runs").iterdir()
    assert json.loads((run / "spec.json").read_text())["fields"]["model"]["mlp_ratio"] == 0
    model, _ = load_checkpoint(run)
    hf, _ = _load_exported(export_hf(run, tmp_path / "hf"))
    tok = tokens(t=40)
    with torch.no_grad():
        assert_f32_close(hf(tok).logits, model(tok)[0])


def test_study_presets_give_each_mixer_its_anchor_block():
    """Mamba-1 and Mamba-2 blocks have no MLP in every LM study preset; GLA keeps its MLP."""
    from dynlab.lm.spec import ANCHOR_MLP_RATIO
    from dynlab.studies import get_study
    from dynlab.runner.protocol import StudyOptions

    assert ANCHOR_MLP_RATIO == {"mamba2": 0, "mamba1": 0, "gla": 2}
    for name in ("length-generalization", "copying", "passkey", "babilong"):
        study = get_study(name)
        for preset in study.presets:
            if preset == "pretrained":  # the checkpoint's own model: tests/studies/test_pretrained_preset.py
                continue
            specs = study.make_specs(StudyOptions(preset=preset, models=("mamba2", "mamba1", "gla"), seeds=(0,)))
            got = {s.model.mixer: s.model.mlp_ratio for s in specs}
            assert got == ANCHOR_MLP_RATIO, (name, preset, got)
    user = get_study("copying").make_specs(StudyOptions(preset="quick", models=("mamba2",), seeds=(0,),
                                                        extra={"model": {"mlp_ratio": 3}}))
    assert {s.model.mlp_ratio for s in user} == {3}  # the user's choice wins


# -- the model card's metadata -----------------------------------------------------------------------------------

def _card_metadata(folder) -> dict:
    """The YAML header of ``folder/README.md``, read by PyYAML and by huggingface_hub (both must agree)."""
    yaml = pytest.importorskip("yaml")
    text = (folder / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n")
    meta = yaml.safe_load(text.split("---\n", 2)[1])
    hub = pytest.importorskip("huggingface_hub")
    assert hub.metadata_load(folder / "README.md") == meta
    assert hub.ModelCard(text).data.to_dict() == meta
    return meta


@pytest.mark.parametrize("license", [None, "apache-2.0", "cc-by-nc-sa-4.0", "openrail++", "other"])
def test_model_card_carries_the_hub_metadata(license, tmp_path):
    kw = {} if license is None else {"license": license}
    out = export_hf(make_lm("mamba1", dtype=torch.float32), tmp_path / "hf", **kw)
    meta = _card_metadata(out)
    assert meta == {"license": license or "unknown", "library_name": "transformers",
                    "pipeline_tag": "text-generation", "tags": ["dynlab", "mamba", "byte-level"]}
    stated = "The exporter stated no license" in (out / "README.md").read_text()
    assert stated == (license is None)


def test_model_card_header_stays_valid_yaml_for_any_identifier():
    """An identifier YAML would read as a number or a boolean is quoted, so it reads back as the string."""
    from dynlab.lm.hub.card import model_card

    yaml = pytest.importorskip("yaml")
    info = {"model_type": "mamba2", "architecture": "Mamba2ForCausalLM", "n_params": 1, "dtype": "float32"}
    for license in ("1.0", "yes", "no", "on", "null", "mit"):
        meta = yaml.safe_load(model_card(info, license=license).split("---\n", 2)[1])
        assert meta["license"] == license and meta["tags"] == ["dynlab", "mamba2", "byte-level"]
    subword = {"spec": "LMRunSpec", "fields": {"data": {"tokenizer": {"kind": "hf", "n_ids": 500, "sha256": "ab" * 32}}}}
    meta = yaml.safe_load(model_card(info, subword).split("---\n", 2)[1])
    assert meta["tags"] == ["dynlab", "mamba2", "subword"] and meta["license"] == "unknown"


@pytest.mark.parametrize("license", ["MIT", "Apache 2.0", "", "apache-2.0\ntags: [x]", "a" * 65, "-mit", None])
def test_a_license_that_is_no_hub_identifier_is_refused_before_anything_is_written(license, tmp_path):
    with pytest.raises(DynlabInputError) as err:
        export_hf(make_lm("mamba2", dtype=torch.float32), tmp_path / "hf", license=license)
    msg = str(err.value)
    assert "not a Hugging Face license identifier" in msg and "allowed:" in msg and "\n" not in msg
    assert not (tmp_path / "hf").exists()
