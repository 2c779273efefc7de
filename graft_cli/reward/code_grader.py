"""Binary test-execution reward for code (``reward.name=code``, registry ``REWARDS``).

A response scores 1.0 only when the program extracted from it passes **every** test of its problem,
run in a separate supervised process per answer (:mod:`graft_cli.reward.sandbox`: fresh working
directory, scrubbed environment, resource limits, process-group timeout, capped output, namespaces /
Landlock / cgroup where the OS allows); else 0.0. The seed's code reward is the same rule (verl
``prime_code`` with ``continuous=False``: 1 when all tests pass, else 0; opd_saf.md §4). The program
of a response and the test spec of a gold: :mod:`graft_cli.reward.programs`; what runs them in the
sandbox: :mod:`graft_cli.reward.harness`; a run's verdict and its statuses:
:mod:`graft_cli.reward.verdicts`.

``assert`` golds that carry a ``reference`` solution are **converted** to the call kind before
grading (:meth:`CodeGrader.convert_golds`, graft_cli/reward/convert.py): the tests' calls of the
entry point and the values each is compared with are recorded while the reference runs them, and
each call gets the tests' own comparison rule (``==``, ``!=``, ``is``, ``in``, ``abs(a - b) < tol``,
truthiness, EvalPlus's ``assertion``). The others (no reference, or tests that use the result
otherwise, e.g. HumanEval/32's ``poly(xs, candidate(xs))``; counted per gold in
:attr:`CodeGrader.test_kinds` as ``assert_fallback``) run their tests **beside** the answer
(:meth:`graft_cli.reward.sandbox.Sandbox.run_pair`): the answer's process only loads the program and
serves calls (the arguments in, each return value out as tagged plain data, an exception as its
class name); the tests run in a second sandboxed process of their own (trusted view: numpy for
EvalPlus's tests), with the prompt's helpers and the entry point bound to a stub that sends each
call over and rebuilds the value it gets back as exact built-ins (a lying ``__eq__`` does not cross;
a malformed reply or a lost answer fails the tests). Only the tests' process writes to the grader -
a pass is its line with a random nonce its stdin alone carried, after the tests returned - and it is
not dumpable, so the answer's process (same uid, where no namespace or Landlock domain separates
them) cannot open its ``/proc`` files. A call's argument mutated by the answer is not seen by the
tests (the converted kind does not see it either). """

from __future__ import annotations

import ast
import functools
import json
import os
import resource
import secrets
import sys
import time
import warnings

from graft_cli.errors import GraftError
from graft_cli.reward import REWARDS
from graft_cli.reward.confine import Cgroup, io_priority
from graft_cli.reward.convert import NotConvertible, NotPlain, calls_from_records, decode, rewrite_tests
from graft_cli.reward.evalplus import CACHE_ENV as EVALPLUS_CACHE_ENV
from graft_cli.reward.evalplus import cache_dir as evalplus_cache_dir
from graft_cli.reward.evalplus import evalplus_budget_s, grade_evalplus, reference_outputs
from graft_cli.reward.harness import HARNESS, payload
from graft_cli.reward.pool import Grades, MathVerifyGrader, serve
from graft_cli.reward.programs import extract_program, parse_spec
from graft_cli.reward.sandbox import ALL_FEATURES, Limits, Sandbox
from graft_cli.reward.verdicts import result_message, verdict


@functools.lru_cache(maxsize=256)
def stdlib_only(tests: str) -> bool:
    """Whether ``tests`` import nothing but the standard library (their process then starts without
    site-packages, as an answer's does: faster)."""
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
    """One sandboxed run: an answer of the io / call kinds alone under the answer interpreter (``-I
    -S``: the standard library only); an assert-kind answer as the server of the tests, which run
    beside it in a process of their own (:meth:`Sandbox.run_pair`); a reference solution's record
    run in the trusted view."""
    data = payload(spec, program, nonce, sandbox.limits.output_bytes, record)
    answer = [sandbox.python, "-I", "-S", "-c", HARNESS, "{fd}"]
    trusted = [sys.executable, "-I", "-c", HARNESS, "{fd}"]
    if record is not None:
        return sandbox.run(trusted, data, view="trusted")
    if spec["kind"] == "assert":
        tests = answer[:-1] if stdlib_only(spec["tests"]) else trusted[:-1]
        return sandbox.run_pair(answer + ["serve"], tests + ["{fd}", "{req}", "{rep}"], data)
    return sandbox.run(answer, data)


