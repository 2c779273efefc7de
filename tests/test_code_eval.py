"""Code benchmarks in `graft eval` (graft_cli/eval/benchmarks.py, graft_cli/data/code_problems.py, the runner):
resolution of the code names, each dataset's loader on a small fixture in its own layout (tests/fixtures/code:
rows shaped as ``evalplus/humanevalplus``, ``evalplus/mbppplus`` and ``livecodebench/code_generation_lite`` hold
them - LiveCodeBench's private tests pickled, zlib'd and base64'd - with made-up problems), the evaluator on them
with a scripted engine (2 samples: the reference solution, then a wrong one, so pass@1 = 0.5 and
pass@2 = 1 exactly), and `graft eval --benchmarks humaneval` offline on a random model."""

from __future__ import annotations

import base64
import json
import os
import pickle
import zlib

import numpy as np
import pytest
from conftest import ROOT, make_random_model

from graft_cli.data.code_problems import humaneval_problems, lcb_spec, livecodebench_problems, mbppplus_problems
from graft_cli.errors import GraftError
from graft_cli.eval.benchmarks import resolve_benchmarks

FIX = os.path.join(ROOT, "tests", "fixtures", "code")
HEP, MBP, LCB = (os.path.join(FIX, f) for f in ("humanevalplus.jsonl", "mbppplus.jsonl", "livecodebench.jsonl"))


def test_resolve_code_benchmarks(tmp_path):
    he, hep, lcb = resolve_benchmarks("humaneval,humanevalplus,livecodebench")
    assert (he.kind, he.loader, he.source) == ("code", "humaneval", "")  # the package's file
    assert (hep.source, hep.loader) == ("evalplus/humanevalplus:test", "humaneval")
    assert lcb.window == ("2025-02-01", "2025-05-01") and lcb.source == "livecodebench/code_generation_lite"
    (tmp_path / "mbppplus.jsonl").write_text(open(MBP).read())
    mb, lcb2 = resolve_benchmarks("mbppplus,livecodebench", eval_dir=str(tmp_path), lcb_window="2024-01-01..")
    assert mb.source == str(tmp_path / "mbppplus.jsonl") and lcb2.window == ("2024-01-01", "")
    (named,) = resolve_benchmarks(f"livecodebench={LCB}")
    assert named.kind == "code" and named.source == LCB
    with pytest.raises(GraftError, match="START..END"):
        resolve_benchmarks("livecodebench", lcb_window="2025-01-01")
    with pytest.raises(GraftError, match="not a YYYY-MM-DD"):
        resolve_benchmarks("livecodebench", lcb_window="2025..2026")


def test_loaders_on_the_fixtures():
    hep = humaneval_problems(HEP)
    assert [p.id for p in hep] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert hep[0].problem.startswith("Please provide a self-contained Python script") and "def below_zero" in \
        hep[0].problem
    spec = json.loads(hep[0].answer)
    assert spec["entry_point"] == "below_zero" and spec["prompt"].startswith("from typing import List")
    mb = mbppplus_problems(MBP)
    assert [p.id for p in mb] == ["Mbpp/2", "Mbpp/3", "Mbpp/4"]
    want = ["similar_elements_sorted", "is_not_prime", "square_all"]
    assert [json.loads(p.answer)["entry_point"] for p in mb] == want
    assert '"""\nWrite a python function to identify non-prime numbers.\nassert is_not_prime(2) == False\n"""' in \
        mb[1].problem
    lcb = livecodebench_problems(LCB)  # default window: the two 2025 problems, not the 2024 one
    assert [p.id for p in lcb] == ["abc999_a", "3999"]
    io_spec, call_spec = (json.loads(p.answer) for p in lcb)
    assert io_spec == {"inputs": ["1 2\n", "10 -4\n", "0 0\n"], "outputs": ["3\n", "6\n", "0\n"]}  # + private ones
    assert call_spec == {"inputs": [[[3, 4, 5, 2]], [[1, 5, 4, 5]], [[-10, -3, 2]]], "outputs": [20, 25, 30],
                         "fn_name": "maxProduct", "judge": "livecodebench"}
    assert "```python\nclass Solution:" in lcb[1].problem and lcb[0].problem.endswith("then write the Python code.")
    assert [p.id for p in livecodebench_problems(LCB, "..2025-01-01")] == ["abc100_a"]
    with pytest.raises(GraftError, match="no LiveCodeBench problem dated"):
        livecodebench_problems(LCB, "2026-01-01..")


