"""Experiment trackers (registry ``TRACKERS``, ``run.loggers``): where the metrics rows of a run go
besides ``metrics.jsonl``, which is always written and is the run's record (``jsonl`` names it in
the list).

- ``tensorboard``: ``<run>/tensorboard/`` event files (``torch.utils.tensorboard``; needs the
  ``tensorboard`` package), one scalar per metric named ``<policy>/<metric>`` at the row's ``step``.
  On resume the writer purges the events after the resumed step, so the curves match metrics.jsonl.
- ``wandb``: a Weights & Biases run named after the graft run in project ``run.wandb_project``
  (``graft``), with files under ``<run>/wandb/`` and ``run.wandb_mode`` (``online``; ``offline``
  needs no network: sync later with ``wandb sync``); the run id is derived from the run directory,
  so a resumed run continues the same W&B run. Metric names are ``<policy>/<metric>`` as in
  TensorBoard.

Only numeric values are logged (metrics.jsonl also holds strings and nulls). The same names as
verl's ``trainer.logger`` and TRL's ``report_to`` would show. """

from __future__ import annotations

import dataclasses
import hashlib
import math
import os

from graft_cli.errors import GraftError
from graft_cli.registry import Registry

TRACKERS: Registry = Registry("tracker")


def scalars(row: dict) -> tuple[int, str, dict]:
    """``(step, policy, {metric: float})`` of a metrics row: finite numbers only (booleans as
    0/1)."""
    out = {}
    for k, v in row.items():
        if k in ("step", "policy"):
            continue
        if isinstance(v, bool):
            v = float(v)
        if isinstance(v, (int, float)) and math.isfinite(float(v)):
            out[k] = float(v)
    return int(row["step"]), str(row.get("policy", "run")), out


@TRACKERS.register("jsonl")
class JsonlTracker:
    """metrics.jsonl (written by the trainer in every case): nothing more to do."""

    def __init__(self, cfg, run_dir: str, start_step: int = 0):
        pass

    def log(self, rows: list[dict]) -> None:
        pass

    def close(self) -> None:
        pass


@TRACKERS.register("tensorboard")
class TensorBoardTracker:
    def __init__(self, cfg, run_dir: str, start_step: int = 0):
        try:
            # lazy: TensorBoard is optional
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise GraftError("config key 'run.loggers': tensorboard needs the tensorboard package "
                             "(pip install tensorboard)") from None
        self.writer = SummaryWriter(log_dir=os.path.join(run_dir, "tensorboard"),
                                    purge_step=start_step + 1 if start_step else None)

    def log(self, rows: list[dict]) -> None:
        for row in rows:
            step, policy, vals = scalars(row)
            for k, v in vals.items():
                self.writer.add_scalar(f"{policy}/{k}", v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


@TRACKERS.register("wandb")
class WandbTracker:
    def __init__(self, cfg, run_dir: str, start_step: int = 0):
        try:
            # lazy: W&B is optional
            import wandb
        except ImportError:
            raise GraftError("config key 'run.loggers': wandb needs the wandb package (pip install wandb)") from None

        rid = hashlib.sha256(os.path.abspath(run_dir).encode()).hexdigest()[:16]
        self.run = wandb.init(project=cfg.run.wandb_project, name=os.path.basename(run_dir.rstrip("/")), id=rid,
                              dir=run_dir, mode=cfg.run.wandb_mode, resume="allow", config=dataclasses.asdict(cfg),
                              reinit="finish_previous")
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log(self, rows: list[dict]) -> None:
        for row in rows:
            step, policy, vals = scalars(row)
            self.run.log({f"{policy}/{k}": v for k, v in vals.items()} | {"step": step})

    def close(self) -> None:
        self.run.finish()


class Trackers:
    """Every tracker of ``run.loggers``, fed the rows the trainer writes to metrics.jsonl."""

    def __init__(self, cfg, run_dir: str, start_step: int = 0):
        self.items = [TRACKERS.get(name)(cfg, run_dir, start_step) for name in cfg.run.loggers]

    def log(self, rows: list[dict]) -> None:
        for t in self.items:
            t.log(rows)

    def close(self) -> None:
        for t in self.items:
            t.close()
