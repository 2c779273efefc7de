"""Agreement of the code reward with EvalPlus's own evaluator on HumanEval+ and MBPP+ (the official release files).

The answers: every task's canonical solution (``prompt + canonical_solution``) and answers made mechanically from it
(:func:`mutants`; each kept only where it parses and differs from the solution): ``off_by_one`` (a ``range`` bound
±1), ``flip_compare`` (``<``/``<=``, ``>``/``>=``, ``==``/``!=``), ``drop_branch`` (an ``if`` without ``else``
removed, or one with ``else`` replaced by its else branch: a dropped edge case), ``return_type`` (the last
``return``'s value wrapped in ``float``/``tuple``/``str``), ``division`` (``//`` and ``/`` swapped), ``constant`` (an
integer constant + 1), ``quadratic`` (a loop quadratic in the size of the first argument added: correct but slow, a
time-out on large inputs), ``prints`` (the arguments printed to stdout), ``raise_edge`` (``ValueError`` on a falsy
first argument).

Both graders see the same answers offline on the same file: graft's code reward (graft_cli/reward/evalplus.py: its
expected outputs from the references run in its sandbox) and ``evalplus.evaluate.evaluate`` (``evalplus`` 0.3.x, its
defaults: ``min_time_limit`` 1.0 s, ``gt_time_limit_factor`` 4.0, fast check, the release file through
``HUMANEVAL_OVERRIDE_PATH`` / ``MBPP_OVERRIDE_PATH``), each with ``--workers`` processes. The base verdict is each
one's base status; the plus verdict is the leaderboard's (base and plus both pass). Every disagreement is listed
with both graders' statuses and graft's detail.

    python benchmarks/evalplus_agreement.py [--data ../shared/data/evalplus] [--datasets humaneval,mbpp]
        [--tasks 0] [--kinds-per-task 5] [--workers 2] [--seed 0] [--out docs/measurements/evalplus]

``--tasks N`` keeps the first N tasks of each file (0: all). Writes ``agreement.json`` and ``agreement.md`` under
``--out`` (none with ``--no-write``).
"""

from __future__ import annotations

import argparse
import ast
import collections
import copy
import json
import os
import random
import subprocess
import sys
import tempfile
import time

FILES = {"humaneval": "HumanEvalPlus-v0.1.10.jsonl.gz", "mbpp": "MbppPlus-v0.2.0.jsonl.gz"}
ENV = {"humaneval": "HUMANEVAL_OVERRIDE_PATH", "mbpp": "MBPP_OVERRIDE_PATH"}
KINDS = ("off_by_one", "flip_compare", "drop_branch", "return_type", "division", "constant", "quadratic", "prints",
         "raise_edge")
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DATA = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "data", "evalplus"))


# ------------------------------------------------------------------------------------------------ mutants
_FLIP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq}


def _sites(tree: ast.Module, kind: str) -> list:
    """The nodes ``kind`` can change, in a fixed order (a walk of the tree)."""
    nodes = list(ast.walk(tree))
    if kind == "off_by_one":
        return [n for n in nodes if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "range"
                and n.args]
    if kind == "flip_compare":
        return [n for n in nodes if isinstance(n, ast.Compare) and type(n.ops[0]) in _FLIP]
    if kind == "drop_branch":
        return [n for n in nodes if isinstance(n, ast.If)]
    if kind == "return_type":
        rets = [n for n in nodes if isinstance(n, ast.Return) and n.value is not None]
        return rets[-1:]
    if kind == "division":
        return [n for n in nodes if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.FloorDiv, ast.Div))]
    if kind == "constant":
        return [n for n in nodes if isinstance(n, ast.Constant) and type(n.value) is int]
    return []


def _entry_def(tree: ast.Module, entry: str):
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry), None)


def _prepend(fn: ast.FunctionDef, code: str) -> None:
    """Put ``code`` at the top of ``fn``'s body (after its docstring)."""
    at = 1 if fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) \
        and isinstance(fn.body[0].value.value, str) else 0
    fn.body[at:at] = ast.parse(code).body