def test_humanevalplus_find_zero_is_graded_with_evalplus_own_check(tmp_path):
    """HumanEval+'s hub test of HumanEval/32 unpacks the returned float (`_poly(*candidate(*inp), inp)`), so every
    answer failed, the reference too; the loader grades it with EvalPlus's find_zero check instead: a root scores
    1, a non-root 0."""
    from graft_cli.reward.code_grader import CodeGrader

    prompt = "import math\n\ndef poly(xs, x):\n    return sum(c * math.pow(x, i) for i, c in enumerate(xs))\n\n" \
             "def find_zero(xs):\n"
    reference = ("    lo, hi = -100.0, 100.0\n    for _ in range(200):\n        mid = (lo + hi) / 2\n"
                 "        if poly(xs, lo) * poly(xs, mid) <= 0:\n            hi = mid\n        else:\n"
                 "            lo = mid\n    return lo\n")
    test = ("import math\n\ndef _poly(xs: list, x: float):\n"
            "    return sum([coeff * math.pow(x, i) for i, coeff in enumerate(xs)])\n\n\n"
            "def check(candidate):\n    inputs = [[[-10, -2]], [[1, 1]], [[-6, 11, -6, 1]]]\n"
            "    results = [-5.0, -1.0, 1.0]\n    for i, (inp, exp) in enumerate(zip(inputs, results)):\n"
            "        assert _poly(*candidate(*inp), inp) <= 0.0001\n")
    path = tmp_path / "hep.jsonl"
    path.write_text(json.dumps({"task_id": "HumanEval/32", "prompt": prompt, "canonical_solution": reference,
                                "entry_point": "find_zero", "test": test}) + "\n")
    (prob,) = humaneval_problems(str(path))
    assert "abs(_poly(*inp, candidate(*inp))) <= 0.0001" in json.loads(prob.answer)["tests"]
    grader = CodeGrader(num_workers=0, timeout_s=10.0)
    try:
        res = grader.grade(["```python\n" + prompt + reference + "```",
                            "```python\n" + prompt + "    return 0.5\n```"], [prob.answer, prob.answer])
    finally:
        grader.close()
    assert list(res.rewards) == [1.0, 0.0], res.status


def test_lcb_private_tests_never_unpickle_a_global():
    evil = base64.b64encode(zlib.compress(pickle.dumps(os.getcwd))).decode()  # a global reference
    with pytest.raises(GraftError, match="unreadable test cases"):
        lcb_spec({"public_test_cases": "[]", "private_test_cases": evil}, "row 0")


def test_missing_fields_are_named(tmp_path):
    bad = tmp_path / "he.jsonl"
    bad.write_text(json.dumps({"task_id": "x", "prompt": "def f():\n"}) + "\n")
    with pytest.raises(GraftError, match="missing field\\(s\\) entry_point, test"):
        humaneval_problems(str(bad))


REF = {  # marker in the problem text -> a correct program and a wrong one
    "below_zero": ("from typing import List\ndef below_zero(ops):\n    b = 0\n    for o in ops:\n        b += o\n"
                   "        if b < 0:\n            return True\n    return False",
                   "def below_zero(ops):\n    return False"),
    "mean_of": ("def mean_of(xs):\n    return sum(xs) / len(xs)", "def mean_of(xs):\n    return 0.0"),
    "count_vowels": ("def count_vowels(s):\n    return sum(c in 'aeiou' for c in s)",
                     "def count_vowels(s):\n    return 1"),
    "shared elements": ("def similar_elements_sorted(a, b):\n    return sorted(set(a) & set(b))",
                        "def similar_elements_sorted(a, b):\n    return []"),
    "non-prime": ("def is_not_prime(n):\n    return n == 1 or any(n % i == 0 for i in range(2, int(n ** 0.5) + 1))",
                  "def is_not_prime(n):\n    return True"),
    "square every": ("def square_all(nums):\n    return [n * n for n in nums]",
                     "def square_all(nums):\n    return nums"),
    "print A+B": ("a, b = map(int, input().split())\nprint(a + b)", "print(3)"),
    "maximum product": ("class Solution:\n    def maxProduct(self, nums):\n        s = sorted(nums)\n"
                        "        return max(s[0] * s[1], s[-1] * s[-2])",
                        "class Solution:\n    def maxProduct(self, nums):\n        return 20"),
}


