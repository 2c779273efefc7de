"""Rollouts sampled ahead with bounded staleness (graft_cli/train/rollouts.py, ``run.staleness``): the version table,
the refusal of older rows, k = 1 collecting exactly the rows its versions imply, resolution and refusals of the
config, and a run killed at any moment resuming to the uninterrupted run's metrics and weights."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pandas as pd
import pytest
import torch
from conftest import ROOT, method_args, metric_rows, proc_env, train_overrides

from graft_cli.config import compose
from graft_cli.errors import GraftError
from graft_cli.train.rollouts import RolloutStream, check_staleness


@pytest.mark.parametrize("k,versions", [
    (0, [0, 1, 2, 3, 4]),
    (1, [0, 0, 1, 2, 3]),
    (2, [0, 0, 0, 1, 2]),
])
def test_rows_sampled_k_steps_behind_are_accepted_with_their_age(k, versions):
    """v(t) = max(0, t − k) by hand (docs/async.md): each step's rows are accepted, aged t − v."""
    assert [check_staleness(t, v, k) for t, v in enumerate(versions)] == [t - v for t, v in enumerate(versions)]


@pytest.mark.parametrize("step,version,k", [(3, 1, 1), (5, 2, 2), (2, 3, 1), (1, 0, 0)])
def test_a_row_older_than_k_or_from_the_future_is_refused(step, version, k):
    with pytest.raises(GraftError, match=f"step {step + 1}: its rollouts were sampled with the weights of version "
                                         f"{version}"):
        check_staleness(step, version, k)


