"""Unit tests of the training driver's small contracts, without a run: the after-step hook contract and its view
(train/hooks.py), the phase timer with a fake clock and a fake CUDA memory counter (train/phases.py), and the
experiment trackers: numeric scalars of a metrics row, TensorBoard files read back with TensorBoard's reader, W&B
through a fake ``wandb`` module, refusals when a package is missing (train/trackers.py)."""

from __future__ import annotations

import dataclasses
import os
import sys
from types import SimpleNamespace

import pytest
import torch

from graft_cli.errors import GraftError
from graft_cli.train import phases as phases_mod
from graft_cli.train.hooks import AfterStep, StepView
from graft_cli.train.phases import Phases
from graft_cli.train.trackers import TRACKERS, JsonlTracker, TensorBoardTracker, Trackers, WandbTracker, scalars


# =============================================================================================== hooks.py
def _view(step=3):
    return StepView(step=step, total_steps=10, policies={}, held_out=[], data_parallel=False, spec=None, grader=None)


def test_after_step_defaults_due_every_step_never_done():
    """The base hook: ``prepare`` does nothing, it is due after every step and nothing of it is on disk yet; calling
    the base hook itself is an error (a hook must say what it does)."""
    hook = AfterStep()
    for step in (0, 1, 10):
        assert hook.prepare(_view(step), cfg=None) is None
        assert hook.due(_view(step), cfg=None) is True
        assert hook.done(_view(step), cfg=None, run_dir="/nowhere") is False
    with pytest.raises(NotImplementedError):
        hook(_view(), cfg=None, run_dir="/nowhere")


def test_a_hook_overrides_only_what_it_needs(tmp_path):
    """A subclass due every other step and done once its file exists: the loop's two questions answered per step."""

    class EveryOther(AfterStep):
        def due(self, view, cfg):
            return view.step % 2 == 0

        def done(self, view, cfg, run_dir):
            return os.path.exists(os.path.join(run_dir, f"hook_{view.step}.txt"))

        def __call__(self, view, cfg, run_dir, console=None):
            open(os.path.join(run_dir, f"hook_{view.step}.txt"), "w").close()
            return [{"step": view.step, "hook/ran": 1.0}]

    h, run = EveryOther(), str(tmp_path)
    assert [h.due(_view(s), None) for s in range(1, 5)] == [False, True, False, True]
    assert h.prepare(_view(0), None) is None  # inherited
    assert not h.done(_view(2), None, run)
    assert h(_view(2), None, run) == [{"step": 2, "hook/ran": 1.0}]
    assert h.done(_view(2), None, run) and not h.done(_view(4), None, run)


