"""Data-parallel training (train/dist.py) on CPU: 2 processes (gloo, torch.distributed.run) vs 1 process on the
same data (a deterministic fake rollout engine). One step must give the same parameters on every rank, equal
(allclose) to the single-process ones, and the same metrics. Covers the rollout split + gather, the sharded
old-log-prob pass, the per-rank minibatch shards with the global Normaliser, the gradient all-reduce, and
the truncated IS correction (rollout log-probs are fake, so the weights are far from 1)."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import ROOT, make_random_model, metric_rows, proc_env, tree, write_problems

from graft_cli.rollout.vllm_launch import free_port
from graft_cli.rundir import sha256_file

WORKER = os.path.join(ROOT, "tests", "dist_worker.py")
pytestmark = pytest.mark.slow  # ~1 min: three fresh Python processes importing torch + transformers


def _run(cmd, out, **extra_env):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "ACCELERATE_USE_FSDP", "GRAFT_FSDP"):
        env.pop(k, None)
    env.update(extra_env)
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    return {int(f[4:-3]): torch.load(os.path.join(out, f), weights_only=False)
            for f in os.listdir(out) if f.startswith("rank") and f.endswith(".pt")}


def _run_nodes(nnodes: int, args: list, out) -> dict:
    """``nnodes`` torchrun agents (one process each) started together on localhost and joined through the c10d
    rendezvous (``--rdzv-backend c10d --rdzv-endpoint HOST:PORT``), as one agent per node does on a cluster."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "ACCELERATE_USE_FSDP", "GRAFT_FSDP"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc_per_node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "graft-test",
           "--max-restarts", "0", *args]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(nnodes)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (o, e) in zip(procs, outs):
        assert p.returncode == 0, (o[-2000:], e[-4000:])
    return {int(f[4:-3]): torch.load(os.path.join(out, f), weights_only=False)
            for f in os.listdir(out) if f.startswith("rank") and f.endswith(".pt")}


def _one_two_fsdp(tmp_path, a: str, b: str, data: str, extra: list) -> tuple[dict, dict, dict]:
    """One step of the worker in one process, in two replicated processes and in two FSDP2 processes."""
    one = _run([sys.executable, WORKER, str(tmp_path / "one"), a, b, data, *extra], tmp_path / "one")
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
              "--master_port", str(free_port())]
    two = _run([*launch, WORKER, str(tmp_path / "two"), a, b, data, *extra], tmp_path / "two")
    launch[-1] = str(free_port())
    fsdp = _run([*launch, WORKER, str(tmp_path / "fsdp"), a, b, data, *extra], tmp_path / "fsdp", GRAFT_FSDP="1")
    return one, two, fsdp


@pytest.mark.parametrize("method", ["graft_nogate"])  # self rows (the GRPO path) + admitted peer rows
def test_two_processes_equal_one(tmp_path, method):
    a = make_random_model(str(tmp_path / "a"), "qwen3", 0)
    b = make_random_model(str(tmp_path / "b"), "llama", 1)
    data = write_problems(str(tmp_path / "train.jsonl"))
    extra = [f"method={method}", "algo.is_correction=token", "optim.micro_batch_tokens=60",
             "optim.sort_micro_batches=false",  # the same accumulation order in one process and in the shards
             "optim.shared_prefix=false"]  # FSDP runs the full pass: the one-process run must too (float order)
    one, two, fsdp = _one_two_fsdp(tmp_path, a, b, data, extra)
    # two "nodes" of one process each, joined by the c10d rendezvous as on a cluster (the
    # torchrun form of docs/scale_out.md): two torchrun agents on localhost, one output folder (a shared file system)
    nodes = _run_nodes(2, [WORKER, str(tmp_path / "nodes"), a, b, data, *extra], tmp_path / "nodes")
    assert set(nodes) == {0, 1} and nodes[0]["world"] == 2
    two_nodes_equal = all(torch.equal(nodes[r]["params"][pol][k], two[r]["params"][pol][k])
                          for r in (0, 1) for pol in two[r]["params"] for k in two[r]["params"][pol])
    assert two_nodes_equal  # the same processes, ranks and collectives as one node of two: bit-identical
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


