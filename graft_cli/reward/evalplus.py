"""HumanEval+ and MBPP+ graded as EvalPlus grades them (``evalplus`` 0.3.1, ``evalplus/evaluate.py`` and
``evalplus/eval/__init__.py``), through the code reward's sandbox.

**Expected outputs** (:func:`ground_truth`) come from running each task's ``prompt + canonical_solution`` on its
``base_input`` and ``plus_input`` (EvalPlus's ``get_groundtruth``), in the sandbox an answer runs in (the ``call``
kind of :mod:`graft_cli.reward.harness`, the standard-library interpreter with ``-I -S``), with each call's wall time
(``time.time()`` around the call, as EvalPlus records it). MBPP+'s regex tasks
(:data:`MBPP_OUTPUT_NOT_NONE_TASKS`) keep only whether the reference returned something. They are written once per
release file, under its sha256, in :func:`cache_dir` (``<sha256>.json.gz``: each task's tagged inputs, expected
outputs and reference times), so a second evaluation reads them back.

**An answer** runs each group of inputs (base, then plus) in a sandboxed process of its own, as EvalPlus's
``untrusted_check`` runs it: the program executed afresh, then the entry point called on each input in order with
the input's time limit (:func:`time_limits`: ``max(min_time_limit, gt_time_limit_factor × reference time)``, a
``SIGALRM`` timer raising EvalPlus's ``TimeoutException``, cut to what is left of the group's wall clock,
:func:`group_timeout`) and its output swallowed (``swallow_io``: prints kept in memory, reading stdin raises); the
first exception or time-out ends the run. The values come back as tagged plain data and are judged here, in the
trusted process (:func:`judge`: EvalPlus's comparison and special oracles, the tolerance carried from one input to
the next as its loop carries it). The plus group runs only where the base group passed: an answer that fails its
base inputs fails the plus verdict whatever its plus inputs give (EvalPlus runs them anyway; no verdict differs).
EvalPlus's plus pass@1 counts an answer whose base
*and* plus statuses pass; so does the reward.

Where graft departs from EvalPlus 0.3.1, on purpose: HumanEval/32 (``find_zero``). There EvalPlus's loop
``continue`` skips its progress counter after the oracle's check, so every answer - its own canonical solution
included - ends with fewer recorded inputs than inputs and fails; graft passes an answer whose every root satisfies
the oracle (``|poly(xs, x)| <= atol``), so the reference scores 1. """

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import math
import os
import secrets

import numpy as np

from graft_cli.reward.convert import NotPlain, decode
from graft_cli.reward.harness import HARNESS
from graft_cli.reward.verdicts import result_message

DATASETS = ("humaneval", "mbpp")
MIN_TIME_LIMIT = 1.0  # evalplus/config.py DEFAULT_MIN_TIME_LIMIT (evaluate's --min-time-limit)
GT_TIME_LIMIT_FACTOR = 4.0  # evalplus/config.py DEFAULT_GT_TIME_LIMIT_FACTOR (--gt-time-limit-factor)
TIMEOUT_PER_TASK = 60.0  # untrusted_check's EVALPLUS_TIMEOUT_PER_TASK default
REFERENCE_TIMEOUT_S = 600.0  # the sandbox's wall clock for one group of a reference solution
REFERENCE_MEMORY_MB = 16384  # a reference's address space: EvalPlus computes expected outputs unlimited (Mbpp/255)
RESULT_BYTES = 512 << 20  # one run's result line: HumanEval/15's and /130's outputs pass 32 MiB
CACHE_ENV = "GRAFT_EVALPLUS_CACHE"
CACHE_FORMAT = 2

# evalplus/eval/_special_oracle.py
MBPP_OUTPUT_NOT_NONE_TASKS = ("check_str", "text_match_three", "text_starta_endb")
MBPP_OUTPUT_SET_EQ_TASKS = ("similar_elements", "find_char_long", "common_in_nested_lists", "extract_singly",
                            "larg_nnum", "intersection_array", "find_dissimilar", "Diff")


def _surface_Area(base_edge, height):  # noqa: N802 - the oracle of Mbpp/581, EvalPlus's name
    slant_height = math.sqrt((base_edge / 2) ** 2 + height**2)
    return round(base_edge**2 + 4 * (base_edge * slant_height) / 2)


def _digit_distance_nums(num1, num2):  # the oracle of Mbpp/558
    a, b = str(num1), str(num2)
    n = max(len(a), len(b))
    return sum(abs(int(x) - int(y)) for x, y in zip(a.zfill(n), b.zfill(n)))


