"""The run directory's paths come from one module (graft_cli/rundir.py): the layout its docstring
draws, written out here by hand."""

from __future__ import annotations

import os

from graft_cli.rundir import (best_path, checkpoint_dir, checkpoints_dir, config_path, eval_step_dir, metrics_path,
                              remove_stale_temporaries, rollout_log_path, step_name)
from graft_cli.train.checkpoint import step_path


def test_the_layout_by_hand():
    r = os.path.join("results", "runs", "x")
    assert step_name(12) == "step_000012" and step_name(1234567) == "step_1234567"
    assert config_path(r) == "results/runs/x/config.yaml" and metrics_path(r) == "results/runs/x/metrics.jsonl"
    assert best_path(r) == "results/runs/x/best.json" and checkpoints_dir(r) == "results/runs/x/checkpoints"
    assert checkpoint_dir(r, 3) == "results/runs/x/checkpoints/step_000003"
    assert checkpoint_dir(r, 3, "a") == "results/runs/x/checkpoints/step_000003/a"
    assert step_path(checkpoints_dir(r), 3) == checkpoint_dir(r, 3)  # the checkpoint writer's own name for it
    assert eval_step_dir(r, "a", 0) == "results/runs/x/eval/a/step_000000"
    assert eval_step_dir(r, "a", 7, "validation") == "results/runs/x/validation/a/step_000007"
    assert rollout_log_path(r, "b", 0) == "results/runs/x/rollouts/b/step_000001.parquet"  # logs count from 1


def test_stale_temporaries_of_other_processes_are_removed_and_nothing_else(tmp_path):
    mine = f"one_run2.jsonl.tmp-{os.getpid()}"
    for name in ["one_run2.jsonl.tmp-26580", mine, "one_run1.jsonl", "notes.tmp-x", "x.tmp-12ab", ".tmp-7"]:
        (tmp_path / name).write_text("x")
    (tmp_path / "step_000004.tmp-991").mkdir()
    (tmp_path / "step_000004.tmp-991" / "model.safetensors").write_text("x")
    remove_stale_temporaries(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted([mine, "one_run1.jsonl", "notes.tmp-x", "x.tmp-12ab", ".tmp-7"])
    remove_stale_temporaries(str(tmp_path / "absent"))  # a folder not made yet: nothing to do