def _mutate(tree: ast.Module, kind: str, i: int, entry: str, variant: int = 0) -> ast.Module | None:
    """A copy of ``tree`` with site ``i`` of ``kind`` changed (None: no such change)."""
    tree = copy.deepcopy(tree)
    if kind in ("quadratic", "prints", "raise_edge"):
        fn = _entry_def(tree, entry)
        if fn is None:
            return None
        args = [a.arg for a in fn.args.args]
        if kind == "quadratic":
            n = f"len(repr({args[0]}))" if args else "1000"
            _prepend(fn, f"_q_n = {n}\nfor _q_i in range(_q_n):\n    for _q_j in range(_q_n):\n        pass\n")
        elif kind == "prints":
            _prepend(fn, f"print({', '.join(args)})\n")
        else:
            if not args:
                return None
            _prepend(fn, f"if not {args[0]}:\n    raise ValueError('edge')\n")
        return tree
    sites = _sites(tree, kind)
    if i >= len(sites):
        return None
    n = sites[i]
    if kind == "off_by_one":
        k = len(n.args) - 1 if len(n.args) <= 2 else 1  # range(stop) / range(start, stop) / range(a, stop, step)
        n.args[k] = ast.BinOp(n.args[k], ast.Add() if variant == 0 else ast.Sub(), ast.Constant(1))
    elif kind == "flip_compare":
        n.ops[0] = _FLIP[type(n.ops[0])]()
    elif kind == "drop_branch":
        parent = next((p for p in ast.walk(tree) for f in ("body", "orelse") if n in getattr(p, f, [])), None)
        if parent is None:
            return None
        for f in ("body", "orelse"):
            block = getattr(parent, f, None)
            if isinstance(block, list) and n in block:
                k = block.index(n)
                block[k:k + 1] = n.orelse or []
                if not block:
                    block.append(ast.Pass())
    elif kind == "return_type":
        wrap = ("float", "tuple", "str")[variant % 3]
        n.value = ast.Call(ast.Name(wrap, ast.Load()), [n.value], [])
    elif kind == "division":
        n.op = ast.Div() if isinstance(n.op, ast.FloorDiv) else ast.FloorDiv()
    elif kind == "constant":
        n.value = n.value + 1
    return tree


def mutants(program: str, entry: str, kinds, rng: random.Random) -> list[tuple[str, str]]:
    """``(kind, source)`` for one mutant of each of ``kinds`` that applies to ``program`` (a random site and
    variant of each), each parsing and different from the program."""
    try:
        tree = ast.parse(program)
    except SyntaxError:
        return []
    base = ast.unparse(tree)
    out = []
    for kind in kinds:
        n = max(1, len(_sites(tree, kind)))
        order = list(range(n))
        rng.shuffle(order)
        for i in order:
            new = _mutate(tree, kind, i, entry, rng.randrange(3))
            if new is None:
                continue
            try:
                ast.fix_missing_locations(new)
                src = ast.unparse(new)
                ast.parse(src)
            except (SyntaxError, ValueError, RecursionError):
                continue
            if src != base:
                out.append((kind, src))
                break
    return out


def answers_for(rows: list[dict], kinds_per_task: int, seed: int) -> list[dict]:
    """Every task's canonical solution and its mutants (``{task_id, kind, solution}``): per task ``kinds_per_task``
    of :data:`KINDS` that apply, taken in random order (the quadratic kind in one task of four: each of its
    time-outs costs a second or more)."""
    rng = random.Random(seed)
    out = []
    for j, r in enumerate(rows):
        prog = r["prompt"] + r["canonical_solution"]
        out.append({"task_id": r["task_id"], "kind": "canonical", "solution": prog})
        pool = [k for k in KINDS if k != "quadratic" or j % 4 == 0]
        rng.shuffle(pool)
        made = 0
        for kind in pool:  # in random order until kinds_per_task of them applied
            for made_kind, src in mutants(prog, r["entry_point"], [kind], rng):
                out.append({"task_id": r["task_id"], "kind": made_kind, "solution": src})
                made += 1
            if made == kinds_per_task:
                break
    return out


