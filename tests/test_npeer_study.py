"""The three-model miniature: who fills whose all-fail prompts (tiny_check.peer_fills) on a table worked by
hand, and the N-peer claims (report/npeer_claims.py) against values computed independently from the arrays."""

from __future__ import annotations

import numpy as np
import pytest

from graft_cli.tiny import check as tiny_check
from graft_cli.report import npeer_claims as NC
from graft_cli.report.stats import hierarchical_bootstrap


def test_peer_fills_by_hand():
    # success counts in groups of n = 4 on five prompts
    ks = {"a": [0, 0, 0, 2, 0], "b": [2, 0, 4, 0, 1], "c": [0, 1, 0, 0, 3]}
    f = tiny_check.peer_fills(ks, 4)
    # a fails q0, q1, q2, q4. b mixed on q0, q4 (q2: all-pass is not mixed); c mixed on q1, q4
    assert f["a"]["all_fail"] == pytest.approx(4 / 5)
    assert f["a"]["any"] == pytest.approx(3 / 4)
    assert f["a"]["mixed"] == pytest.approx({"b": 2 / 4, "c": 2 / 4})
    assert f["a"]["only"] == pytest.approx({"b": 1 / 4, "c": 1 / 4})  # q0 only b, q1 only c, q4 both
    # b fails q1, q3: c mixed on q1 only, a on q3 only
    assert f["b"]["any"] == 1.0 and f["b"]["only"] == pytest.approx({"a": 0.5, "c": 0.5})
    # c fails q0, q2, q3: b mixed on q0, a on q3, nobody on q2
    assert f["c"]["any"] == pytest.approx(2 / 3) and f["c"]["only"] == pytest.approx({"a": 1 / 3, "b": 1 / 3})
    # restricted to prompts q0, q1: a fails both, b fills q0, c fills q1
    g = tiny_check.peer_fills(ks, 4, [0, 1])
    assert g["a"]["n_prompts"] == 2 and g["a"]["only"] == pytest.approx({"b": 0.5, "c": 0.5})
    assert g["c"]["all_fail"] == 0.5 and g["c"]["only"] == pytest.approx({"a": 0.0, "b": 1.0})


def test_three_model_targets():
    props = {"peer_fills": {"a": {"only": {"b": 0.2, "c": 0.04}}, "b": {"only": {"a": 0.3, "c": 0.05}}}}
    met = tiny_check.targets_met(props)
    assert met == {"a_only_b_fills": True, "a_only_c_fills": False, "b_only_a_fills": True,
                   "b_only_c_fills": True}


