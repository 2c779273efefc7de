"""The training loop for N >= 1 policies sharing each prompt batch (README.md, "How a step works").

    prompts -> per policy: rollout -> reward -> advantages      (+ per stored source: its logged step)
            -> exchange.select (registered; "none" = independent GRPO)
            -> per policy: old log-probs (one no-grad pass) -> exchange.admit
                           -> frozen models' scorers -> loss mask -> token advantages (registered)
                           -> minibatch schedule -> loss (registered) -> optimizer step
            -> controllers observe the step; metrics.jsonl, rollouts/<policy>/step_N.parquet, checkpoints

Everything method-specific is looked up by name from the config; nothing here branches on a method, and
the loss inputs are built from the TrainBatch's columns only.
"""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass

import numpy as np
import torch

from graft_cli import config as C
from graft_cli import faults
from graft_cli.algorithms.advantages import ADVANTAGES
from graft_cli.algorithms.controllers import build_controllers
from graft_cli.algorithms.exchange import EXCHANGES, ExchangeContext
from graft_cli.algorithms.losses import POLICY_LOSSES, LossInputs, Normaliser, compute_loss
from graft_cli.algorithms.signals import (LOSS_MASKS, TOKEN_ADVANTAGES, SignalContext, scalar_broadcast,
                                          token_adv_params)
from graft_cli.batch import PolicyStep, TrainBatch, plan_micro_batches
from graft_cli.console import make_console
from graft_cli.data.problems import Problem, load_problems, split_holdout
from graft_cli.data.prompts import PromptSpec
from graft_cli.data.sampler import PromptSampler
from graft_cli.errors import GraftError, PeerLost, Stopped
from graft_cli.models.loading import load_role, load_tokenizer, resolve_path, weights_sha256
from graft_cli.models.logprobs import pack, prefix_groups, response_logprobs, to_padded
from graft_cli.models.scoring import SCORERS, ScoreSettings, score_rows
from graft_cli.rollout import ENGINES, SamplingParams
from graft_cli.rundir import (MetricsLog, atomic_write_text, check_writable, exchange_log_path, read_json_or_none,
                              rollout_log_path, write_parquet)
from graft_cli.train import checkpoint as ckpt
from graft_cli.train import dist as D
from graft_cli.algorithms.minibatch import minibatch_plan
from graft_cli.train.collect import collector_for
from graft_cli.train.hooks import AfterStep
from graft_cli.train.parallel import LockedGrader, PolicyPool, resolve_workers
from graft_cli.train.sources import STEP_SOURCES
from graft_cli.train.trackers import TRACKERS, Trackers


@dataclass
class Policy:
    name: str
    model: object
    tokenizer: object
    optimizer: torch.optim.Optimizer
    engine: object
    prompt_cache: dict


@dataclass
class Frozen:
    """A model with ``role: frozen``: scored, never updated (no optimizer, not checkpointed)."""

    name: str
    model: object
    tokenizer: object
    cfg: C.PolicyConfig
    sha256: str


class PhaseMemory:
    """Peak CUDA memory per phase of a step (``memory/<phase>_peak_gib``: rollout, score, update; the peak since
    the previous mark); nothing on CPU."""

    def __init__(self, model):
        self.dev = next(model.parameters()).device
        self.on = self.dev.type == "cuda"
        self.peaks: dict[str, float] = {}
        if self.on:
            torch.cuda.reset_peak_memory_stats(self.dev)

    def mark(self, phase: str) -> None:
        if self.on:
            gib = torch.cuda.max_memory_allocated(self.dev) / 2**30
            self.peaks[phase] = max(self.peaks.get(phase, 0.0), gib)
            torch.cuda.reset_peak_memory_stats(self.dev)

    def metrics(self) -> dict:
        return {f"memory/{k}_peak_gib": v for k, v in self.peaks.items()}


def sampling_seed(run_seed: int, step: int, policy_index: int) -> int:
    """One seed per (run, step, policy): sampling never depends on RNG state, so resume is exact."""
    return (run_seed * 1_000_003 + step * 7919 + policy_index * 104_729) % (2**31 - 1)


def step_seed(run_seed: int, step: int) -> int:
    return (run_seed * 999_983 + step * 15_485_863 + 17) % (2**31 - 1)


# ----------------------------------------------------------------------------------------------- setup
def engine_kwargs(cfg: C.Config, frozen: dict) -> dict:
    """``rollout.engine_kwargs`` with the options the engine declares in ``frozen_kwargs`` (the tandem junior)
    replaced by the loaded frozen model they name."""
    kw = dict(cfg.rollout.engine_kwargs)
    for k in ENGINES.get(cfg.rollout.engine).frozen_kwargs:
        kw[k] = frozen[kw[k]].model
    return kw


def _keys(pc: C.PolicyConfig, cfg: C.Config) -> tuple[str, str]:
    """The config keys of a model's ``model`` and tokenizer (for one-line errors)."""
    i = next(j for j, p in enumerate(cfg.policies) if p.name == pc.name)
    return f"policies.{i}.model", f"policies.{i}.{'tokenizer' if pc.tokenizer else 'model'}"


def build_policy(pc: C.PolicyConfig, cfg: C.Config, dist: D.Dist | None = None, frozen: dict | None = None) -> Policy:
    model, tok = load_role(pc.model, pc.tokenizer, cfg.run.dtype, cfg.run.device, _keys(pc, cfg), pc.trust_remote_code,
                           cfg.run.model_init, cfg.run.random_shrink)
    if cfg.optim.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.config.use_cache = True
    o = cfg.optim
    opt = torch.optim.AdamW(model.parameters(), lr=pc.lr or o.lr, betas=tuple(o.betas), eps=o.eps,
                            weight_decay=o.weight_decay)
    if dist is not None:
        model, opt = dist.prepare(model, opt)  # FSDP wrap under `accelerate launch`; else unchanged
    engine = ENGINES.get(cfg.rollout.engine)(model, tok, max_batch=cfg.rollout.max_batch,
                                             **engine_kwargs(cfg, frozen or {}))
    return Policy(pc.name, model, tok, opt, engine, {})


