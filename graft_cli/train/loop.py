"""The training loop for N >= 1 policies sharing each prompt batch (README.md, "How a step works").

    collect     every trained policy samples the step's prompts, grades them, takes    train/rollouts.py,
                group advantages (+ each stored source's logged step)                  train/sources.py
    exchange    exchange.select builds each policy's batch ("none" = independent GRPO)   algorithms/exchange/
    per policy  score (old log-probs) -> exchange.admit -> frozen models' columns      train/policy_stages.py,
                -> token signals -> update (minibatches, loss, optimizer) -> sync       train/old_logprobs.py,
                                                                                        train/update.py
    after       controllers observe the step; rollout and exchange logs                train/step_logs.py

A step calls only downward: the collection samples through a :class:`~graft_cli.train.rollouts.RolloutWorker`,
the exchange encodes and scores through :class:`~graft_cli.train.policy_stages.PolicyReceivers`, and
:func:`train_one` runs one policy's stages, the methods of a :class:`~graft_cli.train.policy_stages.PolicyStages`
(no trainer in it), each returning the batch the next one reads. Everything method-specific is looked up by name
from the config; nothing here branches on a method, and the loss inputs are built from the TrainBatch's columns
only. This module holds the :class:`Trainer`: its state, resume, and one step (:meth:`Trainer.train_step`);
loading the models and the checks before anything loads are train/policies.py's; the run driver
:func:`graft_cli.train.run.train` holds the run directory, lock, resume check, the step loop, checkpoints and
hooks.
"""

from __future__ import annotations

import random

import numpy as np
import torch
from rich.markup import escape

from graft_cli import config as C
from graft_cli.algorithms.advantages import ADVANTAGES
from graft_cli.algorithms.controllers import build_controllers
from graft_cli.algorithms.exchange import EXCHANGES, ExchangeContext
from graft_cli.console import make_console
from graft_cli.data.mix import training_problems
from graft_cli.data.problems import Problem, split_holdout
from graft_cli.data.prompts import PromptSpec
from graft_cli.data.sampler import PromptSampler
from graft_cli.errors import GraftError
from graft_cli.models import shards
from graft_cli.models.loading import resolve_path
from graft_cli.reward import make_grader, started
from graft_cli.rundir import (
    MetricsLog,
    best_path,
    checkpoints_dir,
    metrics_path,
    read_json_or_none,
)
from graft_cli.train import checkpoint as ckpt
from graft_cli.train import dist as D
from graft_cli.train.rollouts import CollectInputs, RolloutWorker, collection_for, collector_for
from graft_cli.train.parallel import LockedGrader, PolicyPool, resolve_workers
from graft_cli.train.phases import Phases
from graft_cli.train.hooks import StepView
from graft_cli.train.policies import base_frozen, build_frozen, build_policy, encode_prompt
from graft_cli.train.policy_stages import PolicyReceivers, PolicyStages, PolicyWork
from graft_cli.train.sources import STEP_SOURCES
from graft_cli.train.step_logs import rollout_metrics
from graft_cli.train.update import AlgoParams
from graft_cli.train.sync_check import SyncCheck
from graft_cli.train.sync_check import tolerance as sync_tolerance


def step_seed(run_seed: int, step: int) -> int:
    return (run_seed * 999_983 + step * 15_485_863 + 17) % (2**31 - 1)


def train_one(w: PolicyWork, s: PolicyStages) -> None:
    """One policy's part of a step: each stage returns the batch the next one reads; the metrics go into
    ``w.row``."""
    b = s.old_logprobs(w, w.batch)  # score: π_old, one no-grad pass under the current weights
    b = s.admit(w, b)  # exchange.admit: weight or drop rows
    b = s.frozen_columns(w, b)  # the frozen models' columns (reference, teacher)
    b = s.token_signals(w, b)  # loss mask, rollout rejection, token advantages
    s.update(w, b)  # minibatches, loss, optimizer; the weights pushed into the engine and checked
    s.log(w, b)  # seconds; rollout and exchange logs


