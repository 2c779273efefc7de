"""Scoring in a step: the log-probs of a batch's rows under a policy's current weights (no grad),
the old log-probs of the update (``algo.old_logprobs``), the frozen models' columns (reference,
teacher), and the rollout-vs-trainer gap on the policy's own rows."""

from __future__ import annotations

import dataclasses

import numpy as np

from graft_cli import config as C
from graft_cli.batch import TrainBatch
from graft_cli.models.scoring import SCORERS, ScoreSettings, score_rows
from graft_cli.train import dist as D
from graft_cli.train.policies import Frozen, Policy


def score_settings(cfg: C.Config, dist: D.Dist | None = None) -> ScoreSettings:
    return ScoreSettings(temperature=cfg.rollout.temperature, token_budget=cfg.optim.micro_batch_tokens * 2,
                         chunk_tokens=cfg.optim.chunk_tokens, shared_prefix=cfg.optim.shared_prefix, dist=dist,
                         autocast=cfg.optim.autocast)


def score_logprobs(pol: Policy, batch: TrainBatch, cfg: C.Config, dist: D.Dist | None = None,
                   only: list[int] | None = None) -> list[list[float] | None]:
    """Old log-probs of every row (``only``: of those rows) under the policy's current weights: one
    batched no-grad pass (data-parallel: each rank scores a shard of the rows, then the results are
    all-gathered)."""
    return score_rows(pol.model, pol.tokenizer.pad_token_id, batch, score_settings(cfg, dist), only)


def old_logprobs(pol: Policy, b: TrainBatch, cfg: C.Config, dist: D.Dist | None = None) -> list[list[float]]:
    """The old log-probs of the update (``algo.old_logprobs``): ``trainer`` rescores every row under
    the current weights (verl's convention); ``rollout`` keeps the rollout log-probs on the policy's
    own rows and scores only the peer rows (another policy's responses, co-trained or stored), which
    have none."""
    if cfg.algo.old_logprobs == "trainer":
        return score_logprobs(pol, b, cfg, dist)
    peer = b.peer_rows()
    scored = score_logprobs(pol, b, cfg, dist, only=peer) if peer else [None] * len(b)
    return [list(roll) if s == "self" else lp for s, roll, lp in zip(b.source, b.rollout_logprobs, scored)]


def score_frozen(frozen: dict[str, Frozen], name: str, batch: TrainBatch, settings: ScoreSettings) -> TrainBatch:
    """The batch with the column of every frozen model serving policy ``name`` (one no-grad pass
    each, in config order: a scorer sees the columns of the ones before it)."""
    for f in frozen.values():
        if not f.cfg.serves or name in f.cfg.serves:
            with f.scope():
                col = SCORERS.get(f.cfg.scorer)(f.model, f.tokenizer, batch, settings)
            if col is not None:  # scorer "none" (a co-generating junior) fills nothing
                batch = dataclasses.replace(batch, extra={**batch.extra, f.cfg.score_column: col})
    return batch


def logprob_gap(batch: TrainBatch) -> dict:
    """Rollout-vs-trainer log-prob gap on the policy's own rows (TRL ``sampling/*`` names)."""
    diffs = []
    for s, roll, old in zip(batch.source, batch.rollout_logprobs, batch.old_logprobs or []):
        if s == "self" and roll is not None and len(roll) == len(old) and len(old):
            diffs.append(np.abs(np.asarray(roll) - np.asarray(old)))
    if not diffs:
        return {}
    d = np.concatenate(diffs)
    return {"sampling/sampling_logp_difference/mean": float(d.mean()),
            "sampling/sampling_logp_difference/max": float(d.max())}
