"""Policy losses and loss aggregation (registry ``POLICY_LOSSES``).

All tensors are ``(B, T)`` over response-token positions with a float ``mask``; ``weight`` is one
number per sequence (GRAFT's compatibility weight w, 1 for self samples). A loss returns
``(loss, stats)`` where ``stats`` holds *sums* (token counts, clipped-token counts, ...) that the
trainer adds over micro-batches and divides once per step, so every reported fraction is exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graft_cli.registry import Registry

POLICY_LOSSES: Registry = Registry("policy loss")
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


@dataclass(frozen=True)
class Normaliser:
    """Minibatch-level denominators, fixed before the micro-batches of one optimizer step are run, so
    gradient accumulation over micro-batches equals one pass over the whole minibatch (verl's
    ``agg_loss`` with a global token count)."""

    num_tokens: float  # Σ_j |o_j| over the retained responses of the minibatch
    num_seqs: float  # number of retained responses in the minibatch
    loss_scale_factor: float | None = None  # seq-mean-token-sum-norm constant (max response length)
    aux_seqs: float = 0.0  # auxiliary rows (``TrainBatch.extra["aux"]``, e.g. SGT's NLL rows), not in the above


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, norm: Normaliser) -> torch.Tensor:
    """Aggregate a per-token loss matrix (verl ``agg_loss`` / TRL ``loss_type``):

    - ``token-mean`` (DAPO, TRL ``dapo``): Σ_{j,t} L_{j,t} / Σ_j |o_j|
    - ``seq-mean-token-mean`` (GRPO, TRL ``grpo``): (1/N) Σ_j (Σ_t L_{j,t} / |o_j|)
    - ``seq-mean-token-sum``: (1/N) Σ_j Σ_t L_{j,t}
    - ``seq-mean-token-sum-norm`` (Dr. GRPO): (1/N) Σ_j Σ_t L_{j,t} / C, C = ``loss_scale_factor``
    """
    if mode == "token-mean":
        return (loss_mat * mask).sum() / max(norm.num_tokens, 1.0)
    seq_sum = (loss_mat * mask).sum(-1)
    if mode == "seq-mean-token-mean":
        return (seq_sum / mask.sum(-1).clamp(min=1.0)).sum() / max(norm.num_seqs, 1.0)
    if mode == "seq-mean-token-sum":
        return seq_sum.sum() / max(norm.num_seqs, 1.0)
    if mode == "seq-mean-token-sum-norm":
        c = norm.loss_scale_factor or float(mask.shape[-1])
        return (seq_sum / c).sum() / max(norm.num_seqs, 1.0)
    raise ValueError(f"unknown loss aggregation {mode!r}; known: {', '.join(AGG_MODES)}")


def clipped_token_mask(ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float):
    """Tokens where the clipped surrogate is strictly smaller than the unclipped one (graft.md §4,
    App. H; TRL ``clip_ratio/low`` and ``/high``): low = â<0 ∧ ρ<1−ε_low, high = â>0 ∧ ρ>1+ε_high."""
    low = (adv < 0) & (ratio < 1.0 - clip_low)
    high = (adv > 0) & (ratio > 1.0 + clip_high)
    return low, high


def clip_stats(ratio, adv, mask, is_peer, clip_low, clip_high) -> dict[str, torch.Tensor]:
    """Sums for clip metrics, split into self and peer (grafted) tokens."""
    low, high = clipped_token_mask(ratio, adv, clip_low, clip_high)
    m = mask > 0
    peer = is_peer[:, None].expand_as(m) & m
    own = (~is_peer)[:, None].expand_as(m) & m
    f = lambda x: x.sum().detach().to(torch.float64)  # noqa: E731
    return {
        "tokens": f(m), "tokens_self": f(own), "tokens_peer": f(peer),
        "clip_low": f(low & m), "clip_high": f(high & m),
        "clip_self": f((low | high) & own), "clip_peer": f((low | high) & peer),
    }


def ppo_surrogate(logp, old_logp, adv, clip_low: float, clip_high: float, log_ratio_clamp: float = 20.0):
    """Per-token PPO loss −min(ρÂ, clip(ρ, 1−ε_low, 1+ε_high)Â), ρ = exp(logπ_θ − logπ_old)
    (log-ratio clamped to ±20 as verl does, for numerical safety only). Returns (loss, ρ)."""
    ratio = torch.exp((logp - old_logp).clamp(-log_ratio_clamp, log_ratio_clamp))
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    return -torch.minimum(unclipped, clipped), ratio


@POLICY_LOSSES.register("ppo_token")
def ppo_token_loss(logp, old_logp, adv, mask, weight, is_peer, *, clip_low=0.2, clip_high=0.28,
                   agg="token-mean", norm: Normaliser, **_):
    """GRAFT's receiver objective (Eq. 9–10), which is the DAPO GRPO surrogate when w ≡ 1:
    L = (1/Σ_j|o_j|) Σ_j w_j Σ_t −min(ρ_{j,t}Â_j, clip(ρ_{j,t}, 1−ε_low, 1+ε_high)Â_j), with ρ against
    the receiver's own old policy for self and grafted tokens alike; w does not enter the denominator."""
    per_tok, ratio = ppo_surrogate(logp, old_logp, adv, clip_low, clip_high)
    loss = agg_loss(per_tok * weight[:, None], mask, agg, norm)
    return loss, clip_stats(ratio.detach(), adv, mask, is_peer, clip_low, clip_high)


@POLICY_LOSSES.register("ppo_seq")
def ppo_seq_loss(logp, old_logp, adv, mask, weight, is_peer, *, clip_low=0.2, clip_high=0.28,
                 agg="token-mean", norm: Normaliser, **_):
    """Sequence-level ratio (GSPO; graft.md §8 item 5, "w/o token-level ratio"):
    s_j = exp(mean_t(logπ_θ − logπ_old)), with the straight-through token form of GSPO-token
    (ρ_{j,t} = sg(s_j)·π_θ/sg(π_θ)) so every token of a sequence shares the value s_j; same clip range."""
    m = mask
    log_s = ((logp - old_logp) * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    log_tok = log_s.detach()[:, None] + logp - logp.detach()
    per_tok, ratio = ppo_surrogate(log_tok, torch.zeros_like(log_tok), adv, clip_low, clip_high)
    loss = agg_loss(per_tok * weight[:, None], mask, agg, norm)
    return loss, clip_stats(ratio.detach(), adv, mask, is_peer, clip_low, clip_high)

from graft_cli.algorithms import peer_losses  # noqa: E402,F401  (registers luffy, hacpo_peer, ppo_token_nll)
