"""The Slurm launcher (``--launcher slurm``): every run of a plan is one batch job, its evaluation a
job after it, and the plan's final step (results, report) one job after every evaluation.

Per run not finished on disk, in plan order (partners first):

- a **training job** ``<prefix><run>-train``: ``graft train`` with the run's config and
  ``run.save_on_signal=true``, one process under ``srun``, or (more than one GPU, several nodes, or
  ``resources.launch: torchrun``) the torchrun line of ``experiments/slurm/graft_multinode.sbatch``
  (one torchrun agent per node, c10d rendezvous on the first); ``--signal=TERM@120 --requeue``: on
  preemption or near the time limit the run checkpoints and the job requeues or ends, and the next
  submission resumes it. A stored-trajectory run's job waits for its partner's training job
  (``--dependency=afterok:<id>``);
- an **evaluation job** ``<prefix><run>-eval``: ``graft eval --run DIR`` with the plan's settings,
  after the run's training job (``afterok``);
- one **report job** ``<prefix>report`` after every evaluation job (``afterany``): the same ``graft
  reproduce`` / ``graft ablate`` command with ``--report-only``.

Dependent jobs carry ``--kill-on-invalid-dep=yes``: when a training job fails, Slurm cancels what
waits on it (``--status`` says so; the next submission resubmits the failed run and its dependants).

Scripts go to ``<out>/slurm/`` (``<run>.train.sbatch``, ``<run>.eval.sbatch``,
``report_<plan>.sbatch``; readable, and ``sbatch FILE`` resubmits one by hand), job output to
``<out>/slurm/logs/``, and the job ids to the ledger ``<out>/slurm/jobs.json`` (written atomically
under a lock; keyed by run directory, so plans sharing an output folder share it). Submitting again
resubmits only what is not finished and never a job that is still queued or running.

``#SBATCH`` settings: the run's ``resources`` (nodes, GPUs per node, CPUs, memory; time = 1.5 x the
expected hours, at least 10 minutes) and the options ``--account``, ``--partition``, ``--qos``,
``--time``, ``--sbatch`` (extra lines), over the plan's ``slurm:`` section (same keys, ``extra`` for
the extra lines; ``job_prefix``; ``gpu_type`` for ``--gpus-per-node=TYPE:N``; ``setup``: shell lines
run first, e.g. ``module load``; ``overrides``: config overrides of every run submitted to Slurm,
e.g. ``scale=4xh200``).

Before anything is written: ``sbatch`` must be on PATH and every run must fit the partition
(``sinfo``: GPUs and CPUs per node, nodes); else one line and nothing is submitted. """

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace

from graft_cli.config import EXPERIMENTS_DIR
from graft_cli.errors import GraftError
from graft_cli.plan.launch import Finish, LaunchOptions, RunState, disk_state, step_label
from graft_cli.plan.spec import Plan, PlanRun, Resources
from graft_cli.rundir import atomic_write_json, atomic_write_text, folder_lock, read_json_or_none

TEMPLATE = os.path.join(EXPERIMENTS_DIR, "slurm", "graft_multinode.sbatch")
SLURM_KEYS = ("account", "partition", "qos", "time", "extra", "job_prefix", "gpu_type", "setup", "overrides",
              "report_time")
