"""The paper's code runs (experiments/pair/saf_qwen3_*_code.yaml on experiments/common/saf_code.yaml) and what they
need: `graft train --dry-run` on the real configs (the seed's settings read back from its output), Eurus-2-RL-Data
rows in their own layout (chat-message prompts, the nested ground truth, the ability filter, sharded parquet), the
chat messages rendered as the prompt, and a short training run of a random model with ``reward.name=code`` on the
synthetic code task (the code reward inside the loop, its counts in metrics.jsonl)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
from conftest import ROOT, make_random_model, train_overrides

from graft_cli.config import compose
from graft_cli.data.problems import load_problems
from graft_cli.data.prompts import PromptSpec

GRAFT = [sys.executable, "-m", "graft_cli.cli"]


def run_cli(args):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(GRAFT + args, cwd=ROOT, env=env, capture_output=True, text=True)


def _dry(pair, method, capsys, *extra):
    """`graft train --dry-run`'s lines as a dict (in-process: the CLI's own function on the composed config)."""
    from graft_cli.cli import _dry_run

    _dry_run(compose([f"pair={pair}", f"method={method}", *extra]))
    out = capsys.readouterr().out
    assert out.strip().endswith("config valid; nothing loaded or written (--dry-run)")
    return dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)


def test_dry_run_cli_of_the_saf_code_run():
    r = run_cli(["train", "--pair", "saf_qwen3_4b_code", "--method", "saf", "--dry-run"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "steps: 200" in r.stdout and "config valid; nothing loaded or written (--dry-run)" in r.stdout


@pytest.mark.parametrize("method,steps,batch", [
    ("saf", "200", "128 prompts x n = 8, mini-batch 128 prompts, 1 epoch(s)"),
    ("grpo", "200", "128 prompts x n = 8, mini-batch 128 prompts, 1 epoch(s)"),
    ("grpo_opd", "200", "128 prompts x n = 8, mini-batch 128 prompts, 1 epoch(s)"),
    ("opd_only", "50", "1024 prompts x n = 1, mini-batch 128 prompts, 1 epoch(s)"),
])
def test_dry_run_of_the_code_runs(method, steps, batch, capsys):
    out = _dry("saf_qwen3_4b_code", method, capsys)
    assert out["steps"] == steps and out["batch"] == batch
    assert out["models"] == "student=Qwen/Qwen3-4B" + (", teacher=Qwen/Qwen3-30B-A3B-Instruct-2507 (frozen)"
                                                      if method != "grpo" else "")
    assert out["rollout"].startswith("max 8190 new tokens (prompts <= 2048), T 1.0, top-p 1.0")
    assert out["reward"].startswith("code (")
    assert "where {'ability': 'code'}" in out["data.train"]
    assert out["eval.final.benchmarks"].startswith("humanevalplus [code: evalplus/humanevalplus:test], mbppplus")
    assert out["eval"] == "no validation during training"
    assert ("saf_schedule" in out["algo"]) == (method == "saf")


def test_the_three_code_pairs_and_the_math_opd_only_minibatch():
    for size, model in (("1p7b", "Qwen3-1.7B"), ("4b", "Qwen3-4B"), ("8b", "Qwen3-8B")):
        cfg = compose([f"pair=saf_qwen3_{size}_code", "method=saf"])
        assert [p.model for p in cfg.policies] == [f"Qwen/{model}", "Qwen/Qwen3-30B-A3B-Instruct-2507"]
        assert cfg.reward.name == "code" and cfg.run.steps == 200 and cfg.rollout.max_new_tokens == 8190
    math = compose(["pair=saf_qwen3_4b", "method=opd_only"])  # the math pairs keep a 1,024-prompt mini-batch
    assert (math.data.prompt_batch, math.algo.minibatch_prompts, math.run.steps) == (1024, 1024, 100)
    tiny = compose(["pair=tiny", "method=opd_only"])
    assert tiny.algo.minibatch_prompts == tiny.data.prompt_batch == 512


def test_dry_run_refuses_a_missing_local_file(tmp_path, capsys, monkeypatch):
    from graft_cli.errors import GraftError

    with pytest.raises(GraftError, match="config key 'data.train': .*train-\\*.parquet: file not found"):
        _dry("saf_qwen3_4b_code", "saf", capsys, f"data.train={tmp_path}/eurus/train-*.parquet")
    with pytest.raises(GraftError, match="config key 'eval.benchmarks': unknown benchmark 'no_such_benchmark'"):
        _dry("saf_qwen3_4b_code", "saf", capsys, "eval.benchmarks=[no_such_benchmark]")
    monkeypatch.delenv("HUMANEVAL_OVERRIDE_PATH", raising=False)
    monkeypatch.delenv("GRAFT_EVAL_DIR", raising=False)
    with pytest.raises(GraftError, match="config key 'eval.benchmarks': benchmark humaneval_plus: no release file; "
                                         "set HUMANEVAL_OVERRIDE_PATH"):
        _dry("saf_qwen3_4b_code", "saf", capsys, "eval.benchmarks=[humaneval_plus]", f"eval.data_dir={tmp_path}")


def _eurus_rows(n0: int) -> list[dict]:
    gt = json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})
    return [{"data_source": "codecontests", "ability": "code" if i % 2 == 0 else "math",
             "prompt": [{"role": "system", "content": "Think in [ASSESS] steps."},
                        {"role": "user", "content": f"Write Python code to solve the task.\nTask {n0 + i}"}],
             "reward_model": {"style": "rule", "ground_truth": gt if i % 2 == 0 else "42"},
             "extra_info": {"index": n0 + i}} for i in range(4)]


def test_eurus_rows_in_their_own_layout(tmp_path):
    d = tmp_path / "eurus2-rl-code"
    d.mkdir()
    for k in range(2):  # two shards, as S0's seven
        pd.DataFrame(_eurus_rows(10 * k)).to_parquet(d / f"train-0000{k}-of-00002.parquet")
    probs = load_problems(str(d / "train-*.parquet"), {"problem": "prompt", "answer": "reward_model.ground_truth"},
                          {"ability": "code"})
    assert [p.id for p in probs] == ["train-00000-of-00002.parquet:0", "train-00000-of-00002.parquet:2",
                                     "train-00001-of-00002.parquet:0", "train-00001-of-00002.parquet:2"]
    assert json.loads(probs[0].answer) == {"inputs": ["1 2\n"], "outputs": ["3\n"]}
    msgs = json.loads(probs[0].problem)
    assert [m["role"] for m in msgs] == ["system", "user"] and msgs[1]["content"].endswith("Task 0")

    class ChatTok:
        chat_template = "yes"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt, enable_thinking):
            return "|".join(f"{m['role']}:{m['content']}" for m in messages) + "|assistant:"

    text = PromptSpec(suffix="").text(probs[0].problem, ChatTok())
    assert text == "system:Think in [ASSESS] steps.|user:Write Python code to solve the task.\nTask 0|assistant:"
    raw = PromptSpec(suffix="", chat_template="none", raw_template="{problem}{suffix}").text(probs[0].problem, None)
    assert raw == "Think in [ASSESS] steps.\n\nWrite Python code to solve the task.\nTask 0"
    assert PromptSpec().text("1+1", ChatTok()).startswith("user:1+1 Let's think step by step")  # plain problems


@pytest.mark.slow
def test_training_with_the_code_reward(tmp_path):
    from graft_cli.data.synthetic_code import write_task

    paths = write_task(str(tmp_path / "task"), seed=0, n_train=16, n_eval=2)
    model = make_random_model(str(tmp_path / "m"))
    out = tmp_path / "runs"
    r = run_cli(["train", "--pair", "tiny", "--method", "grpo", "--steps", "2", "--name", "code", "--no-progress",
                 *train_overrides({"a": model}, paths["train"], str(out),
                                  ["reward.name=code", "reward.timeout_s=3", "prompt.suffix=''"])])
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in open(out / "code" / "metrics.jsonl")]
    assert [x["step"] for x in rows] == [1, 2]
    for row in rows:  # a random model writes no fenced program: every answer is counted as such
        assert row["reward/code_no_program"] + row["reward/code_errors"] + row["reward/code_crashes"] == 16
        assert {"reward/code_timeouts", "reward/code_time_mean_s", "reward/code_time_max_s"} <= set(row)
