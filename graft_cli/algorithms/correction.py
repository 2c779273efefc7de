"""Truncated importance-sampling (TIS) correction of the rollout-vs-trainer mismatch (registry
``IS_CORRECTIONS``).

The engine that sampled a response (vLLM, bf16 kernels; or older weights at ``run.staleness`` >= 1)
and the trainer that recomputes the old log-probs disagree, so the rollout is off-policy w.r.t.
π_old: the behaviour policy π_rollout (the weights the engine sampled with; its log-probs are the
rollout log-probs) is not the proximal policy π_old. The correction re-weights each token's
policy-gradient term by the truncated ratio (docs/spec/rollout_corr.md §2; verl ``rollout_is``, TRL
``vllm_importance_sampling_correction``):

- ``token``:    w_{j,t} = min(exp(logπ_old(o_{j,t}) − logπ_rollout(o_{j,t})), C)
- ``sequence``: w_j     = min(exp(Σ_t logπ_old(o_{j,t}) − logπ_rollout(o_{j,t})), C), shared by the
  row's tokens
- ``none``:     no weights (the default; with the in-process HF engine the two agree to ~1e-5)

C = ``algo.is_threshold`` (verl's ``rollout_is_threshold``, default 2.0). The weights are constants
(no gradient) and multiply the advantages, which for the PPO-clip surrogate equals multiplying the
per-token loss (min(ρwA, clip(ρ)wA) = w·min(ρA, clip(ρ)A) for w > 0), as TRL's ``per_token_loss *=
importance_sampling_ratio``. Only the receiver's own rows ("self", with rollout log-probs) are
weighted; grafted/teacher rows get weight 1. Metrics are TRL's
``sampling/importance_sampling_ratio/{mean,min,max}``, computed after truncation, over tokens (token
mode) or sequences (sequence mode). """

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from graft_cli.registry import Params, Registry

IS_CORRECTIONS: Registry = Registry("importance-sampling correction")


@IS_CORRECTIONS.register("none")
def no_correction(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, threshold: float):
    return None


@IS_CORRECTIONS.register("token")
def token_tis(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, threshold: float):
    """(B, T) tensors -> (B, T) weights min(exp(old − roll), C), 0 outside ``mask``."""
    log_r = ((old_logp - rollout_logp) * mask).clamp(max=torch.log(torch.tensor(float(threshold))).item())
    return torch.exp(log_r) * mask


@IS_CORRECTIONS.register("sequence")
def sequence_tis(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, threshold: float):
    """(B, T) tensors -> (B, T) weights min(exp(Σ_t (old − roll)), C), broadcast over ``mask``."""
    log_r = ((old_logp - rollout_logp) * mask).sum(-1, keepdim=True)
    log_r = log_r.clamp(max=torch.log(torch.tensor(float(threshold))).item())
    return torch.exp(log_r) * mask


def self_rows_padded(old_logprobs: list, rollout_logprobs: list, source: list[str]):
    """The receiver's own rows with usable rollout log-probs (``source == "self"``, same length,
    non-empty) and their old / rollout log-probs and mask as (R, T) float64 tensors padded with 0:
    ``(rows, old, roll, mask)``."""
    rows = [i for i, (s, roll, old) in enumerate(zip(source, rollout_logprobs, old_logprobs))
            if s == "self" and roll is not None and len(roll) == len(old) and len(old) > 0]
    T = max((len(old_logprobs[i]) for i in rows), default=0)
    old = torch.zeros(len(rows), T, dtype=torch.float64)
    roll, mask = torch.zeros_like(old), torch.zeros_like(old)
    for k, i in enumerate(rows):
        n = len(old_logprobs[i])
        old[k, :n] = torch.tensor(old_logprobs[i], dtype=torch.float64)
        roll[k, :n] = torch.tensor(rollout_logprobs[i], dtype=torch.float64)
        mask[k, :n] = 1.0
    return rows, old, roll, mask


def batch_is_weights(old_logprobs: list[list[float]], rollout_logprobs: list, source: list[str], mode: str,
                     threshold: float) -> tuple[list[list[float]] | None, dict]:
    """Per-row, per-token weights for a TrainBatch (``None`` when ``mode == "none"``) and the
    metrics. Rows that are not the receiver's own samples, or have no usable rollout log-probs, get
    weight 1."""
    fn = IS_CORRECTIONS.get(mode)
    if mode == "none":
        return None, {}
    rows, old, roll, mask = self_rows_padded(old_logprobs, rollout_logprobs, source)
    weights = [[1.0] * len(x) for x in old_logprobs]
    if not rows:
        return weights, {}
    w = fn(old, roll, mask, threshold)
    for k, i in enumerate(rows):
        weights[i] = w[k, : len(old_logprobs[i])].tolist()
    vals = w[:, 0] if mode == "sequence" else w[mask > 0]
    return weights, {"sampling/importance_sampling_ratio/mean": float(vals.mean()),
                     "sampling/importance_sampling_ratio/min": float(vals.min()),
                     "sampling/importance_sampling_ratio/max": float(vals.max()),
                     # the share the truncation at C cut (ratio above C: weight C)
                     "sampling/importance_sampling_ratio/clipped_fraction": float((vals >= threshold).float().mean())}