def build_frozen(pc: C.PolicyConfig, cfg: C.Config, dist: D.Dist | None = None) -> Frozen:
    """Load a frozen model once in the run's dtype and device (FSDP-sharded like the policies), in eval mode
    with gradients off; its weight hash is recorded in every checkpoint."""
    model, tok = load_role(pc.model, pc.tokenizer, cfg.run.dtype, cfg.run.device, _keys(pc, cfg), pc.trust_remote_code,
                           cfg.run.model_init, cfg.run.random_shrink)
    model.requires_grad_(False)
    digest = weights_sha256(model)
    if dist is not None:
        model = dist.prepare_frozen(model)
    model.eval()
    return Frozen(pc.name, model, tok, pc, digest)


def encode_prompt(pol: Policy, problem: str, spec: PromptSpec) -> list[int]:
    ids = pol.prompt_cache.get(problem)
    if ids is None:
        ids = spec.encode(problem, pol.tokenizer)
        pol.prompt_cache[problem] = ids
    return ids


# --------------------------------------------------------------------------------------- core helpers
def score_settings(cfg: C.Config, dist: D.Dist | None = None) -> ScoreSettings:
    return ScoreSettings(temperature=cfg.rollout.temperature, token_budget=cfg.optim.micro_batch_tokens * 2,
                         chunk_tokens=cfg.optim.chunk_tokens, shared_prefix=cfg.optim.shared_prefix, dist=dist,
                         autocast=cfg.optim.autocast)


def score_logprobs(pol: Policy, batch: TrainBatch, cfg: C.Config, dist: D.Dist | None = None,
                   only: list[int] | None = None) -> list[list[float] | None]:
    """Old log-probs of every row (``only``: of those rows) under the policy's current weights: one batched
    no-grad pass (data-parallel: each rank scores a shard of the rows, then the results are all-gathered)."""
    return score_rows(pol.model, pol.tokenizer.pad_token_id, batch, score_settings(cfg, dist), only)


def old_logprobs(pol: Policy, b: TrainBatch, cfg: C.Config, dist: D.Dist | None = None) -> list[list[float]]:
    """The old log-probs of the update (``algo.old_logprobs``): ``trainer`` rescores every row under the current
    weights (verl's convention); ``sampler`` keeps the engine's log-probs on the policy's own rows and scores
    only the rows another policy generated (GRAFT's grafted rows, stored trajectories), which have none."""
    if cfg.algo.old_logprobs == "trainer":
        return score_logprobs(pol, b, cfg, dist)
    foreign = [i for i, s in enumerate(b.source) if s != "self"]
    scored = score_logprobs(pol, b, cfg, dist, only=foreign) if foreign else [None] * len(b)
    return [list(samp) if s == "self" else lp for s, samp, lp in zip(b.source, b.sampler_logprobs, scored)]


def _rows_with(col, rows) -> bool:
    return col is not None and any(col[i] is not None for i in rows)


def loss_inputs(batch: TrainBatch, rows: list[int], logp, L: int, dev, norm: Normaliser, resp, cfg: C.Config,
                spec, mb_index: int, step: int, coefs: dict) -> LossInputs:
    """The loss inputs of micro-batch ``rows``, built from the batch's columns only: loss mask, advantages
    (per-token when set, else the scalar on every masked token), weights, source and PG flags, the per-row
    ``extra`` columns and the loss's per-token columns padded to ``(B, T)``."""
    a = cfg.algo
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
    for c in (*spec.token_columns, *(("ref_logprobs",) if a.kl_coef > 0 or "ref_logprobs" in batch.extra else ())):
        if c not in batch.extra:
            raise GraftError(f"config key 'algo.loss': loss {spec.name!r} reads the column {c!r}, which no frozen "
                             f"model's scorer filled (policies with role: frozen, column: {c})")
        columns[c] = to_padded([batch.extra[c][i] or [] for i in rows], prompts, L, dev)
    return LossInputs(logp, old, adv, mask, weight, is_peer, norm=norm, in_pg=in_pg, clip_low=a.clip_low,
                      clip_high=a.clip_high, clip_ratio_c=a.clip_ratio_c, agg=a.agg, mb_index=mb_index, step=step,
                      columns=columns, params=a.loss_params, coefs=dict(coefs or {}))


def _row_tokens(batch: TrainBatch, i: int) -> float:
    if batch.loss_mask is None or batch.loss_mask[i] is None:
        return len(batch.response_ids[i])
    return float(sum(batch.loss_mask[i]))


def nonfinite_quantity(logp: torch.Tensor, old: torch.Tensor, loss: torch.Tensor) -> str | None:
    """Which of a micro-batch's log-probs, old log-probs or loss is not finite (None when all are)."""
    for name, t in (("log-prob", logp), ("old log-prob", old), ("loss", loss)):
        if not bool(torch.isfinite(t.detach()).all()):
            return name
    return None


