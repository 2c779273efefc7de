"""The verdict of one sandboxed run of a code answer (:func:`verdict`): the harness's one result
line, read and compared with the test spec here, in the trusted process.

How outputs are compared, per kind (docs/evaluation.md, "How outputs are compared", names each
reference and each leniency kept or refused):

* ``io`` (:func:`same_output`): LiveCodeBench's stdio rule (``lcb_runner/evaluation/testing_util.py``
  ``grade_stdio``): the outputs stripped and split into lines, each line stripped; as many lines on
  both sides; each pair of lines equal as text, else equal as lists of whitespace-separated exact
  decimals (``decimal.Decimal``: ``5.0`` equals ``5``, ``10**18 + 1`` does not equal ``10**18``).
  graft is stricter than LiveCodeBench in one place: a decimal token is ASCII digits only (no
  fullwidth or other Unicode digits, no ``_`` separators, no ``NaN``/``Infinity`` spellings), which
  ``Decimal`` would accept. A tolerance applies only where the problem declares one (``"tolerance":
  t`` in its gold): numeric tokens then match within ``t`` absolute, or relative to the expected
  value when that is larger than 1.
* ``call`` with JSON outputs (:func:`same_value`): the judge the gold names. ``livecodebench``
  (LiveCodeBench's functional problems, ``grade_call_based``): a returned tuple is read as a list,
  then Python's ``==``. ``apps`` (the default: APPS-style training data such as Eurus-2-RL-Code,
  judged by APPS's ``eval/testing_util.py`` as verl's ``prime_code`` copies it): the same, or the
  expected value's only element (APPS stores a call's output wrapped in a one-element list; APPS
  takes the first element of any expected list, graft only of a one-element one), or a list of
  tuples read as a list of lists; an expected dict whose keys are all integers written as strings
  is compared with integer keys. The returned value crosses as exact built-ins
  (:mod:`graft_cli.reward.convert`), so a set never equals a list and an int key never equals a
  str key.
* converted ``call`` (rules): the tests' own comparison on the values rebuilt with their types
  (an ``OrderedDict`` keeps its order, a ``Counter`` its type).

Statuses (``Grades.status``; counted in metrics as ``reward/code_*``): ``ok`` (ran: passed, or a
test failed), ``code_error`` (a Python exception: syntax error, runtime error, memory error; a
malformed result or reply), ``code_timeout`` (wall clock or CPU limit), ``code_crash`` (ended
without a verdict: killed by a signal or limit, exited before its tests, output over the cap; the
answer's process of the assert kind lost), ``code_no_program``. The per-answer wall time is in
``Grades.seconds`` (metrics ``reward/code_time_mean_s`` / ``_max_s``). """

from __future__ import annotations

import json
import re
from decimal import Decimal

from graft_cli.reward.convert import decode, passes

_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def _lines(text: str) -> list[str]:
    """LiveCodeBench's ``get_stripped_lines``: the text stripped, split at newlines, each line
    stripped."""
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(line: str) -> list[Decimal] | None:
    """The line's whitespace-separated tokens as exact decimals; None when one is not an ASCII
    decimal number."""
    toks = line.split()
    if not all(_DECIMAL.fullmatch(t) for t in toks):
        return None
    return [Decimal(t) for t in toks]


def same_output(got: str, want: str, tolerance: float | None = None) -> bool:
    """stdin/stdout tests (module docstring): LiveCodeBench's line rule, exact decimals; numbers
    within ``tolerance`` only when the problem declares one."""
    a, b = _lines(got), _lines(want)
    if len(a) != len(b):
        return False
    tol = None if tolerance is None else Decimal(repr(float(tolerance)))
    for x, y in zip(a, b):
        if x == y:
            continue
        dx, dy = _decimals(x), _decimals(y)
        if dx is None or dy is None or len(dx) != len(dy):
            return False
        if tol is None:
            if dx != dy:
                return False
        elif not all(abs(p - q) <= tol * max(Decimal(1), abs(q)) for p, q in zip(dx, dy)):
            return False
    return True


def _apps_expected(want):
    """APPS's reading of a JSON output whose dict keys are integers written as strings (``{"1": 2}``
    -> ``[{1: 2}]``, wrapped as APPS wraps it); another value as it is. A list of several dicts is
    left alone (APPS would keep only its first: graft is stricter)."""
    inner = want if type(want) is dict else want[0] if type(want) is list and len(want) == 1 else None
    if type(inner) is not dict:
        return want
    try:
        return [{int(k): v for k, v in inner.items()}]
    except (TypeError, ValueError):
        return want


