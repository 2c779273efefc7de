"""File names of an evaluation folder, shared by the solo, handoff and legibility evaluations and
the reports."""

from __future__ import annotations

import os
import re

import numpy as np

from graft_cli.rundir import read_jsonl

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


def _read_rows(path: str) -> list[dict] | None:
    try:
        return read_jsonl(path)
    except (OSError, ValueError):
        return None


def read_problems(folder: str) -> tuple[dict[str, np.ndarray], list[float]]:
    """Per benchmark the per-problem pass@1 (mean grade over every run and sample of problem
    ``problem_index``), from ``<folder>/<bench>_run<k>.jsonl``; and the ``senior_frac`` of every row
    that has one. A benchmark with an unreadable file, a malformed row or a problem index without
    rows is left out."""
    means, _, fracs = read_problem_stats(folder)
    return means, fracs


def read_problem_stats(folder: str) -> tuple[dict[str, np.ndarray], dict[str, float], list[float]]:
    """:func:`read_problems` with, per benchmark, the sampling variance of its mean pass@1, v_b =
    (1/N²) Σ_p s²_p / n_p (s² the problem's grades' sample variance over its n_p runs × samples;
    ``graft_cli.report.power`` eq. 2)."""
    if not os.path.isdir(folder):
        return {}, {}, []
    files: dict[str, list[str]] = {}
    for f in sorted(os.listdir(folder)):
        m = RUN_FILE_RE.match(f)
        if m:
            files.setdefault(m["bench"], []).append(os.path.join(folder, f))
    out: dict[str, np.ndarray] = {}
    var: dict[str, float] = {}
    fracs: list[float] = []
    for bench, paths in files.items():
        grades: dict[int, list[float]] = {}
        bench_fracs: list[float] = []
        try:
            for p in paths:
                rows = _read_rows(p)
                if rows is None:
                    raise ValueError(p)
                for r in rows:
                    grades.setdefault(int(r["problem_index"]), []).append(float(r["grade"]))
                    if r.get("senior_frac") is not None:
                        bench_fracs.append(float(r["senior_frac"]))
        except (KeyError, TypeError, ValueError):
            continue
        if not grades or min(grades) < 0 or sorted(grades) != list(range(max(grades) + 1)):
            continue
        ordered = [grades[i] for i in range(len(grades))]
        out[bench] = np.array([np.mean(g) for g in ordered])
        var[bench] = grade_variance(ordered)
        fracs += bench_fracs
    return out, var, fracs


def grade_variance(grades: list[list[float]]) -> float:
    """(1/N²) Σ_p s²_p / n_p over the problems' grade lists (ddof 1; a problem with one grade counts
    0)."""
    N = len(grades)
    tot = 0.0
    for g in grades:
        if len(g) > 1:
            tot += float(np.var(np.asarray(g, dtype=np.float64), ddof=1)) / len(g)
    return tot / N ** 2 if N else 0.0


def read_grades(folder: str) -> dict[str, np.ndarray]:
    """Per benchmark the grades ``correct[run, problem, sample]`` (0/1) from
    ``<folder>/<bench>_run<k>.jsonl`` (runs in file order of k). A benchmark whose files are
    unreadable, malformed or incomplete (a run, problem or sample missing; runs of different sizes)
    is left out."""
    if not os.path.isdir(folder):
        return {}
    files: dict[str, list[tuple[int, str]]] = {}
    for f in os.listdir(folder):
        m = RUN_FILE_RE.match(f)
        if m:
            files.setdefault(m["bench"], []).append((int(m["run"]), os.path.join(folder, f)))
    out = {}
    for bench, paths in files.items():
        runs = []
        try:
            for _, p in sorted(paths):
                rows = _read_rows(p)
                if not rows:
                    raise ValueError(p)
                cells = {(int(r["problem_index"]), int(r["sample"])): float(r["grade"]) for r in rows}
                P = max(i for i, _ in cells) + 1
                S = max(j for _, j in cells) + 1
                if len(cells) != P * S or min(i for i, _ in cells) < 0 or min(j for _, j in cells) < 0:
                    raise ValueError(p)
                runs.append(np.array([[cells[i, j] for j in range(S)] for i in range(P)]))
        except (KeyError, TypeError, ValueError):
            continue
        if runs and len({r.shape for r in runs}) == 1:
            out[bench] = np.stack(runs)
    return out


def paired_grade_variance(x_folder: str, y_folder: str) -> dict[str, float]:
    """Per benchmark both folders hold with the same runs, problems and samples: the sampling
    variance of the difference of their mean pass@1, (1/N²) Σ_p s²_p(g^x − g^y) / n_p, over the
    grade differences of the same (run, problem, sample) (``graft_cli.report.power`` eq. 2 on the
    pairs: sampled with the same seeds, the two folders' answers can be correlated)."""
    gx, gy = read_grades(x_folder), read_grades(y_folder)
    out = {}
    for bench in sorted(set(gx) & set(gy)):
        a, b = gx[bench], gy[bench]
        if a.shape != b.shape or a.shape[0] * a.shape[2] < 2:
            continue
        d = (a - b).transpose(1, 0, 2).reshape(a.shape[1], -1)  # [problem, run x sample]
        out[bench] = float(np.sum(d.var(axis=1, ddof=1) / d.shape[1])) / d.shape[0] ** 2
    return out

