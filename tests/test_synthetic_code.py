"""The synthetic "write a one-line Python function" task (graft_cli/data/synthetic_code.py): deterministic by
seed, every family and level well formed (the examples in the text are the first two tests), short enough for
the tiny models, and graded by the code reward: every reference solution scores 1, another family's scores 0."""

from __future__ import annotations

import json
import random

import pytest

from graft_cli.reward.code_grader import CodeGrader
from graft_cli.reward.programs import parse_spec
from graft_cli.data.synthetic_code import FAMILIES, LEVELS, generate, make_problem, reference_response, write_task


def test_deterministic_by_seed():
    assert generate(20, seed=3) == generate(20, seed=3)
    assert generate(20, seed=3) != generate(20, seed=4)
    assert [r["id"] for r in generate(3, seed=0)] == ["code-0", "code-1", "code-2"]


def test_every_family_and_level_is_well_formed():
    rng = random.Random(0)
    for fam in FAMILIES:
        for lvl in LEVELS:
            rec = make_problem(rng, fam, lvl, f"{fam}-{lvl}")
            spec = parse_spec(rec["answer"])
            assert spec["kind"] == "call" and spec["fn_name"] == "f" and len(spec["inputs"]) == 7
            ex = "; ".join(f"f({', '.join(map(repr, a))}) == {o!r}" for a, o in zip(spec["inputs"][:2],
                                                                                 spec["outputs"][:2]))
            assert f"Examples: {ex}." in rec["problem"]
            assert rec["solution"].startswith("def f(") and "\n" not in rec["solution"]  # one line
            assert len(reference_response(rec)) <= 70 and len(rec["problem"]) <= 230
    with pytest.raises(ValueError, match="unknown family"):
        make_problem(rng, "sort", 1, "x")


def test_hand_worked_problem():
    rec = make_problem(random.Random(0), "arith", 1, "p")
    spec = json.loads(rec["answer"])
    a, b = (int(t) for t in rec["solution"].replace("def f(x): return x * ", "").split(" + "))
    assert spec["outputs"] == [x * a + b for [x] in spec["inputs"]]


def test_reference_solutions_score_1_and_wrong_ones_0(tmp_path):
    recs = [make_problem(random.Random(i), f, lvl, f"{f}{lvl}") for i, (f, lvl) in
            enumerate((f, lvl) for f in FAMILIES for lvl in LEVELS)] + generate(12, seed=1)
    wrong = [recs[(i + 3) % len(recs)]["solution"] for i in range(len(recs))]  # 3 apart: another family
    grader = CodeGrader(num_workers=2, timeout_s=5.0)
    try:
        good = grader.grade([reference_response(r) for r in recs], [r["answer"] for r in recs])
        bad = grader.grade([f"```python\n{w}\n```" for w in wrong[:18]], [r["answer"] for r in recs[:18]])
    finally:
        grader.close()
    assert list(good.rewards) == [1.0] * len(recs), [(r["id"], s) for r, x, s in zip(recs, good.rewards, good.status)
                                                       if x != 1]
    assert list(bad.rewards) == [0.0] * 18
    paths = write_task(str(tmp_path), seed=0, n_train=5, n_eval=3)
    assert [len(open(p).readlines()) for p in (paths["train"], paths["eval_code"])] == [5, 3]