# ------------------------------------------------------------------ rejection masks and mismatch metrics
# verl's rollout correction (docs/spec/rollout_corr.md §3; trainer/ppo/rollout_corr_helper.py) beside the TIS weights
# above: rejection sampling drops the tokens or whole responses whose trainer/rollout ratio is an outlier from the
# loss (they leave the loss mask, so the token-mean and seq-mean denominators too), a per-token veto drops a whole
# response that holds one catastrophic token, and the off-policy metrics say how far apart the two are. IcePop
# (Ring-1T, 2025) is the token band mask M(k) = 1[α ≤ k ≤ β]; its weight k inside the band is token TIS with
# C ≥ β (``algo.is_correction: token``, ``algo.is_threshold: 5``), which truncates nothing inside the band.
# A rejection mask is ``fn(log_ratio, mask, p) -> keep`` with ``p`` the object of its Params class.
ROLLOUT_REJECTIONS: Registry = Registry("rollout rejection mask", Params)  # spec: its parameters' defaults
SAFETY_BOUND = 20.0  # |log ratio| clamp before exp (verl's SAFETY_BOUND)


def _band(log_w: torch.Tensor, upper: float, lower: float) -> torch.Tensor:
    """1 where lower ≤ exp(log_w) ≤ upper (compared in log space), else 0; ``lower`` 0 means 1/upper
    (verl)."""
    lo = 1.0 / upper if lower <= 0 else lower
    return ((log_w >= math.log(lo)) & (log_w <= math.log(upper))).to(log_w.dtype)


def _seq_masked(x: torch.Tensor, mask: torch.Tensor, mean: bool) -> torch.Tensor:
    s = (x * mask).sum(-1, keepdim=True)
    return s / mask.sum(-1, keepdim=True).clamp(min=1) if mean else s


@ROLLOUT_REJECTIONS.register("none")
def no_rejection(log_ratio: torch.Tensor, mask: torch.Tensor, p: Params) -> torch.Tensor:
    """Every token kept."""
    return mask.clone()


@dataclass(frozen=True)
class RatioBandParams(Params):
    """``algo.rollout_correction.params`` of the ``token``, ``sequence`` and ``geometric`` masks."""

    threshold: float = 2.0  # U
    threshold_lower: float = 0.0  # L (0: 1/U)


@ROLLOUT_REJECTIONS.register("token", spec=RatioBandParams())
def token_rejection(log_ratio: torch.Tensor, mask: torch.Tensor, p: RatioBandParams):
    """keep_{j,t} = 1[L ≤ ρ_{j,t} ≤ U] with ρ = π_old/π_rollout per token (verl ``rollout_rs:
    token``; U = ``threshold``, L = ``threshold_lower``, 0: 1/U)."""
    return _band(log_ratio, p.threshold, p.threshold_lower) * mask


@ROLLOUT_REJECTIONS.register("sequence", spec=RatioBandParams())
def sequence_rejection(log_ratio: torch.Tensor, mask: torch.Tensor, p: RatioBandParams):
    """keep_j = 1[L ≤ Π_t ρ_{j,t} ≤ U] on every token of response j (verl ``rollout_rs:
    sequence``)."""
    return _band(_seq_masked(log_ratio, mask, mean=False), p.threshold, p.threshold_lower) * mask


@ROLLOUT_REJECTIONS.register("geometric", spec=RatioBandParams())
def geometric_rejection(log_ratio: torch.Tensor, mask: torch.Tensor, p: RatioBandParams):
    """keep_j = 1[L ≤ exp(mean_t log ρ_{j,t}) ≤ U] (verl ``rollout_rs: geometric``: the geometric
    mean of the token ratios, a length-independent sequence test)."""
    return _band(_seq_masked(log_ratio, mask, mean=True), p.threshold, p.threshold_lower) * mask


@dataclass(frozen=True)
class IcePopParams(Params):
    alpha: float = 0.5  # the band's lower end (Ring-1T's value)
    beta: float = 5.0  # its upper end


@ROLLOUT_REJECTIONS.register("icepop", spec=IcePopParams())
def icepop_rejection(log_ratio: torch.Tensor, mask: torch.Tensor, p: IcePopParams):
    """IcePop's band: keep_{j,t} = 1[α ≤ ρ_{j,t} ≤ β] (α 0.5, β 5: Ring-1T's values)."""
    return _band(log_ratio, p.beta, p.alpha) * mask


