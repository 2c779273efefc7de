"""One policy's part of a step, stage by stage (the per-policy lines of train/loop.py's picture), and the trained
policies as the exchange sees them (:class:`PolicyReceivers`).

Each stage reads the policy's batch and returns a new one (``dataclasses.replace``: the columns it sets are new
lists, the others are shared, the batch it was given is left as it was); its metrics go into the policy's row:

    old_logprobs    π_old of every row, one no-grad pass (train/old_logprobs.py); the rollout-vs-trainer gap
    admit           the exchange weights or drops rows (``exchange.admit``)
    frozen_columns  the frozen models' columns (reference, teacher log-probs; SCORERS)
    token_signals   loss mask, rollout rejection, token advantages (train/update.py)
    update          minibatches, loss, optimizer (train/update.py); the weights pushed into the engine, the sync probe
    log             the stages' seconds; the rollout and exchange logs

:class:`PolicyStages` holds what the stages read (the policies, frozen models, exchange, collection, config) and
the step's own values (:meth:`PolicyStages.at`); it holds no trainer."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from graft_cli import config as C
from graft_cli import faults
from graft_cli.algorithms.exchange import Exchange, ExchangeContext
from graft_cli.batch import PolicyStep, TrainBatch
from graft_cli.data.prompts import PromptSpec
from graft_cli.train import dist as D
from graft_cli.train.rollouts import AheadCollection, InlineCollection
from graft_cli.train.old_logprobs import logprob_gap, old_logprobs, score_frozen, score_logprobs, score_settings
from graft_cli.train.phases import Phases
from graft_cli.train.policies import Frozen, Policy, encode_prompt
from graft_cli.train.step_logs import StepLogs, peer_rows_per_prompt
from graft_cli.train.update import AlgoParams, UpdateContext, token_signals, update_policy


@dataclass
class PolicyWork:
    """One trained policy's part of a step: its index and name, its collected step, the batch the exchange built
    for it, its metrics row so far, the metrics of the exchange and the stored sources, and its stages' seconds."""

    index: int
    name: str
    step: PolicyStep
    batch: TrainBatch
    row: dict
    metrics: dict
    times: dict = field(default_factory=dict)


@dataclass(frozen=True)
class PolicyReceivers:
    """The trained policies as an exchange sees them (:class:`~graft_cli.algorithms.exchange.base.Receivers`): a
    policy's prompt encoding (through its prompt cache) and its no-grad scoring of rows under its current
    weights."""

    policies: dict[str, Policy]
    spec: PromptSpec
    cfg: C.Config
    dist: D.Dist

    def encode(self, text: str, name: str) -> list[int]:
        return encode_prompt(self.policies[name], text, self.spec)

    def score(self, name: str, batch: TrainBatch) -> list:
        return score_logprobs(self.policies[name], batch, self.cfg, self.dist)


@dataclass(frozen=True)
class PolicyStages:
    """What one policy's stages read: the run's config, data-parallel group, trained policies, frozen models,
    exchange, rollout collection (the updated weights go to it), the ``algo`` functions' parameters (loss, loss
    mask, rejection mask, token advantages) and the run directory; and, per step (:meth:`at`), the 0-based step,
    its seed (the minibatch order: per (step, policy)), the exchange's context, the controllers' coefficients and
    the step's phase timer."""

    cfg: C.Config
    dist: D.Dist
    policies: dict[str, Policy]
    frozen: dict[str, Frozen]
    exchange: Exchange
    collection: InlineCollection | AheadCollection
    algo_params: AlgoParams
    out: str
    step: int = 0
    seed: int = 0
    ctx: ExchangeContext | None = None
    coefs: dict = field(default_factory=dict)
    phase: Phases | None = None

    def at(self, step: int, seed: int, ctx: ExchangeContext, coefs: dict, phase: Phases) -> PolicyStages:
        """The stages of 0-based ``step``."""
        return dataclasses.replace(self, step=step, seed=seed, ctx=ctx, coefs=coefs, phase=phase)

    def old_logprobs(self, w: PolicyWork, b: TrainBatch) -> TrainBatch:
        """The batch with its old log-probs (``algo.old_logprobs``); the rollout-vs-trainer gap goes into the row."""
        with self.phase("score", w.times):
            b = dataclasses.replace(b, old_logprobs=old_logprobs(self.policies[w.name], b, self.cfg, self.dist))
            faults.point("score", self.step + 1)
        w.row.update(logprob_gap(b))
        return b

    def admit(self, w: PolicyWork, b: TrainBatch) -> TrainBatch:
        """The exchange's admission of the rows; its metrics and those of the selection and sources go into the row."""
        b, amet = self.exchange.admit(w.name, b, self.ctx)
        w.row.update({**w.metrics, **amet})
        return b

    def frozen_columns(self, w: PolicyWork, b: TrainBatch) -> TrainBatch:
        """The batch with the columns of the frozen models serving the policy."""
        with self.phase("score_frozen", w.times, memory=False):
            b = score_frozen(self.frozen, w.name, b, score_settings(self.cfg, self.dist))
        return b

    def token_signals(self, w: PolicyWork, b: TrainBatch) -> TrainBatch:
        """The batch with its loss mask and token advantages; their metrics go into the row. Timed with the update
        (``time/update``); its memory peak is the update's."""
        with self.phase("signals", w.times, memory=False):
            b, met = token_signals(b, self.cfg.algo, self.algo_params, self.step, w.name, self.coefs)
        w.row.update(met)
        return b

    def update(self, w: PolicyWork, b: TrainBatch) -> None:
        """The policy's update on ``b``; the updated weights go to the collection (train/rollouts.py), then the sync
        probe; the metrics of both go into the row."""
        pol = self.policies[w.name]
        rng = np.random.default_rng([self.seed, w.index])  # per policy (train/parallel.py)
        with self.phase("update", w.times):
            w.row.update(update_policy(pol, b, UpdateContext(self.cfg, self.dist, self.step, self.coefs, rng,
                                                             self.algo_params)))
            self.collection.push(w.name, pol)  # the engine samples from the updated weights
        w.row.update(self.collection.check(w.name, pol, self.step + 1))

    def log(self, w: PolicyWork, b: TrainBatch) -> None:
        """The stages' seconds and the trained rows' count into the row; the rollout and exchange logs
        (``run.log_rollouts``)."""
        t, row = w.times, w.row
        row.update({"time/old_logprob": t["score"], "time/update": t["signals"] + t["update"],
                    "time/exchange": self.phase.seconds["exchange"], "train_rows": len(b)})
        if self.frozen:
            row["time/score_frozen"] = t["score_frozen"]
        if self.cfg.run.log_rollouts and self.dist.is_main:
            logs = StepLogs(self.out, self.step, self.cfg.run.seed, self.cfg.run.keep_rollouts)
            logs.rollouts(w.step, peer_rows_per_prompt(b, len(w.step.problems)))
            logs.admission(w.name, w.step, self.exchange.admission_log(w.name))


__all__ = ["PolicyWork", "PolicyReceivers", "PolicyStages"]
