"""Assert-kind tests converted to call-kind ones (graft_cli/reward/convert.py): the rules found in test code, the
plain-data codec, the pairing of recorded calls with expected values, and the trusted-side comparisons, all against
values worked by hand."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import pytest

from graft_cli.reward import convert
from graft_cli.reward.convert import (INT_BITS, NotConvertible, NotPlain, calls_from_records, decode, encode,
                                      passes, rewrite_tests)


@pytest.mark.parametrize("tests,rule", [
    ("def check(candidate):\n    assert candidate(1) == 2\n", {"rule": "eq", "transform": []}),
    ("def check(c):\n    assert 2 == c(1)\n", {"rule": "eq", "transform": []}),
    ("assert f(1) != 3\n", {"rule": "ne", "transform": []}),
    ("assert f(1) is None\n", {"rule": "is", "transform": []}),
    ("assert f(1) is not None\n", {"rule": "is", "transform": [], "negate": True}),
    ("assert f(1) in (2, 3)\n", {"rule": "in", "transform": []}),
    ("assert not f(1)\n", {"rule": "truthy", "negate": True, "transform": []}),
    ("assert abs(f(1) - 2.0) < 1e-6\n", {"rule": "close", "le": False, "transform": []}),
    ("import math\nassert math.fabs(f(1) - 2.0) <= 1e-6\n", {"rule": "close", "le": True, "transform": []}),
    ("assert sorted(f(1)) == [1, 2]\n", {"rule": "eq", "transform": [["sorted"]]}),
    ("assert tuple(f(1)) == (1, 2)\n", {"rule": "eq", "transform": [["tuple"]]}),
    ("assert round(f(1), 2) == 0.5\n", {"rule": "eq", "transform": [["round", 2]]}),
    ("for inp, exp in zip([[1]], [2]):\n    assertion(f(*inp), exp, 0)\n", {"rule": "allclose", "transform": []}),
])
def test_rewrite_finds_each_rule(tests, rule):
    _, sites = rewrite_tests(tests, "f")
    assert sites == [rule]


@pytest.mark.parametrize("helper,rule", [
    (convert._STANDARD_MBPP, "allclose"), (convert._STANDARD_HUMANEVAL, "allclose"),
    (convert._SET_EQ, "seteq"), (convert._NOT_NONE, "notnone"), ("", "allclose"),
])
def test_evalplus_assertion_helpers_give_their_rule(helper, rule):
    """EvalPlus's hub tests define assertion() in one of three variants (standard; order-free sets for
    MBPP_OUTPUT_SET_EQ_TASKS; not-None for MBPP_OUTPUT_NOT_NONE_TASKS): each call gets its variant's rule."""
    tests = helper + "\nfor i, (inp, exp) in enumerate(zip([[1]], [2])):\n    assertion(f(*inp), exp, 0)\n"
    _, sites = rewrite_tests(tests, "f")
    assert sites == [{"rule": rule, "transform": []}]


def test_an_assertion_helper_of_another_kind_is_not_converted():
    tests = "def assertion(out, exp, atol):\n    assert True\n\nassertion(f(1), 2, 0)\n"
    with pytest.raises(NotConvertible, match="assertion helper"):
        rewrite_tests(tests, "f")


@pytest.mark.parametrize("tests", [
    "def check(candidate):\n    x = candidate(1)\n    assert x == 2\n",  # the result kept in a variable
    "def check(candidate):\n    assert poly([1], candidate(1)) < 1e-6\n",  # passed to a helper
    "assert f(1) == f(2)\n",  # the entry point on both sides
    "assert 1 < f(1) < 3\n",  # a chained comparison
    "def check(candidate):\n    assert tuple(candidate([1])) == tuple(f([1]))\n",  # compared with itself
    "assert g(1) == 2\n",  # never calls the entry point
    "assert f(1 == 2\n",  # does not parse
])
def test_rewrite_refuses_what_the_call_kind_cannot_express(tests):
    with pytest.raises(NotConvertible):
        rewrite_tests(tests, "f")


def test_rewritten_tests_record_calls_and_expected_values():
    """The rewritten code calls __graft_rec__ / __graft_exp__ with the site number; run here with recorders that
    behave as the harness's (record, then return the value)."""
    code, sites = rewrite_tests("def check(candidate):\n    assert candidate(2) == 4\n    assert 9 == candidate(3)\n",
                                "f")
    events = []
    ns = {"__graft_rec__": lambda s, fn, *a: events.append(("call", s, a)) or fn(*a),
          "__graft_exp__": lambda s, k, v: events.append(("exp", s, k, v)) or v}
    exec(code, ns)
    ns["check"](lambda x: x * x)
    assert events == [("call", 0, (2,)), ("exp", 0, "want", 4), ("exp", 1, "want", 9), ("call", 1, (3,))]
    assert [s["rule"] for s in sites] == ["eq", "eq"]


