"""The sandbox's supervisor (graft_cli/reward/supervise.py) on real child processes, and the harness's stdin
payload (graft_cli/reward/harness.py) against the fields worked out by hand for each test kind."""

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

from graft_cli.reward.harness import payload
from graft_cli.reward.supervise import supervise


def _run(code: str, stdin: bytes = b"", timeout_s: float = 30.0, output_bytes: int = 1 << 20, result_bytes=4096):
    rfd, wfd = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", code, str(wfd)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, pass_fds=(wfd,), start_new_session=True)
    os.close(wfd)
    lim = SimpleNamespace(timeout_s=timeout_s, output_bytes=output_bytes, result_bytes=result_bytes)
    return supervise(proc, rfd, stdin, time.monotonic(), lim)


def test_stdin_stdout_stderr_the_result_pipe_and_its_features_line():
    """Stdin reaches the program; its three outputs come back apart; the #features line is parsed off."""
    code = ("import os, sys; data = sys.stdin.read(); print(data.upper()); print('warn', file=sys.stderr);"
            "os.write(int(sys.argv[1]), b'#features landlock=1 seccomp=0\\nverdict 7'); sys.exit(3)")
    r = _run(code, stdin=b"abc" * 50000)  # more than one pipe buffer: fed in chunks
    assert r.stdout == b"ABC" * 50000 + b"\n" and r.stderr == b"warn\n"
    assert r.result == b"verdict 7" and r.features == {"landlock": True, "seccomp": False}
    assert r.returncode == 3 and not r.timed_out and not r.output_capped and r.signal is None


def test_an_output_over_its_cap_kills_the_program_and_keeps_the_cap():
    """Past output_bytes the run stops: capped, the program killed (no return code), stdout cut at the cap."""
    r = _run("import sys\nwhile True: sys.stdout.write('x' * 4096); sys.stdout.flush()", output_bytes=10000)
    assert r.output_capped and r.returncode is None and len(r.stdout) == 10000 and set(r.stdout) == {ord("x")}


def test_a_program_past_its_deadline_is_killed_and_reported_timed_out():
    """A program that never ends is killed at its deadline: timed_out, no return code."""
    r = _run("while True: pass", timeout_s=0.5)
    assert r.timed_out and r.returncode is None and r.result == b"" and r.features == {}


def test_payload_of_each_kind():
    """The JSON the harness reads: the common fields, then each kind's own (assert, record, call, io)."""
    base = {"program": "def f(x): return x", "nonce": "n1", "out_cap": 99}
    a = json.loads(payload({"kind": "assert", "tests": "assert f(1) == 1", "entry_point": "f"}, "def f(x): return x",
                           "n1", 99))
    assert a == {**base, "kind": "assert", "tests": "assert f(1) == 1", "entry_point": "f", "prompt": ""}
    rec = json.loads(payload({"kind": "assert", "tests": "t", "entry_point": "f", "prompt": "p"}, "def f(x): return x",
                             "n1", 99, record=("rewritten", [{"rule": "eq"}, {"rule": "notnone"}])))
    assert rec["kind"] == "record" and rec["tests"] == "rewritten" and rec["reduce_sites"] == [1]
    c = json.loads(payload({"kind": "call", "inputs": [[1], [2]], "fn_name": "f",
                            "rules": [{"rule": "eq"}, {"rule": "notnone"}]}, "def f(x): return x", "n1", 99))
    assert c == {**base, "kind": "call", "inputs": [[1], [2]], "fn_name": "f", "tagged": True, "reduce": [0, 1]}
    io = json.loads(payload({"kind": "io", "inputs": ["1\n"]}, "def f(x): return x", "n1", 99))
    assert io == {**base, "kind": "io", "inputs": ["1\n"]}