def test_the_rollout_stream_is_nothing_on_a_cpu():
    rs = RolloutStream(torch.device("cpu"))
    assert rs.stream is None and rs.mark({"a": {"w": torch.ones(2)}}) is None
    with rs.run(None):
        x = torch.ones(2) * 2
    assert x.tolist() == [2.0, 2.0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_rollout_stream_reads_the_weights_after_the_kernel_that_wrote_them():
    # the weights come out of a long matmul queued on the default stream; the rollout thread reads them on its own
    # stream: without the event it could read them before the matmul ends
    dev = torch.device("cuda")
    rs = RolloutStream(dev)
    big = torch.randn(4096, 4096, device=dev)
    weights = {"a": {"w": (big @ big @ big).sum(0)}}
    ready = rs.mark(weights)
    out = {}

    def collect():
        with rs.run(ready):
            out["w"] = (weights["a"]["w"] * 1).cpu()

    t = threading.Thread(target=collect)
    t.start()
    t.join()
    assert torch.equal(out["w"], weights["a"]["w"].cpu())


def test_staleness_resolves_pi_old_and_the_correction_and_refuses_the_rollout_logprobs_as_pi_old():
    sync = compose(["method=graft"])
    assert (sync.algo.old_logprobs, sync.algo.is_correction, sync.algo.rollout_correction.metrics) == \
        ("rollout", "none", False)
    stale = compose(["method=graft", "run.staleness=1"])
    assert (stale.algo.old_logprobs, stale.algo.is_correction, stale.algo.rollout_correction.metrics) == \
        ("trainer", "token", True)
    assert compose(["method=graft", "run.staleness=1", "algo.is_correction=sequence"]).algo.is_correction == "sequence"
    with pytest.raises(GraftError, match="algo.old_logprobs.*rollout with run.staleness=2"):
        compose(["method=graft", "run.staleness=2", "algo.old_logprobs=rollout"])
    with pytest.raises(GraftError, match="run.staleness.*must be >= 0"):
        compose(["method=graft", "run.staleness=-1"])


def _run(models, data, out, name, extra):
    from graft_cli.train.run import train

    cfg = compose(["method=graft", *train_overrides(models, data, out, ["run.steps=4", f"run.name={name}",
                                                                       "run.threads=1", *extra])])  # extra last
    return train(cfg, progress=False)


def _log(run_dir: str, policy: str, step: int) -> pd.DataFrame:
    return pd.read_parquet(os.path.join(run_dir, "rollouts", policy, f"step_{step:06d}.parquet"))


def test_k1_samples_step_t_with_the_weights_of_step_t_minus_1(tiny_models, problems_file, tmp_path):
    """GRAFT at k = 1 over 4 steps: the versions are 0, 0, 1, 2 (metrics and rollout logs). With a learning rate of
    1e-30 (below every weight's float32 spacing: the weights stay the initial ones, checked) every version is the
    initial weights, so k = 1 collects exactly the rows k = 0 collects (same seeds, same prompts, same order); with
    a real learning rate k = 1's step 2 still samples with the initial weights: its rows equal the frozen run's
    step 2, while step 2 of a k = 0 run (sampled after one update) differs."""
    prev = torch.get_num_threads()
    try:
        runs = {(k, lr): _run(tiny_models, problems_file, str(tmp_path), f"k{k}lr{lr}",
                              [f"run.staleness={k}", f"optim.lr={lr}"])
                for k, lr in ((0, 1e-30), (1, 1e-30), (1, 1e-2), (0, 1e-2))}
    finally:
        torch.set_num_threads(prev)
    from safetensors.torch import load_file

    for p in ("a", "b"):  # the frozen runs' weights are the initial ones
        init = load_file(os.path.join(tiny_models[p], "model.safetensors"))
        last = load_file(os.path.join(runs[1, 1e-30], "checkpoints", "step_000004", p, "model.safetensors"))
        assert all(torch.equal(last[k], init[k]) for k in init if k in last) and set(last) <= set(init)
    rows = metric_rows(runs[1, 1e-2])
    assert [r["async/version"] for r in rows] == [0, 0, 0, 0, 1, 1, 2, 2]  # (step, policy) a, b per step
    assert [r["async/staleness"] for r in rows] == [0, 0, 1, 1, 1, 1, 1, 1]
    assert all("async/version" not in r for r in metric_rows(runs[0, 1e-2]))  # k = 0 writes what it always wrote
    for p in ("a", "b"):
        assert [int(_log(runs[1, 1e-2], p, s)["version"].iloc[0]) for s in (1, 2, 3, 4)] == [0, 0, 1, 2]
        assert [int(_log(runs[0, 1e-2], p, s)["version"].iloc[0]) for s in (1, 2, 3, 4)] == [0, 1, 2, 3]
        cols = ["prompt_id", "sample_index", "response", "reward"]
        for s in (1, 2, 3, 4):  # one set of weights, so k = 1 and k = 0 sample the same rows
            assert _log(runs[1, 1e-30], p, s)[cols + ["rollout_logprobs"]].equals(
                _log(runs[0, 1e-30], p, s)[cols + ["rollout_logprobs"]])
        assert _log(runs[1, 1e-2], p, 2)[cols].equals(_log(runs[0, 1e-30], p, 2)[cols])
    moved = [not _log(runs[0, 1e-2], p, 2)["response"].equals(_log(runs[0, 1e-30], p, 2)["response"]) for p in "ab"]
    assert any(moved)  # the update of step 1 changed what k = 0 samples at step 2 (so the equality above is k = 1's)


def test_k1_with_the_policies_on_two_threads_equals_one_after_the_other(tiny_models, problems_file, tmp_path):
    """At k = 1 the policies sample ahead on a pool of their own while the trainer's policy threads update: two
    workers of one intra-op thread each give the metrics and rows of one worker on one thread."""
    prev = torch.get_num_threads()
    try:
        runs = {w: _run(tiny_models, problems_file, str(tmp_path), f"w{w}",
                        ["run.staleness=1", f"run.policy_workers={w}", f"run.threads={w}"]) for w in (1, 2)}
    finally:
        torch.set_num_threads(prev)
    assert metric_rows(runs[1]) == metric_rows(runs[2])
    for p in ("a", "b"):
        for s in (1, 4):
            assert _log(runs[1], p, s).equals(_log(runs[2], p, s))


GRAFT = [sys.executable, "-m", "graft_cli.cli"]


def _cli_args(models, data, out, name):
    return ["train", "--method", "graft", "--steps", "4", "--no-progress", "--out", out, "--name", name,
            *train_overrides(models, data, out, ["run.staleness=1", "run.save_every=1", "optim.lr=1e-2"])]


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["rollout:4", "update:3", "push:3"])
def test_k1_killed_during_generation_update_or_weight_push_resumes_identically(tiny_models, problems_file, tmp_path,
                                                                               fault):
    """Killed while the rollout thread generates step 4 (during step 3's update), inside step 3's update, or while
    a rollout thread loads version 2 for step 3's collection: the rerun resumes from its last checkpoint (whose
    collections in flight were stored) and ends with the uninterrupted run's metrics and weights."""
    out = str(tmp_path / "runs")
    ref = subprocess.run(GRAFT + _cli_args(tiny_models, problems_file, out, "ref"), cwd=ROOT, env=proc_env(),
                         capture_output=True, text=True)
    assert ref.returncode == 0, ref.stderr[-3000:]
    killed = subprocess.run(GRAFT + _cli_args(tiny_models, problems_file, out, "killed"), cwd=ROOT,
                            env=proc_env(GRAFT_FAULT=fault), capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr[-3000:]
    res = subprocess.run(GRAFT + _cli_args(tiny_models, problems_file, out, "killed"), cwd=ROOT, env=proc_env(),
                         capture_output=True, text=True)
    assert res.returncode == 0 and "resumed from step" in res.stderr, res.stderr[-3000:]
    a, b = os.path.join(out, "ref"), os.path.join(out, "killed")
    drop = ("time/", "memory/")
    clean = lambda rows: [{k: v for k, v in r.items() if not k.startswith(drop)} for r in rows]  # noqa: E731
    assert clean(metric_rows(b)) == clean(metric_rows(a))
    from graft_cli.rundir import sha256_file

    for p in ("a", "b"):
        w = os.path.join("checkpoints", "step_000004", p, "model.safetensors")
        assert sha256_file(os.path.join(b, w)) == sha256_file(os.path.join(a, w))



def _method_run(m, data, out, method, extra=(), partner=None):
    cmd = GRAFT + ["train", "--method", method, "--steps", "3", "--no-progress", "--out", out, "--name", "r",
                   f"data.train={data}", "data.prompt_batch=4", "algo.minibatch_prompts=2", "rollout.n=4",
                   "rollout.max_new_tokens=10", "reward.num_workers=1", "run.save_every=3", "optim.lr=1e-2",
                   *method_args(method, f"{{name: a, model: '{m['a']}'}}", f"{{name: b, model: '{m['b']}'}}",
                                m["a"], m["b"], partner), *extra]
    return subprocess.run(cmd, cwd=ROOT, env=proc_env(), capture_output=True, text=True)


# in CI: one method of each collection shape (an exchange, a stored partner, dynamic sampling, a controller and a
# frozen teacher, a co-generating engine); the rest in `make test-extended`
@pytest.mark.slow
@pytest.mark.parametrize("method", ["graft", "graft_stored", "grpo_dapo", "saf", "tandem",
                                    *(pytest.param(m, marks=pytest.mark.extended)
                                      for m in ("grpo", "grpo_kl", "hacpo", "sgt", "grpo_opd", "opd_only"))])
def test_every_method_trains_at_k1_on_the_previous_weights(tiny_models, problems_file, tmp_path, method):
    """Every method runs at run.staleness=1: each trained policy's steps 1-3 sample with versions 0, 0, 1, and π_old
    is the trainer's recompute with token TIS against the rollout log-probs (the resolved config)."""
    partner = None
    if method == "graft_stored":  # the partner's logged steps (a k = 0 GRAFT run of a and b)
        res = _method_run(tiny_models, problems_file, str(tmp_path / "partner"), "graft")
        assert res.returncode == 0, res.stderr[-3000:]
        partner = str(tmp_path / "partner" / "r")
    res = _method_run(tiny_models, problems_file, str(tmp_path / "runs"), method, ["run.staleness=1"], partner)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = metric_rows(str(tmp_path / "runs" / "r"))
    by = {}
    for r in rows:
        by.setdefault(r["policy"], []).append(r["async/version"])
    assert by and all(v == [0, 0, 1] for v in by.values()), by
    import yaml

    cfg = yaml.safe_load(open(os.path.join(tmp_path, "runs", "r", "config.yaml")))
    assert (cfg["algo"]["old_logprobs"], cfg["algo"]["is_correction"], cfg["run"]["staleness"]) == \
        ("trainer", "token", 1)
