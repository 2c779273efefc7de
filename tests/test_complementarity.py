"""`graft complementarity` on hand-made rollout logs (values worked by hand below)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from graft_cli.algorithms.exchange.selection import filled_share, solved_share
from graft_cli.eval.complementarity import aggregate, from_runs, step_entry
from graft_cli.errors import GraftError
from graft_cli.rundir import write_parquet

GRAFT = [sys.executable, "-m", "graft_cli.cli"]
N = 4  # samples per prompt

# k per prompt (4 prompts, n = 4)
#  step 1: a = [0,0,2,4], b = [1,0,0,3]
#    a's all-fail prompts {0,1}: b has k>=1 on {0}  -> b solves a = 1/2
#    b's all-fail prompts {1,2}: a has k>=1 on {2}  -> a solves b = 1/2
#  step 2: a = [0,1,0,0], b = [2,0,0,1]
#    a's all-fail {0,2,3}: b solves {0,3}          -> 2/3
#    b's all-fail {1,2}:   a solves {1}            -> 1/2
#  means over steps: b solves a = (1/2 + 2/3)/2 = 7/12; a solves b = 1/2
#  pooled: b solves a = (1+2)/(2+3) = 3/5; a solves b = (1+1)/(2+2) = 1/2
K = {"a": {1: [0, 0, 2, 4], 2: [0, 1, 0, 0], 3: [1, 1, 1, 1]},
     "b": {1: [1, 0, 0, 3], 2: [2, 0, 0, 1]}}


def write_rollouts(run_dir, policy, ks_by_step, ids=None):
    for step, ks in ks_by_step.items():
        pids = ids(step) if ids else [f"q{step}-{i}" for i in range(len(ks))]
        rows = {"step": [], "prompt_index": [], "prompt_id": [], "sample_index": [], "response": [], "reward": []}
        for i, k in enumerate(ks):
            for j in range(N):
                rows["step"].append(step - 1)
                rows["prompt_index"].append(i)
                rows["prompt_id"].append(pids[i])
                rows["sample_index"].append(j)
                rows["response"].append("\\boxed{1}")
                rows["reward"].append(1.0 if j < k else 0.0)
        write_parquet(os.path.join(run_dir, "rollouts", policy, f"step_{step:06d}.parquet"), rows)


def make_run(path, policies, ks, ids=None):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.yaml"), "w") as f:
        f.write("method: grpo\npair: tiny\npolicies:\n" + "".join(f"- name: {p}\n  model: m{p}\n" for p in policies))
    for p in policies:
        write_rollouts(path, p, ks[p], ids)
    return str(path)


# The two definitions, worked by hand (groups of n = 4). Receiver k: [0, 0, 0, 0, 3]: four all-fail prompts.
# Peer k:                                                                 [4, 2, 0, 1, 0]
# solved (peer k >= 1) on prompts 0, 1, 3 -> 3 / 4; filled (1 <= peer k < 4) on prompts 1, 3 -> 2 / 4: prompt 0's
# all-correct peer group counts as solved but carries no advantage to graft.
SHARE_CASES = [
    # receiver k, peers' k, n, solved share, filled share
    ([0, 0, 0, 0, 3], [[4, 2, 0, 1, 0]], 4, (0.75, 4, 3), (0.5, 4, 2)),
    ([0, 0, 2, 4], [[1, 0, 0, 3]], 4, (0.5, 2, 1), (0.5, 2, 1)),
    ([0, 0, 0], [[4, 0, 0], [0, 0, 1]], 4, (2 / 3, 3, 2), (1 / 3, 3, 1)),  # two peers: any of them
    ([1, 2], [[0, 0]], 4, (math.nan, 0, 0), (math.nan, 0, 0)),  # no all-fail prompt
]


@pytest.mark.parametrize("k_recv,k_peers,n,solved,filled", SHARE_CASES)
def test_solved_and_filled_shares_by_hand(k_recv, k_peers, n, solved, filled):
    for got, want in ((solved_share(k_recv, k_peers), solved), (filled_share(k_recv, k_peers, n), filled)):
        assert got[1:] == want[1:]
        assert (math.isnan(got[0]) and math.isnan(want[0])) or got[0] == pytest.approx(want[0])


def test_step_entry_both_ways():
    e = step_entry(1, [0, 1, 0, 0], [2, 0, 0, 1], 4, 4)
    assert e["y_solves_x"] == pytest.approx(2 / 3) and e["x_solves_y"] == pytest.approx(0.5)
    assert (e["x_all_fail"], e["y_all_fail"]) == (3, 2)
    agg = aggregate([e, step_entry(2, [1], [0], 4, 4)])  # second step: x has no all-fail prompt
    assert agg["mean"]["y_solves_x"] == pytest.approx(2 / 3) and agg["mean"]["y_solves_x_steps"] == 1
    assert agg["mean"]["x_solves_y"] == pytest.approx((0.5 + 1.0) / 2)


def test_one_run_two_policies(tmp_path):
    run = make_run(tmp_path / "grpo", ["a", "b"], K)
    res = from_runs([run])
    assert (res["x"]["label"], res["y"]["label"]) == ("a", "b")
    assert [s["step"] for s in res["steps"]] == [1, 2]  # step 3 is logged for a only
    assert [s["y_solves_x"] for s in res["steps"]] == pytest.approx([1 / 2, 2 / 3])
    assert [s["x_solves_y"] for s in res["steps"]] == pytest.approx([1 / 2, 1 / 2])
    assert res["mean"]["y_solves_x"] == pytest.approx(7 / 12)
    assert res["mean"]["x_solves_y"] == pytest.approx(1 / 2)
    assert res["pooled"]["y_solves_x"] == pytest.approx(3 / 5)
    assert res["pooled"]["x_solves_y"] == pytest.approx(1 / 2)


def test_two_runs_and_cli_outputs(tmp_path):
    ra = make_run(tmp_path / "ra", ["a"], {"a": K["a"]})
    rb = make_run(tmp_path / "rb", ["b"], {"b": K["b"]})
    out = tmp_path / "out"
    r = subprocess.run(GRAFT + ["complementarity", "--runs", ra, rb, "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert str(out) in r.stdout + r.stderr
    res = json.loads((out / "complementarity.json").read_text())
    assert res["mean"]["y_solves_x"] == pytest.approx(7 / 12) and res["mean"]["x_solves_y"] == pytest.approx(0.5)
    png = (out / "complementarity.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000


def test_prompt_mismatch_is_one_line(tmp_path):
    ra = make_run(tmp_path / "ra", ["a", "b"], K)
    rb = make_run(tmp_path / "rb", ["a", "b"], K, ids=lambda s: [f"other{s}-{i}" if s == 2 else f"q{s}-{i}"
                                                                for i in range(4)])
    with pytest.raises(GraftError, match="step 2: prompt ids differ"):
        from_runs([f"{ra}:a", f"{rb}:b"])
    r = subprocess.run(GRAFT + ["complementarity", "--runs", f"{ra}:a", f"{rb}:b", "--out", str(tmp_path / "o")],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2
    lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and "prompt ids differ" in lines[0]
    # a two-policy run given alongside another run must name its policy
    with pytest.raises(GraftError, match="name one"):
        from_runs([ra, rb])


def test_the_claims_module_name_is_the_evaluation_module_function():
    """graft_cli.report.claims imports from_runs from graft_cli.analysis.complementarity: that is this module's."""
    from graft_cli.analysis import complementarity as alias
    from graft_cli.report import claims

    assert alias.from_runs is from_runs and claims.from_runs is from_runs
