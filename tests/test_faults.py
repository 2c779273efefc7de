"""kill -9 at every point of a step (graft_cli/faults.py: rollout, grading, scoring, update, checkpoint write,
manifest write, rename), for GRPO, GRAFT, stored-trajectory GRAFT and the stateful methods (SAF's controller,
HACPO's capability history, tandem's co-generation): each killed run, resumed, ends with the metrics and final
weights of the uninterrupted run. Real processes on random tiny models; slow group.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, make_random_model, write_problems

from graft_cli.faults import POINTS

GRAFT = [sys.executable, "-m", "graft_cli.cli"]
pytestmark = pytest.mark.slow


def _env(fault=None):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.pop("GRAFT_FAULT", None)
    if fault:
        env["GRAFT_FAULT"] = fault
    return env


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("faults")
    w = {"a": make_random_model(str(d / "a"), "qwen3", 0, sft_steps=40),
         "b": make_random_model(str(d / "b"), "llama", 1, sft_steps=40),
         "j": make_random_model(str(d / "j"), "qwen3", 7), "data": write_problems(str(d / "train.jsonl")),
         "root": d}
    base = common(w, str(d / "partner"), "p", ["--method", "grpo", f"policies=[{pol(w, 'a')}, {pol(w, 'b')}]"])
    res = subprocess.run(GRAFT + base, cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    w["partner"] = str(d / "partner" / "p")
    return w


def pol(w, name):
    return f"{{name: {name}, model: '{w[name]}'}}"


def common(w, out, name, extra):
    return ["train", "--steps", "4", "--no-progress", "--out", out, "--name", name, f"data.train={w['data']}",
            "data.prompt_batch=4", "algo.minibatch_prompts=2", "rollout.n=4", "rollout.max_new_tokens=10",
            "reward.num_workers=1", "run.save_every=2", "run.keep_checkpoints=3", "optim.lr=1e-3", *extra]


def method_args(w, method):
    two = f"policies=[{pol(w, 'a')}, {pol(w, 'b')}]"
    return {
        "grpo": ["--method", "grpo", f"policies=[{pol(w, 'a')}]"],
        "graft": ["--method", "graft", two],
        "graft_stored": ["--method", "graft_stored", f"policies=[{pol(w, 'a')}]",
                         f"exchange.params.partner_run={w['partner']}", "exchange.params.partner_policy=b"],
        "saf": ["--method", "saf", f"distill.student={pol(w, 'a')}", f"distill.teacher={w['a']}",
                "algo.controllers=[{name: saf_schedule, warmup_steps: 2, kl_delta: 0.2, anneal_steps: 2}]"],
        "hacpo": ["--method", "hacpo", two],
        "tandem": ["--method", "tandem", f"tandem.senior={pol(w, 'a')}", f"tandem.junior={w['j']}"],
    }[method]


def rows(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(x).items() if not k.startswith("time/")} for x in f if x.strip()]


def weights(run):
    ck = os.path.join(run, "checkpoints", "step_000004")
    return {p: hashlib.sha256(open(os.path.join(ck, p, "model.safetensors"), "rb").read()).hexdigest()
            for p in sorted(os.listdir(ck)) if os.path.isdir(os.path.join(ck, p))}


@pytest.fixture(scope="module")
def references(world):
    cache = {}

    def get(method):
        if method not in cache:
            out = str(world["root"] / "ref" / method)
            res = subprocess.run(GRAFT + common(world, out, "ref", method_args(world, method)), cwd=ROOT,
                                 env=_env(), capture_output=True, text=True)
            assert res.returncode == 0, res.stderr[-3000:]
            cache[method] = os.path.join(out, "ref")
        return cache[method]

    return get


# every point of a GRAFT step, and for each other method a kill mid-step; the other methods' checkpoint-write kills
# (the same checkpoint code as GRAFT's four write points) run in `make test-extended` (CI's 30-minute budget)
# (GRPO's manifest-write kill is GRAFT's checkpoint code again: extended too); the push point fires at run.staleness
# >= 1 only, where tests/test_ahead.py kills at it
CASES = ([("graft", p) for p in POINTS if p != "push"] + [("grpo", "update"), pytest.param("grpo", "manifest",
                                                                             marks=pytest.mark.extended)]
         + [(m, "score") for m in ("graft_stored", "saf", "hacpo", "tandem")]
         + [pytest.param(m, "checkpoint", marks=pytest.mark.extended) for m in ("graft_stored", "saf", "hacpo",
                                                                                 "tandem")])


@pytest.mark.parametrize("method,point", CASES)
def test_kill_at_a_point_then_resume_gives_the_uninterrupted_run(world, references, tmp_path, method, point):
    ref = references(method)
    out = str(tmp_path / "runs")
    step = 4 if point in ("checkpoint", "manifest", "rename") else 3  # a checkpoint write, or mid-step 3
    cmd = GRAFT + common(world, out, "k", method_args(world, method))
    killed = subprocess.run(cmd, cwd=ROOT, env=_env(f"{point}:{step}"), capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr[-2000:]
    run = os.path.join(out, "k")
    assert not os.path.exists(os.path.join(run, "checkpoints", "step_000004", "COMPLETE"))
    res = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert res.returncode == 0 and "resumed from step 2" in res.stderr, res.stderr[-3000:]
    assert rows(run) == rows(ref)
    assert weights(run) == weights(ref)
    assert not [d for d in os.listdir(os.path.join(run, "checkpoints")) if ".tmp-" in d]  # stale temp folder gone
    shutil.rmtree(out)
