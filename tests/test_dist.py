"""Data-parallel training (train/dist.py) on CPU: 2 processes (gloo, torch.distributed.run) vs 1 process on the
same data (a deterministic fake rollout engine). One step must give the same parameters on every rank, equal
(allclose) to the single-process ones, and the same metrics. Covers the rollout split + gather, the sharded
old-log-prob pass, the per-rank minibatch shards with the global Normaliser, the gradient all-reduce, and
the truncated IS correction (sampler log-probs are fake, so the weights are far from 1)."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, make_random_model, write_problems

WORKER = os.path.join(ROOT, "tests", "dist_worker.py")
pytestmark = pytest.mark.slow  # ~1 min: three fresh Python processes importing torch + transformers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd, out, **extra_env):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "ACCELERATE_USE_FSDP", "GRAFT_FSDP"):
        env.pop(k, None)
    env.update(extra_env)
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    return {int(f[4:-3]): torch.load(os.path.join(out, f), weights_only=False)
            for f in os.listdir(out) if f.startswith("rank") and f.endswith(".pt")}


@pytest.mark.parametrize("method", ["graft_nogate"])  # self rows (the GRPO path) + admitted peer rows
def test_two_processes_equal_one(tmp_path, method):
    a = make_random_model(str(tmp_path / "a"), "qwen3", 0)
    b = make_random_model(str(tmp_path / "b"), "llama", 1)
    data = write_problems(str(tmp_path / "train.jsonl"))
    extra = [f"method={method}", "algo.is_correction=token", "optim.micro_batch_tokens=60",
             "optim.sort_micro_batches=false",  # the same accumulation order in one process and in the shards
             "optim.shared_prefix=false"]  # FSDP runs the full pass: the one-process run must too (float order)
    one = _run([sys.executable, WORKER, str(tmp_path / "one"), a, b, data, *extra], tmp_path / "one")
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
              "--master_port", str(_free_port())]
    two = _run([*launch, WORKER, str(tmp_path / "two"), a, b, data, *extra], tmp_path / "two")
    launch[-1] = str(_free_port())
    fsdp = _run([*launch, WORKER, str(tmp_path / "fsdp"), a, b, data, *extra], tmp_path / "fsdp", GRAFT_FSDP="1")
    assert set(one) == {0} and set(two) == {0, 1} and set(fsdp) == {0, 1}
    assert one[0]["world"] == 1 and two[0]["world"] == 2 and two[0]["mode"] == "replicate"
    assert fsdp[0]["mode"] == "fsdp"
    p1 = one[0]["params"]
    for run in (two, fsdp):
        for r in (0, 1):
            for pol, sd in run[r]["params"].items():
                for k, v in sd.items():
                    assert torch.allclose(v, p1[pol][k], atol=1e-6, rtol=1e-5), (r, pol, k)
    # the step changed the weights (the test is not vacuous)
    init = make_random_model(str(tmp_path / "a0"), "qwen3", 0)
    from transformers import AutoModelForCausalLM

    sd0 = AutoModelForCausalLM.from_pretrained(init).state_dict()
    assert max(float((p1["a"][k] - sd0[k]).abs().max()) for k in sd0) > 1e-5
    rows1 = one[0]["rows"]
    pairs = [(r1, r2) for run in (two, fsdp) for r1, r2 in zip(rows1, run[0]["rows"])]
    assert len(pairs) == 2 * len(rows1) and all(r1["policy"] == r2["policy"] for r1, r2 in pairs)
    for r1, r2 in pairs:
        keys = {k for k in r1 if not k.startswith("time/")}
        assert keys == {k for k in r2 if not k.startswith("time/")}
        assert "sampling/importance_sampling_ratio/mean" in keys and "loss" in keys
        assert r1["graft/admitted"] > 0 and r1["sampling/importance_sampling_ratio/max"] > 1.0  # not vacuous
        for k in keys:
            v1, v2 = r1[k], r2[k]
            if isinstance(v1, float) and math.isnan(v1):
                assert math.isnan(v2), k
            elif isinstance(v1, float):
                assert math.isclose(v1, v2, rel_tol=1e-5, abs_tol=1e-7), (k, v1, v2)
            else:
                assert v1 == v2, (k, v1, v2)


@pytest.mark.slow
def test_frozen_reference_and_kl_two_processes_equal_one(tmp_path):
    """KL-regularised GRPO: each policy's frozen initial weights are loaded as a second model (sharded under
    FSDP like the policies), scored on row shards and gathered; the step equals the one-process step."""
    a = make_random_model(str(tmp_path / "a"), "qwen3", 0)
    b = make_random_model(str(tmp_path / "b"), "llama", 1)
    data = write_problems(str(tmp_path / "train.jsonl"))
    # unsorted micro-batches: the rows then accumulate in the same order in one process and in the two shards
    # (sorting each shard by length changes only the float order, but Adam turns ~1e-9 gradient noise on
    # unused embedding rows into lr-sized sign flips, beyond this test's tolerance)
    extra = ["method=grpo_kl", "algo.kl_coef=0.5", "optim.micro_batch_tokens=60", "optim.sort_micro_batches=false",
             "optim.shared_prefix=false"]  # FSDP's full pass in every run (the shared prefix reorders sums)
    one = _run([sys.executable, WORKER, str(tmp_path / "one"), a, b, data, *extra], tmp_path / "one")
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
              "--master_port", str(_free_port())]
    fsdp = _run([*launch, WORKER, str(tmp_path / "fsdp"), a, b, data, *extra], tmp_path / "fsdp", GRAFT_FSDP="1")
    assert fsdp[0]["mode"] == "fsdp" and set(fsdp) == {0, 1}
    for r in (0, 1):
        for pol, sd in fsdp[r]["params"].items():
            for k, v in sd.items():
                assert torch.allclose(v, one[0]["params"][pol][k], atol=1e-6, rtol=1e-5), (r, pol, k)
    for r1, r2 in zip(one[0]["rows"], fsdp[0]["rows"]):
        assert r1["kl"] > 0 and math.isclose(r1["kl"], r2["kl"], rel_tol=1e-5, abs_tol=1e-9)
        assert math.isclose(r1["loss"], r2["loss"], rel_tol=1e-5, abs_tol=1e-7)