def _poly(xs: list, x: float):  # the oracle of HumanEval/32
    return sum([coeff * math.pow(x, i) for i, coeff in enumerate(xs)])


def cache_dir() -> str:
    """Where expected outputs are kept: ``$GRAFT_EVALPLUS_CACHE``, else ``~/.cache/graft/evalplus``."""
    return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "graft", "evalplus")


def time_limits(ref_times, min_time_limit: float = MIN_TIME_LIMIT,
                factor: float = GT_TIME_LIMIT_FACTOR) -> list[float]:
    """Each input's time limit (EvalPlus's ``untrusted_check``)."""
    return [max(min_time_limit, factor * t) for t in ref_times]


def group_timeout(limits) -> float:
    """The wall clock of one group's process: ``min(60, sum of its limits) + 1`` and the second ``join`` waits
    (``untrusted_check`` with ``fast_check``, EvalPlus's default)."""
    return min(TIMEOUT_PER_TASK, sum(limits)) + 2.0


# ------------------------------------------------------------------------------------------------ judging
def is_floats(x) -> bool:
    """EvalPlus's ``is_floats``: a float, or a non-empty list/tuple of floats."""
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)) and x:
        return all(isinstance(i, float) for i in x)
    return False


def check_output(dataset: str, entry_point: str, inp, out, exp, atol) -> tuple[bool, float]:
    """Whether ``out`` passes against ``exp`` on input ``inp`` (the body of EvalPlus's ``unsafe_execute`` loop,
    special oracles included), and the tolerance the next inputs are judged with (set to 1e-6 once an expected
    value holds floats and none was given)."""
    try:
        exact_match = out == exp
        if dataset == "mbpp":
            if entry_point == "are_equivalent":  # Mbpp/164 (v0.1.0)
                exact_match = exact_match or True
            elif entry_point == "sum_div":  # Mbpp/295 (v0.1.0)
                exact_match = exact_match or out == 0
            elif entry_point == "surface_Area":  # Mbpp/581
                exact_match = exact_match or abs(out - _surface_Area(*inp)) <= atol
            elif entry_point == "digit_distance_nums":  # Mbpp/558
                exact_match = exact_match or out == _digit_distance_nums(*inp)
            elif entry_point in MBPP_OUTPUT_SET_EQ_TASKS:
                exact_match = set(out) == set(exp)
            elif entry_point in MBPP_OUTPUT_NOT_NONE_TASKS:  # ``out`` was reduced in the sandbox (a bool stays)
                exact_match = out == exp
        if dataset == "humaneval" and entry_point == "find_zero":
            return bool(abs(_poly(*inp, out)) <= atol), atol
        if atol == 0 and is_floats(exp):
            atol = 1e-6
        if not exact_match and atol != 0:
            if type(out) is not type(exp):
                return False, atol
            if isinstance(exp, (list, tuple)) and len(out) != len(exp):
                return False, atol
            return bool(np.allclose(out, exp, rtol=1e-07, atol=atol)), atol
        return bool(exact_match), atol
    except Exception:  # the comparison itself raised (EvalPlus: the input fails)
        return False, atol


def judge(dataset: str, entry_point: str, inputs: list, calls: list, expected: list, atol,
          tagged: list | None = None) -> tuple[bool, str]:
    """``(passed, detail)`` of one group: every input answered and passing, in order, the first failure ending it
    (``calls``: the harness's records, ``{"out": tagged}`` or ``{"error": name}``). ``tagged``: the expected
    values as tagged data, None where one holds a NaN; an output whose tagged form equals it is an exact match
    (the same types and values) and is not decoded."""
    plain = tagged is not None and not (dataset == "humaneval" and entry_point == "find_zero") \
        and not (dataset == "mbpp" and entry_point in MBPP_OUTPUT_SET_EQ_TASKS)  # set() of either may raise
    for i, exp in enumerate(expected):
        if i >= len(calls):
            return False, f"no result for input {i}"
        r = calls[i]
        if not isinstance(r, dict) or "out" not in r:
            err = str(r.get("error") if isinstance(r, dict) else "malformed")[:100]
            return False, f"{err} (input {i})"
        if plain and tagged[i] is not None and r["out"] == tagged[i]:  # exact: only the tolerance to carry on
            if atol == 0 and is_floats(exp):
                atol = 1e-6
            continue
        try:
            out = decode(r["out"])
        except NotPlain:
            return False, f"undecodable output (input {i})"
        ok, atol = check_output(dataset, entry_point, inputs[i], out, exp, atol)
        if not ok:
            return False, f"wrong output (input {i})"
    return True, "passed"


