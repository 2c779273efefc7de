"""The synthetic verifiable math task of the tiny pair (``pair=tiny``).

Why a synthetic task: the real study (3B models on MATH) needs GPUs and a model hub; the default
must still run every method for real on a laptop. This module generates a small arithmetic "world"
whose records look exactly like real data (``{id, problem, answer}`` JSONL, graded by the same
math-verify reward, prompted by the same :class:`~graft_cli.data.prompts.PromptSpec`), so everything
downstream of the problem file is the code path real data takes.

Design choices
--------------
* **Six skill families, three levels each** (:data:`FAMILIES`): ``add`` (carries), ``sub``
  (borrows), ``mul``, ``two`` (two-step expressions: ``a+b+c``, then precedence, then brackets),
  ``lin`` (linear equations) and ``frac`` (fraction arithmetic). Level 1 is single-digit facts,
  which ~3M-parameter models memorise in a minute of SFT; levels 2-3 need multi-digit work, which
  they only partly learn. The level spread is what puts a freshly trained model in the useful RL
  band (some prompts always solved, some sometimes, some never).
* **Short text on both sides.** Problems are bare expressions (``47+38=?``, ``3x+5=26, x=?``,
  ``1/3+1/4=?``) and worked solutions are a one-line chain of equalities ending in ``\\boxed{...}``
  (``4*5=20,3+20=23 \\boxed{23}``; ``26-5=21,21/3=7 \\boxed{7}``; ``4/12+3/12=7/12 \\boxed{7/12}``;
  ``240+42=282 \\boxed{282}`` for ``47*6``). Single-operation problems restate the operation
  (``47+38=85``) — the one step there is — while multi-step ones only write the intermediate
  results. Step time of RL on a CPU is proportional to sequence length, so every character counts;
  the chain still gives the model intermediate results to condition on for the multi-step families
  (``two``, ``lin``, ``frac``, multi-digit ``mul``).
* **Gold answers in MATH style** (integers, ``\\frac{a}{b}`` in lowest terms); reference solutions
  box the unreduced ``a/b`` the chain arrives at, which math-verify grades equal to the gold
  (value comparison). Every reference solution scores 1.0 (tested).
* **Determinism.** All randomness comes from :class:`random.Random` seeded with a string derived
  from ``(seed, split)``; Python hashes string seeds with SHA-512, so files are identical across
  runs, processes and platforms.
* **Five held-out sets standing in for the real benchmarks** (:data:`EVAL_SETS`), with the real
  benchmarks' sizes and a difficulty ordering like theirs: ``math500`` covers everything,
  ``minerva`` and ``amc23`` are mid-level with different family skews, ``aime24``/``aime25`` are the
  hardest levels. Training problems never repeat an evaluation problem (exact-text exclusion;
  level-1 fact spaces are small, so the "held-out" guarantee is per record, as for contaminated real
  data). SFT examples (:func:`sft_example`) are drawn from a separate stream and may overlap
  everything: they play the role of pretraining data.
"""

from __future__ import annotations

import json
import re
import os
import random
from fractions import Fraction

from graft_cli.rundir import atomic_write_text

# ----------------------------------------------------------------------------------------------------
# Problem generators: (rng, level) -> (problem, gold answer, worked solution)


def _frac_gold(f: Fraction) -> str:
    if f.denominator == 1:
        return str(f.numerator)
    return f"\\frac{{{f.numerator}}}{{{f.denominator}}}"


def _worked(*steps: tuple[str, str], ans: str, detail: tuple | None = None):
    """A worked solution as data: its steps ``(expression, value)`` in order, the boxed answer, and
    optionally the same computation in smaller steps (``detail``: partial products, a fraction's
    numerator and denominator one multiplication at a time); a style (:data:`STYLES`) renders it as
    text (the v3 styles the detailed steps)."""
    return tuple(steps), ans, (tuple(detail) if detail else None)