def update_policy(pol: Policy, batch: TrainBatch, cfg: C.Config, rng: np.random.Generator, ordering: str,
                  dist: D.Dist | None = None, step: int = 0, coefs: dict | None = None) -> dict:
    """One optimisation epoch (``algo.ppo_epochs`` of them) over the minibatches of the registered ``ordering``
    (``exchange.ordering``: whole prompt groups, or HACPO's self-first row chunks).
    Data-parallel (``dist``): each rank runs its shard of every minibatch with the minibatch's global
    ``Normaliser``; gradients are averaged across ranks (train/dist.py)."""
    d = dist or D.Dist()
    a, o = cfg.algo, cfg.optim
    spec = POLICY_LOSSES.get(a.loss)
    model = pol.model
    model.train()
    dev = next(model.parameters()).device
    pad = pol.tokenizer.pad_token_id
    stats: dict[str, float] = {}
    losses, grad_norms, ent_sum, ent_n = [], [], 0.0, 0.0
    skipped, bad = 0, None
    for _epoch in range(a.ppo_epochs):
        for mb_idx, mb in enumerate(minibatch_plan(batch, ordering, a.minibatch_prompts, cfg.rollout.n, rng)):
            # rows outside the PG (auxiliary rows), and rows without loss tokens, stay out of its denominators
            norm = Normaliser.of_rows([_row_tokens(batch, i) for i in mb], [batch.in_pg[i] for i in mb],
                                      a.loss_scale_factor or float(cfg.rollout.max_new_tokens))
            local = d.shard(mb)
            total = 0.0
            micros = plan_micro_batches([batch.prompt_ids[i] for i in local], [batch.response_ids[i] for i in local],
                                        o.micro_batch_tokens, shared_prefix=o.shared_prefix,
                                        sort=o.sort_micro_batches)
            micros += [None] * ((d.max_int(len(micros)) if d.fsdp else len(micros)) - len(micros))
            for micro in micros:
                dummy = micro is None  # FSDP: ranks with fewer micro-batches run zero-weight passes
                rows = [local[i] for i in micro] if not dummy else [mb[0]]
                prompts, responses = [batch.prompt_ids[i] for i in rows], [batch.response_ids[i] for i in rows]
                ids, att, resp = pack(prompts, responses, pad, dev)
                groups = prefix_groups(prompts, responses, pad, dev) if o.shared_prefix else None
                logp, ent = response_logprobs(model, ids, att, resp, cfg.rollout.temperature, o.chunk_tokens,
                                              with_entropy=a.log_entropy, groups=groups, autocast_dtype=o.autocast)
                inp = loss_inputs(batch, rows, logp, ids.shape[1], dev, norm, resp, cfg, spec, mb_idx, step, coefs)
                loss, st = compute_loss(spec, inp, a.kl_coef, a.kl_type, a.kl_rows)
                if not dummy and bad is None:
                    bad = nonfinite_quantity(logp, inp.old_logp, loss)
                (loss * (0.0 if dummy else d.loss_scale)).backward()
                if dummy:
                    continue
                total += float(loss.detach())
                for k, v in st.items():
                    stats[k] = stats.get(k, 0.0) + float(v)
                ent_sum += float((ent * inp.mask).sum())
                ent_n += float(inp.mask.sum())
            d.sync_grads(model)
            gn = d.clip_grad_norm(model, o.max_grad_norm)
            if bad is None and not math.isfinite(float(gn)):
                bad = "gradient norm"
            if d.enabled and d.max_int(int(bad is not None)):  # every rank skips (or stops) together
                bad = bad or "value on another rank"
            if bad is not None:
                if o.on_nonfinite == "stop":
                    raise GraftError(f"step {step + 1}, policy {pol.name!r}: non-finite {bad} in minibatch {mb_idx}; "
                                     f"stopped before the optimizer step (optim.on_nonfinite=skip skips such "
                                     f"updates)")
                pol.optimizer.zero_grad(set_to_none=True)  # skipped and counted, weights unchanged
                skipped += 1
                bad = None
                continue
            pol.optimizer.step()
            pol.optimizer.zero_grad(set_to_none=True)
            faults.point("update", step + 1)
            losses.append(total)
            grad_norms.append(float(gn))
    if d.enabled:  # sums over the ranks' shards
        parts = d.gather_objects((stats, ent_sum, ent_n, losses))
        stats = {k: sum(p[0].get(k, 0.0) for p in parts) for k in set().union(*(p[0] for p in parts))}
        ent_sum, ent_n = sum(p[1] for p in parts), sum(p[2] for p in parts)
        losses = [sum(x) for x in zip(*(p[3] for p in parts))]
    tok = max(stats.get("tokens", 0.0), 1.0)
    out = {
        "loss": float(np.mean(losses)) if losses else 0.0,
        "grad_norm": float(np.mean(grad_norms)) if grad_norms else 0.0,
        "clip_ratio/low_mean": stats.get("clip_low", 0.0) / tok,
        "clip_ratio/high_mean": stats.get("clip_high", 0.0) / tok,
        "clip_ratio/region_mean": (stats.get("clip_low", 0.0) + stats.get("clip_high", 0.0)) / tok,
        "clip_ratio/self": stats.get("clip_self", 0.0) / max(stats.get("tokens_self", 0.0), 1.0),
        "num_minibatches": len(losses),
        "train/nonfinite_skipped": skipped,
    }
    if stats.get("tokens_peer", 0.0) > 0:
        out["clip_ratio/peer"] = stats["clip_peer"] / stats["tokens_peer"]
        out["clip_ratio/peer_any"] = float(stats["clip_peer"] > 0)
    if "clip_dual" in stats:
        out["clip_ratio/dual_mean"] = stats["clip_dual"] / tok
    for k, v in stats.items():  # a pair <name>/sum, <name>/n is reported as the mean <name> (e.g. kl)
        if k.endswith("/sum") and f"{k[:-4]}/n" in stats:
            out[k[:-4]] = v / max(stats[f"{k[:-4]}/n"], 1.0)
        elif not k.endswith("/n") and k not in ("tokens", "tokens_self", "tokens_peer", "clip_low", "clip_high",
                                                "clip_self", "clip_peer", "clip_dual"):
            out[f"loss/{k}"] = v
    if a.log_entropy and ent_n:
        out["entropy"] = ent_sum / ent_n
    return out


def rotate_log(log_path, out: str, policy: str, step: int, keep: int) -> None:
    """``run.keep_rollouts`` = k > 0: only the last k steps' logs (``log_path(out, policy, step)``) stay."""
    if keep > 0 and step >= keep:
        old = log_path(out, policy, step - keep)
        if os.path.exists(old):
            os.remove(old)


def rollout_metrics(step: PolicyStep) -> dict:
    if not len(step.rollouts):  # dynamic sampling kept no group
        return {"num_tokens": 0}
    r = step.rewards
    lens = np.array([len(x) for x in step.rollouts.response_ids])
    trunc = np.array(step.rollouts.truncated)
    term = lens[~trunc]
    return {
        "reward": float(r.mean()),
        "reward_std": float(r.std()) if r.numel() > 1 else 0.0,
        "frac_reward_zero_std": float((r.std(-1) == 0).float().mean()) if r.shape[1] > 1 else 1.0,
        "frac_all_fail": float((step.k == 0).float().mean()),
        "frac_all_correct": float((step.k == step.n).float().mean()),
        "completions/mean_length": float(lens.mean()),
        "completions/min_length": int(lens.min()),
        "completions/max_length": int(lens.max()),
        "completions/mean_terminated_length": float(term.mean()) if term.size else 0.0,
        "completions/clipped_ratio": float(trunc.mean()),
        "num_tokens": int(lens.sum()),
    }


def peer_rows_per_prompt(batch: TrainBatch, num_prompts: int) -> list[int]:
    """Per prompt index, the rows of ``batch`` that are not the policy's own samples (``source != 'self'``)."""
    out = [0] * num_prompts
    for g, s in zip(batch.group, batch.source):
        if s != "self" and g is not None and 0 <= int(g) < num_prompts:
            out[int(g)] += 1
    return out