def grade_code(response: str, gold, sandbox: Sandbox) -> tuple[float, str | None, str, float, str]:
    """``(reward, program, status, seconds, detail)`` of one response against a code gold, run in
    ``sandbox``. Never raises for what the response does (a malformed gold raises ValueError)."""
    spec = parse_spec(gold)
    program = extract_program(response, spec.get("prompt"))
    if program is None:
        return 0.0, None, "code_no_program", 0.0, "no fenced python block"
    if spec["kind"] == "evalplus":
        t0 = time.monotonic()
        reward, status, detail, base = grade_evalplus(program, spec, sandbox)
        return reward, program, status, time.monotonic() - t0, f"{detail}; base {'passed' if base else 'failed'}"
    nonce = secrets.token_hex(16)
    run = _run(sandbox, spec, program, nonce)
    reward, status, detail = verdict(spec, run, nonce)
    return reward, program, status, run.seconds, detail


def convert_spec(spec: dict, sandbox: Sandbox) -> tuple[dict | None, str]:
    """An assert-kind spec as a call-kind one (graft_cli/reward/convert.py: its calls and expected
    values recorded while its reference solution runs the rewritten tests in ``sandbox``), or
    ``(None, why not)``."""
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
        _SANDBOX.append(Sandbox(int(options.get("slot", 0)), lim, options.get("features", ALL_FEATURES)))
    return _SANDBOX[0]


def grade_item(response, gold, sb: Sandbox) -> tuple[float, str | None, str, float, float]:
    """One pool item: ``(reward, program, status, seconds, base)``, ``base`` the base tests' verdict of
    an EvalPlus gold (NaN for the others). ``response`` None asks for the conversion of ``gold``
    (:func:`convert_spec`; its result, the converted gold as JSON or why not, in the program field,
    status ``code_converted`` / ``code_assert``), or for an EvalPlus task's expected outputs
    (:func:`graft_cli.reward.evalplus.reference_outputs`, status ``code_reference``). Never raises."""
    t0 = time.monotonic()
    base = float("nan")
    try:
        if response is None and parse_spec(gold)["kind"] == "evalplus_reference":
            spec = parse_spec(gold)
            return 0.0, json.dumps(reference_outputs(sb, spec["dataset"], spec["row"])), "code_reference", \
                time.monotonic() - t0, base
        if response is None:
            conv, why = convert_spec(parse_spec(gold), sb)
            return 0.0, json.dumps(conv) if conv else why, "code_converted" if conv else "code_assert", \
                time.monotonic() - t0, base
        reward, program, status, _, detail = grade_code(response, gold, sb)
        if detail.endswith(("; base passed", "; base failed")):
            base = float(detail.endswith("; base passed"))
        elif program is None and parse_spec(gold)["kind"] == "evalplus":
            base = 0.0
    except (ValueError, TypeError):
        reward, program, status = 0.0, None, "code_bad_gold"
    except Exception as e:  # the grader's own failure must not end the pool: this answer scores 0
        reward, program, status = 0.0, f"grader error {type(e).__name__}", "code_error"
    return reward, program, status, time.monotonic() - t0, base


def _own_state() -> tuple:
    """What a sandboxed program could change about its supervisor from outside (prlimit, renice,
    scheduling policy and priority, I/O priority, affinity)."""
    lims = tuple(resource.getrlimit(getattr(resource, n)) for n in dir(resource) if n.startswith("RLIMIT_"))
    try:
        aff = tuple(sorted(os.sched_getaffinity(0)))
    except OSError:
        aff = ()
    return lims, os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0), os.sched_getparam(0).sched_priority, \
        io_priority(), aff