def test_a_reference_whose_result_fails_its_rule_is_not_converted():
    """A recorded call whose own result does not pass the rule recorded for it (an order the tests did not
    check, a nondeterministic result) leaves the problem unconverted."""
    sites = [{"rule": "allclose", "transform": []}]
    ok = [[0, [1], {"d": []}, {"t": [1, 2]}], [0, "want", {"t": [1, 2]}], [0, "tol", 0]]
    assert calls_from_records(ok, sites)[0] == [[1]]
    bad = [[0, [1], {"d": []}, {"t": [2, 1]}], [0, "want", {"t": [1, 2]}], [0, "tol", 0]]
    with pytest.raises(NotConvertible, match="own result"):
        calls_from_records(bad, sites)
    assert calls_from_records(bad, [{"rule": "seteq", "transform": []}])[0] == [[1]]  # order-free


def test_calls_from_records_pairs_expected_values_either_side():
    sites = [{"rule": "eq", "transform": []}, {"rule": "eq", "transform": []}, {"rule": "close", "le": False,
                                                                              "transform": []}]
    records = [[0, [2], {"d": []}, 4], [0, "want", 4],  # f(2) == 4
               [1, "want", 9], [1, [3], {"d": []}, 9],  # 9 == f(3)
               [1, "want", 16], [1, [4], {"d": []}, 16],  # the same site again, in a loop
               [2, [1], {"d": []}, 0.5], [2, "want", 0.5], [2, "tol", 1e-6]]
    inputs, rules = calls_from_records(records, sites)
    assert inputs == [[2], [3], [4], [1]]
    assert [r.get("want") for r in rules] == [4, 9, 16, 0.5] and rules[3]["tol"] == 1e-6
    with pytest.raises(NotConvertible):
        calls_from_records([[0, [2], {"d": [["k", 1]]}, 4], [0, "want", 4]], sites)  # keyword arguments
    with pytest.raises(NotConvertible):
        calls_from_records([[0, [2], {"d": []}, 4]], sites)  # no expected value recorded


@pytest.mark.parametrize("value", [None, True, 3, -2**80, 0.1, float("inf"), "é\n", [1, [2]], (1, (2,)), {1, 2},
                                   frozenset({3}), {"a": 1, 2: (3,)}, b"\x00\xff", 1 + 2j, []])
def test_plain_data_round_trips_with_exact_types(value):
    back = decode(json.loads(json.dumps(encode(value))))
    assert back == value and type(back) is type(value)


def test_ints_past_the_decimal_digit_limit_cross_as_hex():
    """Python refuses int <-> decimal str beyond 4,300 digits (json.dumps included): such ints are tagged hex."""
    big = 10**5000 + 7
    for v in (big, -big, [big, (1, -big)], 2**INT_BITS):
        back = decode(json.loads(json.dumps(encode(v))))
        assert back == v and type(back) is type(v)
    assert encode(2**INT_BITS - 1) == 2**INT_BITS - 1  # at the bound: a plain JSON number
    assert encode(2**INT_BITS) == {"i": format(2**INT_BITS, "x")}
    assert encode(-(2**INT_BITS)) == {"i": "-" + format(2**INT_BITS, "x")}
    assert decode({"i": "-ff"}) == -255
    for bad in ({"i": "0xz"}, {"i": 12}, {"i": ""}, {"i": "1 2"}):
        with pytest.raises(NotPlain):
            decode(bad)


def test_plain_data_keeps_what_json_would_merge_apart():
    assert decode({"t": [1, 2]}) != decode([1, 2])  # a tuple is not a list
    assert type(decode({"s": [1]})) is set and type(decode({"fs": [1]})) is frozenset
    assert decode({"t": [1, {"t": [2]}]}) == (1, (2,))  # nested tuples stay tuples
    nested = []
    for _ in range(200):
        nested = [nested]
    for bad in ({"x": 1}, {"t": 1}, {"s": [[1]]}, {"f": "1.5"}, {"c": ["a", 1]}, nested, {"b": "zz"},
                {"od": [[[1], 2]]}, {"dd": ["print", []]}, {"q": [-1, []]}, {"ct": [[1]]}):
        with pytest.raises(NotPlain):
            decode(bad)

    class Liar(int):
        def __eq__(self, other):
            return True

    with pytest.raises(NotPlain):
        encode(Liar(1))


