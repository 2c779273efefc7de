"""Stopping from outside, as a cluster scheduler does: SIGTERM to `graft train` abandons the
step (or, with run.save_on_signal, finishes and checkpoints it) and exits 143 in one line; SIGTERM to a plan with
two jobs stops every worker and reward process within 10 s; a plan whose parent is SIGKILLed loses its workers
within seconds; every run resumes. Real processes on random tiny models (conftest); the slow group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, gone_within, make_random_model, proc_env, tree, write_problems

pytestmark = pytest.mark.slow
GRAFT = [sys.executable, "-m", "graft_cli.cli"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("signals")
    return {"a": make_random_model(str(d / "a"), "qwen3", 0, sft_steps=20),
            "data": write_problems(str(d / "train.jsonl")), "root": d}


def train_args(s, out, name, steps, extra=()):
    return ["train", "--steps", str(steps), "--no-progress", "--out", out, "--name", name,
            f"policies=[{{name: a, model: '{s['a']}'}}]", f"data.train={s['data']}", "data.prompt_batch=4",
            "algo.minibatch_prompts=2", "rollout.n=4", "rollout.max_new_tokens=10", "reward.num_workers=2",
            "run.save_every=2", "optim.lr=1e-3", *extra]


def wait_for_rows(path: str, n: int, proc, timeout_s: float = 240.0) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(path) and sum(1 for x in open(path) if x.strip()) >= n:
            return
        time.sleep(0.1)
    raise AssertionError(f"{path} never held {n} rows")


@pytest.mark.parametrize("save", [False, True])
def test_sigterm_stops_train_cleanly_and_the_rerun_continues(setup, tmp_path, save):
    out = str(tmp_path / "runs")
    extra = ["run.save_on_signal=true"] if save else []
    proc = subprocess.Popen(GRAFT + train_args(setup, out, "t", 40, extra), cwd=ROOT, env=proc_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    run = os.path.join(out, "t")
    wait_for_rows(os.path.join(run, "metrics.jsonl"), 3, proc)  # three steps done: one checkpoint (step 2)
    family = tree(proc.pid) | {proc.pid}
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    gone_within(family, 10)
    assert proc.returncode == 143, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and last.startswith("error: stopped by SIGTERM"), last
    from graft_cli.train import checkpoint as ckpt

    steps = ckpt.valid_steps(os.path.join(run, "checkpoints"))
    rows = [json.loads(x) for x in open(os.path.join(run, "metrics.jsonl")) if x.strip()]
    if save:  # the step in progress was finished and checkpointed
        assert f"after step {rows[-1]['step']}; its checkpoint is written" in last
        assert steps[-1] == rows[-1]["step"]
    else:  # abandoned: no row, no checkpoint of it; the message names the last checkpoint
        assert "which was abandoned" in last and f"the last checkpoint (step {steps[-1]}) is intact" in last
    res = subprocess.run(GRAFT + train_args(setup, out, "t", steps[-1] + 2), cwd=ROOT, env=proc_env(),
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"resumed from step {steps[-1]}" in res.stderr
    done = [json.loads(x)["step"] for x in open(os.path.join(run, "metrics.jsonl")) if x.strip()]
    assert done == list(range(1, steps[-1] + 3))  # every step once, nothing repeated or lost


def plan_file(s, tmp_path) -> str:
    ov = {"policies": f"[{{name: a, model: '{s['a']}'}}]", "data.train": s["data"], "data.prompt_batch": 4,
          "algo.minibatch_prompts": 2, "rollout.n": 4, "rollout.max_new_tokens": 10, "reward.num_workers": 2,
          "run.save_every": 2, "optim.lr": 1e-3}
    import yaml

    p = tmp_path / "stopme.yaml"
    p.write_text(yaml.safe_dump({"name": "stopme", "pair": "tiny", "steps": 24, "jobs": 2, "overrides": ov,
                                 "eval": {"enabled": False}, "seeds": [0],
                                 "runs": [{"name": "g1", "method": "grpo"}, {"name": "g2", "method": "grpo",
                                                                             "overrides": ["optim.lr=2e-3"]}]}))
    return str(p)


def _plan_runs(out):
    return [os.path.join(out, d) for d in sorted(os.listdir(out)) if os.path.isdir(os.path.join(out, d))
            and os.path.exists(os.path.join(out, d, "metrics.jsonl"))]


@pytest.mark.parametrize("how", ["sigterm", "sigkill_parent"])
def test_a_two_job_plan_stops_every_process_and_resumes(setup, tmp_path, how):
    out = str(tmp_path / "plan")
    cmd = GRAFT + ["reproduce", "--pair", plan_file(setup, tmp_path), "--out", out, "--jobs", "2", "--no-report",
                   "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=proc_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:  # both workers have trained a step
        runs = _plan_runs(out) if os.path.isdir(out) else []
        if len(runs) == 2 and all(sum(1 for _ in open(os.path.join(r, "metrics.jsonl"))) >= 2 for r in runs):
            break
        time.sleep(0.2)
    family = tree(proc.pid)
    assert len(family) >= 4, family  # two workers, their reward processes
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 143, err[-2000:]
        assert "plan stopme stopped by SIGTERM: 2 running run(s) interrupted" in err.strip().splitlines()[-1]
    else:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    took = gone_within(family, 10)
    assert took < 10
    res = subprocess.run(cmd, cwd=ROOT, env=proc_env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    for r in _plan_runs(out):
        steps = [json.loads(x)["step"] for x in open(os.path.join(r, "metrics.jsonl")) if x.strip()]
        assert steps == list(range(1, 25)), (r, steps[:5], len(steps))
