"""Policy losses for cross-model update variants (registry ``POLICY_LOSSES``; graft.md §3, baselines.md).

Same calling convention as :mod:`graft_cli.algorithms.losses`: ``(B, T)`` tensors over response-token
positions, ``weight`` one number per row (GRAFT's w), ``is_peer`` per row, plus ``extra`` (per-row method
columns from ``TrainBatch.extra``, restricted to the micro-batch's rows), ``mb_index`` (the minibatch's
index within the step) and ``cfg``. Each returns ``(loss, stats)`` with summed stats.

- ``luffy``: GRAFT's "LUFFY update" (graft.md §3): self tokens use the clipped PPO surrogate; peer tokens
  use −f(π_θ(o_t|·))·Â with f(x) = x/(x+γ), γ = ``exchange.params.luffy_gamma`` (0.1): the peer behaviour
  probability is taken as 1, no clip on peer tokens (no gate: pair it with ``gate: none``).
- ``hacpo_peer``: HACPO's update (baselines.md §1.2): self rows the GSPO sequence-ratio surrogate with
  the configured clip (HACPO: 3e-4/4e-4); peer rows Exponential IS with stepwise clipping,
  ŝ = clamp(exp(clamp(ℓ̄_θ^R − ℓ̄_src, ±10)), L_m, 1), objective ŝ·sg(ŝ)·c(src→tgt)·Â (α = 1, no min with the
  unclipped term), L_m = min(1, L_0 + m·0.025) with m the minibatch index (``hacpo_schedule: step``: the
  training step). Use ``algo.agg=seq-mean-token-mean`` (HACPO). **Approximation**: HACPO's KL term to a
  reference model (coef 1e-3) is not included (the trainer holds no reference model).
- ``ppo_token_nll``: "SFT update" (SGT + GRAFT which; baselines.md §2.3 defaults): the PPO token loss on
  the non-auxiliary rows plus λ·NLL on auxiliary rows (``extra["aux"]``), NLL = token-mean −log π_θ over
  the row's receiver tokens, averaged over the auxiliary rows of the minibatch (``norm.aux_seqs``); the
  auxiliary rows enter neither the PPO denominator nor its numerator.
"""

from __future__ import annotations

import math

import torch

from graft_cli.algorithms.losses import POLICY_LOSSES, Normaliser, agg_loss, clip_stats, ppo_surrogate


def _col(extra: dict | None, key: str, n: int, default: float, device) -> torch.Tensor:
    vals = (extra or {}).get(key)
    if vals is None:
        return torch.full((n,), float(default), dtype=torch.float32, device=device)
    out = []
    for v in vals:
        v = default if v is None else float(v)
        out.append(default if isinstance(v, float) and math.isnan(v) else v)
    return torch.tensor(out, dtype=torch.float32, device=device)


def _params(cfg) -> dict:
    try:
        return dict(cfg.exchange.params or {})
    except AttributeError:
        return {}