class _Tok:
    chat_template = None

    def __init__(self):
        self.texts: list[str] = []

    def __call__(self, text, add_special_tokens=False):
        self.texts.append(text)
        return {"input_ids": [len(self.texts) - 1]}


class _Engine:
    """Sample 0 of every prompt: the correct program, fenced; sample 1: the wrong one."""

    def __init__(self, tok):
        self.tok = tok

    def generate(self, prompt_ids, params):
        from graft_cli.batch import Rollouts

        texts = []
        for ids in prompt_ids:
            text = self.tok.texts[ids[0]]
            good, bad = next(v for k, v in REF.items() if k in text)
            texts += [f"Here it is.\n```python\n{good}\n```", f"```python\n{bad}\n```"][: params.n]
        n = len(texts)
        return Rollouts(prompt_ids=prompt_ids, response_ids=[[1]] * n, texts=texts, logprobs=[[0.0]] * n,
                        truncated=[False] * n, n=params.n)


def test_evaluator_scores_code_benchmarks_beside_a_math_one(tmp_path):
    from graft_cli.data.problems import Problem
    from graft_cli.data.prompts import PromptSpec
    from graft_cli.eval.benchmarks import BenchmarkSource
    from graft_cli.schema import RewardConfig
    from graft_cli.eval.setup import EvalSettings, Graders
    from graft_cli.eval.runner import Evaluator

    benches = [(b, b.load()) for b in resolve_benchmarks(f"humanevalplus={HEP},mbppplus={MBP},livecodebench={LCB}")]
    REF["1+1"] = ("\\boxed{2}", "\\boxed{3}")
    math = BenchmarkSource("sums", "sums", "inline")
    benches.append((math, [Problem("s0", "1+1", "2")]))
    tok = _Tok()
    graders = Graders(2, rewards={"code": RewardConfig(name="code", timeout_s=10.0)})
    try:
        Evaluator(_Engine(tok), tok, PromptSpec(chat_template="none"), EvalSettings(runs=1, samples=2), graders) \
            .evaluate(str(tmp_path / "out"), benches)
    finally:
        graders.close()
        REF.pop("1+1")
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    for name in ("humanevalplus", "mbppplus", "livecodebench"):
        b = s["benchmarks"][name]
        assert b["kind"] == "code" and b["runs"] == [0.5] and b["pass@k"]["2"]["mean"] == 1.0, (name, b)
    assert s["average"]["benchmarks"] == ["sums"] and s["average"]["mean"] == 0.5  # the math average
    assert s["code_average"]["benchmarks"] == ["humanevalplus", "mbppplus", "livecodebench"]
    assert s["code_average"]["mean"] == 0.5
    rows = [json.loads(x) for x in open(tmp_path / "out" / "livecodebench_run1.jsonl")]
    assert [(r["problem_id"], r["sample"], r["grade"]) for r in rows] == [("abc999_a", 0, 1.0), ("abc999_a", 1, 0.0),
                                                                         ("3999", 0, 1.0), ("3999", 1, 0.0)]
    assert rows[0]["extracted"] == REF["print A+B"][0] + "\n"  # the program that ran
    assert not tok.texts[0].endswith("\\boxed{}.\n")  # code prompts carry no math suffix


@pytest.mark.slow
def test_eval_humaneval_offline_on_a_random_model(tmp_path):
    import subprocess
    import sys

    random_model = make_random_model(str(tmp_path / "m"))
    out = tmp_path / "he"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "graft_cli.cli", "eval", "--model", random_model, "--benchmarks",
                        "humaneval", "--runs", "1", "--samples", "1", "--max-new-tokens", "4", "--out", str(out),
                        "--no-progress", "--workers", "1"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in open(out / "humaneval_run1.jsonl")]
    assert len(rows) == 164 and {x["problem_id"] for x in rows} == {f"HumanEval/{i}" for i in range(164)}
    s = json.loads((out / "summary.json").read_text())["benchmarks"]["humaneval"]
    assert s["kind"] == "code" and s["num_problems"] == 164
    assert s["runs"] == [np.mean([x["grade"] for x in rows])]
