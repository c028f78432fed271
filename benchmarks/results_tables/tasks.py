"""README's paper-B cells on the synthetic tasks: copying (and its 4x-state check), passkey
retrieval, the bAbI-style questions, and how often each task preset's rules learn on fresh seeds."""

from __future__ import annotations

import numpy as np
import xarray as xr

from dynlab.report import arm_in_range, headline, headline_contrasts

from results_tables.common import DATA, dataset, first_spec, minus, seed_range

def _arm_mean(ds: xr.Dataset, intervention: str, length: int) -> float:
    """Mean over seeds of the post-trained arm's headline accuracy at ``length``."""
    acc = headline(ds).sel(length=length)
    post = (ds["phase"].values.astype(str) == "post") & (ds["intervention"].values.astype(str) == intervention)
    return float(acc.values[post].mean())


def _contrast(ds: xr.Dataset, contrast: str, length: int) -> str:
    """``−0.10 [−0.19, 0.00], p 0.05``: the paired contrast against the zero-state control."""
    c = headline_contrasts(ds).sel(mixer=ds["arch"].values[0], contrast=contrast, length=length)
    mean, lo, hi, p = (float(c[f"contrast_{k}"]) for k in ("mean", "lo", "hi", "p"))
    p_text = f"{p:.2f}" if np.isfinite(p) else "— (no spread)"
    return f"{minus(mean, sign=True) if mean > 0 else minus(mean)} [{minus(lo)}, {minus(hi)}], p {p_text}"


def _learned(ds: xr.Dataset) -> tuple[int, int]:
    """(models that learned, models trained) in the base phase."""
    base = ds["phase"].values.astype(str) == "base"
    return int((ds["status"].values.astype(str)[base] == "ok").sum()), int(base.sum())


def _babi_grid(ds: xr.Dataset) -> tuple[np.ndarray, str, int, list[int]]:
    """A babilong dataset's base-phase rows, their in-range accuracies as text, its longest
    training length and the test lengths the README quotes (1×, 4× and the longest)."""
    base = ds["phase"].values.astype(str) == "base"
    in_range = ", ".join(f"{x:.2f}" for x in ds["in_range_accuracy"].values[base])
    train_max = int(ds["train_max"].max())
    lengths = [x for x in (train_max, 4 * train_max, int(ds["length"].max())) if x in ds["length"].values]
    return base, in_range, train_max, lengths


def babi_cell(babi: xr.Dataset) -> str:
    """README's bAbI cell: how many models learned qa1, and the qa1 accuracy of each
    post-training arm at the training length, 4× and the longest test length, with the
    paired contrasts at the longest (when ≥ 2 seeds learned)."""
    learned, trained = _learned(babi)
    base, in_range, train_max, lengths = _babi_grid(babi)
    train = first_spec(babi)["train"]
    steps = f"{train['steps']} steps"
    if train.get("attempts", 1) > 1 and "train_attempts" in babi:
        drawn = babi["train_attempts"].values[base]
        steps += (f" per model, up to {train['attempts']} models per seed; "
                  + ("learned by each seed's first model" if (drawn == 1).all() else
                     "models drawn per seed: " + ", ".join(str(int(x)) for x in drawn)))
    if learned == 0:
        return (f"no model learned qa1 within {steps} (in-range accuracy {in_range}; learned: "
                f"≥ {babi.attrs['learned_at']}), so no contrast")
    qa1 = babi.sel(kind="qa1")
    arms = {a: " / ".join(f"{_arm_mean(qa1, a, x):.2f}" for x in lengths)
            for a in ("zero", "state-passing", "fitted-noise")}
    cell = (f"{learned} of {trained} seeds learned qa1 ({steps}; in-range accuracy {in_range}); qa1 at "
            f"{' / '.join(str(x) for x in lengths)} tokens ({' / '.join(f'{x // train_max}×' for x in lengths)}): "
            f"zero-state control {arms['zero']}, state passing {arms['state-passing']}, fitted noise "
            f"{arms['fitted-noise']}")
    if learned >= 2:
        cell += (f"; at {lengths[-1]}: state passing {_contrast(qa1, 'state-passing', lengths[-1])}, fitted noise "
                 f"{_contrast(qa1, 'fitted-noise', lengths[-1])}")
    return cell + _old_block(babi)


def babi_kinds_cell(ds: xr.Dataset) -> str:
    """README's bAbI-kinds cell: how many seeds learned every kind, the zero-state control's
    accuracy per kind at the training length, 4× and the longest test length, and each arm's
    paired contrast per kind at the longest (when ≥ 2 seeds learned)."""
    learned, trained = _learned(ds)
    _, in_range, _, lengths = _babi_grid(ds)
    kinds = [str(k) for k in ds["kind"].values]
    if learned == 0:
        return f"no model learned {', '.join(kinds)} (in-range accuracy {in_range}), so no contrast"
    zero = "; ".join(f"{k} " + " / ".join(f"{_arm_mean(ds.sel(kind=k), 'zero', x):.2f}" for x in lengths)
                     for k in kinds)
    chance = ", ".join(f"{k} {float(ds['chance'].sel(kind=k)):.2f}" for k in kinds)
    cell = (f"{learned} of {trained} seeds learned {', '.join(kinds)} (mean in-range accuracy {in_range}); "
            f"zero-state control at {' / '.join(str(x) for x in lengths)} tokens: {zero} (always giving the most "
            f"common answer scores {chance})")
    if learned >= 2:
        for arm in ("state-passing", "fitted-noise"):
            cell += (f"; {arm.replace('-', ' ')} − zero at {lengths[-1]}: "
                     + ", ".join(f"{k} {_contrast(ds.sel(kind=k), arm, lengths[-1])}" for k in kinds))
    return cell + _old_block(ds)


