"""The `graft ablate` and `graft reproduce` commands (thin: load a plan, list it, or hand it to a
launcher, report)."""

from __future__ import annotations

import dataclasses
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
from graft_cli.plan.options import launch_kwargs
from graft_cli.plan import registration as R
from graft_cli.plan import spec as P
from graft_cli.plan.results import disk_records, results_markdown, write_results
from graft_cli.report.markdown import md_table
from graft_cli.report.tables import report_main
from graft_cli.rundir import atomic_write_json


def _console():
    return make_console(stderr=True)


# the launcher options of both commands (graft_cli.plan.options), as click names them
LAUNCH_OPTIONS = ("launcher", "status", "cancel", "report_only", "account", "partition", "qos", "time_limit",
                  "sbatch_lines")


@dataclasses.dataclass(kw_only=True)
class PlanOptions:
    """What ``graft ablate`` and ``graft reproduce`` share: where the runs go, how many train at
    once, and what the launcher does (``status``, ``cancel`` and ``report_only``: one at a time,
    :func:`run_plan`)."""

    out: str | None = None  # folder of the run directories [default: the command's]
    dry_run: bool = False  # list the runs and their status; run nothing
    steps: int | None = None  # training steps of every run [default: the plan's]
    jobs: int | None = None  # runs trained at the same time [default: the plan's]
    progress: bool = True
    launcher: str = "local"  # local | slurm (graft_cli.plan.launchers)
    status: bool = False  # each run's state; runs nothing
    cancel: bool = False  # slurm: cancel the plan's queued and running jobs
    report_only: bool = False  # results (and report) from the run directories; train nothing
    launch: L.LaunchOptions | None = None  # the launcher's own settings (slurm's #SBATCH lines)

    @classmethod
    def from_cli(cls, *, no_progress: bool, **opts) -> PlanOptions:
        """The options from the command's click parameters: ``--no-progress`` the negation of
        ``progress``, the launcher options (:mod:`graft_cli.plan.options`) ``launcher``, ``status``,
        ``cancel``, ``report_only`` and ``launch``."""
        launch = launch_kwargs(**{k: opts.pop(k) for k in LAUNCH_OPTIONS})
        return cls(progress=not no_progress, **opts, **launch)

    def check(self) -> None:
        if self.steps is not None and self.steps < 1:
            raise GraftError("--steps must be >= 1")
        if self.jobs is not None and self.jobs < 1:
            raise GraftError("--jobs must be >= 1")

    def launch_options(self) -> L.LaunchOptions:
        """``launch`` with ``jobs``, ``progress`` and a console (stderr unless ``launch`` names
        one)."""
        given = self.launch or L.LaunchOptions()
        return dataclasses.replace(given, jobs=self.jobs, progress=self.progress, console=given.console or _console())


@dataclasses.dataclass(kw_only=True)
class AblateOptions(PlanOptions):
    """The options of ``graft ablate`` (:func:`ablate_main`)."""

    sweep: str  # experiments/sweep/<NAME>.yaml or a path
    pair: str = "tiny"  # pair config: tiny, 1, 2 or 3
    seeds: list[str] = dataclasses.field(default_factory=list)  # e.g. ["0,1,2"] [default: the sweep's]

    @classmethod
    def from_cli(cls, *, seeds: tuple[str, ...] = (), **opts) -> AblateOptions:
        """As :meth:`PlanOptions.from_cli`, the repeated ``--seeds`` a list."""
        return super().from_cli(seeds=list(seeds), **opts)


@dataclasses.dataclass(kw_only=True)
class ReproduceOptions(PlanOptions):
    """The options of ``graft reproduce`` (:func:`reproduce_main`): ``register`` writes
    ``<out>/registration.json`` and runs nothing; ``registration`` (default
    ``<out>/registration.json`` when there is one) is the registered design the plan must equal
    (:func:`enforce_registration`)."""

    pair: str = "tiny"  # the plan: experiments/reproduce/<PAIR>.yaml
    report: bool = True  # graft report (and the claims) after training and evaluation
    register: bool = False
    registration: str | None = None

    @classmethod
    def from_cli(cls, *, no_report: bool, **opts) -> ReproduceOptions:
        """As :meth:`PlanOptions.from_cli`, ``--no-report`` the negation of ``report``."""
        return super().from_cli(report=not no_report, **opts)


