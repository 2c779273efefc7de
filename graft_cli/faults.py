"""Fault injection for the crash tests: ``GRAFT_FAULT=<point>:<step>`` makes the process SIGKILL itself when it
reaches ``point`` during step ``step`` (1-based; for the checkpoint points, the checkpoint of that step), as a
crash or an OOM kill would. Points: ``rollout`` (sampled, not graded), ``reward`` (graded), ``score`` (old
log-probs scored), ``update`` (after the first optimizer step of the step), ``checkpoint`` (weights written,
no state or manifest yet), ``manifest`` (manifest written, not marked complete), ``rename`` (complete under its
temporary name). Unset (always, outside tests): a no-op.
"""

from __future__ import annotations

import os
import signal

POINTS = ("rollout", "reward", "score", "update", "checkpoint", "manifest", "rename")


def point(name: str, step: int) -> None:
    spec = os.environ.get("GRAFT_FAULT")
    if spec and spec == f"{name}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)
