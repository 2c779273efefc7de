"""Grading in worker processes with a hard timeout per answer: the math-verify grader
(:class:`MathVerifyGrader`, the reward ``math_verify`` of :data:`graft_cli.reward.REWARDS`), its
pool (which the code grader reuses) and the :class:`Grades` every grader returns.

The rule and its math-verify usage are :mod:`graft_cli.reward.answers`
(:func:`~graft_cli.reward.answers.grade_status`); this module runs it where a stuck answer cannot
stop training.

Hard timeout: some answers never finish. ``\\boxed{10^{10^{10^{10}}}}`` makes sympy's ``doit``
inside ``verify`` evaluate ``10**(10**10)`` in C, where not even math-verify's ``signal.alarm``
could interrupt it. :class:`MathVerifyGrader` therefore grades in worker processes (``forkserver``:
forked from a clean server that preloaded math-verify, so a killed worker is replaced in ~0.2 s;
never plain ``fork``, since the trainer holds torch threads) and kills a worker that overruns
``timeout_s`` on an item. """

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait as mp_wait

import numpy as np

from graft_cli.reward.answers import OPTIONS, _ensure_math_verify, grade_one, grade_status, last_boxed

# ----------------------------------------------------------------------------------------------------
# Worker processes with a hard wall-clock timeout


def _cap_memory(memory_mb: int) -> None:
    """An address-space limit for this worker (``RLIMIT_AS``): an answer that needs more raises
    MemoryError inside sympy and scores 0 (status ``memory``) instead of taking the machine's
    memory."""
    if memory_mb and memory_mb > 0:
        cap = int(memory_mb) * 2**20
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))


def _vm_peak() -> int:
    """This process's peak virtual memory in bytes (``VmPeak``; 0 where /proc is not there)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmPeak:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _worker_main(conn, options: dict | None = None) -> None:
    """Worker loop: ``("grade", [(idx, response, gold), ...])`` -> one ``("r", idx, reward,
    extracted, status)`` message per item, sent as soon as the item is done (the parent times each
    item from the previous answer). ``("stop",)`` or a closed pipe ends the loop. ``options``:
    ``sci_notation``, ``memory_mb``."""
    options = dict(options or {})
    OPTIONS["sci_notation"] = bool(options.get("sci_notation", True))
    _ensure_math_verify()
    grade_one("\\boxed{\\frac{1}{2}}", "0.5")  # warm regex/parser caches before the clock starts
    cap = int(options.get("memory_mb", 0)) * 2**20
    _cap_memory(int(options.get("memory_mb", 0)))
    conn.send(("ready", os.getpid()))

    def answer(idx, response, gold):
        reward, extracted, status = grade_status(response, gold)
        near_cap = cap > 0 and _vm_peak() >= 0.9 * cap
        # math-verify swallows the MemoryError: the peak tells; a fresh worker takes over (stop
        # after this item)
        return ("r", idx, 0.0 if near_cap else reward, extracted, "memory" if near_cap else status), near_cap

    serve(conn, answer)


def serve(conn, answer) -> None:
    """A grading worker's loop: each ``("grade", [(idx, response, gold), ...])`` message -> one
    message per item, ``answer(idx, response, gold)`` giving it and whether the worker stops after
    it; ``("stop",)`` or a closed pipe ends the loop."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] != "grade":
            return
        for idx, response, gold in msg[1]:
            out, stop = answer(idx, response, gold)
            conn.send(out)
            if stop:
                return


def _mp_context(preload=("graft_cli.reward.pool", "graft_cli.reward.answers", "math_verify",
                         "latex2sympy2_extended")):
    """forkserver where available (module docstring), else spawn."""
    try:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(list(preload))
        return ctx
    except ValueError:
        return mp.get_context("spawn")


# code_* : the code reward's (graft_cli/reward/code_grader.py)
STATUSES = ("ok", "timeout", "crash", "memory", "rejected", "error", "code_error", "code_timeout", "code_crash",
            "code_no_program", "code_bad_gold")
STATUS_METRICS = {"timeout": "reward/timeouts", "crash": "reward/worker_crashes", "memory": "reward/memory_capped",
                  "rejected": "reward/rejected", "error": "reward/errors"}
CODE_STATUS_METRICS = {"code_timeout": "reward/code_timeouts", "code_crash": "reward/code_crashes",
                       "code_error": "reward/code_errors", "code_no_program": "reward/code_no_program",
                       "code_bad_gold": "reward/code_bad_golds"}