def logprob_gap(batch: TrainBatch) -> dict:
    """Sampler-vs-trainer log-prob gap on the policy's own rows (TRL ``sampling/*`` names)."""
    diffs = []
    for s, samp, old in zip(batch.source, batch.sampler_logprobs, batch.old_logprobs or []):
        if s == "self" and samp is not None and len(samp) == len(old) and len(old):
            diffs.append(np.abs(np.asarray(samp) - np.asarray(old)))
    if not diffs:
        return {}
    d = np.concatenate(diffs)
    return {"sampling/sampling_logp_difference/mean": float(d.mean()),
            "sampling/sampling_logp_difference/max": float(d.max())}


# -------------------------------------------------------------------------------------------- trainer
class Trainer:
    def __init__(self, cfg: C.Config, out_dir: str, progress: bool = True, console=None):
        self.cfg, self.out, self.progress = cfg, out_dir, progress
        from rich.markup import escape

        con = console or make_console(stderr=True)
        self.warn = lambda msg: con.print(f"[yellow]warning[/]: {escape(msg)}", soft_wrap=True, highlight=False)
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        torch.manual_seed(cfg.run.seed)
        np.random.seed(cfg.run.seed)
        random.seed(cfg.run.seed)  # recorded in each checkpoint's state.json (rng.python): identical runs, same file
        self.dist = D.setup(cfg)  # data-parallel processes (torchrun / accelerate launch); a no-op alone
        self.spec = PromptSpec.from_config(cfg.prompt)
        self.problems: list[Problem] = load_problems(resolve_path(cfg.data.train), cfg.data.fields or None,
                                                     cfg.data.where or None)
        self.problems, self.held_out = split_holdout(self.problems, cfg.data.holdout, cfg.data.holdout_seed)
        self.frozen = {pc.name: build_frozen(pc, cfg, self.dist) for pc in cfg.policies if pc.role == "frozen"}
        self.policies = {pc.name: build_policy(pc, cfg, self.dist, self.frozen) for pc in cfg.policies
                         if pc.role == "train"}
        self._filter_long_prompts()
        self.sampler = PromptSampler(len(self.problems), cfg.data.prompt_batch, cfg.run.seed, cfg.data.shuffle)
        self.exchange = EXCHANGES.get(cfg.exchange.name)(cfg)
        self.adv_fn = ADVANTAGES.get(cfg.algo.advantage)
        from graft_cli.reward import make_grader

        self.grader = make_grader(cfg.reward)
        first = next(iter(self.policies.values()))
        self.policy_workers = resolve_workers(cfg.run.policy_workers, len(self.policies), torch.get_num_threads(),
                                              next(first.model.parameters()).device.type, self.dist.enabled)
        if self.policy_workers > 1:  # train/parallel.py: one policy per thread, the cores split between them
            torch.set_num_threads(max(1, torch.get_num_threads() // self.policy_workers))
            self.grader = LockedGrader(self.grader)
        self.pool = PolicyPool(self.policy_workers)
        self.sources = {sc.name: STEP_SOURCES.get(sc.kind)(sc, self.grader, self.adv_fn, cfg.algo, cfg.run.seed)
                        for sc in cfg.sources}
        self.total_steps = cfg.run.steps or cfg.run.epochs * self.sampler.steps_per_epoch
        self.controllers = build_controllers(cfg.algo.controllers, self.total_steps)
        self.collector = collector_for(cfg)
        self.signal_params = token_adv_params(list(cfg.algo.token_advantages), cfg.algo.token_adv_params)
        self.step = 0
        self.metrics = MetricsLog(os.path.join(out_dir, "metrics.jsonl"))
        self.ckpt_root = os.path.join(out_dir, "checkpoints")
        self.check_sources()

    def check_sources(self) -> None:
        """Every step source's data for the steps this run may train (from its oldest complete checkpoint on, or
        from step 0), checked before step 1 against the steps' prompts where the collector knows them in advance
        (``prompts_at``); a missing partner log is one line before anything is written."""
        if not self.sources:
            return
        start = min(ckpt.complete_steps(self.ckpt_root), default=0) if self.cfg.run.resume else 0
        plan = getattr(self.collector, "prompts_at", None)
        for src in self.sources.values():
            src.check(range(start, self.total_steps), (lambda t: plan(self, t)) if plan else None)

    def _filter_long_prompts(self) -> None:
        lim = self.cfg.rollout.max_prompt_tokens
        keep = [p for p in self.problems
                if all(len(encode_prompt(pol, p.problem, self.spec)) <= lim for pol in self.policies.values())]
        self.dropped_long = len(self.problems) - len(keep)
        if not keep:
            raise GraftError(f"config key 'rollout.max_prompt_tokens': every prompt is longer than {lim} tokens")
        self.problems = keep

    # -- state
    def state(self) -> dict:
        return {"step": self.step, "sampler": self.sampler.state_dict(), "exchange": self.exchange.state_dict(),
                "total_steps": self.total_steps,
                "controllers": [{"name": n, "state": c.state_dict()} for n, c in self.controllers],
                "frozen": {n: {"model": f.cfg.model, "sha256": f.sha256} for n, f in self.frozen.items()}}

    def check_frozen(self, st: dict, path: str) -> None:
        """Frozen models are not in checkpoints: their weights must be the ones the run was trained with."""
        for name, f in self.frozen.items():
            rec = (st.get("frozen") or {}).get(name)
            if rec is None or rec.get("sha256") != f.sha256:
                was = "no record" if rec is None else f"{rec.get('model')} sha256 {str(rec.get('sha256'))[:12]}"
                raise GraftError(f"{path}: frozen model {name!r} differs from the one this run was trained with "
                                 f"(now {f.cfg.model} sha256 {f.sha256[:12]}, checkpoint: {was}); "
                                 f"use the same weights or run.resume=false")

    def resume(self) -> bool:
        """Restore the newest checkpoint that verifies against its manifest and loads (each one skipped is named
        in a warning). False when the run has no complete checkpoint; a run whose checkpoints are all damaged
        stops with one line."""
        from transformers import AutoModelForCausalLM

        complete = ckpt.complete_steps(self.ckpt_root)
        for s in reversed(ckpt.valid_steps(self.ckpt_root, self.warn)):
            path = ckpt.step_path(self.ckpt_root, s)
            try:  # read everything first: a checkpoint that fails to load leaves the trainer untouched
                st = ckpt.load_state(path)
                self.check_frozen(st, path)
                loaded = {}
                for name, pol in self.policies.items():
                    d = os.path.join(path, name)
                    model = AutoModelForCausalLM.from_pretrained(d, dtype=next(pol.model.parameters()).dtype)
                    loaded[name] = (model.state_dict(), ckpt.load_optimizer_state(os.path.join(d, "optimizer.pt")))
            except GraftError:
                raise
            except ckpt.RefusedCheckpoint as e:  # a crafted pickle behind a matching manifest
                self.warn(f"checkpoint step {s} skipped: {e}")
                continue
            except Exception as e:  # verified but unloadable (e.g. a manifest rewritten over damaged files)
                self.warn(f"checkpoint step {s} skipped: {path}: {type(e).__name__}: "
                          f"{(str(e).splitlines() or [''])[0][:200]}")
                continue
            for name, pol in self.policies.items():
                self.dist.load_full_state(pol.model, pol.optimizer, *loaded[name])
                pol.engine.sync_weights(pol.model)
            self.sampler.load_state_dict(st["sampler"])
            self.exchange.load_state_dict(st["exchange"])
            saved = st.get("controllers") or []
            for i, (n, c) in enumerate(self.controllers):  # in config order (the config cannot change on resume)
                if i < len(saved) and saved[i].get("name") == n:
                    c.load_state_dict(saved[i].get("state") or {})
            ckpt.set_rng_state(st["rng"])
            self.step = st["step"]
            if self.dist.is_main:
                self.metrics.truncate_after(self.step)
            return True
        if complete:
            raise GraftError(f"{self.ckpt_root}: none of the {len(complete)} complete checkpoints could be restored "
                             f"(steps {', '.join(map(str, complete))}; see the warnings); move them away or use "
                             f"run.resume=false")
        return False

    # -- one step
    def rollout_policy(self, i: int, pol: Policy, problems: list[Problem], round_: int = 0) -> tuple[PolicyStep, dict]:
        """Policy ``i`` samples ``problems`` (sampling round ``round_`` of the step), grades and scores them."""
        cfg, r = self.cfg, self.cfg.rollout
        t0 = time.perf_counter()
        prompt_ids = [encode_prompt(pol, p.problem, self.spec) for p in problems]
        lo, hi = self.dist.rollout_slice(len(problems))  # data-parallel: this rollout group's prompts
        group = self.dist.rank // self.dist.rollout_tp
        seed = sampling_seed(cfg.run.seed, self.step, i) + group * 1_000_033 + round_ * 15_485_867
        params = SamplingParams(n=r.n, temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens,
                                seed=seed % (2**31 - 1))
        ro = pol.engine.generate(prompt_ids[lo:hi], params)
        faults.point("rollout", self.step + 1)
        t1 = time.perf_counter()
        golds = [p.answer for p in problems[lo:hi] for _ in range(r.n)]
        grades = self.grader.grade(ro.texts, golds)
        faults.point("reward", self.step + 1)
        if self.dist.enabled:
            ro, grades = D.concat_rollouts(self.dist.gather_rollout_groups((ro, grades)))
        t2 = time.perf_counter()
        rewards = torch.tensor(grades.rewards, dtype=torch.float32).view(len(problems), r.n)
        adv = self.adv_fn(rewards, eps=cfg.algo.adv_eps, norm_by_std=cfg.algo.norm_by_std)
        ps = PolicyStep(pol.name, problems, prompt_ids, ro, rewards, adv, np.asarray(grades.timed_out))
        ps.rollouts.meta["extracted"] = grades.extracted
        return ps, {"time/rollout": t1 - t0, "time/reward": t2 - t1, **grades.counts(), **ro.meta.get("metrics", {})}

    def coefs(self) -> dict:
        out: dict = {}
        for _name, c in self.controllers:
            out.update(c.coefs(self.step))
        return out

    def score_frozen(self, name: str, batch: TrainBatch) -> None:
        """Every frozen model serving policy ``name`` fills its column of the batch (one no-grad pass each)."""
        for f in self.frozen.values():
            if not f.cfg.serves or name in f.cfg.serves:
                col = SCORERS.get(f.cfg.scorer)(f.model, f.tokenizer, batch, score_settings(self.cfg, self.dist))
                if col is not None:  # scorer "none" (a co-generating junior) fills nothing
                    batch.extra[f.cfg.score_column] = col

    def token_signals(self, name: str, batch: TrainBatch, coefs: dict) -> dict:
        """The registered loss mask and token-advantage functions, in config order; returns their metrics."""
        a = self.cfg.algo
        sctx = SignalContext(step=self.step, policy=name, algo=a, coefs=coefs, params=dict(a.loss_mask_params))
        batch.loss_mask = LOSS_MASKS.get(a.loss_mask)(batch, sctx)
        met: dict = {}
        for fn_name in a.token_advantages:
            sctx.params = self.signal_params[fn_name]
            batch.token_adv, m = TOKEN_ADVANTAGES.get(fn_name)(batch, sctx)
            met.update(m)
        return met

    def train_step(self) -> list[dict]:
        cfg = self.cfg
        t_start = time.perf_counter()
        mem = PhaseMemory(next(iter(self.policies.values())).model)
        steps, rows = self.collector.collect(self)
        mem.mark("rollout")
        for name in self.policies:
            rows[name].update(rollout_metrics(steps[name]))
        source_metrics: dict = {}
        for name, src in self.sources.items():  # stored sources: their logged step on the same prompts
            steps[name], m = src.step(steps[next(iter(self.policies))].problems, self.step)
            source_metrics.update(m)
        coefs = self.coefs()
        ctx = ExchangeContext(step=self.step, seed=step_seed(cfg.run.seed, self.step), params=dict(cfg.exchange.params),
                              tokenizers={n: p.tokenizer for n, p in self.policies.items()},
                              encode_prompt=lambda text, name: encode_prompt(self.policies[name], text, self.spec),
                              extra={"score_logprobs":
                                     lambda name, b: score_logprobs(self.policies[name], b, cfg, self.dist)},
                              receivers=list(self.policies))
        t0 = time.perf_counter()
        batches, xmetrics = self.exchange.select(steps, ctx)
        t_x = time.perf_counter() - t0
        names = list(self.policies)

        def train_one(i: int) -> None:  # one receiver: score, admit, frozen columns, token signals, update
            name = names[i]
            pol, b = self.policies[name], batches[name]
            rng = np.random.default_rng([step_seed(cfg.run.seed, self.step), i])  # per policy (train/parallel.py)
            t0 = time.perf_counter()
            b.old_logprobs = old_logprobs(pol, b, cfg, self.dist)
            faults.point("score", self.step + 1)
            mem.mark("score")
            t1 = time.perf_counter()
            rows[name].update(logprob_gap(b))
            b, amet = self.exchange.admit(name, b, ctx)
            rows[name].update(xmetrics.get(name, {}))
            rows[name].update(source_metrics)
            rows[name].update(amet)
            t_f = time.perf_counter()
            self.score_frozen(name, b)
            t2 = time.perf_counter()
            rows[name].update(self.token_signals(name, b, coefs))
            rows[name].update(update_policy(pol, b, cfg, rng, cfg.exchange.ordering, self.dist, self.step, coefs))
            pol.engine.sync_weights(pol.model)
            mem.mark("update")
            t3 = time.perf_counter()
            rows[name].update({"time/old_logprob": t1 - t0, "time/update": t3 - t2, "time/exchange": t_x,
                               "train_rows": len(b)})
            if self.frozen:
                rows[name]["time/score_frozen"] = t2 - t_f
            if cfg.run.log_rollouts and self.dist.is_main:
                self.log_rollouts(steps[name], peer_rows_per_prompt(b, len(steps[name].problems)))
                self.log_admission(name, steps[name])

        self.pool.map(train_one, range(len(names)))
        self.step += 1
        dt = time.perf_counter() - t_start
        out = []
        for name in self.policies:
            out.append({"step": self.step, "policy": name, **rows[name], "time/step": dt, **mem.metrics()})
        for _n, c in self.controllers:  # controllers see the finished step; their metrics go on every row
            cm = c.observe(self.step - 1, out)
            for r in out:
                r.update(cm)
        return out

    def log_rollouts(self, st: PolicyStep, peer_rows: list[int] | None = None) -> None:
        """``rollouts/<policy>/step_N.parquet``: the policy's own samples of the step, one row each, with
        ``peer_rows``: how many rows of another policy's responses the update used on that prompt (after
        the exchange's admission; 0 without exchange). The rescue analysis (graft_cli/eval/rescue.py)
        reads it."""
        n = st.n
        B = len(st.problems)
        ro = st.rollouts
        cols = {
            "step": [self.step] * (B * n),
            "prompt_index": [i for i in range(B) for _ in range(n)],
            "prompt_id": [p.id for p in st.problems for _ in range(n)],
            "sample_index": [j for _ in range(B) for j in range(n)],
            "answer": [p.answer for p in st.problems for _ in range(n)],
            "response": ro.texts,
            "token_ids": ro.response_ids,
            "gen_logprobs": ro.logprobs,
            "truncated": ro.truncated,
            "reward": st.rewards.flatten().tolist(),
            "advantage": st.advantages.flatten().tolist(),
            "extracted": ro.meta.get("extracted", [None] * (B * n)),
            "data_seed": [self.cfg.run.seed] * (B * n),
            "peer_rows": [int((peer_rows or [0] * B)[i]) for i in range(B) for _ in range(n)],
            **ro.token_columns,  # engine columns (tandem: author, 1 = senior)
        }
        write_parquet(rollout_log_path(self.out, st.name, self.step), cols)
        rotate_log(rollout_log_path, self.out, st.name, self.step, self.cfg.run.keep_rollouts)

    def log_admission(self, name: str, st: PolicyStep) -> None:
        """``rollouts/<policy>/exchange_step_N.parquet``: every row another policy's response put into this
        policy's batch this step, kept or dropped by the exchange's admission (the exchange's
        ``admission_log`` columns, e.g. the compatibility score s), with the step and prompt id. Written only
        when the exchange logs (``admission_log`` not None) and a row was transferred."""
        cols = self.exchange.admission_log(name)
        if not cols or not cols.get("prompt_index"):
            return
        k = len(cols["prompt_index"])
        write_parquet(exchange_log_path(self.out, name, self.step),
                      {"step": [self.step] * k, "prompt_id": [st.problems[q].id for q in cols["prompt_index"]],
                       **cols})
        rotate_log(exchange_log_path, self.out, name, self.step, self.cfg.run.keep_rollouts)

    def save(self) -> str:
        best = read_json_or_none(os.path.join(self.out, "best.json")) or {}  # the best by validation stays
        protect = tuple(int(b["step"]) for b in (best.get("policies") or {}).values() if b.get("step") is not None)
        protect += (0,) if self.cfg.run.save_initial else ()
        if self.dist.enabled:  # rank 0 writes, after a collective gather of the full state (FSDP)
            return D.save_checkpoint(self.dist, self.ckpt_root, self.step, self.policies, self.state(),
                                     self.cfg.run.keep_checkpoints, protect)
        return ckpt.save(self.ckpt_root, self.step, self.policies, self.state(), self.cfg.run.keep_checkpoints,
                         protect)

    def close(self) -> None:
        self.pool.close()
        close = getattr(self.grader, "close", None)
        if close:
            close()


def preflight(cfg: C.Config) -> None:
    """Checks that need the models' tokenizers, before anything is written: a frozen model whose scorer scores the
    policies' own token ids (a KL reference, an OPD teacher), or that co-generates with them (a tandem junior),
    must share each served policy's vocabulary."""
    from graft_cli.models.loading import check_model_path, looks_local, vocab_difference

    trained = {p.name: p for p in cfg.policies if p.role == "train"}
    toks: dict = {}

    random = cfg.run.model_init == "random"

    def tok(pc):
        spec = pc.model if random else resolve_path(pc.tokenizer or pc.model)
        if spec not in toks:
            if random:
                from graft_cli.models.shapes import shape_config, synthetic_tokenizer

                toks[spec] = synthetic_tokenizer(shape_config(pc.model, cfg.run.random_shrink))
            else:
                toks[spec] = load_tokenizer(spec, _keys(pc, cfg)[1], pc.trust_remote_code)
        return toks[spec]

    for i, pc in enumerate(cfg.policies):  # local folders that do not exist: one line naming the key
        if random:
            from graft_cli.models.shapes import shape_config

            shape_config(pc.model)  # a model without a published config here: one line
            continue
        check_model_path(resolve_path(pc.model), f"policies.{i}.model")
        if pc.tokenizer:
            check_model_path(resolve_path(pc.tokenizer), f"policies.{i}.tokenizer", "tokenizer")
    data = resolve_path(cfg.data.train)
    if looks_local(data) and not os.path.exists(os.path.expanduser(data)):
        raise GraftError(f"config key 'data.train': {data}: file not found")
    spec = PromptSpec.from_config(cfg.prompt)
    if spec.chat_template == "required":  # a tokenizer without a chat template: one line before anything loads
        for pc in trained.values():  # the prompted ones (a co-generating junior reads the senior's prompt)
            spec.check(tok(pc), f"config key {_keys(pc, cfg)[1]!r}")

    by_name = {p.name: p for p in cfg.policies}
    for k in ENGINES.get(cfg.rollout.engine).frozen_kwargs:  # a co-generating model (tandem junior)
        f = by_name[cfg.rollout.engine_kwargs[k]]
        for name, pc in trained.items():
            if (f.tokenizer or f.model) != (pc.tokenizer or pc.model):
                diff = vocab_difference(tok(f), tok(pc))
                if diff:
                    raise GraftError(f"rollout.engine_kwargs.{k}: {f.name!r} ({f.model}) and policy {name!r} "
                                     f"({pc.model}) do not share a vocabulary ({diff}); the {cfg.rollout.engine} "
                                     f"engine feeds one token id to both")
    for f in [p for p in cfg.policies if p.role == "frozen"]:
        if not getattr(SCORERS.get(f.scorer), "needs_shared_vocab", False):
            continue
        for name in f.serves or list(trained):
            pc = trained[name]
            if (f.tokenizer or f.model) == (pc.tokenizer or pc.model):
                continue
            diff = vocab_difference(tok(f), tok(pc))
            if diff:
                raise GraftError(f"frozen model {f.name!r} ({f.model}) and policy {name!r} ({pc.model}) do not share a "
                                 f"vocabulary ({diff}); scorer {f.scorer!r} scores the policy's own token ids")


def run_dir_for(cfg: C.Config) -> str:
    name = cfg.run.name or f"{cfg.pair}-{cfg.method}-s{cfg.run.seed}"
    return os.path.join(cfg.run.out, name)


RESUME_MAY_DIFFER = {"run.steps", "run.resume", "run.keep_checkpoints", "run.save_every", "run.save_on_signal",
                     "run.log_rollouts",
                     "run.loggers", "run.wandb_project", "run.wandb_mode", "run.log_every",
                     "reward.num_workers", "reward.memory_mb", "run.threads", "run.device", "run.keep_rollouts",
                     "optim.on_nonfinite", "run.out", "run.name",  # run.out, run.name: the run itself (it may move)
                     "run.policy_workers",  # identical results (train/parallel.py)
                     "run.dist_timeout_s"}
RESUME_MAY_DIFFER |= {f"eval.{k}" for k in ("every", "benchmarks", "data_dir", "samples", "runs", "max_new_tokens",
                                              "temperature", "top_p", "seed", "save_best")}  # validation only


def _flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def check_resumable(cfg: C.Config, out_dir: str) -> None:
    path = os.path.join(out_dir, "config.yaml")
    if not os.path.exists(path):
        return
    old = _flat(C.asdict(C.load_yaml(path)))
    new = _flat(C.asdict(cfg))
    diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k) and k not in RESUME_MAY_DIFFER)
    if diff:
        raise GraftError(f"{out_dir}: holds a run with a different config ({', '.join(diff[:5])}); "
                         f"use another run.name/--out, or run.resume=false to start over")


