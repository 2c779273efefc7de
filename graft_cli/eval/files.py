"""File names of an evaluation folder, shared by the solo, handoff and legibility evaluations and the reports."""

from __future__ import annotations

import os
import re

RUN_FILE_RE = re.compile(r"^(?P<bench>.+)_run(?P<run>\d+)\.jsonl$")
STEP_DIR_RE = re.compile(r"^step_(\d{6,})$")


def run_file(out_dir: str, bench: str, run: int) -> str:
    return os.path.join(out_dir, f"{bench}_run{run}.jsonl")


def step_dirs(policy_dir: str) -> dict[int, str]:
    out = {}
    if os.path.isdir(policy_dir):
        for d in os.listdir(policy_dir):
            m = STEP_DIR_RE.match(d)
            if m and os.path.exists(os.path.join(policy_dir, d, "summary.json")):
                out[int(m.group(1))] = os.path.join(policy_dir, d)
    return dict(sorted(out.items()))
