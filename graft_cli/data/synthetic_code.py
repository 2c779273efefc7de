"""A synthetic, verifiable code task for the tiny models: "write a one-line Python function".

Each problem states a small function in words with two worked examples and asks for a one-line ``def``; its gold
is a ``call`` test spec (graft_cli/reward/programs.py: ``fn_name`` ``f``, argument lists and return values) holding the
two examples and five hidden inputs, so the code reward grades it with the expected values outside the sandbox.
Records are ``{id, problem, answer, solution, family, level}`` (``solution``: the reference one-liner, what SFT
teaches; :func:`reference_response` is the response written around it), deterministic by seed.

Six skill families at three levels, like the arithmetic task's (graft_cli/data/synthetic.py), so a pair of tiny
models can be given complementary blind spots by weighting them in SFT:

==========  =====================================================  ==================================================
family      spec in words (level 1 .. 3)                           reference (examples)
==========  =====================================================  ==================================================
``arith``   x times A plus B (A, B small .. larger, then x*x)      ``def f(x): return x * 3 + 1``
``map``     every element of xs times A / plus A / squared         ``def f(xs): return [v * 3 for v in xs]``
``filter``  the elements of xs greater than / less than / div. by  ``def f(xs): return [v for v in xs if v > 4]``
``string``  s reversed / repeated A times / upper-cased + suffix   ``def f(s): return s[::-1]``
``reduce``  sum / max minus min / sum of squares of xs             ``def f(xs): return sum(xs)``
``cond``    A if x is even else B / x if x > A else B / abs diff   ``def f(x): return 3 if x % 2 == 0 else 5``
==========  =====================================================  ==================================================

Sizes: a reference response is 37-61 characters (``def`` line plus the fence), a prompt 176 on average (at most
~220; 5,000 draws, seed 0): short enough for the ~2M-parameter tiny models to learn by SFT as they learn the
arithmetic task.
"""

from __future__ import annotations

import json
import os
import random

FAMILIES = ("arith", "map", "filter", "string", "reduce", "cond")
LEVELS = (1, 2, 3)
INSTRUCTION = "Answer with the function in a ```python block."
WORDS = ("cat", "sun", "tree", "blue", "code", "moon", "red", "sky", "map", "box", "pen", "leaf")


def _ints(rng: random.Random, n: int, lo: int, hi: int) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def _lists(rng: random.Random, n: int, lo: int = -9, hi: int = 9) -> list[list[int]]:
    return [_ints(rng, rng.randint(1, 3) if i < 2 else rng.randint(0, 5), lo, hi) for i in range(n)]  # short examples


def _arith(rng, level):
    if level == 1:
        a, b = rng.randint(2, 5), rng.randint(1, 9)
        return f"x times {a} plus {b}", f"def f(x): return x * {a} + {b}", [[x] for x in _ints(rng, 7, 0, 9)]
    if level == 2:
        a, b = rng.randint(2, 9), rng.randint(10, 30)
        return f"x times {a} minus {b}", f"def f(x): return x * {a} - {b}", [[x] for x in _ints(rng, 7, -9, 20)]
    a = rng.randint(1, 9)
    return f"x times x plus {a}", f"def f(x): return x * x + {a}", [[x] for x in _ints(rng, 7, -9, 9)]


def _map(rng, level):
    a = rng.randint(2, 9)
    args = [[xs] for xs in _lists(rng, 7)]
    if level == 1:
        return f"the list of every element of xs times {a}", f"def f(xs): return [v * {a} for v in xs]", args
    if level == 2:
        return f"the list of every element of xs plus {a}", f"def f(xs): return [v + {a} for v in xs]", args
    return "the list of the squares of the elements of xs", "def f(xs): return [v * v for v in xs]", args


def _filter(rng, level):
    a = rng.randint(-3, 5)
    args = [[xs] for xs in _lists(rng, 7)]
    if level == 1:
        return f"the elements of xs greater than {a}", f"def f(xs): return [v for v in xs if v > {a}]", args
    if level == 2:
        return f"the elements of xs less than {a}", f"def f(xs): return [v for v in xs if v < {a}]", args
    d = rng.randint(2, 4)
    return f"the elements of xs divisible by {d}", f"def f(xs): return [v for v in xs if v % {d} == 0]", args


