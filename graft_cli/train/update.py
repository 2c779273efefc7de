"""One policy's update (README.md, "How a step works"): the token signals (registered loss mask,
rollout rejection and token advantages), the loss inputs of a micro-batch built from the
TrainBatch's columns only, and :func:`update_policy`, ``algo.ppo_epochs`` passes over the
minibatches of the registered ordering with gradient accumulation over token-budget micro-batches,
non-finite guards and FSDP's zero-weight passes. What it reads besides the batch is one
:class:`UpdateContext`."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from graft_cli import config as C
from graft_cli import faults
from graft_cli.algorithms.correction import rejection_params
from graft_cli.algorithms.losses import POLICY_LOSSES, LossInputs, Normaliser, compute_loss
from graft_cli.algorithms.signals import (
    LOSS_MASKS,
    TOKEN_ADVANTAGES,
    SignalContext,
    loss_mask_params,
    rollout_rejection,
    scalar_broadcast,
    token_adv_params,
)
from graft_cli.batch import TrainBatch, plan_micro_batches
from graft_cli.errors import GraftError
from graft_cli.models.logprobs import pack, prefix_groups, response_logprobs, to_padded
from graft_cli.train import dist as D
from graft_cli.algorithms.minibatch import layout_ranks, minibatch_plan
from graft_cli.registry import Params
from graft_cli.train.policies import Policy


@dataclass(frozen=True)
class AlgoParams:
    """The parameters of the ``algo`` section's registered functions, each the object of its Params
    class checked from the resolved config (:meth:`of`, once per run): the loss's
    (``LossInputs.params``), the loss mask's and each token-advantage function's by name
    (``SignalContext.params``) and the rollout-rejection mask's."""

    loss: Params
    loss_mask: Params
    rejection: Params
    token_adv: dict[str, Params]

    @classmethod
    def of(cls, algo) -> AlgoParams:
        """The parameters ``algo`` (an ``AlgoConfig``) gives its loss, loss mask, rejection mask and
        token advantages (one-line GraftError naming the key of a bad value)."""
        rc = algo.rollout_correction
        return cls(loss=POLICY_LOSSES.get(algo.loss).check(algo.loss_params),
                   loss_mask=loss_mask_params(algo.loss_mask, algo.loss_mask_params),
                   rejection=rejection_params(rc.rejection, rc.params),
                   token_adv=token_adv_params(list(algo.token_advantages), algo.token_adv_params))


@dataclass
class UpdateContext:
    """What one policy's update reads besides its batch: the config (``algo``, ``optim``,
    ``rollout.n``, ``exchange.ordering``), the data-parallel group (``None``: one process), the step
    (0-based), the controllers' coefficients of the step, the generator that orders the minibatches
    and the ``algo`` functions' parameters (None: read from ``cfg.algo`` when the context is
    made)."""

    cfg: C.Config
    dist: D.Dist | None = None
    step: int = 0
    coefs: dict = field(default_factory=dict)
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    params: AlgoParams | None = None

    def __post_init__(self):
        if self.params is None:
            self.params = AlgoParams.of(self.cfg.algo)


# --------------------------------------------------------------------------------------- loss inputs
def _rows_with(col, rows) -> bool:
    return col is not None and any(col[i] is not None for i in rows)


def loss_inputs(batch: TrainBatch, rows: list[int], logp, resp, norm: Normaliser, spec, mb_index: int,
                ctx: UpdateContext) -> LossInputs:
    """The loss inputs of micro-batch ``rows`` (``resp``: the packed rows' response mask, ``(B,
    L)``), built from the batch's columns only: loss mask, advantages (per-token when set, else the
    scalar on every masked token), weights, source and PG flags, the per-row ``extra`` columns and
    the loss's per-token columns padded to ``(B, L - 1)``, the layout of ``logp``."""
    a, L, dev = ctx.cfg.algo, resp.shape[1], resp.device
    prompts = [batch.prompt_ids[i] for i in rows]
    if _rows_with(batch.loss_mask, rows):
        mask = to_padded([batch.mask_of(i) for i in rows], prompts, L, dev)
    else:
        mask = resp[:, 1:].float()
    old = to_padded([batch.old_logprobs[i] for i in rows], prompts, L, dev)
    if _rows_with(batch.token_adv, rows):
        adv = to_padded([scalar_broadcast(batch, i) for i in rows], prompts, L, dev)
    else:
        adv = torch.tensor([batch.advantages[i] for i in rows], device=dev)[:, None] * mask
    weight = torch.tensor([batch.weights[i] for i in rows], dtype=torch.float32, device=dev)
    is_peer = torch.tensor([batch.source[i] != "self" for i in rows], device=dev)
    in_pg = torch.tensor([bool(batch.in_pg[i]) for i in rows], device=dev)
    columns = {k: [v[i] for i in rows] for k, v in batch.extra.items()}
    columns["source_logp_mean"] = [batch.source_logp_mean[i] for i in rows]
    for c in (*spec.token_columns, *(("ref_logprobs",) if a.kl_coef > 0 or "ref_logprobs" in batch.extra else ())):
        if c not in batch.extra:
            raise GraftError(f"config key 'algo.loss': loss {spec.name!r} reads the column {c!r}, which no frozen "
                             f"model's scorer filled (policies with role: frozen, column: {c})")
        columns[c] = to_padded([batch.extra[c][i] or [] for i in rows], prompts, L, dev)
    return LossInputs(logp, old, adv, mask, weight, is_peer, norm=norm, in_pg=in_pg, clip_low=a.clip_low,
                      clip_high=a.clip_high, clip_ratio_c=a.clip_ratio_c, agg=a.agg, mb_index=mb_index, step=ctx.step,
                      columns=columns, params=ctx.params.loss, coefs=dict(ctx.coefs or {}))


