"""The verdict of one sandboxed run of a code answer (:func:`verdict`): the harness's one result
line, read and compared with the test spec here, in the trusted process.

Statuses (``Grades.status``; counted in metrics as ``reward/code_*``): ``ok`` (ran: passed, or a
test failed), ``code_error`` (a Python exception: syntax error, runtime error, memory error; a
malformed result or reply), ``code_timeout`` (wall clock or CPU limit), ``code_crash`` (ended
without a verdict: killed by a signal or limit, exited before its tests, output over the cap; the
answer's process of the assert kind lost), ``code_no_program``. The per-answer wall time is in
``Grades.seconds`` (metrics ``reward/code_time_mean_s`` / ``_max_s``). """

from __future__ import annotations

import json
import math

from graft_cli.reward.convert import decode, json_form, passes


def _num(tok: str):
    try:
        v = float(tok)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def same_output(got: str, want: str, tol: float = 1e-6) -> bool:
    """stdin/stdout tests: equal whitespace-separated tokens; numeric tokens equal within ``tol``
    (absolute, or relative to the expected value when it is larger than 1)."""
    a, b = got.split(), want.split()
    if a == b:
        return True
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        vx, vy = _num(x), _num(y)
        if vx is None or vy is None or abs(vx - vy) > tol * max(1.0, abs(vy)):
            return False
    return True


def same_value(got, want) -> bool:
    """Call tests: the JSON-decoded return value equals the expected one (or its only element:
    APPS's rule)."""
    if got == want:
        return True
    return isinstance(want, list) and len(want) == 1 and got == want[0]


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
            ok = isinstance(r["out"], str) and same_output(r["out"], want) and r.get("over") is False
        elif "rules" in spec:
            rule = dict(want)
            for k in ("want", "tol"):
                if k in rule:
                    rule[k] = decode(rule[k])
            ok = passes(rule, decode(r["out"]))
        else:
            ok = same_value(json_form(decode(r["out"])), want)
        if not ok:
            return 0.0, "ok", f"wrong output (test {i})"
    return 1.0, "ok", "passed"


def _why(run) -> str:
    if run.returncode is not None and run.returncode < 0:
        return f"killed by signal {-run.returncode}"
    tail = run.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
    return f"exit {run.returncode} without a verdict {tail[0][:200]}".strip()
