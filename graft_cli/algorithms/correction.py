"""Truncated importance-sampling (TIS) correction of the sampler-vs-trainer mismatch (registry ``IS_CORRECTIONS``).

The engine that sampled a response (vLLM, bf16 kernels) and the trainer that recomputes the old
log-probs disagree slightly, so the rollout is off-policy w.r.t. π_old. The correction re-weights each
token's policy-gradient term by the truncated ratio (conventions §5; verl ``rollout_is``, TRL
``vllm_importance_sampling_correction``):

- ``token``:    w_{j,t} = min(exp(logπ_old(o_{j,t}) − logπ_samp(o_{j,t})), C)
- ``sequence``: w_j     = min(exp(Σ_t logπ_old(o_{j,t}) − logπ_samp(o_{j,t})), C), shared by the row's tokens
- ``none``:     no weights (the default; with the in-process HF engine the two agree to ~1e-5)

C = ``algo.is_threshold`` (verl's ``rollout_is_threshold``, default 2.0). The weights are constants
(no gradient) and multiply the advantages, which for the PPO-clip surrogate equals multiplying the
per-token loss (min(ρwA, clip(ρ)wA) = w·min(ρA, clip(ρ)A) for w > 0), as TRL's ``per_token_loss *=
importance_sampling_ratio``. Only the receiver's own rows ("self", with sampler log-probs) are weighted;
grafted/teacher rows get weight 1. Metrics are TRL's ``sampling/importance_sampling_ratio/{mean,min,max}``,
computed after truncation, over tokens (token mode) or sequences (sequence mode).
"""

from __future__ import annotations

import torch

from graft_cli.registry import Registry

IS_CORRECTIONS: Registry = Registry("importance-sampling correction")


@IS_CORRECTIONS.register("none")
def no_correction(old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, threshold: float):
    return None


@IS_CORRECTIONS.register("token")
def token_tis(old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, threshold: float):
    """(B, T) tensors -> (B, T) weights min(exp(old − samp), C), 0 outside ``mask``."""
    log_r = ((old_logp - sampler_logp) * mask).clamp(max=torch.log(torch.tensor(float(threshold))).item())
    return torch.exp(log_r) * mask


@IS_CORRECTIONS.register("sequence")
def sequence_tis(old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, threshold: float):
    """(B, T) tensors -> (B, T) weights min(exp(Σ_t (old − samp)), C), broadcast over ``mask``."""
    log_r = ((old_logp - sampler_logp) * mask).sum(-1, keepdim=True)
    log_r = log_r.clamp(max=torch.log(torch.tensor(float(threshold))).item())
    return torch.exp(log_r) * mask


def batch_is_weights(old_logprobs: list[list[float]], sampler_logprobs: list, source: list[str], mode: str,
                     threshold: float) -> tuple[list[list[float]] | None, dict]:
    """Per-row, per-token weights for a TrainBatch (``None`` when ``mode == "none"``) and the metrics.
    Rows that are not the receiver's own samples, or have no usable sampler log-probs, get weight 1."""
    fn = IS_CORRECTIONS.get(mode)
    if mode == "none":
        return None, {}
    rows = [i for i, (s, samp, old) in enumerate(zip(source, sampler_logprobs, old_logprobs))
            if s == "self" and samp is not None and len(samp) == len(old) and len(old) > 0]
    weights = [[1.0] * len(x) for x in old_logprobs]
    if not rows:
        return weights, {}
    T = max(len(old_logprobs[i]) for i in rows)
    old = torch.zeros(len(rows), T, dtype=torch.float64)
    samp = torch.zeros_like(old)
    mask = torch.zeros_like(old)
    for k, i in enumerate(rows):
        n = len(old_logprobs[i])
        old[k, :n] = torch.tensor(old_logprobs[i], dtype=torch.float64)
        samp[k, :n] = torch.tensor(sampler_logprobs[i], dtype=torch.float64)
        mask[k, :n] = 1.0
    w = fn(old, samp, mask, threshold)
    for k, i in enumerate(rows):
        weights[i] = w[k, : len(old_logprobs[i])].tolist()
    vals = w[:, 0] if mode == "sequence" else w[mask > 0]
    return weights, {"sampling/importance_sampling_ratio/mean": float(vals.mean()),
                     "sampling/importance_sampling_ratio/min": float(vals.min()),
                     "sampling/importance_sampling_ratio/max": float(vals.max())}
