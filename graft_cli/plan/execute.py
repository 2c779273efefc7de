"""Running a plan: per run, train (skipped when finished, resumed when partial) then evaluate
(skipped when done), in plan order; one run at a time in this process, or ``jobs`` runs at a time in
worker processes (each with ``cpu_count // jobs`` torch threads and its output in
``<out>/logs/<run>.log``). A run whose partner failed is skipped; any other failure is recorded and
the plan goes on.

Stopping (a scheduler's SIGTERM, or Ctrl-C): with ``jobs`` > 1 every worker runs in its own process
group; the parent signals each group (the worker, its reward processes) with SIGTERM, waits up to
``STOP_GRACE_S`` for them to leave (each ``graft train`` abandons its step: nothing is half-written,
every run resumes from its last checkpoint), SIGKILLs what is left, and exits 143 with one line; the
same command continues the plan. A worker whose parent dies (SIGKILL) notices within a second and
stops its own group the same way. With ``jobs`` = 1 the run in this process stops the plan
(:class:`~graft_cli.train.run.SignalStop`).

Results: one record per run (:func:`execute`), written with the plan to ``<out>/plan_<name>.json``
and as a markdown table to ``<out>/plan_<name>.md`` (:mod:`graft_cli.plan.results`). """

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from graft_cli.config import compose
from graft_cli.console import make_console
from graft_cli.errors import GraftError, Stopped
from graft_cli.eval.runner import EvalOptions, evaluate_run
from graft_cli.eval.validation import ValidationHook
from graft_cli.plan import status as S
from graft_cli.plan.results import eval_dict, load_results, measured_record, write_results
from graft_cli.plan.spec import Plan, PlanRun
from graft_cli.report.markdown import md_table
from graft_cli.tiny import build as T
from graft_cli.tiny.code import build_code
from graft_cli.tiny.code import read_manifest as read_code_manifest
from graft_cli.tiny.sft import default_recipe
from graft_cli.train.provenance import reuse_problem
from graft_cli.train.run import RESUME_MAY_DIFFER, train


# ------------------------------------------------------------------------------------------ dry run
def describe(plan: Plan, out: str, check_configs: bool = True) -> list[dict]:
    """One row per run: what would happen (composing each config when ``check_configs``, so a bad
    method name or override shows up before anything runs)."""
    rows = []
    for i, r in enumerate(plan.runs, 1):
        d = plan.run_dir(r, out)
        st = S.run_status(d, plan.steps)
        row = {"index": i, "run": plan.run_name(r), "name": r.name, "method": r.method, "seed": r.seed,
               "overrides": list(r.overrides), "partner": f"{r.partner_key()}:{r.partner[1]}" if r.partner else "",
               "steps": plan.steps, "status": st.label(), "dir": d, "config": "ok"}
        res = plan.resources_for(r)
        row["resources"] = res.label()
        row["gpu_hours"] = res.train_gpu_hours() + res.eval_gpu_hours()
        ev = plan.eval_for(r)
        if ev.enabled and st.finished and S.eval_done(d, ev.steps, ev.runs, ev.samples, ev.benchmarks, ev.bench_runs):
            row["status"] += ", evaluated"
        partner_ready = True
        if r.partner:
            partner = plan.by_key()[r.partner_key()]
            partner_ready = S.run_status(plan.run_dir(partner, out), plan.steps).finished
        if check_configs and not partner_ready:
            row["config"] = "checked when its partner has run"
        elif check_configs:
            try:
                compose(plan.compose_overrides(r, out))
            except GraftError as e:
                row["config"] = f"error: {e}"
        rows.append(row)
    return rows


