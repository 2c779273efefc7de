"""The math-verify reward: final-answer extraction, equivalence judgements, hard timeouts, ordering.

Expected values in the tables are hand judgements of mathematical equivalence, not outputs of the
code under test. Where math-verify's documented behaviour departs from the strict mathematical answer
the case carries a ``# math-verify:`` comment naming the documented rule it follows.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from sympy import srepr

from graft_cli.reward import REWARDS
from graft_cli.reward.pool import Grades, MathVerifyGrader
from graft_cli.reward.answers import _ensure_math_verify, grade_one, last_boxed


def box(ans: str) -> str:
    return f"Let me think step by step. So the final answer is $\\boxed{{{ans}}}$."


# ----------------------------------------------------------------------------------------------------
# last_boxed

LAST_BOXED = [
    ("\\boxed{5}", "5"),
    ("a \\boxed{1} then \\boxed{2}.", "2"),  # the last box counts
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("$\\boxed{\\{1,2\\}}$", "\\{1,2\\}"),  # escaped braces are content
    ("\\boxed{ 7 }", "7"),
    ("\\fbox{3}", "3"),
    ("\\boxed{1} and \\fbox{4}", "4"),
    ("\\fbox{4} and \\boxed{1}", "1"),
    ("so $\\boxed 42$.", "42"),  # \boxed without braces: up to the next $
    ("so \\boxed 42.\nDone", "42"),  # ... or newline, trailing '.' dropped
    ("\\boxed {9}", "9"),
    ("\\boxed{a{b}c}", "a{b}c"),
    ("\\boxed{\\sqrt{\\frac{1}{2}}} end", "\\sqrt{\\frac{1}{2}}"),
    ("\\boxed{\\boxed{8}}", "8"),
    ("no box here", None),
    ("", None),
    ("\\boxed{}", None),  # empty box: no answer
    ("\\boxed{  }", None),
    ("\\boxed{5", None),  # unbalanced
    ("\\boxed{1} ... \\boxed{2", None),  # the LAST box is broken (truncated): no fallback to an earlier one
    ("\\boxed{{{{1}", None),
    ("\\boxedx{3}", None),  # another command name
    ("\\boxed{3} \\boxedx{4}", "3"),
    ("\\boxed", None),
]


@pytest.mark.parametrize("text,expected", LAST_BOXED)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


LONG_BOXED = ["\\boxed{" * 50_000, "{" * 100_000 + "\\boxed{1}", "\\boxed{" + "{" * 100_000,
              "\\boxed{" + "x" * 100_000 + "}", "\\boxed{1}" * 10_000, "\\boxed" * 20_000]


def test_last_boxed_on_long_inputs():
    # unclosed boxes have no answer; the last closed one wins (its time: test_grader_time_bounds, slow group)
    assert [last_boxed(t) for t in LONG_BOXED] == [None, "1", None, "x" * 100_000, "1", None]


# ----------------------------------------------------------------------------------------------------
# Equivalence: (gold, response, expected reward)

EQUIV = [
    # fractions, decimals, radicals
    ("\\frac{1}{2}", box("0.5"), 1.0),
    ("0.5", box("\\frac{1}{2}"), 1.0),
    ("\\frac{1}{2}", box("\\frac12"), 1.0),
    ("\\frac{1}{2}", box("\\dfrac{1}{2}"), 1.0),
    ("\\frac{1}{2}", box("2/4"), 1.0),
    ("\\frac{\\sqrt3}{2}", box("\\frac{\\sqrt{3}}{2}"), 1.0),
    ("\\frac{\\sqrt{3}}{2}", box("\\frac{1}{2}\\sqrt{3}"), 1.0),
    ("2\\sqrt{2}", box("\\sqrt{8}"), 1.0),
    ("\\frac{1}{3}", box("0.333"), 0.0),
    # math-verify: floats are compared after rounding to 6 decimals (verify(float_rounding=6), its
    # docstring's own example is 1/3 == 0.333333), so these 6-decimal approximations count as equal.
    ("\\frac{1}{3}", box("0.333333"), 1.0),
    ("\\sqrt{2}", box("1.414214"), 1.0),
    ("\\sqrt{2}", box("1.414"), 0.0),
    ("\\pi", box("3.14"), 0.0),
    ("0.\\overline{3}", box("\\frac{1}{3}"), 1.0),  # repeating decimals (pre-normalised by reward/answers.py)
    ("0.\\overline{3}", box("0"), 0.0),
    ("\\frac{4}{11}", box("0.\\overline{36}"), 1.0),
    # integers, negatives, formatting
    ("-3", box("-3"), 1.0),
    ("-3", box("3"), 0.0),
    ("-\\frac{3}{4}", box("-0.75"), 1.0),
    ("-\\frac{3}{4}", box("\\frac{-3}{4}"), 1.0),
    ("1000", box("1,000"), 1.0),
    ("1000", box("1{,}000"), 1.0),
    ("3", box("3.0"), 1.0),
    ("4", box("2+2"), 1.0),
    ("42", box("41"), 0.0),
    ("1.5\\times10^3", box("1500"), 1.0),
    # intervals and sets
    ("(0,\\infty)", box("(0, \\infty)"), 1.0),
    ("(0,\\infty)", box("[0,\\infty)"), 0.0),
    ("(-\\infty, 2] \\cup [3,\\infty)", box("(-\\infty,2]\\cup[3,\\infty)"), 1.0),
    ("x \\in (0,\\infty)", box("(0,\\infty)"), 1.0),
    ("(0,\\infty)", box("x \\in (0,\\infty)"), 1.0),
    # math-verify: a set gold is compared with a relation prediction only when allow_set_relation_comp
    # is set (documented in verify(); default False), so x>0 does not match (0,oo) although the solution
    # sets are equal.
    ("(0,\\infty)", box("x>0"), 0.0),
    ("\\{1,2\\}", box("\\{2,1\\}"), 1.0),
    ("1,2", box("2, 1"), 1.0),
    ("2, -3", box("-3, 2"), 1.0),
    ("2 \\text{ and } 3", box("2,3"), 1.0),
    ("2, -3", box("2"), 0.0),
    ("\\{1,2\\}", box("\\{1,3\\}"), 0.0),
    ("(3,-1)", box("(3, -1)"), 1.0),
    ("(3,-1)", box("(-1, 3)"), 0.0),  # an ordered pair is not a set
    # equations and expressions
    ("x=5", box("5"), 1.0),
    ("5", box("x=5"), 1.0),
    ("x=5", box("x = 5"), 1.0),
    # math-verify: strict=True (default) makes variables matter (documented in verify()).
    ("x=5", box("y=5"), 0.0),
    ("y=2x+1", box("2x+1"), 1.0),
    ("x^2+2x+1", box("(x+1)^2"), 1.0),
    ("1+i", box("i+1"), 1.0),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", box("\\begin{pmatrix}1\\\\2\\end{pmatrix}"), 1.0),
    # degrees and units are dropped by the normalisation
    ("30^\\circ", box("30"), 1.0),
    ("30", box("30^\\circ"), 1.0),
    ("30^\\circ", box("30^{\\circ}"), 1.0),
    ("5\\text{ cm}", box("5"), 1.0),
    ("5", box("5\\text{ cm}"), 1.0),
    ("12\\text{ inches}", box("12"), 1.0),
    ("\\$18.90", box("18.90"), 1.0),
    ("\\$1.50", box("1.5"), 1.0),
    # text answers and choices
    ("\\text{Evelyn}", box("Evelyn"), 1.0),
    ("\\text{Evelyn}", box("\\text{Evelyn}"), 1.0),
    ("Evelyn", box("\\text{Evelyn}"), 1.0),
    ("\\text{Evelyn}", box("\\text{Bob}"), 0.0),
    ("\\text{odd}", box("odd"), 1.0),
    ("\\text{odd}", box("\\text{even}"), 0.0),
    ("\\text{(C)}", box("C"), 1.0),
    ("C", box("D"), 0.0),
    # percentages. math-verify reads X\% as X/100 and, for integers only, also accepts the bare
    # number ("9% == 9", grader.sympy_numeric_eq). So 50\% == 0.5 (mathematically right) and
    # 50\% == 50 (the usual MATH leniency), but 12.5\% != 12.5 (12.5% = 0.125). These hold only with
    # reward/answers.py's antlr-4.9.3 fix: without it every LaTeX percentage fails to parse and 50\% equals
    # nothing but the identical string "50\%" (which is why 50\% vs 0.5 once looked "not equal").
    ("50\\%", box("50\\%"), 1.0),
    ("50\\%", box("0.5"), 1.0),
    ("50\\%", box("50"), 1.0),
    ("10\\%", box("10"), 1.0),
    ("12.5\\%", box("12.5"), 0.0),
    ("12.5\\%", box("0.125"), 1.0),
    ("50\\%", box("51\\%"), 0.0),
    # final-answer extraction
    ("7", "First \\boxed{5}, but correcting the sign: \\boxed{7}", 1.0),
    ("7", "\\boxed{7} ... wait, no: \\boxed{5}", 0.0),
    ("7", "The answer is 7.", 0.0),  # no \boxed: 0 even though the number is right
    ("7", "", 0.0),
    ("7", "\\boxed{7", 0.0),  # unbalanced last box
    ("7", "\\fbox{7}", 1.0),
    ("7", "so the answer is \\boxed 7", 1.0),
    ("7", "\\boxed{}", 0.0),
    ("\\frac{1}{2}", "\\boxed{\\boxed{\\frac{1}{2}}}", 1.0),
    ("104", box("104."), 1.0),  # sentence-final period inside the box
    # gold formats
    ("$\\frac{1}{2}$", box("0.5"), 1.0),
    ("\\boxed{7}", box("7"), 1.0),
    ("1/2", box("\\frac{1}{2}"), 1.0),
    # a gold latex2sympy cannot parse (\hbar) compares by normalised string: an identical answer scores
    # 1, and no stray number is pulled out of it ("2" from "1/2").
    ("\\hbar \\omega(v+1 / 2)", box("\\hbar \\omega(v+1 / 2)"), 1.0),
    ("\\hbar \\omega(v+1 / 2)", box("2"), 0.0),
]


@pytest.mark.parametrize("gold,response,expected", EQUIV)
def test_equivalence(gold, response, expected):
    reward, _ = grade_one(response, gold)
    assert reward == expected, (gold, response, last_boxed(response))


def test_equivalence_table_size():
    assert len(EQUIV) >= 30
    assert {e for *_, e in EQUIV} == {0.0, 1.0}


def test_grade_one_returns_extracted_and_never_raises():
    assert grade_one(box("\\frac{1}{2}"), "0.5") == (1.0, "\\frac{1}{2}")
    assert grade_one("no box", "1") == (0.0, None)
    for bad_response, bad_gold in [(None, "1"), (box("1"), None), (123, 456), (box("1"), ""),
                                   (box("\x00\xff"), "\\frac{"), (box("1"), "}{")]:
        reward, _ = grade_one(bad_response, bad_gold)
        assert reward == 0.0


def test_two_stage_latex_parse_matches_full_ll():
    # reward/answers.py parses LaTeX with ANTLR's SLL-then-LL strategy; the result must equal a full-LL parse.
    import math_verify.parser as mv_parser
    from latex2sympy2_extended.latex2sympy2 import latex2sympy as full_ll
    _ensure_math_verify()  # applies the patches
    assert mv_parser.latex2sympy is not full_ll
    for s in ["(-\\infty, 5]", "[0,1)", "(-\\infty,-2)\\cup(2,\\infty)", "\\{1,2,3\\}", "1, 2", "x=5",
              "y = 2x+1", "1 < x \\le 3", "(3,-1)", "\\left( 3, \\frac{\\pi}{2} \\right)", "50\\%",
              "\\begin{pmatrix}1\\\\2\\end{pmatrix}", "2\\sqrt{2}", "\\frac{x}{y}", "f(x)=x^2"]:
        assert outcome(mv_parser.latex2sympy, s) == outcome(full_ll, s), s


def outcome(fn, s):
    try:
        return srepr(fn(s, is_real=True, convert_degrees=False))
    except Exception as e:
        return type(e).__name__


def test_grade_one_off_the_main_thread():
    # math-verify's signal.alarm timeouts raise off the main thread; reward/answers.py disables them.
    out = []
    t = threading.Thread(target=lambda: out.append(grade_one(box("0.5"), "\\frac{1}{2}")))
    t.start()
    t.join(30)
    assert out == [(1.0, "0.5")]


# ----------------------------------------------------------------------------------------------------
# Worker processes: hard timeout, ordering, lifecycle

TIMEOUT_S = 1.0
SLACK_S = 1.5

# Verified by hand: grade_one on this tower runs > 30 s in-process (sympy's doit evaluates
# 10**(10**10) inside verify, in C, where even math-verify's signal.alarm could not interrupt it).
TOWER = box("10^{10^{10^{10}}}")

# (name, response, gold, timed_out: True / False / None = either)
PATHOLOGICAL = [
    ("frac_5000_unclosed", "\\boxed{" + "\\frac{" * 5000 + "}", "1", False),
    ("frac_nested_500", box("\\frac{1}{" * 500 + "2" + "}" * 500), "1", None),
    ("unbalanced", "\\boxed{{{{{1}", "1", False),
    ("answer_100k_digits", box("1" * 100_000), "1", None),
    ("sum_30k_terms", box("+".join(["x"] * 30_000)), "1", None),
    ("sqrt_nested_2000", box("\\sqrt{" * 2000 + "2" + "}" * 2000), "1", None),
    ("power_tower", TOWER, "5", True),
    ("power_tower_9", box("9^{9^{9^{9}}}"), "5", True),
    ("factorial_1e6", box("1000000!"), "5", None),
    ("factorial_1e10", box("(10^{10})!"), "5", True),
    ("binary_garbage", box(bytes(range(256)).decode("latin-1") * 20), "1", None),
    ("nul_bytes", box("\x00\x00"), "0", False),
    ("empty", "", "1", False),
    ("boxed_50k_unclosed", "\\boxed{" * 50_000, "1", False),
    ("dollars_100k", "$" * 100_000, "1", False),
]


@pytest.fixture(scope="module")
def grader():
    g = MathVerifyGrader(num_workers=2, timeout_s=TIMEOUT_S, chunk_size=4).start()
    yield g
    g.close()


@pytest.mark.parametrize("name,response,gold,expect_timeout", PATHOLOGICAL, ids=[p[0] for p in PATHOLOGICAL])
def test_pathological_inputs_score_0(grader, name, response, gold, expect_timeout):
    # each returns (the hard timeout ends the ones math-verify would hang on) and scores 0; how long each takes on
    # the wall clock: test_grader_time_bounds (slow group)
    out = grader.grade([response], [gold])
    assert out.rewards[0] == 0.0
    if expect_timeout is not None:
        assert bool(out.timed_out[0]) is expect_timeout, name


def test_timeout_in_batch_requeues_rest_of_chunk():
    # The tower sits mid-chunk: the worker is killed at the deadline, the tower scores 0 with
    # timed_out, and the chunk's later items are re-queued and graded normally.
    golds = [str(i) for i in range(12)]
    responses = [box(str(i)) if i % 3 else box(str(i + 1)) for i in range(12)]
    responses[5] = TOWER
    expected = np.array([0.0 if i % 3 == 0 or i == 5 else 1.0 for i in range(12)], dtype=np.float32)
    with MathVerifyGrader(num_workers=2, timeout_s=TIMEOUT_S, chunk_size=4).start() as g:
        out = g.grade(responses, golds)
        np.testing.assert_array_equal(out.rewards, expected)
        assert out.timed_out.tolist() == [i == 5 for i in range(12)]
        assert out.extracted[5] == "10^{10^{10^{10}}}"
        assert out.extracted[7] == "7"
        assert g.num_timeouts == 1 and g.num_restarts == 1
        # the replacement worker serves the next call
        out2 = g.grade([box("0.5")] * 8, ["\\frac{1}{2}"] * 8)
        assert out2.rewards.tolist() == [1.0] * 8 and not out2.timed_out.any()


SEVERAL_TIMEOUTS = ([TOWER, box("1"), TOWER, box("2"), TOWER, box("3")], ["5", "1", "5", "2", "5", "0"])


def test_several_timeouts_in_one_batch():
    with MathVerifyGrader(num_workers=2, timeout_s=TIMEOUT_S, chunk_size=2).start() as g:
        out = g.grade(*SEVERAL_TIMEOUTS)
    assert out.rewards.tolist() == [0, 1, 0, 1, 0, 0]
    assert out.timed_out.tolist() == [True, False, True, False, True, False]


@pytest.mark.slow
def test_grader_time_bounds(grader):
    """The wall-clock side of the hard timeout, in the slow group (a loaded machine stretches wall time; the fast
    suite bounds none): each pathological input returns within TIMEOUT_S + SLACK_S and a timed-out one not before
    0.9 · TIMEOUT_S; three kills over two workers take at most two deadlines in a row; last_boxed reads each long
    input in under 0.5 s (linear time)."""
    for name, response, gold, _ in PATHOLOGICAL:
        t = time.perf_counter()
        out = grader.grade([response], [gold])
        wall = time.perf_counter() - t
        assert wall < TIMEOUT_S + SLACK_S, f"{name}: {wall:.2f} s"
        if out.timed_out[0]:
            assert wall >= TIMEOUT_S * 0.9, name
    with MathVerifyGrader(num_workers=2, timeout_s=TIMEOUT_S, chunk_size=2).start() as g:
        t = time.perf_counter()
        g.grade(*SEVERAL_TIMEOUTS)
        assert time.perf_counter() - t < 2 * TIMEOUT_S + 2 * SLACK_S
    for text in LONG_BOXED:
        t = time.perf_counter()
        last_boxed(text)
        assert time.perf_counter() - t < 0.5


def test_results_align_with_inputs_across_workers():
    rng = np.random.default_rng(0)
    n = 300
    golds, responses, expected = [], [], []
    for i in range(n):
        a = int(rng.integers(1, 1000))
        golds.append(f"\\frac{{{a}}}{{{i + 1001}}}")  # distinct per item: a misaligned result is wrong
        right = bool(rng.random() < 0.5)
        responses.append(box(f"\\frac{{{a if right else a + 1}}}{{{i + 1001}}}"))
        expected.append(1.0 if right else 0.0)
    with MathVerifyGrader(num_workers=2, timeout_s=10, chunk_size=7) as g:
        out = g.grade(responses, golds)
    assert isinstance(out, Grades) and len(out) == n
    assert out.rewards.dtype == np.float32 and out.timed_out.dtype == bool
    np.testing.assert_array_equal(out.rewards, np.array(expected, dtype=np.float32))
    assert out.extracted == [last_boxed(r) for r in responses]
    assert not out.timed_out.any()


def test_in_process_matches_workers():
    responses = [box("0.5"), "nothing", box("x=5"), box("\\{2,1\\}"), box("50\\%")]
    golds = ["\\frac{1}{2}", "1", "5", "\\{1,2\\}", "0.5"]
    local = MathVerifyGrader(num_workers=0).grade(responses, golds)
    with MathVerifyGrader(num_workers=1, chunk_size=2) as g:
        remote = g.grade(responses, golds)
    assert local.rewards.tolist() == remote.rewards.tolist() == [1, 0, 1, 1, 1]
    assert local.extracted == remote.extracted
    assert not local.timed_out.any()


def test_empty_batch_and_length_mismatch():
    g = MathVerifyGrader(num_workers=2)
    out = g.grade([], [])
    assert out.rewards.shape == (0,) and out.timed_out.shape == (0,) and out.extracted == []
    assert g._workers == []  # nothing to grade: no worker started
    with pytest.raises(ValueError):
        g.grade(["a"], [])


def test_lifecycle_reuse_close_and_dead_worker():
    g = MathVerifyGrader(num_workers=2, timeout_s=5).start()
    assert all(w.ready for w in g._workers)
    pids = [w.proc.pid for w in g._workers]
    g.grade([box("2")] * 10, ["2"] * 10)
    assert [w.proc.pid for w in g._workers] == pids  # reused, not restarted
    os.kill(pids[0], 9)  # a worker dies between calls
    g._workers[0].proc.join(5)
    out = g.grade([box(str(i)) for i in range(20)], [str(i) for i in range(20)])
    assert out.rewards.tolist() == [1.0] * 20
    procs = [w.proc for w in g._workers]
    g.close()
    assert all(not p.is_alive() for p in procs)
    g.close()  # idempotent
    del g  # __del__ after close is safe


def test_del_stops_workers():
    g = MathVerifyGrader(num_workers=1)
    g.grade([box("1")], ["1"])
    proc = g._workers[0].proc
    del g
    proc.join(5)
    assert not proc.is_alive()


def test_registry():
    assert "math_verify" in REWARDS
    g = REWARDS.get("math_verify")(num_workers=0, timeout_s=3, chunk_size=16)
    assert isinstance(g, MathVerifyGrader)
    assert (g.num_workers, g.timeout_s, g.chunk_size) == (0, 3.0, 16)
    assert g.grade([box("2")], ["2"]).rewards.tolist() == [1.0]


def test_coinflip_share_follows_reward_coinflip_p():
    """The benchmark-only coin flip scores 1 for about a share p of distinct responses (the hash of response and
    gold, so the same answer always gets the same grade), p comes from ``reward.coinflip_p``, and p outside [0, 1]
    is refused in one line. At p = 0.2 about (0.8)^8 = 16.8% of groups of 8 are all-fail (gpu_proof relies on it)."""
    import hashlib

    from graft_cli.schema import RewardConfig
    from graft_cli.errors import GraftError
    from graft_cli.reward import make_grader

    responses = [f"answer {i}" for i in range(4000)]
    golds = ["7"] * len(responses)
    for p in (0.2, 0.5):
        g = make_grader(RewardConfig(name="coinflip", coinflip_p=p))
        r = g.grade(responses, golds).rewards
        # computed independently: the first 8 hex digits of sha256(response \0 gold) over 2^32, below p
        want = [float(int(hashlib.sha256(f"{a}\x00{b}".encode()).hexdigest()[:8], 16) / 2**32 < p)
                for a, b in zip(responses, golds)]
        assert list(r) == want
        assert abs(r.mean() - p) < 0.03
        assert list(g.grade(responses[:10], golds[:10]).rewards) == want[:10]
    groups = make_grader(RewardConfig(name="coinflip", coinflip_p=0.2)).grade(responses, golds).rewards.reshape(-1, 8)
    assert 0.12 < (groups.sum(1) == 0).mean() < 0.22
    with pytest.raises(GraftError, match=r"reward.coinflip_p=1.5: must be in \[0, 1\]"):
        make_grader(RewardConfig(name="coinflip", coinflip_p=1.5))
