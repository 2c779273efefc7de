"""Scoring rows of a TrainBatch under a model: one batched no-grad pass, and the registry of
scorers.

:func:`score_rows` is the trainer's old-log-prob pass (every row under the policy's current weights)
and the pass every scorer uses: rows sorted by length (with ``shared_prefix``: rows of one prompt
together, each prompt run once), packed into micro-batches of ``token_budget`` padded tokens,
chunked LM head (:func:`graft_cli.models.logprobs.response_logprobs`); data-parallel, each rank
scores a shard of the rows and the results are all-gathered.

A scorer (registry ``SCORERS``) turns a TrainBatch and a *frozen* model (a model with ``role:
frozen``: a KL reference, an OPD teacher, a tandem junior) into one per-row column, stored as
``batch.extra[<column>]``: ``scorer(model, tokenizer, batch, settings) -> list``.

- ``logprobs``: per-token log π_frozen(o_t | ·) of each row's response tokens at the rollout
  temperature (a KL reference's or a teacher's log-probs), as a list per row. verl's reference
  worker scores at ``rollout.temperature`` as its actor does (``compute_ref_log_prob``:
  ``meta_info["temperature"]``), so the k3 KL to a frozen copy of the initial weights is 0 at step 1
  whatever the temperature (tandem_qwen3_4b: 0.6); an OPD teacher is scored the same way (S0 puts it
  in the reference slot; its rollouts are at T = 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from graft_cli.batch import TrainBatch, plan_micro_batches
from graft_cli.models.logprobs import pack, prefix_groups, response_logprobs
from graft_cli.registry import Registry

@dataclass(frozen=True)
class ScorerSpec:
    """A scorer's needs: ``shared_vocab``, it scores the policy's own token ids, so the frozen model
    must share the policy's vocabulary (checked before anything loads)."""

    shared_vocab: bool = False


SCORERS: Registry = Registry("scorer", ScorerSpec)


class DistLike(Protocol):
    """What scoring needs of a data-parallel group (:class:`graft_cli.train.dist.Dist` is one):
    whether it is on, whether models are FSDP-sharded, this rank's share of the rows, the group's
    maximum of an int, and every rank's object."""

    enabled: bool
    fsdp: bool

    def shard(self, rows: list[int]) -> list[int]: ...

    def max_int(self, x: int) -> int: ...

    def gather_objects(self, obj) -> list: ...


class OneProcess:
    """The :class:`DistLike` of a single process: every row here, nothing to gather."""

    enabled = fsdp = False

    def shard(self, rows: list[int]) -> list[int]:
        return rows

    def max_int(self, x: int) -> int:
        return x

    def gather_objects(self, obj) -> list:
        return [obj]


@dataclass
class ScoreSettings:
    temperature: float = 1.0
    token_budget: int = 32768  # padded tokens per scoring micro-batch
    chunk_tokens: int = 4096
    dist: DistLike | None = None  # a graft_cli.train.dist.Dist, or None (one process)
    shared_prefix: bool = False  # each distinct prompt runs once per micro-batch (models/logprobs.py)
    autocast: str = "none"  # none | bfloat16: the forward under torch.autocast (optim.autocast)


@torch.no_grad()
def score_rows(model, pad_id: int, batch: TrainBatch, settings: ScoreSettings,
               only: list[int] | None = None) -> list[list[float] | None]:
    """Per-token log-probs of every row's response tokens under ``model`` (module docstring); with
    ``only``, of those rows alone (the others are None)."""
    d = settings.dist or OneProcess()
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    wanted = list(range(len(batch))) if only is None else sorted(set(only))
    order = d.shard(wanted)
    out: list[list[float] | None] = [None] * len(batch)
    mbs = plan_micro_batches([batch.prompt_ids[i] for i in order], [batch.response_ids[i] for i in order],
                             settings.token_budget, shared_prefix=settings.shared_prefix)  # sorted: less padding
    mbs += [None] * ((d.max_int(len(mbs)) if d.fsdp else len(mbs)) - len(mbs))  # FSDP: same forward count
    for mb in mbs:
        rows = [order[i] for i in mb] if mb is not None else [0]
        prompts, responses = [batch.prompt_ids[i] for i in rows], [batch.response_ids[i] for i in rows]
        ids, att, resp = pack(prompts, responses, pad_id, dev)
        groups = prefix_groups(prompts, responses, pad_id, dev) if settings.shared_prefix else None
        lp, _ = response_logprobs(model, ids, att, resp, settings.temperature, settings.chunk_tokens, groups=groups,
                                  autocast_dtype=settings.autocast)
        if mb is None:  # a dummy pass that keeps FSDP ranks in lock-step
            continue
        lp = lp.cpu()
        for j, i in enumerate(rows):
            p = len(batch.prompt_ids[i])
            out[i] = lp[j, p - 1 : p - 1 + len(batch.response_ids[i])].tolist()
    if was_training:
        model.train()
    if d.enabled:
        for part in d.gather_objects({i: out[i] for i in order}):
            for i, v in part.items():
                out[i] = v
    return out  # type: ignore[return-value]


@SCORERS.register("logprobs", ScorerSpec(shared_vocab=True))
def logprob_scorer(model, tokenizer, batch: TrainBatch, settings: ScoreSettings) -> list[list[float]]:
    """Per-token log-probs of the response tokens under the frozen model at the settings'
    temperature (the trainer passes the rollout temperature, as verl's reference worker)."""
    return score_rows(model, tokenizer.pad_token_id, batch, settings)


@SCORERS.register("none")
def no_scorer(model, tokenizer, batch: TrainBatch, settings: ScoreSettings) -> None:
    """Fills no column: a frozen model that only co-generates (a tandem junior) or is used
    elsewhere."""
    return None