def row_tokens(batch: TrainBatch, i: int) -> float:
    if batch.loss_mask is None or batch.loss_mask[i] is None:
        return len(batch.response_ids[i])
    return float(sum(batch.loss_mask[i]))


def nonfinite_quantity(logp: torch.Tensor, old: torch.Tensor, loss: torch.Tensor) -> str | None:
    """Which of a micro-batch's log-probs, old log-probs or loss is not finite (None when all
    are)."""
    for name, t in (("log-prob", logp), ("old log-prob", old), ("loss", loss)):
        if not bool(torch.isfinite(t.detach()).all()):
            return name
    return None


def token_signals(batch: TrainBatch, algo, params: AlgoParams, step: int, name: str,
                  coefs: dict) -> tuple[TrainBatch, dict]:
    """The batch with its ``loss_mask`` / ``token_adv`` from the registered loss mask, the
    rollout-rejection mask and the token-advantage functions, in config order (each sees the columns
    of the ones before it, and its own parameters from ``params``); their metrics."""
    sctx = SignalContext(step=step, policy=name, algo=algo, coefs=coefs, params=params.loss_mask)
    batch = dataclasses.replace(batch, loss_mask=LOSS_MASKS.get(algo.loss_mask)(batch, sctx))
    mask, met = rollout_rejection(batch, algo.rollout_correction, params.rejection)
    batch = dataclasses.replace(batch, loss_mask=mask)
    for fn_name in algo.token_advantages:
        sctx.params = params.token_adv[fn_name]
        adv, m = TOKEN_ADVANTAGES.get(fn_name)(batch, sctx)
        batch = dataclasses.replace(batch, token_adv=adv)
        met.update(m)
    return batch, met


@dataclass
class _Pass:
    """One update's fixed inputs: the policy, its batch, the loss, the context and the data-parallel
    group."""

    pol: Policy
    batch: TrainBatch
    spec: object
    ctx: UpdateContext
    d: D.Dist


@dataclass
class _Totals:
    """What an update accumulates over its minibatches (summed loss statistics, per-step loss and
    gradient norm, the entropy's token sum and count, the skipped updates)."""

    stats: dict = field(default_factory=dict)
    losses: list = field(default_factory=list)
    grad_norms: list = field(default_factory=list)
    ent_sum: float = 0.0
    ent_n: float = 0.0
    skipped: int = 0
    grad_share: list = field(default_factory=list)  # (grafted rows' gradient norm / the minibatch's, row share)


def update_policy(pol: Policy, batch: TrainBatch, ctx: UpdateContext) -> dict:
    """One optimisation epoch (``algo.ppo_epochs`` of them) over the minibatches of the registered
    ``exchange.ordering`` (whole prompt groups, or HACPO's self-first row chunks, split over
    ``exchange.layout``'s ranks), ordered by ``ctx.rng``; one optimizer step per minibatch
    (:func:`_accumulate`, :func:`_step`). Data-parallel (``ctx.dist``): each rank runs its shard of
    every minibatch with the minibatch's global ``Normaliser``; gradients are averaged across ranks
    (train/dist.py)."""
    cfg, a = ctx.cfg, ctx.cfg.algo
    p = _Pass(pol, batch, POLICY_LOSSES.get(a.loss), ctx, ctx.dist or D.Dist())
    pol.model.train()
    acc = _Totals()
    for _epoch in range(a.ppo_epochs):
        plan = minibatch_plan(batch, cfg.exchange.ordering, a.minibatch_prompts, cfg.rollout.n, ctx.rng,
                              layout_ranks(cfg.exchange.layout, cfg.exchange.layout_ranks))
        measure = a.grad_share_every > 0 and (ctx.step + 1) % a.grad_share_every == 0
        for mb_idx, mb in enumerate(plan):
            total, bad = _accumulate(p, mb, mb_idx, acc)
            if measure and bad is None and any(batch.source[i] != "self" for i in mb):
                acc.grad_share.append(_grafted_grad_share(p, mb, mb_idx))
            _step(p, mb_idx, total, bad, acc)
    return _update_metrics(p, acc)


