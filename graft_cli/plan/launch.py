"""Where a plan's runs execute: a :class:`Launcher` runs (or submits) them, tells each run's state
and cancels them. ``local`` (:class:`LocalLauncher`) trains and evaluates in this process or its
worker pool (:func:`graft_cli.plan.execute.execute`), then runs the plan's final step (results,
report); ``slurm`` (:class:`graft_cli.plan.slurm.SlurmLauncher`) makes every run a Slurm job, its
evaluation a job after it and the final step one job after every evaluation.

A run's state (:class:`RunState`) is read from its directory (last complete checkpoint, evaluation
done) and, for a scheduler, from the scheduler's record of the run's jobs: ``queued``, ``running``,
``finished``, ``failed (<STATE>)``, ``new`` / ``partial k/N`` (on disk, no job) or ``cancelled
(partner ... failed)``. """

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from graft_cli.errors import GraftError
from graft_cli.plan import status as S
from graft_cli.plan.spec import Plan, PlanRun
from graft_cli.report.markdown import md_table


@dataclass
class Finish:
    """The plan's final step once every run is trained and evaluated: ``call(records)`` in this
    process (local), or the ``graft`` command line ``argv`` that does the same from the run
    directories (a scheduler's last job)."""
    argv: list[str]
    call: Callable[[list[dict]], dict]


@dataclass
class LaunchOptions:
    """The options of ``graft reproduce`` / ``graft ablate`` a launcher reads."""
    jobs: int | None = None  # local: runs trained at the same time
    progress: bool = True
    console: object = None
    account: str | None = None  # slurm: #SBATCH lines (a plan's `slurm:` section gives defaults)
    partition: str | None = None
    qos: str | None = None
    time: str | None = None
    sbatch: list[str] = field(default_factory=list)  # extra #SBATCH options, e.g. "--constraint=h200"


@dataclass
class RunState:
    """One run as ``--status`` shows it."""
    run: str
    train: str  # queued | running | finished | failed (STATE) | new | partial k/N | cancelled (...)
    train_job: str = ""
    step: str = ""  # last complete checkpoint on disk / planned steps
    eval: str = ""  # queued | running | finished | failed (STATE) | not started | off
    eval_job: str = ""


class Launcher(Protocol):
    """Runs a plan's runs somewhere; ``--status`` and ``--cancel`` ask it about them."""
    name: str

    def launch(self, plan: Plan, out: str, finish: Finish) -> dict:
        """Train and evaluate (or submit) every run not finished, then the final step; returns what
        it did."""

    def status(self, plan: Plan, out: str) -> list[RunState]:
        """Each run's state, in plan order."""

    def cancel(self, plan: Plan, out: str) -> list[str]:
        """Stop the plan's queued and running work; returns what was cancelled."""


def disk_state(plan: Plan, r: PlanRun, out: str) -> tuple[S.RunStatus, str]:
    """(training status on disk, evaluation label on disk: finished | not started | off)."""
    d = plan.run_dir(r, out)
    st = S.run_status(d, plan.steps)
    ev = plan.eval_for(r)
    if not ev.enabled:
        return st, "off"
    done = st.finished and S.eval_done(d, ev.steps, ev.runs, ev.samples, ev.benchmarks, ev.bench_runs)
    return st, "finished" if done else "not started"


def step_label(st: S.RunStatus) -> str:
    return f"{st.step}/{'?' if st.total is None else st.total}"


def status_markdown(plan: Plan, states: list[RunState]) -> str:
    cols = ["run", "training", "job", "step", "evaluation", "job"]
    return md_table(cols, [[s.run, s.train, s.train_job or "—", s.step, s.eval, s.eval_job or "—"] for s in states])


class LocalLauncher:
    """This machine: :func:`~graft_cli.plan.execute.execute` (one process, or ``jobs`` worker
    processes)."""
    name = "local"

    def __init__(self, opts: LaunchOptions):
        self.opts = opts

    def launch(self, plan: Plan, out: str, finish: Finish) -> dict:
        from graft_cli.plan import execute as X  # lazy: torch and the trainer load only to train

        records = X.execute(plan, out, jobs=self.opts.jobs, progress=self.opts.progress, console=self.opts.console)
        return {"records": records, **finish.call(records)}

    def status(self, plan: Plan, out: str) -> list[RunState]:
        rows = []
        for r in plan.runs:
            st, ev = disk_state(plan, r, out)
            rows.append(RunState(plan.run_name(r), "finished" if st.finished else st.label().split(" (")[0],
                                 step=step_label(st), eval=ev))
        return rows

    def cancel(self, plan: Plan, out: str) -> list[str]:
        raise GraftError("--cancel: the local launcher runs the plan in the command's own process; stop it with "
                         "Ctrl-C (every run resumes from its last checkpoint)")
