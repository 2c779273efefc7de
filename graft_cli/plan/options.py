"""The launcher options shared by `graft reproduce` and `graft ablate` (click only: `graft --help`
loads no more)."""

from __future__ import annotations

import click

OPTIONS = (
    click.option("--launcher", default="local", show_default=True,
                 help="where the runs execute: local (this machine) or slurm (one batch job per run, its evaluation "
                      "after it, a report job at the end; docs/cluster.md)"),
    click.option("--status", is_flag=True, help="each run's state (queued, running, finished, failed; job ids, last "
                                                "step on disk); runs nothing"),
    click.option("--cancel", is_flag=True, help="slurm: cancel the plan's queued and running jobs"),
    click.option("--report-only", is_flag=True, help="write the results (and report) from the run directories; "
                                                     "train nothing (the Slurm report job runs this)"),
    click.option("--account", default=None, help="slurm: #SBATCH --account [default: the plan's slurm.account]"),
    click.option("--partition", default=None, help="slurm: #SBATCH --partition [default: the plan's, else the "
                                                   "cluster's default]"),
    click.option("--qos", default=None, help="slurm: #SBATCH --qos [default: the plan's slurm.qos]"),
    click.option("--time", "time_limit", default=None,
                 help="slurm: #SBATCH --time of the training jobs [default: the plan's slurm.time, else 1.5 x each "
                      "run's expected hours]"),
    click.option("--sbatch", "sbatch_lines", multiple=True,
                 help="slurm: an extra #SBATCH option, e.g. --sbatch=--constraint=h200 (repeatable)"),
)


def launch_options(fn):
    """Add :data:`OPTIONS` to a command."""
    for opt in reversed(OPTIONS):
        fn = opt(fn)
    return fn


def launch_kwargs(launcher, status, cancel, report_only, account, partition, qos, time_limit, sbatch_lines) -> dict:
    """The launcher fields of ``graft ablate`` / ``graft reproduce``'s options (``PlanOptions`` in
    :mod:`graft_cli.plan.commands`) from the options above."""
    from graft_cli.plan.launch import LaunchOptions  # lazy: the click options load before the plan package

    return {"launcher": launcher, "status": status, "cancel": cancel, "report_only": report_only,
            "launch": LaunchOptions(account=account, partition=partition, qos=qos, time=time_limit,
                                    sbatch=list(sbatch_lines))}