def _grad_norm(params: list) -> float:
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in params])))


def _grafted_grad_share(p: _Pass, mb: list[int], mb_idx: int) -> tuple[float, float]:
    """(‖g_grafted‖ / ‖g‖, the grafted rows' share of the minibatch's rows): g is the minibatch's
    accumulated gradient, g_grafted the gradient of the grafted rows' terms of the same loss (the
    same normaliser, so g = g_grafted + g_own for a loss that is a sum over tokens), from a second
    backward over those rows. The accumulated gradient is put back untouched, so the update is the
    one it would have been."""
    params = [q for q in p.pol.model.parameters() if q.grad is not None]
    kept = [q.grad.detach().clone() for q in params]
    full = _grad_norm(kept)
    p.pol.optimizer.zero_grad(set_to_none=True)
    grafted = [i for i in mb if p.batch.source[i] != "self"]
    _accumulate(p, mb, mb_idx, _Totals(), only=grafted)
    grads = [q.grad for q in params if q.grad is not None]
    part = _grad_norm(grads) if grads else 0.0
    for q, g in zip(params, kept):
        q.grad = g
    return (part / full if full > 0 else float("nan")), len(grafted) / len(mb)


def _accumulate(p: _Pass, mb: list[int], mb_idx: int, acc: _Totals, only: list[int] | None = None
                ) -> tuple[float, str | None]:
    """Minibatch ``mb``'s gradients, accumulated over token-budget micro-batches of this rank's
    shard; returns the summed loss and the first non-finite quantity seen (None when all were
    finite). ``only``: the terms of these rows of ``mb`` alone, under ``mb``'s normaliser."""
    batch, ctx, d, a, o = p.batch, p.ctx, p.d, p.ctx.cfg.algo, p.ctx.cfg.optim
    model, dev, pad = p.pol.model, next(p.pol.model.parameters()).device, p.pol.tokenizer.pad_token_id
    # rows outside the PG (auxiliary rows), and rows without loss tokens, stay out of its
    # denominators
    norm = Normaliser.of_rows([row_tokens(batch, i) for i in mb], [batch.in_pg[i] for i in mb],
                              a.loss_scale_factor or float(ctx.cfg.rollout.max_new_tokens))
    local = d.shard(mb if only is None else only)
    total, bad = 0.0, None
    micros = plan_micro_batches([batch.prompt_ids[i] for i in local], [batch.response_ids[i] for i in local],
                                o.micro_batch_tokens, shared_prefix=o.shared_prefix, sort=o.sort_micro_batches)
    micros += [None] * ((d.max_int(len(micros)) if d.fsdp else len(micros)) - len(micros))
    for micro in micros:
        dummy = micro is None  # FSDP: ranks with fewer micro-batches run zero-weight passes
        rows = [local[i] for i in micro] if not dummy else [mb[0]]
        prompts, responses = [batch.prompt_ids[i] for i in rows], [batch.response_ids[i] for i in rows]
        ids, att, resp = pack(prompts, responses, pad, dev)
        groups = prefix_groups(prompts, responses, pad, dev) if o.shared_prefix else None
        logp, ent = response_logprobs(model, ids, att, resp, ctx.cfg.rollout.temperature, o.chunk_tokens,
                                      with_entropy=a.log_entropy, groups=groups, autocast_dtype=o.autocast)
        inp = loss_inputs(batch, rows, logp, resp, norm, p.spec, mb_idx, ctx)
        loss, st = compute_loss(p.spec, inp, a.kl_coef, a.kl_type, a.kl_rows)
        if not dummy and bad is None:
            bad = nonfinite_quantity(logp, inp.old_logp, loss)
        (loss * (0.0 if dummy else d.loss_scale)).backward()
        if dummy:
            continue
        total += float(loss.detach())
        for k, v in st.items():
            acc.stats[k] = acc.stats.get(k, 0.0) + float(v)
        acc.ent_sum += float((ent * inp.mask).sum())
        acc.ent_n += float(inp.mask.sum())
    return total, bad