def _assert_step_equal(one: dict, run: dict) -> None:
    """Every rank of a 2-process run holds the one-process parameters (adapters or full weights), and rank 0 logged
    its losses. Float order: two shards sum the gradient in another order, and Adam's first steps turn that ~1e-9
    noise into up to 2.5e-6 on the adapters (measured: replicated 2.5e-6, FSDP 9.5e-7) and 6.2e-6 on full weights
    (FSDP2); a step that is not the one-process step moves them by the learning rate, 1e-2."""
    p1 = one[0]["params"]
    for r in (0, 1):
        for pol, sd in run[r]["params"].items():
            assert set(sd) == set(p1[pol])
            for k, v in sd.items():
                assert torch.allclose(v, p1[pol][k], atol=1e-5, rtol=1e-5), (r, pol, k)
    for r1, r2 in zip(one[0]["rows"], run[0]["rows"]):
        assert r1["policy"] == r2["policy"]
        assert math.isclose(r1["loss"], r2["loss"], rel_tol=1e-5, abs_tol=1e-7)


def test_lora_two_processes_equal_one(tmp_path):
    """Both policies as LoRA adapters (r 4): a GRAFT step on two processes (replicated, and FSDP2 with the
    optimizer over the adapter only) gives the weights and metrics of one process, within float tolerance; the
    base stays as loaded and the adapters moved (not vacuous)."""
    a = make_random_model(str(tmp_path / "a"), "qwen3", 0)
    b = make_random_model(str(tmp_path / "b"), "llama", 1)
    data = write_problems(str(tmp_path / "train.jsonl"))
    extra = ["method=graft_nogate", "policies.0.lora.r=4", "policies.1.lora.r=4", "optim.lr=1e-2",
             "optim.micro_batch_tokens=60", "optim.sort_micro_batches=false", "optim.shared_prefix=false"]
    one, two, fsdp = _one_two_fsdp(tmp_path, a, b, data, extra)
    assert two[0]["mode"] == "replicate" and fsdp[0]["mode"] == "fsdp"
    p1 = one[0]["params"]
    for run in (two, fsdp):
        _assert_step_equal(one, run)
    lora_b = [v for k, v in p1["a"].items() if "lora_B" in k]
    assert lora_b and max(float(v.abs().max()) for v in lora_b) > 0  # the adapter trained (lora_B starts at 0)
    from transformers import AutoModelForCausalLM

    sd0 = AutoModelForCausalLM.from_pretrained(a).state_dict()
    base = {k.replace("base_model.model.", "").replace(".base_layer", ""): v for k, v in p1["a"].items()
            if "lora_" not in k}
    assert all(torch.equal(base[k], sd0[k]) for k in sd0 if k in base) and len(set(sd0) & set(base)) > 10


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_accelerate_launch_fsdp2_equals_one_process(tmp_path, lora):
    """``accelerate launch`` with an FSDP2 config (tests/fixtures/accelerate_fsdp2_cpu.yaml: the CPU twin of
    experiments/accelerate/fsdp_4gpu.yaml), full weights or both policies as LoRA adapters: graft_cli/train/dist.py
    reads the launch config from the environment and shards each policy itself; one GRAFT step gives the
    one-process weights (or adapters) and losses within the float-order tolerance of the torchrun FSDP2 test."""
    a = make_random_model(str(tmp_path / "a"), "qwen3", 0)
    b = make_random_model(str(tmp_path / "b"), "llama", 1)
    data = write_problems(str(tmp_path / "train.jsonl"))
    extra = ["method=graft_nogate", "optim.lr=1e-2", "optim.micro_batch_tokens=60", "optim.sort_micro_batches=false",
             "optim.shared_prefix=false"] + (["policies.0.lora.r=4", "policies.1.lora.r=4"] if lora else [])
    one = _run([sys.executable, WORKER, str(tmp_path / "one"), a, b, data, *extra], tmp_path / "one")
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
              os.path.join(ROOT, "tests", "fixtures", "accelerate_fsdp2_cpu.yaml"), "--main_process_port",
              str(free_port())]
    acc = _run([*launch, WORKER, str(tmp_path / "acc"), a, b, data, *extra], tmp_path / "acc")
    assert set(acc) == {0, 1} and acc[0]["world"] == 2 and acc[0]["mode"] == "fsdp"
    _assert_step_equal(one, acc)
    init = _run([sys.executable, WORKER, str(tmp_path / "init"), a, b, data, *extra, "optim.lr=1e-30"],
                tmp_path / "init")
    moved = [k for k, v in acc[0]["params"]["a"].items() if not torch.equal(v, init[0]["params"]["a"][k])]
    if lora:  # only the adapters moved (lora_B starts at 0), the base is untouched
        assert moved and all("lora_" in k for k in moved) and any("lora_B" in k for k in moved)
    else:
        assert len(moved) == len(acc[0]["params"]["a"])


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
              "--master_port", str(free_port())]
    fsdp = _run([*launch, WORKER, str(tmp_path / "fsdp"), a, b, data, *extra], tmp_path / "fsdp", GRAFT_FSDP="1")
    assert fsdp[0]["mode"] == "fsdp" and set(fsdp) == {0, 1}
    for r in (0, 1):
        for pol, sd in fsdp[r]["params"].items():
            for k, v in sd.items():
                assert torch.allclose(v, one[0]["params"][pol][k], atol=1e-6, rtol=1e-5), (r, pol, k)
    for r1, r2 in zip(one[0]["rows"], fsdp[0]["rows"]):
        assert r1["kl"] > 0 and math.isclose(r1["kl"], r2["kl"], rel_tol=1e-5, abs_tol=1e-9)
        assert math.isclose(r1["loss"], r2["loss"], rel_tol=1e-5, abs_tol=1e-7)