# ------------------------------------------------------------------------------------------------ the files
def slice_file(src: str, n: int, where: str, only=()) -> str:
    """The first ``n`` tasks of a release file (or the tasks ``only`` names) as a ``.jsonl`` in ``where`` (``n`` 0
    and no ``only``: the file itself)."""
    if not n and not only:
        return src
    from graft_cli.data.code_problems import read_rows

    rows = [r for r in read_rows(src) if r["task_id"] in only] if only else read_rows(src)[:n]
    tag = f"-first{n}" if not only else "-" + "_".join(t.split("/")[-1] for t in only)
    path = os.path.join(where, os.path.basename(src).replace(".jsonl.gz", f"{tag}.jsonl"))
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


# ------------------------------------------------------------------------------------------------ EvalPlus
EVALPLUS_SETTINGS = "evalplus.evaluate.evaluate defaults: min_time_limit={m}, gt_time_limit_factor={f}, fast_check " \
                    "(stop at the first failure), EVALPLUS_TIMEOUT_PER_TASK 60, EVALPLUS_MAX_MEMORY_BYTES 4 GiB"

_EVALPLUS_RUN = r"""
import contextlib, io, json, os, sys, time
ds, release, samples, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
os.environ[{"humaneval": "HUMANEVAL_OVERRIDE_PATH", "mbpp": "MBPP_OVERRIDE_PATH"}[ds]] = release
from evalplus import __version__
from evalplus.config import DEFAULT_GT_TIME_LIMIT_FACTOR, DEFAULT_MIN_TIME_LIMIT
from evalplus.data import get_human_eval_plus, get_human_eval_plus_hash, get_mbpp_plus, get_mbpp_plus_hash
from evalplus.eval._special_oracle import MBPP_OUTPUT_NOT_NONE_TASKS
from evalplus.evaluate import evaluate, get_groundtruth
with contextlib.redirect_stdout(io.StringIO()):
    if ds == "humaneval":
        get_groundtruth(get_human_eval_plus(), get_human_eval_plus_hash(), [])
    else:
        get_groundtruth(get_mbpp_plus(), get_mbpp_plus_hash(), MBPP_OUTPUT_NOT_NONE_TASKS)
    t0 = time.perf_counter()
    evaluate(ds, samples=samples, parallel=workers, i_just_wanna_run=True)
    dt = time.perf_counter() - t0
print(json.dumps({"seconds": dt, "version": __version__, "min_time_limit": DEFAULT_MIN_TIME_LIMIT,
                  "gt_time_limit_factor": DEFAULT_GT_TIME_LIMIT_FACTOR}))
"""


def evalplus_verdicts(dataset: str, release: str, answers: list[dict], workers: int, where: str) -> dict:
    """EvalPlus's own evaluator on ``answers``: ``{"verdicts": [(base, plus), ...], "status": [(base_status,
    plus_status), ...], "seconds", "version", "min_time_limit", "gt_time_limit_factor"}`` (seconds: its
    ``evaluate`` call, the expected outputs computed and cached before)."""
    samples = os.path.join(where, f"{dataset}_samples_{workers}.jsonl")
    with open(samples, "w", encoding="utf-8") as f:
        for a in answers:
            f.write(json.dumps({"task_id": a["task_id"], "solution": a["solution"]}) + "\n")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", _EVALPLUS_RUN, dataset, release, samples, str(workers)],
                       capture_output=True, text=True, env=env, cwd=where)
    if p.returncode != 0:
        raise RuntimeError(f"evalplus failed: {p.stderr[-2000:]}")
    info = json.loads(p.stdout.strip().splitlines()[-1])
    with open(samples.replace(".jsonl", "_eval_results.json"), encoding="utf-8") as f:
        res = json.load(f)["eval"]
    seen = collections.Counter()
    verdicts, status = [], []
    for a in answers:
        r = res[a["task_id"]][seen[a["task_id"]]]
        seen[a["task_id"]] += 1
        status.append((r["base_status"], r["plus_status"]))
        verdicts.append((r["base_status"] == "pass", r["base_status"] == r["plus_status"] == "pass"))
    return dict(info, verdicts=verdicts, status=status)