def _string(rng, level):
    args = [[rng.choice(WORDS)] for _ in range(7)]
    if level == 1:
        return "s reversed", "def f(s): return s[::-1]", args
    if level == 2:
        a = rng.randint(2, 3)
        return f"s repeated {a} times", f"def f(s): return s * {a}", args
    w = rng.choice(WORDS)
    return f"s in upper case followed by {w}", f"def f(s): return s.upper() + '{w}'", args


def _reduce(rng, level):
    args = [[xs] for xs in _lists(rng, 7)]
    if level == 1:
        return "the sum of the elements of xs", "def f(xs): return sum(xs)", args
    if level == 2:
        args = [[xs or [0]] for xs in _lists(rng, 7)]
        return "the largest element of xs minus the smallest (xs is not empty)", \
            "def f(xs): return max(xs) - min(xs)", args
    return "the sum of the squares of the elements of xs", "def f(xs): return sum(v * v for v in xs)", args


def _cond(rng, level):
    a, b = rng.randint(1, 9), rng.randint(10, 20)
    if level == 1:
        return f"{a} if x is even, else {b}", f"def f(x): return {a} if x % 2 == 0 else {b}", \
            [[x] for x in _ints(rng, 7, 0, 20)]
    if level == 2:
        return f"x if x is greater than {a}, else {b}", f"def f(x): return x if x > {a} else {b}", \
            [[x] for x in _ints(rng, 7, -5, 15)]
    return f"the distance between x and {a}", f"def f(x): return abs(x - {a})", [[x] for x in _ints(rng, 7, -9, 20)]


_MAKERS = {"arith": _arith, "map": _map, "filter": _filter, "string": _string, "reduce": _reduce, "cond": _cond}
_PARAM = {"arith": "x", "map": "xs", "filter": "xs", "string": "s", "reduce": "xs", "cond": "x"}


def _call(args: list) -> str:
    return "f(" + ", ".join(repr(a) for a in args) + ")"


def make_problem(rng: random.Random, family: str, level: int, pid: str) -> dict:
    """One problem of ``family`` at ``level`` (its own draws from ``rng``)."""
    if family not in _MAKERS or level not in LEVELS:
        raise ValueError(f"unknown family/level {family!r}/{level}; families: {', '.join(FAMILIES)}, levels 1-3")
    spec, solution, inputs = _MAKERS[family](rng, level)
    ns: dict = {}
    exec(solution, ns)  # our own reference, not untrusted text
    outputs = [ns["f"](*args) for args in inputs]
    examples = "; ".join(f"{_call(a)} == {o!r}" for a, o in zip(inputs[:2], outputs[:2]))
    problem = (f"Write a one-line Python function f({_PARAM[family]}) that returns {spec}. "
               f"Examples: {examples}. {INSTRUCTION}")
    answer = json.dumps({"fn_name": "f", "inputs": inputs, "outputs": outputs})
    return {"id": pid, "problem": problem, "answer": answer, "solution": solution, "family": family, "level": level}


def generate(n: int, seed: int = 0, families=FAMILIES, weights=None, levels=LEVELS, prefix: str = "code") -> list[dict]:
    """``n`` problems, deterministic by ``seed``: each draws its family (by ``weights``, default uniform) and level
    uniformly, then its constants and inputs."""
    rng = random.Random(f"{prefix}:{seed}")
    fams = list(families)
    out = []
    for i in range(n):
        fam = rng.choices(fams, weights=weights)[0] if weights else rng.choice(fams)
        out.append(make_problem(rng, fam, rng.choice(list(levels)), f"{prefix}-{i}"))
    return out


def reference_response(rec: dict) -> str:
    """The response SFT teaches: the reference one-liner in a python fence."""
    return f"```python\n{rec['solution']}\n```"


def write_task(folder: str, seed: int = 0, n_train: int = 4000, n_eval: int = 300) -> dict:
    """``train.jsonl`` and ``eval_code.jsonl`` (disjoint draws: their own seeds) in ``folder``; returns the paths."""
    os.makedirs(folder, exist_ok=True)
    paths = {}
    for name, n, prefix in (("train", n_train, "code-train"), ("eval_code", n_eval, "code-eval")):
        path = os.path.join(folder, f"{name}.jsonl")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            for rec in generate(n, seed, prefix=prefix):
                f.write(json.dumps(rec) + "\n")
        os.replace(tmp, path)
        paths[name] = path
    return paths