# ------------------------------------------------------------------------------ faults
GRAFT = [sys.executable, "-m", "graft_cli.cli"]


def _pair_args(w, steps=3, extra=()):
    """`graft train` of a two-policy GRAFT run, as each rank of a 2-process FSDP2 run runs it."""
    return ["train", "--steps", str(steps), "--no-progress", "--out", w["out"], "--name", "r", "--method", "graft",
            f"policies=[{{name: a, model: '{w['a']}'}}, {{name: b, model: '{w['b']}'}}]", f"data.train={w['data']}",
            "data.prompt_batch=4", "algo.minibatch_prompts=2", "rollout.n=4", "rollout.max_new_tokens=8",
            "reward.num_workers=1", "run.save_every=1", "run.keep_checkpoints=5", "optim.lr=1e-3", *extra]


def _launch(w, tag, fault=None, extra=(), steps=3, world=2):
    """The ranks started by hand, each in its own session, as a cluster launcher (srun) does: no torchrun agent
    that would stop the survivor for us. ``fault``: ``GRAFT_FAULT`` (``<point>:<step>@<rank>``). ``world`` 1: one
    plain process (no process group)."""
    port = free_port()
    procs = []
    for r in range(world):
        env = proc_env(WORLD_SIZE="2", RANK=str(r), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       GRAFT_FSDP="1")  # FSDP2: sharded updates; each rank writes its part of a checkpoint
        env.pop("ACCELERATE_USE_FSDP", None)
        env.pop("GRAFT_FAULT", None)
        if world == 1:
            for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GRAFT_FSDP"):
                env.pop(k)
        if fault:
            env["GRAFT_FAULT"] = fault
        log = open(os.path.join(w["logs"], f"{tag}.rank{r}.log"), "w")
        procs.append(subprocess.Popen(GRAFT + _pair_args(w, steps=steps, extra=extra), cwd=ROOT, env=env,
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    w["sessions"] += [p.pid for p in procs]
    return procs


def _ends(procs, timeout_s=300.0):
    """``[(returncode, time it ended)]`` of each rank."""
    deadline, out = time.time() + timeout_s, [None] * len(procs)
    while None in out and time.time() < deadline:
        for r, p in enumerate(procs):
            if out[r] is None and p.poll() is not None:
                out[r] = (p.returncode, time.time())
        time.sleep(0.05)
    assert None not in out, "a rank did not end"
    return out


def _log(w, tag, r):
    return open(os.path.join(w["logs"], f"{tag}.rank{r}.log")).read()


def _last_line(w, tag, r):
    text = _log(w, tag, r)
    assert "Traceback" not in text, text[-3000:]
    return text.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def pair_world(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist_faults")
    w = {"a": make_random_model(str(d / "a"), "qwen3", 0, sft_steps=40),
         "b": make_random_model(str(d / "b"), "llama", 1, sft_steps=40),
         "data": write_problems(str(d / "train.jsonl")), "logs": str(d), "sessions": []}
    return w


def test_a_killed_or_hung_rank_stops_the_other_and_the_relaunched_pair_resumes_identical(pair_world, tmp_path):
    """Issue 29 item 3, on a 2-process FSDP2 (gloo) run launched rank by rank: (A) rank 1 SIGKILLed mid-update
    (after its first optimizer step of step 2): rank 0 stops within seconds in one line, exit 75; (B) the relaunched
    pair resumes from step 1, and rank 1 hangs (SIGSTOP) after step 2's checkpoint: rank 0 stops after
    run.dist_timeout_s (10 s) instead of waiting on the collective for torch's 30 minutes; (C) relaunched, rank 0
    is SIGKILLed while writing step 3's (gathered) checkpoint: rank 1 stops in one line and the half-written folder
    is never taken for a checkpoint; (D) relaunched, the pair resumes from step 2 and ends with the metrics and
    final weights of an uninterrupted 2-process run. No process of any launch is left."""
    w = pair_world
    w["out"] = str(tmp_path / "ref")
    ref = _ends(_launch(w, "ref"))
    assert [e[0] for e in ref] == [0, 0], _log(w, "ref", 0)[-3000:]
    w["out"] = str(tmp_path / "runs")
    run = os.path.join(w["out"], "r")

    ends = _ends(_launch(w, "A", fault="update:2@1"))  # (A) a dead rank: its sockets close
    assert ends[1][0] == -9 and ends[0][0] == 75, _log(w, "A", 0)[-3000:]
    assert ends[0][1] - ends[1][1] < 20
    last = _last_line(w, "A", 0)
    assert last.startswith("error: rank 0 of 2:") and "another rank died" in last, last
    assert "1 steps done, the last checkpoint (step 1) is intact; relaunch every rank" in last, last

    procs = _launch(w, "B", extra=["run.dist_timeout_s=10"])  # (B) a hung rank: nothing closes, only the timeout
    marker = os.path.join(run, "checkpoints", "step_000002", "COMPLETE")
    deadline = time.time() + 300
    while not os.path.exists(marker) and time.time() < deadline and procs[0].poll() is None:
        time.sleep(0.05)
    assert os.path.exists(marker), _log(w, "B", 0)[-3000:]
    os.kill(procs[1].pid, signal.SIGSTOP)
    stopped = time.time()
    rc0 = procs[0].wait(timeout=120)
    waited = time.time() - stopped
    os.kill(procs[1].pid, signal.SIGKILL)
    procs[1].wait()
    assert rc0 == 75 and 8 < waited < 40, (rc0, waited, _log(w, "B", 0)[-3000:])
    last = _last_line(w, "B", 0)
    assert "did not answer within run.dist_timeout_s=10 s" in last and "(step 2) is intact" in last, last
    assert "resumed from step 1" in _log(w, "B", 0)

    ends = _ends(_launch(w, "C", fault="checkpoint:3@0"))  # (C) rank 0 dies writing its shards of a checkpoint
    assert ends[0][0] == -9 and ends[1][0] == 75, _log(w, "C", 1)[-3000:]
    assert ends[1][1] - ends[0][1] < 20
    last = _last_line(w, "C", 1)
    assert last.startswith("error: rank 1 of 2: all_gather_object failed") and "(step 2) is intact" in last, last
    assert not os.path.exists(os.path.join(run, "checkpoints", "step_000003"))

    ends = _ends(_launch(w, "D"))  # (D) the relaunched pair finishes
    assert [e[0] for e in ends] == [0, 0], _log(w, "D", 0)[-3000:]
    assert "resumed from step 2" in _log(w, "D", 0) and "resumed from step 2" in _log(w, "D", 1)
    ref_run = os.path.join(str(tmp_path / "ref"), "r")
    assert metric_rows(run) == metric_rows(ref_run)
    for pol in ("a", "b"):  # saved at 2 ranks, resumed at 2: every shard (weights and AdamW moments) identical
        for r in (0, 1):
            f = os.path.join("checkpoints", "step_000003", pol, "shards", f"rank-0000{r}-of-00002.safetensors")
            assert sha256_file(os.path.join(run, f)) == sha256_file(os.path.join(ref_run, f))
    assert not [d for d in os.listdir(os.path.join(run, "checkpoints")) if ".tmp-" in d]
    deadline = time.time() + 60  # waits until they have exited (60 s: a hang guard, not a speed bound)
    while (left := set().union(*(tree(pid) for pid in w["sessions"]))) and time.time() < deadline:
        time.sleep(0.1)
    assert not left, left  # every rank, reward worker and forkserver of every launch is gone


def test_sharded_checkpoints_resume_at_one_process_as_the_gathered_ones_do_and_export(pair_world, tmp_path):
    """Issue 32 item 3: a 2-process FSDP2 run writes each rank's part of every tensor (run.checkpoint_format auto;
    no model.safetensors, no optimizer.pt), the same run with checkpoint_format=full gathers to rank 0. The shards
    hold exactly the gathered weights and AdamW moments; both runs resumed at ONE process (the shards re-cut whole)
    continue identically, metrics and final weights; `graft export` of a sharded step is a Hugging Face folder
    whose weights are the gathered ones. (Saved at 2 and resumed at 2: the killed-rank test above, part D.)"""
    import shutil

    from safetensors.torch import load_file

    from graft_cli.models import shards
    from graft_cli.train import checkpoint as ckpt

    w = pair_world
    runs = {}
    for tag, fmt in (("S", "auto"), ("F", "full")):
        w["out"] = str(tmp_path / tag)
        ends = _ends(_launch(w, tag, extra=[f"run.checkpoint_format={fmt}"], steps=2))
        assert [e[0] for e in ends] == [0, 0], _log(w, tag, 0)[-3000:]
        runs[tag] = os.path.join(w["out"], "r")
    assert metric_rows(runs["S"]) == metric_rows(runs["F"])  # saving does not change the run
    step2 = {t: os.path.join(r, "checkpoints", "step_000002") for t, r in runs.items()}
    assert ckpt.verify(step2["S"]) is None and ckpt.verify(step2["F"]) is None
    for pol in ("a", "b"):
        sdir, fdir = os.path.join(step2["S"], pol), os.path.join(step2["F"], pol)
        assert sorted(os.listdir(os.path.join(sdir, "shards"))) == [
            "rank-00000-of-00002.json", "rank-00000-of-00002.safetensors",
            "rank-00001-of-00002.json", "rank-00001-of-00002.safetensors"]
        assert not os.path.exists(os.path.join(sdir, "model.safetensors"))
        assert not os.path.exists(os.path.join(sdir, "optimizer.pt"))
        reader = shards.ShardReader(sdir)
        gathered = load_file(os.path.join(fdir, "model.safetensors"))
        mine = reader.full_state()
        assert set(gathered) - set(mine) == {"lm_head.weight"}  # tied to the embedding: the shards hold it once
        mine["lm_head.weight"] = mine["model.embed_tokens.weight"]
        for k, v in gathered.items():
            assert torch.equal(mine[k], v), k
        opt = ckpt.load_optimizer_state(os.path.join(fdir, "optimizer.pt"))  # keyed by parameter name
        for name, st in opt["state"].items():
            for k in ("exp_avg", "exp_avg_sq", "step"):
                assert torch.equal(reader.read(f"optim/{name}/{k}"), st[k]), (pol, name, k)

    ends = {}
    for tag in ("S", "F"):  # resume each at one process (no process group, no FSDP) to step 3
        one = tmp_path / f"{tag}1"
        shutil.copytree(runs[tag], one / "r")
        w["out"] = str(one)
        ends[tag] = _ends(_launch(w, f"{tag}1", world=1))
        assert ends[tag][0][0] == 0, _log(w, f"{tag}1", 0)[-3000:]
        assert "resumed from step 2" in _log(w, f"{tag}1", 0)
    s1, f1 = (os.path.join(str(tmp_path / f"{t}1"), "r") for t in ("S", "F"))
    assert metric_rows(s1) == metric_rows(f1) and len(metric_rows(s1)) == 6  # 3 steps x 2 policies
    for pol in ("a", "b"):
        f = os.path.join("checkpoints", "step_000003", pol, "model.safetensors")
        assert sha256_file(os.path.join(s1, f)) == sha256_file(os.path.join(f1, f))

    out = str(tmp_path / "export")
    done = ckpt.export(runs["S"], out, step=2)
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[5, 6, 7, 8, 9]])
    for pol, folder in done.items():
        assert not os.path.exists(os.path.join(folder, "shards"))
        got = AutoModelForCausalLM.from_pretrained(folder)
        ref = AutoModelForCausalLM.from_pretrained(os.path.join(step2["F"], pol))
        with torch.no_grad():
            assert torch.equal(got(input_ids=ids).logits, ref(input_ids=ids).logits), pol


def test_lora_policies_under_fsdp_shard_the_adapter_resume_at_one_process_and_export(pair_world, tmp_path):
    """Both policies as LoRA adapters (r 4) in a 2-process FSDP2 run: the adapters train (the optimizer holds them
    only), a sharded checkpoint holds only adapter tensors (with adapter_config.json) and equals the gathered one
    (checkpoint_format=full: PEFT's adapter_model.safetensors); both resume at one process identically; `graft
    export` of the sharded step is the gathered adapter folder."""
    import shutil

    from safetensors.torch import load_file

    from graft_cli.models import lora, shards
    from graft_cli.train import checkpoint as ckpt

    w = dict(pair_world)
    # responses long enough for a boxed answer (rewards vary, so the adapters get gradients), a LoRA learning rate
    lo = ["policies.0.lora.r=4", "policies.1.lora.r=4", "rollout.max_new_tokens=16", "optim.lr=1e-2"]
    runs = {}
    for tag, fmt, world in (("LS", "auto", 2), ("LF", "full", 2)):
        w["out"] = str(tmp_path / tag)
        ends = _ends(_launch(w, tag, extra=[f"run.checkpoint_format={fmt}", *lo], steps=2, world=world))
        assert [e[0] for e in ends] == [0] * world, _log(w, tag, 0)[-3000:]
        runs[tag] = os.path.join(w["out"], "r")
    assert metric_rows(runs["LS"]) == metric_rows(runs["LF"])
    step2 = {t: os.path.join(r, "checkpoints", "step_000002") for t, r in runs.items()}
    for pol in ("a", "b"):
        sdir, fdir = (os.path.join(step2[t], pol) for t in ("LS", "LF"))
        assert lora.is_adapter_folder(sdir) and shards.is_sharded(sdir)
        mine = shards.sharded_adapter(sdir)
        gathered = load_file(os.path.join(fdir, lora.ADAPTER_WEIGHTS))
        assert set(mine) == set(gathered) and all(".lora_" in k for k in mine)  # no base tensor in the shards
        assert all(torch.equal(mine[k], gathered[k]) for k in mine), pol
        assert any(float(v.abs().max()) > 0 for k, v in gathered.items() if "lora_B" in k)  # it trained
    ends = {}
    for tag in ("LS", "LF"):  # each resumed at one process to step 3
        one = tmp_path / f"{tag}1"
        shutil.copytree(runs[tag], one / "r")
        w["out"] = str(one)
        ends[tag] = _ends(_launch(w, f"{tag}1", extra=lo, world=1))
        assert ends[tag][0][0] == 0 and "resumed from step 2" in _log(w, f"{tag}1", 0), _log(w, f"{tag}1", 0)[-3000:]
    s1, f1 = (os.path.join(str(tmp_path / f"{t}1"), "r") for t in ("LS", "LF"))
    assert metric_rows(s1) == metric_rows(f1) and len(metric_rows(s1)) == 6
    for pol in ("a", "b"):
        f = os.path.join("checkpoints", "step_000003", pol, lora.ADAPTER_WEIGHTS)
        assert sha256_file(os.path.join(s1, f)) == sha256_file(os.path.join(f1, f))
    done = ckpt.export(runs["LS"], str(tmp_path / "export"), step=2)
    for pol, folder in done.items():
        got = load_file(os.path.join(folder, lora.ADAPTER_WEIGHTS))
        want = load_file(os.path.join(step2["LF"], pol, lora.ADAPTER_WEIGHTS))
        assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
        assert lora.is_adapter_folder(folder) and not os.path.exists(os.path.join(folder, "shards"))