@dataclass
class Grades:
    rewards: np.ndarray  # (N,) float32, 1.0 / 0.0
    timed_out: np.ndarray  # (N,) bool: the item hit the hard timeout (its reward is 0.0)
    extracted: list[str | None] = field(default_factory=list)  # last boxed content per response
    status: list[str] = field(default_factory=list)  # per response, one of STATUSES (non-"ok" scores 0)
    seconds: np.ndarray | None = None  # (N,) wall time per answer where the grader measures it (code), NaN unknown
    base: np.ndarray | None = None  # (N,) the base tests' verdict where a gold has them (EvalPlus), NaN elsewhere

    def __len__(self) -> int:
        return len(self.rewards)

    def counts(self) -> dict:
        """``reward/<status>`` counts of the responses that did not grade normally (metrics rows); a
        grader that times its answers (code) adds its ``reward/code_*`` counts and the mean / max
        seconds per answer."""
        st = self.status or ["timeout" if t else "ok" for t in self.timed_out]
        out = {v: sum(1 for x in st if x == k) for k, v in STATUS_METRICS.items()}
        if self.seconds is not None:
            out.update({v: sum(1 for x in st if x == k) for k, v in CODE_STATUS_METRICS.items()})
            sec = self.seconds[np.isfinite(self.seconds)] if len(self.seconds) else self.seconds
            out["reward/code_time_mean_s"] = float(sec.mean()) if len(sec) else 0.0
            out["reward/code_time_max_s"] = float(sec.max()) if len(sec) else 0.0
        return out

    @classmethod
    def concat(cls, parts: list) -> Grades:
        """The grades of several batches, in order."""
        secs, base = [g.seconds for g in parts], [g.base for g in parts]
        return cls(np.concatenate([g.rewards for g in parts]), np.concatenate([g.timed_out for g in parts]),
                   [x for g in parts for x in g.extracted], [x for g in parts for x in g.status],
                   None if any(s is None for s in secs) else np.concatenate(secs),
                   None if any(b is None for b in base) else np.concatenate(base))


class _Worker:
    def __init__(self, ctx, options: dict | None = None, target=None):
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=target or _worker_main, args=(child, options), daemon=True,
                                name="graft-reward")
        self.proc.start()
        child.close()
        self.started = time.monotonic()
        self.ready = False
        self.current: deque[int] = deque()  # indices sent and not yet answered, in order
        self.last = 0.0  # when the item at current[0] started (dispatch or previous answer)

    def kill(self) -> None:
        try:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(timeout=5)
        except Exception:
            pass
        try:
            self.conn.close()
        except Exception:
            pass