_LOCKS: dict = {}


def _lock_run_dir(out: str) -> None:
    """One training process per run directory: an exclusive ``flock`` on ``<run>/.lock``, released by the
    OS when the process ends (also on a kill), so a second `graft train` on the same run stops at once."""
    import fcntl

    f = open(os.path.join(out, ".lock"), "w")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise GraftError(f"{out}: another graft process is training in this run directory") from None
    _LOCKS[out] = f


def _unlock_run_dir(out: str) -> None:
    """Release this process's lock of ``out`` (a run that ended: the same process may train it again)."""
    f = _LOCKS.pop(out, None)
    if f is not None:
        f.close()


class _Preempt(BaseException):
    """Raised by the SIGTERM handler where the main thread is (the step is abandoned; every write is atomic)."""


class SignalStop:
    """SIGTERM during :func:`train` (a scheduler's preemption; installed in the main thread only). By default the
    step in progress is **abandoned** at once: the handler raises where the main thread is, every file write is
    atomic (a temporary name, then a rename), so nothing half-written is left and the run resumes from its last
    checkpoint. With ``run.save_on_signal`` the step is **finished**, its checkpoint written, and the run stops
    at that step boundary (a second SIGTERM abandons it). Either way the run ends with :class:`Stopped` (exit
    143) and one line."""

    def __init__(self, save_on_signal: bool):
        import signal
        import threading

        self.save, self.requested, self._old = save_on_signal, False, None
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame):
        if self.save and not self.requested:
            self.requested = True  # finish the step, checkpoint it, stop (train() checks at the boundary)
            return
        raise _Preempt()

    def restore(self) -> None:
        import signal

        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
            self._old = None


