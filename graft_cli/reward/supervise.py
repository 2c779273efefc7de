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


def supervise(proc, rfd: int, stdin: bytes, t0: float, lim) -> RunResult:
    """Feed ``stdin`` to the started program ``proc`` and read its stdout, stderr and result pipe
    (``rfd``, closed here) up to their caps (``lim``: its :class:`~graft_cli.reward.sandbox.Limits`)
    until it ends, its time (from ``t0``) is up or a cap is passed; then kill its process group. Its
    ``#features`` line is read off the result."""
    deadline = t0 + lim.timeout_s
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray(), rfd: bytearray()}
    caps = {proc.stdout.fileno(): lim.output_bytes, proc.stderr.fileno(): lim.output_bytes, rfd: lim.result_bytes}
    open_fds = set(bufs)
    win = proc.stdin.fileno()
    pending = memoryview(stdin)
    os.set_blocking(win, False)
    if not pending:
        proc.stdin.close()
        win = None
    timed_out = capped = False
    exited_at = None
    while True:
        now = time.monotonic()
        if proc.poll() is not None and exited_at is None:
            exited_at = now
        if exited_at is not None and (not open_fds or now - exited_at > 0.2):
            break  # a pipe held open by an escaped grandchild must not keep the run alive
        if now >= deadline:
            timed_out = proc.poll() is None
            break
        wl = [win] if win is not None else []
        if not open_fds and not wl:  # every pipe closed: only the exit is left to wait for
            try:
                proc.wait(timeout=max(0.0, deadline - now))
            except subprocess.TimeoutExpired:
                pass
            continue
        try:
            r, w, _ = select.select(list(open_fds), wl, [], min(0.05, max(0.0, deadline - now)))
        except InterruptedError:
            continue
        if w:
            try:
                k = os.write(win, pending[:65536])
                pending = pending[k:]
            except (BrokenPipeError, BlockingIOError, OSError):
                pending = pending[:0]
            if not pending:
                proc.stdin.close()
                win = None
        for fd in r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                open_fds.discard(fd)
                continue
            bufs[fd] += chunk
            if len(bufs[fd]) > caps[fd]:
                capped = True
        if capped:
            break
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        proc.wait(timeout=5)
    except Exception:
        pass
    for fd in list(open_fds):  # what is already in the pipes
        try:
            os.set_blocking(fd, False)
            while len(bufs[fd]) <= caps[fd]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                bufs[fd] += chunk
        except OSError:
            pass
    for f in (proc.stdout, proc.stderr):
        f.close()
    if win is not None:
        try:
            proc.stdin.close()
        except OSError:
            pass
    os.close(rfd)
    result = bytes(bufs[rfd][: lim.result_bytes])
    features = {}
    if result.startswith(b"#features "):
        head, _, result = result.partition(b"\n")
        for kv in head.decode().split()[1:]:
            k, _, v = kv.partition("=")
            features[k] = v == "1"
    out_fd, err_fd = list(bufs)[:2]
    killed = (timed_out or capped) and proc.returncode in (None, -signal.SIGKILL)
    return RunResult(None if killed else proc.returncode, timed_out, bytes(bufs[out_fd][: lim.output_bytes]),
                     bytes(bufs[err_fd][: lim.output_bytes]), result, time.monotonic() - t0, capped, features)