def rejection_params(name: str, params: dict | None) -> Params:
    """The checked parameters of rejection mask ``name``, its Params class's object (one-line error
    naming ``algo.rollout_correction.params.<key>``)."""
    return type(ROLLOUT_REJECTIONS.spec(name)).check(params, "algo.rollout_correction.params",
                                                     f"rejection mask {name!r}")


def token_veto(log_ratio: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """keep_j = 0 when any token of response j has ρ_{j,t} < ``threshold`` (verl
    ``rollout_token_veto_threshold``); (B, 1) 0/1."""
    bad = (log_ratio < math.log(threshold)) & (mask > 0)
    return (~bad.any(-1, keepdim=True)).to(log_ratio.dtype)


def mismatch_metrics(old: torch.Tensor, roll: torch.Tensor, mask: torch.Tensor) -> dict:
    """verl's off-policy diagnostics between the proximal policy (π_old, the trainer's) and the
    behaviour policy (π_rollout, the rollout log-probs) over the masked tokens: ``kl`` = mean_t(log
    π_rollout − log π_old) (KL(π_rollout‖π_old), k1), ``k3_kl`` = mean_t(ρ − log ρ − 1),
    ``training_ppl`` / ``rollout_ppl`` = mean_j exp(−mean_t log π), ``log_ppl_diff`` = mean_j(mean_t
    log π_rollout − mean_t log π_old) (the log of training PPL / rollout PPL), ``ppl_ratio`` =
    mean_j exp(that), ``chi2_token`` = mean_t ρ² − 1, ``chi2_seq`` = mean_j (Π_t ρ)² − 1 (ρ clamped
    to e^±20)."""
    n = mask.sum()
    lr = (old - roll) * mask
    tok = lambda x: float((x * mask).sum() / n)  # noqa: E731
    m_old, m_roll = _seq_masked(old, mask, True).squeeze(-1), _seq_masked(roll, mask, True).squeeze(-1)
    diff = m_roll - m_old
    rho = torch.exp(lr.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    seq = lr.sum(-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {"kl": tok(roll - old), "k3_kl": tok(rho - lr - 1), "training_ppl": float(torch.exp(-m_old).mean()),
            "rollout_ppl": float(torch.exp(-m_roll).mean()), "log_ppl_diff": float(diff.mean()),
            "log_ppl_abs_diff": float(diff.abs().mean()), "ppl_ratio": float(torch.exp(diff).mean()),
            "chi2_token": tok(rho.square()) - 1.0, "chi2_seq": float(torch.exp(2 * seq).mean()) - 1.0}


def batch_rejection(old_logprobs: list, rollout_logprobs: list, source: list[str], loss_mask: list | None,
                    rejection: str, params: Params, veto_threshold: float, metrics: bool) -> tuple[list | None, dict]:
    """The loss mask of a TrainBatch with the rejection mask (``params``: its Params class's object,
    a TypeError otherwise) and the veto applied to the receiver's own rows (those with rollout
    log-probs; grafted, teacher and stored rows are kept as they are), and the ``rollout_corr/*``
    metrics over those rows (verl's names): the mismatch metrics, ``rs_masked_fraction`` (tokens
    dropped), ``rs_seq_masked_fraction`` (responses with a dropped token), ``veto_fraction``."""
    fn = ROLLOUT_REJECTIONS.get(rejection)
    kind = type(ROLLOUT_REJECTIONS.spec(rejection))
    if not isinstance(params, kind):
        raise TypeError(f"rejection mask {rejection!r}: parameters must be a {kind.__name__}, "
                        f"got {type(params).__name__}")
    rows, old, roll, mask = self_rows_padded(old_logprobs, rollout_logprobs, source)
    if not rows or (rejection == "none" and veto_threshold <= 0 and not metrics):
        return loss_mask, {}
    lmask = mask.clone()
    for k, i in enumerate(rows):
        m = None if loss_mask is None else loss_mask[i]
        if m is not None:
            lmask[k, :len(m)] = torch.tensor(m, dtype=torch.float64)
    log_ratio = (old - roll) * mask
    keep = fn(log_ratio, mask, params)
    met = {f"rollout_corr/{k}": v for k, v in mismatch_metrics(old, roll, mask).items()} if metrics else {}
    if veto_threshold > 0:
        veto = token_veto(log_ratio, mask, veto_threshold)
        met["rollout_corr/veto_fraction"] = float(1 - veto.mean())
        keep = keep * veto
    if rejection == "none" and veto_threshold <= 0:
        return loss_mask, met
    dropped = (1 - keep) * mask
    met["rollout_corr/rs_masked_fraction"] = float(dropped.sum() / mask.sum())
    met["rollout_corr/rs_seq_masked_fraction"] = float((dropped.sum(-1) > 0).to(torch.float64).mean())
    out = list(loss_mask) if loss_mask is not None else [None] * len(old_logprobs)
    for k, i in enumerate(rows):
        n = len(old_logprobs[i])
        out[i] = (lmask[k, :n] * keep[k, :n]).tolist()
    return out, met