def _has_nan(x) -> bool:
    return x == {"f": "nan"} or (type(x) is list and any(map(_has_nan, x))) or \
        (type(x) is dict and any(_has_nan(v) for v in x.values()))


# --------------------------------------------------------------------------------------------- sandbox runs
def _payload(program: str, entry_point: str, inputs_json: str, nonce: str, out_cap: int, limits=None,
             reduce=None, times: bool = False, wall_s: float | None = None) -> bytes:
    """The harness's ``call``-kind input, the task's inputs already encoded (``inputs_json``: a JSON list of
    tagged argument lists); ``wall_s``: the run's wall clock, kept by the harness's timer."""
    head = {"kind": "call", "program": program, "nonce": nonce, "out_cap": out_cap, "fn_name": entry_point,
            "tagged": True, "quiet": True, "entry_only": True, "times": times}
    if limits is not None:
        head["limits"] = limits
    if wall_s is not None:
        head["wall_s"] = wall_s
    if reduce is not None:
        head["reduce"] = reduce
    text = json.dumps(head)
    return (text[:-1] + ', "inputs": ' + inputs_json + "}").encode()


def run_group(sandbox, program: str, entry_point: str, inputs_json: str, timeout_s: float, limits=None,
              reduce=None, times: bool = False, wall_s: float | None = None, memory_mb: int | None = None):
    """One sandboxed run of ``program``'s ``entry_point`` over one group of inputs (``wall_s``: the group's wall
    clock, kept by the harness's timer): ``(calls or None, status, detail)`` (``calls``: the harness's records;
    None: the run gave none - status ``code_timeout``, ``code_crash`` or ``code_error``)."""
    saved = sandbox.limits
    sandbox.limits = dataclasses.replace(saved, timeout_s=float(timeout_s), cpu_s=None,
                                         result_bytes=max(saved.result_bytes, RESULT_BYTES),
                                         memory_mb=memory_mb or saved.memory_mb)
    try:
        data = _payload(program, entry_point, inputs_json, secrets.token_hex(8), saved.output_bytes, limits,
                        reduce, times, wall_s)
        run = sandbox.run([sandbox.python, "-I", "-S", "-c", HARNESS, "{fd}"], data)
    finally:
        sandbox.limits = saved
    if run.timed_out:
        return None, "code_timeout", f"group over its {timeout_s:g} s"
    if run.output_capped:
        return None, "code_crash", "output over the cap"
    try:
        msg = result_message(run)
    except ValueError as e:
        return None, "code_error", f"malformed result ({e})"
    if msg is None:
        return None, "code_crash", f"exit {run.returncode} without a result"
    if msg.get("status") == "error":
        return None, "code_error", f"{str(msg.get('error'))[:100]} ({str(msg.get('phase'))[:20]})"
    calls = msg.get("calls")
    if not isinstance(calls, list) or len(msg) != 1:
        return None, "code_error", "malformed result"
    return calls, "ok", ""


# ------------------------------------------------------------------------------------------- expected outputs
def reference_program(row: dict) -> str:
    """What EvalPlus runs for a task's expected outputs: ``prompt + canonical_solution``."""
    return row["prompt"] + row["canonical_solution"]


def reference_outputs(sandbox, dataset: str, row: dict) -> dict:
    """One task's expected outputs and reference times, per group (``{"base": {"expected": [...], "time":
    [...]}, "plus": ...}``, values tagged; ``"plus": {"error": why}`` where the reference did not answer every plus
    input: the base verdicts stand, no answer passes plus), or ``{"error": why}`` where it did not answer every base
    input; ``row``'s ``base_input`` and ``plus_input`` are lists of tagged argument lists."""
    entry = row["entry_point"]
    out = {}
    for group in ("base", "plus"):
        inputs = row[f"{group}_input"]
        reduce = [2] * len(inputs) if dataset == "mbpp" and entry in MBPP_OUTPUT_NOT_NONE_TASKS else None
        calls, status, detail = run_group(sandbox, reference_program(row), entry,
                                          json.dumps(inputs), REFERENCE_TIMEOUT_S,
                                          reduce=reduce, times=True, memory_mb=REFERENCE_MEMORY_MB)
        if calls is None or len(calls) != len(inputs) or any("out" not in c for c in calls):
            bad = next((c for c in calls or () if "out" not in c), None)
            why = f"{group}: {detail or (bad or {}).get('error') or 'results missing'}"
            if group == "base":
                return {"error": why}
            out[group] = {"error": why}  # Mbpp/255: EvalPlus fails its own reference on plus too (memory)
            break
        out[group] = {"expected": [c["out"] for c in calls], "time": [float(c["t"]) for c in calls]}
    return out