def _step(p: _Pass, mb_idx: int, total: float, bad: str | None, acc: _Totals) -> None:
    """The optimizer step of one minibatch after the gradient sync and clip; a non-finite value
    stops the run (``optim.on_nonfinite=stop``) or skips the step on every rank (``skip``)."""
    d, pol, step = p.d, p.pol, p.ctx.step
    o = p.ctx.cfg.optim
    d.sync_grads(pol.model)
    gn = d.clip_grad_norm(pol.model, o.max_grad_norm)
    if bad is None and not math.isfinite(float(gn)):
        bad = "gradient norm"
    if d.enabled and d.max_int(int(bad is not None)):  # every rank skips (or stops) together
        bad = bad or "value on another rank"
    if bad is not None:
        if o.on_nonfinite == "stop":
            raise GraftError(f"step {step + 1}, policy {pol.name!r}: non-finite {bad} in minibatch {mb_idx}; "
                             f"stopped before the optimizer step (optim.on_nonfinite=skip skips such updates)")
        pol.optimizer.zero_grad(set_to_none=True)  # skipped and counted, weights unchanged
        acc.skipped += 1
        return
    pol.optimizer.step()
    pol.optimizer.zero_grad(set_to_none=True)
    faults.point("update", step + 1)
    acc.losses.append(total)
    acc.grad_norms.append(float(gn))


_COUNTS = ("tokens", "tokens_self", "tokens_peer", "clip_low", "clip_high", "clip_self", "clip_peer", "clip_dual")


def _update_metrics(p: _Pass, acc: _Totals) -> dict:
    """The update's metrics: mean loss and gradient norm, clip fractions, the loss's own statistics,
    entropy (data-parallel: the ranks' sums first)."""
    stats, ent_sum, ent_n, losses = acc.stats, acc.ent_sum, acc.ent_n, acc.losses
    if p.d.enabled:  # sums over the ranks' shards
        parts = p.d.gather_objects((stats, ent_sum, ent_n, losses))
        stats = {k: sum(q[0].get(k, 0.0) for q in parts) for k in set().union(*(q[0] for q in parts))}
        ent_sum, ent_n = sum(q[1] for q in parts), sum(q[2] for q in parts)
        losses = [sum(x) for x in zip(*(q[3] for q in parts))]
    tok = max(stats.get("tokens", 0.0), 1.0)
    out = {
        "loss": float(np.mean(losses)) if losses else 0.0,
        "grad_norm": float(np.mean(acc.grad_norms)) if acc.grad_norms else 0.0,
        "clip_ratio/low_mean": stats.get("clip_low", 0.0) / tok,
        "clip_ratio/high_mean": stats.get("clip_high", 0.0) / tok,
        "clip_ratio/region_mean": (stats.get("clip_low", 0.0) + stats.get("clip_high", 0.0)) / tok,
        "clip_ratio/self": stats.get("clip_self", 0.0) / max(stats.get("tokens_self", 0.0), 1.0),
        "num_minibatches": len(losses),
        "train/nonfinite_skipped": acc.skipped,
    }
    if stats.get("tokens_peer", 0.0) > 0:
        out["clip_ratio/peer"] = stats["clip_peer"] / stats["tokens_peer"]
        out["clip_ratio/peer_any"] = float(stats["clip_peer"] > 0)
    if "clip_dual" in stats:
        out["clip_ratio/dual_mean"] = stats["clip_dual"] / tok
    for k, v in stats.items():  # a pair <name>/sum, <name>/n is reported as the mean <name> (e.g. kl)
        if k.endswith("/sum") and f"{k[:-4]}/n" in stats:
            if stats[f"{k[:-4]}/n"] > 0 or not k.startswith("ratio/"):  # no grafted token: no ratio/peer
                out[k[:-4]] = v / max(stats[f"{k[:-4]}/n"], 1.0)
        elif not k.endswith("/n") and k not in _COUNTS:
            out[f"loss/{k}"] = v
    if p.ctx.cfg.algo.log_entropy and ent_n:
        out["entropy"] = ent_sum / ent_n
    if acc.grad_share:
        out["grad_share/grafted"] = float(np.nanmean([g for g, _ in acc.grad_share]))
        out["grad_share/grafted_rows"] = float(np.mean([r for _, r in acc.grad_share]))
    return out