def same_value(got, want, judge: str = "apps") -> bool:
    """Call tests with JSON outputs: ``got`` (the decoded return value, exact built-ins) against
    ``want`` (the JSON value) under ``judge`` (module docstring)."""
    if type(got) is tuple:  # both judges: "ground truth sequences are not tuples"
        got = list(got)
    if judge == "livecodebench":
        return bool(got == want)
    want = _apps_expected(want)
    if got == want:
        return True
    if type(want) is list and len(want) == 1:  # APPS takes want[0] of any list: graft only of a wrapped one
        if got == want[0]:
            return True
        try:  # "ground truth sequences are not tuples": a list of tuples read as a list of lists
            return type(got[0]) is tuple and [list(x) for x in got] == want[0]
        except (TypeError, KeyError, IndexError):
            return False
    return False


def result_message(run) -> dict | None:
    """The harness's one result line (None: it wrote none); raises ValueError on anything else:
    several lines, not JSON (nested too deep included), not an object."""
    lines = [x for x in run.result.split(b"\n") if x.strip()]
    if not lines:
        return None
    if len(lines) > 1:
        raise ValueError(f"{len(lines)} result lines")
    try:
        msg = json.loads(lines[0])
    except RecursionError:
        raise ValueError("result nested too deep") from None
    if not isinstance(msg, dict):
        raise ValueError("result is not an object")
    return msg


def verdict(spec: dict, run, nonce: str) -> tuple[float, str, str]:
    """``(reward, status, detail)`` of one sandbox run (module docstring: statuses). Anything the
    run wrote that is not one well-formed result line is ``code_error``; this never raises."""
    if run.timed_out:
        return 0.0, "code_timeout", "wall-clock timeout"
    if run.output_capped:
        return 0.0, "code_crash", "output over the cap"
    try:
        msg = result_message(run)
        if msg is None:
            return 0.0, "code_crash", _why(run)
        return _judge(spec, msg, nonce, run)
    except Exception as e:  # a malformed result: wrong shapes, undecodable values, recursion
        return 0.0, "code_error", f"malformed result ({type(e).__name__})"


def _judge(spec: dict, msg: dict, nonce: str, run) -> tuple[float, str, str]:
    status = msg.get("status")
    if status == "error":  # AnswerLost: the answer's process of the assert kind ended before it answered
        return 0.0, "code_crash" if msg.get("error") == "AnswerLost" else "code_error", \
            f"{str(msg.get('error'))[:100]} ({str(msg.get('phase'))[:20]})"
    if spec["kind"] == "assert":
        if status == "pass" and msg.get("nonce") == nonce and run.returncode == 0 and len(msg) == 2:
            return 1.0, "ok", "passed"
        if status == "fail" and len(msg) == 1:
            return 0.0, "ok", "a test failed"
        if status == "pass" and msg.get("nonce") == nonce:
            return 0.0, "code_crash", _why(run)
        return 0.0, "code_error", "malformed result"
    got = msg.get("io") if spec["kind"] == "io" else msg.get("calls")
    if not isinstance(got, list) or len(msg) != 1 or len(got) > len(spec["inputs"]):
        return 0.0, "code_error", "malformed result"
    wants = spec.get("rules") or spec["outputs"]
    for i, want in enumerate(wants):
        if i >= len(got):
            return 0.0, "code_error", "malformed result (results missing)"
        r = got[i]
        if r.get("error") is not None:
            return 0.0, "code_error", f"{str(r['error'])[:100]} (test {i})"
        if spec["kind"] == "io":
            ok = isinstance(r["out"], str) and same_output(r["out"], want, spec.get("tolerance")) \
                and r.get("over") is False
        elif "rules" in spec:
            rule = dict(want)
            for k in ("want", "tol"):
                if k in rule:
                    rule[k] = decode(rule[k])
            ok = passes(rule, decode(r["out"]))
        else:
            ok = same_value(decode(r["out"]), want, spec.get("judge", "apps"))
        if not ok:
            return 0.0, "ok", f"wrong output (test {i})"
    return 1.0, "ok", "passed"


def _why(run) -> str:
    if run.returncode is not None and run.returncode < 0:
        return f"killed by signal {-run.returncode}"
    tail = run.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
    return f"exit {run.returncode} without a verdict {tail[0][:200]}".strip()
