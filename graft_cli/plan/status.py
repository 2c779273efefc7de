"""Is a run finished, partial or new; is its evaluation done (read from the run directory only).

A run is *finished* when its last complete checkpoint's step equals its total steps: the plan's
``run.steps`` when set, else the ``total_steps`` its checkpoint recorded (``state.json``). A
checkpoint past the planned total also counts as finished (the run is not retrained; ``note`` says
so). Anything with ``config.yaml`` but short of that is *partial* (``train()`` resumes it from its
last checkpoint). """

from __future__ import annotations

import os
from dataclasses import dataclass

from graft_cli.rundir import (best_path, checkpoint_dir, checkpoints_dir, config_path, eval_step_dir, read_json_or_none,
                              run_config_raw, run_policies)
from graft_cli.train import checkpoint as ckpt


@dataclass
class RunStatus:
    state: str  # new | partial | finished
    step: int  # last complete checkpoint step (0: none)
    total: int | None  # planned total steps (None: unknown until trained)
    note: str = ""

    @property
    def finished(self) -> bool:
        return self.state == "finished"

    def label(self) -> str:
        if self.state == "new":
            return "new"
        tot = "?" if self.total is None else str(self.total)
        return f"{self.state} {self.step}/{tot}" + (f" ({self.note})" if self.note else "")


def checkpoint_total(path: str) -> int | None:
    """The total steps a checkpoint's ``state.json`` recorded (JSON only; None when unreadable)."""
    try:
        st = ckpt.load_state(path)
        return int(st["total_steps"]) if st.get("total_steps") is not None else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_status(run_dir: str, total_steps: int | None) -> RunStatus:
    """Status of ``run_dir`` against ``total_steps`` (None: use the checkpoint's own recorded
    total)."""
    if not os.path.exists(config_path(run_dir)):
        return RunStatus("new", 0, total_steps)
    steps = ckpt.complete_steps(checkpoints_dir(run_dir))
    if not steps:
        return RunStatus("partial", 0, total_steps)
    last = steps[-1]
    total = total_steps
    if total is None:
        total = checkpoint_total(checkpoint_dir(run_dir, last))
    if total is None:
        return RunStatus("partial", last, None, "total unknown")
    if last == total:
        return RunStatus("finished", last, total)
    if last > total:
        return RunStatus("finished", last, total, f"has {last} steps")
    return RunStatus("partial", last, total)


# --------------------------------------------------------------------------------------------- eval
def eval_targets(run_dir: str, steps_spec: str) -> dict[str, list[int]] | None:
    """policy -> the steps ``graft eval --run DIR --steps SPEC`` would evaluate (None: cannot tell
    yet)."""
    pols = run_policies(run_dir)
    complete = ckpt.complete_steps(checkpoints_dir(run_dir))
    spec = (steps_spec or "last").strip()
    if spec == "last":
        return {p: complete[-1:] for p in pols} if complete else None
    if spec == "best":
        best = read_json_or_none(best_path(run_dir)) or {}
        out = {p: [int(best["policies"][p]["step"])] for p in pols if p in (best.get("policies") or {})}
        return out if len(out) == len(pols) else None
    if spec == "all":
        return {p: complete for p in pols} if complete else None
    try:
        wanted = sorted({int(x) for x in spec.split(",") if x.strip()})
    except ValueError:
        return None
    return {p: wanted for p in pols}


def eval_summary(run_dir: str, policy: str, step: int) -> dict | None:
    return read_json_or_none(os.path.join(eval_step_dir(run_dir, policy, step), "summary.json"))


def eval_done(run_dir: str, steps_spec: str, runs: int, samples: int | None = None,
              benchmarks: list | None = None, bench_runs: dict | None = None) -> bool:
    """True when every target (policy, step) has a summary with at least ``runs`` eval runs (a
    benchmark of ``bench_runs``: at least its own), made with ``samples`` samples (when given) and
    covering ``benchmarks`` (names; when given)."""
    targets = eval_targets(run_dir, steps_spec)
    if not targets or not any(targets.values()):
        return False
    for pol, steps in targets.items():
        for s in steps:
            summ = eval_summary(run_dir, pol, s)
            if summ is None or int(summ.get("num_runs") or 0) < runs:
                return False
            if samples is not None and int((summ.get("settings") or {}).get("samples", -1)) != int(samples):
                return False
            have = summ.get("benchmarks") or {}
            if any(int((have.get(b) or {}).get("num_runs") or 0) < int(r) for b, r in (bench_runs or {}).items()):
                return False
            if benchmarks:
                names = {b.split("=", 1)[0] for b in benchmarks}
                if not names <= set(summ.get("benchmarks") or {}):
                    return False
            folder = eval_step_dir(run_dir, pol, s)
            if _tandem_eval(run_dir) and not all(os.path.exists(os.path.join(folder, d, "summary.json"))
                                                 for d in ("handoff", "legibility")):
                return False
    return True


def _tandem_eval(run_dir: str) -> bool:
    """Whether the run's config asks for the handoff and legibility evaluations
    (``eval.tandem``)."""
    return bool((run_config_raw(run_dir).get("eval") or {}).get("tandem"))
