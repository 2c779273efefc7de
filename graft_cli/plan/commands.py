"""The `graft ablate` and `graft reproduce` commands (thin: load a plan, list it, or hand it to a launcher, report)."""

from __future__ import annotations

import importlib
import os
import time

import click

from graft_cli.config import EXPERIMENTS_DIR
from graft_cli.console import make_console
from graft_cli.errors import GraftError
from graft_cli.plan import execute as X
from graft_cli.plan import launch as L
from graft_cli.plan.launchers import get_launcher
from graft_cli.plan import registration as R
from graft_cli.plan import spec as P
from graft_cli.plan.results import disk_records, results_markdown, write_results
from graft_cli.report.markdown import md_table
from graft_cli.report.tables import report_main
from graft_cli.rundir import atomic_write_json


def _console():
    return make_console(stderr=True)


def _check_counts(steps: int | None, jobs: int | None) -> None:
    if steps is not None and steps < 1:
        raise GraftError("--steps must be >= 1")
    if jobs is not None and jobs < 1:
        raise GraftError("--jobs must be >= 1")


def ablate_main(sweep: str, pair: str = "tiny", dry_run: bool = False, out: str | None = None,
                steps: int | None = None, seeds=None, jobs: int | None = None, progress: bool = True,
                launcher: str = "local", status: bool = False, cancel: bool = False, report_only: bool = False,
                launch: L.LaunchOptions | None = None) -> dict:
    """``graft ablate --sweep NAME``: expand the sweep, list it (dry run), or train + evaluate its runs through the
    launcher (``--status``, ``--cancel``, ``--report-only``: :func:`run_plan`)."""
    _check_counts(steps, jobs)
    opts = _options(launch, jobs, progress)
    chosen = get_launcher(launcher, opts)
    plan = P.load_sweep(sweep, pair=pair, seeds=seeds or None, steps=steps)
    out = out or os.path.join("results", "ablate")
    if dry_run:
        click.echo(X.dry_run_markdown(plan, out, X.describe(plan, out)))
        return {}
    argv = ["ablate", "--sweep", os.path.abspath(plan.source), "--pair", pair, "--out", os.path.abspath(out),
            "--report-only", "--no-progress"]
    argv += (["--steps", str(steps)] if steps is not None else []) + [x for s in (seeds or []) for x in ("--seeds", s)]
    finish = L.Finish(argv, lambda records: {})
    return run_plan(plan, out, chosen, finish, status=status, cancel=cancel, report_only=report_only,
                    console=opts.console, what=f"sweep {plan.name}")


def unplanned_methods(plan: P.Plan) -> list[str]:
    """Method configs in experiments/method/ that the plan does not run."""

    used = {r.method for r in plan.runs}
    return [m for m in P.known(os.path.join(EXPERIMENTS_DIR, "method")) if m not in used]


def reproduce_main(pair: str = "tiny", out: str | None = None, dry_run: bool = False, jobs: int | None = None,
                   steps: int | None = None, report: bool = True, progress: bool = True, launcher: str = "local",
                   status: bool = False, cancel: bool = False, report_only: bool = False,
                   launch: L.LaunchOptions | None = None, register: bool = False,
                   registration: str | None = None) -> dict:
    """``graft reproduce --pair P``: the plan ``experiments/reproduce/<P>.yaml``: train and evaluate every run
    through the launcher (resumable), then ``graft report`` on the output folder with the claims section.
    ``register``: write ``<out>/registration.json`` and run nothing; ``registration`` (default
    ``<out>/registration.json`` when there is one): the registered design the plan must equal before anything
    runs or any claim is judged (:mod:`graft_cli.plan.registration`)."""
    _check_counts(steps, jobs)
    opts = _options(launch, jobs, progress)
    chosen = get_launcher(launcher, opts)
    plan = P.load_reproduce(pair, steps=steps)
    out = out or os.path.join("results", f"reproduce_{plan.name}")
    if register:
        path, written = R.register(plan, out)
        opts.console.print(f"reproduce {plan.name}: {'registered' if written else 'already registered'} in {path} "
                           f"(plan hash {R.plan_hash(plan)[:12]}); commit it before the first run")
        return {"registration": path}
    enforce_registration(plan, out, registration)
    # the miniatures name what they leave out
    miniature = plan.pair == "tiny" and os.path.dirname(os.path.abspath(plan.source)) == P.reproduce_dir()
    missing = unplanned_methods(plan) if miniature else []
    full = f"{plan.name}_full"
    has_full = os.path.exists(os.path.join(P.reproduce_dir(), f"{full}.yaml"))
    hint = f"add a line to {plan.source}" + (f", or run the plan that has them: --pair {full}" if has_full else "")
    if dry_run:
        click.echo(X.dry_run_markdown(plan, out, X.describe(plan, out)))
        if missing:
            click.echo(f"\nmethod configs not in the plan: {', '.join(missing)} ({hint})")
        return {}
    if missing and not (status or cancel or report_only):
        opts.console.print(f"note: method configs not in the plan: {', '.join(missing)} ({hint})")
    argv = ["reproduce", "--pair", os.path.abspath(plan.source), "--out", os.path.abspath(out), "--report-only",
            "--no-progress"] + (["--steps", str(steps)] if steps is not None else [])

    def finish(records: list[dict]) -> dict:
        return report_and_claims(plan, out, records, opts.console) if report else {}

    return run_plan(plan, out, chosen, L.Finish(argv, finish), status=status, cancel=cancel,
                    report_only=report_only, console=opts.console, what=f"reproduce {plan.name}")


