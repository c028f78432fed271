"""The dataset vocabulary: one registry of every variable, coordinate and dimension name
that dynlab writes, with its ``long_name``, ``units`` and a one-line description.

Every analysis and every study labels its outputs through :func:`annotate` (or builds them
with :func:`var`), so a name means the same thing in every dataset and plots label
themselves.  The registry is complete at import time: nothing adds to it later, and a
test checks that every variable of every study's dataset is in it.

Dimension names (one meaning each):

- ``run`` — a run of a study (one trained model); coordinates on ``run`` say which;
- ``length`` — an evaluated sequence length L in tokens (``length_dense``: every length
  1 … max);
- ``t`` — a position in the sequence, in tokens read: the state h(t) after t tokens, the
  prediction of token t from the t tokens before it (PPL(t)), or the start t of the
  truncated context (EffRem_T(t)).  ``t_pert`` is the same position on the grid of the
  perturbation runs (injection at ``t_ref``);
- ``layer``, ``head`` — a block of a language model and a head within it;
- ``depth`` (passkey needle depth), ``kind`` (bAbI task kind);
- ``k`` — index of a return-map eigenvalue; ``k_lyap`` — index of a Lyapunov exponent
  (0 = largest); ``k2`` — column of the return-map matrix on U;
- ``state`` — a symbolic state (group element) of the fixed-point analysis; ``k_fp`` — index
  of an eigenvalue at a fixed point;
- ``direction`` (U or U_perp), ``word``, ``point``, ``sample``, ``variant``, ``censoring``.

- ``t_bin`` (with ``t_bin_start``), ``t_effrem``, ``t_state`` — the positions of a language
  model's binned perplexity, effective remembrance and state statistics: each quantity on
  its own grid, so none is padded onto the positions of another (a study's runs share each
  grid, NaN beyond a run's own length; :func:`dynlab.results.positions.curves` gives each run's
  curve alone, with ``t_rel`` = t / T_train);
- ``loss_point`` — a point of a run's subsampled training-loss curve (its step is the
  coordinate ``train_step``, one per run).

Units, one spelling per kind of quantity (CF/UDUNITS names where one exists): ``"1"`` =
dimensionless, counts included (parameters, optimiser steps, classes) and quantities in the
hidden state's own scale (R, M, distances, residuals); ``"s"`` = seconds; ``"bit"``;
``"tokens"`` = sequence positions and lengths, crossing times included (the state after t
tokens; 1 time step = 1 token read); ``"1/token"`` = a rate per token read;
``"nats/token"`` = a cross-entropy; ``""`` = not a quantity (labels, text, flags).  Every
dataset dynlab writes carries ``Conventions = "CF-1.11"``.

Long module: the registry is one table, a row per name; kept in one place so that a name
is defined once and the check that every written name is in it reads a single table.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, NamedTuple

import xarray as xr

from dynlab.names import BABI_KINDS, INTERVENTION_NAMES

__all__ = ["VARIABLES", "Variable", "annotate", "attrs_of", "check_dataset", "unregistered", "var"]


class Variable(NamedTuple):
    """What a name means: plot label, units and a one-line description."""

    long_name: str
    units: str
    description: str


_CENSORED = "NaN = never crossed (censored at the horizon)"
_FORECAST = "straight line fitted on [t_ref/2, t_ref], extrapolated to τ; NaN = never"

_ENTRIES: dict[str, tuple[str, str, str]] = {
    # -- dimensions and index coordinates --------------------------------------------------
    "run": ("run index", "", "0-based position of the run in the study (run_id names it)"),
    "length": ("sequence length", "tokens",
               "evaluated length L: tokens of a word-problem sequence, characters of the copied string "
               "(copying) or tokens of the whole sample (passkey, babilong)"),
    "length_dense": ("sequence length", "tokens", "every length 1 … the longest evaluated length"),
    "t": ("position t", "tokens",
          "tokens read: the state after t tokens, the prediction of token t from the t before it, "
          "or the start of the truncated context (EffRem)"),
    "t_bin": ("position t (bin end)", "tokens", "last position of a perplexity bin; the bin holds t_bin_start … t_bin"),
    "t_bin_start": ("first position of the bin", "tokens", "the bin of ppl_binned holds t_bin_start … t_bin"),
    "t_rel": ("position t / T_train", "1",
              "a curve's position over its run's training length (dynlab.results.positions.curves; never stored)"),
    "t_log": ("position t (log-spaced bin end)", "tokens",
              "last position of a log-spaced perplexity bin; the bin holds the positions after the previous end"),
    "t_effrem": ("start t of the truncated context", "tokens",
                 "EffRem_T(t) compares the prediction from x_0:T with the one from x_t:T"),
    "t_state": ("position t (state statistics)", "tokens", "the state after t tokens"),
    "loss_point": ("training-loss curve point", "", "index of a window of training steps (train_step is its last step)"),
    "train_step": ("training step", "1", "last optimiser step (1-based) of the window a loss-curve point averages"),
    "t_pert": ("position t (perturbation)", "tokens", "position of the perturbation runs; injection at t_ref"),
    "layer": ("layer", "", "block index"),
    "head": ("head", "", "head index within the layer"),
    "depth": ("key depth", "1", "position of the passkey needle as a fraction of the filler"),
    "kind": ("bAbI task kind", "", " | ".join(BABI_KINDS)),
    "k": ("eigenvalue index", "", "index of a return-map eigenvalue on U (all words and centroids in a study)"),
    "k2": ("column index on U", "", "column of the return-map matrix restricted to U"),
    "k_lyap": ("Lyapunov exponent index", "", "0 = the largest finite-time Lyapunov exponent, then decreasing"),
    "direction": ("perturbation direction", "", "U (symbolic subspace) or U_perp"),
    "state": ("symbolic state", "", "group element (class index) whose states the fixed points are sought from"),
    "k_fp": ("fixed-point eigenvalue index", "",
             "eigenvalues of DF_w at the principal fixed point, word after word (state size per word)"),
    "word": ("state-preserving word", "", "tokens of a word that multiplies to the identity"),
    "word_length": ("word length", "tokens", "tokens in the state-preserving word"),
    "point": ("evaluation point (class)", "", "class whose centroid the return map is evaluated at"),
    "sample": ("sample index", "", "index of an analysed sequence"),
    "variant": ("crossing-time variant", "", "which readability ratio defines T_cross"),
    "censoring": ("censoring rule", "", "replace: censored T_cross = own horizon; drop: leave the run out"),
    "forecast": ("forecast variant", "", "which forecast of the crossing time is correlated with mp"),
    # -- coordinates on run ------------------------------------------------------------------
    "run_id": ("run id", "", "hash of the full run spec"),
    "arch": ("architecture", "", "registered recurrent cell, or the language model's sequence mixer"),
    "family": ("family", "", "declared family: affine | state-dependent"),
    "family_measured": ("measured family", "", "family measured by the Jacobian probe"),
    "group": ("group", "", "finite group of the word problem"),
    "group_order": ("group order |G|", "1", "number of elements of the group"),
    "seed": ("seed", "", "training seed"),
    "hidden": ("hidden size", "1", "cell width"),
    "layers": ("layers", "", "number of stacked cells"),
    "nonlinearity": ("nonlinearity φ", "", "state nonlinearity ('default' = the cell's own)"),
    "intervention": ("initial-state intervention", "", " | ".join(INTERVENTION_NAMES)),
    "phase": ("training phase", "", "base (trained on the task from the zero state) | post (a post-training arm of it)"),
    "contrast": ("contrast", "", "post-training arm compared with the compute-matched zero-state control"),
    "mixer": ("sequence mixer", "", "the LM's mixer (arch of its runs), as a dimension of the contrasts"),
    "train_length": ("training length", "tokens", "T_train: context length in training"),
    "budget": ("training budget", "1", "tokens seen in training / (20 × parameters)"),
    "tokens_per_param": ("training tokens per parameter", "tokens", "tokens seen in training / parameters"),
    "n_params": ("parameters", "1", "every parameter of the LM, embedding and head included"),
    "engine": ("training engine", "1", "loop: the run trained alone; stack: trained in a stack with other runs of one layout"),
    "ensemble_size": ("runs in the training stack", "1", "runs trained together with this one (engine stack; NaN for loop)"),
    "d_model": ("model width", "1", "d_model of the LM"),
    "forget_rate": ("slowest forgetting rate of the state", "1/token",
                    "top Lyapunov exponent of the LM's state map: the slowest state entry's mean log decay over "
                    "validation text (dynlab.lm.analysis.contraction)"),
    "memory_horizon": ("memory horizon", "tokens", "-1 / forget_rate: e-folding length of the slowest-forgetting state entry"),
    "d_state": ("state size N", "1", "d_state of the LM's mixer (Mamba: N; GLA: key size)"),
    "state_size": ("recurrent state size", "1",
                   "entries of the recurrent state over every layer: layers × heads × head_dim × d_state"),
    "eval_length": ("evaluation length", "tokens", "length evaluated from the zero state"),
    "train_min": ("shortest training length", "tokens", "string length (copying) or sample length"),
    "train_max": ("longest training length", "tokens", "string length (copying) or sample length"),
    # -- training record ---------------------------------------------------------------------
    "status": ("run status", "", "ok | not-learned (curriculum below the training length; LM tasks: in-range accuracy below learned_at) | diverged"),
    "reason": ("failure reason", "", "why a run failed or did not learn (empty when ok)"),
    "curriculum_length": ("curriculum length reached", "tokens", "training length at the last step"),
    "train_loss": ("final training loss", "nats/token",
                   "cross-entropy at the end of training (trackers: last batch; LMs: mean over the last 5 % of steps)"),
    "train_steps": ("training steps run", "1", "optimizer steps taken"),
    "train_loss_curve": ("training loss", "nats/token",
                         "mean training loss over a window of steps, at most 64 windows per run (dynlab.training.loss_curve)"),
    "converged": ("training converged", "",
                  "the loss fell by >= 10 % and levelled off (a post-training arm also: stayed level); "
                  "the rule is the variable's rule attribute (dynlab.training.converged)"),
    "train_time": ("training wall time", "s", "wall-clock seconds of training (machine-dependent)"),
    # -- accuracy and max-pass length ----------------------------------------------------------
    "accuracy": ("accuracy", "1",
                 "fraction of answers correct at length L: the group state at step L (trackers), per character "
                 "(copying), whole key (passkey), whole answer (babilong)"),
    "accuracy_all": ("all-steps accuracy", "1", "fraction of correct readouts over positions 1..L"),
    "accuracy_dense": ("final-step accuracy at every length", "1", "fraction of sequences read out correctly at step L"),
    "token_accuracy": ("per-token accuracy", "1", "fraction of scored target tokens predicted exactly (arg-max, teacher forcing)"),
    "exact_match": ("exact match", "1", "fraction of samples whose scored tokens are all predicted exactly"),
    "task_accuracy": ("task accuracy", "1", "accuracy on the post-training task (see accuracy)"),
    "task_token_accuracy": ("task per-token accuracy", "1", "token_accuracy on the post-training task"),
    "task_exact_match": ("task exact match", "1", "exact_match on the post-training task"),
    "chance": ("chance accuracy", "1",
               "babilong: share of the kind's most common answer (always giving it scores this), from 4000 generated stories"),
    "train_attempts": ("models drawn in training", "1",
                       "freshly initialised models trained under train.attempts until one learned (NaN: the rule was off)"),
    "arm_in_range_accuracy": ("in-range accuracy of this model", "1",
                              "mean headline accuracy of the row's own model (trained model or post-training arm) "
                              "over the test lengths <= train_max"),
    "in_range_accuracy": ("in-range accuracy", "1",
                          "mean headline accuracy of the trained model over the test lengths <= train_max; decides its status"),
    "contrast_mean": ("paired difference (arm − zero)", "1", "mean over seeds of accuracy(arm) − accuracy(zero control)"),
    "contrast_lo": ("paired difference, 95 % CI low", "1", "mean − t_0.975,n−1 · sd / sqrt(n) of the paired differences"),
    "contrast_hi": ("paired difference, 95 % CI high", "1", "mean + t_0.975,n−1 · sd / sqrt(n) of the paired differences"),
    "contrast_p": ("paired t-test p-value", "1", "two-sided p of the paired t-test of arm vs zero control (NaN: n < 2 or no spread)"),
    "contrast_n": ("pairs", "1", "number of (arm, control) pairs of learned models in the contrast"),
    "mp": ("max-pass length (dense)", "tokens",
           "largest L with the accuracy pooled over ±window·L lengths ≥ threshold at every l ≤ L"),
    "mp_censored": ("max-pass length censored", "", "True when every length up to the horizon passed (mp = horizon)"),
    "mp_grid": ("max-pass length on the evaluation grid", "tokens", "largest grid L with accuracy ≥ threshold at every grid l ≤ L"),
    "mp_grid_censored": ("grid max-pass length censored", "", "True when every grid length passed"),
    # -- geometry over time (dynlab.analysis.geometry) -----------------------------------------
    "q": ("distinguishability ratio q = R/M", "1", "within-class scatter over the minimum centroid separation"),
    "R": ("RMS within-class scatter R", "1", "RMS distance of a state to its class centroid"),
    "M": ("minimum centroid separation M", "1", "smallest distance between two class centroids"),
    "R_par": ("RMS scatter along U, R∥", "1", "residual projected on the symbolic subspace U"),
    "R_perp": ("RMS scatter orthogonal to U, R⊥", "1", "residual projected on the complement of U"),
    "centroid_radius": ("centroid radius", "1", "RMS distance of the class centroids from their mean"),
    "k_U": ("dim U", "1", "dimension of the symbolic subspace U"),
    "n_present": ("classes present", "1", "number of classes with at least one sequence at t"),
    "tau_readout": ("readout threshold m/M", "1", "smallest centroid-to-boundary distance of the readout over M"),
    "T_cross": ("first persistent crossing of q ≥ τ", "tokens", _CENSORED),
    "T_cross_par_pred": ("crossing of q∥ predicted by Corollary 1", "tokens", "linear fit of R∥ against τ·M"),
    "eta": ("growth rate of the error along U", "1/token", "slope of the linear fit of R∥(t)"),
    "e_U0": ("intercept of the error along U", "1", "intercept of the linear fit of R∥(t)"),
    "horizon": ("last analysed step", "tokens", "q(t) followed to it: the longest evaluated length; shorter for not-learned runs"),
    "crossed": ("q crossed the threshold", "1", "persistently, within the horizon"),
    "failure_mode": ("failure mode (saturation|climb|robust)", "1", "from the crossing of q"),
    # -- decoder-aligned readability (dynlab.tracking.analysis / readability) ---------------
    "blowup_t": ("first step with non-finite states", "tokens", "NaN = the states stayed finite"),
    "T_cross_readout": ("first persistent crossing of q ≥ τ_readout", "tokens", "τ from the trained readout's margin; " + _CENSORED),
    "q_par": ("decoder-relevant ratio q∥ = R∥/M", "1", "scatter along U over the minimum centroid separation"),
    "q_pair": ("worst-pair projected ratio, state", "1", "pooled spread along the pair direction / pair distance; τ = 0.5"),
    "q_pair_out": ("worst-pair projected ratio, readout features", "1", "q_pair on the input of the final linear readout"),
    "q_dec": ("trained-decoder ratio, readout features", "1",
              "spread along a boundary normal / (2 · centroid-to-boundary distance), worst pair; τ = 0.5"),
    "q_pair_ref": ("q_pair with separations at the training length", "1", "pair spreads at t over pair distances at t_ref"),
    "q_dec_ref": ("q_dec with margins at the training length", "1", "boundary spreads at t over 2 · margins at t_ref"),
    "probe_accuracy": ("linear-probe accuracy", "1", "logistic regression fitted on states at t_ref, applied at t"),
    "T_probe": ("first persistent step t ≥ t_ref with probe accuracy < 0.9", "tokens", "NaN = never (censored)"),
    "T_horizon": ("horizon forecast from t ≤ t_ref", "tokens",
                  "first t ≥ t_ref where the Gaussian error model of the decoder margins, drifting linearly as fitted on "
                  "[t_ref/2, t_ref], predicts accuracy < 0.9; NaN = beyond the horizon (censored)"),
    "dec_margin": ("smallest centroid-to-boundary distance of the readout", "1", "min over pairs of m_ag"),
    "min_class_count": ("smallest class count", "1", "fewest analysed sequences in a present class at t"),
    "thin_classes": ("steps with a class of < 4 sequences", "1", "0 = every class well sampled"),
    # -- return map and Lyapunov exponents (dynlab.analysis.jacobian) --------------------------
    "DF_U": ("return-map Jacobian on U, Bᵀ DF_w B", "1", "Jacobian of a state-preserving word restricted to U"),
    "return_map_eig": ("|return-map eigenvalue| on U", "1", "moduli of the eigenvalues of Bᵀ DF_w B, largest first"),
    "return_map_eig_real": ("return-map eigenvalue on U, real part", "1", "eigenvalues of Bᵀ DF_w B over words and centroids"),
    "return_map_eig_imag": ("return-map eigenvalue on U, imaginary part", "1", "eigenvalues of Bᵀ DF_w B over words and centroids"),
    "return_map_eig_max": ("largest |return-map eigenvalue| on U", "1", "median over words and centroids of the largest |λ|"),
    "return_map_dist_identity": ("‖P_U DF_w P_U − I‖ (spectral)", "1", "median over words and centroids; 0 = identity on U"),
    "k_U_ref": ("dim U at t_ref", "1", "rank of the symbolic subspace at the reference step"),
    "lyap": ("finite-time Lyapunov exponent", "1/token", "QR method, per trajectory"),
    "lyap_mean": ("finite-time Lyapunov exponent", "1/token", "QR method, mean over trajectories"),
    "lyapunov": ("finite-time Lyapunov exponent", "1/token", "QR method along fresh trajectories, mean over them"),
    # -- perturbation (dynlab.analysis.perturbation) -------------------------------------------
    "delta_norm": ("perturbation size ‖h_pert − h_clean‖", "1", "RMS over sequences"),
    "dist_pert": ("distance of perturbed states to the correct centroid", "1", "RMS over sequences"),
    "dist_clean": ("distance of clean states to the correct centroid", "1", "RMS over sequences"),
    "dist_excess": ("extra distance to the correct centroid", "1", "perturbed minus clean"),
    "q_pert": ("q of perturbed states", "1", "R/M of the perturbed population"),
    "q_clean": ("q of clean states", "1", "R/M of the clean population"),
    "M_t0": ("centroid separation M at injection", "1", "M at the injection step"),
    "recovery_rate": ("perturbation recovery rate", "1/token", "log-slope of the perturbation size; negative = contraction"),
    "perturb_delta_norm": ("perturbation size ‖h_pert − h_clean‖", "1", "RMS over sequences"),
    "perturb_dist_excess": ("extra distance to the correct centroid", "1", "perturbed minus clean"),
    "perturb_q_pert": ("q of perturbed states", "1", "R/M of the perturbed population"),
    # -- fixed points of the return maps (dynlab.tracking.analysis.fixed_points) ---------------
    "fp_residual": ("fixed-point residual ‖F_w(h*) − h*‖", "1",
                    "worst word's smallest residual from the class's states; ≤ 1e-8 = a fixed point was found"),
    "fp_count": ("distinct fixed points of the return map", "1",
                 "max over words; NaN = the fixed set of an affine F_w is a subspace (see fp_dim)"),
    "fp_dim": ("dimension of the fixed set", "1", "nullity of DF_w(h*) − I, max over words; 0 = isolated point"),
    "fp_rho_perp": ("spectral radius on U⊥ per token at the fixed point", "1",
                    "ρ(B⊥ᵀ DF_w B⊥)^(1/|w|), max over words; < 1 = contracting off U"),
    "fp_rho_par": ("spectral radius on U per token at the fixed point", "1",
                   "ρ(Bᵀ DF_w B)^(1/|w|), max over words; 1 = neutral along U (Theorem 1)"),
    "fp_stable": ("fixed point stable", "1", "1 = ρ(DF_w(h*)) < 1 for every word, 0 = not; NaN = none found"),
    "fp_drift": ("Corollary 1's drift along U per token, from the return maps", "1/token",
                 "η̄ = mean over class centroids c and words w of ‖P_U(F_w(c) − c)‖/|w| at t_ref"),
    "T_cross_fp": ("crossing of q∥ predicted from the return-map drift", "tokens",
                   "t_ref + (τ·M − R∥)/η̄ at t_ref (Corollary 1); NaN = never within the horizon"),
    "fp_eig_real": ("eigenvalue of DF_w at the fixed point, real part", "1", "all words, principal fixed point"),
    "fp_eig_imag": ("eigenvalue of DF_w at the fixed point, imaginary part", "1", "all words, principal fixed point"),
    # -- margins (dynlab.analysis.margin) --------------------------------------------------------
    "margin_min": ("smallest nearest-centroid margin", "1", "over the analysed states at t"),
    "margin_min_rel": ("smallest margin relative to M/2", "1", "margin_min / half_M"),
    "frac_correct": ("fraction decoded correctly by nearest centroid", "1", "at t"),
    "frac_in_ball": ("fraction within M/2 of the own centroid", "1", "at t"),
    "half_M": ("half the minimum centroid separation, M/2", "1", "NaN when fewer than two classes"),
    "e_U": ("signed error along U (class 0 → 1)", "1", "C2 only: kept for a few sequences"),
    "e_U_rms": ("RMS signed error along U", "1", "C2 only"),
    "e_U_absmax": ("largest |signed error along U|", "1", "C2 only"),
    "e_U_absmax_rel": ("largest |error along U| / (M/2)", "1", "C2 only: below 1 = inside the binary margin"),
    "e_U_absmax_rel_max": ("max over t of e_U_absmax_rel", "1", "C2 only"),
    "sign_flip_frac": ("sign flips of the error along U", "1",
                       "C2 only: fraction of sequences whose signed error changed sign at t"),
    "sign_flip_frac_mean": ("mean sign-flip fraction (t ≥ 2)", "1", "C2 only"),
    "abs_ratio_median": ("median |e(t)| / |e(t−1)| along U", "1", "C2 only"),
    "inside_margin": ("every |e_U| < M/2 at every step", "1", "C2 only"),
    "half_margin_rel": ("relative half-margin (M/2)/centroid radius", "1", "median over t; shrinks with group order"),
    "q_max": ("max over t of q", "1", "largest distinguishability ratio of the run"),
    # -- T_cross vs mp correlations (dynlab.analysis.correlation) ------------------------------
    "variant_description": ("crossing-time variant, described", "", "what the variant's ratio reads"),
    "corr_r": ("Pearson r(T_cross variant, mp)", "1", "ok runs only; NaN with fewer than 3 usable runs"),
    "corr_r_lo": ("Pearson r, lower end of the 95% bootstrap CI", "1", ""),
    "corr_r_hi": ("Pearson r, upper end of the 95% bootstrap CI", "1", ""),
    "corr_rho": ("Spearman ρ(T_cross variant, mp)", "1", "ok runs only; NaN with fewer than 3 usable runs"),
    "corr_rho_lo": ("Spearman ρ, lower end of the 95% bootstrap CI", "1", ""),
    "corr_rho_hi": ("Spearman ρ, upper end of the 95% bootstrap CI", "1", ""),
    "corr_n": ("runs used in the correlation", "1", "per variant and censoring rule"),
    "corr_heldout_pearson_r": ("held-out Pearson r of the default variant's T_cross vs mp", "1",
                               "on the seeds not used to choose the variant (attr variant)"),
    "corr_heldout_pearson_r_lo": ("held-out Pearson r, lower end of the 95% bootstrap CI", "1", ""),
    "corr_heldout_pearson_r_hi": ("held-out Pearson r, upper end of the 95% bootstrap CI", "1", ""),
    "corr_heldout_n_used": ("held-out runs used", "1", ""),
    "corr_forecast_heldout_r": ("held-out Pearson r of a forecast vs mp", "1",
                                "forecast variants (defined before any data) on the held-out seeds (attr heldout_seeds)"),
    "corr_forecast_heldout_r_lo": ("held-out forecast r, lower end of the 95% bootstrap CI", "1", ""),
    "corr_forecast_heldout_r_hi": ("held-out forecast r, upper end of the 95% bootstrap CI", "1", ""),
    "corr_forecast_heldout_n": ("held-out runs used by the forecast's r", "1", "per forecast and censoring rule"),
    # -- language models (dynlab.lm.analysis.metrics, dynlab.lm) -------------------------------
    "ppl": ("perplexity at position t", "1", "exp of the NLL at position t averaged over samples"),
    "ppl_binned": ("binned perplexity", "1", "exp of the NLL averaged over samples and the bin ending at t"),
    "ppl_log": ("perplexity on log-spaced bins", "1",
                "exp of the NLL averaged over samples and the positions of the log-spaced bin ending at t_log"),
    "effrem": ("effective remembrance (TV)", "1", "total variation between q(.|x_0:T) and q(.|x_t:T)"),
    "effrem_js": ("effective remembrance (JS)", "bit", "Jensen-Shannon divergence between q(.|x_0:T) and q(.|x_t:T)"),
    "effrem_cos": ("effective remembrance (1-cos)", "1", "1 - cosine similarity of q(.|x_0:T) and q(.|x_t:T)"),
    "state_mean": ("state mean", "1", "mean of a head's state entries over samples"),
    "state_std": ("state standard deviation", "1", "std of a head's state entries over samples"),
    "state_norm": ("state norm", "1", "mean over samples of a head's state Frobenius norm"),
    "lg_passed": ("length generalizes (Def. 3.2)", "", "PPL(t) ≤ p* for all t ≥ t* (binned)"),
    "lg_p_star": ("best in-training perplexity p*", "1", "lowest binned PPL at t ≤ T_train"),
    "lg_t_star": ("position of p*", "tokens", "t*"),
    "lg_worst_violation": ("worst violation", "1", "max over t ≥ t* of PPL(t) − p*"),
    "lg_worst_t": ("position of the worst violation", "tokens", "argmax of PPL(t) − p* over t ≥ t*"),
    "lg_max_t": ("longest evaluated position", "tokens", "largest binned position"),
    "ppl_in": ("in-range perplexity", "1", "mean binned PPL over the bins ending in (T_train/2, T_train]"),
    "ppl_far": ("far perplexity", "1", "mean binned PPL over the bins ending in the last eighth (7L/8, L] of the evaluation"),
    "far_in_ratio": ("far/in PPL ratio", "1", "ppl_far / lg_p_star; above 1 the PPL rises beyond T_train"),
    "far_over_in": ("far / in-range PPL", "1",
                    "ppl_far / ppl_in: one in-range reference for every T_train (the bins ending in (T_train/2, T_train])"),
    "budget_blocks": ("training budget over the blocks", "1",
                      "tokens seen / (20 x parameters of the blocks, embedding and head left out)"),
    "annealed": ("trained to this budget alone", "1",
                 "True: a separate run whose schedule ends at its one budget; False: checkpoints inside one run"),
    "checkpoint_step": ("training step of the checkpoint", "1", "steps after which the model has seen the budget"),
    "first_rise_budget": ("first budget with a PPL rise", "1",
                          "smallest checkpoint budget whose far_in_ratio exceeds 1 (NaN: none)"),
    "damaged": ("damaged in range", "1",
                "1 if a post-training arm's in-range accuracy fell below learned_at (0: kept, NaN: not tested)"),
}

# The paired contrasts of a length-generalization study's far and in-range PPL (arm − zero control).
for _prefix, _what in (("far_", "far PPL"), ("in_", "in-range PPL")):
    _ENTRIES[f"{_prefix}contrast_mean"] = (f"paired difference of the {_what} (arm − zero)", "1",
                                          f"mean over seeds of {_what}(arm) − {_what}(zero control)")
    _ENTRIES[f"{_prefix}contrast_lo"] = (f"paired difference of the {_what}, 95 % CI low", "1", _ENTRIES["contrast_lo"][2])
    _ENTRIES[f"{_prefix}contrast_hi"] = (f"paired difference of the {_what}, 95 % CI high", "1", _ENTRIES["contrast_hi"][2])
    _ENTRIES[f"{_prefix}contrast_p"] = (f"paired t-test p-value of the {_what}", "1", "two-sided p of the paired t-test, uncorrected")
    _ENTRIES[f"{_prefix}contrast_n"] = ("pairs", "1", "number of (arm, control) pairs in the contrast")

# The crossing time, crossed flag, failure mode and forecast of every readability ratio.
for _name, _what in (("par", "q∥"), ("pair", "q_pair"), ("pair_out", "q_pair_out"), ("dec", "q_dec"),
                     ("pair_ref", "q_pair_ref"), ("dec_ref", "q_dec_ref")):
    _ENTRIES[f"T_cross_{_name}"] = (f"first persistent crossing of {_what} ≥ τ", "tokens", _CENSORED)
    _ENTRIES[f"crossed_{_name}"] = (f"{_what} crossed the threshold", "1", "persistently, within the horizon")
    _ENTRIES[f"failure_mode_{_name}"] = (f"failure mode from {_what} (saturation|climb|robust)", "1",
                                         "same rules as failure_mode")
    if _name in ("pair", "pair_out", "dec"):
        _ENTRIES[f"T_forecast_{_name}"] = (f"forecast crossing of {_what} from the training length", "tokens", _FORECAST)

# One correlation of T_cross with mp (CorrelationResult.to_dataset), plain and as the study's
# default-variant scalars ``corr_<name>``.
for _name, (_long, _desc) in {
    "pearson_r": ("Pearson r(T_cross, mp)", ""),
    "pearson_r_lo": ("Pearson r, lower end of the bootstrap CI", "level: attr ci_level"),
    "pearson_r_hi": ("Pearson r, upper end of the bootstrap CI", "level: attr ci_level"),
    "spearman_rho": ("Spearman ρ(T_cross, mp)", ""),
    "spearman_rho_lo": ("Spearman ρ, lower end of the bootstrap CI", "level: attr ci_level"),
    "spearman_rho_hi": ("Spearman ρ, upper end of the bootstrap CI", "level: attr ci_level"),
    "n_runs": ("runs given", ""),
    "n_used": ("runs used", "after the censoring rule"),
    "n_tcross_censored": ("runs with T_cross censored", "never crossed"),
    "n_mp_censored": ("runs with mp censored", "passed every length"),
    "n_both_censored": ("runs with both censored", ""),
    "n_dropped": ("runs left out", "by the censoring rule"),
    "n_boot_degenerate": ("bootstrap resamples with a constant variable", ""),
}.items():
    _ENTRIES[_name] = (_long, "1", _desc)
    _ENTRIES[f"corr_{_name}"] = (_long.replace("T_cross", "T_cross of the default variant"), "1",
                                 "ok runs; the variant is the attr variant" + (f"; {_desc}" if _desc else ""))

# -- state geometry of the long-context task models (dynlab.lm.analysis.state_geometry) ------------------
_T = "the task's symbolic variable (passkey: the key's last digit; copying: the first letter)"
_ENTRIES.update({
    "distance": ("distance since the variable was written", "tokens",
                 "passkey: filler tokens after the needle; copying: letters in the string"),
    "geo_q": ("distinguishability ratio q = R/M of the task variable", "1", "per distance bin; classes: " + _T),
    "geo_R": ("RMS within-class scatter R of the task variable", "1", "last layer's flat SSM state"),
    "geo_M": ("minimum centroid separation M of the task variable", "1", "last layer's flat SSM state"),
    "geo_R_par": ("RMS scatter along U, R∥, of the task variable", "1", "residual projected on U"),
    "geo_R_perp": ("RMS scatter orthogonal to U, R⊥, of the task variable", "1", "residual projected on U⊥"),
    "geo_k_U": ("dim U of the task variable", "1", "rank of the centred class centroids"),
    "geo_probe_accuracy": ("cross-validated linear-probe accuracy of the task variable", "1",
                           "standardised states, logistic regression, 5-fold stratified cross-validation"),
    "geo_accuracy": ("retrieval accuracy at the distance", "1",
                     "passkey: whole key exact; copying: per character; on the probe samples"),
    "geo_T_cross": ("first distance with q ≥ τ", "tokens", "τ: attr geo_tau; censored at the largest distance (geo_crossed False)"),
    "geo_crossed": ("q reached τ within the distances", "", "False: geo_T_cross is censored"),
    "geo_horizon": ("first distance with retrieval accuracy < 0.5", "tokens",
                    "censored at the largest distance (geo_horizon_reached False)"),
    "geo_horizon_reached": ("retrieval accuracy fell below 0.5", "", "False: geo_horizon is censored"),
    "geo_rho": ("spectral radius of the state-update Jacobian", "1", "last layer's own block, median over trajectories"),
    "geo_rho_par": ("spectral radius of the Jacobian on U, ρ∥", "1", "Bᵀ J B, U of the last layer"),
    "geo_rho_perp": ("spectral radius of the Jacobian on U⊥, ρ⊥", "1", "J restricted to the complement of U"),
    "geo_fp_count": ("fixed points under the filler token", "1", "distinct solutions of F(h) = h; NaN: not searched"),
    "geo_fp_residual": ("fixed-point residual ‖F(h*) − h*‖", "1", "largest over those found, else the best solve"),
    "geo_fp_rho_par": ("ρ∥ at the filler fixed point", "1", "first fixed point found"),
    "geo_fp_rho_perp": ("ρ⊥ at the filler fixed point", "1", "first fixed point found"),
})

#: name -> :class:`Variable`; read-only: the vocabulary is complete at import time.
VARIABLES = MappingProxyType({k: Variable(*v) for k, v in _ENTRIES.items()})
del _ENTRIES


def attrs_of(name: str, **extra: Any) -> dict[str, Any]:
    """``long_name``, ``units`` and ``description`` of ``name`` (plus ``extra`` attrs).

    An unregistered name is a programming error (KeyError naming it): add it to
    :data:`VARIABLES` first.
    """
    try:
        v = VARIABLES[name]
    except KeyError:
        raise KeyError(f"{name!r} is not in the dataset vocabulary (dynlab.results.vocabulary.VARIABLES)") from None
    return {"long_name": v.long_name, "units": v.units, "description": v.description, **extra}


def var(name: str, dims: Any, values: Any, **extra: Any) -> tuple[Any, Any, dict[str, Any]]:
    """``(dims, values, attrs)`` of variable ``name`` for an ``xr.Dataset`` constructor."""
    return dims, values, attrs_of(name, **extra)


def annotate(obj: xr.Dataset | xr.DataArray) -> Any:
    """Set ``long_name``/``units``/``description`` of every registered variable and
    coordinate of ``obj`` from :data:`VARIABLES` (in place; other attrs are kept).  Returns
    ``obj``.  A DataArray is labelled by its ``name``."""
    if isinstance(obj, xr.DataArray):
        if obj.name in VARIABLES:
            obj.attrs.update(attrs_of(str(obj.name)))
        for c in obj.coords:
            if c in VARIABLES:
                obj[c].attrs.update(attrs_of(str(c)))
        return obj
    for name in list(obj.data_vars) + list(obj.coords):
        if name in VARIABLES:
            obj[name].attrs.update(attrs_of(str(name)))
    return obj


def unregistered(ds: xr.Dataset) -> list[str]:
    """Variables, coordinates and dimensions of ``ds`` that are not in the vocabulary."""
    names = [*ds.data_vars, *ds.coords, *ds.dims]
    return sorted({str(n) for n in names if n not in VARIABLES})


def check_dataset(ds: xr.Dataset) -> list[str]:
    """What in ``ds`` breaks the vocabulary: names that are not registered, and variables
    or coordinates whose ``long_name``/``units`` attrs are missing or differ from the
    registry.  Empty when the dataset speaks the vocabulary."""
    out = [f"{n}: not in the vocabulary" for n in unregistered(ds)]
    for name in [*ds.data_vars, *ds.coords]:
        if name not in VARIABLES:
            continue
        attrs, v = ds[name].attrs, VARIABLES[name]
        for key, want in (("long_name", v.long_name), ("units", v.units)):
            if attrs.get(key) != want:
                out.append(f"{name}: {key} {attrs.get(key)!r}, vocabulary {want!r}")
    return out
