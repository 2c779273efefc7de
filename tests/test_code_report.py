"""`graft report`'s code section (graft_cli/report/tables.py ``code_table``) on fake code runs and an eval folder:
code benchmarks get their own table (per benchmark and their average, each value worked by hand below) and stay
out of the math tables' columns and averages."""

from __future__ import annotations

import json
import os

import yaml

from graft_cli.report.tables import report_main

POL = [{"name": "student", "model": "Qwen/Qwen3-4B"},
       {"name": "teacher", "model": "Qwen/Qwen3-30B-A3B-Instruct-2507", "role": "frozen"}]


def _summary(code: dict, math: dict | None = None) -> dict:
    """code/math: name -> mean (fraction); std 0.01 each; 4 runs."""
    def b(m, kind=None):
        return {"mean": m, "std": 0.01, "num_runs": 4, "runs": [m] * 4, **({"kind": kind} if kind else {})}

    benches = {**{k: b(v) for k, v in (math or {}).items()}, **{k: b(v, "code") for k, v in code.items()}}
    cmean = sum(code.values()) / len(code)
    out = {"benchmarks": benches, "num_runs": 4}
    if math:
        m = sum(math.values()) / len(math)
        out["average"] = {"mean": m, "std": 0.002, "runs": [m] * 4, "five": False, "benchmarks": list(math)}
        out["code_average"] = {"mean": cmean, "std": 0.003, "runs": [cmean] * 4, "benchmarks": list(code)}
    else:
        out["average"] = {"mean": cmean, "std": 0.003, "runs": [cmean] * 4, "five": False, "benchmarks": list(code)}
    return out


def _run(root, name, method, summ, step=200):
    d = os.path.join(root, name)
    sd = os.path.join(d, "eval", "student", f"step_{step:06d}")
    os.makedirs(sd)
    with open(os.path.join(d, "config.yaml"), "w") as f:
        yaml.safe_dump({"method": method, "pair": "saf_qwen3_4b_code", "policies": POL, "run": {"seed": 0},
                        "exchange": {"name": "none"}}, f)
    open(os.path.join(d, "metrics.jsonl"), "w").close()
    with open(os.path.join(sd, "summary.json"), "w") as f:
        json.dump(summ, f)
    with open(os.path.join(d, "best.json"), "w") as f:
        json.dump({"policies": {"student": {"step": step}}}, f)


def test_code_table_beside_the_math_tables(tmp_path):
    root = str(tmp_path / "runs")
    # GRPO: HE+ 60, MBPP+ 50, LCB 20 -> code avg (60+50+20)/3 = 43.33; SAF: 63, 53, 21 -> 45.67
    _run(root, "grpo-code", "grpo", _summary({"humanevalplus": 0.60, "mbppplus": 0.50, "livecodebench": 0.20}))
    _run(root, "saf-code", "saf", _summary({"humanevalplus": 0.63, "mbppplus": 0.53, "livecodebench": 0.21}))
    ev = os.path.join(root, "eval-model")
    os.makedirs(ev)
    s = _summary({"humaneval": 0.80}, math={"aime24": 0.30, "aime25": 0.20})  # math avg 25, code avg 80
    with open(os.path.join(ev, "summary.json"), "w") as f:
        json.dump({**s, "model": "Qwen/Qwen3-4B"}, f)
    with open(os.path.join(ev, "meta.json"), "w") as f:  # what marks a `graft eval --model` folder
        json.dump({"settings": {}, "benchmarks": {}}, f)
    out = str(tmp_path / "report")
    report_main([root], out=out, plots=False)
    rep = json.load(open(os.path.join(out, "report.json")))
    keys = [t["key"] for t in rep["tables"]]
    assert "code" in keys and "table1" not in keys  # code-only runs make no math table
    t = next(t for t in rep["tables"] if t["key"] == "code")
    assert t["columns"] == ["Run", "Method", "Pair", "Policy", "Step", "HumanEval", "HumanEval+", "MBPP+",
                            "LiveCodeBench v6", "Code avg"]
    rows = {r[0]: dict(zip(t["columns"], r)) for r in t["rows"]}
    assert rows["grpo-code"]["HumanEval+"] == "60.00±1.00" and rows["grpo-code"]["Code avg"] == "43.33±0.30"
    assert rows["saf-code"]["LiveCodeBench v6"] == "21.00±1.00" and rows["saf-code"]["HumanEval"] == "—"
    assert rows["saf-code"]["Method"] == "saf" and rows["saf-code"]["Step"] == "200"
    assert rows["Qwen/Qwen3-4B"]["HumanEval"] == "80.00±1.00" and rows["Qwen/Qwen3-4B"]["Code avg"] == "80.00±0.30"
    other = next(t for t in rep["tables"] if t["key"] == "evals")
    assert other["rows"][0][-1] == "25.00±0.20"  # the eval folder's average stays the math one
    assert "## Code benchmarks (pass@1 %" in open(os.path.join(out, "report.md")).read()
