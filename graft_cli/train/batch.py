"""Per-step data structures and the minibatch schedule.

``PolicyStep`` is one policy's rollouts on the shared prompt batch with rewards and advantages.
``TrainBatch`` is what a policy is optimised on: one row per response (self, peer or teacher), with the
receiver's token ids, a scalar advantage (optionally per-token via ``token_adv``), a weight, a source
tag and a group id (the prompt's index in the step batch). Exchange steps turn ``PolicyStep``s into
``TrainBatch``es; the trainer only scores, schedules and optimises them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from graft_cli.data.problems import Problem
from graft_cli.rollout.base import Rollouts

SOURCES = ("self", "peer", "teacher")


@dataclass
class PolicyStep:
    name: str
    problems: list[Problem]
    prompt_ids: list[list[int]]  # this policy's own encoding of each prompt (B)
    rollouts: Rollouts
    rewards: torch.Tensor  # (B, n) float
    advantages: torch.Tensor  # (B, n) float, computed over the full group
    timed_out: np.ndarray | None = None  # (B*n,) bool: reward grading timed out

    @property
    def k(self) -> torch.Tensor:
        """Successes per prompt k(q) (reward > 0.5 counts as correct)."""
        return (self.rewards > 0.5).sum(-1)

    @property
    def n(self) -> int:
        return self.rollouts.n


@dataclass
class TrainBatch:
    prompt_ids: list[list[int]] = field(default_factory=list)
    response_ids: list[list[int]] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    source: list[str] = field(default_factory=list)
    group: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    sampler_logprobs: list[list[float] | None] = field(default_factory=list)  # receiver's engine, self rows
    source_logp_mean: list[float] = field(default_factory=list)  # mean generation log-prob on source tokens
    texts: list[str] = field(default_factory=list)
    old_logprobs: list[list[float]] | None = None  # filled by the trainer's scoring pass
    token_adv: list[list[float]] | None = None  # optional per-token advantages (OPD)
    extra: dict = field(default_factory=dict)  # method-specific per-row columns

    COLUMNS = ("prompt_ids", "response_ids", "advantages", "weights", "source", "group", "rewards",
               "sampler_logprobs", "source_logp_mean", "texts")

    def __len__(self) -> int:
        return len(self.response_ids)

    def append(self, **row) -> None:
        for c in self.COLUMNS:
            getattr(self, c).append(row.pop(c, None) if c != "source_logp_mean" else row.pop(c, math.nan))
        for k, v in row.items():
            self.extra.setdefault(k, [None] * (len(self) - 1)).append(v)
        for col in self.extra.values():
            if len(col) < len(self):
                col.append(None)

    def select(self, idx: list[int]) -> "TrainBatch":
        out = TrainBatch()
        for c in self.COLUMNS:
            col = getattr(self, c)
            setattr(out, c, [col[i] for i in idx])
        for c in ("old_logprobs", "token_adv"):
            col = getattr(self, c)
            setattr(out, c, None if col is None else [col[i] for i in idx])
        out.extra = {k: [v[i] for i in idx] for k, v in self.extra.items()}
        return out

    def extend(self, other: "TrainBatch") -> None:
        for c in self.COLUMNS:
            getattr(self, c).extend(getattr(other, c))
        n_before = len(self) - len(other)
        for k in set(self.extra) | set(other.extra):
            self.extra.setdefault(k, [None] * n_before).extend(other.extra.get(k, [None] * len(other)))

    @property
    def is_peer(self) -> list[bool]:
        return [s != "self" for s in self.source]


def self_batch(step: PolicyStep) -> TrainBatch:
    """The plain GRPO batch: every response of the policy's own groups."""
    b = TrainBatch()
    ro, n = step.rollouts, step.n
    for i in range(len(step.problems)):
        for j in range(n):
            r = i * n + j
            b.append(prompt_ids=step.prompt_ids[i], response_ids=ro.response_ids[r],
                     advantages=float(step.advantages[i, j]), weights=1.0, source="self", group=i,
                     rewards=float(step.rewards[i, j]), sampler_logprobs=ro.logprobs[r], texts=ro.texts[r])
    return b


def minibatch_schedule(batch: TrainBatch, num_minibatches: int, ordering: str,
                       rng: np.random.Generator | None = None) -> list[list[int]]:
    """Split a TrainBatch into ``num_minibatches`` minibatches of whole prompt groups (graft.md §2.5,
    §8 item 4). Groups holding any non-self row ("peer groups") are placed after the policy's own
    groups (``last``, GRAFT's peer-last) or before them (``first``); the ordered groups are chunked
    into equal counts of prompts, so a boundary minibatch may mix own and peer groups. ``uniform``
    packs like ``last`` and then shuffles the minibatch order with ``rng`` (reshuffled every step).
    Within a class, groups keep their prompt-batch order."""
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(batch.group):
        groups.setdefault(g, []).append(i)
    peer_groups = {batch.group[i] for i, s in enumerate(batch.source) if s != "self"}
    own = [g for g in sorted(groups) if g not in peer_groups]  # prompt-batch order, whatever the row order
    peer = [g for g in sorted(groups) if g in peer_groups]
    ordered = peer + own if ordering == "first" else own + peer
    chunks = [c.tolist() for c in np.array_split(np.array(ordered, dtype=np.int64), num_minibatches)]
    mbs = [[i for g in chunk for i in groups[g]] for chunk in chunks]
    if ordering == "uniform":
        if rng is None:
            raise ValueError("uniform ordering needs an rng")
        perm = rng.permutation(len(mbs))
        mbs = [mbs[p] for p in perm]
    elif ordering not in ("last", "first"):
        raise ValueError(f"unknown ordering {ordering!r}")
    return [m for m in mbs if m]


def micro_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Greedy split of row indices (kept in order) so that each micro-batch's padded size
    (rows x longest row) stays within ``token_budget`` (at least one row per micro-batch)."""
    out, cur, longest = [], [], 0
    for i, n in enumerate(lengths):
        new_longest = max(longest, n)
        if cur and new_longest * (len(cur) + 1) > token_budget:
            out.append(cur)
            cur, new_longest = [], n
        cur.append(i)
        longest = new_longest
    if cur:
        out.append(cur)
    return out