def ablate_main(o: AblateOptions) -> dict:
    """``graft ablate --sweep NAME``: expand the sweep, list it (dry run), or train + evaluate its
    runs through the launcher (``--status``, ``--cancel``, ``--report-only``: :func:`run_plan`)."""
    o.check()
    opts = o.launch_options()
    chosen = get_launcher(o.launcher, opts)
    plan = P.load_sweep(o.sweep, pair=o.pair, seeds=o.seeds or None, steps=o.steps)
    out = o.out or os.path.join("results", "ablate")
    if o.dry_run:
        click.echo(X.dry_run_markdown(plan, out, X.describe(plan, out)))
        return {}
    argv = ["ablate", "--sweep", os.path.abspath(plan.source), "--pair", o.pair, "--out", os.path.abspath(out),
            "--report-only", "--no-progress"]
    argv += (["--steps", str(o.steps)] if o.steps is not None else []) + [x for s in o.seeds for x in ("--seeds", s)]
    finish = L.Finish(argv, lambda records: {})
    return run_plan(plan, dataclasses.replace(o, out=out), chosen, finish, opts.console, f"sweep {plan.name}")


def unplanned_methods(plan: P.Plan) -> list[str]:
    """Method configs in experiments/method/ that the plan does not run."""

    used = {r.method for r in plan.runs}
    return [m for m in P.known(os.path.join(EXPERIMENTS_DIR, "method")) if m not in used]


def reproduce_main(o: ReproduceOptions) -> dict:
    """``graft reproduce --pair P``: the plan ``experiments/reproduce/<P>.yaml``: train and evaluate
    every run through the launcher (resumable), then ``graft report`` on the output folder with the
    claims section. ``o.register``: write ``<out>/registration.json`` and run nothing;
    ``o.registration`` (default ``<out>/registration.json`` when there is one): the registered
    design the plan must equal before anything runs or any claim is judged
    (:mod:`graft_cli.plan.registration`)."""
    o.check()
    opts = o.launch_options()
    chosen = get_launcher(o.launcher, opts)
    plan = P.load_reproduce(o.pair, steps=o.steps)
    out = o.out or os.path.join("results", f"reproduce_{plan.name}")
    if o.register:
        path, written = R.register(plan, out, claims_module(plan))
        opts.console.print(f"reproduce {plan.name}: {'registered' if written else 'already registered'} in {path} "
                           f"(plan hash {R.plan_hash(plan)[:12]}); commit it before the first run")
        return {"registration": path}
    enforce_registration(plan, out, o.registration)
    # the miniatures name what they leave out
    miniature = plan.pair == "tiny" and os.path.dirname(os.path.abspath(plan.source)) == P.reproduce_dir()
    missing = unplanned_methods(plan) if miniature else []
    full = f"{plan.name}_full"
    has_full = os.path.exists(os.path.join(P.reproduce_dir(), f"{full}.yaml"))
    hint = f"add a line to {plan.source}" + (f", or run the plan that has them: --pair {full}" if has_full else "")
    if o.dry_run:
        click.echo(X.dry_run_markdown(plan, out, X.describe(plan, out)))
        if missing:
            click.echo(f"\nmethod configs not in the plan: {', '.join(missing)} ({hint})")
        return {}
    if missing and not (o.status or o.cancel or o.report_only):
        opts.console.print(f"note: method configs not in the plan: {', '.join(missing)} ({hint})")
    argv = ["reproduce", "--pair", os.path.abspath(plan.source), "--out", os.path.abspath(out), "--report-only",
            "--no-progress"] + (["--steps", str(o.steps)] if o.steps is not None else [])

    def finish(records: list[dict]) -> dict:
        return report_and_claims(plan, out, records, opts.console) if o.report else {}

    return run_plan(plan, dataclasses.replace(o, out=out), chosen, L.Finish(argv, finish), opts.console,
                    f"reproduce {plan.name}")