def dry_run_markdown(plan: Plan, out: str, rows: list[dict]) -> str:
    steps = plan.steps if plan.steps is not None else "run.epochs"
    ev = plan.eval
    head = (f"Plan {plan.name} ({plan.source}): pair {plan.pair}, {len(rows)} runs, steps {steps}, "
            f"eval {'off' if not ev.enabled else _eval_label(ev)}, "
            f"out {out}")
    cols = ["#", "run", "method", "seed", "overrides", "partner", "status", "config", "resources", "GPU-h"]
    table = md_table(cols, [[r["index"], r["run"], r["method"], r["seed"], " ".join(r["overrides"]) or "—",
                             r["partner"] or "—", r["status"], r["config"], r["resources"],
                             f"{r['gpu_hours']:.1f}"] for r in rows])
    train_h, eval_h = plan.gpu_hours()
    total = (f"GPU-hours: {train_h + eval_h:,.1f} ({train_h:,.1f} training + {eval_h:,.1f} evaluation) over "
             f"{len(rows)} runs" if train_h + eval_h > 0 else "GPU-hours: 0 (the plan names no GPUs)")
    return head + "\n\n" + table + "\n\n" + total


# ---------------------------------------------------------------------------------------- one run
def run_job(job: dict) -> dict:
    """Train (unless finished) and evaluate (unless done) one run. ``job``: overrides, run_dir,
    finished, eval (EvalPlan fields or None), threads, log (a file path: output goes there),
    progress. Returns {trained, train_s, evaluated, eval_s, error}; never raises."""
    rec = {"trained": None, "train_s": 0.0, "evaluated": None, "eval_s": 0.0, "error": None}
    if job.get("parent_pid"):  # a worker process: its own process group, gone with its parent
        os.setpgrp()
        _exit_with_parent(int(job["parent_pid"]))
    log = None
    if job.get("log"):
        os.makedirs(os.path.dirname(job["log"]), exist_ok=True)
        log = open(job["log"], "a", buffering=1, encoding="utf-8")
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = sys.stderr = log
    try:
        # lazy: imported once the log is redirected, so that a failing import lands in the run's log
        import torch

        if job.get("threads"):
            torch.set_num_threads(int(job["threads"]))
        console = make_console(file=log, force_terminal=False, width=160) if log else make_console(stderr=True)
        if not job["finished"]:
            check_tiny(job.get("tiny"))
        cfg = compose(job["overrides"])
        if not job["finished"]:
            t0 = time.perf_counter()

            was = S.run_status(job["run_dir"], cfg.run.steps)
            train(cfg, progress=job.get("progress", False), console=console, after_step=(ValidationHook(),))
            rec["trained"] = "resumed" if was.state == "partial" and was.step > 0 else "trained"
            rec["train_s"] = time.perf_counter() - t0
        ev = job.get("eval")
        if ev and ev.get("enabled", True):
            if S.eval_done(job["run_dir"], ev["steps"], ev["runs"], ev.get("samples"), ev.get("benchmarks"),
                           ev.get("bench_runs")):
                rec["evaluated"] = "done before"
            else:
                t0 = time.perf_counter()
                kw = {k: ev.get(k) for k in ("steps", "runs", "bench_runs", "samples", "temperature", "top_p", "top_k",
                                             "max_new_tokens", "seed")}
                bench = ev.get("benchmarks")
                evaluate_run(EvalOptions(run_dir=job["run_dir"], benchmarks=",".join(bench) if bench else None,
                                         progress=job.get("progress", False), reuse_dir=job.get("eval_reuse"),
                                         **kw), console=console)
                rec["evaluated"] = "evaluated"
                rec["eval_s"] = time.perf_counter() - t0
    except BaseException as e:  # noqa: B036 — recorded, the plan goes on (KeyboardInterrupt re-raised)
        if isinstance(e, KeyboardInterrupt) or (isinstance(e, Stopped) and not job.get("parent_pid")):
            raise  # in this process: a signal stops the whole plan, not just this run
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        rec["error"] = msg if isinstance(e, GraftError) else f"{type(e).__name__}: {msg}"
        if not isinstance(e, GraftError):
            traceback.print_exc()
    finally:
        if log:
            sys.stdout.flush()
            log.flush()
    return rec


EVAL_REUSE = ".eval_reuse"  # <out>/.eval_reuse: evaluations shared between a plan's runs (graft_cli/eval/reuse.py)
STOP_GRACE_S = 8.0  # after SIGTERM to the workers' groups, this long before SIGKILL (the whole stop: < 10 s)


