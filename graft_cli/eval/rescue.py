"""Rescue rate: does a prompt the receiver could not solve become solvable after training on it?

GRAFT's mechanism (graft.md §2.1–2.3) acts on prompts where the receiver's whole group fails and the
peer's group is mixed: the receiver's zero-signal group is replaced by the peer's. The rescue rate
measures whether that lesson sticks.

* **Events** (:func:`rescue_events`, pure over a run's rollout logs,
  ``rollouts/<policy>/step_N.parquet``): a prompt whose group of the receiver's own samples all
  failed (every reward ≤ 0) at some step t. The event is *admitted* when the update of that step
  used at least one response of another policy on that prompt (the log's ``peer_rows`` column,
  written after the exchange's admission). A prompt's first event counts (the earliest step;
  admitted if any of its all-fail draws was admitted).
* **Outcome** (:func:`rescue_summary`): the prompt is drawn again by the evaluation at the run's
  last checkpoint with the training sampling (``rollout.n`` samples at
  ``rollout.temperature``/``top_p``), and counts as rescued when at least one sample is correct.
  (Re-draws inside training are rare: a 40-step run of 64 prompts per step sees 2,560 of the tiny
  task's 8,192 problems once, in one epoch; so the draw is made at the end.)
* The rescue rate is rescued / events, per subset: ``admitted`` (GRAFT's grafted all-fail prompts)
  and ``not_admitted`` (all-fail prompts without an admitted graft; for GRPO, every all-fail
  prompt). The report sets GRAFT's admitted rate against GRPO's rate on its own all-fail prompts.

Events are capped at ``cap`` per subset (a seeded, order-free sample: SHA-256 of the prompt id and
seed) so the evaluation's cost stays bounded. """

from __future__ import annotations

import glob
import hashlib
import os

import numpy as np

RESCUE_DIR = "rescue"
BENCH = "rescue"


def read_logs(run_dir: str, policy: str):
    """All rollout logs of ``policy`` as one DataFrame (columns step, prompt_id, reward, peer_rows);
    None when the run logged none."""
    # lazy: pandas is heavy
    import pandas as pd

    files = sorted(glob.glob(os.path.join(run_dir, "rollouts", policy, "step_*.parquet")))
    if not files:
        return None
    cols = ["step", "prompt_id", "reward", "peer_rows"]
    frames = []
    for f in files:
        df = pd.read_parquet(f)
        if "peer_rows" not in df.columns:
            df["peer_rows"] = 0
        frames.append(df[cols])
    return pd.concat(frames, ignore_index=True)


def rescue_events(logs) -> list[dict]:
    """Per prompt id with an all-fail group at some step: ``{prompt_id, step, admitted}``, ``step``
    the earliest all-fail step, ``admitted`` true when any all-fail draw of it had ``peer_rows`` >
    0. Sorted by (step, prompt_id)."""
    if logs is None or len(logs) == 0:
        return []
    g = logs.groupby(["step", "prompt_id"], sort=True).agg(best=("reward", "max"), peer=("peer_rows", "max"))
    fail = g[g["best"] <= 0].reset_index()
    out: dict[str, dict] = {}
    for row in fail.itertuples(index=False):
        pid = str(row.prompt_id)
        ev = out.get(pid)
        if ev is None:
            out[pid] = {"prompt_id": pid, "step": int(row.step), "admitted": bool(row.peer > 0)}
        elif row.peer > 0:
            ev["admitted"] = True
    return sorted(out.values(), key=lambda e: (e["step"], e["prompt_id"]))


def _key(pid: str, seed: int) -> str:
    return hashlib.sha256(f"{seed}:{pid}".encode()).hexdigest()


def capped(events: list[dict], cap: int, seed: int = 0) -> list[dict]:
    """At most ``cap`` events per subset (admitted / not admitted), the ``cap`` smallest SHA-256
    keys of (seed, prompt id): a sample that does not depend on the order of the logs. ``cap`` ≤ 0
    keeps all."""
    if cap <= 0:
        return list(events)
    keep = []
    for flag in (True, False):
        sub = [e for e in events if e["admitted"] is flag]
        keep += sorted(sub, key=lambda e: _key(e["prompt_id"], seed))[:cap]
    return sorted(keep, key=lambda e: (e["step"], e["prompt_id"]))


def rescue_summary(events: list[dict], correct: np.ndarray) -> dict:
    """Rates from the re-draw: ``correct[i, j]`` is sample j of event i's prompt graded correct. Per
    subset (``admitted``, ``not_admitted``, ``all``): events, rescued (≥ 1 correct sample), rate
    (None when empty) and mean pass@1 of the re-draw."""
    correct = np.asarray(correct, dtype=np.float64).reshape(len(events), -1) if len(events) else np.zeros((0, 1))
    out = {}
    for name, sel in (("admitted", [e["admitted"] for e in events]),
                      ("not_admitted", [not e["admitted"] for e in events]),
                      ("all", [True] * len(events))):
        idx = [i for i, s in enumerate(sel) if s]
        solved = int(sum(correct[i].max() > 0 for i in idx))
        out[name] = {"events": len(idx), "rescued": solved, "rate": solved / len(idx) if idx else None,
                     "pass1": float(correct[idx].mean()) if idx else None}
    return out


__all__ = ["rescue_events", "capped", "rescue_summary", "read_logs", "RESCUE_DIR"]