# -------------------------------------------------------------------------------------------- trainer
class Trainer:
    def __init__(self, cfg: C.Config, out_dir: str, progress: bool = True, console=None):
        self.cfg, self.out, self.progress = cfg, out_dir, progress

        con = console or make_console(stderr=True)
        self.warn = lambda msg: con.print(f"[yellow]warning[/]: {escape(msg)}", soft_wrap=True, highlight=False)
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        torch.manual_seed(cfg.run.seed)
        np.random.seed(cfg.run.seed)
        random.seed(cfg.run.seed)  # recorded in each checkpoint's state.json (rng.python): identical runs, same file
        self.dist = D.setup(cfg)  # data-parallel processes (torchrun / accelerate launch); a no-op alone
        self.spec = PromptSpec.from_config(cfg.prompt)
        self.problems: list[Problem] = training_problems(cfg.data, resolve_path(cfg.data.train))
        self.problems, self.held_out = split_holdout(self.problems, cfg.data.holdout, cfg.data.holdout_seed,
                                                     cfg.data.holdout_distinct)
        self.frozen = {pc.name: build_frozen(pc, cfg, self.dist) for pc in cfg.policies
                       if pc.role == "frozen" and pc.base_of is None}
        self.policies = {pc.name: build_policy(pc, cfg, self.dist, self.frozen) for pc in cfg.policies
                         if pc.role == "train"}
        self.frozen.update({pc.name: base_frozen(pc, self.policies[pc.base_of]) for pc in cfg.policies
                            if pc.role == "frozen" and pc.base_of is not None})  # a LoRA policy's base
        self._filter_long_prompts()
        # run.sync_check's probe per policy: two training prompts answered by their reference answers
        self.check_sync = SyncCheck(cfg.run.sync_check, sync_tolerance(cfg.run.dtype, cfg.run.sync_tolerance),
                                    cfg.rollout.engine, self.warn, enabled=not self.dist.enabled)
        for n, pol in self.policies.items():
            self.check_sync.probe(n, [encode_prompt(pol, q.problem, self.spec) for q in self.problems[:2]],
                                  [q.answer for q in self.problems[:2]], pol.tokenizer)
        self.sampler = PromptSampler(len(self.problems), cfg.data.prompt_batch, cfg.run.seed, cfg.data.shuffle)
        self.exchange = EXCHANGES.get(cfg.exchange.name)(cfg)
        self.adv_fn = ADVANTAGES.get(cfg.algo.advantage)

        self.grader = started(make_grader(cfg.reward))  # a reward that cannot run here stops the run before step 1
        first = next(iter(self.policies.values()))
        self.policy_workers = resolve_workers(cfg.run.policy_workers, len(self.policies), torch.get_num_threads(),
                                              next(first.model.parameters()).device.type, self.dist.enabled)
        if self.policy_workers > 1:  # train/parallel.py: one policy per thread, the cores split between them
            torch.set_num_threads(max(1, torch.get_num_threads() // self.policy_workers))
        if self.policy_workers > 1 or C.samples_ahead(cfg.run):  # graded from several threads (train/rollouts.py)
            self.grader = LockedGrader(self.grader)
        self.pool = PolicyPool(self.policy_workers)
        self.sources = {sc.name: STEP_SOURCES.get(sc.kind)(sc, self.grader, self.adv_fn, cfg.algo, cfg.run.seed)
                        for sc in cfg.sources}
        self.total_steps = cfg.run.steps or cfg.run.epochs * self.sampler.steps_per_epoch
        self.controllers = build_controllers(cfg.algo.controllers, self.total_steps)
        self.collector = collector_for(cfg)
        worker = RolloutWorker(self.policies, self.spec, self.grader, self.adv_fn, cfg, self.dist)
        self.collect_inputs = CollectInputs(self.problems, self.sampler, list(self.policies), worker, self.pool)
        # run.staleness: this step's rollouts, or those sampled ahead while earlier steps updated (train/rollouts.py)
        self.collection = collection_for(cfg, self.collector, self.collect_inputs, self.policies, self.check_sync,
                                         worker, self.total_steps)
        self.receivers = PolicyReceivers(self.policies, self.spec, cfg, self.dist)
        self.stages = PolicyStages(cfg, self.dist, self.policies, self.frozen, self.exchange, self.collection,
                                   AlgoParams.of(cfg.algo), out_dir)
        self.step = 0
        self.metrics = MetricsLog(metrics_path(out_dir))
        self.ckpt_root = checkpoints_dir(out_dir)
        self.check_sources()

    def check_sources(self) -> None:
        """Every step source's data for the steps this run may train (from its oldest complete checkpoint on, or
        from step 0), checked before step 1 against the steps' prompts where the collector knows them in advance
        (``prompts_at``); a missing partner log is one line before anything is written."""
        if not self.sources:
            return
        start = min(ckpt.complete_steps(self.ckpt_root), default=0) if self.cfg.run.resume else 0
        plan = lambda t: self.collector.prompts_at(self.collect_inputs, t)  # noqa: E731
        for src in self.sources.values():
            src.check(range(start, self.total_steps), plan)

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
                "frozen": {n: {"model": f.cfg.model, "sha256": f.sha256} for n, f in self.frozen.items()},
                "lora_base": {n: p.base_sha256 for n, p in self.policies.items() if p.base_sha256 is not None},
                **({"collection": c} if (c := self.collection.state_dict()) is not None else {})}

    def check_lora_bases(self, st: dict, path: str) -> None:
        """A LoRA policy's checkpoint holds its adapter only: its base must be the one the adapter was trained on."""
        for name, pol in self.policies.items():
            if pol.base_sha256 is None:
                continue
            was = (st.get("lora_base") or {}).get(name)
            if was != pol.base_sha256:
                raise GraftError(f"{path}: policy {name!r}'s LoRA adapter was trained on another base model (now "
                                 f"sha256 {pol.base_sha256[:12]}, checkpoint: {str(was)[:12] if was else 'no record'});"
                                 f" use the same base weights or run.resume=false")

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
        complete = ckpt.complete_steps(self.ckpt_root)
        for s in reversed(ckpt.valid_steps(self.ckpt_root, self.warn)):
            path = ckpt.step_path(self.ckpt_root, s)
            try:  # read everything first: a checkpoint that fails to load leaves the trainer untouched
                st = ckpt.load_state(path)
                self.check_frozen(st, path)
                self.check_lora_bases(st, path)
                loaded = ckpt.read_policy_states(path, self.policies)
            except GraftError:
                raise
            except ckpt.RefusedCheckpoint as e:  # a crafted pickle behind a matching manifest
                self.warn(f"checkpoint step {s} skipped: {e}")
                continue
            except Exception as e:  # verified but unloadable (e.g. a manifest rewritten over damaged files)
                self.warn(f"checkpoint step {s} skipped: {path}: {type(e).__name__}: "
                          f"{(str(e).splitlines() or [''])[0][:200]}")
                continue
            self.restore(st, loaded)
            return True
        if complete:
            raise GraftError(f"{self.ckpt_root}: none of the {len(complete)} complete checkpoints could be restored "
                             f"(steps {', '.join(map(str, complete))}; see the warnings); move them away or use "
                             f"run.resume=false")
        return False

    def restore(self, st: dict, loaded: dict) -> None:
        """The policies' weights and optimizer states (:func:`~graft_cli.train.checkpoint.read_policy_states`),
        synced into their engines with the rollouts in flight, then the data cursor, exchange, controllers and RNG
        state of ``st``."""
        for name, pol in self.policies.items():
            msd, osd, kind = loaded[name]
            if kind == "sharded":
                shards.load_state_into(pol.model, msd)
                pol.optimizer.load_state_dict(osd)
            elif kind == "adapter":
                self.dist.load_adapter_state(pol.model, pol.optimizer, msd, osd)
            else:
                self.dist.load_full_state(pol.model, pol.optimizer, msd, osd)
        self.collection.restore(st.get("collection"), st["step"])
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

    # -- one step
    def coefs(self) -> dict:
        out: dict = {}
        for _name, c in self.controllers:
            out.update(c.coefs(self.step))
        return out

    def train_step(self) -> list[dict]:
        """One step (module docstring): collect (sample and grade; the stored sources' logged steps), the
        exchange's selection, then each policy's stages (:func:`train_one`, one thread per policy where
        ``run.policy_workers`` > 1), then the controllers see the step. Seconds and peak memory per phase:
        :class:`~graft_cli.train.phases.Phases`."""
        phase = Phases(next(iter(self.policies.values())).model)
        with phase("step", memory=False):
            with phase("rollout"):
                steps, rows = self.collection.take(self.step)
            for name in self.policies:
                rows[name].update(rollout_metrics(steps[name]))
            source_metrics = self.source_steps(steps)
            ctx, coefs = self.exchange_context(), self.coefs()
            with phase("exchange", memory=False):
                batches, xmetrics = self.exchange.select(steps, ctx)
            work = [PolicyWork(i, name, steps[name], batches[name], rows[name],
                               {**xmetrics.get(name, {}), **source_metrics}) for i, name in enumerate(self.policies)]
            stages = self.stages.at(self.step, step_seed(self.cfg.run.seed, self.step), ctx, coefs, phase)
            self.pool.map(lambda w: train_one(w, stages), work)
            self.step += 1
        out = [{"step": self.step, "policy": name, **rows[name], "time/step": phase.seconds["step"], **phase.metrics()}
               for name in self.policies]
        for _n, c in self.controllers:  # controllers see the finished step; their metrics go on every row
            cm = c.observe(self.step - 1, out)
            for r in out:
                r.update(cm)
        return out

    def source_steps(self, steps: dict) -> dict:
        """Each stored source's logged step on this step's prompts, added to ``steps``; their metrics."""
        out: dict = {}
        for name, src in self.sources.items():
            steps[name], m = src.step(steps[next(iter(self.policies))].problems, self.step)
            out.update(m)
        return out

    def exchange_context(self) -> ExchangeContext:
        """What the exchange sees this step: the receivers' tokenizers, their prompt encoding and their scoring
        (old log-probs of rows under a receiver's current weights: :class:`PolicyReceivers`)."""
        return ExchangeContext(step=self.step, seed=step_seed(self.cfg.run.seed, self.step),
                               tokenizers={n: p.tokenizer for n, p in self.policies.items()},
                               receivers=self.receivers, receiver_names=list(self.policies))

    def view(self) -> StepView:
        """What an after-step hook sees (:class:`~graft_cli.train.hooks.StepView`)."""
        return StepView(step=self.step, total_steps=self.total_steps, policies=self.policies,
                        held_out=self.held_out, data_parallel=self.dist.enabled, spec=self.spec, grader=self.grader)

    def settle(self) -> None:
        """No rollout in flight, and the engines sample from the trainer's weights (before a checkpoint or an
        after-step hook; train/rollouts.py)."""
        self.collection.settle(self.step)

    def save(self) -> str:
        self.settle()
        best = read_json_or_none(best_path(self.out)) or {}  # the best by validation stays
        protect = tuple(int(b["step"]) for b in (best.get("policies") or {}).values() if b.get("step") is not None)
        protect += (0,) if self.cfg.run.save_initial else ()
        if self.dist.enabled:  # rank 0 writes, after a collective gather of the full state (FSDP)
            return D.save_checkpoint(self.dist, self.ckpt_root, self.step, self.policies, self.state(),
                                     self.cfg.run.keep_checkpoints, protect, self.cfg.run.checkpoint_format)
        return ckpt.save(self.ckpt_root, self.step, self.policies, self.state(), self.cfg.run.keep_checkpoints,
                         protect)

    def close(self) -> None:
        self.collection.close()
        for pol in self.policies.values():
            pol.engine.close()
        self.pool.close()
        self.grader.close()
