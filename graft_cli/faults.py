"""Fault injection for the crash tests: ``GRAFT_FAULT=<point>:<step>`` makes the process SIGKILL
itself when it reaches ``point`` during step ``step`` (1-based; for the checkpoint points, the
checkpoint of that step), as a crash or an OOM kill would. Points: ``rollout`` (sampled, not
graded), ``reward`` (graded), ``score`` (old log-probs scored), ``update`` (after the first
optimizer step of the step), ``checkpoint`` (weights written, no state or manifest yet),
``manifest`` (manifest written, not marked complete), ``rename`` (complete under its temporary
name), ``push`` (at ``run.staleness`` >= 1: a rollout thread about to load the weights of version
``step - 1`` into the replicas, train/rollouts.py). ``<point>:<step>@<rank>`` fires only in the process
of that rank (``RANK``) of a data-parallel run, so one rank dies while the others are in a
collective. Unset (always, outside tests): a no-op. """

from __future__ import annotations

import os
import signal

POINTS = ("rollout", "reward", "score", "update", "checkpoint", "manifest", "rename", "push")


def point(name: str, step: int) -> None:
    spec = os.environ.get("GRAFT_FAULT")
    if not spec:
        return
    where, _, rank = spec.partition("@")
    if where == f"{name}:{step}" and (not rank or rank == os.environ.get("RANK", "0")):
        os.kill(os.getpid(), signal.SIGKILL)