def gen_add(rng: random.Random, level: int):
    if level == 1:
        a, b = rng.randint(0, 9), rng.randint(0, 9)
    elif level == 2:
        a, b = rng.randint(10, 99), rng.randint(1, 9)
    else:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
    c = a + b
    return f"{a}+{b}=?", str(c), _worked((f"{a}+{b}", f"{c}"), ans=str(c))


def gen_sub(rng: random.Random, level: int):
    if level == 1:
        a = rng.randint(1, 18)
        b = rng.randint(max(0, a - 9), min(9, a))
    elif level == 2:
        a, b = rng.randint(10, 99), rng.randint(1, 9)
    else:
        a = rng.randint(20, 99)
        b = rng.randint(10, a)
    c = a - b
    return f"{a}-{b}=?", str(c), _worked((f"{a}-{b}", f"{c}"), ans=str(c))


def gen_mul(rng: random.Random, level: int):
    if level == 1:
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        return f"{a}*{b}=?", str(a * b), _worked((f"{a}*{b}", f"{a * b}"), ans=str(a * b))
    if level == 2:
        a, b = rng.randint(11, 19), rng.randint(2, 9)
    else:
        a, b = rng.randint(21, 99), rng.randint(2, 9)
    t, u = a - a % 10, a % 10
    c = a * b
    # partial products: 47*6 -> 240+42=282 (detailed: 40*6=240, 7*6=42, 240+42=282)
    if not u:
        return f"{a}*{b}=?", str(c), _worked((f"{a}*{b}", f"{c}"), ans=str(c))
    return f"{a}*{b}=?", str(c), _worked((f"{t * b}+{u * b}", f"{c}"), ans=str(c),
                                         detail=((f"{t}*{b}", f"{t * b}"), (f"{u}*{b}", f"{u * b}"),
                                                 (f"{t * b}+{u * b}", f"{c}")))


def gen_two(rng: random.Random, level: int):
    if level == 1:  # a+b+c, every step a single-digit fact
        a = rng.randint(1, 8)
        b = rng.randint(1, 9 - a)
        c = rng.randint(1, 9)
        s = a + b
        return f"{a}+{b}+{c}=?", str(s + c), _worked((f"{a}+{b}", f"{s}"), (f"{s}+{c}", f"{s + c}"), ans=str(s + c))
    a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 9)
    if level == 2:  # c+a*b or a*b-c (precedence)
        p = a * b
        if rng.random() < 0.5:
            return f"{c}+{a}*{b}=?", str(c + p), _worked((f"{a}*{b}", f"{p}"), (f"{c}+{p}", f"{c + p}"), ans=str(c + p))
        return f"{a}*{b}-{c}=?", str(p - c), _worked((f"{a}*{b}", f"{p}"), (f"{p}-{c}", f"{p - c}"), ans=str(p - c))
    # level 3: brackets (a+c)*b
    s = a + c
    return f"({a}+{c})*{b}=?", str(s * b), _worked((f"{a}+{c}", f"{s}"), (f"{s}*{b}", f"{s * b}"), ans=str(s * b))


def gen_lin(rng: random.Random, level: int):
    x = rng.randint(1, 9)
    if level == 1:  # x+a=b
        a = rng.randint(1, 9)
        b = x + a
        return f"x+{a}={b}, x=?", str(x), _worked((f"{b}-{a}", f"{x}"), ans=str(x))
    if level == 2:  # ax=b
        a = rng.randint(2, 9)
        b = a * x
        return f"{a}x={b}, x=?", str(x), _worked((f"{b}/{a}", f"{x}"), ans=str(x))
    a, c = rng.randint(2, 9), rng.randint(1, 9)  # ax+c=d
    d = a * x + c
    return f"{a}x+{c}={d}, x=?", str(x), _worked((f"{d}-{c}", f"{a * x}"), (f"{a * x}/{a}", f"{x}"), ans=str(x))