def test_step_view_is_a_frozen_view_of_the_documented_fields():
    """StepView holds exactly the documented fields, in order, and a hook cannot change them."""
    names = [f.name for f in dataclasses.fields(StepView)]
    assert names == ["step", "total_steps", "policies", "held_out", "data_parallel", "spec", "grader"]
    v = _view(5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.step = 6
    assert (v.step, v.total_steps, v.data_parallel) == (5, 10, False)


# ============================================================================================== phases.py
class FakeClock:
    """perf_counter returning the next of the given times."""

    def __init__(self, *times):
        self.times = list(times)

    def perf_counter(self):
        return self.times.pop(0)


def test_phases_time_blocks_into_their_dict_with_a_fake_clock(monkeypatch):
    """Each block's seconds (end − start of perf_counter) go into ``seconds`` or the given dict; on CPU no memory
    metrics."""
    monkeypatch.setattr(phases_mod, "time", FakeClock(10.0, 12.5, 20.0, 20.25, 30.0, 31.0))
    ph = Phases(torch.nn.Linear(2, 2))
    assert ph.on is False
    with ph("rollout"):
        pass
    step_times = {}
    with ph("score", step_times):
        pass
    with ph("rollout"):  # the same phase again: the last block's time
        pass
    assert ph.seconds == {"rollout": 1.0} and step_times == {"score": 0.25}
    assert ph.metrics() == {} and ph.peaks == {}


def test_phases_peak_memory_per_phase_on_cuda(monkeypatch):
    """On CUDA: the peak allocated since the previous phase ended, in GiB, maxed over blocks of one phase; the
    counter is reset at start and after each block; ``memory=False`` leaves it alone."""
    peaks = [3 * 2**30, 2**29, 5 * 2**30]  # what max_memory_allocated reports at the end of each measured block
    resets = []
    fake_cuda = SimpleNamespace(reset_peak_memory_stats=lambda dev: resets.append(str(dev)),
                                max_memory_allocated=lambda dev: peaks.pop(0))
    monkeypatch.setattr(phases_mod, "torch", SimpleNamespace(cuda=fake_cuda))
    monkeypatch.setattr(phases_mod, "time", FakeClock(*range(10)))
    model = SimpleNamespace(parameters=lambda: iter([SimpleNamespace(device=torch.device("cuda", 1))]))
    ph = Phases(model)
    assert ph.on and resets == ["cuda:1"]
    with ph("update"):
        pass
    with ph("score"):
        pass
    with ph("sync", memory=False):
        pass
    with ph("update"):
        pass
    # update: max(3, 5) GiB; score: 0.5 GiB; sync not measured; a reset after each measured block
    assert ph.metrics() == {"memory/update_peak_gib": 5.0, "memory/score_peak_gib": 0.5}
    assert resets == ["cuda:1"] * 4 and peaks == []
    assert ph.seconds == {"update": 1, "score": 1, "sync": 1}


# ============================================================================================ trackers.py
@pytest.mark.parametrize("row,want", [
    ({"step": 3, "policy": "a", "loss": 0.5, "n": 4}, (3, "a", {"loss": 0.5, "n": 4.0})),
    ({"step": 1, "flag": True, "off": False}, (1, "run", {"flag": 1.0, "off": 0.0})),  # no policy: "run"
    ({"step": 2.0, "policy": "b", "s": "text", "none": None, "nan": float("nan"), "inf": float("inf"),
      "lst": [1]}, (2, "b", {})),
    ({"step": 5, "policy": 7, "x": -1}, (5, "7", {"x": -1.0})),
])
def test_scalars_keeps_finite_numbers_only(row, want):
    """A metrics row's scalars: finite numbers as floats, booleans as 0/1; strings, None, nan, inf, lists dropped."""
    step, policy, vals = scalars(row)
    assert (step, policy, vals) == want
    assert all(type(v) is float for v in vals.values())


def test_registered_trackers_and_unknown_name():
    """``run.loggers`` names: jsonl, tensorboard, wandb; another name is refused naming the known ones."""
    assert (TRACKERS.get("jsonl"), TRACKERS.get("tensorboard"), TRACKERS.get("wandb")) == \
        (JsonlTracker, TensorBoardTracker, WandbTracker)
    with pytest.raises(GraftError, match=r"^unknown tracker 'mlflow'; known: jsonl, tensorboard, wandb$"):
        Trackers(SimpleNamespace(run=SimpleNamespace(loggers=["jsonl", "mlflow"])), "/tmp/none")


def _tb_scalars(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(os.path.join(run_dir, "tensorboard"))
    ea.Reload()
    return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}


def test_tensorboard_events_read_back_and_purged_on_resume(tmp_path):
    """TensorBoard: one scalar per numeric metric as ``<policy>/<metric>`` at the row's step; a run resumed after
    step 2 replaces what an earlier attempt wrote after it."""
    cfg = SimpleNamespace(run=SimpleNamespace(loggers=["jsonl", "tensorboard"]))
    run = str(tmp_path / "run")
    tr = Trackers(cfg, run)
    tr.log([{"step": 1, "policy": "a", "loss": 1.0, "note": "x"}, {"step": 1, "policy": "b", "loss": -1.0}])
    tr.log([{"step": 2, "policy": "a", "loss": 2.0}, {"step": 3, "policy": "a", "loss": 3.0, "ok": True}])
    tr.close()
    assert _tb_scalars(run) == {"a/loss": [(1, 1.0), (2, 2.0), (3, 3.0)], "b/loss": [(1, -1.0)], "a/ok": [(3, 1.0)]}
    tr = Trackers(cfg, run, start_step=2)  # resumed from step 2's checkpoint: step 3 is written again
    tr.log([{"step": 3, "policy": "a", "loss": 30.0}])
    tr.close()
    assert _tb_scalars(run)["a/loss"] == [(1, 1.0), (2, 2.0), (3, 30.0)]


@dataclasses.dataclass
class _RunCfg:
    wandb_project: str = "graft-tests"
    wandb_mode: str = "offline"
    loggers: list = dataclasses.field(default_factory=lambda: ["wandb"])


@dataclasses.dataclass
class _Cfg:
    run: _RunCfg = dataclasses.field(default_factory=_RunCfg)


class FakeWandb:
    """The part of ``wandb`` the tracker uses: ``init`` records its keywords and returns a run that records calls."""

    def __init__(self):
        self.inits, self.runs = [], []

    def init(self, **kw):
        self.inits.append(kw)
        run = SimpleNamespace(logged=[], defined=[], finished=False)
        run.log = run.logged.append
        run.define_metric = lambda name, **kw: run.defined.append((name, kw))

        def finish():
            run.finished = True

        run.finish = finish
        self.runs.append(run)
        return run


def test_wandb_run_named_after_the_run_and_resumable(tmp_path, monkeypatch):
    """W&B: project and mode from the config, the run's folder name, one id per run directory (the same on resume,
    whatever the path's spelling), every metric against ``step``; rows logged as ``<policy>/<metric>``."""
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    run = tmp_path / "my_run"
    run.mkdir()
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path)
    t1 = WandbTracker(_Cfg(), str(run) + "/")
    t2 = WandbTracker(_Cfg(), "my_run", start_step=4)
    WandbTracker(_Cfg(), str(tmp_path / "other"))
    a, b, c = fake.inits
    assert (a["project"], a["mode"], a["name"], a["dir"], a["resume"]) == ("graft-tests", "offline", "my_run",
                                                                            str(run) + "/", "allow")
    assert a["config"] == {"run": {"wandb_project": "graft-tests", "wandb_mode": "offline", "loggers": ["wandb"]}}
    assert b["name"] == "my_run" and a["id"] == b["id"] and a["id"] != c["id"]
    assert len(a["id"]) == 16 and int(a["id"], 16) >= 0
    assert fake.runs[0].defined == [("step", {}), ("*", {"step_metric": "step"})]
    t1.log([{"step": 2, "policy": "a", "loss": 0.5, "text": "x"}, {"step": 2, "policy": "b", "ok": True}])
    assert fake.runs[0].logged == [{"a/loss": 0.5, "step": 2}, {"b/ok": 1.0, "step": 2}]
    t2.close()
    assert fake.runs[1].finished and not fake.runs[0].finished