def code_worker_main(conn, options: dict | None = None) -> None:
    """A code-grading worker (the math grader's protocol,
    :func:`graft_cli.reward.pool._worker_main`): ``("grade", [(idx, response, gold), ...])`` ->
    ``("r", idx, reward, program, status, seconds)`` per item. A worker whose own limits, priority
    or CPU affinity changed while it graded stops after that item (the pool replaces it)."""
    options = dict(options or {})
    if options.get("evalplus_cache"):  # the caller's, read when the grader was made: a forkserver's children
        os.environ[EVALPLUS_CACHE_ENV] = options["evalplus_cache"]  # inherit the server's environment
    sb = _sandbox_for(options)
    state = _own_state()
    conn.send(("ready", os.getpid(), sb.features(), sb.root))

    def answer(idx, response, gold):
        reward, program, status, sec, base = grade_item(response, gold, sb)
        return ("r", idx, reward, program, status, sec, base), _own_state() != state

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
    """Grades code responses (:func:`grade_code`) in worker processes, each with its own sandbox
    slot; the pool, its ordering and its crash/stuck-worker handling are the math grader's.
    ``timeout_s`` is each answer's wall-clock budget inside the sandbox (the whole test suite); the
    pool kills a worker only when it has not answered ``timeout_s + 10`` s after taking an item (the
    sandbox's own kill and sweep failed). ``num_workers=0`` grades in the calling process
    (debugging; its sandbox is set up with ``preexec_fn``, unsafe with threads)."""

    worker_target = staticmethod(code_worker_main)
    preload = ("graft_cli.reward.code_grader",)
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
                        "features": tuple(features), "evalplus_cache": evalplus_cache_dir()}
        self.sandbox_features: dict | None = None  # what the workers' sandboxes got on this machine (first report)
        self.convert = bool(convert)
        self.allow_root = bool(allow_root)
        self.test_kinds: dict = {}  # gold -> (kind, why): io, call, assert_converted, assert_fallback (test_kind)
        self._converted: dict = {}  # assert-kind gold -> the call-kind gold its answers are graded against

    def on_ready(self, msg: tuple) -> None:
        """Keep the first worker's sandbox report; warn once about the protections asked for but
        refused here."""
        if self.sandbox_features is not None or len(msg) < 3:
            return
        self.sandbox_features = dict(msg[2])
        root = len(msg) > 3 and bool(msg[3])
        if root and "uid" in self.options["features"] and not self.sandbox_features.get("uid") \
                and not self.allow_root:
            raise GraftError("code reward: the sandbox could not run answers under a uid of their own (running as "
                             "root here); set reward.code.allow_root=true to run them as root without capabilities")
        wanted = set(self.options["features"]) - {"nproc", "nocaps"} - ({"userns"} if root else {"uid"}) \
            - ({"cpu_pin"} if self.sandbox_features.get("cgroup_cpu") else set())  # a cpu cgroup holds the runs
        off = sorted(k for k in wanted if not self.sandbox_features.get(k))
        if off:
            warnings.warn(f"code reward sandbox: {', '.join(off)} refused on this machine (graft_cli/reward/sandbox.py "
                          "says what each one protects)", stacklevel=2)

    @staticmethod
    def extract(response: str, gold) -> str | None:
        return _extract_for(response, gold)

    def convert_golds(self, golds: list) -> list:
        """``golds`` with each assert-kind gold that has a reference solution and tests the call
        kind can express replaced by its call-kind conversion (:func:`convert_spec`, run once per
        distinct gold in the workers and kept for the grader's lifetime); :attr:`test_kinds` records
        each gold's kind and why."""
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
        """How many distinct golds of ``golds`` are of each test kind (:meth:`convert_golds`
        first)."""
        self.convert_golds(golds)
        out = {"io": 0, "call": 0, "assert_converted": 0, "assert_fallback": 0}
        for g in dict.fromkeys(g for g in golds if isinstance(g, str)):
            if g in self.test_kinds:
                out[self.test_kinds[g][0]] += 1
        return out

    def grade(self, responses: list[str], golds: list[str]) -> Grades:
        """Grade a batch (assert-kind golds converted first where they can be:
        :meth:`convert_golds`); with ``dedupe`` (the default) each distinct (extracted program,
        gold) pair runs once and its verdict, status and time are copied to the responses that carry
        the same program for the same problem (a group of 8 samples from a small policy repeats its
        program often; a sandboxed run costs ~0.1 s). A response whose program cannot be extracted
        is its own item, as without ``dedupe``."""
        if len(responses) != len(golds):
            return super().grade(responses, golds)
        need = max((evalplus_budget_s(g) for g in golds if isinstance(g, str) and '"evalplus' in g[:40]),
                   default=0.0)
        if need > self.timeout_s - self.slack_s:  # an EvalPlus task's own limits (graft_cli/reward/evalplus.py)
            saved = self.timeout_s
            self.timeout_s = need + self.slack_s
            try:
                return self.grade(responses, golds)
            finally:
                self.timeout_s = saved
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
                      [g.status[k] for k in which], None if g.seconds is None else g.seconds[which],
                      None if g.base is None else g.base[which])

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
    """Binary test-execution reward for code (:class:`CodeGrader`): each answer runs sandboxed with
    ``timeout_s`` of wall clock and ``memory_mb`` MiB of address space (0: 4096).
    ``code.allow_root`` (``reward.code``): as root, grade even where answers cannot get a uid of
    their own (else the first grading stops in one line)."""
    allow = bool(code.get("allow_root", False) if isinstance(code, dict) else getattr(code, "allow_root", False))
    return CodeGrader(num_workers=num_workers, timeout_s=timeout_s, chunk_size=min(int(chunk_size), 4),
                      memory_mb=memory_mb or 4096, allow_root=allow)
