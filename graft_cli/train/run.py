"""The run driver: :func:`train` runs (or resumes) a run: the checks before anything is written (a
writable run directory, :func:`~graft_cli.train.policies.preflight`, a resumed run's config against
the one on disk), the run directory's lock, ``config.yaml``, the step loop with its checkpoints,
after-step hooks and progress, and the one-line endings of a stopped run (SIGTERM, a lost
data-parallel peer)."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import threading
from dataclasses import dataclass

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from graft_cli import config as C
from graft_cli.console import make_console
from graft_cli.errors import GraftError, PeerLost, Stopped
from graft_cli.rundir import atomic_write_text, check_writable, config_path
from graft_cli.train import checkpoint as ckpt
from graft_cli.train import dist as D
from graft_cli.train.hooks import AfterStep
from graft_cli.train.loop import Trainer
from graft_cli.train.provenance import record_session
from graft_cli.train.policies import preflight
from graft_cli.train.trackers import TRACKERS, Trackers


def run_dir_for(cfg: C.Config) -> str:
    name = cfg.run.name or f"{cfg.pair}-{cfg.method}-s{cfg.run.seed}"
    return os.path.join(cfg.run.out, name)


RESUME_MAY_DIFFER = {"run.steps", "run.resume", "run.keep_checkpoints", "run.save_every", "run.save_on_signal",
                     "run.sync_check", "run.sync_tolerance",
                     "run.log_rollouts",
                     "run.loggers", "run.wandb_project", "run.wandb_mode", "run.log_every",
                     "reward.num_workers", "reward.memory_mb", "run.threads", "run.device", "run.keep_rollouts",
                     "optim.on_nonfinite", "run.out", "run.name",  # run.out, run.name: the run itself (it may move)
                     "run.policy_workers",  # identical results (train/parallel.py)
                     "run.dist_timeout_s", "run.checkpoint_format"}  # any format resumes at any world size
RESUME_MAY_DIFFER |= {f"eval.{k}" for k in ("every", "benchmarks", "data_dir", "samples", "runs", "max_new_tokens",
                                              "temperature", "top_p", "seed", "save_best")}  # validation only


def _flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def check_resumable(cfg: C.Config, out_dir: str) -> None:
    path = config_path(out_dir)
    if not os.path.exists(path):
        return
    old = _flat(C.asdict(C.load_yaml(path)))
    new = _flat(C.asdict(cfg))
    diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k) and k not in RESUME_MAY_DIFFER)
    if diff:
        raise GraftError(f"{out_dir}: holds a run with a different config ({', '.join(diff[:5])}); "
                         f"use another run.name/--out, or run.resume=false to start over")


_LOCKS: dict = {}


def _lock_run_dir(out: str) -> None:
    """One training process per run directory: an exclusive ``flock`` on ``<run>/.lock``, released
    by the OS when the process ends (also on a kill), so a second `graft train` on the same run
    stops at once."""

    f = open(os.path.join(out, ".lock"), "w")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise GraftError(f"{out}: another graft process is training in this run directory") from None
    _LOCKS[out] = f


def _unlock_run_dir(out: str) -> None:
    """Release this process's lock of ``out`` (a run that ended: the same process may train it
    again)."""
    f = _LOCKS.pop(out, None)
    if f is not None:
        f.close()


class _Preempt(BaseException):
    """Raised by the SIGTERM handler where the main thread is (the step is abandoned; every write is
    atomic)."""


class SignalStop:
    """SIGTERM during :func:`train` (a scheduler's preemption; installed in the main thread only).
    By default the step in progress is **abandoned** at once: the handler raises where the main
    thread is, every file write is atomic (a temporary name, then a rename), so nothing half-written
    is left and the run resumes from its last checkpoint. With ``run.save_on_signal`` the step is
    **finished**, its checkpoint written, and the run stops at that step boundary (a second SIGTERM
    abandons it). Either way the run ends with :class:`Stopped` (exit 143) and one line."""

    def __init__(self, save_on_signal: bool):
        self.save, self.requested, self._old = save_on_signal, False, None
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame):
        if self.save and not self.requested:
            self.requested = True  # finish the step, checkpoint it, stop (train() checks at the boundary)
            return
        raise _Preempt()

    def restore(self) -> None:
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
            self._old = None


def check_inputs(cfg: C.Config, out: str) -> None:
    """What can be checked before anything is loaded or written: a writable run directory, the
    models' vocabularies (:func:`~graft_cli.train.policies.preflight`), a resumed run's config
    against the one on disk, the trackers' names."""
    check_writable(out, "run.out")
    preflight(cfg)
    if cfg.run.resume:
        check_resumable(cfg, out)  # read-only: refuse a different config before loading anything
    for name in cfg.run.loggers:
        TRACKERS.get(name)


def open_run_dir(cfg: C.Config, out: str) -> None:
    """Lock the run directory, clear an earlier run there unless resuming (the lock stays), write
    ``config.yaml``."""
    os.makedirs(out, exist_ok=True)
    _lock_run_dir(out)
    if os.path.exists(config_path(out)) and not cfg.run.resume:
        for entry in os.listdir(out):  # start over, keeping only our lock
            if entry != ".lock":
                path = os.path.join(out, entry)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    if cfg.run.resume:
        check_resumable(cfg, out)  # again under the lock
    atomic_write_text(config_path(out), C.to_yaml(cfg))


def train(cfg: C.Config, progress: bool = True, console=None, after_step: tuple[AfterStep, ...] = ()) -> str:
    """Run (or resume) a training run; returns the run directory. Each :class:`AfterStep` hook that
    is due is called as ``hook(view, cfg, run_dir, console)`` (``view``:
    :class:`~graft_cli.train.hooks.StepView`) after the step's checkpoint and may return metrics
    rows to log."""
    console = console or make_console(stderr=True)
    out = run_dir_for(cfg)
    is_main = D.launched_main()  # data-parallel runs: only rank 0 writes files
    check_inputs(cfg, out)  # nothing is written before the inputs are known good
    # every input (models, tokenizers, data, rewards) is loaded and checked before the run directory
    # is touched
    trainer = Trainer(cfg, out, progress and is_main, console)
    run = _Run(cfg, out, console, trainer, after_step, SignalStop(cfg.run.save_on_signal), is_main,
               progress and is_main)
    try:
        for hook in after_step:  # the hooks' inputs too (validation benchmarks), before anything is written
            hook.prepare(trainer.view(), cfg)
        if is_main:
            open_run_dir(cfg, out)
            resumed = (ckpt.valid_steps(trainer.ckpt_root) or [0])[-1] if cfg.run.resume else 0
            record_session(cfg, out, RESUME_MAY_DIFFER, resumed)  # provenance.json: commit, config and build hashes
        run.loop(run.start())
    except PeerLost as e:  # another data-parallel rank died or hung (train/dist.py): one line, exit 75
        raise PeerLost(f"{e}; {trainer.step} steps done, {on_disk(trainer)}; relaunch every rank to resume") \
            from None
    except RuntimeError as e:  # a collective inside FSDP / a checkpoint gather (NCCL, the store, gloo)
        if not (trainer.dist.enabled and (isinstance(e, torch.distributed.DistError) or "gloo" in str(e))):
            raise
        raise PeerLost(f"{D.peer_lost(trainer.dist, 'a collective', e)}; {trainer.step} steps done, "
                       f"{on_disk(trainer)}; relaunch every rank to resume") from None
    except _Preempt:
        last = ckpt.valid_steps(trainer.ckpt_root)
        raise Stopped(f"stopped by SIGTERM during step {trainer.step + 1}, which was abandoned; "
                      + (f"the last checkpoint (step {last[-1]}) is intact; " if last else "no checkpoint yet; ")
                      + "rerun the same command to continue") from None
    finally:
        run.stop.restore()
        trainer.close()
        _unlock_run_dir(out)
    if is_main:
        console.print(f"run directory: {out} ({disk_use(out) / 2**20:.1f} MiB on disk)", soft_wrap=True)
    return out


@dataclass
class _Run:
    """One call of :func:`train` once its inputs are loaded: the step loop, its checkpoints, hooks
    and progress."""

    cfg: C.Config
    out: str
    console: object
    trainer: Trainer
    hooks: tuple
    stop: SignalStop
    is_main: bool
    progress: bool
    trackers: Trackers | None = None

    def start(self) -> bool:
        """Resume from the newest valid checkpoint (True), or start at step 0 with metrics.jsonl
        cleared."""
        trainer, console = self.trainer, self.console
        resumed = self.cfg.run.resume and trainer.resume()
        if resumed:
            console.print(f"resumed from step {trainer.step} in {self.out}")
            if trainer.step >= trainer.total_steps:  # e.g. --steps below the checkpoint's step: nothing is undone
                console.print(f"the checkpoint's step {trainer.step} is at or past this run's {trainer.total_steps} "
                              f"steps: nothing to train (raise --steps to continue; the checkpoint is unchanged)")
        elif self.is_main:
            mpath = trainer.metrics.path
            if os.path.exists(mpath) and os.path.getsize(mpath) > 0:
                console.print(f"{self.out}: no complete checkpoint; starting at step 0 (metrics.jsonl of the earlier "
                              f"attempt is cleared)")
            trainer.metrics.truncate_after(0)
        return resumed

    def log(self, rows: list[dict]) -> None:
        if self.is_main and rows:
            self.trainer.metrics.write(rows)
            self.trackers.log(rows)

    def run_hooks(self, pending: bool) -> None:
        """The hooks due after the trainer's step (e.g. validation: eval/<policy>/step_N/,
        best.json); ``pending``: only those whose work for the step is not on disk."""
        for hook in self.hooks:
            view = self.trainer.view()
            if hook.due(view, self.cfg) and not (pending and hook.done(view, self.cfg, self.out)):
                self.trainer.settle()  # the engines hold the weights the hook evaluates
                self.log(hook(view, self.cfg, self.out, None))

    def loop(self, resumed: bool) -> None:
        """Steps until the run's last: each step's metrics, its checkpoint (before any hook), the
        hooks, progress (a terminal gets rich's live bar; a log one plain line every
        ``run.log_every`` steps)."""
        trainer, cfg = self.trainer, self.cfg
        self.trackers = Trackers(cfg, self.out, trainer.step) if self.is_main else None
        live = self.progress and self.console.is_terminal
        cols = [TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("{task.fields[info]}")]
        try:
            with Progress(*cols, console=self.console, disable=not live, transient=False) as bar:
                task = bar.add_task("train", total=trainer.total_steps, completed=trainer.step, info="")
                if resumed:  # the hooks of the step it resumed at, if they had not finished (killed in validation)
                    self.run_hooks(pending=True)
                elif cfg.run.save_initial and trainer.step == 0:  # the base weights, as step 0
                    trainer.save()
                while trainer.step < trainer.total_steps:
                    info = step_line(self.one_step(), trainer.exchange)
                    bar.update(task, completed=trainer.step, info=info)
                    if self.progress and not live and (trainer.step % cfg.run.log_every == 0
                                                       or trainer.step == trainer.total_steps):
                        self.console.print(f"step {trainer.step}/{trainer.total_steps} {info}", soft_wrap=True,
                                           highlight=False)
        finally:
            if self.trackers is not None:
                self.trackers.close()

    def one_step(self) -> list[dict]:
        """Train one step, log it, checkpoint it when due (always before a hook runs or a requested
        stop), stop on a requested SIGTERM, run the hooks; returns the step's rows."""
        trainer, cfg = self.trainer, self.cfg
        try:
            rows = trainer.train_step()
        except PeerLost:
            raise
        except GraftError as e:  # say what is on disk: the checkpoint a rerun resumes from, if any
            raise GraftError(f"{e}; {on_disk(trainer)}") from None
        self.log(rows)
        if cfg.run.save_every and (trainer.step % cfg.run.save_every == 0 or trainer.step == trainer.total_steps
                                   or any(h.due(trainer.view(), cfg) for h in self.hooks) or self.stop.requested):
            trainer.save()  # complete on disk before any hook runs
        if self.stop.requested:  # run.save_on_signal: the step is finished and checkpointed
            raise Stopped(f"stopped by SIGTERM after step {trainer.step}; its checkpoint is written "
                          f"(run.save_on_signal); rerun the same command to continue")
        self.run_hooks(pending=False)
        return rows


def on_disk(trainer) -> str:
    """What a rerun resumes from: the newest checkpoint that verifies, or step 0."""
    last = ckpt.valid_steps(trainer.ckpt_root)
    return f"the last checkpoint (step {last[-1]}) is intact" if last else \
        "no checkpoint was written yet (a rerun starts at step 0)"


def step_line(rows: list[dict], exchange) -> str:
    """One step in a line: per policy the reward and what the run's exchange says of its row
    (:meth:`~graft_cli.algorithms.exchange.base.Exchange.step_text`), then seconds per step."""
    parts = []
    for r in rows:
        p = f"{r['policy']}: r={r.get('reward', float('nan')):.3f}"
        said = exchange.step_text(r)
        parts.append(f"{p} {said}" if said else p)
    return " | ".join(parts) + f" | {rows[0]['time/step']:.1f} s/step"


def disk_use(path: str) -> int:
    """Bytes of every file under ``path``."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs
               if os.path.isfile(os.path.join(d, f)))