def _old_block(ds: xr.Dataset) -> str:
    """`` (seeds 0–2, with an MLP after each mixer)`` when the dataset's Mamba model predates the real Mamba
    block (``mlp_ratio > 0``, as the task presets trained before the MLP was dropped), else ''."""
    model = first_spec(ds).get("model") or {}
    old = model.get("mlp_ratio", 0) and str(model.get("mixer", "")).startswith("mamba")
    return f" (seeds {seed_range(ds['seed'].values)}, with an MLP after each mixer)" if old else ""


def copying_cell() -> str:
    """README's copying cell: state passing against the zero-state control at 3× the longest
    training string (on the fresh seeds 20–24 when that dataset exists), each arm's damage
    in range, and the 4×-state capacity check."""
    fresh = (DATA / "copying-seeds20-24.nc").is_file()  # the quick preset at the current block, fresh seeds
    copy, copy4 = dataset("copying-seeds20-24" if fresh else "copying"), dataset("copying-state128")
    far = 3 * int(copy["train_max"].max())
    learned, trained = _learned(copy)
    score, damaged = arm_in_range(copy)
    sp_rows = (copy["phase"].values.astype(str) == "post") & (copy["intervention"].values.astype(str) == "state-passing")
    model, model4 = first_spec(copy)["model"], first_spec(copy4)["model"]
    state_x = model4["d_state"] / model["d_state"]
    return ((f"seeds {seed_range(copy['seed'].values)}: " if fresh else "")
            + f"{_arm_mean(copy, 'zero', far):.2f} → {_arm_mean(copy, 'state-passing', far):.2f} at {far} letters, "
            f"difference {_contrast(copy, 'state-passing', far)} ({learned} of {trained} models learned); but in "
            f"range (≤ {int(copy['train_max'].max())} letters) the state-passing arm scores "
            f"{np.nanmean(score[sp_rows]):.2f} and {int(np.nansum(damaged[sp_rows]))} of {int(sp_rows.sum())} of its "
            f"models fell below 0.9: damage in range, not a length effect; with a "
            f"{state_x:.0f}× larger state {_arm_mean(copy4, 'zero', far):.2f} → "
            f"{_arm_mean(copy4, 'state-passing', far):.2f}{_old_block(copy4)}")




def passkey_cell(passkey: xr.Dataset) -> str:
    """README's passkey cell: the zero-state control against fitted noise (and state passing)
    at the two longest test lengths, in how many seeds fitted noise did better at the nearer
    one, and its paired contrast there."""
    near, farthest = (int(x) for x in passkey["length"].values[-2:])
    train_max = int(passkey["train_max"].max())
    acc = headline(passkey).sel(length=near)
    post, iv = passkey["phase"].values.astype(str) == "post", passkey["intervention"].values.astype(str)
    fitted, control = acc.values[post & (iv == "fitted-noise")], acc.values[post & (iv == "zero")]
    order = np.argsort(passkey["seed"].values[post & (iv == "fitted-noise")])
    better = int((fitted[order] > control[np.argsort(passkey["seed"].values[post & (iv == "zero")])]).sum())
    arms = {a: " / ".join(f"{_arm_mean(passkey, a, x):.2f}" for x in (near, farthest))
            for a in ("zero", "fitted-noise", "state-passing")}
    return (f"at {near} / {farthest} tokens ({near / train_max:.0f}× / {farthest / train_max:.0f}×) "
            f"{arms['zero']} → {arms['fitted-noise']}, better in {better} of {fitted.size} seeds at {near}, "
            f"{_contrast(passkey, 'fitted-noise', near)}; state passing {arms['state-passing']}"
            f"{_old_block(passkey)}")

#: The task presets' learnability on seeds never used to choose their rules: (what, dataset label).
LEARNABILITY = (("copying", "copying-seeds20-24"), ("passkey", "passkey-learnability"),
                ("babilong", "babilong-learnability"), ("babilong `kinds`", "babilong-kinds-learnability"))


def learnability_text() -> str:
    """README's sentence on how many models each task preset's own rules train to its
    learned threshold (in-range test accuracy ≥ ``learned_at``) on seeds that played no part
    in choosing those rules, with each seed's in-range accuracy and, where a preset draws a
    fresh model after a failure, how many it drew."""
    parts, seeds, at = [], set(), set()
    for what, label in LEARNABILITY:
        if not (DATA / f"{label}.nc").is_file():
            continue
        ds = dataset(label)
        learned, trained = _learned(ds)
        base = ds["phase"].values.astype(str) == "base"
        seeds |= {int(x) for x in ds["seed"].values[base]}
        at.add(float(ds.attrs["learned_at"]))
        acc = ds["in_range_accuracy"].values[base].astype(float)
        detail = f"in range {acc.min():.2f}–{acc.max():.2f}"
        if first_spec(ds)["train"].get("attempts", 1) > 1 and "train_attempts" in ds:
            detail += "; models drawn " + ", ".join(str(int(x)) for x in ds["train_attempts"].values[base])
        parts.append(f"{what} {learned} of {trained} ({detail})")
    if not parts:
        return ""
    return (f"Learned (in-range test accuracy ≥ {'/'.join(f'{x:g}' for x in sorted(at))}) on seeds "
            f"{seed_range(sorted(seeds))}, never used to choose the task presets' rules: "
            + "; ".join(parts) + ".")