class MathVerifyGrader:
    """Grades responses against gold answers with :func:`grade_one` in worker processes.

    Each response gets a hard wall-clock budget of ``timeout_s`` seconds: a worker that has not
    answered its current item in time is killed and replaced, that item scores 0.0 with
    ``timed_out=True``, and the rest of its chunk is re-queued. Items travel in chunks of
    ``chunk_size``; results are returned in input order. ``num_workers=0`` grades in-process (no
    timeout; for debugging). Workers start lazily on the first :meth:`grade` (or :meth:`start`) and
    are reused across calls; their start-up does not count against ``timeout_s``. One grader serves
    one thread at a time. ``num_timeouts`` / ``num_restarts`` count over the grader's lifetime.

    A subclass grades something else with the same pool (graft_cli/reward/code_grader.py):
    ``worker_target`` (the worker loop; a worker ``i`` gets the grader's options plus ``slot: i``;
    an answer message may carry its seconds as a 6th element and its base tests' verdict as a
    7th), ``preload`` (the forkserver's modules), :meth:`extract` (what a timed-out or crashed item
    reports as extracted) and :meth:`grade_inline` (the ``num_workers=0`` path: its tuple may end
    with the base verdict too)."""

    worker_target = staticmethod(_worker_main)
    preload = ("graft_cli.reward.pool", "math_verify", "latex2sympy2_extended")

    @staticmethod
    def extract(response: str, gold) -> str | None:
        return last_boxed(response)

    def on_ready(self, msg: tuple) -> None:
        """A worker's ``("ready", pid, ...)`` message (a subclass reads what its workers report
        there)."""

    def grade_inline(self, response: str, gold):
        """``(reward, extracted, status, seconds or None)`` of one item in the calling process."""
        reward, extracted, status = grade_status(response, gold)
        return reward, extracted, status, None

    def __init__(self, num_workers: int = 2, timeout_s: float = 5.0, chunk_size: int = 64,
                 startup_timeout_s: float = 120.0, sci_notation: bool = True, memory_mb: int = 4096):
        self._workers: list[_Worker] = []  # first: close() (and so __del__) works on a grader that failed here
        self._pid = os.getpid()
        if num_workers < 0 or timeout_s <= 0 or chunk_size < 1:
            raise ValueError("need num_workers >= 0, timeout_s > 0 and chunk_size >= 1")
        self.options = {"sci_notation": bool(sci_notation), "memory_mb": int(memory_mb)}
        OPTIONS["sci_notation"] = bool(sci_notation)  # the in-process path (num_workers = 0) and the caches
        self.num_workers = num_workers
        self.timeout_s = float(timeout_s)
        self.chunk_size = int(chunk_size)
        self.startup_timeout_s = float(startup_timeout_s)
        self.num_timeouts = 0  # over the grader's lifetime
        self.num_restarts = 0
        self.num_crashes = 0
        self._ctx = None
        self._startup_failures = 0

    # -- lifecycle
    def _new_worker(self, i: int) -> _Worker:
        return _Worker(self._ctx, {**self.options, "slot": i}, self.worker_target)

    def _start_workers(self) -> None:
        if self._ctx is None:
            self._ctx = _mp_context(self.preload)
        for i in range(self.num_workers):
            if i >= len(self._workers):
                self._workers.append(self._new_worker(i))
            elif not self._workers[i].proc.is_alive():
                self._workers[i].kill()
                self._workers[i] = self._new_worker(i)

    def start(self, wait: bool = True) -> MathVerifyGrader:
        """Start the workers now (otherwise the first :meth:`grade` does) and, with ``wait``, block
        until all of them are ready, e.g. to overlap their start-up with model loading."""
        if self.num_workers == 0:
            return self
        self._start_workers()
        deadline = time.monotonic() + self.startup_timeout_s
        while wait and not all(w.ready for w in self._workers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"reward worker did not start within {self.startup_timeout_s:.0f} s")
            pending = {w.conn: i for i, w in enumerate(self._workers) if not w.ready}
            for conn in mp_wait(list(pending), timeout=max(0.0, deadline - time.monotonic())):
                try:
                    msg = conn.recv()
                    if msg[0] == "ready":
                        self._workers[pending[conn]].ready = True
                        self._startup_failures = 0
                        self.on_ready(msg)
                except (EOFError, OSError):
                    self._startup_failures += 1
                    if self._startup_failures > 3 * self.num_workers:
                        raise RuntimeError("reward workers keep dying at start-up") from None
                    self._restart(pending[conn])
        return self

    def _restart(self, i: int) -> None:
        self._workers[i].kill()
        self._workers[i] = self._new_worker(i)
        self.num_restarts += 1

    def close(self) -> None:
        workers, self._workers = self._workers, []
        if self._pid != os.getpid():
            return  # a forked copy does not own the workers
        for w in workers:
            try:
                w.conn.send(("stop",))
            except Exception:
                pass
        deadline = time.monotonic() + 2.0
        for w in workers:
            try:
                w.proc.join(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:
                pass
            w.kill()

    def __enter__(self) -> MathVerifyGrader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- grading
    def grade(self, responses: list[str], golds: list[str]) -> Grades:
        if len(responses) != len(golds):
            raise ValueError(f"{len(responses)} responses but {len(golds)} golds")
        n = len(responses)
        rewards = np.zeros(n, dtype=np.float32)
        timed_out = np.zeros(n, dtype=bool)
        extracted: list[str | None] = [None] * n
        status = ["ok"] * n
        seconds = np.full(n, np.nan) if self.worker_target is not _worker_main else None
        base = np.full(n, np.nan) if self.worker_target is not _worker_main else None
        if n == 0:
            return Grades(rewards, timed_out, extracted, status, seconds, base)
        if self.num_workers == 0:
            for i, (r, g) in enumerate(zip(responses, golds)):
                res = self.grade_inline(r, g)
                rewards[i], extracted[i], status[i], sec = res[:4]
                if seconds is not None:
                    seconds[i] = sec
                if base is not None and len(res) > 4:
                    base[i] = res[4]
                timed_out[i] = status[i] in ("timeout", "code_timeout")
            return Grades(rewards, timed_out, extracted, status, seconds, base)

        try:
            return self._grade(responses, golds, rewards, timed_out, extracted, status, seconds, base)
        except BaseException:
            self.close()  # workers may hold a half-done chunk: start clean next time
            raise

    def _dispatch(self, queue: deque, responses, golds, now: float) -> None:
        """The next chunk of ``queue`` to each ready worker that holds none (a send that fails puts
        it back)."""
        for w in self._workers:
            if w.ready and not w.current and queue:
                chunk = queue.popleft()
                try:
                    w.conn.send(("grade", [(i, responses[i], golds[i]) for i in chunk]))
                except Exception:
                    queue.appendleft(chunk)
                    continue
                w.current.extend(chunk)
                w.last = now

    def _on_crash(self, i: int, queue: deque, retried: set, score_zero) -> None:
        """Worker ``i`` died: the item it held is regraded once on a fresh worker, then scored 0
        (``score_zero``, e.g. the OOM killer each time); the rest of its chunk goes back to the
        front of ``queue``. Dying before it was ready counts towards the start-up failures."""
        w = self._workers[i]
        if w.current:
            idx = w.current.popleft()
            rest = list(w.current)
            if idx in retried:
                score_zero(idx)
                self.num_crashes += 1
            else:
                retried.add(idx)
                rest = [idx] + rest
            if rest:
                queue.appendleft(rest)
        elif not w.ready:
            self._startup_failures += 1
            if self._startup_failures > 3 * self.num_workers:
                raise RuntimeError("reward workers keep dying at start-up")
        self._restart(i)

    def _grade(self, responses, golds, rewards, timed_out, extracted, status, seconds=None, base=None) -> Grades:
        n = len(responses)
        self._start_workers()
        queue = deque(list(range(s, min(s + self.chunk_size, n))) for s in range(0, n, self.chunk_size))
        remaining = n
        retried: set[int] = set()  # items whose worker died once: regraded on a fresh worker, then scored 0

        def settle(idx: int, reward: float, ext, st: str = "ok", sec: float | None = None,
                   b: float | None = None) -> None:
            nonlocal remaining
            rewards[idx], extracted[idx], timed_out[idx], status[idx] = reward, ext, st in ("timeout",
                                                                                          "code_timeout"), st
            if seconds is not None:
                seconds[idx] = np.nan if sec is None else sec
            if base is not None:
                base[idx] = np.nan if b is None else b
            remaining -= 1

        while remaining > 0:
            now = time.monotonic()
            self._dispatch(queue, responses, golds, now)
            waits = [w.last + self.timeout_s - now for w in self._workers if w.current]
            waits += [w.started + self.startup_timeout_s - now for w in self._workers if not w.ready]
            wait_s = max(0.0, min(waits)) if waits else 0.0
            ready = mp_wait([w.conn for w in self._workers], timeout=wait_s)
            now = time.monotonic()
            for i, w in enumerate(self._workers):
                if w.conn not in ready:
                    continue
                crashed = False
                try:
                    while w.conn.poll():
                        msg = w.conn.recv()
                        if msg[0] == "ready":
                            w.ready = True
                            self._startup_failures = 0
                            self.on_ready(msg)
                        elif msg[0] == "r" and w.current and msg[1] == w.current[0]:
                            w.current.popleft()
                            settle(msg[1], msg[2], msg[3], msg[4], msg[5] if len(msg) > 5 else None,
                                   msg[6] if len(msg) > 6 else None)
                            w.last = now
                except (EOFError, OSError):
                    crashed = True
                if crashed:
                    self._on_crash(i, queue, retried, lambda idx: settle(
                        idx, 0.0, self.extract(responses[idx], golds[idx]), "crash"))
            for i, w in enumerate(self._workers):  # enforce deadlines
                if w.current and now - w.last > self.timeout_s:
                    idx = w.current.popleft()
                    settle(idx, 0.0, self.extract(responses[idx], golds[idx]), "timeout",
                           now - w.last if seconds is not None else None)
                    self.num_timeouts += 1
                    if w.current:
                        queue.appendleft(list(w.current))
                    self._restart(i)
                elif not w.ready and now - w.started > self.startup_timeout_s:
                    raise RuntimeError(f"reward worker did not start within {self.startup_timeout_s:.0f} s")
        return Grades(rewards, timed_out, extracted, status, seconds, base)
