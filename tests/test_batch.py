"""Minibatch schedule (peer-last / peer-first / uniform), micro-batch splitting and the self batch
(graft.md §2.5, §8 item 4). Expected minibatches are worked out by hand in the tables."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graft_cli.data.problems import Problem
from graft_cli.batch import Rollouts
from graft_cli.batch import PolicyStep, TrainBatch, self_batch
from graft_cli.algorithms.minibatch import group_schedule as minibatch_schedule
from graft_cli.batch import micro_batches


def make_batch(num_groups: int, rows_per_group: int, peer: dict[int, list[int]] | None = None,
               order: list[int] | None = None) -> TrainBatch:
    """``peer[g]`` lists which of group g's rows are peer rows. Rows are appended group by group in
    ``order`` (default 0..G-1); each row's text is ``"g<group>r<row>"`` so tests can read it back."""
    peer = peer or {}
    b = TrainBatch()
    for g in (order if order is not None else range(num_groups)):
        for j in range(rows_per_group):
            b.append(prompt_ids=[g], response_ids=[g, j], advantages=0.0, weights=1.0,
                     source="peer" if j in peer.get(g, []) else "self", group=g, rewards=0.0,
                     rollout_logprobs=None, texts=f"g{g}r{j}")
    return b


def groups_of(batch: TrainBatch, mbs: list[list[int]]) -> list[list[int]]:
    """The group ids of each minibatch, in the order they appear, deduplicated."""
    out = []
    for mb in mbs:
        seen = []
        for i in mb:
            if batch.group[i] not in seen:
                seen.append(batch.group[i])
        out.append(seen)
    return out


# (num_groups, peer groups, num_minibatches, ordering, expected groups per minibatch)
#  8 groups, peers {2, 5}:  own = 0 1 3 4 6 7, peer = 2 5
#    last : 0 1 | 3 4 | 6 7 | 2 5          first: 2 5 | 0 1 | 3 4 | 6 7
#  8 groups, peers {1, 4, 6}: own = 0 2 3 5 7, peer = 1 4 6
#    last : 0 2 | 3 5 | 7 1 | 4 6   (the third minibatch mixes own group 7 with peer group 1)
#    first: 1 4 | 6 0 | 2 3 | 5 7   (the second mixes peer 6 with own 0)
#  no peers: prompt order;  all peers: prompt order
#  6 groups into 4 minibatches (np.array_split sizes 2 2 1 1), peer {0}: own 1..5 then 0 -> 1 2 | 3 4 | 5 | 0
#  3 groups into 4 minibatches: the empty chunk is dropped -> 3 minibatches of one group
SCHEDULE_TABLE = [
    (8, [2, 5], 4, "last", [[0, 1], [3, 4], [6, 7], [2, 5]]),
    (8, [2, 5], 4, "first", [[2, 5], [0, 1], [3, 4], [6, 7]]),
    (8, [1, 4, 6], 4, "last", [[0, 2], [3, 5], [7, 1], [4, 6]]),
    (8, [1, 4, 6], 4, "first", [[1, 4], [6, 0], [2, 3], [5, 7]]),
    (8, [], 4, "last", [[0, 1], [2, 3], [4, 5], [6, 7]]),
    (8, [], 4, "first", [[0, 1], [2, 3], [4, 5], [6, 7]]),
    (4, [0, 1, 2, 3], 2, "last", [[0, 1], [2, 3]]),
    (8, [1, 4, 6], 2, "last", [[0, 2, 3, 5], [7, 1, 4, 6]]),
    (8, [1, 4, 6], 1, "last", [[0, 2, 3, 5, 7, 1, 4, 6]]),
    (6, [0], 4, "last", [[1, 2], [3, 4], [5], [0]]),
    (3, [1], 4, "last", [[0], [2], [1]]),
]


@pytest.mark.parametrize("G,peers,k,ordering,want", SCHEDULE_TABLE)
def test_schedule_table(G, peers, k, ordering, want):
    # a group is a peer group if ANY of its rows is non-self: mark only row 1 of each peer group
    b = make_batch(G, 3, {g: [1] for g in peers})
    mbs = minibatch_schedule(b, k, ordering)
    assert groups_of(b, mbs) == want
    # whole groups: every row of a group is in the same minibatch, rows in batch order inside it
    for mb in mbs:
        for g in {b.group[i] for i in mb}:
            assert [i for i in mb if b.group[i] == g] == [3 * g, 3 * g + 1, 3 * g + 2]
    assert sorted(i for mb in mbs for i in mb) == list(range(len(b)))


