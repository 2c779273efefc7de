"""SAF-OPD's evaluation as released and reported (opd_saf.md §4-5): validation every 10 steps,
n = 32 at T 1.0 / top-p 1.0 on AIME24 and AIME25; the final evaluation adds HMMT25 February and November at
avg@32; the released evaluation prompt. The released strings are written out here from kissshhot/SAF-OPD
(math_eval/eval_math.py: ``problem + "\\nPlease reason step by step, and put your final answer within
\\\\boxed{}."``; run_eval_math.sh: n 32, T 1.0, top-p 1.0, max_tokens 16384, seed 42)."""

from __future__ import annotations

import json
import os

import pytest
from conftest import train_overrides

from graft_cli.config import compose
from graft_cli.data.prompts import PromptSpec
from graft_cli.eval.setup import EvalSettings, eval_prompt_spec, final_settings
from graft_cli.eval.runner import prepare_folder

RELEASED_SUFFIX = "Please reason step by step, and put your final answer within \\boxed{}."
SAF_PAIRS = ("saf_qwen3_1p7b", "saf_qwen3_4b", "saf_qwen3_8b")


class ChatTok:
    """A tokenizer with a chat template that returns the user message as it is (the content under test)."""
    chat_template = "stub"

    def apply_chat_template(self, messages, **kw):
        assert kw["enable_thinking"] is False and kw["add_generation_prompt"] is True
        return messages[0]["content"]


@pytest.mark.parametrize("pair", SAF_PAIRS)
def test_saf_pairs_evaluate_as_released(pair):
    cfg = compose([f"pair={pair}", "method=saf"])
    e = cfg.eval
    assert (e.every, list(e.benchmarks), e.samples, e.runs, e.temperature, e.top_p) == (
        10, ["aime24", "aime25"], 32, 1, 1.0, 1.0)
    # the final evaluation: the same sampling (so it reuses a validated step's AIME samples), HMMT25 added,
    # one run of 32 samples (avg@32 = the pass@1 mean over them), 16,384 new tokens, seed 42
    assert list(e.final.benchmarks) == ["aime24", "aime25", "hmmt25_feb", "hmmt25_nov"]
    assert final_settings(cfg) == EvalSettings(runs=1, samples=32, temperature=1.0, top_p=1.0, max_new_tokens=16384,
                                               seed=42)
    problem = "Find $x$."
    assert eval_prompt_spec(cfg).text(problem, ChatTok()) == problem + "\nPlease reason step by step, and put " \
                                                                       "your final answer within \\boxed{}."
    # training prompts are not the evaluation's (prompt.suffix untouched)
    assert PromptSpec.from_config(cfg.prompt).text(problem, ChatTok()) == f"{problem} {cfg.prompt.suffix}"
    # options given on the command line still win
    s = final_settings(cfg, runs=2, samples=4, temperature=0.6, top_p=0.95, max_new_tokens=100, seed=0)
    assert s == EvalSettings(runs=2, samples=4, temperature=0.6, top_p=0.95, max_new_tokens=100, seed=0)


def test_defaults_without_final_section():
    """A pair without eval.final: `graft eval --run` as before (5 runs, the validation's sampling)."""
    cfg = compose(["pair=tiny", "method=graft"])
    assert final_settings(cfg) == EvalSettings(runs=5, samples=8, temperature=0.6, top_p=0.95,
                                               max_new_tokens=cfg.rollout.max_new_tokens, seed=0)
    assert eval_prompt_spec(cfg) == PromptSpec.from_config(cfg.prompt)


def test_final_out_of_range_refused():
    from graft_cli.errors import GraftError

    for ov, key in (("eval.final.runs=0", "eval.final.runs"), ("eval.final.top_p=0", "eval.final.top_p"),
                    ("eval.final.samples=0", "eval.final.samples")):
        with pytest.raises(GraftError, match=key):
            compose(["pair=tiny", "method=grpo", ov])


def test_separator_in_folder_identity(tmp_path):
    """A folder made with the default separator keeps its meta.json identity (no new key); another separator is
    part of the identity, so results made with other prompts are not mixed."""
    from graft_cli.errors import GraftError

    plain = PromptSpec(RELEASED_SUFFIX)
    prepare_folder(str(tmp_path / "a"), EvalSettings(), plain, [])
    assert "separator" not in json.load(open(tmp_path / "a" / "meta.json"))["prompt"]
    nl = PromptSpec(RELEASED_SUFFIX, separator="\n")
    prepare_folder(str(tmp_path / "b"), EvalSettings(), nl, [])
    assert json.load(open(tmp_path / "b" / "meta.json"))["prompt"]["separator"] == "\n"
    with pytest.raises(GraftError, match="separator"):
        prepare_folder(str(tmp_path / "b"), EvalSettings(), plain, [])


def test_validation_then_final_evaluation(tiny_models, problems_file, tmp_path):
    """One policy, one step validated on `arith` with the evaluation suffix; `graft eval --run` (no options)
    then takes eval.final: the validated samples are reused (same file, untouched), the added benchmark is
    evaluated, one run; both with the evaluation prompt, not the training one."""
    from graft_cli.eval.validation import ValidationHook
    from graft_cli.eval.runner import EvalOptions, evaluate_run
    from graft_cli.train.run import train

    extra = tmp_path / "extra.jsonl"
    extra.write_text("".join(json.dumps({"id": f"x{i}", "problem": f"{i}+1=?", "answer": str(i + 1)}) + "\n"
                             for i in range(2)))
    cfg = compose(train_overrides({"a": tiny_models["a"]}, problems_file, str(tmp_path / "runs"),
                                  ["run.steps=1", "run.name=v", "eval.every=1", "eval.samples=2",
                                   f"eval.benchmarks=[arith={problems_file}]", "eval.max_new_tokens=4",
                                   f"eval.prompt_suffix='{RELEASED_SUFFIX}'",
                                   f"eval.final.benchmarks=[arith={problems_file},extra={extra}]",
                                   "eval.final.runs=1"]))
    run = train(cfg, progress=False, after_step=(ValidationHook(),))
    d = os.path.join(run, "eval", "a", "step_000001")
    f1 = os.path.join(d, "arith_run1.jsonl")
    m1 = os.path.getmtime(f1)
    meta = json.load(open(os.path.join(d, "meta.json")))
    assert meta["prompt"]["suffix"] == RELEASED_SUFFIX and cfg.prompt.suffix != RELEASED_SUFFIX
    res = evaluate_run(EvalOptions(run_dir=run, steps="1", workers=1, progress=False))
    assert os.path.getmtime(f1) == m1  # reused
    s = res["a"][1]
    assert set(s["benchmarks"]) == {"arith", "extra"} and s["benchmarks"]["extra"]["num_runs"] == 1
    assert not os.path.exists(os.path.join(d, "arith_run2.jsonl"))  # eval.final.runs = 1, not 5
