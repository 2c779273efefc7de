"""The trainer's minibatch schedule and micro-batching over a :class:`graft_cli.batch.TrainBatch`."""

from __future__ import annotations

import numpy as np

from graft_cli.batch import TrainBatch, micro_batches  # noqa: F401  (micro_batches: re-exported)


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
