"""`graft eval`: pass@k against the closed form, mean ± std aggregation on fixture grades, benchmark
resolution, best-step selection, the CLI on a random model (files, resume, settings guard), and
validation during training writing best.json."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, SHARED, make_random_model, train_overrides

from graft_cli.errors import GraftError
from graft_cli.eval import benchmarks as B
from graft_cli.eval.metrics import average_over_benchmarks, mean_std, pass_at_1, pass_at_k, pass_at_k_run, pm, \
    summarize_benchmark
from graft_cli.eval.setup import run_seed
from graft_cli.eval.summary import select_best

GRAFT = [sys.executable, "-m", "graft_cli.cli"]
SMOKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "smoke.jsonl")  # 25 MATH500 problems
FULL_SETS = os.path.join(SHARED, "data", "eval")


def run_cli(args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(GRAFT + args, cwd=ROOT, env=env, capture_output=True, text=True)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(x) for x in f if x.strip()]


# ----------------------------------------------------------------------------------------- metrics
def test_pass_at_k_hand_cases():
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # n=5, c=2, k=3: 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)
    # n=8, c=3, k=1: c/n
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    assert pass_at_k(8, 0, 4) == 0.0
    assert pass_at_k(8, 6, 4) == 1.0  # n - c = 2 < k: every 4-subset holds a correct sample
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_pass_at_k_equals_closed_form_everywhere_small():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                closed = 1.0 - (math.comb(n - c, k) / math.comb(n, k))
                assert pass_at_k(n, c, k) == pytest.approx(closed, abs=1e-12), (n, c, k)


# Fixture: 2 runs x 2 problems x 4 samples
#   run 1: p1 = [1,0,0,0] (0.25), p2 = [1,1,1,1] (1.0)  -> pass@1 = 0.625
#   run 2: p1 = [0,0,0,0] (0.0),  p2 = [1,1,0,0] (0.5)  -> pass@1 = 0.25
#   mean 0.4375; sample std |0.625 - 0.25| / sqrt(2) = 0.265165...
#   pass@2: run 1: p1 1 - C(3,2)/C(4,2) = 0.5, p2 1.0 -> 0.75; run 2: p1 0, p2 1 - C(2,2)/C(4,2) = 5/6 -> 5/12
FIX = np.array([[[1, 0, 0, 0], [1, 1, 1, 1]],
                [[0, 0, 0, 0], [1, 1, 0, 0]]], dtype=float)


def test_summarize_benchmark_fixture():
    assert pass_at_1(FIX[0]) == pytest.approx(0.625)
    assert pass_at_k_run(FIX[1], 2) == pytest.approx(5 / 12)
    s = summarize_benchmark(FIX)
    assert (s["num_runs"], s["num_problems"], s["num_samples"]) == (2, 2, 4)
    assert s["runs"] == pytest.approx([0.625, 0.25])
    assert s["mean"] == pytest.approx(0.4375)
    assert s["std"] == pytest.approx(0.375 / math.sqrt(2))  # ddof=1
    assert set(s["pass@k"]) == {"1", "2", "4"}
    assert s["pass@k"]["1"]["mean"] == pytest.approx(0.4375)
    assert s["pass@k"]["2"]["runs"] == pytest.approx([0.75, 5 / 12])
    assert s["pass@k"]["2"]["mean"] == pytest.approx((0.75 + 5 / 12) / 2)
    # pass@4 = any correct: run 1 both problems, run 2 only p2
    assert s["pass@k"]["4"]["runs"] == pytest.approx([1.0, 0.5])


def test_mean_std_and_benchmark_average():
    m, s = mean_std([0.2, 0.4, 0.6])
    assert m == pytest.approx(0.4) and s == pytest.approx(0.2)  # sample std
    assert mean_std([0.3]) == (pytest.approx(0.3), None)  # one run: std undefined
    # per-run averages first: A [.5, .7], B [.1, .3] -> [.3, .5] -> 0.4 ± 0.1414
    avg = average_over_benchmarks({"A": [0.5, 0.7], "B": [0.1, 0.3]})
    assert avg["runs"] == pytest.approx([0.3, 0.5])
    assert avg["mean"] == pytest.approx(0.4)
    assert avg["std"] == pytest.approx(0.2 / math.sqrt(2))
    assert pm(0.7208, 0.0052) == "72.08±0.52"
    assert pm(0.3, None) == "30.00"
    assert pm(float("nan"), None) == "—"


def test_run_seeds_distinct():
    seeds = [run_seed(0, k) for k in range(1, 6)]
    assert len(set(seeds)) == 5
    assert run_seed(1, 1) != run_seed(0, 1)


# ----------------------------------------------------------------------------------- benchmarks
def test_resolve_benchmarks(tmp_path, monkeypatch):
    monkeypatch.delenv(B.EVAL_DIR_ENV, raising=False)
    ev = FULL_SETS
    if os.path.isdir(ev):  # the real five sets (../shared/data); a bare clone checks the folder logic on a copy
        five = B.resolve_benchmarks(None, eval_dir=ev)
        assert [b.name for b in five] == list(B.FIVE)
        assert all(os.path.exists(b.source) for b in five)
        assert [len(b.load()) for b in five] == [500, 30, 30, 40, 272]
    else:
        ev = str(tmp_path / "eval")
        os.makedirs(ev)
        for n in B.FIVE:
            with open(SMOKE) as src, open(os.path.join(ev, f"{n}.jsonl"), "w") as dst:
                dst.write(src.read())
        five = B.resolve_benchmarks(None, eval_dir=ev)
        assert [b.name for b in five] == list(B.FIVE) and [len(b.load()) for b in five] == [25] * 5
    hub = B.resolve_benchmarks("math500,aime24")
    assert [b.source for b in hub] == ["HuggingFaceH4/MATH-500:test", "HuggingFaceH4/aime_2024:train"]
    one = B.resolve_benchmarks(None, data=SMOKE)
    assert [(b.name, b.source) for b in one] == [("smoke", SMOKE)]
    named = B.resolve_benchmarks([f"mine={SMOKE}", "minerva"], eval_dir=ev)
    assert [b.name for b in named] == ["mine", "minerva"] and named[0].source == SMOKE
    # the tiny pair: eval_<name>.jsonl in its task folder
    task = tmp_path / "task"
    task.mkdir()
    for n in B.FIVE:
        (task / f"eval_{n}.jsonl").write_text(json.dumps({"id": "x", "problem": "1+1=?", "answer": "2"}) + "\n")
    monkeypatch.setattr(B, "tiny_task_dir", lambda: str(task))
    tiny = B.resolve_benchmarks(None, pair="tiny")
    assert [b.source for b in tiny] == [str(task / f"eval_{n}.jsonl") for n in B.FIVE]
    # a run of any pair on the tiny task (pair=tiny3) is scored on the synthetic sets, not the hub's
    from graft_cli import config as C
    from graft_cli.eval.setup import run_benches

    got = run_benches(C.compose(["pair=tiny3"]), "aime24,amc23")
    assert [(b.name, b.source) for b, _ in got] == [(n, str(task / f"eval_{n}.jsonl")) for n in ("aime24", "amc23")]
    for bad in ("nosuch", "x=/nonexistent/file.jsonl"):
        with pytest.raises(GraftError):
            B.resolve_benchmarks(bad)
    with pytest.raises(GraftError):
        B.resolve_benchmarks("math500", data=SMOKE)


def test_select_best():
    def st(runs, five=True):
        return {"average_runs": runs, "five": five, "benchmarks": {b: {} for b in B.FIVE}}

    # step 10: run-1 score 0.30 (validation only); step 20: 0.35; step 30: 0.35 (tie -> earlier step 20)
    steps = {"10": st([0.30]), "20": st([0.35, 0.10]), "30": st([0.35])}
    best = select_best(steps)
    assert best["step"] == 20 and best["runs_compared"] == 1 and best["score"] == pytest.approx(0.35)
    # once all are fully evaluated, the mean over the common runs decides
    steps = {"10": st([0.30, 0.40]), "20": st([0.35, 0.10])}
    assert select_best(steps)["step"] == 10
    # steps not scored on the five are ignored when some are
    steps = {"5": st([0.9], five=False), "10": st([0.2])}
    assert select_best(steps)["step"] == 10
    assert select_best({}) is None


# ---------------------------------------------------------------------------------------- the CLI
@pytest.fixture(scope="module")
def random_model(tmp_path_factory):
    return make_random_model(str(tmp_path_factory.mktemp("evalmodel") / "m"))


def test_eval_cli_model_writes_files_and_resumes(random_model, tmp_path):
    out = tmp_path / "out"
    args = ["eval", "--model", random_model, "--data", SMOKE, "--runs", "2", "--samples", "2", "--max-new-tokens", "8",
            "--out", str(out), "--no-progress", "--workers", "1"]
    r = run_cli(args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert str(out) in r.stdout + r.stderr  # says where it wrote
    assert sorted(os.listdir(out)) == ["meta.json", "smoke_run1.jsonl", "smoke_run2.jsonl", "summary.json"]
    for k in (1, 2):
        rows = read_jsonl(out / f"smoke_run{k}.jsonl")
        assert len(rows) == 25 * 2
        assert {"problem_id", "run", "sample", "response", "extracted", "grade"} <= set(rows[0])
        assert {r["run"] for r in rows} == {k} and {r["sample"] for r in rows} == {0, 1}
        assert all(r["grade"] in (0.0, 1.0) for r in rows)
    seeds = {read_jsonl(out / f"smoke_run{k}.jsonl")[0]["seed"] for k in (1, 2)}
    assert len(seeds) == 2  # a distinct seed per run
    s = json.loads((out / "summary.json").read_text())
    assert s["settings"]["samples"] == 2 and s["settings"]["temperature"] == 0.6 and s["settings"]["top_p"] == 0.95
    sm = s["benchmarks"]["smoke"]
    assert sm["num_runs"] == 2 and sm["num_problems"] == 25 and len(sm["runs"]) == 2
    assert set(sm["pass@k"]) == {"1", "2"}
    # the summary is the arithmetic of the per-sample files
    for k in (1, 2):
        rows = read_jsonl(out / f"smoke_run{k}.jsonl")
        assert sm["runs"][k - 1] == pytest.approx(np.mean([r["grade"] for r in rows]))
    assert s["average"]["benchmarks"] == ["smoke"]

    # resume: a third run only adds run3; run1/run2 are not rewritten
    mtimes = {k: os.path.getmtime(out / f"smoke_run{k}.jsonl") for k in (1, 2)}
    r = run_cli([*args[:6], "3", *args[7:]])  # --runs 3
    assert r.returncode == 0, r.stderr[-3000:]
    assert all(os.path.getmtime(out / f"smoke_run{k}.jsonl") == mtimes[k] for k in (1, 2))
    assert json.loads((out / "summary.json").read_text())["benchmarks"]["smoke"]["num_runs"] == 3

    # other settings into the same folder: one line, exit 2
    r = run_cli([*args[:8], "3", *args[9:]])  # --samples 3
    assert r.returncode == 2
    lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and "samples" in lines[0], r.stderr


def test_eval_skips_and_counts_prompts_longer_than_the_context(random_model, tmp_path):
    """The random model has 512 positions; the character tokenizer makes one token per character. A 600-character
    problem leaves no room for the 8 new tokens: it is not generated, scores 0, is flagged in the per-sample file
    and counted in the summary, and one line says so; the short problems are generated as usual."""
    data = tmp_path / "mixed.jsonl"
    with open(data, "w") as f:
        f.write(json.dumps({"id": "short0", "problem": "1+1", "answer": "2"}) + "\n")
        f.write(json.dumps({"id": "long", "problem": "1+" * 300 + "1", "answer": "301"}) + "\n")
        f.write(json.dumps({"id": "short1", "problem": "2+2", "answer": "4"}) + "\n")
    out = tmp_path / "out"
    r = run_cli(["eval", "--model", random_model, "--data", str(data), "--runs", "1", "--samples", "2",
                 "--max-new-tokens", "8", "--out", str(out), "--no-progress", "--workers", "1"])
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_jsonl(out / "mixed_run1.jsonl")
    long_rows = [x for x in rows if x["problem_id"] == "long"]
    assert len(rows) == 6 and len(long_rows) == 2
    assert all(x["skipped"] == "prompt_longer_than_context" and x["grade"] == 0.0 and x["response"] == ""
               for x in long_rows)
    assert all("skipped" not in x and x["num_tokens"] > 0 for x in rows if x["problem_id"] != "long")
    s = json.loads((out / "summary.json").read_text())["benchmarks"]["mixed"]
    assert s["skipped_long"] == 2 and s["num_problems"] == 3
    assert "1 of 3 prompts leave no room for 8 new tokens in the model's 512-token context" in r.stdout + r.stderr


def test_eval_cli_needs_run_or_model():
    r = run_cli(["eval", "--data", SMOKE])
    assert r.returncode == 2 and "--run" in r.stderr and len(r.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------------ validation during training
def test_validation_in_training_writes_best_json(tiny_models, problems_file, tmp_path):
    from graft_cli.config import compose
    from graft_cli.eval.runner import EvalOptions, evaluate_run
    from graft_cli.eval.validation import ValidationHook
    from graft_cli.train.run import train

    out = tmp_path / "runs"
    cfg = compose(train_overrides(tiny_models, problems_file, str(out),
                                  ["run.steps=2", "run.name=val", "eval.every=1", "eval.samples=2",
                                   f"eval.benchmarks=[arith={problems_file}]", "eval.max_new_tokens=6",
                                   "run.keep_checkpoints=1"]))
    run = train(cfg, progress=False, after_step=(ValidationHook(),))
    best = json.loads(open(os.path.join(run, "best.json")).read())
    assert set(best["policies"]) == {"a", "b"}
    for pol, b in best["policies"].items():
        assert b["step"] in (1, 2)
        for step in (1, 2):
            d = os.path.join(run, "eval", pol, f"step_{step:06d}")
            assert os.path.exists(os.path.join(d, "arith_run1.jsonl"))
            assert json.load(open(os.path.join(d, "summary.json")))["benchmarks"]["arith"]["num_runs"] == 1
        # the selected weights are kept even though checkpoint pruning removed step 1
        assert open(os.path.join(run, "best", pol, "BEST_STEP")).read().strip() == str(b["step"])
        assert b["checkpoint"] == f"best/{pol}"
        summ = json.load(open(os.path.join(run, "eval", pol, "summary.json")))
        assert set(summ["steps"]) == {"1", "2"} and summ["best"]["step"] == b["step"]
        scores = {int(k): v["average"] for k, v in summ["steps"].items()}
        assert b["score"] == pytest.approx(max(scores.values()))
    rows = [json.loads(x) for x in open(os.path.join(run, "metrics.jsonl"))]
    val = [r for r in rows if "validation/score" in r]
    assert sorted((r["step"], r["policy"]) for r in val) == [(1, "a"), (1, "b"), (2, "a"), (2, "b")]
    train_rows = [r for r in rows if "reward" in r]
    assert len(train_rows) == 4  # training lines unchanged

    # the final evaluation adds runs to the validated step: run1 is reused, run2 added
    f1 = os.path.join(run, "eval", "a", "step_000002", "arith_run1.jsonl")
    m1 = os.path.getmtime(f1)
    res = evaluate_run(EvalOptions(run_dir=run, steps="2", policies="a", runs=2, workers=1, progress=False))
    assert os.path.getmtime(f1) == m1
    assert res["a"][2]["benchmarks"]["arith"]["num_runs"] == 2
    assert os.path.exists(os.path.join(run, "eval", "a", "step_000002", "arith_run2.jsonl"))


# ------------------------------------------------------------------------------------- lm-eval bridge
TASK_DIR = os.path.join(ROOT, "graft_cli", "eval", "lm_eval_tasks")


def _load_task_yaml(name):
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: ("!function", loader.construct_scalar(node)))
    with open(os.path.join(TASK_DIR, name)) as f:
        return yaml.load(f, Loader=Loader)


def test_lm_eval_task_yamls_parse():
    base = _load_task_yaml("_graft_math_yaml")
    assert base["dataset_path"] == "json" and base["test_split"] == "test"
    assert base["process_results"] == ("!function", "utils.process_results")
    assert base["repeats"] == 8 and base["filter_list"][0]["filter"][0] == {"function": "take_first_k", "k": 8}
    g = base["generation_kwargs"]
    assert (g["do_sample"], g["temperature"], g["top_p"]) == (True, 0.6, 0.95)
    assert {m["metric"] for m in base["metric_list"]} == {"pass_at_1", "pass_at_k"}
    for b in B.FIVE:
        t = _load_task_yaml(f"graft_{b}.yaml")
        assert t["task"] == f"graft_{b}" and t["include"] == "_graft_math_yaml"
        assert t["dataset_kwargs"]["data_files"]["test"] == f"data/eval/{b}.jsonl"
    group = _load_task_yaml("graft_math.yaml")
    assert group["task"] == [f"graft_{b}" for b in B.FIVE]
    assert group["aggregate_metric_list"][0]["weight_by_size"] is False  # unweighted five-benchmark mean


def test_lm_eval_prompt_is_graft_prompt():
    import jinja2

    from graft_cli.data.prompts import PromptSpec

    class NoTemplate:
        chat_template = None

    tmpl = _load_task_yaml("_graft_math_yaml")["doc_to_text"]
    problem = "What is $\\frac{1}{2}+\\frac{1}{3}$?"
    assert jinja2.Template(tmpl, keep_trailing_newline=True).render(problem=problem) == \
        PromptSpec().text(problem, NoTemplate())


def test_lm_eval_process_results_hand_example():
    import importlib.util

    spec = importlib.util.spec_from_file_location("graft_lm_eval_utils", os.path.join(TASK_DIR, "utils.py"))
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    doc = {"problem": "1/2 = ?", "answer": "\\frac{1}{2}"}
    # 4 samples: 0.5 (correct), 1/3 (wrong), no box (wrong), \frac12 (correct) -> pass@1 = 2/4; pass@4 = 1
    resps = ["so it is \\boxed{0.5}", "\\boxed{\\frac{1}{3}}", "I give up", "thus \\boxed{\\frac12}."]
    out = utils.process_results(doc, [resps])  # lm-eval's shape after take_first_k: [[r1, ..., rk]]
    assert out == {"pass_at_1": 0.5, "pass_at_k": 1.0}
    assert utils.process_results({"answer": "7"}, ["\\boxed{7}"]) == {"pass_at_1": 1.0, "pass_at_k": 1.0}
    assert utils.process_results({"answer": "7"}, [["\\boxed{8}", "7"]]) == {"pass_at_1": 0.0, "pass_at_k": 0.0}


def test_checkpoint_before_validation_and_resume_into_validation(tiny_models, problems_file, tmp_path):
    """A step's checkpoint is complete before its validation starts (also when the step is no scheduled save),
    so a failing validation costs no training; the rerun resumes into that validation, then trains on
   ."""
    from graft_cli.config import compose
    from graft_cli.eval.validation import ValidationHook
    from graft_cli.rundir import checkpoints_dir
    from graft_cli.train import checkpoint as ckpt
    from graft_cli.train.run import train

    seen = []

    class Dying(ValidationHook):
        def __init__(self, fail: bool):
            super().__init__()
            self.fail = fail

        def __call__(self, view, cfg, run_dir, console=None):
            seen.append((view.step, ckpt.complete_steps(checkpoints_dir(run_dir))))
            if self.fail and view.step == 2:
                raise RuntimeError("validation died")
            return super().__call__(view, cfg, run_dir, console)

    out = tmp_path / "runs"
    cfg = compose(train_overrides(tiny_models, problems_file, str(out),
                                  ["run.steps=3", "run.name=v", "eval.every=2", "eval.samples=2",
                                   f"eval.benchmarks=[arith={problems_file}]", "eval.max_new_tokens=6",
                                   "run.save_every=10", "run.keep_checkpoints=5"]))
    with pytest.raises(RuntimeError, match="validation died"):
        train(cfg, progress=False, after_step=(Dying(fail=True),))
    assert seen == [(2, [2])]  # step 2 was on disk, complete, when its validation began
    run = os.path.join(str(out), "v")
    assert not os.path.exists(os.path.join(run, "eval", "a", "step_000002", "summary.json"))
    train(cfg, progress=False, after_step=(Dying(fail=False),))
    assert seen[1:] == [(2, [2]), (3, [2, 3])]  # resumed into step 2's validation, then step 3 and its own
    rows = [json.loads(x) for x in open(os.path.join(run, "metrics.jsonl"))]
    assert sorted((r["step"], r["policy"]) for r in rows if "reward" in r) == \
        [(s, p) for s in (1, 2, 3) for p in ("a", "b")]  # no step trained twice
    assert sorted((r["step"], r["policy"]) for r in rows if "validation/score" in r) == \
        [(2, "a"), (2, "b"), (3, "a"), (3, "b")]


def test_a_validation_set_that_cannot_load_stops_the_run_before_it_trains(tiny_models, problems_file, tmp_path):
    """The validation benchmarks are loaded with the other inputs, before the run directory exists
    item 3): one line naming the file, no step trained, nothing written."""
    from graft_cli.config import compose
    from graft_cli.errors import GraftError
    from graft_cli.eval.validation import ValidationHook
    from graft_cli.train.run import train

    out = tmp_path / "runs"
    missing = tmp_path / "no_such_bench.jsonl"
    cfg = compose(train_overrides(tiny_models, problems_file, str(out),
                                  ["run.steps=2", "run.name=v", "eval.every=2", f"eval.benchmarks=[b={missing}]"]))
    with pytest.raises(GraftError, match="no_such_bench.jsonl"):
        train(cfg, progress=False, after_step=(ValidationHook(),))
    assert not os.path.exists(out / "v")


def test_benchmark_average_with_more_runs_on_some_benchmarks():
    # A has 3 runs [.5, .7, .9] (mean .7), B one [.1]: mean = (.7 + .1)/2 = .4 uses every run; the per-run
    # averages (and their std) only the run both have: [(.5 + .1)/2] = [.3]
    avg = average_over_benchmarks({"A": [0.5, 0.7, 0.9], "B": [0.1]})
    assert avg["mean"] == pytest.approx(0.4) and avg["runs"] == pytest.approx([0.3]) and avg["std"] is None


def test_eval_bench_runs_adds_runs_to_the_named_benchmarks(random_model, tmp_path):
    out = tmp_path / "out"
    args = ["eval", "--model", random_model, "--benchmarks", f"small={SMOKE},big={SMOKE}", "--runs", "1",
            "--samples", "2", "--max-new-tokens", "4", "--out", str(out), "--no-progress", "--workers", "1",
            "--bench-runs", "small=3"]
    r = run_cli(args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(f for f in os.listdir(out) if f.endswith(".jsonl")) == [
        "big_run1.jsonl", "small_run1.jsonl", "small_run2.jsonl", "small_run3.jsonl"]
    s = json.loads((out / "summary.json").read_text())
    assert s["benchmarks"]["small"]["num_runs"] == 3 and s["benchmarks"]["big"]["num_runs"] == 1
    small = np.mean(s["benchmarks"]["small"]["runs"])
    assert s["average"]["mean"] == pytest.approx((small + s["benchmarks"]["big"]["runs"][0]) / 2)
    # the per-problem sampling variance reads all six grades of a small problem
    from graft_cli.eval.files import read_problem_stats
    means, var, _ = read_problem_stats(str(out))
    rows = [x for k in (1, 2, 3) for x in read_jsonl(out / f"small_run{k}.jsonl") if x["problem_index"] == 0]
    assert len(rows) == 6 and means["small"][0] == pytest.approx(np.mean([x["grade"] for x in rows]))
    # a benchmark the evaluation does not score, or a malformed value: one line, exit 2, nothing written
    for bad, word in (("tiny=2", "tiny"), ("small:3", "NAME=RUNS"), ("small=0", ">= 1")):
        r = run_cli([*args[:-1], bad, "--out", str(tmp_path / "bad")])
        lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
        assert r.returncode == 2 and len(lines) == 1 and word in lines[0], r.stderr
        assert not (tmp_path / "bad").exists()


def test_plan_eval_bench_runs_and_eval_done(monkeypatch):
    from graft_cli.plan import status as S
    from graft_cli.plan.spec import parse_eval

    ev = parse_eval({"runs": 1, "samples": 4, "bench_runs": {"aime24": 5, "amc23": "5"}})
    assert ev.bench_runs == {"aime24": 5, "amc23": 5} and ev.kwargs()["bench_runs"] == {"aime24": 5, "amc23": 5}
    with pytest.raises(GraftError, match=r"eval.bench_runs: aime24: runs must be a whole number >= 1"):
        parse_eval({"bench_runs": {"aime24": 0}})
    summ = {"num_runs": 1, "settings": {"samples": 4},
            "benchmarks": {"aime24": {"num_runs": 5}, "amc23": {"num_runs": 2}, "math500": {"num_runs": 1}}}
    monkeypatch.setattr(S, "eval_targets", lambda run_dir, steps: {"a": [36]})
    monkeypatch.setattr(S, "eval_summary", lambda run_dir, p, s: summ)
    monkeypatch.setattr(S, "_tandem_eval", lambda run_dir: False)
    assert S.eval_done("r", "last", 1, 4)
    assert S.eval_done("r", "last", 1, 4, bench_runs={"aime24": 5})
    assert not S.eval_done("r", "last", 1, 4, bench_runs={"aime24": 5, "amc23": 5})  # amc23 has 2 of 5


def test_eval_final_bench_runs_from_the_config():
    from graft_cli.config import compose
    from graft_cli.eval.setup import final_settings

    assert final_settings(compose([])).bench_runs == {}
    cfg = compose(["eval.final.bench_runs.aime24=5", "eval.final.bench_runs.amc23=3"])
    s = final_settings(cfg)
    assert s.bench_runs == {"aime24": 5, "amc23": 3} and s.runs_for("aime24") == 5 and s.runs_for("math500") == 5
    assert final_settings(cfg, runs=1).runs_for("math500") == 1 and final_settings(cfg, runs=1).runs_for("amc23") == 3
    with pytest.raises(GraftError, match=r"eval.final.bench_runs.aime24': must be a whole number >= 1, got 0"):
        compose(["eval.final.bench_runs.aime24=0"])