def gen_frac(rng: random.Random, level: int):
    if level == 1:  # same denominator
        d = rng.randint(3, 9)
        a = rng.randint(1, d - 2)
        b = rng.randint(1, d - 1 - a)
        f = Fraction(a + b, d)
        return f"{a}/{d}+{b}/{d}=?", _frac_gold(f), _worked((f"{a}/{d}+{b}/{d}", f"{a + b}/{d}"), ans=f"{a + b}/{d}",
                                                            detail=((f"{a}+{b}", f"{a + b}"),))
    if level == 2:  # fraction times integer
        d = rng.randint(2, 9)
        a = rng.randint(1, d - 1)
        k = rng.randint(2, 9)
        f = Fraction(a * k, d)
        return f"{a}/{d}*{k}=?", _frac_gold(f), _worked((f"{a}/{d}*{k}", f"{a * k}/{d}"), ans=f"{a * k}/{d}",
                                                        detail=((f"{a}*{k}", f"{a * k}"),))
    # level 3: different denominators, cross multiplication
    b, d = rng.sample(range(2, 10), 2)
    a, c = rng.randint(1, b - 1), rng.randint(1, d - 1)
    n, m = a * d + c * b, b * d
    f = Fraction(n, m)
    return (f"{a}/{b}+{c}/{d}=?", _frac_gold(f),
            _worked((f"{a * d}/{m}+{c * b}/{m}", f"{n}/{m}"), ans=f"{n}/{m}",
                    detail=((f"{b}*{d}", f"{m}"), (f"{a}*{d}", f"{a * d}"), (f"{c}*{b}", f"{c * b}"),
                            (f"{a * d}+{c * b}", f"{n}"))))


FAMILIES = {"add": gen_add, "sub": gen_sub, "mul": gen_mul, "two": gen_two, "lin": gen_lin, "frac": gen_frac}
LEVELS = (1, 2, 3)

# The RL training distribution: every family equally, levels 1-3 equally.
TRAIN_MIX = {"families": {f: 1.0 for f in FAMILIES}, "levels": {1: 1.0, 2: 1.0, 3: 1.0}}
TRAIN_SIZE = 8192

# Held-out stand-ins for the five real benchmarks: (size, family weights, level weights).
EVAL_SETS = {
    "math500": (500, {f: 1.0 for f in FAMILIES}, {1: 1.0, 2: 1.0, 3: 1.0}),
    "aime24": (30, {"mul": 1.0, "two": 1.0, "lin": 1.0, "frac": 1.0, "add": 0.5, "sub": 0.5}, {3: 1.0}),
    "aime25": (30, {"frac": 1.0, "lin": 1.0, "add": 1.0, "sub": 1.0, "mul": 0.5, "two": 0.5}, {3: 1.0}),
    "amc23": (40, {f: 1.0 for f in FAMILIES}, {2: 1.0, 3: 1.0}),
    "minerva": (272, {"two": 1.5, "lin": 1.5, "frac": 1.0, "mul": 1.0, "add": 0.5, "sub": 0.5}, {1: 1.0, 2: 2.0}),
}
BENCHMARK_NAMES = {"math500": "MATH500", "aime24": "AIME24", "aime25": "AIME25", "amc23": "AMC23",
                   "minerva": "Minerva"}


def _pick(rng: random.Random, weights: dict):
    keys = list(weights)
    return rng.choices(keys, weights=[weights[k] for k in keys], k=1)[0]


# ----------------------------------------------------------------------------------------------------
# Solution styles: how a model writes the same worked solution (tiny pair v3: each model is trained mostly on its
# own style, a little on its peer's, so a peer's response is foreign in *form* as real heterogeneous pairs' are)


def restate(problem: str) -> str:
    """The problem's expression without its question: ``7*6-9=?`` -> ``7*6-9``, ``3x+5=26, x=?`` ->
    ``3x+5=26``. Every v3 style opens with it: tokens both models copy from the prompt at almost no
    cost, as most tokens of a real response are (the per-token mean of the gate's s is over the
    whole response)."""
    return problem.split(", x=?")[0].removesuffix("=?")


def style_chain(head: str, steps, ans: str) -> str:
    """The tiny pair v2's writing (both models) and the records' ``solution``: left-to-right
    equalities, no spaces, comma-separated, no restated problem: ``7*6=42,42-9=33 \\boxed{33}``."""
    return ",".join(f"{e}={v}" for e, v in steps) + f" \\boxed{{{ans}}}"


