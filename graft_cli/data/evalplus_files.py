"""HumanEval+ and MBPP+ as EvalPlus ships them: the release files (``task_id, prompt, entry_point,
canonical_solution, base_input, plus_input, atol, contract``, MBPP+'s ``assertion``), read from a path (``.jsonl``
or ``.jsonl.gz``), as problems graded by the code reward exactly as EvalPlus grades them
(graft_cli/reward/evalplus.py).

* :data:`RELEASES`: ``humaneval_plus`` (HumanEval+ v0.1.10, 164 tasks) and ``mbpp_plus`` (MBPP+ v0.2.0, 378
  tasks), each with the environment variable EvalPlus itself honours (``HUMANEVAL_OVERRIDE_PATH``,
  ``MBPP_OVERRIDE_PATH``) and its release file's name (looked for in the evaluation data directory:
  ``--eval-dir`` / ``eval.data_dir`` / ``$GRAFT_EVAL_DIR``). :func:`release_path` finds a file or stops in one line.
* :func:`read_release` reads the rows; MBPP+'s tuple, set and complex inputs, stored as JSON lists and strings, are
  turned back as EvalPlus's ``mbpp_deserialize_inputs`` does (:func:`mbpp_deserialize_inputs`).
* :func:`evalplus_problems`: the problems, each prompt EvalPlus's instruct prompt, each gold ``{"evalplus": dataset,
  "sha256": the file's, "task_id", "prompt"}``; the expected outputs are computed on first use of a file (the
  references run in the code reward's sandbox, in grading workers) and cached by the file's sha256
  (:func:`ensure_expected`), so a second evaluation reads them back. """

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass

from graft_cli.data.code_problems import evalplus_message, jsonl_lines
from graft_cli.data.problems import Problem
from graft_cli.errors import GraftError
from graft_cli.reward.convert import encode
from graft_cli.reward.evalplus import load_cache, write_cache
from graft_cli.rundir import sha256_file

FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "base_input", "plus_input", "atol")


@dataclass(frozen=True)
class Release:
    """One EvalPlus benchmark: its dataset (EvalPlus's ``--dataset``), override variable, release file and size."""

    dataset: str
    env: str
    filename: str
    size: int
    repo: str  # where the official files come from


RELEASES = {
    "humaneval_plus": Release("humaneval", "HUMANEVAL_OVERRIDE_PATH", "HumanEvalPlus-v0.1.10.jsonl.gz", 164,
                              "the GitHub release v0.1.10 of evalplus/humanevalplus_release"),
    "mbpp_plus": Release("mbpp", "MBPP_OVERRIDE_PATH", "MbppPlus-v0.2.0.jsonl.gz", 378,
                         "the GitHub release v0.2.0 of evalplus/mbppplus_release"),
}


def release_path(name: str, eval_dir: str | None = None) -> str:
    """The release file of benchmark ``name``: ``$HUMANEVAL_OVERRIDE_PATH`` / ``$MBPP_OVERRIDE_PATH``, else its
    file (``.jsonl.gz`` or the decompressed ``.jsonl``) in ``eval_dir``; raises GraftError in one line naming
    both and where the files come from."""
    r = RELEASES[name]
    env = os.environ.get(r.env)
    if env:
        if not os.path.exists(env):
            raise GraftError(f"benchmark {name}: {r.env}={env}: file not found")
        return env
    for f in (r.filename, r.filename[:-3]):
        if eval_dir and os.path.exists(os.path.join(eval_dir, f)):
            return os.path.join(eval_dir, f)
    raise GraftError(f"benchmark {name}: no release file; set {r.env}=FILE or put {r.filename} in eval.data_dir "
                     f"(--eval-dir, ${'GRAFT_EVAL_DIR'}) (the official file: {r.repo})")


# --------------------------------------------------------------------------------------------- MBPP+ inputs
def _tuples_deep(x):
    return tuple(_tuples_deep(v) for v in x) if isinstance(x, list) else x


def mbpp_deserialize_inputs(task_id: str, inputs: list) -> list:
    """MBPP+'s inputs as its tasks take them (``evalplus/data/mbpp.py`` ``mbpp_deserialize_inputs``: JSON has no
    tuples, sets or complex numbers)."""
    n = int(str(task_id).split("/")[-1])
    if n in (2, 116, 132, 143, 222, 261, 273, 394, 399, 421, 424, 429, 470, 560, 579, 596, 616, 630, 726, 740, 744,
             809):
        return [[tuple(lst) for lst in inp] for inp in inputs]
    if n in (63, 64, 70, 94, 120, 237, 272, 299, 400, 409, 417, 438, 473, 614, 780):
        return [[[tuple(lst) for lst in lst_lst] for lst_lst in inp] for inp in inputs]
    if n in (75, 413, 444, 753):
        return [[[tuple(lst) for lst in inp[0]]] + [inp[1]] for inp in inputs]
    if n in (106, 750):
        return [[inp[0]] + [tuple(inp[1])] for inp in inputs]
    if n == 115:
        return [[[set(item) if isinstance(item, list) and len(item) else {} for item in inp[0]]] for inp in inputs]
    if n == 124:
        return [(float(inp[0]), complex(inp[1])) for inp in inputs]
    if n in (250, 405, 446, 617, 720, 763, 808):
        return [[tuple(inp[0])] + [inp[1]] for inp in inputs]
    if n in (259, 401, 445):
        return [[tuple(lst) for lst in [[tuple(lst) for lst in lst_lst] for lst_lst in inp]] for inp in inputs]
    if n == 278:
        return [[tuple(lst) for lst in [[tuple(item) if isinstance(item, list) else item for item in inp[0]]]]
                for inp in inputs]
    if n == 307:
        return [[tuple(inp[0])] + [inp[1], inp[2]] for inp in inputs]
    if n == 722:
        return [[{key: tuple(value) for key, value in inp[0].items()}] + inp[1:] for inp in inputs]
    if n == 252:
        return [[complex(inp[0])] for inp in inputs]
    if n in (580, 615, 791):
        return [_tuples_deep(inp) for inp in inputs]
    return inputs


