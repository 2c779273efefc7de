"""The miniature's mechanism measures: rescue events and rates, per-family held-out curves, admitted shares,
the per-prompt peer-row count the trainer logs, and the tiny pair's per-family complementarity."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest

from graft_cli.batch import TrainBatch
from graft_cli.eval import rescue as R
from graft_cli.tiny import check as tiny_check
from graft_cli.report import mechanism as M
from graft_cli.rundir import read_jsonl
from graft_cli.train.step_logs import peer_rows_per_prompt


def logs(rows):
    """rows: (step, prompt_id, rewards of the group, peer_rows)"""
    out = []
    for step, pid, rewards, peer in rows:
        for r in rewards:
            out.append({"step": step, "prompt_id": pid, "reward": r, "peer_rows": peer})
    return pd.DataFrame(out)


def test_rescue_events_table_of_cases():
    df = logs([
        (1, "p1", [0, 0], 0),   # all-fail, no graft
        (1, "p2", [0, 1], 0),   # mixed: no event
        (2, "p3", [0, 0], 2),   # all-fail, grafted group admitted
        (3, "p1", [0, 0], 1),   # p1 again, admitted now: its first step stays 1, admitted becomes true
        (3, "p4", [1, 1], 3),   # solved (peer rows do not make an event)
        (4, "p5", [0, 0], 0),
    ])
    ev = R.rescue_events(df)
    assert ev == [{"prompt_id": "p1", "step": 1, "admitted": True}, {"prompt_id": "p3", "step": 2, "admitted": True},
                  {"prompt_id": "p5", "step": 4, "admitted": False}]
    assert R.rescue_events(None) == [] and R.rescue_events(logs([])) == []


def test_capped_is_per_subset_and_order_free():
    ev = [{"prompt_id": f"q{i}", "step": i, "admitted": i % 2 == 0} for i in range(10)]
    c = R.capped(ev, 2, seed=3)
    assert sum(e["admitted"] for e in c) == 2 and sum(not e["admitted"] for e in c) == 2
    assert R.capped(list(reversed(ev)), 2, seed=3) == c  # the sample does not depend on the order
    assert [e["step"] for e in c] == sorted(e["step"] for e in c)
    assert R.capped(ev, 0) == ev


def test_rescue_summary_by_hand():
    ev = [{"prompt_id": "a", "step": 1, "admitted": True}, {"prompt_id": "b", "step": 1, "admitted": True},
          {"prompt_id": "c", "step": 2, "admitted": False}]
    correct = np.array([[0, 1, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]])
    s = R.rescue_summary(ev, correct)
    assert s["admitted"] == {"events": 2, "rescued": 1, "rate": 0.5, "pass1": pytest.approx(1 / 8)}
    assert s["not_admitted"] == {"events": 1, "rescued": 1, "rate": 1.0, "pass1": 0.5}
    assert s["all"]["rescued"] == 2 and s["all"]["rate"] == pytest.approx(2 / 3)
    empty = R.rescue_summary([], np.zeros((0, 4)))
    assert empty["admitted"] == {"events": 0, "rescued": 0, "rate": None, "pass1": None}


def test_peer_rows_per_prompt():
    b = TrainBatch()
    for g, src in ((0, "self"), (0, "self"), (1, "peer"), (1, "peer"), (1, "self"), (3, "peer")):
        b.append(prompt_ids=[1], response_ids=[2], advantages=0.0, weights=1.0, source=src, group=g)
    assert peer_rows_per_prompt(b, 4) == [0, 2, 0, 1]


def _eval_folder(run_dir, policy, step, bench_file, grades):
    d = os.path.join(run_dir, "eval", policy, f"step_{step:06d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump({"benchmarks": {"math500": {"source": bench_file, "num_problems": len(grades)}}}, f)
    with open(os.path.join(d, "math500_run1.jsonl"), "w") as f:
        for i, gs in enumerate(grades):
            for j, g in enumerate(gs):
                f.write(json.dumps({"problem_id": f"p{i}", "problem_index": i, "sample": j, "grade": g}) + "\n")
    return d


def test_family_curves_rescue_table_and_admitted(tmp_path):
    bench = tmp_path / "bench.jsonl"
    fams = ["add", "add", "frac", "lin"]
    bench.write_text("".join(json.dumps({"id": f"p{i}", "problem": "x", "answer": "1", "family": f}) + "\n"
                             for i, f in enumerate(fams)))
    recs = []
    for name, seed, step_grades in (("grpo", 0, {10: [[1, 0], [0, 0], [0, 0], [1, 1]]}),
                                    ("graft", 0, {10: [[1, 1], [1, 0], [1, 0], [0, 1]],
                                                  20: [[1, 1], [1, 1], [1, 1], [1, 1]]}),
                                    ("graft", 1, {20: [[0, 0], [0, 0], [0, 0], [0, 0]]})):
        d = str(tmp_path / f"{name}-s{seed}")
        for step, g in step_grades.items():
            _eval_folder(d, "a", step, str(bench), g)
        recs.append({"name": name, "seed": seed, "dir": d, "scores": {"a": {"step": max(step_grades)}}})
    cur = M.family_curves(recs, ("grpo", "graft"))
    assert cur["a"]["grpo"]["add"] == {10: [0.25]}  # (1 + 0 + 0 + 0) / 4
    assert cur["a"]["graft"]["add"] == {10: [0.75], 20: [1.0, 0.0]}
    assert cur["a"]["graft"]["frac"][10] == [0.5] and cur["a"]["grpo"]["lin"][10] == [1.0]
    pngs = M.plot_family_curves(cur, str(tmp_path / "rep"))
    assert os.path.getsize(pngs["a"]) > 1000
    # rescue.json of the scored steps, pooled over seeds
    for r, (adm, na) in zip(recs, (((0, 0), (5, 2)), ((4, 3), (2, 0)), ((6, 3), (0, 0)))):
        d = os.path.join(r["dir"], "eval", "a", f"step_{r['scores']['a']['step']:06d}", "rescue")
        os.makedirs(d)
        json.dump({"admitted": {"events": adm[0], "rescued": adm[1], "rate": adm[1] / adm[0] if adm[0] else None},
                   "not_admitted": {"events": na[0], "rescued": na[1], "rate": na[1] / na[0] if na[0] else None}},
                  open(os.path.join(d, "rescue.json"), "w"))
    rows = {r["run"]: r for r in M.rescue_table(recs, ("grpo", "graft"))}
    assert rows["graft"]["seeds"] == 2 and rows["graft"]["admitted"]["rate"] == pytest.approx(6 / 10)
    assert rows["graft"]["admitted"]["per_seed"] == [0.75, 0.5]
    assert rows["grpo"]["not_admitted"]["rate"] == pytest.approx(0.4) and rows["grpo"]["admitted"]["rate"] is None
    # admitted share from metrics.jsonl: mean over seeds per step
    for r, vals in zip(recs[1:], ([0.5, 0.7], [0.3, 0.1])):
        with open(os.path.join(r["dir"], "metrics.jsonl"), "w") as f:
            for step, v in enumerate(vals, 1):
                f.write(json.dumps({"step": step, "policy": "a", "graft/frac_admitted": v, "time/step": 1.0}) + "\n")
    assert M.admitted_curves(recs, "graft") == {"a": {1: pytest.approx(0.4), 2: pytest.approx(0.4)}}
    md = M.mechanism_markdown(recs, str(tmp_path / "rep"), "grpo", "graft")
    assert "family_a.png" in md and "60.0% (6/10)" in md and "40.0% (2/5)" in md and "admitted.png" in md


def test_family_complementarity_and_blind_spots_by_hand():
    fams = ["frac", "frac", "frac", "lin", "lin", "add"]
    k_a = [0, 0, 0, 8, 3, 2]   # a fails every frac prompt
    k_b = [3, 8, 0, 0, 0, 2]   # b mixed on 1 of a's 3 all-fail frac prompts; b fails both lin prompts
    f = tiny_check.family_complementarity(fams, k_a, k_b, 8)
    assert f["frac"] == {"n_prompts": 3, "all_fail_a": 1.0, "all_fail_b": pytest.approx(1 / 3),
                         "peer_mixed_a": pytest.approx(1 / 3), "peer_mixed_b": 0.0}
    assert f["lin"]["all_fail_b"] == 1.0 and f["lin"]["peer_mixed_b"] == 0.5  # a: k = 8 (all-pass), 3 (mixed)
    assert tiny_check.blind_spots(f) == {"a": [], "b": ["lin"]}  # frac: b mixed on 33% < 40%
    assert tiny_check.blind_spots(f, peer_mixed_min=0.3) == {"a": ["frac"], "b": ["lin"]}


def test_rescue_evaluation_end_to_end(tiny_models, problems_file, tmp_path):
    """`graft eval --run` with eval.rescue re-draws every all-fail prompt of the rollout logs (counted here from
    the parquet files directly) with the training sampling, n samples each, and writes rescue.json."""
    from conftest import train_overrides

    from graft_cli.config import compose
    from graft_cli.eval.runner import EvalOptions, evaluate_run
    from graft_cli.rundir import read_json
    from graft_cli.train.run import train

    cfg = compose(["method=graft", *train_overrides(tiny_models, problems_file, str(tmp_path), [
        "run.name=r", "run.steps=2", "eval.rescue=true", "run.threads=1"])])
    run = train(cfg, progress=False)
    evaluate_run(EvalOptions(run_dir=run, steps="last", runs=1, samples=2, benchmarks=f"toy={problems_file}",
                             progress=False))
    for pol in ("a", "b"):
        fail, admitted = set(), set()
        for step in (1, 2):
            df = pd.read_parquet(os.path.join(run, "rollouts", pol, f"step_{step:06d}.parquet"))
            for pid, g in df.groupby("prompt_id"):
                if g["reward"].max() <= 0:
                    fail.add(pid)
                    if g["peer_rows"].max() > 0:
                        admitted.add(pid)
        assert fail  # random tiny models all-fail most prompts: the re-draw has work to do
        js = read_json(os.path.join(run, "eval", pol, "step_000002", "rescue", "rescue.json"))
        assert {e["prompt_id"] for e in js["events"]} == fail
        assert js["admitted"]["events"] == len(admitted) and js["all"]["events"] == len(fail)
        assert 0 <= js["all"]["rescued"] <= len(fail) and js["settings"]["samples"] == 4  # rollout.n
        rows = read_jsonl(os.path.join(run, "eval", pol, "step_000002", "rescue", "rescue_run1.jsonl"))
        assert len(rows) == 4 * len(fail)
        solved = {r["problem_id"] for r in rows if r["grade"] > 0}
        assert js["all"]["rescued"] == len(solved)