def op_word(expr: str) -> str:
    """The operation a worked step performs, as a word, read off its expression (so both models can
    predict it from the text before it): ``add`` if it has ``+``, else ``subtract`` for a ``-``
    after the first character, else ``multiply`` for ``*``, else ``divide``: ``7*6`` -> multiply,
    ``240+42`` -> add, ``26-5`` -> subtract, ``21/3`` -> divide, ``4/6+3/6`` -> add, ``1/3*4`` ->
    multiply."""
    if "+" in expr:
        return "add"
    if "-" in expr[1:]:
        return "subtract"
    if "*" in expr:
        return "multiply"
    return "divide"


def style_prose(head: str, steps, ans: str) -> str:
    """``a``'s style (recipes v3 and later), sentences as a Qwen-like model writes them: ``To find
    7*6-9, multiply first: 7*6=42. Then subtract: 42-9=33. The answer is \\boxed{33}.`` One step:
    ``To find 47+38, add: 47+38=85. The answer is \\boxed{85}.`` Every word is predictable from the
    problem (the restated expression, the operation words of :func:`op_word`), so most tokens of a
    response cost either model little, as most tokens of a real response do, while the arithmetic is
    written in the same local context as :func:`style_steps` (the expression, ``=``, the digits)."""
    (e1, v1), rest = steps[0], steps[1:]
    first = f"{op_word(e1)} first" if rest else op_word(e1)
    text = f"To find {head}, {first}: {e1}={v1}."
    for e, v in rest:
        text += f" Then {op_word(e)}: {e}={v}."
    return text + f" The answer is \\boxed{{{ans}}}."


def style_steps(head: str, steps, ans: str) -> str:
    """``b``'s style in the v3 recipe, a Llama-like chain of clauses: ``Let's compute 7*6-9 step by
    step; multiply 7*6=42; subtract 42-9=33; so the final answer is \\boxed{33}``. The same steps
    and operation words as :func:`style_prose`, in other connectives (where a real pair's writing
    differs)."""
    text = f"Let's compute {head} step by step"
    for e, v in steps:
        text += f"; {op_word(e)} {e}={v}"
    return text + f"; so the final answer is \\boxed{{{ans}}}"


def style_words(head: str, steps, ans: str) -> str:
    """``c``'s style (pair=tiny3): ``is`` for equality, a closing word:
    ``7*6-9: 7*6 is 42, 42-9 is 33, answer \\boxed{33}``."""
    return f"{head}: " + ", ".join(f"{e} is {v}" for e, v in steps) + f", answer \\boxed{{{ans}}}"


STYLES = {"chain": style_chain, "prose": style_prose, "steps": style_steps, "words": style_words}
CANONICAL_STYLE = "chain"  # the records' ``solution`` field (v2's text)
# styles that write the detailed steps where a solution has them (v3's: a peer whose plan the
# receiver lacks still writes steps the receiver can follow, one known operation at a time, as real
# worked solutions do)
DETAILED_STYLES = frozenset({"prose", "steps", "words"})


def render(worked, style: str = CANONICAL_STYLE) -> str:
    """The text of a worked solution ``(problem, steps, answer[, detail])`` in ``style``
    (:data:`STYLES`): the detailed steps for :data:`DETAILED_STYLES` where there are some, the
    compact ones otherwise."""
    problem, steps, ans = worked[:3]
    detail = worked[3] if len(worked) > 3 else None
    return STYLES[style](restate(problem), detail if detail and style in DETAILED_STYLES else steps, ans)


def make_problem(rng: random.Random, family: str, level: int, style: str = CANONICAL_STYLE) -> dict:
    """One problem of ``family`` at ``level`` as a record without ``id``; ``solution`` is written in
    ``style`` and ``worked`` holds the solution as data (steps, answer) for other styles."""
    problem, answer, (steps, ans, detail) = FAMILIES[family](rng, level)
    worked = (problem, steps, ans, detail)
    return {"problem": problem, "answer": answer, "solution": render(worked, style), "family": family,
            "level": level, "worked": worked}