def read_release(path: str, dataset: str) -> list[dict]:
    """The rows of a release file (``.jsonl`` or ``.jsonl.gz``), MBPP+'s inputs deserialised; raises GraftError
    naming the file and line of a bad row."""
    if not os.path.exists(path):
        raise GraftError(f"{path}: file not found")
    rows = []
    for lineno, row in jsonl_lines(path):
        missing = [k for k in FIELDS if not isinstance(row, dict) or k not in row]
        if missing:
            raise GraftError(f"{path}:{lineno}: missing field(s) {', '.join(missing)} (an EvalPlus release file "
                             "has task_id, prompt, entry_point, canonical_solution, base_input, plus_input, atol)")
        if dataset == "mbpp":
            row["base_input"] = mbpp_deserialize_inputs(row["task_id"], row["base_input"])
            row["plus_input"] = mbpp_deserialize_inputs(row["task_id"], row["plus_input"])
        rows.append(row)
    if not rows:
        raise GraftError(f"{path}: no tasks")
    return rows


# ----------------------------------------------------------------------------------------- expected outputs
def ensure_expected(path: str, dataset: str, rows: list[dict] | None = None, num_workers: int = 2,
                    where: str | None = None) -> str:
    """The file's sha256, its expected outputs cached (graft_cli/reward/evalplus.py ``cache_path``): computed
    here when missing, each task's reference run in a grading worker's sandbox."""
    from graft_cli.reward.code_grader import CodeGrader  # lazy: the sandbox's modules, needed on a file's first use

    sha = sha256_file(path)
    try:
        _warn_failed(load_cache(sha, where)["tasks"], path)
        return sha
    except FileNotFoundError:
        pass
    rows = rows if rows is not None else read_release(path, dataset)
    golds = []
    for r in rows:
        row = {"task_id": r["task_id"], "prompt": r["prompt"], "canonical_solution": r["canonical_solution"],
               "entry_point": r["entry_point"], "base_input": [encode(list(a)) for a in r["base_input"]],
               "plus_input": [encode(list(a)) for a in r["plus_input"]]}
        golds.append(json.dumps({"evalplus_reference": {"dataset": dataset, "row": row}}))
    grader = CodeGrader(num_workers=num_workers, convert=False, allow_root=True, dedupe=False)
    try:
        g = grader.grade([None] * len(golds), golds)
    finally:
        grader.close()
    tasks = {}
    for r, gold, out, st in zip(rows, golds, g.extracted, g.status):
        row = json.loads(gold)["evalplus_reference"]["row"]
        res = json.loads(out) if st == "code_reference" and out else {"error": f"reference run: {st} {out}"}
        t = {"entry_point": r["entry_point"], "atol": r["atol"]}
        if "error" in res:
            t["error"] = res["error"]
        else:
            for group in ("base", "plus"):
                t[group] = dict(res[group], inputs=row[f"{group}_input"])
        tasks[r["task_id"]] = t
    write_cache(sha, dataset, tasks, where)
    _warn_failed(tasks, path)
    return sha


def _warn_failed(tasks: dict, path: str) -> None:
    """One warning naming the tasks whose reference did not answer every input (their answers score 0,
    ``code_bad_gold``)."""
    bad = {k: t.get("error") or t["plus"]["error"] for k, t in tasks.items() if "error" in t or "error" in t["plus"]}
    if bad:
        first = next(iter(bad))
        warnings.warn(f"{path}: the reference solution of {len(bad)} task(s) did not answer every input in the "
                      f"sandbox ({', '.join(list(bad)[:5])}; {first}: {bad[first][:200]}); their answers fail "
                      "that group of inputs (code_bad_gold)", stacklevel=3)


def evalplus_problems(source: str, dataset: str, num_workers: int = 2) -> list[Problem]:
    """The tasks of release file ``source`` as problems (module docstring), their expected outputs ready."""
    rows = read_release(source, dataset)
    sha = ensure_expected(source, dataset, rows, num_workers)
    out = []
    for r in rows:
        gold = {"evalplus": dataset, "sha256": sha, "task_id": r["task_id"], "prompt": r["prompt"]}
        out.append(Problem(str(r["task_id"]), evalplus_message(r["prompt"]), json.dumps(gold)))
    ids = [p.id for p in out]
    if len(set(ids)) != len(ids):
        raise GraftError(f"{source}: duplicate task ids")
    return out