def _exit_with_parent(ppid: int) -> None:
    """A daemon thread that stops this worker's process group (this process, its reward processes)
    once its parent is gone: SIGTERM (the run abandons its step cleanly), then SIGKILL after a few
    seconds."""
    def watch():
        while os.getppid() == ppid:
            time.sleep(0.5)
        for sig, wait_s in ((signal.SIGTERM, 4.0), (signal.SIGKILL, 0.0)):
            try:
                os.killpg(os.getpgrp(), sig)
            except OSError:
                return
            time.sleep(wait_s)

    threading.Thread(target=watch, name="graft-parent-watch", daemon=True).start()


class _PlanStop(BaseException):
    """Raised in the plan's main thread by its SIGTERM / SIGINT handler."""


def _alive(pid: int, proc=None) -> bool:
    """The worker lives (``proc.is_alive()`` also reaps it once it has ended), or its process group
    still has a member (its reward processes)."""
    if proc is not None and proc.is_alive():
        return True
    try:
        os.killpg(pid, 0)
        return True
    except OSError:
        return False


def _signal(pid: int, sig: int) -> None:
    """``sig`` to the worker's group, and to the worker itself (in case it has not made its group
    yet)."""
    for send in (os.killpg, os.kill):
        try:
            send(pid, sig)
        except OSError:
            pass


def stop_workers(procs: dict, grace_s: float = STOP_GRACE_S) -> list[int]:
    """SIGTERM each worker's process group (``procs``: pid -> its ``multiprocessing.Process``; a
    worker leads its own group), wait up to ``grace_s`` for them all to end, SIGKILL the groups
    still there; returns those."""
    for pid in procs:
        _signal(pid, signal.SIGTERM)
    deadline = time.time() + grace_s
    while time.time() < deadline and any(_alive(p, q) for p, q in procs.items()):
        time.sleep(0.1)
    killed = [p for p, q in procs.items() if _alive(p, q)]
    for pid in killed:
        _signal(pid, signal.SIGKILL)
    return killed


# ------------------------------------------------------------------------------------ tiny pair pin
def uses_tiny(plan: Plan, out: str, source: str = "tiny") -> bool:
    """Whether the plan's runs load the embedded tiny pair (``tiny:<role>`` models or data;
    ``source="tiny_code"``: the tiny code models, ``tiny_code:<name>``, in any run)."""

    runs = [r for r in plan.runs if not r.partner]
    for r in runs[:1] if source == "tiny" else runs:
        cfg = compose(plan.compose_overrides(r, out))
        if any(str(p.model).startswith(f"{source}:") for p in cfg.policies) or str(cfg.data.train).startswith(
                f"{source}:"):
            return True
    return False


def tiny_roles(plan: Plan, out: str) -> tuple:
    """The tiny roles the plan's runs train (``tiny:<role>`` policy models; the pair's a and b when
    none is named): built before the runs start. Frozen roles a method loads (a teacher, c) are
    built when a run first asks for them (:func:`graft_cli.tiny.build.resolve_tiny`), so a GRAFT
    study on a clean machine waits for the pair alone."""
    roles: set = set()
    for r in plan.runs:
        if r.partner:
            continue
        cfg = compose(plan.compose_overrides(r, out))
        roles |= {str(p.model).split(":", 1)[1] for p in cfg.policies if str(p.model).startswith("tiny:")}
    return tuple(x for x in T.ROLES if x in roles) or T.PAIR


def tiny_identity(progress: bool = True, code: bool = False, roles=T.PAIR) -> dict:
    """Build the tiny ``roles`` (and with ``code`` the tiny code models) once here if needed
    (workers never build them concurrently) and return the identity: cache folder and the manifests'
    model hashes (of every role the cache has)."""

    T.ensure_tiny(progress=progress, roles=roles)
    man = T.read_manifest() or {}
    out = {"cache": T.default_cache_dir(), "hashes": man.get("hashes"), "version": man.get("version")}
    if code:
        build_code()
        out["code_hashes"] = (read_code_manifest() or {}).get("hashes")
    return out


