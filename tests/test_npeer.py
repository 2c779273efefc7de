"""The N-peer exchange rules (graft_cli/algorithms/exchange/selection.py, ``exchange.params.n_peer``) on tables
worked by hand: who gives which prompt to whom among three policies, and equality with the pair algorithm for
two."""

from __future__ import annotations

import pytest

from graft_cli.algorithms.exchange import selection as S
from graft_cli.algorithms.exchange.graft import options
from graft_cli.errors import GraftError

N8 = [8, 8, 8]

# Success counts (n = 8) of policies 0, 1, 2 on six prompts.
#   q0: 0 fails; 1 (k=3) and 2 (k=5) can give       -> contested for receiver 0
#   q1: 0 fails; 1 (k=2) and 2 (k=2) can give       -> contested, tie
#   q2: 0 and 1 fail; only 2 (k=4) can give (to both)
#   q3: 1 and 2 fail; 0 (k=6) can give to both
#   q4: 2 fails; 0 (k=1) and 1 (k=7) can give
#   q5: 1 fails; 0 (k=8, all-pass: not a source) and 2 (k=3) can give
KS = [[0, 0, 0, 6, 1, 8],
      [3, 2, 0, 0, 7, 0],
      [5, 2, 4, 0, 0, 3]]


def test_pairwise_candidates_and_balance_by_hand():
    p = S.plan_exchange(KS, N8, n_peer="best_source")
    assert p.candidates[(1, 0)] == [0, 1] and p.candidates[(2, 0)] == [0, 1, 2]
    assert p.candidates[(0, 1)] == [3] and p.candidates[(2, 1)] == [2, 5]  # q5: 0 is all-pass, not a source
    assert p.candidates[(0, 2)] == [3, 4] and p.candidates[(1, 2)] == [4]
    # pair (1, 0): m = min(|C_10| = 2, |C_01| = 1) = 1 -> the best k_1 among {q0: 3, q1: 2} = q0
    # pair (2, 0): m = min(3, |C_02| = 2) = 2 -> k_2 = {q0: 5, q1: 2, q2: 4}: q0, q2
    assert p.selected[(1, 0)] == [0] and p.selected[(2, 0)] == [0, 2]
    assert p.m[(1, 0)] == 1 and p.m[(2, 0)] == 2
    # pair (1, 2): m = min(|C_12| = 1, |C_21| = 2) = 1 -> q4 to 2 from 1; to 1 from 2 the best k_2: q2 (4 > 3)
    assert p.selected[(1, 2)] == [4] and p.selected[(2, 1)] == [2]
    assert p.selected[(0, 2)] == [3, 4] and p.m[(0, 2)] == 2  # pair (0, 2): m = min(|C_02| = 2, |C_20| = 3)


def test_best_source_table():
    p = S.plan_exchange(KS, N8, n_peer="best_source")
    assert p.assign[0] == {0: 2, 2: 2}  # q0 offered by 1 (k=3) and 2 (k=5): 2 wins
    assert p.assign[1] == {2: 2, 3: 0}
    assert p.assign[2] == {3: 0, 4: 1}  # q4 offered by 0 (k=1) and 1 (k=7): 1 wins


def test_round_robin_deals_contested_prompts_in_turn():
    # a receiver offered three contested prompts by two sources: cursor over the other policies (1, 2)
    offers = {0: [1, 2], 1: [1, 2], 2: [1, 2], 5: [2]}
    assert S.assign_round_robin(offers, [[0] * 6] * 3, 0) == {0: 1, 1: 2, 2: 1, 5: 2}
    # the source with the turn is skipped when it does not offer the prompt; the cursor moves past the taker
    offers = {0: [1, 2], 1: [2, 3], 2: [1, 3], 3: [1, 2, 3]}
    assert S.assign_round_robin(offers, [[0] * 4] * 4, 0) == {0: 1, 1: 2, 2: 3, 3: 1}
    p = S.plan_exchange(KS, N8, n_peer="round_robin")
    assert p.assign[0] == {0: 1, 2: 2}  # q0 contested: 1's turn first (best_source gave it to 2)