def enforce_registration(plan: P.Plan, out: str, registration: str | None) -> dict | None:
    """The registration the plan runs under (``registration``, else ``<out>/registration.json``), checked against
    the plan (one line naming the first differing key) and kept in ``out`` for the report; None without one."""
    inside = os.path.join(out, R.REGISTRATION)
    path = registration or (inside if os.path.exists(inside) else None)
    if path is None:
        return None
    if not os.path.exists(path):
        raise GraftError(f"--registration {path}: file not found")
    reg = R.load_registration(path)
    R.check_registration(plan, reg, path)
    if os.path.abspath(path) != os.path.abspath(inside):
        if os.path.exists(inside) and R.load_registration(inside).get("plan_hash") != reg["plan_hash"]:
            raise GraftError(f"{inside}: holds another registration than {path}; use a new --out")
        os.makedirs(out, exist_ok=True)
        atomic_write_json(inside, reg)
    return reg


def _options(launch: L.LaunchOptions | None, jobs: int | None, progress: bool) -> L.LaunchOptions:
    opts = launch or L.LaunchOptions()
    opts.jobs, opts.progress, opts.console = jobs, progress, opts.console or _console()
    return opts


def run_plan(plan: P.Plan, out: str, launcher: L.Launcher, finish: L.Finish, status: bool = False,
             cancel: bool = False, report_only: bool = False, console=None, what: str = "plan") -> dict:
    """``--status`` (each run's state), ``--cancel`` (the plan's jobs), ``--report-only`` (results and report from
    the run directories), or the launch itself; prints what happened."""
    if sum((status, cancel, report_only)) > 1:
        raise GraftError("--status, --cancel and --report-only: one at a time")
    if status:
        click.echo(L.status_markdown(plan, launcher.status(plan, out)))
        return {}
    if cancel:
        ids = launcher.cancel(plan, out)
        console.print(f"{what}: cancelled {len(ids)} job(s)" + (f": {', '.join(ids)}" if ids else ""))
        return {"cancelled": ids}
    t0 = time.time()
    if report_only:
        records = disk_records(plan, out)
        write_results(plan, out, records, 0.0)
        result = {"records": records, **finish.call(records)}
    else:
        result = launcher.launch(plan, out, finish)
    if "submitted" in result:
        click.echo(submission_markdown(result))
        console.print(f"{what}: {len(result['submitted'])} job(s) submitted, {len(result['kept'])} still queued or "
                      f"running; scripts and logs in {result['folder']}; `--status` shows each run")
        return result
    click.echo(results_markdown(plan, result["records"]))
    if result.get("claims_md"):
        click.echo("\n" + result["claims_md"])
    console.print(f"{what}: {len(result['records'])} runs in {out}/ ({(time.time() - t0) / 60:.1f} min this time); "
                  f"results {os.path.join(out, f'plan_{plan.name}.md')}"
                  + (f"; report {os.path.join(result['report'], 'report.md')}" if result.get("report") else ""))
    return result


def submission_markdown(result: dict) -> str:
    rows = [[s["kind"], s["run"] or "—", s["job"], "submitted" if new else "kept (queued or running)",
             s["dependency"] or "—"] for new, items in ((True, result["submitted"]), (False, result["kept"]))
            for s in items]
    return md_table(["job", "run", "id", "", "after"], rows) if rows else "nothing to submit: every run is finished"


CLAIM_KINDS = {"graft": "graft_cli.report.claims", "saf": "graft_cli.report.saf_claims",
               "tandem": "graft_cli.report.tandem_claims", "npeer": "graft_cli.report.npeer_claims",
               "staleness": "graft_cli.report.staleness_claims", "dose": "graft_cli.report.dose_claims",
               "none": None}  # none: graft report's tables only (the paper-table plans span pairs or students)


def report_and_claims(plan: P.Plan, out: str, records: list[dict], console) -> dict:
    """``graft report`` on the plan's folder, then the claims of the plan's paper (``claims.kind``: graft | saf |
    tandem | npeer | staleness | none)."""

    kind = str((plan.claims or {}).get("kind", "graft"))
    if kind not in CLAIM_KINDS:
        raise GraftError(f"{plan.source}: claims.kind {kind!r}: must be one of {', '.join(CLAIM_KINDS)}")
    rdir = os.path.join(out, "report")
    try:
        scored = {r["dir"]: {p: sc["step"] for p, sc in (r.get("scores") or {}).items() if sc.get("step") is not None}
                  for r in records}  # one source of scores: the tables read the step the claims judge
        report_main([out], out=rdir, console=console, steps=scored)
    except Exception as e:  # the claims section is still written
        console.print(f"[yellow]warning[/]: graft report failed ({type(e).__name__}: {e}); writing the claims only")
    if CLAIM_KINDS[kind] is None:
        return {"report": rdir, "claims": [], "claims_md": ""}
    write_claims = importlib.import_module(CLAIM_KINDS[kind]).write_claims
    md, claims = write_claims(rdir, records, {**plan.claims, "analysis": plan.analysis})
    return {"report": rdir, "claims": claims, "claims_md": md}