def load_cache(sha256: str, where: str | None = None) -> dict:
    """The cached expected outputs of the release file with this sha256 (:func:`write_cache`'s layout), read once
    per process and path; raises FileNotFoundError."""
    return _read_cache(cache_path(sha256, where), sha256)


@functools.lru_cache(maxsize=8)
def _read_cache(path: str, sha256: str) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    if data.get("format") != CACHE_FORMAT or data.get("sha256") != sha256:
        raise FileNotFoundError(f"{path}: another cache format or file")
    return data


def cache_path(sha256: str, where: str | None = None) -> str:
    return os.path.join(where or cache_dir(), f"{sha256}.json.gz")


def write_cache(sha256: str, dataset: str, tasks: dict, where: str | None = None) -> str:
    """Write ``tasks`` (task id -> entry point, atol, tagged inputs and :func:`reference_outputs` per group)
    atomically under the file's sha256; returns the path."""
    path = cache_path(sha256, where)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=3) as f:
        json.dump({"format": CACHE_FORMAT, "sha256": sha256, "dataset": dataset, "tasks": tasks}, f)
    os.replace(tmp, path)
    _read_cache.cache_clear()
    return path


@functools.lru_cache(maxsize=1024)
def task_data(sha256: str, task_id: str) -> dict:
    """One task as its answers are graded: entry point, atol, per group the inputs (decoded, and as the JSON
    text the harness reads), the expected outputs (decoded) and the time limits."""
    t = load_cache(sha256)["tasks"][task_id]
    if "error" in t:
        return {"error": t["error"]}
    out = {"entry_point": t["entry_point"], "atol": t["atol"], "dataset": load_cache(sha256)["dataset"]}
    for group in ("base", "plus"):
        g = t[group]
        if "error" in g:
            out[group] = {"error": g["error"]}
            continue
        lim = time_limits(g["time"])
        out[group] = {"inputs": [decode(a) for a in g["inputs"]], "inputs_json": json.dumps(g["inputs"]),
                      "expected": [decode(v) for v in g["expected"]], "limits": lim, "timeout": group_timeout(lim),
                      "tagged": [None if _has_nan(v) else v for v in g["expected"]]}
    return out


# ------------------------------------------------------------------------------------------------- grading
def grade_evalplus(program: str, spec: dict, sandbox) -> tuple[float, str, str, bool]:
    """``(reward, status, detail, base_passed)`` of one program on one task (module docstring); the reward is
    the plus verdict (base and plus inputs all pass). The base group runs first, in a sandboxed process of its own;
    the plus group then runs in another, where the base group passed."""
    try:
        t = task_data(spec["sha256"], spec["task_id"])
    except (FileNotFoundError, KeyError) as e:
        return 0.0, "code_bad_gold", f"no expected outputs ({type(e).__name__}: {e})", False
    if "error" in t:
        return 0.0, "code_bad_gold", f"the reference failed: {t['error']}", False
    entry, dataset = t["entry_point"], t["dataset"]
    reduce = dataset == "mbpp" and entry in MBPP_OUTPUT_NOT_NONE_TASKS
    for group in ("base", "plus"):
        g = t[group]
        if "error" in g:
            return 0.0, "code_bad_gold", f"{group}: the reference failed: {g['error']}", group == "plus"
        calls, status, detail = run_group(sandbox, program, entry, g["inputs_json"], g["timeout"], g["limits"],
                                          [1] * len(g["inputs"]) if reduce else None, wall_s=g["timeout"])
        if calls is None:
            return 0.0, status, f"{group}: {detail}", group == "plus"
        ok, why = judge(dataset, entry, g["inputs"], calls, g["expected"], t["atol"], g["tagged"])
        if not ok:
            st = "code_timeout" if why.startswith("TimeoutException") else \
                "ok" if why.startswith(("wrong output", "no result")) else "code_error"
            return 0.0, st, f"{group}: {why}", group == "plus"
    return 1.0, "ok", "passed", True


def evalplus_budget_s(gold: str) -> float:
    """The longest one item of an EvalPlus gold may take in a grading worker: an answer's two groups, or a
    reference's (0 for any other gold)."""
    if '"evalplus_reference"' in gold[:40]:
        return 2 * REFERENCE_TIMEOUT_S
    return 2 * (TIMEOUT_PER_TASK + 2.0)