def test_schedule_row_indices_when_rows_are_not_grouped_in_prompt_order():
    # rows appended in group order 3, 0, 2, 1 (2 rows each): rows 0-1 = g3, 2-3 = g0, 4-5 = g2, 6-7 = g1
    # group 0 has a peer row.  Within a class, groups keep their prompt-batch order (group id): own = 1 2 3,
    # peer = 0.  last with 2 minibatches (array_split of 4 -> 2, 2): [1, 2] | [3, 0]
    b = make_batch(4, 2, {0: [0]}, order=[3, 0, 2, 1])
    mbs = minibatch_schedule(b, 2, "last")
    assert mbs == [[6, 7, 4, 5], [0, 1, 2, 3]]
    assert [[b.texts[i] for i in mb] for mb in mbs] == [["g1r0", "g1r1", "g2r0", "g2r1"],
                                                       ["g3r0", "g3r1", "g0r0", "g0r1"]]


def test_boundary_minibatch_mixes_own_and_peer():
    b = make_batch(8, 2, {1: [0, 1], 4: [0], 6: [1]})
    mbs = minibatch_schedule(b, 4, "last")
    kinds = [sorted({"peer" if g in (1, 4, 6) else "own" for g in gs}) for gs in groups_of(b, mbs)]
    assert kinds == [["own"], ["own"], ["own", "peer"], ["peer"]]


def test_uniform_reshuffles_but_keeps_the_same_minibatches():
    b = make_batch(8, 2, {1: [0], 4: [0], 6: [0]})
    last = minibatch_schedule(b, 4, "last")
    orders = set()
    for seed in range(12):
        mbs = minibatch_schedule(b, 4, "uniform", np.random.default_rng(seed))
        # same set of minibatches as peer-last packing, only their order changes
        assert sorted(map(tuple, mbs)) == sorted(map(tuple, last))
        orders.add(tuple(map(tuple, mbs)))
        # the same rng seed gives the same order
        assert mbs == minibatch_schedule(b, 4, "uniform", np.random.default_rng(seed))
    assert len(orders) > 1  # different rngs give different orders (12 draws of 24 permutations)
    # the rng is advanced, so consecutive steps with one generator are reshuffled
    rng = np.random.default_rng(0)
    seq = [tuple(map(tuple, minibatch_schedule(b, 4, "uniform", rng))) for _ in range(8)]
    assert len(set(seq)) > 1


def test_schedule_errors():
    b = make_batch(4, 2)
    with pytest.raises(ValueError, match="rng"):
        minibatch_schedule(b, 2, "uniform")
    with pytest.raises(ValueError, match="sideways"):
        minibatch_schedule(b, 2, "sideways")


# --- registered orderings: the loop's minibatch_plan ---------------------------------------------------
def hacpo_batch(B: int, n: int, peer_n: int | None = None) -> TrainBatch:
    """B prompts, each group laid out as HACPO's joint group: n self rows then ``peer_n`` (default n) peer rows."""
    b = TrainBatch()
    for g in range(B):
        for j in range(n + (n if peer_n is None else peer_n)):
            b.append(prompt_ids=[g], response_ids=[g, j], advantages=0.0, weights=1.0,
                     source="self" if j < n else "peer", group=g, rewards=0.0, rollout_logprobs=None,
                     texts=f"g{g}{'s' if j < n else 'p'}{j if j < n else j - n}")
    return b


