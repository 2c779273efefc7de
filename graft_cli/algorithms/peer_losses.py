"""Policy losses for cross-model update variants (registry ``POLICY_LOSSES``; graft.md §3,
baselines.md).

Same signature as :mod:`graft_cli.algorithms.losses`: ``spec(LossInputs) -> (loss, stats)``,
parameters from ``algo.loss_params`` (a :class:`~graft_cli.registry.Params` dataclass next to each
loss holds their defaults; the loss reads its object, ``inp.params``).

- ``luffy``: GRAFT's "LUFFY update" (graft.md §3): self tokens use the clipped PPO surrogate; peer
  tokens use −f(π_θ(o_t|·))·Â with f(x) = x/(x+γ); the peer behaviour probability is taken as 1, no
  clip on peer tokens (no gate: pair it with ``gate: none``). Parameter ``gamma`` (0.1).
- ``hacpo_peer``: HACPO's update (baselines.md §1.2): self rows the GSPO sequence-ratio surrogate
  with the configured clip (HACPO: 3e-4/4e-4); peer rows Exponential IS with stepwise clipping, ŝ =
  clamp(exp(clamp(ℓ̄_θ^R − ℓ̄_src, ±10)), L_m, 1), objective ŝ·sg(ŝ)·c(src→tgt)·Â (α = 1, no min
  with the unclipped term), L_m = min(1, L_0 + m·Δ) with m the minibatch index (``schedule: step``:
  the training step). Parameters ``lower_bound`` L_0 (0.8), ``lower_bound_step`` Δ (0.025),
  ``schedule`` (minibatch | step), ``peer_coef`` (1.0). Per-row columns ``n_scored``,
  ``source_logp_mean``, ``hacpo_c``. Use ``algo.agg=seq-mean-token-mean`` (HACPO); HACPO's released
  schedule of m (self rows first, then peer rows, in chunks of minibatch_prompts × n rows, split
  over the launcher's 8 ranks: ``exchange.layout``) is the minibatch ordering ``self_first_rows``,
  its EOS contract the loss mask ``strip_eos`` and its KL scope ``algo.kl_rows: self``. Metric
  ``hacpo/L_m``: the mean bound over the step's peer rows.
- ``ppo_token_nll``: "SFT update" (SGT; baselines.md §2.3 defaults): the PPO token loss on the rows
  in the policy gradient plus λ·NLL on the rows that are not (``in_pg`` false), NLL = token-mean
  −log π_θ over the row's tokens, averaged over those rows of the minibatch (``norm.aux_seqs``);
  they enter neither the PPO denominator nor its numerator. Parameter ``nll_coef`` λ (0.1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graft_cli.algorithms.losses import (LossInputs, agg_loss, clip_stats, ppo_surrogate, register_loss,
                                         sequence_log_ratio_tokens)
from graft_cli.registry import Params, choice


def _seq_adv(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (adv * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


@dataclass(frozen=True)
class LuffyParams(Params):
    gamma: float = 0.1  # f(x) = x/(x+γ) on peer tokens


@register_loss("luffy", params=LuffyParams)
def luffy_loss(inp: LossInputs):
    """graft.md §3 "LUFFY update": self tokens −min(ρÂ, clip(ρ)Â); peer tokens −f(π_θ)·Â, f(x) =
    x/(x+γ) (no clip, behaviour prob 1); w per row; aggregation as configured (token-mean)."""
    gamma = float(inp.params.gamma)
    if gamma <= 0:
        raise ValueError("luffy: gamma must be > 0")
    self_tok, ratio = ppo_surrogate(inp.logp, inp.old_logp, inp.adv, inp.clip_low, inp.clip_high,
                                    clip_ratio_c=inp.clip_ratio_c)
    p = torch.exp(inp.logp)
    peer_tok = -(p / (p + gamma)) * inp.adv
    per_tok = torch.where(inp.is_peer[:, None], peer_tok, self_tok)
    loss = agg_loss(per_tok * inp.weight[:, None], inp.mask, inp.agg, inp.norm)
    stat_ratio = torch.where(inp.is_peer[:, None], torch.ones_like(ratio), ratio.detach())
    return loss, clip_stats(stat_ratio, inp.adv, inp.mask, inp.is_peer, inp.clip_low, inp.clip_high)


@dataclass(frozen=True)
class HacpoPeerParams(Params):
    lower_bound: float = 0.8  # L_0
    lower_bound_step: float = 0.025  # Δ: L_m = min(1, L_0 + m·Δ)
    schedule: str = choice("minibatch", "step")  # m: the minibatch index | the training step
    peer_coef: float = 1.0


@register_loss("hacpo_peer", params=HacpoPeerParams)
def hacpo_peer_loss(inp: LossInputs):
    """HACPO (baselines.md §1.2, paper eq. 59): self rows GSPO, min(sÂ, clip(s, 1−ε_l, 1+ε_h)Â) with
    s = exp(mean_t(logπ_θ − logπ_old)); peer rows ŝ·sg(ŝ)·c·Â with ŝ = clamp(s_x, L_m, 1), s_x =
    exp(clamp(mean_t logπ_θ(o^R) − mean_t logπ_src(o^S), −10, 10)) (terminal EOS excluded on both
    sides: columns ``n_scored``, ``source_logp_mean``), c = column ``hacpo_c``."""
    p: HacpoPeerParams = inp.params
    lb0, inc, coef = float(p.lower_bound), float(p.lower_bound_step), float(p.peer_coef)
    m, logp = inp.mask, inp.logp
    B, dev = m.shape[0], m.device
    # self: GSPO sequence ratio, straight-through token form (every token carries s_j); log s
    # clamped to ±10 as HACPO's max_abs_log_ratio (verl's GSPO clamps above only)
    log_tok = sequence_log_ratio_tokens(logp, inp.old_logp, m).clamp(min=-10.0)
    self_tok, ratio = ppo_surrogate(log_tok, torch.zeros_like(log_tok), inp.adv, inp.clip_low, inp.clip_high)
    # peer: exponential IS with stepwise clipping
    n_scored = inp.row("n_scored", float("inf"))
    scored = m * (torch.cumsum(m, -1) <= n_scored[:, None]).float()
    mean_tgt = (logp * scored).sum(-1) / scored.sum(-1).clamp(min=1.0)
    src_mean = inp.row("source_logp_mean", float("nan"))
    if bool((inp.is_peer & ~torch.isfinite(src_mean)).any()):
        raise ValueError("hacpo_peer: a peer row has no source mean log-prob (column source_logp_mean)")
    log_x = torch.nan_to_num((mean_tgt - src_mean).clamp(-10.0, 10.0), nan=0.0)
    s_x = torch.exp(log_x)
    idx = torch.full((B,), float(inp.mb_index if p.schedule == "minibatch" else inp.step), device=dev)
    lower = torch.clamp(lb0 + idx * inc, max=1.0)
    s_hat = torch.minimum(torch.maximum(s_x, lower), torch.ones_like(s_x))
    c = inp.row("hacpo_c", 1.0)
    obj = s_hat * s_hat.detach() * c * _seq_adv(inp.adv, m) * coef
    peer_tok = -obj[:, None].expand_as(m)
    per_tok = torch.where(inp.is_peer[:, None], peer_tok, self_tok)
    loss = agg_loss(per_tok * inp.weight[:, None], m, inp.agg, inp.norm)
    own = (~inp.is_peer).float()[:, None] * m
    st = clip_stats(ratio.detach(), inp.adv, own, inp.is_peer, inp.clip_low, inp.clip_high)
    peer_m = inp.is_peer.float()[:, None] * m
    low = (s_x < lower).float()[:, None] * peer_m
    high = (s_x > 1.0).float()[:, None] * peer_m
    f = lambda x: x.sum().detach().to(torch.float64)  # noqa: E731
    st["tokens"] = st["tokens"] + f(peer_m)
    st["tokens_peer"] = f(peer_m)
    st["clip_low"] = st["clip_low"] + f(low)
    st["clip_high"] = st["clip_high"] + f(high)
    st["clip_peer"] = f(low) + f(high)
    peer_rows = inp.is_peer.to(torch.float64)  # reported as hacpo/L_m: the mean bound over the step's peer rows
    st["hacpo/L_m/sum"] = (lower.detach().to(torch.float64) * peer_rows).sum()
    st["hacpo/L_m/n"] = peer_rows.sum()
    return loss, st


@dataclass(frozen=True)
class PpoTokenNllParams(Params):
    nll_coef: float = 0.1  # λ


@register_loss("ppo_token_nll", params=PpoTokenNllParams)
def ppo_token_nll_loss(inp: LossInputs):
    """SFT update (graft.md §3; baselines.md §2.3): L = L_PPO over the rows in the policy gradient
    (their own token-mean denominator) + (1/N_aux) Σ_{aux j} λ · (1/|o_j|) Σ_t −log π_θ(o_{j,t}|·)
    over the other rows (``in_pg`` false), λ = ``nll_coef``. Without such rows it is
    ``ppo_token``."""
    B, dev, mask = inp.mask.shape[0], inp.mask.device, inp.mask
    aux = ~inp.pg_rows()
    lam = torch.full((B,), float(inp.params.nll_coef), dtype=torch.float32, device=dev)
    pg_mask = mask * (~aux).float()[:, None]
    per_tok, ratio = ppo_surrogate(inp.logp, inp.old_logp, inp.adv, inp.clip_low, inp.clip_high,
                                   clip_ratio_c=inp.clip_ratio_c)
    loss = agg_loss(per_tok * inp.weight[:, None], pg_mask, inp.agg, inp.norm)
    nll = -(inp.logp * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    n_aux = float(inp.norm.aux_seqs or 0.0)
    if bool(aux.any()):
        loss = loss + (lam * nll * aux.float()).sum() / max(n_aux, 1.0)
    st = clip_stats(ratio.detach(), inp.adv, pg_mask, inp.is_peer & ~aux, inp.clip_low, inp.clip_high)
    st["nll_sum"] = (nll * aux.float()).sum().detach().to(torch.float64)
    st["nll_rows"] = aux.float().sum().detach().to(torch.float64)
    return loss, st
