"""The staleness study's report: k = 1 against k = 0, paired by seed (graft_cli/report/staleness_claims.py)."""

from __future__ import annotations

import json
import os

import pytest

from graft_cli.report import staleness_claims as S


def test_judge_pairs_seeds_by_hand():
    # pass@1 of a: k1 − k0 per seed = [1, 2, 0]: mean 1, sd 1, se 1/sqrt(3); t(0.975, 2) = 4.302653 → h = 2.484138
    # admitted of a: [10, 11, 12]: mean 11, the same h → [8.515862, 13.484138], which excludes 0
    measured = {"policies": ["a"], "problems": {}, "steps": {
        "admitted": {"graft_k1": {"a": {"0": 50.0, "1": 52.0, "2": 54.0}},
                     "graft": {"a": {"0": 40.0, "1": 41.0, "2": 42.0}}},
        "peer_clip": {"graft_k1": {"a": {"0": 0.5}}, "graft": {"a": {"0": 0.4}}}},
        "scores": {"graft_k1": {"a": {"0": 30.0, "1": 32.0, "2": 31.0}},
                   "graft": {"a": {"0": 29.0, "1": 30.0, "2": 31.0}}}}
    by = {c["key"]: c for c in S.judge(measured)}
    assert by["pass1/a"]["interval"] == pytest.approx((1.0, 1.0 - 2.484138, 1.0 + 2.484138), abs=1e-5)
    assert by["pass1/a"]["reading"] == "no difference resolved"
    assert by["admitted/a"]["interval"] == pytest.approx((11.0, 8.515862, 13.484138), abs=1e-5)
    assert by["admitted/a"]["reading"] == "differs" and by["admitted/a"]["method"] == "paired t over 3 seeds"
    # one seed a side: no interval
    assert by["peer_clip/a"]["interval"] is None and by["peer_clip/a"]["reading"] == "not measured"
    assert S.reading((-3.0, -4.0, -2.0)) == "differs"


def _run(tmp_path, name, seed, rows):
    d = tmp_path / f"tiny-{name}-s{seed}"
    d.mkdir()
    with open(d / "metrics.jsonl", "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(d)


def test_measure_reads_the_runs_step_means(tmp_path):
    # k0 seed 0: admitted 0.5 and 0.7 over two steps (mean 60%), peer clip 0.01 once (a validation line without
    # time/step is not a training step); k1 seed 0: admitted 0.4 / 0.6 (50%), staleness 0 then 1 (0.5), IS clipped
    # 0.1 / 0.3 (0.2)
    k0 = _run(tmp_path, "graft", 0, [
        {"step": 1, "policy": "a", "time/step": 1.0, "graft/frac_admitted": 0.5, "clip_ratio/peer": 0.01},
        {"step": 2, "policy": "a", "time/step": 1.0, "graft/frac_admitted": 0.7},
        {"step": 2, "policy": "a", "validation/score": 0.9, "graft/frac_admitted": 0.0}])
    k1 = _run(tmp_path, "graft_k1", 0, [
        {"step": 1, "policy": "a", "time/step": 1.0, "graft/frac_admitted": 0.4, "async/staleness": 0,
         "sampling/importance_sampling_ratio/clipped_fraction": 0.1},
        {"step": 2, "policy": "a", "time/step": 1.0, "graft/frac_admitted": 0.6, "async/staleness": 1,
         "sampling/importance_sampling_ratio/clipped_fraction": 0.3}])
    records = [{"name": "graft", "seed": 0, "dir": k0, "scores": {"a": {"avg": 25.0}}},
               {"name": "graft_k1", "seed": 0, "dir": k1, "scores": {"a": {"avg": 26.5}}},
               {"name": "grpo", "seed": 0, "dir": k0, "scores": {"a": {"avg": 99.0}}}]
    m = S.measure(records)
    assert m["policies"] == ["a"]
    assert m["scores"] == {"graft": {"a": {"0": 25.0}}, "graft_k1": {"a": {"0": 26.5}}}
    assert m["steps"]["admitted"]["graft"]["a"]["0"] == pytest.approx(60.0)
    assert m["steps"]["admitted"]["graft_k1"]["a"]["0"] == pytest.approx(50.0)
    assert m["steps"]["peer_clip"]["graft"]["a"]["0"] == pytest.approx(1.0)
    assert m["staleness"]["a"]["staleness (versions)"] == pytest.approx(0.5)
    assert m["staleness"]["a"]["IS weight clipped share"] == pytest.approx(0.2)
    md, claims = S.write_claims(str(tmp_path / "report"), records)
    assert os.path.exists(tmp_path / "report" / "report.md")
    saved = json.load(open(tmp_path / "report" / "claims.json"))
    assert [c["key"] for c in saved["claims"]] == ["pass1/a", "admitted/a", "peer_clip/a"]
    assert all(c["verdict"] == "not measured" for c in saved["claims"])  # one seed a side
    assert "| gate's admitted share % | a | 60.00 | 50.00 |" in md


def test_the_staleness_plan_pairs_four_seeds_at_k0_and_k1():
    from graft_cli.plan import spec as P

    plan = P.load_reproduce("tiny_staleness")
    seeds: dict = {}
    for r in plan.runs:
        seeds.setdefault(r.name, []).append(r.seed)
        assert r.method == "graft"
    assert seeds == {"graft": [0, 1, 2, 3], "graft_k1": [0, 1, 2, 3]}
    assert plan.claims["kind"] == "staleness"
    k1 = [r for r in plan.runs if r.name == "graft_k1"][0]
    assert "run.staleness=1" in k1.overrides