# --------------------------------------------------------------------------------------------------- graft
def graft_problems(dataset: str, release: str, workers: int) -> dict:
    from graft_cli.data.evalplus_files import evalplus_problems

    t0 = time.perf_counter()
    probs = {p.id: p for p in evalplus_problems(release, dataset, num_workers=workers)}
    return {"problems": probs, "seconds": time.perf_counter() - t0}


def graft_verdicts(problems: dict, answers: list[dict], workers: int) -> dict:
    """graft's code reward on ``answers`` (each its solution in a python fence): ``{"verdicts", "status",
    "seconds"}`` (seconds: the grading, its workers started and warmed first)."""
    from graft_cli.reward.code_grader import CodeGrader

    resp = ["```python\n" + a["solution"] + "\n```" for a in answers]
    golds = [problems[a["task_id"]].answer for a in answers]
    g = CodeGrader(num_workers=workers, allow_root=True)
    try:
        g.grade(resp[:workers], golds[:workers])  # start and warm the workers
        t0 = time.perf_counter()
        res = g.grade(resp, golds)
        dt = time.perf_counter() - t0
    finally:
        g.close()
    return {"verdicts": [(bool(b == 1.0), bool(r == 1.0)) for b, r in zip(res.base, res.rewards)],
            "status": list(res.status), "seconds": dt}


def graft_detail(problem, solution: str) -> str:
    """graft's detail for one answer (graded again in this process's sandbox)."""
    from graft_cli.reward.code_grader import _sandbox_for, grade_code

    _, _, status, _, detail = grade_code("```python\n" + solution + "\n```", problem.answer,
                                         _sandbox_for({"timeout_s": 10.0}))
    return f"{status}: {detail}"


# ---------------------------------------------------------------------------------------------------- run
def compare(dataset: str, answers: list[dict], ours: dict, theirs: dict, problems: dict) -> dict:
    rows = collections.defaultdict(lambda: collections.Counter())
    dis = []
    for a, (gb, gp), (eb, ep), gst, est in zip(answers, ours["verdicts"], theirs["verdicts"], ours["status"],
                                               theirs["status"]):
        c = rows[a["kind"]]
        c["n"] += 1
        c["base_agree"] += gb == eb
        c["plus_agree"] += gp == ep
        c["base_pass_graft"] += gb
        c["base_pass_evalplus"] += eb
        c["plus_pass_graft"] += gp
        c["plus_pass_evalplus"] += ep
        if (gb, gp) != (eb, ep):
            dis.append({"dataset": dataset, "task_id": a["task_id"], "kind": a["kind"], "graft": [gb, gp],
                        "evalplus": [eb, ep], "graft_status": gst, "evalplus_status": list(est),
                        "graft_detail": graft_detail(problems[a["task_id"]], a["solution"]),
                        "solution": a["solution"]})
    return {"kinds": {k: dict(v) for k, v in rows.items()}, "disagreements": dis}


def table(results: dict) -> str:
    lines = ["| dataset | kind | answers | base agree | plus agree | base pass graft / EvalPlus | "
             "plus pass graft / EvalPlus |", "|---|---|---:|---:|---:|---:|---:|"]
    for ds, r in results.items():
        tot = collections.Counter()
        for kind, c in sorted(r["kinds"].items(), key=lambda kv: (kv[0] != "canonical", kv[0])):
            tot.update(c)
            lines.append(f"| {ds} | {kind} | {c['n']} | {c['base_agree']} | {c['plus_agree']} | "
                         f"{c['base_pass_graft']} / {c['base_pass_evalplus']} | "
                         f"{c['plus_pass_graft']} / {c['plus_pass_evalplus']} |")
        lines.append(f"| {ds} | **all** | {tot['n']} | {tot['base_agree']} | {tot['plus_agree']} | "
                     f"{tot['base_pass_graft']} / {tot['base_pass_evalplus']} | "
                     f"{tot['plus_pass_graft']} / {tot['plus_pass_evalplus']} |")
    return "\n".join(lines)


