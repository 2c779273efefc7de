"""The tiny code models (graft_cli/tiny/code.py), the task overlay that trains on them
(experiments/task/tiny_code.yaml), the tiny_code benchmark and the SAF report's code arm."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, proc_env, train_overrides
from graft_cli.config import compose
from graft_cli.data.prompts import PromptSpec
from graft_cli.data.synthetic_code import reference_response
from graft_cli.eval.runner import code_prompt_spec
from graft_cli.tiny import code as C


class _Raw:
    chat_template = None


def run_cli(args):
    return subprocess.run([sys.executable, "-m", "graft_cli.cli", *args], cwd=ROOT, env=proc_env(),
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def reduced(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("tinycache"))
    return d, C.build_code(d, recipe=C.CodeRecipe.reduced())


def test_one_prompt_for_sft_training_and_evaluation():
    """The prompt the code models are trained on by SFT is the one the task overlay gives RL and the one
    `graft eval` gives a code benchmark: the problem, then a newline (no math suffix)."""
    problem = "Write a one-line Python function f(x) that returns x times 3 plus 1. Examples: f(1) == 4."
    cfg = compose(["pair=tiny", "method=saf", "task=tiny_code"])
    rl = PromptSpec.from_config(cfg.prompt).text(problem, _Raw())
    ev = code_prompt_spec(PromptSpec.from_config(compose(["pair=tiny", "method=grpo"]).prompt)).text(problem, _Raw())
    assert C.prompt_text(problem) == rl == ev == problem + "\n"


def test_the_task_overlay_sets_the_code_arm():
    cfg = compose(["pair=tiny", "method=grpo_opd", "task=tiny_code"])
    assert [(p.name, p.model, p.role) for p in cfg.policies] == [("student", "tiny_code:junior", "train"),
                                                                 ("teacher", "tiny_code:teacher", "frozen")]
    assert (cfg.data.train, cfg.reward.name, cfg.prompt.suffix, list(cfg.eval.benchmarks)) == (
        "tiny_code:train", "code", "", ["tiny_code"])
    # the overlay is applied after the pair and the method whatever the order of the overrides
    assert compose(["task=tiny_code", "method=grpo_opd", "pair=tiny"]).data.train == "tiny_code:train"


def test_reduced_build_is_reused_and_reproducible(reduced, tmp_path):
    d, paths = reduced
    man = C.read_manifest(d)
    assert man["version"] == C.CODE_VERSION and set(man["hashes"]) == {"junior", "teacher"}
    assert man["hashes"]["junior"] != man["hashes"]["teacher"]
    assert man["models"]["junior"]["steps"] == C.CodeRecipe.reduced().junior_step
    for k in ("train", "eval"):
        recs = [json.loads(x) for x in open(paths[k])]
        assert recs and {"id", "problem", "answer", "solution", "family"} <= set(recs[0])
    mtime = os.path.getmtime(os.path.join(d, "code", "manifest.json"))
    assert C.build_code(d, recipe=C.CodeRecipe.reduced()) == paths  # reused, not rebuilt
    assert os.path.getmtime(os.path.join(d, "code", "manifest.json")) == mtime
    again = str(tmp_path / "again")
    C.build_code(again, recipe=C.CodeRecipe.reduced())
    assert C.read_manifest(again)["hashes"] == man["hashes"]  # same seed and recipe: the same weights


def test_the_code_tokenizer_keeps_programs_short(reduced):
    from transformers import AutoTokenizer

    _, paths = reduced
    tok = AutoTokenizer.from_pretrained(paths["junior"])
    recs = [json.loads(x) for x in open(paths["train"])][:64]
    lens = [len(tok(reference_response(r), add_special_tokens=False)["input_ids"]) for r in recs]
    assert max(lens) <= 30 < max(len(reference_response(r)) for r in recs)  # merges learnt: fewer tokens than chars
    assert tok.decode(tok(reference_response(recs[0]), add_special_tokens=False)["input_ids"]) == \
        reference_response(recs[0])


def test_tiny_code_names_and_benchmark_resolve(reduced, monkeypatch):
    from graft_cli.eval.benchmarks import resolve_benchmarks
    from graft_cli.models.loading import resolve_path

    d, paths = reduced
    monkeypatch.setattr(C, "build_code", lambda *a, **k: paths)  # the reduced build stands in for the full one
    assert resolve_path("tiny_code:teacher") == paths["teacher"]
    with pytest.raises(Exception, match="unknown tiny_code name 'student'"):
        resolve_path("tiny_code:student")
    (b,) = resolve_benchmarks(["tiny_code"])
    assert (b.name, b.kind, b.source) == ("tiny_code", "code", paths["eval"])
    assert [p.id for p in b.load()] == [json.loads(x)["id"] for x in open(paths["eval"])]


def test_saf_claims_judge_each_arm():
    """Two arms: the math arm keeps its claim keys, the code arm's are prefixed; each Δ is mean(SAF) − mean(fixed)
    of that arm's own runs (worked by hand: math 41,43 vs 40,40 -> +2.0; code 20,22,24 vs 20,20,20 -> +2.0)."""
    from graft_cli.report.saf_claims import arms, judge, measure

    cfg = {"policy": "student", "arms": [{"label": "code", "grpo": "grpo_code", "fixed": "grpo_opd_code",
                                          "saf": "saf_code", "opd_only": "opd_only_code"}]}
    recs = [{"name": n, "dir": "", "scores": {"student": {"avg": v}}} for n, v in (
        ("saf", 41.0), ("saf", 43.0), ("grpo_opd", 40.0), ("grpo_opd", 40.0),
        ("saf_code", 20.0), ("saf_code", 22.0), ("saf_code", 24.0),
        ("grpo_opd_code", 20.0), ("grpo_opd_code", 20.0), ("grpo_opd_code", 20.0))]
    (math, code) = arms(cfg)
    assert (math["label"], math["saf"], code["label"], code["saf"], code["policy"]) == (
        "math", "saf", "code", "saf_code", "student")
    m, c = judge(measure(recs, math), math)[0], judge(measure(recs, code), code)[0]
    assert m["interval"][0] == pytest.approx(2.0) and c["interval"][0] == pytest.approx(2.0)
    # code: SAF's sd 2 over 3 seeds, fixed's 0 -> se = 2/sqrt(3), df = 2 (Welch), t_0.975,2 = 4.303
    assert c["interval"][2] - c["interval"][0] == pytest.approx(4.303 * 2 / 3 ** 0.5, rel=1e-3)
    with pytest.raises(ValueError, match="label"):
        arms({"arms": [{"grpo": "x"}]})