# self_first_rows (HACPO: self rows of all prompts, then peer rows, chunks of minibatch_prompts × n rows):
#  4 prompts × (2 self + 2 peer), minibatch 2 prompts → 4 rows a chunk, 16 rows → 4 minibatches:
#    m0 g0s0 g0s1 g1s0 g1s1 | m1 g2s0 g2s1 g3s0 g3s1 | m2 g0p0 g0p1 g1p0 g1p1 | m3 g2p0 g2p1 g3p0 g3p1
#  the same with 1-prompt minibatches (2 rows): 8 minibatches, m0..m3 self, m4..m7 peer
#  3 prompts × (2 + 2), minibatch 2 prompts (4 rows): 12 rows → 4 | 4 | 4, the second mixes g2's self rows
#    with g0's peer rows (the row count, not the prompt count, sets the cut, as verl's minibatches)
#  2 prompts × (2 self + 1 peer), minibatch 1 prompt (2 rows): g0s0 g0s1 | g1s0 g1s1 | g0p0 g1p0
SELF_FIRST_TABLE = [
    (4, 2, None, 2, [["g0s0", "g0s1", "g1s0", "g1s1"], ["g2s0", "g2s1", "g3s0", "g3s1"],
                     ["g0p0", "g0p1", "g1p0", "g1p1"], ["g2p0", "g2p1", "g3p0", "g3p1"]]),
    (4, 2, None, 1, [["g0s0", "g0s1"], ["g1s0", "g1s1"], ["g2s0", "g2s1"], ["g3s0", "g3s1"],
                     ["g0p0", "g0p1"], ["g1p0", "g1p1"], ["g2p0", "g2p1"], ["g3p0", "g3p1"]]),
    (3, 2, None, 2, [["g0s0", "g0s1", "g1s0", "g1s1"], ["g2s0", "g2s1", "g0p0", "g0p1"],
                     ["g1p0", "g1p1", "g2p0", "g2p1"]]),
    (2, 2, 1, 1, [["g0s0", "g0s1"], ["g1s0", "g1s1"], ["g0p0", "g1p0"]]),
]


@pytest.mark.parametrize("B,n,peer_n,prompts,want", SELF_FIRST_TABLE)
def test_self_first_rows_table(B, n, peer_n, prompts, want):
    from graft_cli.algorithms.minibatch import minibatch_plan

    b = hacpo_batch(B, n, peer_n)
    mbs = minibatch_plan(b, "self_first_rows", prompts, n)
    assert [[b.texts[i] for i in mb] for mb in mbs] == want
    assert sorted(i for mb in mbs for i in mb) == list(range(len(b)))


def test_hacpo_schedule_at_the_papers_size():
    # 128 prompts × (8 self + 8 peer), 64-prompt minibatches: 2048 rows in 4 chunks of 512, m = 0, 1 self rows
    # only and m = 2, 3 peer rows only (the group orderings would make 2 mixed minibatches of 1,024 rows)
    from graft_cli.algorithms.minibatch import minibatch_plan

    b = hacpo_batch(128, 8)
    mbs = minibatch_plan(b, "self_first_rows", 64, 8)
    assert [len(mb) for mb in mbs] == [512] * 4
    assert [sorted({b.source[i] for i in mb}) for mb in mbs] == [["self"], ["self"], ["peer"], ["peer"]]
    assert [sorted({b.group[i] for i in mb}) for mb in mbs] == [list(range(64)), list(range(64, 128))] * 2
    assert [len(mb) for mb in minibatch_plan(b, "last", 64, 8)] == [1024, 1024]


# layout rank_chunks (verl's data-parallel split of the self-first rows, HACPO's 8-GPU launcher), worked by hand:
#  4 prompts × (2 self + 2 peer), minibatch 2 prompts (4 rows), W = 2: rank 0 holds the 8 self rows, rank 1 the 8
#    peer rows, each cuts minibatches of 4 / 2 = 2 rows; step m = rank 0's m-th pair + rank 1's m-th pair
#  the same with W = 4: ranks hold g0s g1s | g2s g3s | g0p g1p | g2p g3p, minibatches of 1 row
RANK_CHUNKS_TABLE = [
    (2, [["g0s0", "g0s1", "g0p0", "g0p1"], ["g1s0", "g1s1", "g1p0", "g1p1"],
         ["g2s0", "g2s1", "g2p0", "g2p1"], ["g3s0", "g3s1", "g3p0", "g3p1"]]),
    (4, [["g0s0", "g2s0", "g0p0", "g2p0"], ["g0s1", "g2s1", "g0p1", "g2p1"],
         ["g1s0", "g3s0", "g1p0", "g3p0"], ["g1s1", "g3s1", "g1p1", "g3p1"]]),
    (1, SELF_FIRST_TABLE[0][4]),
]