def _arm(rng, p, seeds=(0, 1, 2, 3), n=200):
    """seed -> {bench: per-problem pass@1} with success probability p (two benchmarks)."""
    return {s: {"math500": (rng.random(n) < p).astype(float), "amc23": (rng.random(n // 2) < p).astype(float)}
            for s in seeds}


def _measured():
    rng = np.random.default_rng(0)
    arms = {"a": {"grpo": 0.30, "graft_ab": 0.40, "graft_ac": 0.32, "graft3": 0.60, "graft3_rr": 0.41,
                  "graft3_pd": 0.40},
            "b": {"grpo": 0.30, "graft_ab": 0.35, "graft_bc": 0.36, "graft3": 0.36, "graft3_rr": 0.36,
                  "graft3_pd": 0.36},
            "c": {"grpo": 0.30, "graft_ac": 0.30, "graft_bc": 0.31, "graft3": 0.50, "graft3_rr": 0.31,
                  "graft3_pd": 0.30}}
    probs = {m: {n: _arm(rng, p) for n, p in a.items()} for m, a in arms.items()}
    peers = {"grpo": ["a", "b", "c"], "graft_ab": ["a", "b"], "graft_ac": ["a", "c"], "graft_bc": ["b", "c"],
             "graft3": ["a", "b", "c"], "graft3_rr": ["a", "b", "c"], "graft3_pd": ["a", "b", "c"]}
    return {"problems": probs, "models": ["a", "b", "c"], "peers": peers}


def _mean(arm):
    return 100 * np.mean([np.mean([v[b].mean() for b in sorted(v)]) for v in arm.values()])


def test_best_single_peer_is_the_better_pairwise_run():
    m = _measured()
    for model in ("a", "b", "c"):
        pairs = [n for n in ("graft_ab", "graft_ac", "graft_bc") if n in m["problems"][model]]
        want = max(pairs, key=lambda n: _mean(m["problems"][model][n]))
        name, v = NC.best_single(m["problems"], model, pairs)
        assert name == want and v == pytest.approx(_mean(m["problems"][model][want]))


def test_two_peer_claim_against_an_independent_bootstrap():
    m = _measured()  # the by-hand interval below is the unfloored paired t (rule paired_t)
    claims = {c["key"]: c for c in NC.judge(m, {"n_boot": 500, "analysis": {"interval": "paired_t"}})}
    c = claims["two_peers_beat_best_single[best_source]"]
    # a: 0.60 vs its best pair 0.40 (held); b: 0.36 vs 0.36 (straddles 0, wider than ±1: underpowered);
    # c: 0.50 vs 0.31 (held)
    assert c["per_model"]["a"]["verdict"] == "held" and c["per_model"]["c"]["verdict"] == "held"
    assert c["per_model"]["b"]["verdict"].startswith("underpowered") and c["verdict"] == "mixed"  # wider than ±1
    # the interval is the paired t over the 4 seeds' macro pass@1 (points); the stats module's hierarchical
    # bootstrap over (seed, problem) stands beside it
    pa = m["problems"]["a"]
    best = c["per_model"]["a"]["best_single"]
    dd = [_mean({s: pa["graft3"][s]}) - _mean({s: pa[best][s]}) for s in range(4)]
    h = 3.182446 * np.std(dd, ddof=1) / 2  # t(0.975, 3) · S_d / √4
    assert c["per_model"]["a"]["interval"] == pytest.approx((np.mean(dd), np.mean(dd) - h, np.mean(dd) + h))
    assert c["per_model"]["a"]["method"] == "paired t over 4 seeds"
    x = {s: [v[b] for b in ("amc23", "math500")] for s, v in pa["graft3"].items()}
    y = {s: [v[b] for b in ("amc23", "math500")] for s, v in pa[best].items()}
    d, lo, hi = hierarchical_bootstrap(x, y, n_boot=500, seed=0)
    assert c["per_model"]["a"]["bootstrap"] == pytest.approx((100 * d, 100 * lo, 100 * hi))
    assert d == pytest.approx((_mean(pa["graft3"]) - _mean(pa[best])) / 100)


def test_best_rule_pooled_over_models():
    m = _measured()
    claims = {c["key"]: c for c in NC.judge(m, {"n_boot": 500})}
    br = claims["best_rule"]
    pool = NC.pooled(m["problems"], m["models"])
    means = {r: _mean(pool[n]) for r, n in NC.DEFAULTS["three_way"].items()}
    assert br["rule"] == max(means, key=means.get) == "best_source"
    assert br["means"] == pytest.approx(means)
    # graft3 is far ahead on a and c: best against both others
    assert br["verdict"] == "held" and set(br["versus"]) == {"round_robin", "pooled_donor"}
    assert br["per_model"]["a"]["best"] == "best_source"


def test_claims_not_measured_without_files():
    claims = NC.judge({"problems": {}, "models": ["a"], "peers": {}}, None)
    assert {c["verdict"] for c in claims} == {"not measured"}


def test_exchange_volume_from_metrics(tmp_path):
    import json

    rows = [{"step": 1, "policy": "a", "graft/admitted": 6, "graft/grafted_share": 0.10, "graft/admitted/b": 4,
             "graft/admitted/c": 2},
            {"step": 2, "policy": "a", "graft/admitted": 2, "graft/grafted_share": 0.04, "graft/admitted/b": 2,
             "graft/admitted/c": 0},
            {"step": 1, "policy": "b", "graft/admitted": 3, "graft/grafted_share": 0.05},
            {"step": 1, "policy": "c", "loss": 0.1}]  # no exchange metrics: c is left out
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    v = NC.exchange_volume(str(tmp_path))
    assert set(v) == {"a", "b"}
    assert v["a"]["admitted"] == 4.0 and v["a"]["share"] == pytest.approx(0.07)
    assert v["a"]["from"] == {"b": 3.0, "c": 1.0} and v["b"]["from"] == {}
    md = NC.exchange_markdown({"models": ["a", "b"], "peers": {}, "exchange": {"graft3": {0: v, 1: v}}})
    assert "4.0 (7.0%) = 3.0 from b + 1.0 from c" in md and "3.0 (5.0%)" in md
    assert NC.exchange_volume(str(tmp_path / "missing")) == {}


def test_first_seed_of_each_transfer_plot():
    pngs = ["transfer_tiny3-graft3-s1.png", "transfer_tiny3-graft3-s0.png", "transfer_tiny3-graft3_rr-s2.png",
            "transfer_tiny3-graft3_rr-s10.png", "other.png"]
    assert NC.first_seed(pngs) == ["transfer_tiny3-graft3-s0.png", "transfer_tiny3-graft3_rr-s2.png"]
