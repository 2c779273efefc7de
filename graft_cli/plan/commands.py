"""The `graft ablate` and `graft reproduce` commands (thin: load a plan, list or execute it, report)."""

from __future__ import annotations

import importlib
import os
import time

import click

from graft_cli.config import EXPERIMENTS_DIR
from graft_cli.console import make_console
from graft_cli.errors import GraftError
from graft_cli.plan import execute as X
from graft_cli.plan import spec as P
from graft_cli.report.tables import report_main


def _console():
    return make_console(stderr=True)


def ablate_main(sweep: str, pair: str = "tiny", dry_run: bool = False, out: str | None = None,
                steps: int | None = None, seeds=None, jobs: int | None = None, progress: bool = True) -> list[dict]:
    """``graft ablate --sweep NAME``: expand the sweep, list it (dry run) or train + evaluate its runs."""
    if steps is not None and steps < 1:
        raise GraftError("--steps must be >= 1")
    if jobs is not None and jobs < 1:
        raise GraftError("--jobs must be >= 1")
    plan = P.load_sweep(sweep, pair=pair, seeds=seeds or None, steps=steps)
    out = out or os.path.join("results", "ablate")
    if dry_run:
        click.echo(X.dry_run_markdown(plan, out, X.describe(plan, out)))
        return []
    console = _console()
    records = X.execute(plan, out, jobs=jobs, progress=progress, console=console)
    click.echo(X.results_markdown(plan, records))
    console.print(f"sweep {plan.name}: runs in {out}/ ; results {os.path.join(out, f'plan_{plan.name}.md')} and "
                  f"{os.path.join(out, f'plan_{plan.name}.json')} (tables: graft report {out})")
    return records


def unplanned_methods(plan: P.Plan) -> list[str]:
    """Method configs in experiments/method/ that the plan does not run."""

    used = {r.method for r in plan.runs}
    return [m for m in P.known(os.path.join(EXPERIMENTS_DIR, "method")) if m not in used]


def reproduce_main(pair: str = "tiny", out: str | None = None, dry_run: bool = False, jobs: int | None = None,
                   steps: int | None = None, report: bool = True, progress: bool = True) -> dict:
    """``graft reproduce --pair P``: the plan ``experiments/reproduce/<P>.yaml``: train and evaluate every run
    (resumable), then ``graft report`` on the output folder with the claims section."""
    if steps is not None and steps < 1:
        raise GraftError("--steps must be >= 1")
    if jobs is not None and jobs < 1:
        raise GraftError("--jobs must be >= 1")
    plan = P.load_reproduce(pair, steps=steps)
    out = out or os.path.join("results", f"reproduce_{plan.name}")
    missing = unplanned_methods(plan) if plan.pair == "tiny" else []  # the miniatures name what they leave out
    full = f"{plan.name}_full"
    has_full = os.path.exists(os.path.join(P.reproduce_dir(), f"{full}.yaml"))
    hint = f"add a line to {plan.source}" + (f", or run the plan that has them: --pair {full}" if has_full else "")
    if dry_run:
        click.echo(X.dry_run_markdown(plan, out, X.describe(plan, out)))
        if missing:
            click.echo(f"\nmethod configs not in the plan: {', '.join(missing)} ({hint})")
        return {}
    console = _console()
    if missing:
        console.print(f"note: method configs not in the plan: {', '.join(missing)} ({hint})")
    t0 = time.time()
    records = X.execute(plan, out, jobs=jobs, progress=progress, console=console)
    result = {"records": records, "out": out, "report": None, "claims": []}
    if report:
        result.update(report_and_claims(plan, out, records, console))
    wall = time.time() - t0
    click.echo(X.results_markdown(plan, records))
    if result.get("claims_md"):
        click.echo("\n" + result["claims_md"])
    console.print(f"reproduce {plan.pair}: {len(records)} runs in {out}/ ({wall / 60:.1f} min this time); results "
                  f"{os.path.join(out, f'plan_{plan.name}.md')}"
                  + (f"; report {os.path.join(result['report'], 'report.md')}" if result.get("report") else ""))
    return result


CLAIM_KINDS = {"graft": "graft_cli.report.claims", "saf": "graft_cli.report.saf_claims",
               "tandem": "graft_cli.report.tandem_claims", "npeer": "graft_cli.report.npeer_claims",
               "none": None}  # none: graft report's tables only (the paper-table plans span pairs or students)


def report_and_claims(plan: P.Plan, out: str, records: list[dict], console) -> dict:
    """``graft report`` on the plan's folder, then the claims of the plan's paper (``claims.kind``: graft | saf |
    tandem | npeer | none)."""

    kind = str((plan.claims or {}).get("kind", "graft"))
    if kind not in CLAIM_KINDS:
        raise GraftError(f"{plan.source}: claims.kind {kind!r}: must be one of {', '.join(CLAIM_KINDS)}")
    rdir = os.path.join(out, "report")
    try:
        report_main([out], out=rdir, console=console)
    except Exception as e:  # the claims section is still written
        console.print(f"[yellow]warning[/]: graft report failed ({type(e).__name__}: {e}); writing the claims only")
    if CLAIM_KINDS[kind] is None:
        return {"report": rdir, "claims": [], "claims_md": ""}
    write_claims = importlib.import_module(CLAIM_KINDS[kind]).write_claims
    md, claims = write_claims(rdir, records, plan.claims)
    return {"report": rdir, "claims": claims, "claims_md": md}
