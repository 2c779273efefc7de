"""Tandem RLVR's evaluation (tandem.md §2.8, §2.10): `graft eval --run` on the tandem pair samples
as the release's eval/config.py does (T 0.7, top-p 0.8, top-k 20, 8 samples, seed 17), validation as its training
launcher (n = 4, T 0.6, top-p 0.95 on the held-out slice) and the checkpoint is the step with the best held-out
pass@4. Expected values are worked by hand (the unbiased pass@k of the Codex paper) or counted from the files."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from conftest import make_random_model, train_overrides

from graft_cli.config import compose
from graft_cli.errors import GraftError
from graft_cli.eval.setup import EvalSettings, final_settings, run_selection, validation_root, validation_settings
from graft_cli.eval.summary import Selection, select_best, selection_runs
from graft_cli.eval.runner import prepare_folder

TANDEM_ARMS = ("tandem", "grpo", "grpo_kl", "grpo_n16")


@pytest.mark.parametrize("method", TANDEM_ARMS)
def test_tandem_pair_evaluates_as_released(method):
    cfg = compose(["pair=tandem_qwen3_4b", f"method={method}"])
    assert final_settings(cfg) == EvalSettings(runs=5, samples=8, temperature=0.7, top_p=0.8, top_k=20,
                                               max_new_tokens=3000, seed=17)
    assert list(cfg.eval.final.benchmarks) == ["aime24", "aime25", "aime26", "amc23_25", "math500", "minerva",
                                               "olympiad"]
    assert validation_settings(cfg) == EvalSettings(runs=1, samples=4, temperature=0.6, top_p=0.95, top_k=0,
                                                    max_new_tokens=3000, seed=0)
    # a folder holds one sampling setting: validation goes to <run>/validation/, selection by held-out pass@4
    assert validation_root(cfg) == "validation"
    assert run_selection(cfg) == Selection("validation", "pass@4", ("heldout",))
    # command-line options still win over eval.final
    assert final_settings(cfg, top_k=0, samples=2).identity()["samples"] == 2
    assert "top_k" not in final_settings(cfg, top_k=0).identity()


def test_other_pairs_keep_one_folder_and_the_pass1_average():
    for ov in (["pair=tiny", "method=graft"], ["pair=saf_qwen3_4b", "method=saf"]):
        cfg = compose(ov)
        assert validation_root(cfg) == "eval" and run_selection(cfg) == Selection()
    assert "top_k" not in EvalSettings().identity()  # folders made before top-k keep their identity


def test_selection_settings_are_checked_in_one_line():
    with pytest.raises(GraftError, match=r"eval.select_metric.*pass@k"):
        compose(["method=grpo", "eval.select_metric=best"])
    with pytest.raises(GraftError, match=r"eval.select_metric.*pass@8 needs at least 8 validation samples"):
        compose(["method=grpo", "eval.every=5", "eval.samples=4", "eval.select_metric=pass@8"])
    with pytest.raises(GraftError, match="eval.top_k"):
        compose(["method=grpo", "eval.top_k=-1"])
    with pytest.raises(GraftError, match="eval.final.top_k"):
        compose(["method=grpo", "eval.final.top_k=-2"])


def _summary(per_bench: dict) -> dict:
    """A step summary: benchmark -> per-run pass@1 list and per-run pass@4 list."""
    return {"benchmarks": {b: {"runs": p1, "pass@k": {"1": {"runs": p1}, "4": {"runs": p4}}}
                           for b, (p1, p4) in per_bench.items()},
            "average": {"benchmarks": list(per_bench)}}


def test_selection_by_held_out_pass_at_4_by_hand():
    # step 20: heldout pass@1 0.40, pass@4 0.50; step 40: pass@1 0.30, pass@4 0.70 (a sharper but more diverse
    # policy); math500 only at step 40. pass@4 on heldout picks 40, pass@1 on heldout picks 20
    s20 = _summary({"heldout": ([0.40], [0.50])})
    s40 = _summary({"heldout": ([0.30], [0.70]), "math500": ([0.9], [0.95])})
    assert selection_runs(s40, "pass@4", ("heldout",)) == [0.70]
    assert selection_runs(s40, "pass@1") == [pytest.approx(0.60)]  # the benchmark average (0.3 + 0.9)/2
    assert selection_runs(s20, "pass@4", ("math500",)) is None  # not evaluated there: not a candidate
    steps = {"20": {"select_runs": selection_runs(s20, "pass@4", ("heldout",))},
             "40": {"select_runs": selection_runs(s40, "pass@4", ("heldout",))}}
    assert select_best(steps, key="select_runs")["step"] == 40
    steps = {k: {"select_runs": selection_runs(s, "pass@1", ("heldout",))} for k, s in (("20", s20), ("40", s40))}
    assert select_best(steps, key="select_runs")["step"] == 20


def _pass_at_k(n: int, c: int, k: int) -> float:
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def test_tandem_like_run_validates_apart_selects_by_pass_at_k_and_evaluates_with_top_k(problems_file, tmp_path):
    """Two steps validated at one sampling (4 samples, T 1) into validation/, best.json by held-out pass@2 counted
    here from the validation files, then `graft eval --run` of the last checkpoint at another (2 samples, T 0.7,
    top-k 3) into eval/ with top-k in the folder's identity; best.json unchanged by it."""
    from graft_cli.eval.validation import ValidationHook
    from graft_cli.eval.runner import EvalOptions, evaluate_run
    from graft_cli.rundir import read_json, read_jsonl
    from graft_cli.train.run import train

    model = make_random_model(str(tmp_path / "m"), "qwen3", 5)  # scores 0: the wiring (the values: the test below)
    cfg = compose(train_overrides({"a": model}, problems_file, str(tmp_path / "runs"),
                                  ["run.steps=2", "run.name=t", "run.save_every=2", "rollout.max_new_tokens=12",
                                   "data.prompt_batch=2", "rollout.n=2", "run.log_rollouts=false",
                                   "data.holdout=4", "eval.every=1", "eval.samples=4", "eval.temperature=1.0",
                                   "eval.top_p=1.0", "eval.max_new_tokens=12", "eval.benchmarks=[heldout]",
                                   "eval.select_metric=pass@2", "eval.select_benchmarks=[heldout]",
                                   "eval.final.samples=2", "eval.final.temperature=0.7", "eval.final.top_k=3",
                                   "eval.final.runs=1", "run.device=cpu", "optim.lr=1e-5",
                                   "reward.num_workers=0"]))  # in-process grading: no worker start-up
    run = train(cfg, progress=False, after_step=(ValidationHook(),))
    assert sorted(os.listdir(os.path.join(run, "validation", "a"))) == ["step_000001", "step_000002", "summary.json"]
    assert not os.path.exists(os.path.join(run, "eval"))
    score = {}
    for s in (1, 2):  # held-out pass@2 from the grades on disk: mean over problems of 1 − C(4−c, 2)/C(4, 2)
        rows = read_jsonl(os.path.join(run, "validation", "a", f"step_{s:06d}", "heldout_run1.jsonl"))
        c = {}
        for r in rows:
            c[r["problem_index"]] = c.get(r["problem_index"], 0) + int(r["grade"] > 0.5)
        score[s] = float(np.mean([_pass_at_k(4, v, 2) for v in c.values()]))
    best = read_json(os.path.join(run, "best.json"))
    want = max((1, 2), key=lambda s: (score[s], -s))
    assert best["policies"]["a"]["step"] == want and best["policies"]["a"]["score"] == pytest.approx(score[want])
    assert "pass@2" in best["criterion"] and "heldout" in best["criterion"]
    res = evaluate_run(EvalOptions(run_dir=run, steps="last", workers=0, progress=False))
    assert sorted(res["a"]) == [2]
    meta = json.load(open(os.path.join(run, "eval", "a", "step_000002", "meta.json")))
    assert (meta["settings"]["top_k"], meta["settings"]["samples"], meta["settings"]["temperature"]) == (3, 2, 0.7)
    assert read_json(os.path.join(run, "best.json"))["policies"]["a"]["step"] == want  # still the validation's pick


