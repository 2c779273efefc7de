"""`graft report` on a FIXTURE folder of fake runs (config.yaml, metrics.jsonl, eval summaries, best.json,
rollouts), checking that the right numbers land in the right cells. Every expected value is worked by hand
next to the fixture that produces it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT

from graft_cli.report.tables import report_main
from graft_cli.rundir import write_parquet

GRAFT = [sys.executable, "-m", "graft_cli.cli"]
FIVE = ("math500", "aime24", "aime25", "amc23", "minerva")
SMOL, QWEN = "HuggingFaceTB/SmolLM3-3B-Base", "Qwen/Qwen3-1.7B-Base"
POLS = [{"name": "smol", "model": SMOL}, {"name": "qwen", "model": QWEN}]


def summary(bench: dict, avg: tuple, runs: int = 5) -> dict:
    """bench: name -> (mean, std) as fractions; avg: (mean, std)."""
    return {"benchmarks": {b: {"mean": m, "std": s, "num_runs": runs, "runs": [m] * runs}
                           for b, (m, s) in bench.items()},
            "average": {"mean": avg[0], "std": avg[1], "runs": [avg[0]] * runs, "five": True, "benchmarks": list(FIVE)},
            "num_runs": runs}


def uniform(v: float, s: float = 0.01) -> dict:
    return {b: (v, s) for b in FIVE}


def fake_run(root, name, method, seed=0, ordering="last", exchange="graft", evals=None, best=None, metrics=(),
             params=None):
    d = os.path.join(root, name)
    os.makedirs(d)
    cfg = {"method": method, "pair": "1", "policies": POLS, "run": {"seed": seed},
           "exchange": {"name": exchange, "ordering": ordering, "params": params or {}}}
    with open(os.path.join(d, "config.yaml"), "w") as f:
        yaml.safe_dump(cfg, f)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for m in metrics:
            f.write(json.dumps(m) + "\n")
    for pol, steps in (evals or {}).items():
        for step, s in steps.items():
            sd = os.path.join(d, "eval", pol, f"step_{step:06d}")
            os.makedirs(sd)
            with open(os.path.join(sd, "summary.json"), "w") as f:
                json.dump(s, f)
    if best:
        with open(os.path.join(d, "best.json"), "w") as f:
            json.dump({"policies": {p: {"step": s} for p, s in best.items()}}, f)
    return d


def row(report, key, first):
    t = next(t for t in report["tables"] if t["key"] == key)
    hits = [r for r in t["rows"] if r[0] == first]
    assert hits, (first, [r[0] for r in t["rows"]])
    return dict(zip(t["columns"], hits[0]))


@pytest.fixture(scope="module")
def fixture_report(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("runs"))
    # --- GRPO n=8, seed 0: smol avg 30.00±0.50 (math500 70.00±1.00), qwen avg 28.00±0.40
    #     metrics: 2 steps, time/step 1800 s; own times smol 1 s, qwen 1 s -> shares 0.5/0.5
    #     Table 5 (4 devices, pair 1): smol best (step 2) = 4*(1800+1800)*0.5/3600 = 2; full = 2
    #                                  qwen best (step 1) = 4*1800*0.5/3600 = 1;    full = 2
    #                                  both best = 2 + 1 = 3 (independent: sum); both full = 4
    grpo_m = [{"step": s, "policy": p, "time/step": 1800.0, "time/rollout": 1.0, "reward": 0.1 * s}
              for s in (1, 2) for p in ("smol", "qwen")]
    smol_grpo = {**uniform(0.29), "math500": (0.70, 0.01)}
    grpo = fake_run(root, "grpo-s0", "grpo", exchange="none", metrics=grpo_m, best={"smol": 2, "qwen": 1},
                    evals={"smol": {2: summary(smol_grpo, (0.30, 0.005))},
                           "qwen": {1: summary(uniform(0.28), (0.28, 0.004))}})
    # rollout logs for complementarity (2 prompts, n = 2): k_smol = [0, 2], k_qwen = [0, 0]
    #   qwen solves smol's all-fail {0}: 0 of 1 -> 0.0 %; smol solves qwen's all-fail {0,1}: 1 of 2 -> 50.0 %
    for pol, ks in (("smol", [0, 2]), ("qwen", [0, 0])):
        rows = {"prompt_index": [], "prompt_id": [], "reward": []}
        for i, k in enumerate(ks):
            for j in range(2):
                rows["prompt_index"].append(i)
                rows["prompt_id"].append(f"q{i}")
                rows["reward"].append(1.0 if j < k else 0.0)
        write_parquet(os.path.join(grpo, "rollouts", pol, "step_000001.parquet"), rows)
    # --- GRPO n=8, seed 1: smol avg 32.00, qwen avg 30.00 -> Table 4: smol 31.00±1.41, qwen 29.00±1.41
    fake_run(root, "grpo-s1", "grpo", seed=1, exchange="none", best={"smol": 1, "qwen": 1},
             evals={"smol": {1: summary(uniform(0.32), (0.32, 0.005))},
                    "qwen": {1: summary(uniform(0.30), (0.30, 0.005))}})
    # --- GRAFT (peer last): smol avg 34.00±0.60 at step 3 -> Δ vs GRPO = +4.00; qwen 29.50 at step 2 -> +1.50
    #     metrics: 4 steps, time/step 3600; own smol 2+1 = 3 s, qwen 1 s -> shares 0.75 / 0.25
    #     Table 5: smol best (3) = 4*3*0.75 = 9, full = 4*4*0.75 = 12; qwen best (2) = 4*2*0.25 = 2, full = 4
    #              both best = joint through the later step 3 = 4*3 = 12; both full = 16
    #     Table 9 (last): smol self [.001,.002,.003,.002] -> 0.200 %; smol peer [.004, -, .002, -] -> 0.300 %
    #              peer_any smol [1, 0], qwen [1, 1] -> 1 of 4 steps without clipping -> 25.0 %
    graft_m = []
    for s in (1, 2, 3, 4):
        sm = {"step": s, "policy": "smol", "time/step": 3600.0, "time/rollout": 2.0, "time/update": 1.0,
              "clip_ratio/self": [0.001, 0.002, 0.003, 0.002][s - 1], "graft/s_mean": 0.9, "graft/s_p10": 0.7,
              "graft/s_p90": 1.1, "graft/complementarity": 0.5, "reward": 0.2}
        qw = {"step": s, "policy": "qwen", "time/step": 3600.0, "time/rollout": 1.0, "clip_ratio/self": 0.004,
              "graft/s_mean": 0.85, "graft/complementarity": 0.2, "reward": 0.1}
        if s in (1, 3):
            sm.update({"clip_ratio/peer": {1: 0.004, 3: 0.002}[s], "clip_ratio/peer_any": {1: 1.0, 3: 0.0}[s]})
            qw.update({"clip_ratio/peer": 0.01, "clip_ratio/peer_any": 1.0})
        graft_m += [sm, qw]
    graft_m.append({"step": 3, "policy": "smol", "validation/score": 0.34})  # a validation line: not a training row
    fake_run(root, "graft-s0", "graft", metrics=graft_m, best={"smol": 3, "qwen": 2}, params={"delta": 0.8},
             evals={"smol": {2: summary(uniform(0.33), (0.33, 0.006)),
                             3: summary({**uniform(0.34), "aime24": (0.1442, 0.0149)}, (0.34, 0.006))},
                    "qwen": {2: summary(uniform(0.295), (0.295, 0.003))}})
    # --- GRAFT peer first / uniform (Table 9 columns): smol self .0005 -> 0.050; peer .0001 with no clipping
    for name, method, order in (("graft-first", "graft_first", "first"), ("graft-uniform", "graft_uniform", "uniform")):
        m = [{"step": s, "policy": p, "time/step": 10.0, "clip_ratio/self": 0.0005, "clip_ratio/peer": 0.0001,
              "clip_ratio/peer_any": 0.0} for s in (1, 2) for p in ("smol", "qwen")]
        fake_run(root, name, method, ordering=order, metrics=m, best={"smol": 1, "qwen": 1},
                 evals={"smol": {1: summary(uniform(0.31), (0.31, 0.004))},
                        "qwen": {1: summary(uniform(0.27), (0.27, 0.004))}})
    # --- w/o compat gate, no best.json: the better of steps 1 (25.00) and 2 (26.00) is selected -> Δ = 26 - 34 = -8.00
    fake_run(root, "graft-nogate", "graft_nogate", params={"gate": "none"},
             evals={"smol": {1: summary(uniform(0.25), (0.25, 0.01)), 2: summary(uniform(0.26), (0.26, 0.01))}})
    out = str(tmp_path_factory.mktemp("report"))
    report_main([root], out=out)
    with open(os.path.join(out, "report.json")) as f:
        return root, out, json.load(f)


def test_table1_cells(fixture_report):
    _, _, rep = fixture_report
    t = next(t for t in rep["tables"] if t["key"] == "table1")
    heads = [r[0] for r, s in zip(t["rows"], t["styles"]) if s == "head"]
    assert heads == ["Updated SmolLM3-3B-Base", "Updated Qwen3-1.7B-Base"]
    smol = t["rows"][: t["rows"].index(next(r for r in t["rows"] if r[0] == "Updated Qwen3-1.7B-Base"))]
    grpo = dict(zip(t["columns"], next(r for r in smol if r[0] == "GRPO n=8")))
    assert grpo["MATH500"] == "70.00±1.00" and grpo["Avg"] == "30.00±0.50" and grpo["Δ vs GRPO n=8"] == "—"
    assert grpo["Peer (pair)"] == "—"
    graft = dict(zip(t["columns"], next(r for r in smol if r[0] == "GRAFT")))
    assert graft["AIME24"] == "14.42±1.49" and graft["Avg"] == "34.00±0.60" and graft["Δ vs GRPO n=8"] == "+4.00"
    assert graft["Peer (pair)"] == "Qwen3-1.7B-Base (Pair 1)"
    paper = dict(zip(t["columns"], next(r for r in smol if r[0] == "GRAFT (paper)")))
    assert paper["MATH500"] == "76.86±0.32" and paper["Avg"] == "37.06±0.67" and paper["Δ vs GRPO n=8"] == "+4.46"
    qwen = t["rows"][len(smol):]
    qg = dict(zip(t["columns"], next(r for r in qwen if r[0] == "GRAFT")))
    assert qg["Avg"] == "29.50±0.30" and qg["Δ vs GRPO n=8"] == "+1.50"
    assert any(r[0] == "GRPO n=8 (paper)" and "31.20±0.27" in r for r in qwen)


def test_ablation_table_selects_best_step_without_best_json(fixture_report):
    _, _, rep = fixture_report
    r = row(rep, "table7", "w/o compat gate (w=1)")
    assert r["Avg"] == "26.00±1.00" and r["Δ vs full GRAFT"] == "-8.00"
    p = row(rep, "table7", "w/o compat gate (w=1) (paper)")
    assert p["Avg"] == "28.70±0.78" and p["Δ vs full GRAFT"] == "-8.36"
    assert row(rep, "table7", "GRAFT (full)")["Avg"] == "34.00±0.60"


def test_table9_clipped_fractions(fixture_report):
    _, _, rep = fixture_report
    self_ = row(rep, "table9", "Self, smol")
    assert (self_["First"], self_["Uniform"], self_["Last (GRAFT)"]) == ("0.050", "0.050", "0.200")
    assert self_["Last (paper)"] == "0.045"
    peer = row(rep, "table9", "Grafted, smol ← qwen")
    assert peer["Last (GRAFT)"] == "0.300" and peer["First"] == "0.010" and peer["Last (paper)"] == "0.277"
    zero = row(rep, "table9", "% steps with zero peer-token clipping")
    assert (zero["First"], zero["Uniform"], zero["Last (GRAFT)"]) == ("100.0", "100.0", "25.0")
    assert zero["First (paper)"] == "97.6"


def test_table5_compute(fixture_report):
    _, _, rep = fixture_report
    g = row(rep, "table5_1", "GRAFT")
    n = "SmolLM3-3B-Base"
    q = "Qwen3-1.7B-Base"
    assert g[f"{n} s/step"] == "3600.00"
    assert (g[f"{n} best GPU-h"], g[f"{n} full GPU-h"]) == ("9", "12")
    assert (g[f"{q} best GPU-h"], g[f"{q} full GPU-h"]) == ("2", "4")
    assert (g["Both best GPU-h"], g["Both full GPU-h"]) == ("12", "16")
    r = row(rep, "table5_1", "GRPO n=8")
    assert (r[f"{n} best GPU-h"], r[f"{q} best GPU-h"], r["Both best GPU-h"], r["Both full GPU-h"]) == ("2", "1", "3",
                                                                                                        "4")
    p = row(rep, "table5_1", "GRAFT (paper)")
    assert p["Both best GPU-h"] == "40.9" and p[f"{n} best GPU-h"] == "25.3"


def test_table4_repeats_and_complementarity(fixture_report):
    _, _, rep = fixture_report
    t = next(t for t in rep["tables"] if t["key"] == "table4")
    rows = [dict(zip(t["columns"], r)) for r in t["rows"]]
    smol = next(r for r in rows if r["Updated model"] == "SmolLM3-3B-Base" and r["Method"] == "GRPO n=8")
    assert smol["Runs"] == "2" and smol["Avg"] == "31.00±1.41"
    assert not any(r["Method"] == "GRAFT" for r in rows)  # one seed only
    c = next(t for t in rep["tables"] if t["key"] == "complementarity")
    crow = [dict(zip(c["columns"], r)) for r in c["rows"]]
    grpo = [r for r in crow if r["Run"] == "grpo-s0"]
    assert {(r["Solver"], r["Fails"], r["%"]) for r in grpo} == {("qwen", "smol", "0.0"), ("smol", "qwen", "50.0")}
    assert any(r["Method"] == "paper (GRPO n=8)" and r["Solver"] == "smol" and r["%"] == "47.9" for r in crow)
    graft = {(r["Solver"], r["%"], r["Source"]) for r in crow if r["Run"] == "graft-s0"}
    assert graft == {("qwen", "50.0", "metrics"), ("smol", "20.0", "metrics")}


def test_outputs_markdown_latex_plots(fixture_report):
    _, out, rep = fixture_report
    md = open(os.path.join(out, "report.md")).read()
    assert "| GRAFT | Qwen3-1.7B-Base (Pair 1) |" in md and "*76.86±0.32*" in md
    tex = open(os.path.join(out, "tables.tex")).read()
    assert tex.count("\\begin{tabular}") == len(rep["tables"])
    assert "34.00$\\pm$0.60" in tex and "\\textit{76.86$\\pm$0.32}" in tex
    names = sorted(os.listdir(os.path.join(out, "plots")))
    assert names == ["clip_fraction.png", "compat_hist.png", "complementarity.png", "reward.png", "validation.png"]
    for n in names:
        assert open(os.path.join(out, "plots", n), "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_report_cli_prints_where(fixture_report, tmp_path):
    root, _, _ = fixture_report
    r = subprocess.run(GRAFT + ["report", root, "--out", str(tmp_path / "rep"), "--no-plots"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert str(tmp_path / "rep" / "report.md") in (r.stdout + r.stderr).replace("\n", "")
    r = subprocess.run(GRAFT + ["report", str(tmp_path / "nothing-here")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_consoles_do_not_turn_model_names_into_emoji():
    """`tiny:a: avg=...` once printed as `tiny🅰 avg=...` (rich emoji codes)."""
    import io

    from graft_cli.console import make_console

    buf = io.StringIO()
    make_console(file=buf, width=80).print("tiny:a: avg=1.00 tiny:b:")
    assert buf.getvalue().strip() == "tiny:a: avg=1.00 tiny:b:"