@pytest.mark.parametrize("W,want", RANK_CHUNKS_TABLE)
def test_rank_chunks_table(W, want):
    from graft_cli.algorithms.minibatch import minibatch_plan

    b = hacpo_batch(4, 2)
    mbs = minibatch_plan(b, "self_first_rows", 2, 2, None, W)
    assert [[b.texts[i] for i in mb] for mb in mbs] == want


def test_rank_chunks_at_the_launchers_size():
    # run_hacpo_math_8gpu.sh: 128 prompts × (8 + 8), 64-prompt minibatches, 8 GPUs: rank r holds rows
    # [256r, 256r + 256) of the self-first order (ranks 0-3 self, 4-7 peer), 64-row minibatches, so every one of
    # the 4 updates holds 256 self and 256 peer rows; rank r's m-th block is prompts 32(r mod 4) + 8m .. + 7
    from graft_cli.algorithms.minibatch import minibatch_plan

    b = hacpo_batch(128, 8)
    mbs = minibatch_plan(b, "self_first_rows", 64, 8, None, 8)
    assert [len(mb) for mb in mbs] == [512] * 4
    for m, mb in enumerate(mbs):
        assert sum(b.source[i] == "self" for i in mb) == 256
        want = sorted(32 * r + 8 * m + k for r in range(4) for k in range(8))
        for src in ("self", "peer"):
            assert sorted({b.group[i] for i in mb if b.source[i] == src}) == want
    assert sorted(i for mb in mbs for i in mb) == list(range(len(b)))


def test_rank_chunks_refuses_an_uneven_split():
    from graft_cli.algorithms.minibatch import minibatch_plan
    from graft_cli.config import compose
    from graft_cli.errors import GraftError

    with pytest.raises(ValueError, match="do not split evenly over 3 ranks"):
        minibatch_plan(hacpo_batch(4, 2), "self_first_rows", 2, 2, None, 3)
    cfg = compose(["method=hacpo"])
    assert (cfg.exchange.layout, cfg.exchange.layout_ranks) == ("rank_chunks", 8)
    with pytest.raises(GraftError, match=r"'exchange.layout_ranks': must divide the minibatch's rows.* = 256"):
        compose(["method=hacpo", "exchange.layout_ranks=3"])
    with pytest.raises(GraftError, match=r"'exchange.layout': rank_chunks splits the rows of ordering "
                                         r"self_first_rows, not 'last'"):
        compose(["method=graft", "exchange.layout=rank_chunks"])
    with pytest.raises(GraftError, match=r"'exchange.layout': unknown layout 'diagonal'"):
        compose(["method=hacpo", "exchange.layout=diagonal"])