def test_pooled_donor_balances_intake_against_outflow():
    p = S.plan_exchange(KS, N8, n_peer="pooled_donor")
    # receiver 0: intake {q0, q1, q2}; outflow {q3 (1, 2 fail), q4 (2 fails)} -> m = 2;
    # best source per prompt: q0 -> 2 (k 5), q1 -> 1 (tie 2 vs 2: lower index), q2 -> 2 (k 4)
    # SelectWithTies by the best k: q0 (5), q2 (4)
    assert p.assign[0] == {0: 2, 2: 2} and p.m[(1, 0)] == p.m[(2, 0)] == 2
    # receiver 1: intake {q2 (2), q3 (0), q5 (2)}; outflow {q0, q1 (0 fails), q4 (2 fails)}: m = 3, all of them
    # (pairwise balancing gave it only q2 and q3)
    assert p.assign[1] == {2: 2, 3: 0, 5: 2}
    # receiver 2: intake {q3 (0, k 6), q4 (0 k 1, 1 k 7 -> 1)}; outflow {q0, q1, q2 (0 fails), q5 (1 fails)} -> both
    assert p.assign[2] == {3: 0, 4: 1}
    assert p.selected[(0, 2)] == [3] and p.selected[(1, 2)] == [4]


@pytest.mark.parametrize("rule", ["best_source", "round_robin", "pooled_donor"])
def test_every_rule_is_the_pair_algorithm_for_two_policies(rule):
    ka, kb = [0, 0, 3, 5, 0, 8, 2], [4, 2, 0, 0, 1, 0, 0]
    pair = S.balanced_pair(ka, kb, 8)
    p = S.plan_exchange([ka, kb], [8, 8], n_peer=rule)
    assert sorted(p.assign[1]) == pair["sel_ab"] and sorted(p.assign[0]) == pair["sel_ba"]
    assert set(p.assign[1].values()) <= {0} and set(p.assign[0].values()) <= {1}


def test_pooled_donor_needs_balanced_selection():
    with pytest.raises(GraftError, match="n_peer.*pooled_donor.*selection balanced"):
        options({"n_peer": "pooled_donor", "selection": "unbalanced"})
    with pytest.raises(GraftError, match="must be one of best_source, pooled_donor, round_robin"):
        options({"n_peer": "democracy"})
    assert options({"n_peer": "round_robin"}).n_peer == "round_robin"


def test_transfer_matrix_from_metrics_rows():
    from graft_cli.report.plots import transfer_matrix

    rows = [{"step": 1, "policy": "b", "graft/admitted/a": 4, "graft/admitted/c": 0},
            {"step": 2, "policy": "b", "graft/admitted/a": 2, "graft/admitted/c": 6},
            {"step": 1, "policy": "c", "graft/admitted/a": 1, "graft/admitted/b": 3},
            {"step": 1, "policy": "a"}]  # a received nothing logged
    M = transfer_matrix(rows, ["a", "b", "c"])
    assert M.tolist() == [[0.0, 3.0, 1.0],   # a -> b: (4 + 2) / 2, a -> c: 1
                          [0.0, 0.0, 3.0],   # b -> c
                          [0.0, 3.0, 0.0]]   # c -> b: (0 + 6) / 2


@pytest.fixture(scope="module")
def three_models(tiny_models, tmp_path_factory):
    from conftest import make_random_model

    return {**tiny_models, "c": make_random_model(str(tmp_path_factory.mktemp("m3") / "c"), "llama", 2, sft_steps=60)}


@pytest.mark.parametrize("rule", ["best_source", "round_robin", "pooled_donor"])
def test_three_policy_graft_run_and_exact_resume(three_models, problems_file, tmp_path, rule):
    """A whole N = 3 GRAFT run under each rule: per-source admitted counts on every receiver's rows, and a run
    stopped after 2 steps and resumed to 3 equals the uninterrupted 3-step run."""
    from conftest import metric_rows, train_overrides

    from graft_cli.config import compose
    from graft_cli.train.run import train

    def run(name, steps):
        cfg = compose(["method=graft", *train_overrides(three_models, problems_file, str(tmp_path), [
            f"run.name={name}", f"run.steps={steps}", f"exchange.params.n_peer={rule}", "run.threads=1"])])
        return train(cfg, progress=False)

    full = run("full", 3)
    run("resumed", 2)
    resumed = run("resumed", 3)
    assert metric_rows(full) == metric_rows(resumed)
    rows = [r for r in metric_rows(full) if "graft/transferred" in r]
    assert {r["policy"] for r in rows} == {"a", "b", "c"}
    for r in rows:
        others = {"a", "b", "c"} - {r["policy"]}
        assert {f"graft/admitted/{o}" for o in others} <= set(r)
        assert sum(r[f"graft/admitted/{o}"] for o in others) == r["graft/admitted"]
