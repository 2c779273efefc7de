"""A run a researcher can trust overnight: numerical guards, pickle-free checkpoints with manifests, fallback
past damaged checkpoints, nothing written before the input is known good, and one-line errors.

Each test runs real `graft train` processes on random tiny models (conftest) and checks the files they wrote.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import metric_rows, proc_env, ROOT, kill_after, make_random_model, write_problems

from graft_cli.rundir import sha256_file

GRAFT = [sys.executable, "-m", "graft_cli.cli"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("reliability")
    return {"a": make_random_model(str(d / "a"), "qwen3", 0, sft_steps=40),
            "data": write_problems(str(d / "train.jsonl")), "root": d}


def args(s, out, name, steps=4, extra=(), model=None):
    return ["train", "--steps", str(steps), "--no-progress", "--out", out, "--name", name,
            f"policies=[{{name: a, model: '{model or s['a']}'}}]", f"data.train={s['data']}", "data.prompt_batch=4",
            "algo.minibatch_prompts=2", "rollout.n=4", "rollout.max_new_tokens=10", "reward.num_workers=1",
            "run.save_every=2", "run.keep_checkpoints=3", "optim.lr=1e-3", *extra]


def run(cmd):
    return subprocess.run(GRAFT + cmd, cwd=ROOT, env=proc_env(), capture_output=True, text=True)


def one_line_error(res, *needles):
    assert res.returncode == 2, res.stderr[-3000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    for n in needles:
        assert n in last, last
    return last


@pytest.fixture(scope="module")
def reference(setup):
    out = str(setup["root"] / "ref_runs")
    res = run(args(setup, out, "ref"))
    assert res.returncode == 0, res.stderr[-3000:]
    return os.path.join(out, "ref")


# ----------------------------------------------------------------------------------------- checkpoints
def test_checkpoints_are_json_safetensors_and_a_manifest(reference):
    ck = os.path.join(reference, "checkpoints", "step_000004")
    assert sorted(os.listdir(ck)) == ["COMPLETE", "MANIFEST.json", "a", "state.json"]
    man = json.load(open(os.path.join(ck, "MANIFEST.json")))
    assert set(man["files"]) >= {"state.json", "a/model.safetensors", "a/optimizer.pt", "a/config.json"}
    for rel, meta in man["files"].items():
        assert sha256_file(os.path.join(ck, rel)) == meta["sha256"]
    st = json.load(open(os.path.join(ck, "state.json")))
    assert st["step"] == 4 and len(st["rng"]["torch"]) > 0
    import torch

    torch.load(os.path.join(ck, "a", "optimizer.pt"), weights_only=True)  # plain tensors and values


def _copy_run(src, out_root, name):
    dst = os.path.join(out_root, name)
    shutil.copytree(src, dst)
    os.remove(os.path.join(dst, ".lock"))
    return dst


def _truncate_to_step(run_dir, step):
    """Make a copy look like a run killed after checkpoint ``step`` (later checkpoints and rows removed)."""
    for d in os.listdir(os.path.join(run_dir, "checkpoints")):
        if int(d.split("_")[1]) > step:
            shutil.rmtree(os.path.join(run_dir, "checkpoints", d))
    rows = [x for x in open(os.path.join(run_dir, "metrics.jsonl")) if json.loads(x)["step"] <= step + 1]
    open(os.path.join(run_dir, "metrics.jsonl"), "w").write("".join(rows))  # a partial step after it


@pytest.fixture(scope="module")
def full6(setup):
    out = str(setup["root"] / "full6")
    res = run(args(setup, out, "full", steps=6))
    assert res.returncode == 0, res.stderr[-3000:]
    return os.path.join(out, "full")


@pytest.mark.parametrize("damage", ["truncate", "flip", pytest.param("state", marks=pytest.mark.slow),
                                    pytest.param("manifest", marks=pytest.mark.slow)])
def test_a_damaged_last_checkpoint_falls_back_to_the_previous_one(setup, full6, tmp_path, damage):
    """The step-4 checkpoint of a 6-step run is damaged and the later ones removed (a run killed after step 4);
    resuming skips it with one warning naming the file and redoes steps 3-6 from step 2: the metrics equal the
    uninterrupted run's."""
    out = str(tmp_path / "runs")
    d = _copy_run(full6, out, "full")
    _truncate_to_step(d, 4)
    ck = os.path.join(d, "checkpoints", "step_000004")
    w = os.path.join(ck, "a", "model.safetensors")
    if damage == "truncate":
        open(w, "r+b").truncate(os.path.getsize(w) // 2)
    elif damage == "flip":  # still parses: only the manifest tells
        b = bytearray(open(w, "rb").read())
        b[-10] ^= 0xFF
        open(w, "wb").write(bytes(b))
    elif damage == "state":
        open(os.path.join(ck, "state.json"), "w").write("{garbled")
    else:
        os.remove(os.path.join(ck, "MANIFEST.json"))
    res = run(args(setup, out, "full", steps=6))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "checkpoint step 4 skipped" in res.stderr and "resumed from step 2" in res.stderr
    assert metric_rows(d) == metric_rows(full6)


def test_all_checkpoints_damaged_stops_with_one_line(setup, reference, tmp_path):
    out = str(tmp_path / "runs")
    d = _copy_run(reference, out, "ref")
    for s in os.listdir(os.path.join(d, "checkpoints")):
        open(os.path.join(d, "checkpoints", s, "state.json"), "a").write(" ")
    before = open(os.path.join(d, "metrics.jsonl")).read()
    res = run(args(setup, out, "ref", steps=6))
    one_line_error(res, "none of the", "complete checkpoints could be restored")
    assert open(os.path.join(d, "metrics.jsonl")).read() == before  # nothing truncated


def test_a_crafted_pickle_in_a_run_directory_is_refused_not_executed(setup, reference, tmp_path):
    """optimizer.pt replaced by a pickle whose loading would run a command, with a manifest rewritten to match:
    weights_only loading refuses it (the checkpoint is skipped), the command never runs."""
    import pickle

    from graft_cli.train.checkpoint import write_manifest

    out = str(tmp_path / "runs")
    d = _copy_run(reference, out, "ref")
    marker = tmp_path / "PWNED"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    for s in ("step_000002", "step_000004"):
        ck = os.path.join(d, "checkpoints", s)
        with open(os.path.join(ck, "a", "optimizer.pt"), "wb") as f:
            pickle.dump(Evil(), f)
        write_manifest(ck)
    res = run(args(setup, out, "ref", steps=6))
    one_line_error(res, "none of the", "complete checkpoints could be restored")
    assert "skipped" in res.stderr and "refused as unsafe" in res.stderr
    assert "weights_only=False" not in res.stderr  # torch's advice to unpickle it is not passed on
    assert not marker.exists()


# ------------------------------------------------------------------------------------ nothing written
def test_a_failed_start_writes_nothing_and_the_corrected_command_runs(setup, tmp_path):
    out = str(tmp_path / "runs")
    missing = str(tmp_path / "no_such_model")
    res = run(args(setup, out, "x", steps=2, model=missing))
    one_line_error(res, "policies.0.model", missing, "does not exist")
    assert not os.path.exists(os.path.join(out, "x"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "1+1", "answer": "2"}\n{"problem": "2+2"\n')
    res = run(args(setup, out, "x", steps=2, extra=[f"data.train={bad}"]))
    one_line_error(res, f"{bad}:2", "not valid JSON")
    assert not os.path.exists(os.path.join(out, "x"))
    res = run(args(setup, out, "x", steps=2, extra=[f"data.train={tmp_path / 'none.jsonl'}"]))
    one_line_error(res, "data.train", "file not found")
    assert not os.path.exists(os.path.join(out, "x"))
    res = run(args(setup, out, "x", steps=3, extra=["run.keep_rollouts=2"]))
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(os.listdir(os.path.join(out, "x", "rollouts", "a"))) == ["step_000002.parquet", "step_000003.parquet"]
    assert "MiB on disk" in res.stderr  # the run says how much it wrote


def test_graft_eval_skips_a_damaged_checkpoint(setup, reference, tmp_path):
    out = str(tmp_path / "runs")
    d = _copy_run(reference, out, "ref")
    open(os.path.join(d, "checkpoints", "step_000004", "a", "model.safetensors"), "r+b").truncate(100)
    res = run(["eval", "--run", d, "--steps", "last", "--runs", "1", "--samples", "2", "--data", setup["data"],
               "--no-progress", "--workers", "1"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert "checkpoint step 4 skipped" in res.stderr
    assert os.listdir(os.path.join(d, "eval", "a")) and os.path.isdir(os.path.join(d, "eval", "a", "step_000002"))
    assert not os.path.exists(os.path.join(d, "eval", "a", "step_000004"))


def test_a_moved_run_directory_resumes(setup, reference, tmp_path):
    moved = str(tmp_path / "elsewhere")
    d = _copy_run(reference, moved, "renamed")
    res = run(args(setup, moved, "renamed", steps=6))
    assert res.returncode == 0 and "resumed from step 4" in res.stderr, res.stderr[-3000:]
    assert [r["step"] for r in metric_rows(d) if "time/step" not in r][:4] == [1, 2, 3, 4]


def test_temperature_zero_is_refused_for_training(setup, tmp_path):
    res = run(args(setup, str(tmp_path / "runs"), "t0", steps=1, extra=["rollout.temperature=0"]))
    one_line_error(res, "rollout.temperature", "must be > 0", "graft eval --temperature 0")
    assert not os.path.exists(os.path.join(str(tmp_path / "runs"), "t0"))


def test_save_every_zero_trains_without_any_checkpoint_and_refuses_what_needs_one(setup, tmp_path):
    """run.save_every=0 (benchmarks on multi-GB models): the steps run and log, no checkpoint is written, not even
    the last step's; with eval.every > 0 or run.save_on_signal it is refused in one line before anything runs."""
    out = str(tmp_path / "runs")
    res = run(args(setup, out, "nock", steps=2, extra=["run.save_every=0"]))
    assert res.returncode == 0, res.stderr[-3000:]
    assert [r["step"] for r in metric_rows(os.path.join(out, "nock"))] == [1, 2]
    ck = os.path.join(out, "nock", "checkpoints")
    assert not os.path.isdir(ck) or os.listdir(ck) == [], os.listdir(ck)
    for extra in (["eval.every=1"], ["run.save_on_signal=true"]):
        res = run(args(setup, out, "refused", steps=2, extra=["run.save_every=0", *extra]))
        one_line_error(res, "run.save_every", "no checkpoint")
        assert not os.path.exists(os.path.join(out, "refused"))


# ----------------------------------------------------------------------------------------- non-finite
NAN_PLUGIN = '''
import torch
from graft_cli.algorithms.losses import POLICY_LOSSES, register_loss


@register_loss("nan_first_step")
def nan_first_step(inp):
    """The PPO token loss, made NaN on the first step (a stand-in for an overflow)."""
    loss, st = POLICY_LOSSES.get("ppo_token")(inp)
    return (loss * float("nan") if inp.step == 0 else loss), st
'''


@pytest.mark.parametrize("mode", ["stop", "skip"])
def test_a_nonfinite_loss_stops_or_is_skipped_and_counted(setup, tmp_path, mode):
    plugin = tmp_path / "nan_plugin.py"
    plugin.write_text(NAN_PLUGIN)
    out = str(tmp_path / "runs")
    extra = [f"plugins=[{plugin}]", "algo.loss=nan_first_step", f"optim.on_nonfinite={mode}"]
    res = run(args(setup, out, mode, steps=2, extra=extra))
    d = os.path.join(out, mode)
    if mode == "stop":
        last = one_line_error(res, "step 1", "policy 'a'", "non-finite loss")
        assert last.endswith("no checkpoint was written yet (a rerun starts at step 0)")  # not "intact"
        assert "intact" not in res.stderr
        assert not os.path.exists(os.path.join(d, "checkpoints", "step_000002"))
        return
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [r for r in metric_rows(d) if "train/nonfinite_skipped" in r]
    assert [r["train/nonfinite_skipped"] for r in rows] == [2, 0]  # both minibatches of step 1, none of step 2
    assert rows[0]["num_minibatches"] == 0 and rows[1]["num_minibatches"] == 2
    import torch
    from safetensors.torch import load_file

    w = load_file(os.path.join(d, "checkpoints", "step_000002", "a", "model.safetensors"))
    assert all(torch.isfinite(t).all() for t in w.values())


def test_a_checkpoint_is_never_written_from_nonfinite_weights(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from graft_cli.errors import GraftError
    from graft_cli.train import checkpoint as ckpt

    path = make_random_model(str(tmp_path / "m"), "qwen3", 0)
    m = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        next(m.parameters())[0, 0] = float("inf")

    class P:
        model, tokenizer, optimizer = m, None, None

    with pytest.raises(GraftError, match="non-finite values; no checkpoint written"):
        ckpt.save(str(tmp_path / "ck"), 1, {"a": P()}, {"step": 1})
    assert not os.path.exists(tmp_path / "ck")


@pytest.mark.slow
@pytest.mark.extended  # test_faults kills GRPO mid-update and after each checkpoint write, and compares the weights
def test_kill_during_the_run_resumes_to_identical_weights(setup, reference, tmp_path):
    out = str(tmp_path / "runs")
    marker = os.path.join(out, "killed", "checkpoints", "step_000002", "COMPLETE")
    kill_after(GRAFT + args(setup, out, "killed"), marker, proc_env())
    res = run(args(setup, out, "killed"))
    assert res.returncode == 0 and "resumed from step 2" in res.stderr, res.stderr[-3000:]
    assert metric_rows(os.path.join(out, "killed")) == metric_rows(reference)
    w = os.path.join("checkpoints", "step_000004", "a", "model.safetensors")
    assert sha256_file(os.path.join(out, "killed", w)) == sha256_file(os.path.join(reference, w))


def test_a_full_disk_during_a_checkpoint_keeps_the_last_one(tmp_path, monkeypatch):
    """ENOSPC while the step-4 checkpoint is written: one line, no half-written folder, step 2 intact."""
    import errno

    import torch
    from transformers import AutoModelForCausalLM

    from conftest import make_char_tokenizer
    from graft_cli.errors import GraftError
    from graft_cli.train import checkpoint as ckpt

    path = make_random_model(str(tmp_path / "m"), "qwen3", 0)
    m = AutoModelForCausalLM.from_pretrained(path)

    class P:
        model, tokenizer = m, make_char_tokenizer()
        optimizer = torch.optim.AdamW(m.parameters())

    root = str(tmp_path / "ck")
    ckpt.save(root, 2, {"a": P()}, {"step": 2})
    real = torch.save

    def full(obj, f, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(f))

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(GraftError, match="checkpoint not written .No space left on device.; the last complete"):
        ckpt.save(root, 4, {"a": P()}, {"step": 4})
    monkeypatch.setattr(torch, "save", real)
    assert sorted(os.listdir(root)) == ["step_000002"] and ckpt.verify(os.path.join(root, "step_000002")) is None


def test_two_identical_runs_write_byte_identical_run_directories(setup, reference):
    """Issue 29 item 7: two identical runs (Python's `random` seeded with run.seed too, recorded as rng.python in
    state.json) write the same files, byte for byte: weights, optimizer states, state.json, manifests, rollout
    parquets, summary.png. Two things differ by design and are compared without them: the ``time/*`` values of
    metrics.jsonl (wall-clock durations of the phases; every other key and value is equal, and each line has the
    same time keys), ``run.out`` in config.yaml (the runs live in different folders) and each session's start time
    in provenance.json."""
    out = str(setup["root"] / "twin_runs")
    res = run(args(setup, out, "ref"))
    assert res.returncode == 0, res.stderr[-3000:]
    twin = os.path.join(out, "ref")

    def files(d):
        return sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs)

    assert files(twin) == files(reference)
    assert {"metrics.jsonl", "config.yaml", "summary.png", "checkpoints/step_000004/a/optimizer.pt",
            "checkpoints/step_000004/state.json", "rollouts/a/step_000004.parquet"} <= set(files(twin))
    for rel in files(twin):
        a, b = (open(os.path.join(d, rel), "rb").read() for d in (reference, twin))
        if rel == "metrics.jsonl":
            ra, rb = ([json.loads(x) for x in t.decode().splitlines()] for t in (a, b))
            assert len(ra) == len(rb) == 4
            for x, y in zip(ra, rb):
                assert sorted(x) == sorted(y)
                assert {k: v for k, v in x.items() if not k.startswith("time/")} == \
                    {k: v for k, v in y.items() if not k.startswith("time/")}
        elif rel == "config.yaml":
            ref_out = os.path.dirname(reference)
            assert ref_out.encode() in a and b.replace(out.encode(), ref_out.encode()) == a
        elif rel == "provenance.json":  # the same run identity; only each session's start time differs
            pa, pb = json.loads(a), json.loads(b)
            assert pa["config_hash"] == pb["config_hash"] and pa["tiny_build"] == pb["tiny_build"]
            assert [{k: v for k, v in x.items() if k != "started"} for x in pa["sessions"]] == \
                [{k: v for k, v in x.items() if k != "started"} for x in pb["sessions"]]
        else:
            assert a == b, rel


def test_steps_below_the_checkpoint_say_so_and_change_nothing(setup, reference, tmp_path):
    """--steps smaller than the checkpoint's step on resume: exit 0, one line saying there is
    nothing to train, the run directory's checkpoints and metrics untouched."""
    out = str(tmp_path / "runs")
    d = _copy_run(reference, out, "ref")
    ck = os.path.join(d, "checkpoints", "step_000004", "a", "model.safetensors")
    before, metrics = sha256_file(ck), open(os.path.join(d, "metrics.jsonl")).read()
    res = run(args(setup, out, "ref", steps=2))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "the checkpoint's step 4 is at or past this run's 2 steps: nothing to train" in res.stderr
    assert sha256_file(ck) == before and open(os.path.join(d, "metrics.jsonl")).read() == metrics


# ------------------------------------------------------------------------- real resource limits (item 4)
def _limited(cmd, limit_bytes):
    """`graft` under a real file-size limit (RLIMIT_FSIZE, as `ulimit -f` sets it) with SIGXFSZ ignored, so a
    write past the limit fails with EFBIG (a full quota or disk fails the same way) instead of killing the process."""
    import resource
    import signal

    def pre():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run(GRAFT + cmd, cwd=ROOT, env=proc_env(), capture_output=True, text=True, preexec_fn=pre)


@pytest.mark.slow
def test_a_real_file_size_limit_fails_each_write_in_one_line_and_the_rerun_resumes_identical(setup, full6, tmp_path):
    """Issue 29 item 4. A copy of the 6-step run cut back to its step-4 checkpoint is resumed three times under
    a file-size limit sized from the uninterrupted run's own files, so that in turn metrics.jsonl's append of
    step 6, the step-6 checkpoint (its weights file) and the rollout parquet of step 5 fail: each time one line,
    exit 2, the step-4 checkpoint still verifies, no temporary file or torn line is left. The rerun without a
    limit resumes from step 4 and ends with the uninterrupted run's metrics and weights."""
    from graft_cli.train import checkpoint as ckpt

    out = str(tmp_path / "runs")
    d = _copy_run(full6, out, "full")
    _truncate_to_step(d, 4)
    ck4 = os.path.join(d, "checkpoints", "step_000004")
    lines = [len(x.encode()) for x in open(os.path.join(full6, "metrics.jsonl"))]
    cum = [sum(lines[:k]) for k in range(len(lines) + 1)]  # bytes of metrics.jsonl after step k (one policy)
    weights = os.path.getsize(os.path.join(full6, "checkpoints", "step_000006", "a", "model.safetensors"))
    parquet = min(os.path.getsize(os.path.join(full6, "rollouts", "a", f)) for f in os.listdir(
        os.path.join(full6, "rollouts", "a")))
    config = os.path.getsize(os.path.join(d, "config.yaml")) + 512  # rewritten on resume (run.out differs)

    def check(res, *needles):
        last = one_line_error(res, *needles)
        assert "resumed from step 4" in res.stderr
        assert ckpt.valid_steps(os.path.join(d, "checkpoints")) == [2, 4] and ckpt.verify(ck4) is None
        litter = [os.path.join(r, f) for r, ds, fs in os.walk(d) for f in fs + ds if ".tmp-" in f]
        assert not litter, litter
        return last

    # (1) metrics.jsonl: the limit falls inside step 6's line (rollout logs off: no parquet of ~5 KB to fail first)
    limit = (cum[5] + cum[6]) // 2
    assert limit > max(config, cum[4]) + 200
    res = _limited(args(setup, out, "full", steps=6, extra=["run.log_rollouts=false"]), limit)
    check(res, os.path.join(d, "metrics.jsonl"), "File too large")
    rows = [json.loads(x) for x in open(os.path.join(d, "metrics.jsonl"))]  # every line whole: the torn one cut off
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    # (2) the step-6 checkpoint: its weights file is larger than the limit, everything before it smaller
    res = _limited(args(setup, out, "full", steps=6), weights // 2)
    check(res, "step_000006: checkpoint not written (File too large)", "the last complete checkpoint is kept")
    assert not os.path.exists(os.path.join(d, "checkpoints", "step_000006"))
    # (3) the rollout parquet of step 5, the first write of the step past the limit
    limit = parquet - 256
    assert limit > max(config, cum[4]) + 200
    res = _limited(args(setup, out, "full", steps=6), limit)
    check(res, os.path.join(d, "rollouts", "a", "step_000005.parquet"), "File too large")
    # without the limit: resumes from step 4 and ends as the uninterrupted run did
    res = run(args(setup, out, "full", steps=6))
    assert res.returncode == 0 and "resumed from step 4" in res.stderr, res.stderr[-3000:]
    assert metric_rows(d) == metric_rows(full6)
    w = os.path.join("checkpoints", "step_000006", "a", "model.safetensors")
    assert sha256_file(os.path.join(d, w)) == sha256_file(os.path.join(full6, w))


def test_a_run_directory_that_cannot_be_written_is_one_line_before_anything_loads(tmp_path):
    """A run directory under a path component that is a regular file (what root's permission bypass cannot
    change, like a read-only mount): one line naming run.out and the file, exit 2, nothing written, no model
    loaded (in process: the check comes first)."""
    from click.testing import CliRunner

    from graft_cli.cli import main

    blocker = tmp_path / "results"
    blocker.write_text("not a folder\n")
    s = {"a": str(tmp_path / "never_loaded"), "data": str(tmp_path / "never_read.jsonl")}
    res = CliRunner().invoke(main, args(s, str(blocker / "runs"), "x", steps=1))
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.output
    assert "config key 'run.out'" in res.stderr and f"{blocker} is not a folder" in res.stderr, res.stderr
    assert blocker.read_text() == "not a folder\n" and sorted(os.listdir(tmp_path)) == ["results"]


@pytest.mark.slow
def test_an_evaluation_killed_mid_benchmark_keeps_its_files_and_the_rerun_does_only_the_rest(setup, reference,
                                                                                           tmp_path):
    """`graft eval --run` SIGKILLed (with its reward workers) once the first (benchmark, run) file is written: the
    rerun keeps that file untouched (same bytes, same mtime), writes only the others, and every file equals the
    one an uninterrupted evaluation writes."""
    two = tmp_path / "two.jsonl"
    shutil.copy(setup["data"], two)

    def cmd(d):
        return ["eval", "--run", d, "--steps", "last", "--runs", "2", "--samples", "2", "--no-progress",
                "--benchmarks", f"one={setup['data']},two={two}", "--workers", "1"]

    whole = _copy_run(reference, str(tmp_path / "whole"), "ref")
    res = run(cmd(whole))
    assert res.returncode == 0, res.stderr[-3000:]
    d = _copy_run(reference, str(tmp_path / "killed"), "ref")
    folder = os.path.join("eval", "a", "step_000004")
    first = os.path.join(d, folder, "one_run1.jsonl")
    kill_after(GRAFT + cmd(d), first, proc_env())
    names = ["one_run1.jsonl", "one_run2.jsonl", "two_run1.jsonl", "two_run2.jsonl"]
    done = [n for n in names if os.path.exists(os.path.join(d, folder, n))]
    assert done[:1] == ["one_run1.jsonl"] and len(done) < 4 and \
        not os.path.exists(os.path.join(d, folder, "summary.json"))
    kept = os.stat(first).st_mtime_ns, open(first, "rb").read()
    res = run(cmd(d))
    assert res.returncode == 0, res.stderr[-3000:]
    assert (os.stat(first).st_mtime_ns, open(first, "rb").read()) == kept  # not regenerated
    for n in names:
        assert open(os.path.join(d, folder, n), "rb").read() == open(os.path.join(whole, folder, n), "rb").read(), n
    assert not [f for f in os.listdir(os.path.join(d, folder)) if ".tmp-" in f]
    s1, s2 = (json.load(open(os.path.join(x, folder, "summary.json"))) for x in (d, whole))
    assert s1["benchmarks"] == s2["benchmarks"] and s1["num_runs"] == 2


# ------------------------------------------------------------------- inputs checked before step 1 (item 6)
@pytest.fixture
def silent_hub(monkeypatch):
    """A hub endpoint that accepts connections and never answers (dropped packets look the same to a client), with
    a 1 s request timeout; counts the connections made to it."""
    import socket
    import threading

    import datasets.config
    from huggingface_hub import constants

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    seen, held = [], []

    def accept():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            seen.append(1)
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    url = f"http://127.0.0.1:{srv.getsockname()[1]}"
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", url)
    monkeypatch.setattr(constants, "HF_HUB_ETAG_TIMEOUT", 1)
    # the hub is this silent endpoint, not switched off: .ci/run exports HF_HUB_OFFLINE=1 for every other test
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    from graft_cli.data import hub

    monkeypatch.setattr(hub, "_ANSWERS", {})
    yield seen
    srv.close()
    for c in held:
        c.close()


def test_every_input_of_the_run_is_checked_before_step_1(tmp_path, silent_hub):
    """Issue 29 item 6, through the CLI in process: a training set and a validation benchmark with a repeated id, a
    tokenizer without the chat template the config requires, and hub datasets (training, validation) while the hub
    does not answer: each is one line naming the file, key or dataset, exit 2, nothing written. The hub is asked
    once for the whole process (1 s), not through datasets' retry loop."""
    from click.testing import CliRunner

    from graft_cli.cli import main

    model = make_random_model(str(tmp_path / "m"), "qwen3", 0)
    good = write_problems(str(tmp_path / "train.jsonl"))
    dup = tmp_path / "dup.jsonl"
    dup.write_text(open(good).read() + json.dumps({"id": "p3", "problem": "1+1", "answer": "2"}) + "\n")
    s, out = {"a": model, "data": good}, str(tmp_path / "runs")

    def bad(extra, *needles):
        res = CliRunner().invoke(main, args(s, out, "x", steps=2, extra=extra))
        assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.output[-3000:]
        for n in needles:
            assert n in res.stderr, res.stderr
        assert not os.path.exists(out), os.listdir(out)

    bad([f"data.train={dup}"], f"{dup}:17: duplicate id 'p3' (first at {dup}:4)")
    bad(["eval.every=1", f"eval.benchmarks=[dups={dup}]"], f"{dup}:17: duplicate id 'p3'")
    bad(["prompt.chat_template=required"], "config key 'policies.0.model': tokenizer", "has no chat template")
    bad(["data.train=graft-test/no-such-set:train"], "graft-test/no-such-set:train: could not load hub dataset",
               "not in the local cache", "did not answer")
    bad(["eval.every=1", "eval.benchmarks=[remote=graft-test/no-such-bench:test]"],
                "graft-test/no-such-bench:test: could not load hub dataset")
    assert len(silent_hub) == 1, len(silent_hub)  # one request in all, no retry loop
