"""End-to-end: `graft train` through the CLI on two small random models (different architectures),
checking the files it writes; and a real process kill after a checkpoint, then resume, ending with
metrics identical to an uninterrupted run."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
from conftest import ROOT, train_overrides

GRAFT = [sys.executable, "-m", "graft_cli.cli"]
TIME_KEYS = ("time/",)


def run_cli(args, **kw):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(GRAFT + args, cwd=ROOT, env=env, capture_output=True, text=True, **kw)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_train_cli_writes_run_directory(tiny_models, problems_file, tmp_path):
    out = tmp_path / "runs"
    r = run_cli(["train", "--pair", "tiny", "--method", "grpo", "--steps", "2", "--name", "e2e", "--no-progress",
                 *train_overrides(tiny_models, problems_file, str(out))])
    assert r.returncode == 0, r.stderr[-3000:]
    run = out / "e2e"
    assert str(run) in r.stderr + r.stdout  # says where it wrote its output
    # resolved config
    cfg_text = (run / "config.yaml").read_text()
    assert "method: grpo" in cfg_text and "prompt_batch: 4" in cfg_text
    # metrics: one line per step and policy, TRL names, finite losses
    rows = read_jsonl(run / "metrics.jsonl")
    assert [(r["step"], r["policy"]) for r in rows] == [(1, "a"), (1, "b"), (2, "a"), (2, "b")]
    for row in rows:
        for key in ("reward", "reward_std", "frac_reward_zero_std", "completions/mean_length", "clip_ratio/low_mean",
                    "clip_ratio/high_mean", "entropy", "grad_norm", "loss", "time/rollout", "time/reward",
                    "time/old_logprob", "time/update", "sampling/sampling_logp_difference/mean"):
            assert key in row, key
        assert math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"])
        assert row["sampling/sampling_logp_difference/max"] < 1e-3  # fp32: rollout == trainer
    # rollouts: prompt_batch 4 x n 4 rows per policy and step
    for pol in ("a", "b"):
        for step in (1, 2):
            df = pd.read_parquet(run / "rollouts" / pol / f"step_{step:06d}.parquet")
            assert len(df) == 16
            assert set(df.columns) >= {"prompt_id", "sample_index", "response", "token_ids", "rollout_logprobs",
                                       "reward", "advantage"}
            assert (df.groupby("prompt_id").size() == 4).all()
            assert all(len(t) == len(lp) for t, lp in zip(df.token_ids, df.rollout_logprobs))
    # checkpoints: complete, loadable with the Auto classes
    ck = run / "checkpoints" / "step_000002"
    assert (ck / "COMPLETE").exists() and (ck / "state.json").exists() and (ck / "MANIFEST.json").exists()
    assert not list(run.rglob("*.pkl")) and not (ck / "state.pt").exists()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for pol in ("a", "b"):
        assert (ck / pol / "optimizer.pt").exists()
        AutoModelForCausalLM.from_pretrained(ck / pol)
        AutoTokenizer.from_pretrained(ck / pol)


def test_train_cli_bad_option_is_one_line(tmp_path):
    r = run_cli(["train", "--pair", "tiny", "algo.clip_low=-1"])
    assert r.returncode == 2
    lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and "algo.clip_low" in lines[0], r.stderr


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith(TIME_KEYS)} for r in rows]


@pytest.mark.slow
@pytest.mark.extended  # the same kill (after step 2's checkpoint) as test_faults' every-point GRAFT matrix
def test_kill_and_resume_matches_uninterrupted_run(tiny_models, problems_file, tmp_path):
    base = train_overrides(tiny_models, problems_file, str(tmp_path / "runs"), ["run.save_every=2"])
    args = ["train", "--steps", "4", "--no-progress", *base]
    ref = run_cli([*args, "run.name=ref"])
    assert ref.returncode == 0, ref.stderr[-3000:]

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(GRAFT + [*args, "run.name=killed"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    marker = tmp_path / "runs" / "killed" / "checkpoints" / "step_000002" / "COMPLETE"
    deadline = time.time() + 300
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "no checkpoint at step 2 before the run ended"
    os.killpg(proc.pid, signal.SIGKILL)  # a real kill of the run and its reward workers
    proc.wait()
    partial = read_jsonl(tmp_path / "runs" / "killed" / "metrics.jsonl")
    assert len(partial) < 8

    res = run_cli([*args, "run.name=killed"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resumed from step" in res.stderr
    got = _strip(read_jsonl(tmp_path / "runs" / "killed" / "metrics.jsonl"))
    # the policies really learn (non-zero updates), so equality is not trivial
    assert sum(r["grad_norm"] > 0 for r in got) >= 4 and len({r["reward"] for r in got}) > 1
    want = _strip(read_jsonl(tmp_path / "runs" / "ref" / "metrics.jsonl"))
    assert [(r["step"], r["policy"]) for r in got] == [(s, p) for s in (1, 2, 3, 4) for p in ("a", "b")]
    assert got == want


def test_tiny_names_resolve_to_models_and_task_files(tmp_path, monkeypatch):
    """pair=tiny uses `tiny:a` (a model folder, built on first use) and `tiny:train` (the task's train.jsonl, which
    needs the task alone: ensure_task)."""
    from graft_cli.tiny import build as tiny_build
    from graft_cli.errors import GraftError
    from graft_cli.models.loading import resolve_path

    task = tmp_path / "task"
    task.mkdir()
    (task / "train.jsonl").write_text("")
    paths = {"a": str(tmp_path / "a"), "b": str(tmp_path / "b"), "task": str(task)}
    monkeypatch.setattr(tiny_build, "ensure_tiny", lambda *a, **k: paths)
    monkeypatch.setattr(tiny_build, "ensure_task", lambda *a, **k: str(task))
    assert resolve_path("tiny:a") == paths["a"]
    assert resolve_path("tiny:train") == str(task / "train.jsonl")
    assert resolve_path("/some/model") == "/some/model"
    with pytest.raises(GraftError, match="unknown tiny name 'nope'"):
        resolve_path("tiny:nope")


def test_second_process_on_same_run_dir_is_refused(tmp_path):
    import fcntl

    from graft_cli.errors import GraftError
    from graft_cli.train.run import _lock_run_dir

    run = tmp_path / "run"
    run.mkdir()
    holder = open(run / ".lock", "w")  # another process's lock (flock is per open file description)
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with pytest.raises(GraftError, match="another graft process"):
        _lock_run_dir(str(run))
    holder.close()
    _lock_run_dir(str(run))  # free again once the holder is gone