def sample_problem(rng: random.Random, families: dict | None = None, levels: dict | None = None) -> dict:
    """A problem whose family/level are drawn from weight dicts (defaults: the training mix)."""
    fam = _pick(rng, families or TRAIN_MIX["families"])
    lvl = _pick(rng, levels or TRAIN_MIX["levels"])
    return make_problem(rng, fam, int(lvl))


def _slip_value(value: str, delta: int) -> str:
    """``value`` (an integer ``42`` or an unreduced fraction ``7/12``) with its integer (the
    numerator) moved by ``delta``, kept >= 1 for a numerator and >= 0 for an integer (a slip away
    from the wall instead)."""
    num, sep, den = value.partition("/")
    n = int(num) + delta
    floor = 1 if sep else 0
    if n < floor:
        n = int(num) - delta
    return f"{n}{sep}{den}"


def slip(worked, delta: int):
    """The worked solution ``(problem, steps, answer, detail)`` with a *slip* in its last
    computation: the last step's result (in the compact and the detailed steps) and the boxed answer
    off by ``delta`` in the units (a fraction's numerator), the rest of the solution unchanged. The
    solution reads as fluently as a correct one and grades 0. The tiny pair (recipes v4 and later)
    trains on a share of slipped solutions so a base model makes *stochastic* final-step errors, the
    kind RL with a verifiable reward removes (pass@k well above pass@1 at the evaluation
    temperature), where an SFT-only model's errors are systematic."""
    problem, steps, ans, detail = (tuple(worked) + (None,))[:4]
    new_ans = _slip_value(ans, delta)

    def fix(chain):
        if not chain:
            return chain
        (e, v), head = chain[-1], tuple(chain[:-1])
        if v == ans:
            v = new_ans
        elif "/" in ans and v == ans.partition("/")[0]:  # a fraction's detail ends at its numerator
            v = new_ans.partition("/")[0]
        else:
            raise ValueError(f"slip: the last step {e}={v} is not the answer {ans} of {problem}")
        return head + ((e, v),)

    return problem, fix(steps), new_ans, fix(detail)


def sft_example(rng: random.Random, families: dict, levels: dict | None = None,
                styles: dict | None = None, slip_rate: float = 0.0) -> tuple[str, str]:
    """``(problem, worked solution)`` for supervised pretraining; ``families`` weights define the
    model's skill mix (this is where the pair's complementarity comes from) and ``styles`` (style ->
    weight, default the canonical style only) how the solution is written. With one style no extra
    random draw is made, so a single-style stream is the stream of v2. ``slip_rate`` > 0: that share
    of solutions carry a :func:`slip` (+1 or -1 with equal odds); 0 makes no draw (the v2/v3
    streams)."""
    rec = sample_problem(rng, families, levels)
    if not styles or len(styles) == 1:
        style = next(iter(styles)) if styles else CANONICAL_STYLE
    else:
        style = _pick(rng, styles)
    worked = rec["worked"]
    if slip_rate > 0 and rng.random() < slip_rate:
        worked = slip(worked, rng.choice((-1, 1)))
    return rec["problem"], render(worked, style)


def _rng(seed: int, split: str) -> random.Random:
    return random.Random(f"graft-tiny:{seed}:{split}")


def generate_split(name: str, size: int, families: dict, levels: dict, seed: int,
                   exclude: set | None = None, unique: bool = True) -> list[dict]:
    """``size`` records for split ``name``; problems in ``exclude`` are skipped, duplicates within
    the split too when ``unique`` (cells whose space is exhausted just stop contributing)."""
    rng = _rng(seed, name)
    seen = set(exclude or ())
    out: list[dict] = []
    tries = 0
    while len(out) < size:
        tries += 1
        if tries > 200 * size:
            raise RuntimeError(f"synthetic split {name}: cannot draw {size} distinct problems")
        rec = sample_problem(rng, families, levels)
        if rec["problem"] in seen:
            continue
        if unique:
            seen.add(rec["problem"])
        rec.pop("worked")
        out.append({"id": f"tiny-{name}-{len(out):05d}", **rec})
    return out