def enforce_registration(plan: P.Plan, out: str, registration: str | None) -> dict | None:
    """The registration the plan runs under (``registration``, else ``<out>/registration.json``),
    checked against the plan (one line naming the first differing key) and kept in ``out`` for the
    report; None without one."""
    inside = os.path.join(out, R.REGISTRATION)
    path = registration or (inside if os.path.exists(inside) else None)
    if path is None:
        return None
    if not os.path.exists(path):
        raise GraftError(f"--registration {path}: file not found")
    reg = R.load_registration(path)
    R.check_registration(plan, reg, path, out)
    if os.path.abspath(path) != os.path.abspath(inside):
        if os.path.exists(inside) and R.load_registration(inside).get("plan_hash") != reg["plan_hash"]:
            raise GraftError(f"{inside}: holds another registration than {path}; use a new --out")
        os.makedirs(out, exist_ok=True)
        atomic_write_json(inside, reg)
    return reg


def run_plan(plan: P.Plan, o: PlanOptions, launcher: L.Launcher, finish: L.Finish, console,
             what: str = "plan") -> dict:
    """``o.status`` (each run's state), ``o.cancel`` (the plan's jobs), ``o.report_only`` (results
    and report from the run directories in ``o.out``), or the launch itself into ``o.out``; prints
    what happened."""
    out = o.out
    if sum((o.status, o.cancel, o.report_only)) > 1:
        raise GraftError("--status, --cancel and --report-only: one at a time")
    if o.status:
        click.echo(L.status_markdown(plan, launcher.status(plan, out)))
        return {}
    if o.cancel:
        ids = launcher.cancel(plan, out)
        console.print(f"{what}: cancelled {len(ids)} job(s)" + (f": {', '.join(ids)}" if ids else ""))
        return {"cancelled": ids}
    t0 = time.time()
    if o.report_only:
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
               "ladder": "graft_cli.report.ladder_claims",
               "none": None}  # none: graft report's tables only (the paper-table plans span pairs or students)


def claims_module(plan: P.Plan) -> str | None:
    """The module that judges the plan's claims (``claims.kind``), None for ``none``."""
    kind = str((plan.claims or {}).get("kind", "graft"))
    if kind not in CLAIM_KINDS:
        raise GraftError(f"{plan.source}: claims.kind {kind!r}: must be one of {', '.join(CLAIM_KINDS)}")
    return CLAIM_KINDS[kind]


def report_and_claims(plan: P.Plan, out: str, records: list[dict], console) -> dict:
    """``graft report`` on the plan's folder, then the claims of the plan's paper (``claims.kind``:
    graft | saf | tandem | npeer | staleness | none)."""

    kind = str((plan.claims or {}).get("kind", "graft"))
    if kind not in CLAIM_KINDS:
        raise GraftError(f"{plan.source}: claims.kind {kind!r}: must be one of {', '.join(CLAIM_KINDS)}")
    rdir = os.path.join(out, "report")
    try:
        scored = {r["dir"]: {p: sc["step"] for p, sc in (r.get("scores") or {}).items() if sc.get("step") is not None}
                  for r in records}  # one source of scores: the tables read the step the claims judge
        report_main([out], out=rdir, console=console, steps=scored, finished_only=True)
    except Exception as e:  # the claims section is still written
        console.print(f"[yellow]warning[/]: graft report failed ({type(e).__name__}: {e}); writing the claims only")
    if CLAIM_KINDS[kind] is None:
        return {"report": rdir, "claims": [], "claims_md": ""}
    reg_path = os.path.join(out, R.REGISTRATION)
    changed = R.analysis_changes(R.load_registration(reg_path), CLAIM_KINDS[kind]) if os.path.exists(reg_path) else []
    if changed:
        console.print(f"[yellow]note[/]: the analysis code differs from the registered version in {', '.join(changed)}"
                      f" (recorded in {os.path.join(rdir, 'analysis_code.json')})")
    if os.path.exists(reg_path):
        os.makedirs(rdir, exist_ok=True)
        atomic_write_json(os.path.join(rdir, "analysis_code.json"),
                          {"changed_since_registration": changed, **R.analysis_code(CLAIM_KINDS[kind])})
    write_claims = importlib.import_module(CLAIM_KINDS[kind]).write_claims
    md, claims = write_claims(rdir, records, {**plan.claims, "analysis": plan.analysis})
    return {"report": rdir, "claims": claims, "claims_md": md}
