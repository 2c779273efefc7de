"""The supervisor's side of one sandboxed run (:mod:`graft_cli.reward.sandbox`): the program's
standard input fed through a pipe, its stdout, stderr and result pipe read up to their caps, the
wall-clock deadline, the kill of its process group, and what the run reported (:class:`RunResult`,
with the protections its child got). """

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass, field


@dataclass
class RunResult:
    returncode: int | None  # None: killed by the supervisor before it exited (timeout or output cap)
    timed_out: bool
    stdout: bytes
    stderr: bytes
    result: bytes  # what the program wrote to the result pipe (the features line first)
    seconds: float
    output_capped: bool = False  # stdout, stderr or the result pipe went over its cap (the program was killed)
    features: dict = field(default_factory=dict)  # protection -> True (in force) / False (refused or off)
    leftovers: int = 0  # processes still alive after the program ended, killed by the sweep

    @property
    def signal(self) -> int | None:
        return -self.returncode if self.returncode is not None and self.returncode < 0 else None


class _Pipes:
    """The program's standard input (fed from ``stdin``) and its three outputs (stdout, stderr, the
    result pipe ``rfd``), each read up to its cap."""

    def __init__(self, proc, rfd: int, stdin: bytes, lim):
        self.out, self.err, self.rfd = proc.stdout.fileno(), proc.stderr.fileno(), rfd
        self.bufs = {self.out: bytearray(), self.err: bytearray(), rfd: bytearray()}
        self.caps = {self.out: lim.output_bytes, self.err: lim.output_bytes, rfd: lim.result_bytes}
        self.open = set(self.bufs)
        self.stdin, self.pending = proc.stdin, memoryview(stdin)
        self.win = proc.stdin.fileno()
        os.set_blocking(self.win, False)
        if not self.pending:
            self.close_stdin()

    def close_stdin(self) -> None:
        try:
            self.stdin.close()
        except OSError:
            pass
        self.win = None

    def feed(self) -> None:
        """Write the next chunk of stdin (the program may have stopped reading: the rest is dropped)."""
        try:
            k = os.write(self.win, self.pending[:65536])
            self.pending = self.pending[k:]
        except (BrokenPipeError, BlockingIOError, OSError):
            self.pending = self.pending[:0]
        if not self.pending:
            self.close_stdin()

    def read(self, fd: int) -> bool:
        """Read what ``fd`` has; True when its buffer went over its cap."""
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            self.open.discard(fd)
            return False
        self.bufs[fd] += chunk
        return len(self.bufs[fd]) > self.caps[fd]

    def drain(self) -> None:
        """Read what is already in the pipes (the program has ended)."""
        for fd in list(self.open):
            try:
                os.set_blocking(fd, False)
                while len(self.bufs[fd]) <= self.caps[fd]:
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        break
                    self.bufs[fd] += chunk
            except OSError:
                pass

    def close(self, proc) -> None:
        for f in (proc.stdout, proc.stderr):
            f.close()
        if self.win is not None:
            self.close_stdin()
        os.close(self.rfd)

    def taken(self, fd: int) -> bytes:
        return bytes(self.bufs[fd][: self.caps[fd]])


def _pump(proc, pipes: _Pipes, deadline: float) -> tuple[bool, bool]:
    """Feed and read until the program ends (and its pipes close, or 0.2 s more: a pipe held open by
    an escaped grandchild must not keep the run alive), its time is up or an output passes its cap.
    Returns ``(timed_out, capped)``."""
    exited_at = None
    while True:
        now = time.monotonic()
        if proc.poll() is not None and exited_at is None:
            exited_at = now
        if exited_at is not None and (not pipes.open or now - exited_at > 0.2):
            return False, False
        if now >= deadline:
            return proc.poll() is None, False
        wl = [pipes.win] if pipes.win is not None else []
        if not pipes.open and not wl:  # every pipe closed: only the exit is left to wait for
            try:
                proc.wait(timeout=max(0.0, deadline - now))
            except subprocess.TimeoutExpired:
                pass
            continue
        try:
            r, w, _ = select.select(list(pipes.open), wl, [], min(0.05, max(0.0, deadline - now)))
        except InterruptedError:
            continue
        if w:
            pipes.feed()
        if any([pipes.read(fd) for fd in r]):
            return False, True


def _features(result: bytes) -> tuple[dict, bytes]:
    """The ``#features`` line off the head of the result pipe: ``(protection -> held, the rest)``."""
    features = {}
    if result.startswith(b"#features "):
        head, _, result = result.partition(b"\n")
        for kv in head.decode().split()[1:]:
            k, _, v = kv.partition("=")
            features[k] = v == "1"
    return features, result


def supervise(proc, rfd: int, stdin: bytes, t0: float, lim) -> RunResult:
    """Feed ``stdin`` to the started program ``proc`` and read its stdout, stderr and result pipe
    (``rfd``, closed here) up to their caps (``lim``: its :class:`~graft_cli.reward.sandbox.Limits`)
    until it ends, its time (from ``t0``) is up or a cap is passed; then kill its process group. Its
    ``#features`` line is read off the result."""
    pipes = _Pipes(proc, rfd, stdin, lim)
    timed_out, capped = _pump(proc, pipes, t0 + lim.timeout_s)
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        proc.wait(timeout=5)
    except Exception:
        pass
    pipes.drain()
    pipes.close(proc)
    features, result = _features(pipes.taken(rfd))
    killed = (timed_out or capped) and proc.returncode in (None, -signal.SIGKILL)
    return RunResult(None if killed else proc.returncode, timed_out, pipes.taken(pipes.out), pipes.taken(pipes.err),
                     result, time.monotonic() - t0, capped, features)