def train(cfg: C.Config, progress: bool = True, console=None, after_step: tuple[AfterStep, ...] = ()) -> str:
    """Run (or resume) a training run; returns the run directory. Each :class:`AfterStep` hook that is due is
    called as ``hook(trainer, cfg, run_dir, console)`` after the step's checkpoint and may return metrics rows
    to log."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or make_console(stderr=True)
    out = run_dir_for(cfg)
    check_writable(out, "run.out")  # a run directory that cannot be written: one line before anything is loaded
    preflight(cfg)  # nothing is written before the models' vocabularies are known to fit
    is_main = os.environ.get("RANK", "0") == "0"  # data-parallel runs: only rank 0 writes files
    progress = progress and is_main
    if cfg.run.resume:
        check_resumable(cfg, out)  # read-only: refuse a different config before loading anything
    for name in cfg.run.loggers:  # an unknown tracker: one line before anything is loaded
        TRACKERS.get(name)
    # every input (models, tokenizers, data, rewards) is loaded and checked before the run directory is touched
    trainer = Trainer(cfg, out, progress, console)
    stop = SignalStop(cfg.run.save_on_signal)
    try:
        for hook in after_step:  # the hooks' inputs too (validation benchmarks), before anything is written
            hook.prepare(trainer, cfg)
        if is_main:
            os.makedirs(out, exist_ok=True)
            _lock_run_dir(out)
            if os.path.exists(os.path.join(out, "config.yaml")) and not cfg.run.resume:
                import shutil

                for entry in os.listdir(out):  # start over, keeping only our lock
                    if entry != ".lock":
                        path = os.path.join(out, entry)
                        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
            if cfg.run.resume:
                check_resumable(cfg, out)  # again under the lock
            atomic_write_text(os.path.join(out, "config.yaml"), C.to_yaml(cfg))
        resumed = cfg.run.resume and trainer.resume()
        if resumed:
            console.print(f"resumed from step {trainer.step} in {out}")
            if trainer.step >= trainer.total_steps:  # e.g. --steps below the checkpoint's step: nothing is undone
                console.print(f"the checkpoint's step {trainer.step} is at or past this run's {trainer.total_steps} "
                              f"steps: nothing to train (raise --steps to continue; the checkpoint is unchanged)")
        elif is_main:
            mpath = trainer.metrics.path
            if os.path.exists(mpath) and os.path.getsize(mpath) > 0:
                console.print(f"{out}: no complete checkpoint; starting at step 0 (metrics.jsonl of the earlier "
                              f"attempt is cleared)")
            trainer.metrics.truncate_after(0)
        trackers = Trackers(cfg, out, trainer.step) if is_main else None
        # a terminal gets rich's live bar; a log (CI, nohup, a cluster job) one plain line every run.log_every steps
        live = progress and console.is_terminal
        cols = [TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("{task.fields[info]}")]
        try:
            with Progress(*cols, console=console, disable=not live, transient=False) as bar:
                task = bar.add_task("train", total=trainer.total_steps, completed=trainer.step, info="")

                def run_hooks(pending: bool) -> None:  # e.g. validation: eval/<policy>/step_N/, best.json
                    for hook in after_step:
                        if hook.due(trainer, cfg) and not (pending and hook.done(trainer, cfg, out)):
                            val = hook(trainer, cfg, out, None)
                            if is_main and val:
                                trainer.metrics.write(val)
                                trackers.log(val)

                if resumed:  # the hooks of the step it resumed at, if they had not finished (killed in validation)
                    run_hooks(pending=True)
                elif cfg.run.save_initial and trainer.step == 0:  # the base weights, as step 0
                    trainer.save()
                while trainer.step < trainer.total_steps:
                    try:
                        rows = trainer.train_step()
                    except PeerLost:
                        raise
                    except GraftError as e:  # say what is on disk: the checkpoint a rerun resumes from, if any
                        raise GraftError(f"{e}; {on_disk(trainer)}") from None
                    if is_main:
                        trainer.metrics.write(rows)
                        trackers.log(rows)
                    if (trainer.step % cfg.run.save_every == 0 or trainer.step == trainer.total_steps
                            or any(h.due(trainer, cfg) for h in after_step) or stop.requested):
                        trainer.save()  # complete on disk before any hook runs
                    if stop.requested:  # run.save_on_signal: the step is finished and checkpointed
                        raise Stopped(f"stopped by SIGTERM after step {trainer.step}; its checkpoint is written "
                                      f"(run.save_on_signal); rerun the same command to continue")
                    run_hooks(pending=False)
                    info = step_line(rows)
                    bar.update(task, completed=trainer.step, info=info)
                    if progress and not live and (trainer.step % cfg.run.log_every == 0
                                                  or trainer.step == trainer.total_steps):
                        console.print(f"step {trainer.step}/{trainer.total_steps} {info}", soft_wrap=True,
                                      highlight=False)
        finally:
            if trackers is not None:
                trackers.close()
    except PeerLost as e:  # another data-parallel rank died or hung (train/dist.py): one line, exit 75
        raise PeerLost(f"{e}; {trainer.step} steps done, {on_disk(trainer)}; relaunch every rank to resume") \
            from None
    except RuntimeError as e:  # a collective inside FSDP / a checkpoint gather (NCCL, the store, gloo)
        if not (trainer.dist.enabled and (isinstance(e, torch.distributed.DistError) or "gloo" in str(e))):
            raise
        raise PeerLost(f"{D.peer_lost(trainer.dist, 'a collective', e)}; {trainer.step} steps done, "
                       f"{on_disk(trainer)}; relaunch every rank to resume") from None
    except _Preempt:
        last = ckpt.valid_steps(trainer.ckpt_root)
        raise Stopped(f"stopped by SIGTERM during step {trainer.step + 1}, which was abandoned; "
                      + (f"the last checkpoint (step {last[-1]}) is intact; " if last else "no checkpoint yet; ")
                      + "rerun the same command to continue") from None
    finally:
        stop.restore()
        trainer.close()
        _unlock_run_dir(out)
    if is_main:
        console.print(f"run directory: {out} ({disk_use(out) / 2**20:.1f} MiB on disk)", soft_wrap=True)
    return out


def on_disk(trainer) -> str:
    """What a rerun resumes from: the newest checkpoint that verifies, or step 0."""
    last = ckpt.valid_steps(trainer.ckpt_root)
    return f"the last checkpoint (step {last[-1]}) is intact" if last else \
        "no checkpoint was written yet (a rerun starts at step 0)"


def step_line(rows: list[dict]) -> str:
    """One step in a line: per policy the reward (and, when it exchanged, groups from the peer / responses
    admitted), then seconds per step."""
    parts = []
    for r in rows:
        p = f"{r['policy']}: r={r.get('reward', float('nan')):.3f}"
        if r.get("graft/selected") is not None:
            p += f" peer groups {r['graft/selected']} admitted {r.get('graft/admitted', 0)}"
        parts.append(p)
    return " | ".join(parts) + f" | {rows[0]['time/step']:.1f} s/step"


def disk_use(path: str) -> int:
    """Bytes of every file under ``path``."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs
               if os.path.isfile(os.path.join(d, f)))