def _seq_adv(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (adv * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


@POLICY_LOSSES.register("luffy")
def luffy_loss(logp, old_logp, adv, mask, weight, is_peer, *, clip_low=0.2, clip_high=0.28, agg="token-mean",
               norm: Normaliser, cfg=None, **_):
    """graft.md §3 "LUFFY update": self tokens −min(ρÂ, clip(ρ)Â); peer tokens −f(π_θ)·Â, f(x) = x/(x+γ)
    (no clip, behaviour prob 1); w per row; aggregation as configured (token-mean)."""
    gamma = float(_params(cfg).get("luffy_gamma", 0.1))
    self_tok, ratio = ppo_surrogate(logp, old_logp, adv, clip_low, clip_high)
    p = torch.exp(logp)
    peer_tok = -(p / (p + gamma)) * adv
    per_tok = torch.where(is_peer[:, None], peer_tok, self_tok)
    loss = agg_loss(per_tok * weight[:, None], mask, agg, norm)
    stat_ratio = torch.where(is_peer[:, None], torch.ones_like(ratio), ratio.detach())
    return loss, clip_stats(stat_ratio, adv, mask, is_peer, clip_low, clip_high)


@POLICY_LOSSES.register("hacpo_peer")
def hacpo_peer_loss(logp, old_logp, adv, mask, weight, is_peer, *, clip_low=3e-4, clip_high=4e-4,
                    agg="seq-mean-token-mean", norm: Normaliser, extra=None, mb_index=0, cfg=None, **_):
    """HACPO (baselines.md §1.2, paper eq. 59): self rows GSPO, min(sÂ, clip(s, 1−ε_l, 1+ε_h)Â) with
    s = exp(mean_t(logπ_θ − logπ_old)); peer rows ŝ·sg(ŝ)·c·Â with ŝ = clamp(s_x, L_m, 1),
    s_x = exp(clamp(mean_t logπ_θ(o^R) − mean_t logπ_src(o^S), −10, 10)) (terminal EOS excluded on both sides:
    ``extra["n_scored"]``, ``extra["src_logp_mean"]``), c = ``extra["hacpo_c"]``."""
    p = _params(cfg)
    lb0 = float(p.get("hacpo_peer_lower_bound", 0.8))
    inc = float(p.get("hacpo_peer_lower_bound_step", 0.025))
    coef = float(p.get("hacpo_peer_coef", 1.0))
    sched = p.get("hacpo_schedule", "minibatch")
    B, dev = mask.shape[0], mask.device
    m = mask
    # self: GSPO sequence ratio, straight-through token form (every token carries s_j)
    log_s = ((logp - old_logp) * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    log_tok = log_s.detach()[:, None] + logp - logp.detach()
    self_tok, ratio = ppo_surrogate(log_tok, torch.zeros_like(log_tok), adv, clip_low, clip_high)
    # peer: exponential IS with stepwise clipping
    n_scored = _col(extra, "n_scored", B, float("inf"), dev)
    scored = m * (torch.cumsum(m, -1) <= n_scored[:, None]).float()
    mean_tgt = (logp * scored).sum(-1) / scored.sum(-1).clamp(min=1.0)
    src_mean = _col(extra, "src_logp_mean", B, float("nan"), dev)
    log_x = torch.nan_to_num((mean_tgt - src_mean).clamp(-10.0, 10.0), nan=0.0)
    s_x = torch.exp(log_x)
    idx = (torch.full((B,), float(mb_index), device=dev) if sched == "minibatch"
           else _col(extra, "hacpo_step", B, 0.0, dev))
    lower = torch.clamp(lb0 + idx * inc, max=1.0)
    s_hat = torch.minimum(torch.maximum(s_x, lower), torch.ones_like(s_x))
    c = _col(extra, "hacpo_c", B, 1.0, dev)
    obj = s_hat * s_hat.detach() * c * _seq_adv(adv, m) * coef
    peer_tok = -obj[:, None].expand_as(m)
    per_tok = torch.where(is_peer[:, None], peer_tok, self_tok)
    loss = agg_loss(per_tok * weight[:, None], m, agg, norm)
    own = (~is_peer).float()[:, None] * m
    st = clip_stats(ratio.detach(), adv, own, is_peer, clip_low, clip_high)
    peer_m = is_peer.float()[:, None] * m
    low = (s_x < lower).float()[:, None] * peer_m
    high = (s_x > 1.0).float()[:, None] * peer_m
    f = lambda x: x.sum().detach().to(torch.float64)  # noqa: E731
    st["tokens"] = st["tokens"] + f(peer_m)
    st["tokens_peer"] = f(peer_m)
    st["clip_low"] = st["clip_low"] + f(low)
    st["clip_high"] = st["clip_high"] + f(high)
    st["clip_peer"] = f(low) + f(high)
    return loss, st


@POLICY_LOSSES.register("ppo_token_nll")
def ppo_token_nll_loss(logp, old_logp, adv, mask, weight, is_peer, *, clip_low=0.2, clip_high=0.28,
                       agg="token-mean", norm: Normaliser, extra=None, **_):
    """SFT update (graft.md §3; baselines.md §2.3): L = L_PPO over non-auxiliary rows (their own
    token-mean denominator) + (1/N_aux) Σ_{aux j} λ_j · (1/|o_j|) Σ_t −log π_θ(o_{j,t}|·), λ_j =
    ``extra["nll_coef"]``. Without auxiliary rows it is ``ppo_token``."""
    B, dev = mask.shape[0], mask.device
    aux = _col(extra, "aux", B, 0.0, dev) > 0.5
    lam = _col(extra, "nll_coef", B, 0.0, dev)
    pg_mask = mask * (~aux).float()[:, None]
    per_tok, ratio = ppo_surrogate(logp, old_logp, adv, clip_low, clip_high)
    loss = agg_loss(per_tok * weight[:, None], pg_mask, agg, norm)
    nll = -(logp * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    n_aux = float(getattr(norm, "aux_seqs", 0.0) or 0.0)
    if bool(aux.any()):
        loss = loss + (lam * nll * aux.float()).sum() / max(n_aux, 1.0)
    st = clip_stats(ratio.detach(), adv, pg_mask, is_peer & ~aux, clip_low, clip_high)
    st["nll_sum"] = (nll * aux.float()).sum().detach().to(torch.float64)
    st["nll_rows"] = aux.float().sum().detach().to(torch.float64)
    return loss, st