def build_task(seed: int = 0, train_size: int = TRAIN_SIZE) -> dict[str, list[dict]]:
    """All splits in memory: ``train`` plus ``eval_<name>`` for each of :data:`EVAL_SETS`."""
    splits: dict[str, list[dict]] = {}
    held: set = set()
    for name, (size, fams, lvls) in EVAL_SETS.items():
        recs = generate_split(name, size, fams, lvls, seed, unique=True)
        splits[f"eval_{name}"] = recs
        held.update(r["problem"] for r in recs)
    # Training problems may repeat each other (small level-1 spaces) but never an eval problem.
    splits["train"] = generate_split("train", train_size, TRAIN_MIX["families"], TRAIN_MIX["levels"], seed,
                                     exclude=held, unique=False)
    return splits


def write_task(out_dir: str, seed: int = 0, train_size: int = TRAIN_SIZE) -> dict[str, str]:
    """Write ``train.jsonl`` and ``eval_{math500,aime24,aime25,amc23,minerva}.jsonl`` into
    ``out_dir``; returns split name -> path. Same seed, same bytes."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for name, recs in build_task(seed, train_size).items():
        path = os.path.join(out_dir, f"{name}.jsonl")
        atomic_write_text(path, "".join(json.dumps(r, sort_keys=False) + "\n" for r in recs))
        paths[name] = path
    return paths


def corpus(seed: int = 0, size: int = 4000, style=CANONICAL_STYLE) -> list[tuple[str, str]]:
    """A sample of ``(problem, solution)`` pairs over all families and levels, solutions in
    ``style`` (a name), or in one of ``style`` (a list of names) drawn uniformly per example
    (tokenizer training: a v2 tokenizer learns its own model's writing, a v3 tokenizer general text
    covering every model's). One style makes no extra random draw."""
    rng = _rng(seed, "corpus")
    styles = [style] if isinstance(style, str) else list(style)
    out = []
    for _ in range(size):
        r = sample_problem(rng, {f: 1.0 for f in FAMILIES}, {lv: 1.0 for lv in LEVELS})
        st = styles[0] if len(styles) == 1 else rng.choice(styles)
        out.append((r["problem"], render(r["worked"], st)))
    return out


__all__ = ["FAMILIES", "LEVELS", "STYLES", "CANONICAL_STYLE", "render", "slip",
           "TRAIN_MIX", "EVAL_SETS", "BENCHMARK_NAMES", "make_problem", "sample_problem",
           "sft_example", "generate_split", "build_task", "write_task", "corpus", "worked_from_problem",
           "family_of", "gold_solution"]


# ----------------------------------------------------------------------------------------------------
# The worked solution of a problem, read back from its text (gold content in any style; a problem's family)

_INT = r"(\d+)"
_PATTERNS = (  # (family, level, regex over the problem text); the first match wins
    ("two", 3, rf"\({_INT}\+{_INT}\)\*{_INT}=\?"),
    ("two", 2, rf"{_INT}\+{_INT}\*{_INT}=\?"),
    ("two", 2, rf"{_INT}\*{_INT}-{_INT}=\?"),
    ("two", 1, rf"{_INT}\+{_INT}\+{_INT}=\?"),
    ("lin", 1, rf"x\+{_INT}={_INT}, x=\?"),
    ("lin", 2, rf"{_INT}x={_INT}, x=\?"),
    ("lin", 3, rf"{_INT}x\+{_INT}={_INT}, x=\?"),
    ("frac", 3, rf"{_INT}/{_INT}\+{_INT}/{_INT}=\?"),
    ("frac", 2, rf"{_INT}/{_INT}\*{_INT}=\?"),
    ("add", 0, rf"{_INT}\+{_INT}=\?"),
    ("sub", 0, rf"{_INT}-{_INT}=\?"),
    ("mul", 0, rf"{_INT}\*{_INT}=\?"),
)


class _Replay(random.Random):
    """A :class:`random.Random` that returns given integers in order from ``randint`` and
    ``sample`` and a given number from ``random``: it replays a generator's draws, so a problem's
    worked solution is rebuilt by the very generator that made it (no second copy of its
    arithmetic)."""

    def __init__(self, ints: list[int], coin: float = 0.0):
        super().__init__(0)
        self._ints, self._coin = list(ints), coin

    def randint(self, a, b):  # noqa: D102
        return self._ints.pop(0)

    def sample(self, population, k, **kw):  # noqa: D102
        return [self._ints.pop(0) for _ in range(k)]

    def random(self):  # noqa: D102
        return self._coin


def _draws(family: str, level: int, nums: list[int], problem: str) -> tuple[list[int], float, int]:
    """The generator's draws (in its order), its coin and level that give ``problem``."""
    if family == "two" and level == 3:  # (a+c)*b: draws a, b, c
        a, c, b = nums
        return [a, b, c], 0.0, 3
    if family == "two" and level == 2:
        if "+" in problem:  # c+a*b: draws a, b, c; coin < 0.5
            c, a, b = nums
            return [a, b, c], 0.0, 2
        a, b, c = nums  # a*b-c: coin >= 0.5
        return [a, b, c], 0.9, 2
    if family == "two":  # a+b+c
        return list(nums), 0.0, 1
    if family == "lin":
        if level == 1:  # x+a=b: draws x, a
            a, b = nums
            return [b - a, a], 0.0, 1
        if level == 2:  # ax=b: draws x, a
            a, b = nums
            return [b // a, a], 0.0, 2
        a, c, d = nums  # ax+c=d: draws x, a, c
        return [(d - c) // a, a, c], 0.0, 3
    if family == "frac":
        if level == 3:  # a/b+c/d: sample(b, d), then a, c
            a, b, c, d = nums
            return [b, d, a, c], 0.0, 3
        a, d, k = nums  # a/d*k: draws d, a, k
        return [d, a, k], 0.0, 2
    if family == "mul":
        a, b = nums
        return [a, b], 0.0, (1 if a < 10 else 2 if a < 20 else 3)
    a, b = nums  # add, sub: the level only picks the ranges; a single-step solution reads the same
    return [a, b], 0.0, (1 if a < 10 else 2)


def _frac_level1(problem: str):
    m = re.fullmatch(rf"{_INT}/{_INT}\+{_INT}/{_INT}=\?", problem)
    if m and m.group(2) == m.group(4):
        a, d, b = int(m.group(1)), int(m.group(2)), int(m.group(3))
        return [d, a, b]
    return None


def worked_from_problem(problem: str) -> tuple[str, tuple, tuple]:
    """``(family, worked, gold)`` of a tiny-task problem from its text alone: its family, its worked
    solution ``(problem, steps, answer, detail)`` as :func:`make_problem` holds it (render it in any
    style with :func:`render`) and its gold answer. The problem's numbers are replayed through the
    family's generator (:class:`_Replay`), so the solution is the one the generator wrote. A text no
    generator writes is a ValueError."""
    draws = _frac_level1(problem)
    if draws is not None:
        family, level, coin = "frac", 1, 0.0
    else:
        for family, level, pat in _PATTERNS:
            m = re.fullmatch(pat, problem)
            if m:
                draws, coin, level = _draws(family, level, [int(g) for g in m.groups()], problem)
                break
        else:
            raise ValueError(f"not a tiny-task problem: {problem!r}")
    made, gold, (steps, ans, detail) = FAMILIES[family](_Replay(draws, coin), level)
    if made != problem:
        raise ValueError(f"not a tiny-task problem: {problem!r} (its numbers make {made!r})")
    return family, (problem, steps, ans, detail), gold


def family_of(problem: str) -> str | None:
    """The tiny-task family of ``problem`` (:data:`FAMILIES`), None for any other text."""
    try:
        return worked_from_problem(problem)[0]
    except ValueError:
        return None


def gold_solution(problem: str, style: str) -> str:
    """The gold worked solution of ``problem`` written in ``style`` (:data:`STYLES`)."""
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}; styles: {', '.join(STYLES)}")
    return render(worked_from_problem(problem)[1], style)