@pytest.mark.parametrize("rule,got,ok", [
    ({"rule": "eq", "want": 4}, 4, True), ({"rule": "eq", "want": 4}, 4.0, True),  # Python's == on built-ins
    ({"rule": "eq", "want": (1, 2)}, [1, 2], False), ({"rule": "eq", "want": (1, 2), "transform": [["tuple"]]},
                                                      [1, 2], True),
    ({"rule": "ne", "want": 3}, 2, True), ({"rule": "ne", "want": 3}, 3, False),
    ({"rule": "is", "want": None}, None, True), ({"rule": "is", "want": None}, 0, False),
    ({"rule": "is", "want": None, "negate": True}, 0, True),
    ({"rule": "in", "want": [2, 3]}, 3, True), ({"rule": "in", "want": [2, 3]}, 4, False),
    ({"rule": "truthy"}, [1], True), ({"rule": "truthy", "negate": True}, [1], False),
    ({"rule": "close", "want": 0.33, "tol": 1e-6}, 0.3300001, True),  # |d| = 1e-7 < 1e-6
    ({"rule": "close", "want": 0.33, "tol": 1e-6}, 0.331, False),
    ({"rule": "close", "want": 1.0, "tol": 0.5, "le": True}, 1.5, True),
    ({"rule": "allclose", "want": [1.0, 2.0], "tol": 0}, [1.0000001, 2.0], True),  # atol 0 with floats: 1e-6
    ({"rule": "allclose", "want": [1.0, 2.0], "tol": 0}, [1.01, 2.0], False),
    ({"rule": "allclose", "want": 5, "tol": 0}, 6, False),
    ({"rule": "eq", "want": 2, "transform": [["len"]]}, 7, False),  # len of an int: the test would have raised
    ({"rule": "seteq", "want": ("a", "b"), "tol": 0}, ["b", "a"], True),  # order ignored
    ({"rule": "seteq", "want": ("a", "b"), "tol": 0}, ["a", "a"], False),
    ({"rule": "seteq", "want": ("a",), "tol": 0}, 5, False),  # not iterable: the test would have raised
    ({"rule": "notnone", "want": True, "tol": 0}, True, True),  # a match (reduced to True in the sandbox)
    ({"rule": "notnone", "want": True, "tol": 0}, False, False),
    ({"rule": "notnone", "want": False, "tol": 0}, False, True),
    ({"rule": "notnone", "want": True, "tol": 0}, 1, False),  # not reduced: not a bool
])
def test_passes_rules_worked_by_hand(rule, got, ok):
    assert passes({"transform": [], **rule}, got) is ok


def _od(*keys):
    return collections.OrderedDict((k, i) for i, k in enumerate(keys))


# one per container type: the value, and one that equals it under == but differs in type or order where the type has
# one (None: the type has neither beyond what == sees)
CONTAINERS = {
    "list": ([3, 1, 2], [1, 2, 3]),
    "tuple": ((3, 1), [3, 1]),
    "set": ({3, 1}, None),
    "frozenset": (frozenset({3, 1}), {3, 1}),
    "dict": ({"b": 1, "a": 2}, None),
    "OrderedDict": (_od("b", "a"), _od("a", "b")),
    "Counter": (collections.Counter({"b": 2, "a": 1}), {"b": 2, "a": 1}),
    "defaultdict": (collections.defaultdict(list, {"b": [1]}), {"b": [1]}),
    "deque": (collections.deque([3, 1], maxlen=4), [3, 1]),
}


def _same(a, b) -> bool:
    """Equal, of one type, in one order (where the type has one), a defaultdict with one factory, a deque with one
    maxlen."""
    if type(a) is not type(b) or a != b:
        return False
    if type(a) in (dict, collections.OrderedDict, collections.Counter, collections.defaultdict):
        return list(a.items()) == list(b.items()) and getattr(a, "default_factory", None) is getattr(
            b, "default_factory", None)
    if type(a) is collections.deque:
        return list(a) == list(b) and a.maxlen == b.maxlen
    return True


def _source(value) -> str:
    if type(value) is collections.defaultdict:
        return f"defaultdict({value.default_factory.__name__}, {dict(value)!r})"
    return repr(value)


@pytest.mark.parametrize("name", list(CONTAINERS))
def test_each_container_crosses_with_its_type_and_order(name):
    """The trusted side's codec and the harness's own (the answer's process, run for real on a call-kind payload)
    both rebuild the value with its type and order; the look-alike (same under a JSON round trip) stays apart."""
    from graft_cli.reward.harness import HARNESS, payload

    value, other = CONTAINERS[name]
    assert _same(decode(encode(value)), value)
    assert json.loads(json.dumps(encode(value))) == encode(value)  # it is JSON
    if other is not None:
        assert not _same(decode(encode(other)), value)
    program = (f"import collections\nfrom collections import OrderedDict, Counter, defaultdict, deque\n"
               f"def f():\n    return {_source(value)}\n")
    spec = {"kind": "call", "inputs": [[]], "fn_name": "f", "rules": [{"rule": "eq"}]}
    rfd, wfd = os.pipe()
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", HARNESS, str(wfd)],
                          input=payload(spec, program, "n", 1000), pass_fds=(wfd,), capture_output=True, timeout=60)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as f:
        line = f.read()
    assert proc.returncode == 0, proc.stderr[-500:]
    got = decode(json.loads(line)["calls"][0]["out"])
    assert _same(got, value), (got, value)


def test_an_ordered_dict_moved_to_its_end_crosses_in_its_own_order():
    """OrderedDict.move_to_end changes the OrderedDict's order but not the order of the dict storage beneath it: the
    value crosses in the OrderedDict's own."""
    od = _od("a", "b", "c")
    od.move_to_end("a")
    assert list(decode(encode(od))) == ["b", "c", "a"] and list(dict.keys(od)) == ["a", "b", "c"]
    assert decode(encode(od)) != _od("a", "b", "c")