def same_models(before: dict | None, now: dict | None) -> bool:
    """Every role in ``before`` (a hash per role) has the same hash in ``now``; roles built since (a
    teacher asked for later) are not a change."""
    before, now = before or {}, now or {}
    return all(now.get(r) == h for r, h in before.items())


def check_tiny(expected: dict | None) -> None:
    """Refuse to train when the tiny pair differs from the one the plan started with: a rebuilt
    cache (other hashes for the roles it had), or code whose recipe no longer matches the cache
    (ensure_tiny would rebuild it)."""
    if not expected:
        return

    man = T.read_manifest() or {}
    if not same_models(expected.get("hashes"), man.get("hashes")):
        raise GraftError(f"the tiny pair in {T.default_cache_dir()} changed since this plan started (model hashes "
                         f"differ): its runs would mix two pairs; use a new --out")
    try:
        recipe_now = default_recipe().to_dict()  # the recipe ensure_tiny would build (GRAFT_TINY_RECIPE)
    except Exception:  # an older/newer tiny module without Recipe: the hash check above stands
        return
    if man.get("recipe") != recipe_now:
        raise GraftError("the tiny recipe in the code changed since this plan started (the cache would be "
                         "rebuilt): its runs would mix two pairs; finish with the code the plan started with, "
                         "or use a new --out")


# ------------------------------------------------------------------------------------------ the plan
def _eval_label(ev) -> str:
    """``steps=last runs=1 samples=4`` and the benchmarks with runs of their own (``aime24=5
    ...``)."""
    more = "".join(f" {b}={r}" for b, r in (ev.bench_runs or {}).items())
    return f"steps={ev.steps} runs={ev.runs}{more} samples={ev.samples or 8}"


def execute(plan: Plan, out: str, jobs: int | None = None, progress: bool = True, console=None,
            only: list[str] | None = None) -> list[dict]:
    """Run the plan into ``out``; returns one record per run (see :func:`record`). ``only``: run
    keys (``name-sSEED``) to restrict to (their partners must be finished or also listed)."""
    ex = _Execution(plan, out, max(1, int(jobs or plan.jobs or 1)), progress, console or make_console(stderr=True))
    runs = [r for r in plan.runs if not only or r.key in only]
    os.makedirs(out, exist_ok=True)
    t_start = time.time()
    todo = ex.survey(runs)
    if todo and uses_tiny(plan, out):
        ex.tiny = _tiny_of(plan, out, progress)
    ex.console.print(f"plan {plan.name}: {len(runs)} runs, {len(runs) - len(todo)} already finished and evaluated, "
                     f"{len(todo)} to do ({ex.jobs} at a time) into {out}")
    ex.pending, ex.pending_keys = list(todo), {r.key for r in todo}
    started = time.strftime("%Y-%m-%d %H:%M:%S")

    def record(state: str) -> list[dict]:  # this execution's stage, as of now
        recs = [measured_record(plan, r, dict(ex.records[r.key])) for r in runs]  # a copy: it drops private keys
        write_results(plan, out, recs, time.time() - t_start, ex.tiny, started=started, state=state)
        return recs

    ex.on_finish = lambda: record("running")  # a killed execution leaves its stage as of its last run
    try:
        ex.run_inline() if ex.jobs == 1 else ex.run_parallel()
    except Stopped:  # the stage is recorded (its wall time, the runs it finished) before the stop's one line
        record("stopped")
        raise
    return record("finished")


def _tiny_of(plan: Plan, out: str, progress: bool) -> dict:
    """The tiny build the plan's runs use (built if missing), refused when ``out`` holds runs of
    another build."""
    tiny = tiny_identity(progress, code=uses_tiny(plan, out, "tiny_code"), roles=tiny_roles(plan, out))
    prev = (load_results(out, plan.name) or {}).get("tiny")
    if prev and (not same_models(prev.get("hashes"), tiny["hashes"])
                 or prev.get("code_hashes", tiny.get("code_hashes")) != tiny.get("code_hashes")):
        raise GraftError(f"{out}: its runs were made with another build of the tiny pair (manifest model hashes "
                         f"differ from {tiny['cache']}); use a new --out")
    return tiny