@pytest.mark.parametrize("G,peers,k,ordering,want", SCHEDULE_TABLE[:6])
def test_group_orderings_through_the_registry(G, peers, k, ordering, want):
    # the registered group orderings take algo.minibatch_prompts: ⌈G / prompts⌉ minibatches (8 / 2 → 4)
    from graft_cli.algorithms.minibatch import MINIBATCH_ORDERINGS
    from graft_cli.algorithms.minibatch import minibatch_plan

    b = make_batch(G, 3, {g: [1] for g in peers})
    assert groups_of(b, minibatch_plan(b, ordering, G // k, 3)) == want
    assert set(MINIBATCH_ORDERINGS.names()) >= {"last", "first", "uniform", "self_first_rows"}


def test_ordering_is_checked_at_compose():
    from graft_cli.config import compose
    from graft_cli.errors import GraftError

    with pytest.raises(GraftError, match=r"exchange.ordering.*unknown minibatch ordering 'sideways'.*self_first_rows"):
        compose(["method=graft", "exchange.ordering=sideways"])
    assert compose(["method=hacpo"]).exchange.ordering == "self_first_rows"


# --- micro_batches: greedy, in order, padded size rows x longest <= budget ----------------------------
# lengths (3, 5, 2, 8, 1), budget 10:
#   [0] longest 3; add 1 -> 5·2 = 10 <= 10 ok; add 2 -> 5·3 = 15 > 10 -> flush [0, 1]
#   [2] longest 2; add 3 -> 8·2 = 16 > 10 -> flush [2];  [3] longest 8; add 4 -> 8·2 = 16 -> flush [3]; [4]
# lengths (4, 4, 4, 4, 4), budget 12: 3 rows of 4 = 12 fit, the 4th makes 16 -> [0 1 2] [3 4]
# a single row longer than the budget still forms its own micro-batch
MICRO_TABLE = [
    ([3, 5, 2, 8, 1], 10, [[0, 1], [2], [3], [4]]),
    ([4, 4, 4, 4, 4], 12, [[0, 1, 2], [3, 4]]),
    ([20, 1, 1], 10, [[0], [1, 2]]),
    ([1, 1, 20], 10, [[0, 1], [2]]),
    ([3, 5, 2, 8, 1], 1000, [[0, 1, 2, 3, 4]]),
    ([7], 1, [[0]]),
    ([], 10, []),
]


@pytest.mark.parametrize("lengths,budget,want", MICRO_TABLE)
def test_micro_batches_table(lengths, budget, want):
    got = micro_batches(lengths, budget)
    assert got == want
    for mb in got:
        assert len(mb) == 1 or len(mb) * max(lengths[i] for i in mb) <= budget


def test_micro_batches_cover_every_row_once_in_order():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 60, size=40).tolist()
    for budget in (1, 50, 120, 500):
        got = micro_batches(lengths, budget)
        assert [i for mb in got for i in mb] == list(range(40))
        for mb in got:
            assert len(mb) == 1 or len(mb) * max(lengths[i] for i in mb) <= budget


# --- self_batch ------------------------------------------------------------------------------------------
def test_self_batch_rows_and_order():
    B, n = 2, 3
    probs = [Problem("p0", "1+1", "2"), Problem("p1", "2+2", "4")]
    resp = [[10 + r, 1] for r in range(B * n)]  # response r is (10 + r, EOS)
    lps = [[-0.1 * r, -0.5] for r in range(B * n)]
    ro = Rollouts(prompt_ids=[[5, 6], [7]], response_ids=resp, texts=[f"t{r}" for r in range(B * n)],
                  logprobs=lps, truncated=[False] * (B * n), n=n)
    rewards = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([[1.5, -0.5, -0.5], [0.25, 0.25, -0.75]])
    step = PolicyStep("a", probs, [[5, 6], [7]], ro, rewards, adv)
    b = self_batch(step)
    assert len(b) == 6
    # prompt-major: rows 0-2 are prompt 0's responses in sample order, rows 3-5 prompt 1's
    assert b.group == [0, 0, 0, 1, 1, 1]
    assert b.prompt_ids == [[5, 6]] * 3 + [[7]] * 3
    assert b.response_ids == resp
    assert b.texts == ["t0", "t1", "t2", "t3", "t4", "t5"]
    assert b.advantages == [1.5, -0.5, -0.5, 0.25, 0.25, -0.75]
    assert b.rewards == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    assert b.weights == [1.0] * 6
    assert b.source == ["self"] * 6 and b.is_peer == [False] * 6
    assert b.rollout_logprobs == lps
    assert b.old_logprobs is None and b.token_adv is None
    assert step.k.tolist() == [1, 2]
    # a self batch has no peer groups: the schedule is plain prompt order
    assert minibatch_schedule(b, 2, "last") == [[0, 1, 2], [3, 4, 5]]


def test_trainbatch_select_and_extend_keep_columns_aligned():
    b = make_batch(3, 2, {2: [1]})
    b.append(prompt_ids=[9], response_ids=[9, 9], advantages=1.0, weights=0.5, source="peer", group=2,
             rewards=1.0, rollout_logprobs=None, texts="extra", w_gate=0.7)
    assert b.extra["w_gate"] == [None] * 6 + [0.7]
    s = b.select([6, 0])
    assert s.texts == ["extra", "g0r0"] and s.weights == [0.5, 1.0] and s.extra["w_gate"] == [0.7, None]
    other = make_batch(1, 2)
    s.extend(other)
    assert len(s) == 4 and s.extra["w_gate"] == [0.7, None, None, None]