def test_top_k_reaches_the_engine_and_the_folder_identity(tmp_path):
    from graft_cli.data.prompts import PromptSpec
    from graft_cli.eval.benchmarks import BenchmarkSource
    from graft_cli.eval.runner import Evaluator
    from graft_cli.batch import Rollouts

    seen = []

    class Engine:
        def generate(self, prompt_ids, params):
            seen.append(params)
            n = len(prompt_ids) * params.n
            return Rollouts(prompt_ids=prompt_ids, response_ids=[[5]] * n, texts=["\\boxed{2}"] * n,
                            logprobs=[[0.0]] * n, truncated=[False] * n, n=params.n)

    class Tok:
        chat_template = None

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [1, 2, 3]}

    class Grader:
        def grade(self, texts, golds):
            from types import SimpleNamespace

            return SimpleNamespace(rewards=[1.0] * len(texts), extracted=["2"] * len(texts),
                                   timed_out=[False] * len(texts), base=None)  # base: EvalPlus's base verdicts

    from graft_cli.data.problems import Problem

    probs = [Problem(id="p0", problem="1+1", answer="2")]
    bench = [(BenchmarkSource("b", "file", "x"), probs)]
    s = EvalSettings(runs=1, samples=2, temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=4)
    Evaluator(Engine(), Tok(), PromptSpec(chat_template="none"), s, Grader()).evaluate(str(tmp_path / "f"), bench)
    assert [(p.top_k, p.top_p, p.temperature, p.n) for p in seen] == [(20, 0.8, 0.7, 2)]
    with pytest.raises(GraftError, match="top_k"):  # a folder made at top-k 20 refuses top-k off
        prepare_folder(str(tmp_path / "f"), EvalSettings(runs=1, samples=2, temperature=0.7, top_p=0.8,
                                                         max_new_tokens=4), PromptSpec(chat_template="none"), bench)