class _Execution:
    """One :func:`execute`: the runs' records, the ones still pending, their partners, and the jobs
    (in this process when ``jobs`` is 1, else worker processes)."""

    def __init__(self, plan: Plan, out: str, jobs: int, progress: bool, console):
        self.plan, self.out, self.jobs, self.progress, self.console = plan, out, jobs, progress, console
        self.threads = max(1, (os.cpu_count() or 1) // jobs)
        self.records: dict[str, dict] = {}
        self.failed: set[str] = set()
        self.pending: list[PlanRun] = []
        self.pending_keys: set[str] = set()
        self.tiny: dict | None = None
        self.on_finish = lambda: None  # after each run's record is complete (execute: the stage so far)

    def survey(self, runs: list[PlanRun]) -> list[PlanRun]:
        """Each run's record as found on disk; returns the runs still to train or evaluate."""
        plan, todo = self.plan, []
        for r in runs:
            d = plan.run_dir(r, self.out)
            st = S.run_status(d, plan.steps)
            ev = plan.eval_for(r)
            ev_done = (not ev.enabled) or (st.finished and S.eval_done(d, ev.steps, ev.runs, ev.samples,
                                                                       ev.benchmarks, ev.bench_runs))
            self.records[r.key] = {"key": r.key, "name": r.name, "method": r.method, "seed": r.seed,
                                   "run": plan.run_name(r), "dir": d, "overrides": list(r.overrides),
                                   "partner": r.partner_key(), "status_before": st.label(), "trained": None,
                                   "evaluated": None, "error": None, "train_s": 0.0, "eval_s": 0.0,
                                   "_finished": st.finished}
            if st.finished:
                reuse_check(plan, r, self.out)
            if st.finished and ev_done:
                self.records[r.key]["trained"] = "skipped (finished)"
                self.records[r.key]["evaluated"] = "skipped (done)" if ev.enabled else "off"
            else:
                todo.append(r)
        return todo

    def job_for(self, r: PlanRun, in_process: bool) -> dict:
        plan, out = self.plan, self.out
        return {"overrides": plan.compose_overrides(r, out), "run_dir": plan.run_dir(r, out),
                "finished": self.records[r.key]["_finished"], "eval": eval_dict(plan, r),
                "threads": None if in_process and self.jobs == 1 else self.threads,
                "log": None if in_process else os.path.join(out, "logs", f"{plan.run_name(r)}.log"),
                "progress": self.progress and in_process, "tiny": self.tiny,
                "eval_reuse": os.path.join(out, EVAL_REUSE),  # another run's identical evaluation is copied
                "parent_pid": None if in_process else os.getpid()}

    def partner_state(self, r: PlanRun) -> str:
        """ready: the partner run is finished on disk; wait: it is still to run; failed: neither."""
        pk = r.partner_key()
        if not pk:
            return "ready"
        if pk in self.failed:
            return "failed"
        if pk in self.pending_keys:
            return "wait"
        partner = self.plan.by_key()[pk]
        return "ready" if S.run_status(self.plan.run_dir(partner, self.out), self.plan.steps).finished else "failed"

    def skip_for_partner(self, r: PlanRun) -> None:
        self.records[r.key]["error"] = f"partner {r.partner_key()} failed or missing"
        self.failed.add(r.key)
        self.pending_keys.discard(r.key)
        self.console.print(f"[red]skipped[/] {self.plan.run_name(r)}: partner {r.partner_key()} failed")

    def finish(self, r: PlanRun, rec: dict, t0: float) -> None:
        R = self.records[r.key]
        R.update({k: rec[k] for k in ("trained", "evaluated", "error", "train_s", "eval_s")})
        if R["trained"] is None:
            R["trained"] = "skipped (finished)" if R["_finished"] else "not trained"
        R["wall_s"] = time.time() - t0
        if rec["error"]:
            self.failed.add(r.key)
            self.console.print(f"[red]failed[/] {self.plan.run_name(r)}: {rec['error']}"
                               + (f" (log: {self.job_for(r, False)['log']})" if self.jobs > 1 else ""))
        else:
            self.console.print(f"done {self.plan.run_name(r)}: train {R['trained']} ({R['train_s']:.0f}s), eval "
                               f"{R['evaluated']} ({R['eval_s']:.0f}s)")
        self.on_finish()

    def run_inline(self) -> None:
        """One run at a time, in this process, in plan order."""
        for r in self.pending:
            if self.partner_state(r) == "failed":
                self.skip_for_partner(r)
                continue
            self.console.print(f"run {self.plan.run_name(r)} ({self.records[r.key]['status_before']})")
            t0 = time.time()
            rec = run_job(self.job_for(r, True))
            self.pending_keys.discard(r.key)
            self.finish(r, rec, t0)

    def run_parallel(self) -> None:
        """``jobs`` worker processes (one run each, then replaced), a run started when its partner
        is finished; SIGTERM / SIGINT stop the workers and end with one line saying what resumes."""
        running: dict = {}

        def on_signal(signum, frame):
            raise _PlanStop(signum)

        old_handlers = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)} \
            if threading.current_thread() is threading.main_thread() else {}
        pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=mp.get_context("spawn"), max_tasks_per_child=1)
        stopping = False
        try:
            while self.pending or running:
                self.start_ready(pool, running)
                if not running:
                    for r in self.pending:  # only runs waiting on partners that will never come
                        self.records[r.key]["error"] = f"partner {r.partner_key()} never finished"
                        self.failed.add(r.key)
                    self.pending.clear()
                    break
                done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for fut in done:
                    r, t0 = running.pop(fut)
                    self.pending_keys.discard(r.key)
                    try:
                        rec = fut.result()
                    except Exception as e:  # a worker that died (e.g. killed for memory)
                        rec = {"trained": None, "train_s": 0.0, "evaluated": None, "eval_s": 0.0,
                               "error": f"worker died: {type(e).__name__}: {e}"}
                    self.finish(r, rec, t0)
        except _PlanStop as e:
            stopping = True
            procs = dict(getattr(pool, "_processes", None) or {})  # the workers (private, but the only handle)
            killed = stop_workers(procs)
            pool.shutdown(wait=False, cancel_futures=True)
            name = signal.Signals(e.args[0]).name if e.args else "a signal"
            raise Stopped(f"plan {self.plan.name} stopped by {name}: {len(running)} running run(s) interrupted"
                          + (f" ({len(killed)} needed SIGKILL)" if killed else "")
                          + f", {len(self.pending)} not started; each resumes from its last checkpoint: rerun the "
                            f"same command to continue") from None
        finally:
            for sig, h in old_handlers.items():
                signal.signal(sig, h)
            if not stopping:
                pool.shutdown(wait=True)

    def start_ready(self, pool, running: dict) -> None:
        """Submit pending runs whose partner is ready, up to ``jobs`` running."""
        for r in list(self.pending):
            if len(running) >= self.jobs:
                break
            ps = self.partner_state(r)
            if ps == "wait":
                continue
            self.pending.remove(r)
            if ps == "failed":
                self.skip_for_partner(r)
                continue
            self.console.print(f"start {self.plan.run_name(r)} ({self.records[r.key]['status_before']}); "
                               f"log {self.job_for(r, False)['log']}")
            running[pool.submit(run_job, self.job_for(r, False))] = (r, time.time())


def reuse_check(plan: Plan, r: PlanRun, out: str) -> None:
    """Refuse (one line naming the run and the key) a finished run whose recorded config or tiny
    build differs from what the plan composes for it now
    (:func:`graft_cli.train.provenance.reuse_problem`)."""
    why = reuse_problem(compose(plan.compose_overrides(r, out)), plan.run_dir(r, out), RESUME_MAY_DIFFER)
    if why:
        raise GraftError(f"plan {plan.name}: run {plan.run_name(r)} is finished but cannot be reused: {why}; remove "
                         f"{plan.run_dir(r, out)} or use a new --out")


# ------------------------------------------------------------------------------------------- results