QUEUED = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "SUSPENDED", "RESIZING", "STOPPED"}
RUNNING = {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT"}
NEVER = "DependencyNeverSatisfied"  # a pending job's reason once what it waits on has failed
SIGNAL = "TERM@120"  # run.save_on_signal checkpoints within the two minutes


# ------------------------------------------------------------------------------------------ the scheduler
@dataclass
class Job:
    id: str
    state: str  # Slurm's job state (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...) or UNKNOWN
    reason: str = ""

    @property
    def active(self) -> bool:
        return self.state in QUEUED or self.state in RUNNING

    def label(self) -> str:
        if self.state in QUEUED:
            return "queued" + (f" ({self.reason})" if self.reason and self.reason != "None" else "")
        if self.state in RUNNING:
            return "running"
        return "finished" if self.state == "COMPLETED" else f"failed ({self.state})"


def _run(argv: list[str], what: str) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise GraftError(f"--launcher slurm: {argv[0]} not found on PATH (a Slurm client is needed)") from None
    except subprocess.TimeoutExpired:
        raise GraftError(f"--launcher slurm: {what} did not answer in 120 s") from None
    if p.returncode != 0:
        err = (p.stderr or p.stdout).strip().splitlines()
        raise GraftError(f"--launcher slurm: {what} failed: {err[-1] if err else f'exit {p.returncode}'}")
    return p.stdout


def require_sbatch() -> None:
    if shutil.which("sbatch") is None:
        raise GraftError("--launcher slurm: sbatch not found on PATH (run on a Slurm login node, or install the "
                         "Slurm client); nothing submitted")


def submit(script: str, dependency: str | None = None) -> str:
    """``sbatch --parsable [--dependency=... --kill-on-invalid-dep=yes] SCRIPT`` -> the job id."""
    argv = ["sbatch", "--parsable"]
    if dependency:
        argv += [f"--dependency={dependency}", "--kill-on-invalid-dep=yes"]
    out = _run(argv + [script], f"sbatch {os.path.basename(script)}").strip()
    job = out.split(";")[0]
    if not job.isdigit():
        raise GraftError(f"--launcher slurm: sbatch {os.path.basename(script)} answered {out!r}, not a job id")
    return job


def job_states(ids: list[str]) -> dict[str, Job]:
    """Each job's state: ``squeue`` for the jobs Slurm still holds, ``sacct`` for the ones it has
    let go (jobs neither knows are UNKNOWN)."""
    ids = sorted({i for i in ids if i}, key=int)
    if not ids:
        return {}
    out: dict[str, Job] = {}
    for line in _run(["squeue", "-h", "--states=all", "-o", "%i|%T|%r"], "squeue").splitlines():
        jid, state, reason = (line.split("|") + ["", ""])[:3]
        if jid.strip() in ids:
            out[jid.strip()] = Job(jid.strip(), state.strip(), reason.strip())
    rest = [i for i in ids if i not in out]
    if rest:
        try:
            text = _run(["sacct", "-X", "-n", "-P", "-j", ",".join(rest), "--format=JobID,State,Reason"], "sacct")
        except GraftError:
            text = ""  # no accounting storage: what squeue forgot stays UNKNOWN
        for line in text.splitlines():
            jid, state, reason = (line.split("|") + ["", ""])[:3]
            if jid in rest:
                out[jid] = Job(jid, state.split()[0] if state else "UNKNOWN", reason)
    return {i: out.get(i, Job(i, "UNKNOWN")) for i in ids}


def cancel_jobs(ids: list[str]) -> None:
    if ids:
        _run(["scancel", *ids], "scancel")


def partition_limits(partition: str | None) -> tuple[str, int, int, int]:
    """(partition, most GPUs on one node, most CPUs on one node, nodes) from ``sinfo``; the default
    partition when ``partition`` is None."""
    argv = ["sinfo", "-h", "-o", "%P|%c|%G|%D"] + (["-p", partition] if partition else [])
    rows = [ln.split("|") for ln in _run(argv, "sinfo").splitlines() if ln.count("|") == 3]
    if partition is None:
        rows = [r for r in rows if r[0].endswith("*")]
    if not rows:
        raise GraftError(f"--launcher slurm: partition {partition!r} not found (sinfo)" if partition else
                         "--launcher slurm: no default partition (sinfo); name one with --partition")
    name = rows[0][0].rstrip("*")
    gpus = max(gres_gpus(r[2]) for r in rows)
    cpus = max(int(re.sub(r"\D", "", r[1]) or 0) for r in rows)
    return name, gpus, cpus, sum(int(re.sub(r"\D", "", r[3]) or 0) for r in rows)


def gres_gpus(gres: str) -> int:
    """GPUs per node in a ``sinfo %G`` field: ``gpu:h200:8(S:0-1),shard:4`` -> 8, ``(null)`` ->
    0."""
    n = 0
    for item in gres.split(","):
        parts = re.sub(r"\(.*?\)", "", item).split(":")
        if parts[0] == "gpu" and len(parts) > 1 and parts[-1].isdigit():
            n += int(parts[-1])
    return n


def check_fits(plan: Plan, partition: str | None) -> None:
    """One line for the first run that asks for more than the partition has; nothing when every run
    fits."""
    name, gpus, cpus, nodes = partition_limits(partition)
    for r in plan.runs:
        res = plan.resources_for(r)
        for what, want, have in (("GPUs per node", max(res.gpus, res.eval_gpu_count), gpus),
                                 ("CPUs per node", res.cpus, cpus), ("nodes", res.nodes, nodes)):
            if want > have:
                raise GraftError(f"{plan.source or plan.name}: run {plan.run_name(r)} asks for {want} {what}; "
                                 f"partition {name} has at most {have} (sinfo); nothing submitted")


# ------------------------------------------------------------------------------------------- scripts
def slurm_time(hours: float | None) -> str | None:
    """1.5 x the expected hours (at least 10 minutes) as D-HH:MM:SS; None without an estimate."""
    if hours is None:
        return None
    minutes = max(10, math.ceil(round(hours * 90, 6)))  # 1.5 x 60, rounded: 20.8 h is 1,872 min
    return f"{minutes // 1440}-{minutes % 1440 // 60:02d}:{minutes % 60:02d}:00"


def template_body() -> list[str]:
    """The multi-node template's shell part: every line after its last ``#SBATCH`` line."""
    with open(TEMPLATE, encoding="utf-8") as f:
        lines = f.read().splitlines()
    last = max(i for i, ln in enumerate(lines) if ln.startswith("#SBATCH"))
    return lines[last + 1:]


def sbatch_lines(settings: dict, name: str, res: Resources, gpus: int, time: str | None, logs: str) -> list[str]:
    """The ``#SBATCH`` header of one job."""
    lines = [f"--job-name={name}", f"--nodes={res.nodes}", "--ntasks-per-node=1", f"--cpus-per-task={res.cpus}"]
    if gpus:
        gtype = settings.get("gpu_type")
        lines.append(f"--gpus-per-node={gtype}:{gpus}" if gtype else f"--gpus-per-node={gpus}")
    if res.mem:
        lines.append(f"--mem={res.mem}")
    if time:
        lines.append(f"--time={time}")
    for key in ("partition", "account", "qos"):
        if settings.get(key):
            lines.append(f"--{key}={settings[key]}")
    lines += [f"--signal={SIGNAL}", "--requeue", f"--output={logs}/%x-%j.out", f"--chdir={os.getcwd()}"]
    return ["#SBATCH " + x for x in lines + list(settings.get("extra") or [])]


def job_script(header: list[str], comment: str, settings: dict, command: list[str], torchrun: bool,
               gpus: int, cpus: int) -> str:
    """A batch script: header, environment, the plan's setup lines, then ``graft <command>`` under
    srun (one process) or through the multi-node template's torchrun line."""
    env = [f"export PATH={shlex.quote(os.path.dirname(sys.executable))}:$PATH",
           f"export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-{max(1, cpus // max(1, gpus))}}}"]
    body = ["set -euo pipefail", *env, *list(settings.get("setup") or [])]
    args = " ".join(shlex.quote(a) for a in command)
    if torchrun:  # the template runs `graft train "$@"`
        if command[0] != "train":
            raise GraftError(f"{TEMPLATE} launches graft train only, not graft {command[0]}")
        args = " ".join(shlex.quote(a) for a in command[1:])
        body += [f"export GPUS_PER_NODE={max(1, gpus)}",
                 "export GRAFT_RDZV_PORT=${GRAFT_RDZV_PORT:-$((29500 + SLURM_JOB_ID % 1000))}",
                 f"# {os.path.relpath(TEMPLATE)}: one torchrun agent per node", f"set -- {args}",
                 *[ln for ln in template_body() if ln.strip() != "set -euo pipefail"]]
    else:
        body.append(f"srun --kill-on-bad-exit=1 python -m graft_cli.cli {args}")
    return "\n".join(["#!/bin/bash", *[f"# {c}" for c in comment.splitlines()], *header, *body]) + "\n"


def train_command(plan: Plan, r: PlanRun, out: str, settings: dict) -> list[str]:
    argv = ["train", "--pair", plan.run_pair(r), "--method", r.method, "--out", out, "--seed", str(r.seed),
            "--name", plan.run_name(r), "--no-progress"]
    if plan.steps is not None:
        argv += ["--steps", str(plan.steps)]
    return argv + plan.entry_overrides(r, out) + ["run.save_on_signal=true"] + list(settings.get("overrides") or [])


def eval_command(plan: Plan, r: PlanRun, out: str) -> list[str]:
    argv = ["eval", "--run", plan.run_dir(r, out), "--no-progress"]
    for k, v in plan.eval_for(r).kwargs().items():
        if v is None:
            continue
        if k == "bench_runs":
            v = ",".join(f"{b}={n}" for b, n in v.items())
        argv += [f"--{k.replace('_', '-')}", str(v)]
    return argv


# -------------------------------------------------------------------------------------------- ledger
class Ledger:
    """``<out>/slurm/jobs.json``: per run directory the ids of its training and evaluation jobs
    (newest last), per plan its report jobs."""

    def __init__(self, folder: str):
        self.path = os.path.join(folder, "jobs.json")
        raw = read_json_or_none(self.path) or {}
        self.runs: dict = raw.get("runs") or {}
        self.reports: dict = raw.get("reports") or {}

    def last(self, run: str, kind: str) -> str | None:
        ids = (self.runs.get(run) or {}).get(kind) or []
        return ids[-1] if ids else None

    def add(self, run: str, kind: str, job: str) -> None:
        self.runs.setdefault(run, {}).setdefault(kind, []).append(job)
        self.save()

    def add_report(self, plan: str, job: str) -> None:
        self.reports.setdefault(plan, []).append(job)
        self.save()

    def save(self) -> None:
        atomic_write_json(self.path, {"runs": self.runs, "reports": self.reports})


def locked(folder: str):
    """One submission at a time per output folder (``jobs.json.lock``)."""
    return folder_lock(folder, "jobs.json.lock")


# ------------------------------------------------------------------------------------------ launcher
def merged_settings(plan: Plan, opts: LaunchOptions) -> dict:
    """The plan's ``slurm:`` section under the command-line options."""
    bad = sorted(set(plan.slurm) - set(SLURM_KEYS))
    if bad:
        raise GraftError(f"{plan.source}: slurm: unknown key {bad[0]!r}; known: {', '.join(SLURM_KEYS)}")
    s = dict(plan.slurm)
    for key in ("account", "partition", "qos", "time"):
        if getattr(opts, key):
            s[key] = getattr(opts, key)
    s["extra"] = [str(x) for x in (s.get("extra") or [])] + list(opts.sbatch)
    for x in s["extra"]:
        if not x.startswith("-") or "\n" in x:
            raise GraftError(f"--sbatch / slurm.extra {x!r}: an sbatch option such as --constraint=h200")
    s.setdefault("job_prefix", f"graft-{plan.name}-")
    return s


class SlurmLauncher:
    """Every run a Slurm job (module docstring)."""
    name = "slurm"

    def __init__(self, opts: LaunchOptions):
        self.opts = opts

    def launch(self, plan: Plan, out: str, finish: Finish) -> dict:
        require_sbatch()
        settings = merged_settings(plan, self.opts)
        check_fits(plan, settings.get("partition"))
        out = os.path.abspath(out)
        check_configs(plan, out)
        folder = os.path.join(out, "slurm")
        with locked(folder):
            return Submission(plan, out, folder, settings, finish).run()

    def status(self, plan: Plan, out: str) -> list[RunState]:
        out = os.path.abspath(out)
        ledger = Ledger(os.path.join(out, "slurm"))
        jobs = job_states([j for r in plan.runs for k in ("train", "eval")
                           if (j := ledger.last(plan.run_name(r), k))])
        cancel_never_satisfied(jobs)
        return [run_state(plan, r, out, ledger, jobs) for r in plan.runs]

    def cancel(self, plan: Plan, out: str) -> list[str]:
        out = os.path.abspath(out)
        ledger = Ledger(os.path.join(out, "slurm"))
        ids = [j for r in plan.runs for k in ("train", "eval") if (j := ledger.last(plan.run_name(r), k))]
        ids += (ledger.reports.get(plan.name) or [])[-1:]
        active = [j.id for j in job_states(ids).values() if j.active]
        cancel_jobs(active)
        return active


def check_configs(plan: Plan, out: str) -> None:
    """Compose every run's config before anything is submitted (a stored-trajectory run once its
    partner has run; its job composes it), and build the tiny pair once here when the plan uses it
    (jobs never build it at once)."""
    from graft_cli.plan import execute as X  # lazy: composing loads the method registries

    for row in X.describe(plan, out):
        if row["config"].startswith("error"):
            raise GraftError(f"{plan.source or plan.name}: run {row['run']}: {row['config'][7:]}; nothing submitted")
    if X.uses_tiny(plan, out):
        X.tiny_identity(progress=False, code=X.uses_tiny(plan, out, "tiny_code"), roles=X.tiny_roles(plan, out))


def cancel_never_satisfied(jobs: dict[str, Job]) -> list[str]:
    """Cancel the pending jobs whose dependency failed (a cluster that keeps them pending); they
    read failed."""
    never = [j.id for j in jobs.values() if j.state in QUEUED and j.reason == NEVER]
    cancel_jobs(never)
    for i in never:
        jobs[i] = Job(i, "CANCELLED", NEVER)
    return never


def job_label(job: Job | None, on_disk: str, upstream: str | None) -> str:
    """A job's state for ``--status``: what is on disk wins once finished; a job cancelled because
    what it waited on failed says which (``upstream``)."""
    if on_disk == "finished" or job is None:
        return on_disk
    if job.state == "CANCELLED" and upstream:
        return f"cancelled ({upstream})"
    return job.label()


def run_state(plan: Plan, r: PlanRun, out: str, ledger: Ledger, jobs: dict[str, Job]) -> RunState:
    st, ev = disk_state(plan, r, out)
    name = plan.run_name(r)
    tj, ej = ledger.last(name, "train"), ledger.last(name, "eval")
    upstream = None
    if r.partner:
        partner = plan.run_name(plan.by_key()[r.partner_key()])
        pj = jobs.get(ledger.last(partner, "train") or "")
        if pj is not None and not pj.active and pj.state != "COMPLETED":
            upstream = f"partner {partner} failed"
    train = job_label(jobs.get(tj or ""), "finished" if st.finished else st.label().split(" (")[0], upstream)
    if ev != "off" and ej:
        ev = job_label(jobs.get(ej), ev, upstream or ("training failed" if train.startswith("failed") else None))
    return RunState(name, train, tj or "", step_label(st), ev, ej or "")


class Submission:
    """One ``--launcher slurm`` submission of a plan (under the output folder's lock)."""

    def __init__(self, plan: Plan, out: str, folder: str, settings: dict, finish: Finish):
        self.plan, self.out, self.folder, self.settings, self.finish = plan, out, folder, settings, finish
        self.ledger = Ledger(folder)
        self.logs = os.path.join(folder, "logs")
        self.submitted: list[dict] = []
        self.kept: list[dict] = []

    def run(self) -> dict:
        os.makedirs(self.logs, exist_ok=True)
        ids = [j for r in self.plan.runs for k in ("train", "eval") if (j := self.ledger.last(self.plan.run_name(r),
                                                                                              k))]
        self.jobs = job_states(ids + (self.ledger.reports.get(self.plan.name) or [])[-1:])
        cancelled = cancel_never_satisfied(self.jobs)
        train_ids: dict[str, str | None] = {}
        eval_ids: list[str] = []
        for r in self.plan.runs:
            train_ids[r.key] = self.training(r, train_ids)
            ev = self.evaluation(r, train_ids[r.key])
            if ev:
                eval_ids.append(ev)
        report = self.report(eval_ids)
        return {"submitted": self.submitted, "kept": self.kept, "cancelled": cancelled, "report": report,
                "folder": self.folder}

    def active(self, job: str | None) -> bool:
        return bool(job) and self.jobs.get(job, Job(job, "UNKNOWN")).active

    def note(self, kind: str, run: str, job: str, new: bool, dep: str | None = None) -> None:
        (self.submitted if new else self.kept).append({"kind": kind, "run": run, "job": job, "dependency": dep})

    def training(self, r: PlanRun, train_ids: dict) -> str | None:
        """The run's training job id (kept if queued or running, else submitted), or None once
        finished."""
        plan, name = self.plan, self.plan.run_name(r)
        st, _ = disk_state(plan, r, self.out)
        if st.finished:
            return None
        old = self.ledger.last(name, "train")
        if self.active(old):
            self.note("train", name, old, False)
            return old
        dep = train_ids.get(r.partner_key()) if r.partner else None
        res = plan.resources_for(r)
        script = self.write(f"{name}.train.sbatch", f"{name}-train", res, res.gpus,
                            self.settings.get("time") or slurm_time(res.hours),
                            train_command(plan, r, self.out, self.settings), res.uses_torchrun(),
                            f"plan {plan.name}, run {name}: training (resumes from its last checkpoint)")
        job = submit(script, f"afterok:{dep}" if dep else None)
        self.ledger.add(name, "train", job)
        self.note("train", name, job, True, dep)
        return job

    def evaluation(self, r: PlanRun, train_job: str | None) -> str | None:
        """The run's evaluation job id (kept, submitted after ``train_job``), or None when done or
        off."""
        plan, name = self.plan, self.plan.run_name(r)
        _, ev = disk_state(plan, r, self.out)
        if ev in ("finished", "off"):
            return None
        old = self.ledger.last(name, "eval")
        if self.active(old):
            self.note("eval", name, old, False)
            return old
        res = plan.resources_for(r)
        eres = replace(res, nodes=1)
        script = self.write(f"{name}.eval.sbatch", f"{name}-eval", eres, res.eval_gpu_count,
                            slurm_time(res.eval_hours), eval_command(plan, r, self.out), False,
                            f"plan {plan.name}, run {name}: evaluation (graft eval keeps finished files)")
        job = submit(script, f"afterok:{train_job}" if train_job else None)
        self.ledger.add(name, "eval", job)
        self.note("eval", name, job, True, train_job)
        return job

    def report(self, eval_ids: list[str]) -> str | None:
        """The final job after every evaluation (a queued one is replaced when new evaluations were
        submitted); None when nothing is left to run and the results are written."""
        old = (self.ledger.reports.get(self.plan.name) or [None])[-1]
        new_evals = any(s["kind"] == "eval" for s in self.submitted)
        if self.active(old) and not new_evals:
            self.note("report", "", old, False)
            return old
        if self.active(old) and self.jobs[old].state in QUEUED:  # a running one finishes; the new one runs after
            cancel_jobs([old])
        results = os.path.join(self.out, f"plan_{self.plan.name}.json")
        if not self.submitted and not self.kept and os.path.exists(results):
            return None
        res = Resources(cpus=1)
        script = self.write(f"report_{self.plan.name}.sbatch", "report", res, 0,
                            self.settings.get("report_time") or "0-01:00:00", self.finish.argv, False,
                            f"plan {self.plan.name}: results and report from the run directories")
        dep = f"afterany:{':'.join(eval_ids)}" if eval_ids else None
        job = submit(script, dep)
        self.ledger.add_report(self.plan.name, job)
        self.note("report", "", job, True, ",".join(eval_ids) or None)
        return job

    def write(self, file: str, job_name: str, res: Resources, gpus: int, time: str | None, command: list[str],
              torchrun: bool, comment: str) -> str:
        header = sbatch_lines(self.settings, f"{self.settings['job_prefix']}{job_name}", res, gpus, time, self.logs)
        path = os.path.join(self.folder, file)
        comment += f"\nwritten by graft's Slurm launcher; `sbatch {path}` resubmits it"
        atomic_write_text(path, job_script(header, comment, self.settings, command, torchrun, gpus, res.cpus))
        return path
