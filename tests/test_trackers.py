"""Experiment trackers and run output: TensorBoard event files read back with TensorBoard's own reader equal
metrics.jsonl; W&B offline writes its run without a network; `graft train` ends with the run's summary table and
picture; without a terminal, one plain line per step; the libraries' progress bars are silenced."""

from __future__ import annotations

import glob
import json
import math
import os
import subprocess
import sys

import pytest
from conftest import ROOT, train_overrides

GRAFT = [sys.executable, "-m", "graft_cli.cli"]


def _env():
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}


def _train(tiny_models, data, out, name, extra, method="graft"):
    ov = train_overrides(tiny_models, data, out, [f"run.name={name}", "run.steps=2", *extra])
    return subprocess.run(GRAFT + ["train", "--method", method, *ov], cwd=ROOT, env=_env(), capture_output=True,
                          text=True)


def _rows(run):
    return [json.loads(x) for x in open(os.path.join(run, "metrics.jsonl")) if x.strip()]


def test_tensorboard_events_equal_metrics_jsonl(tiny_models, problems_file, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    res = _train(tiny_models, problems_file, str(tmp_path), "tb", ["run.loggers=[jsonl,tensorboard]"])
    assert res.returncode == 0, res.stderr[-3000:]
    run = os.path.join(str(tmp_path), "tb")
    acc = EventAccumulator(os.path.join(run, "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    checked = 0
    for row in _rows(run):
        for k, v in row.items():
            if k in ("step", "policy") or isinstance(v, (str, type(None))) or not math.isfinite(float(v)):
                continue
            tag = f"{row['policy']}/{k}"
            assert tag in tags, tag
            ev = {e.step: e.value for e in acc.Scalars(tag)}
            assert ev[row["step"]] == pytest.approx(float(v), rel=1e-6, abs=1e-6), tag
            checked += 1
    assert checked > 100 and {"a/reward", "b/reward", "a/graft/admitted"} <= tags


@pytest.mark.slow
def test_wandb_offline_needs_no_network(tiny_models, problems_file, tmp_path):
    pytest.importorskip("wandb")
    res = _train(tiny_models, problems_file, str(tmp_path), "wb", ["run.loggers=[jsonl,wandb]",
                                                                   "run.wandb_mode=offline"])
    assert res.returncode == 0, res.stderr[-3000:]
    run = os.path.join(str(tmp_path), "wb")
    files = glob.glob(os.path.join(run, "wandb", "offline-run-*", "run-*.wandb"))
    assert len(files) == 1 and os.path.getsize(files[0]) > 0
    # the offline run file (protobuf records; its history items hold key and JSON value as strings) carries the
    # same metric names and values as metrics.jsonl
    data = open(files[0], "rb").read()
    for r in [r for r in _rows(run) if "time/step" in r]:
        assert f"{r['policy']}/reward".encode() in data and json.dumps(float(r["reward"])).encode() in data


def test_unknown_tracker_is_one_line(tiny_models, problems_file, tmp_path):
    res = _train(tiny_models, problems_file, str(tmp_path), "x", ["run.loggers=[jsonl,mlflow]"])
    assert res.returncode == 2 and "unknown tracker 'mlflow'" in res.stderr.strip().splitlines()[-1]
    assert not os.path.exists(os.path.join(str(tmp_path), "x"))


def test_train_ends_with_its_summary_and_picture_and_logs_a_line_per_step(tiny_models, problems_file, tmp_path):
    """Not a terminal (captured): one plain line per step; no library progress bars; the summary table's numbers
    are metrics.jsonl's; summary.png is written; and `graft report RUN` works on the single run."""
    res = _train(tiny_models, problems_file, str(tmp_path), "sum", [])
    assert res.returncode == 0, res.stderr[-3000:]
    run = os.path.join(str(tmp_path), "sum")
    err = res.stderr
    assert "Loading weights" not in err and "Writing model shards" not in err
    lines = [x for x in err.splitlines() if x.startswith("step ")]
    assert [x.split()[1] for x in lines] == ["1/2", "2/2"] and "s/step" in lines[0]
    rows = [r for r in _rows(run) if "time/step" in r]
    for pol in ("a", "b"):
        rs = [r for r in rows if r["policy"] == pol]
        first, last = rs[0]["reward"], rs[-1]["reward"]
        row = next(x for x in err.splitlines() if x.startswith(f"| {pol} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2] == f"{first:.3f} → {last:.3f}"
        assert cells[4] == str(sum(r["graft/selected"] for r in rs))
        assert cells[6] == str(sum(r["graft/admitted"] for r in rs))
    assert os.path.getsize(os.path.join(run, "summary.png")) > 1000
    rep = subprocess.run(GRAFT + ["report", run, "--out", str(tmp_path / "rep")], cwd=ROOT, env=_env(),
                         capture_output=True, text=True)
    assert rep.returncode == 0 and os.path.exists(tmp_path / "rep" / "report.md"), rep.stderr[-2000:]
