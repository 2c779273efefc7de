"""Minibatch orderings (registry ``MINIBATCH_ORDERINGS``, config key ``exchange.ordering``): how one
step's TrainBatch is cut into the optimizer's minibatches, in the order they are run.

An ordering is ``fn(batch, size, rng) -> list[list[int]]`` (row indices of each minibatch, empty
ones dropped); ``size`` is a :class:`MinibatchSize`: ``algo.minibatch_prompts`` and the rows a
prompt brings of one source (``rollout.n``). The minibatch index m the losses see
(``LossInputs.mb_index``; HACPO's stepwise bound L_m) is the position in the returned list.

- ``last`` (GRAFT's peer-last, graft.md §2.5, §8 item 4), ``first``, ``uniform``: whole prompt
  groups. Groups holding any non-self row ("peer groups") are placed after the policy's own groups
  (``last``) or before them (``first``); the ordered groups are chunked into ⌈G / minibatch_prompts⌉
  equal counts of prompts (``np.array_split``), so a boundary minibatch may mix own and peer groups.
  ``uniform`` packs like ``last`` and then shuffles the minibatch order with ``rng`` (reshuffled
  every step). Within a class, groups keep their prompt-batch order.
- ``self_first_rows`` (HACPO's released trainer, baselines.md §1.2:
  ``_target_trajectories_self_first``, then verl's minibatches of ``ppo_mini_batch_size × n`` rows
  in order, ``shuffle: false``): the policy's own rows of every prompt first, then the other rows
  (prompt-batch order within each part), cut into chunks of ``minibatch_prompts × n`` rows. With 128
  prompts × 8 self + 8 peer rows and 64-prompt minibatches: 4 minibatches of 512 rows, m = 0, 1 self
  rows only, m = 2, 3 peer rows only.

Layouts (``exchange.layout``, ``exchange.layout_ranks`` = W; ``self_first_rows`` only):
``whole_batch`` cuts the ordered rows of one process as above; ``rank_chunks`` reproduces verl's
data-parallel split of the same ordered rows across W ranks (HACPO's released
``run_hacpo_math_8gpu.sh``, W = 8): the rows are dispatched to the ranks in W contiguous equal
chunks (``chunk_tensordict``), each rank cuts its chunk into minibatches of ``minibatch_prompts × n
/ W`` rows in order (``train_mini_batch``: ``mini_batch_size // dp_size``, ``shuffle: false``), and
optimizer step m all-reduces the m-th minibatch of every rank, so minibatch m here is the union of
those W row blocks. With 128 prompts × 8 + 8 rows, 64-prompt minibatches and W = 8: ranks 0-3 hold
only self rows, ranks 4-7 only peer rows, and each of the 4 steps mixes 256 self and 256 peer rows
(peer L_m = 0.8, 0.825, 0.85, 0.875). """

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from graft_cli.batch import TrainBatch
from graft_cli.registry import Registry

MINIBATCH_ORDERINGS: Registry = Registry("minibatch ordering")


@dataclass(frozen=True)
class MinibatchSize:
    prompts: int  # algo.minibatch_prompts
    rows_per_prompt: int = 1  # a prompt's rows of one source (rollout.n)
    ranks: int = 1  # exchange.layout_ranks under layout rank_chunks (1: the whole batch in one process)


LAYOUTS = ("whole_batch", "rank_chunks")  # exchange.layout (module docstring)


def rank_chunk_minibatches(order: list[int], per: int, ranks: int) -> list[list[int]]:
    """verl's data-parallel split (module docstring, ``rank_chunks``): ``order`` in ``ranks``
    contiguous equal chunks, each cut into minibatches of ``per / ranks`` rows; minibatch m = the
    m-th block of every rank, rank order. ``per`` and ``len(order)`` must be multiples of ``ranks``
    and the chunk a multiple of ``per / ranks`` (verl asserts the same)."""
    if per % ranks or len(order) % ranks or (len(order) // ranks) % (per // ranks):
        raise ValueError(f"rank_chunks: {len(order)} rows and minibatches of {per} rows do not split evenly "
                         f"over {ranks} ranks")
    chunk, local = len(order) // ranks, per // ranks
    shards = [order[r * chunk:(r + 1) * chunk] for r in range(ranks)]
    return [[i for sh in shards for i in sh[m * local:(m + 1) * local]] for m in range(chunk // local)]


def _groups(batch: TrainBatch) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(batch.group):
        groups.setdefault(g, []).append(i)
    return groups


def group_schedule(batch: TrainBatch, num_minibatches: int, ordering: str,
                   rng: np.random.Generator | None = None) -> list[list[int]]:
    """Whole prompt groups into ``num_minibatches`` minibatches, ordered ``last`` | ``first`` |
    ``uniform`` (module docstring)."""
    if ordering not in ("last", "first", "uniform"):
        raise ValueError(f"unknown ordering {ordering!r}")
    groups = _groups(batch)
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
    return [m for m in mbs if m]


def _group_ordering(name: str):
    def fn(batch: TrainBatch, size: MinibatchSize, rng: np.random.Generator | None = None) -> list[list[int]]:
        return group_schedule(batch, max(1, math.ceil(len(set(batch.group)) / size.prompts)), name, rng)

    fn.__doc__ = f"``{name}``: whole prompt groups, ⌈G / minibatch_prompts⌉ minibatches (module docstring)."
    return MINIBATCH_ORDERINGS.register(name)(fn)


for _name in ("last", "first", "uniform"):
    _group_ordering(_name)


@MINIBATCH_ORDERINGS.register("self_first_rows")
def self_first_rows(batch: TrainBatch, size: MinibatchSize, rng: np.random.Generator | None = None) -> list[list[int]]:
    """HACPO's schedule (module docstring): own rows of every prompt, then the other rows, each part
    in prompt-batch order (rows of one prompt in batch order), in chunks of ``prompts ×
    rows_per_prompt`` rows; ``size.ranks`` > 1: those rows split over the ranks first
    (:func:`rank_chunk_minibatches`)."""
    per = max(1, size.prompts * size.rows_per_prompt)
    groups = _groups(batch)
    order = [i for g in sorted(groups) for i in groups[g] if batch.source[i] == "self"]
    order += [i for g in sorted(groups) for i in groups[g] if batch.source[i] != "self"]
    if size.ranks > 1:
        return rank_chunk_minibatches(order, per, size.ranks)
    return [order[k:k + per] for k in range(0, len(order), per)]


def minibatch_plan(batch: TrainBatch, ordering: str, minibatch_prompts: int, rows_per_prompt: int = 1,
                   rng: np.random.Generator | None = None, ranks: int = 1) -> list[list[int]]:
    """The step's minibatches (row indices, in the order they run) under the registered
    ``ordering``; ``ranks``: the data-parallel ranks of layout ``rank_chunks`` (1:
    ``whole_batch``)."""
    size = MinibatchSize(int(minibatch_prompts), int(rows_per_prompt), max(1, int(ranks)))
    return MINIBATCH_ORDERINGS.get(ordering)(batch, size, rng)


def layout_ranks(layout: str, ranks: int) -> int:
    """The ranks an ordering splits over: ``exchange.layout_ranks`` under ``rank_chunks``, 1 under
    ``whole_batch``."""
    return int(ranks) if layout == "rank_chunks" else 1