def test_saf_report_writes_both_arms(tmp_path):
    from graft_cli.report.saf_claims import write_claims

    cfg = {"policy": "student", "arms": [{"label": "code", "grpo": "grpo_code", "fixed": "grpo_opd_code",
                                          "saf": "saf_code", "opd_only": "opd_only_code"}]}
    recs = [{"name": n, "dir": "", "scores": {"student": {"avg": v}}} for n, v in (
        ("saf", 41.0), ("saf", 43.0), ("grpo_opd", 40.0), ("grpo_opd", 41.0), ("saf_code", 20.0),
        ("saf_code", 22.0), ("grpo_opd_code", 20.0), ("grpo_opd_code", 21.0))]
    md, claims = write_claims(str(tmp_path), recs, cfg)
    assert [c["key"] for c in claims] == ["saf_beats_fixed", "fixed_collapses_entropy", "code/saf_beats_fixed",
                                          "code/fixed_collapses_entropy"]
    assert "### The math arm" in md and "### The code arm" in md
    saved = json.load(open(tmp_path / "claims.json"))
    assert set(saved["arms"]) == {"math", "code"} and saved["arms"]["code"]["measured"]["scores"]["saf_code"] == [
        20.0, 22.0]


@pytest.mark.slow
def test_a_tiny_code_grpo_run_trains_end_to_end(reduced, tmp_path):
    """GRPO on the reduced tiny code models through the task overlay: the code reward grades every answer (the
    counts add up to the batch), and the run's evaluation scores the held-out code problems."""
    _, paths = reduced
    out = tmp_path / "runs"
    ov = train_overrides({"student": paths["junior"]}, paths["train"], str(out),
                         ["task=tiny_code", "reward.timeout_s=3", "eval.every=0"])
    r = run_cli(["train", "--pair", "tiny", "--method", "grpo", "--steps", "2", "--name", "code", "--no-progress",
                 *ov])
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in open(out / "code" / "metrics.jsonl")]
    assert [x["step"] for x in rows] == [1, 2]
    for row in rows:  # 4 prompts x 4 samples: each answer is passed, failed, without a program, or an error
        counted = sum(row.get(f"reward/code_{k}", 0) for k in ("no_program", "errors", "crashes", "timeouts"))
        assert counted <= 16 and 0.0 <= row["reward"] <= 1.0
    r = run_cli(["eval", "--run", str(out / "code"), "--benchmarks", f"tiny_code={paths['eval']}", "--samples", "1",
                 "--runs", "1", "--steps", "last"])
    assert r.returncode == 0, r.stderr[-3000:]



def test_the_tiny_saf_plan_has_a_code_arm_and_pins_its_models(tmp_path):
    """`graft reproduce --pair tiny_saf`: the code arm's runs use the task overlay and the tiny code models, the plan
    is detected as using them (so it builds them once and records their hashes), the math-only GRAFT plan is not."""
    from graft_cli.plan import execute as X
    from graft_cli.plan.spec import load_reproduce

    plan = load_reproduce("tiny_saf")
    code = [r for r in plan.runs if r.name.endswith("_code")]
    # GRPO once, fixed fusion and SAF on the 5 seeds the plan budgets for the code arm
    assert sorted({r.name for r in code}) == ["grpo_code", "grpo_opd_code", "saf_code"] and len(code) == 11
    assert all("task=tiny_code" in r.overrides for r in code)
    assert plan.eval_for(code[0]).benchmarks == ["tiny_code"]
    assert all(plan.eval_for(r).bench_runs == {"tiny_code": 2} for r in code)  # not the math arm's small sets
    assert [a["label"] for a in plan.claims["arms"]] == ["code"]
    assert X.uses_tiny(plan, str(tmp_path), "tiny_code")
    assert not X.uses_tiny(load_reproduce("tiny"), str(tmp_path), "tiny_code")