@pytest.mark.parametrize("name,module,msg", [
    ("wandb", "wandb", r"^config key 'run.loggers': wandb needs the wandb package \(pip install wandb\)$"),
    ("tensorboard", "torch.utils.tensorboard",
     r"^config key 'run.loggers': tensorboard needs the tensorboard package \(pip install tensorboard\)$"),
])
def test_missing_tracker_package_is_one_line(tmp_path, monkeypatch, name, module, msg):
    """A tracker whose package is not installed stops with one line naming ``run.loggers`` and the package."""
    monkeypatch.setitem(sys.modules, module, None)  # import of it fails as if it were not installed
    with pytest.raises(GraftError, match=msg):
        Trackers(_Cfg(run=_RunCfg(loggers=["jsonl", name])), str(tmp_path))


def test_trackers_feed_every_tracker_in_order(tmp_path, monkeypatch):
    """Trackers builds each named tracker with the run directory and start step, logs each batch of rows to all
    and closes all."""
    seen = []

    class Rec:
        def __init__(self, cfg, run_dir, start_step=0):
            seen.append(("init", run_dir, start_step))

        def log(self, rows):
            seen.append(("log", len(rows)))

        def close(self):
            seen.append(("close",))

    monkeypatch.setitem(TRACKERS._items, "unit_rec", Rec)
    tr = Trackers(SimpleNamespace(run=SimpleNamespace(loggers=["jsonl", "unit_rec"])), str(tmp_path), 7)
    assert [type(t) for t in tr.items] == [JsonlTracker, Rec]
    tr.log([{"step": 8}, {"step": 8}])
    tr.close()
    assert seen == [("init", str(tmp_path), 7), ("log", 2), ("close",)]


def test_step_line_says_what_the_exchange_says_of_each_row():
    """The run's step line holds each policy's reward and the words its exchange gives the row: GRAFT's peer groups
    and admitted responses, nothing for independent GRPO's exchange or a row without GRAFT's metrics."""
    from graft_cli.algorithms.exchange import EXCHANGES, Exchange
    from graft_cli.train.run import step_line

    rows = [{"policy": "a", "reward": 0.5, "graft/selected": 2, "graft/admitted": 7, "time/step": 3.21},
            {"policy": "b", "reward": 0.25, "graft/selected": 0, "time/step": 3.21}]
    graft = EXCHANGES.get("graft")()
    assert step_line(rows, graft) == ("a: r=0.500 peer groups 2 admitted 7 | b: r=0.250 peer groups 0 admitted 0"
                                      " | 3.2 s/step")
    assert step_line(rows, Exchange()) == "a: r=0.500 | b: r=0.250 | 3.2 s/step"
    assert step_line([{"policy": "a", "reward": 1.0, "time/step": 1.0}], graft) == "a: r=1.000 | 1.0 s/step"