def run(data: str, datasets, tasks: int, kinds_per_task: int, workers: int, seed: int, cache: str | None = None,
        files: dict | None = None, only=()) -> dict:
    """The whole comparison (module docstring); returns the results per dataset. ``cache``: where graft keeps its
    expected outputs (None: ``$GRAFT_EVALPLUS_CACHE`` or ``~/.cache/graft/evalplus``); ``files``: a dataset's
    release file other than :data:`FILES`'; ``only``: these task ids alone."""
    out = {}
    if cache:
        os.environ["GRAFT_EVALPLUS_CACHE"] = cache
    with tempfile.TemporaryDirectory(prefix="evalplus-agree-") as tmp:
        for ds in datasets:
            release = slice_file(os.path.join(data, (files or {}).get(ds) or FILES[ds]), tasks, tmp,
                                 [t for t in only if t.lower().startswith(ds)])
            from graft_cli.data.evalplus_files import read_release

            rows = read_release(release, ds)
            answers = answers_for(rows, kinds_per_task, seed)
            prep = graft_problems(ds, release, workers)
            ours = graft_verdicts(prep["problems"], answers, workers)
            theirs = evalplus_verdicts(ds, release, answers, workers, tmp)
            r = compare(ds, answers, ours, theirs, prep["problems"])
            r.update(answers=len(answers), tasks=len(rows), file=os.path.basename(release), workers=workers,
                     graft_seconds=ours["seconds"], evalplus_seconds=theirs["seconds"],
                     graft_expected_seconds=prep["seconds"],
                     evalplus={k: theirs[k] for k in ("version", "min_time_limit", "gt_time_limit_factor")})
            out[ds] = r
            print(f"{ds}: {len(answers)} answers on {len(rows)} tasks; disagreements {len(r['disagreements'])}; "
                  f"graft {ours['seconds']:.1f} s, EvalPlus {theirs['seconds']:.1f} s at {workers} workers",
                  flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=DEFAULT_DATA, help="folder with the EvalPlus release files")
    ap.add_argument("--datasets", default="humaneval,mbpp")
    ap.add_argument("--tasks", type=int, default=0, help="first N tasks of each file (0: all)")
    ap.add_argument("--kinds-per-task", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(HERE, "..", "docs", "measurements", "evalplus"))
    ap.add_argument("--mbpp-file", default=None, help="another MBPP+ file in --data (e.g. MbppPlus-v0.1.0.jsonl.gz)")
    ap.add_argument("--only", default="", help="these task ids alone (comma-separated)")
    ap.add_argument("--name", default="agreement", help="the written files' name")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    files = {"mbpp": args.mbpp_file} if args.mbpp_file else {}
    for ds in args.datasets.split(","):
        f = os.path.join(args.data, files.get(ds) or FILES[ds])
        if not os.path.exists(f):
            sys.exit(f"{f}: not found (--data: the folder of the EvalPlus files)")
    only = [t for t in args.only.split(",") if t]
    res = run(args.data, args.datasets.split(","), args.tasks, args.kinds_per_task, args.workers, args.seed,
              files=files, only=only)
    any_ds = next(iter(res.values()))
    print(EVALPLUS_SETTINGS.format(m=any_ds["evalplus"]["min_time_limit"], f=any_ds["evalplus"]["gt_time_limit_factor"])
          + f"; evalplus {any_ds['evalplus']['version']}")
    print(table(res))
    for r in res.values():
        for d in r["disagreements"]:
            print(f"DISAGREE {d['task_id']} {d['kind']}: graft base/plus {d['graft']} ({d['graft_detail']}), "
                  f"EvalPlus {d['evalplus']} {d['evalplus_status']}")
    if not args.no_write:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"{args.name}.json"), "w", encoding="utf-8") as f:
            json.dump({"args": vars(args) | {"data": os.path.basename(os.path.normpath(args.data))}, "results": res},
                      f, indent=1)
        with open(os.path.join(args.out, f"{args.name}.md"), "w", encoding="utf-8") as f:
            f.write(table(res) + "\n")
        print("wrote", os.path.join(args.out, f"{args.name}.json"))


if __name__ == "__main__":
    main()