def test_best_json_from_the_validation_folders_by_held_out_pass_at_4(tmp_path):
    """update_best with the tandem pair's selection over validation/ step folders (summaries written here): step 20
    has the better held-out pass@1 (0.50 vs 0.375), step 40 the better pass@4 (0.75 vs 0.625); eval/ holds a
    final evaluation of step 20 only, which does not take part."""
    from graft_cli.eval.summary import update_best
    from graft_cli.rundir import read_json

    cfg = compose(["pair=tandem_qwen3_4b", "method=tandem"])
    run = str(tmp_path / "run")

    def write(root, step, benches):
        d = os.path.join(run, root, "senior", f"step_{step:06d}")
        os.makedirs(d)
        summ = _summary(benches)
        summ.update(num_runs=1, average={"mean": float(np.mean([v[0][0] for v in benches.values()])), "std": None,
                                         "runs": [float(np.mean([v[0][0] for v in benches.values()]))],
                                         "benchmarks": list(benches)})
        for b, (p1, _) in benches.items():
            summ["benchmarks"][b].update(mean=p1[0], std=None)
        json.dump(summ, open(os.path.join(d, "summary.json"), "w"))

    write("validation", 20, {"heldout": ([0.50], [0.625])})
    write("validation", 40, {"heldout": ([0.375], [0.75])})
    write("eval", 20, {"math500": ([0.9], [0.95])})
    sel = run_selection(cfg, run)
    assert sel.root == "validation"
    best = update_best(run, selection=sel)
    assert best["policies"]["senior"]["step"] == 40 and best["policies"]["senior"]["score"] == pytest.approx(0.75)
    assert read_json(os.path.join(run, "validation", "senior", "summary.json"))["best"]["step"] == 40
    # the pass@1 average (the GRAFT pairs' rule) over the same folders would pick step 20
    assert update_best(run, selection=Selection("validation"))["policies"]["senior"]["step"] == 20
    # no validation/ folder (validation off): the final evaluation's folders are selected from
    assert run_selection(cfg, str(tmp_path / "other")).root == "eval"
