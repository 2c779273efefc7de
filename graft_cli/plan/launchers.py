"""The launchers by name: ``--launcher local`` (this machine's process pool) or ``slurm`` (every run
a Slurm job)."""

from __future__ import annotations

from graft_cli.errors import GraftError
from graft_cli.plan.launch import Launcher, LaunchOptions, LocalLauncher
from graft_cli.plan.slurm import SlurmLauncher

LAUNCHERS = {"local": LocalLauncher, "slurm": SlurmLauncher}


def get_launcher(name: str, opts: LaunchOptions) -> Launcher:
    """The launcher called ``name`` (one line naming the known ones otherwise)."""
    if name not in LAUNCHERS:
        raise GraftError(f"--launcher {name!r}: unknown; known: {', '.join(LAUNCHERS)}")
    return LAUNCHERS[name](opts)
