"""HumanEval+ and MBPP+ as EvalPlus ships and grades them (graft_cli/data/evalplus_files.py,
graft_cli/reward/evalplus.py).

* EvalPlus's comparison and special oracles (its ``unsafe_execute`` loop) against values worked by hand; its time
  limits; MBPP+'s input deserialisation; reading a release file and finding it (override variables, the eval data
  directory, one line when it is missing);
* the fixtures (three tasks of each release file, cut to a few inputs) end to end through the sandbox: the
  references score 1 on base and plus, wrong answers 0, an answer right on the base inputs only gets base 1 and
  reward 0, prints are swallowed, a second load reads the cached expected outputs back;
* slow: every reference of a slice of the real files (``../shared/data/evalplus``, skipped without it), an answer
  over its time limit, and agreement with EvalPlus's own evaluator on mutated answers of a slice
  (benchmarks/evalplus_agreement.py; skipped without the ``evalplus`` package).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import shutil

import pytest

from graft_cli.data.evalplus_files import evalplus_problems, mbpp_deserialize_inputs, read_release, release_path
from graft_cli.errors import GraftError
from graft_cli.reward.code_grader import CodeGrader
from graft_cli.reward.evalplus import check_output, group_timeout, judge, time_limits

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "fixtures", "evalplus")
SHARED = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "data", "evalplus"))
HE_TINY, MB_TINY = os.path.join(FIX, "humanevalplus_tiny.jsonl"), os.path.join(FIX, "mbppplus_tiny.jsonl")


# --------------------------------------------------------------------------------------------- the rules
@pytest.mark.parametrize("dataset,entry,inp,out,exp,atol,want", [
    ("humaneval", "add", [1, 2], 3, 3, 0, (True, 0)),
    ("humaneval", "f", [0], 0.1 + 0.2, 0.3, 0, (True, 1e-6)),  # a float expected value: atol 1e-6 from here on
    ("humaneval", "f", [0], 0.3001, 0.3, 0, (False, 1e-6)),
    ("humaneval", "f", [0], 3, 3.0, 0, (True, 1e-6)),  # 3 == 3.0: an exact match, whatever the types
    ("humaneval", "f", [0], 3, 3.1, 0.5, (False, 0.5)),  # within atol, but an int against a float
    ("humaneval", "f", [0], (0.1, 0.2), [0.1, 0.2], 1e-6, (False, 1e-6)),  # a tuple against a list
    ("humaneval", "f", [0], [0.1, 0.2 + 1e-9], [0.1, 0.2], 0, (True, 1e-6)),
    ("humaneval", "f", [0], [0.1], [0.1, 0.2], 0, (False, 1e-6)),  # lengths differ
    ("humaneval", "find_zero", [[-10, -2]], -5.0, 123.0, 1e-4, (True, 1e-4)),  # -10 - 2x = 0 at -5
    ("humaneval", "find_zero", [[-10, -2]], -4.9, -5.0, 1e-4, (False, 1e-4)),  # |-10 + 9.8| = 0.2
    ("mbpp", "similar_elements", [(1, 2), (2, 1)], (2, 1), (1, 2), 0, (True, 0)),  # a set comparison
    ("mbpp", "similar_elements", [(1, 2), (2, 3)], (2, 3), (2,), 0, (False, 0)),
    ("mbpp", "sum_div", [8], 0, 7, 0, (True, 0)),  # Mbpp/295 (v0.1.0): 0 also passes
    ("mbpp", "sum_div", [8], 6, 7, 0, (False, 0)),
    ("mbpp", "are_equivalent", [1, 2], "anything", True, 0, (True, 0)),  # Mbpp/164 (v0.1.0): any output
    ("mbpp", "text_match_three", ["abbb"], False, True, 0, (False, 0)),  # a bool is compared as it is
    ("mbpp", "surface_Area", [3, 4], 35, 33, 0, (True, 0)),  # round(9 + 2 * 3 * sqrt(18.25)) = 35
    ("mbpp", "digit_distance_nums", [123, 256], 7, 99, 0, (True, 0)),  # |1-2| + |2-5| + |3-6|
    ("mbpp", "f", [0], [1, 2], (1, 2), 0, (False, 0)),  # no set rule elsewhere
])
def test_check_output(dataset, entry, inp, out, exp, atol, want):
    assert check_output(dataset, entry, inp, out, exp, atol) == want


def test_judge_carries_the_tolerance_and_stops_at_the_first_failure():
    calls = [{"out": 0.5}, {"out": [1, 2.5000001]}]
    assert judge("humaneval", "f", [[0], [1]], calls, [0.5, [1, 2.5]], 0) == (True, "passed")
    # alone, [1, 2.5] is not floats (an int in it): no tolerance, the exact comparison fails
    assert judge("humaneval", "f", [[1]], calls[1:], [[1, 2.5]], 0) == (False, "wrong output (input 0)")
    assert judge("humaneval", "f", [[0], [1]], [{"error": "TimeoutException"}], [1, 2], 0)[1] == \
        "TimeoutException (input 0)"
    assert judge("humaneval", "f", [[0], [1]], [{"out": 1}], [1, 2], 0) == (False, "no result for input 1")


def test_time_limits_as_evalplus_sets_them():
    assert time_limits([1e-6, 0.5, 0.25]) == [1.0, 2.0, 1.0]  # max(1.0, 4.0 * reference time)
    assert group_timeout([1.0, 2.0]) == 5.0  # min(60, 3) + 2
    assert group_timeout([1.0] * 100) == 62.0  # the per-task cap


def test_mbpp_inputs_deserialised_as_evalplus_does():
    assert mbpp_deserialize_inputs("Mbpp/2", [[[3, 4], [5]]]) == [[(3, 4), (5,)]]
    assert mbpp_deserialize_inputs("Mbpp/124", [["0", "1j"]]) == [(0.0, 1j)]
    assert mbpp_deserialize_inputs("Mbpp/722", [[{"a": [1, 2]}, 3]]) == [[{"a": (1, 2)}, 3]]
    assert mbpp_deserialize_inputs("Mbpp/580", [[[1, [2, 3]]]]) == [((1, (2, 3)),)]
    assert mbpp_deserialize_inputs("Mbpp/3", [[[1, 2]]]) == [[[1, 2]]]  # not listed: as stored


# ------------------------------------------------------------------------------------------- the files
def test_read_release_jsonl_and_gz(tmp_path):
    rows = read_release(MB_TINY, "mbpp")
    assert [r["task_id"] for r in rows] == ["Mbpp/2", "Mbpp/124", "Mbpp/787"]
    assert rows[0]["base_input"][0] == [(3, 4, 5, 6), (5, 7, 4, 10)] and rows[1]["base_input"][0] == (0.0, 1j)
    gz = tmp_path / "m.jsonl.gz"
    with open(MB_TINY, "rb") as f, gzip.open(gz, "wb") as g:
        g.write(f.read())
    assert read_release(str(gz), "mbpp") == rows
    he = read_release(HE_TINY, "humaneval")
    assert he[0]["base_input"] == [[3.5], [1.33], [123.456]]


def test_read_release_bad_row_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    row = json.loads(open(HE_TINY).readline())
    del row["plus_input"]
    bad.write_text(open(HE_TINY).readline() + json.dumps(row) + "\n")
    with pytest.raises(GraftError, match=r"bad.jsonl:2: missing field\(s\) plus_input"):
        read_release(str(bad), "humaneval")


def test_release_path_override_eval_dir_and_missing(tmp_path, monkeypatch):
    monkeypatch.delenv("HUMANEVAL_OVERRIDE_PATH", raising=False)
    with pytest.raises(GraftError) as e:
        release_path("humaneval_plus", None)
    msg = str(e.value)
    assert "\n" not in msg and "HUMANEVAL_OVERRIDE_PATH" in msg and "HumanEvalPlus-v0.1.10.jsonl.gz" in msg \
        and "eval.data_dir" in msg and "humanevalplus_release" in msg
    shutil.copy(HE_TINY, tmp_path / "HumanEvalPlus-v0.1.10.jsonl")  # the decompressed name also counts
    assert release_path("humaneval_plus", str(tmp_path)) == str(tmp_path / "HumanEvalPlus-v0.1.10.jsonl")
    monkeypatch.setenv("HUMANEVAL_OVERRIDE_PATH", HE_TINY)
    assert release_path("humaneval_plus", str(tmp_path)) == HE_TINY  # EvalPlus's variable first
    monkeypatch.setenv("MBPP_OVERRIDE_PATH", str(tmp_path / "none.jsonl"))
    with pytest.raises(GraftError, match="MBPP_OVERRIDE_PATH=.*none.jsonl: file not found"):
        release_path("mbpp_plus", None)


def test_benchmarks_resolve_by_name(monkeypatch):
    from graft_cli.eval.benchmarks import resolve_benchmarks

    monkeypatch.setenv("MBPP_OVERRIDE_PATH", MB_TINY)
    src, = resolve_benchmarks("mbpp_plus")
    assert (src.name, src.kind, src.loader, src.source) == ("mbpp_plus", "code", "evalplus", MB_TINY)
    src, = resolve_benchmarks(f"humaneval_plus={HE_TINY}")
    assert src.source == HE_TINY and src.loader == "evalplus"


# --------------------------------------------------------------------------------------- end to end
def _fenced(code: str) -> str:
    return "```python\n" + code + "\n```"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAFT_EVALPLUS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_humaneval_fixture_end_to_end(cache, monkeypatch):
    probs = {p.id: p for p in evalplus_problems(HE_TINY, "humaneval", num_workers=0)}
    rows = {r["task_id"]: r for r in read_release(HE_TINY, "humaneval")}
    assert len(os.listdir(cache)) == 1  # <sha256>.json.gz
    add = rows["HumanEval/53"]["prompt"]
    answers = [(tid, _fenced(r["prompt"] + r["canonical_solution"]), 1.0, 1.0) for tid, r in rows.items()]
    answers += [
        ("HumanEval/53", _fenced(add + "    return x - y\n"), 0.0, 0.0),
        ("HumanEval/53", _fenced(add + "    return abs(x) + abs(y)\n"), 1.0, 0.0),  # the base inputs are >= 0
        ("HumanEval/53", _fenced(add + "    print('x' * 2_000_000)\n    return x + y\n"), 1.0, 1.0),  # swallowed
        ("HumanEval/53", _fenced(add + "    return float(x + y)\n"), 1.0, 1.0),  # 3.0 == 3
        ("HumanEval/53", _fenced(add + "    return (x + y,)\n"), 0.0, 0.0),
        ("HumanEval/53", _fenced(add + "    return int(input())\n"), 0.0, 0.0),  # reading stdin raises
        ("HumanEval/53", _fenced("def plus(x, y):\n    return x + y\n"), 0.0, 0.0),  # no entry point
        ("HumanEval/2", _fenced("def truncate_number(number):\n    return number % 1.0 + 1e-9\n"), 1.0, 1.0),
        ("HumanEval/2", _fenced("def truncate_number(number):\n    return number % 1.0 + 1e-5\n"), 0.0, 0.0),
    ]
    g = CodeGrader(num_workers=0, allow_root=True)
    try:
        res = g.grade([a[1] for a in answers], [probs[a[0]].answer for a in answers])
    finally:
        g.close()
    assert list(res.base) == [a[2] for a in answers], res.status
    assert list(res.rewards) == [a[3] for a in answers], res.status
    import graft_cli.reward.code_grader as cg

    def no_pool(*a, **k):
        raise AssertionError("expected outputs recomputed")

    monkeypatch.setattr(cg.CodeGrader, "grade", no_pool)  # a second load reads the cache back
    assert [p.answer for p in evalplus_problems(HE_TINY, "humaneval")] == [probs[t].answer for t in rows]


def test_mbpp_fixture_end_to_end(cache):
    probs = {p.id: p for p in evalplus_problems(MB_TINY, "mbpp", num_workers=0)}
    rows = {r["task_id"]: r for r in read_release(MB_TINY, "mbpp")}
    answers = [(tid, _fenced(r["prompt"] + r["canonical_solution"]), 1.0) for tid, r in rows.items()]
    answers += [
        ("Mbpp/2", _fenced("def similar_elements(a, b):\n    return tuple(sorted(set(a) & set(b), reverse=True))\n"),
         1.0),  # any order: a set comparison
        ("Mbpp/2", _fenced("def similar_elements(a, b):\n    return tuple(set(a))\n"), 0.0),
        ("Mbpp/787", _fenced("import re\ndef text_match_three(text):\n    return bool(re.search('ab{3}?', text))\n"),
         1.0),  # a bool is compared as it is: False where the reference found nothing
        ("Mbpp/787", _fenced("def text_match_three(text):\n    return True\n"), 0.0),  # True for 'ac' fails
        ("Mbpp/787", _fenced("def text_match_three(text):\n    return text\n"), 0.0),  # 'ac' is not None
        ("Mbpp/787", _fenced("def text_match_three(text):\n    return 'abbb' in text or None\n"), 1.0),
    ]
    g = CodeGrader(num_workers=0, allow_root=True)
    try:
        res = g.grade([a[1] for a in answers], [probs[a[0]].answer for a in answers])
    finally:
        g.close()
    assert list(res.rewards) == [a[2] for a in answers], res.status


def test_workers_read_the_cache_the_grader_was_made_with(tmp_path, monkeypatch):
    """The pool's workers come from a forkserver started once per process, with the environment of that moment:
    a cache directory set later still reaches them (the grader hands its own to its workers)."""
    monkeypatch.setenv("GRAFT_EVALPLUS_CACHE", str(tmp_path / "first"))
    CodeGrader(num_workers=1, allow_root=True).start().close()  # the forkserver runs from here on, if not before
    monkeypatch.setenv("GRAFT_EVALPLUS_CACHE", str(tmp_path / "second"))
    probs = evalplus_problems(MB_TINY, "mbpp", num_workers=0)
    rows = read_release(MB_TINY, "mbpp")
    g = CodeGrader(num_workers=1, allow_root=True)
    try:
        res = g.grade([_fenced(r["prompt"] + r["canonical_solution"]) for r in rows], [p.answer for p in probs])
    finally:
        g.close()
    assert res.status == ["ok"] * len(rows) and list(res.rewards) == [1.0] * len(rows)


def test_a_reference_that_fails_on_plus_keeps_the_base_verdicts(cache, tmp_path):
    """A reference that answers its base inputs but not every plus input (Mbpp/255's, over the result cap): the
    cache keeps its base outputs, an answer is judged on base as usual and fails plus (``code_bad_gold``), with one
    warning naming the task."""
    prompt = "def add(a, b):\n"
    row = {"task_id": "HumanEval/0", "prompt": prompt, "entry_point": "add", "atol": 0, "contract": "", "test": "",
           "canonical_solution": "    if a == 37:\n        raise MemoryError\n    return a + b\n",
           "base_input": [[1, 2], [3, 4]], "plus_input": [[5, 6], [37, 1]]}
    path = tmp_path / "plus-fails.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.warns(UserWarning, match=r"1 task\(s\).*HumanEval/0: plus: MemoryError"):
        probs = evalplus_problems(str(path), "humaneval", num_workers=0)
    answers = [_fenced(prompt + "    return a + b\n"), _fenced(prompt + "    return a - b\n")]
    g = CodeGrader(num_workers=0, allow_root=True)
    try:
        res = g.grade(answers, [probs[0].answer] * 2)
    finally:
        g.close()
    assert list(res.base) == [1.0, 0.0] and list(res.rewards) == [0.0, 0.0]
    assert res.status == ["code_bad_gold", "ok"]


# ----------------------------------------------------------------------------------------------- slow
def _shared(name: str) -> str:
    path = os.path.join(SHARED, name)
    if not os.path.exists(path):
        pytest.skip(f"{path} absent (the EvalPlus release files sit beside the checkout in ../shared/data/evalplus)")
    return path


def _first(src: str, n: int, tmp_path) -> str:
    path = tmp_path / os.path.basename(src).replace(".jsonl.gz", f"-{n}.jsonl")
    with gzip.open(src, "rt", encoding="utf-8") as f, open(path, "w", encoding="utf-8") as out:
        for _, line in zip(range(n), f):
            out.write(line)
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("name,dataset", [("HumanEvalPlus-v0.1.10.jsonl.gz", "humaneval"),
                                          ("MbppPlus-v0.2.0.jsonl.gz", "mbpp")])
def test_references_score_one_on_a_slice(name, dataset, cache, tmp_path):
    path = _first(_shared(name), 24, tmp_path)
    probs = evalplus_problems(path, dataset, num_workers=2)
    rows = read_release(path, dataset)
    g = CodeGrader(num_workers=2, allow_root=True)
    try:
        res = g.grade([_fenced(r["prompt"] + r["canonical_solution"]) for r in rows], [p.answer for p in probs])
    finally:
        g.close()
    assert list(res.base) == [1.0] * len(rows) and list(res.rewards) == [1.0] * len(rows), res.status


@pytest.mark.slow
def test_an_answer_over_its_time_limit_fails(cache):
    probs = {p.id: p for p in evalplus_problems(HE_TINY, "humaneval", num_workers=0)}
    add = read_release(HE_TINY, "humaneval")[2]["prompt"]
    slow = add + "    if x == 999:\n        import time\n        time.sleep(3)\n    return x + y\n"  # a plus input
    g = CodeGrader(num_workers=0, allow_root=True)
    try:
        res = g.grade([_fenced(slow)], [probs["HumanEval/53"].answer])
    finally:
        g.close()
    assert (res.base[0], res.rewards[0], res.status[0]) == (1.0, 0.0, "code_timeout")  # limit max(1 s, 4 x ref)


@pytest.mark.slow
def test_agreement_with_evalplus_on_a_slice(tmp_path, monkeypatch):
    pytest.importorskip("evalplus", reason="the evalplus package (the oracle) is not installed")
    _shared("HumanEvalPlus-v0.1.10.jsonl.gz")
    spec = importlib.util.spec_from_file_location("evalplus_agreement",
                                                  os.path.join(HERE, "..", "benchmarks", "evalplus_agreement.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setenv("GRAFT_EVALPLUS_CACHE", str(tmp_path / "cache"))
    res = mod.run(SHARED, ["humaneval", "mbpp"], tasks=10, kinds_per_task=6, workers=2, seed=1)
    for ds, r in res.items():
        assert r["answers"] >= 30 and r["kinds"]["canonical"]["n"] == 10
        assert r["disagreements"] == [], (ds, r["disagreements"])


class _Tok:
    chat_template = None

    def __init__(self):
        self.texts: list[str] = []

    def __call__(self, text, add_special_tokens=False):
        self.texts.append(text)
        return {"input_ids": [len(self.texts) - 1]}


class _Engine:
    """Sample 0 of every prompt: its task's reference, fenced; sample 1: ``abs(x) + abs(y)`` for ``add`` (right on
    HumanEval/53's base inputs only), a program without the entry point elsewhere."""

    def __init__(self, tok, rows):
        self.tok, self.rows = tok, rows

    def generate(self, prompt_ids, params):
        from graft_cli.batch import Rollouts

        texts = []
        for ids in prompt_ids:
            r = next(r for r in self.rows if r["prompt"].strip() in self.tok.texts[ids[0]])
            other = r["prompt"] + "    return abs(x) + abs(y)\n" if r["entry_point"] == "add" \
                else "def nothing():\n    pass\n"
            texts += [_fenced(r["prompt"] + r["canonical_solution"]), _fenced(other)][: params.n]
        return Rollouts(prompt_ids=prompt_ids, response_ids=[[1]] * len(texts), texts=texts,
                        logprobs=[[0.0]] * len(texts), truncated=[False] * len(texts), n=params.n)


def test_evaluator_reports_base_beside_plus(cache, tmp_path):
    from graft_cli.data.prompts import PromptSpec
    from graft_cli.eval.benchmarks import resolve_benchmarks
    from graft_cli.eval.runner import Evaluator
    from graft_cli.eval.setup import EvalSettings, Graders
    from graft_cli.schema import RewardConfig

    evalplus_problems(HE_TINY, "humaneval", num_workers=0)  # expected outputs cached here, in this process
    benches = [(b, b.load()) for b in resolve_benchmarks(f"humaneval_plus={HE_TINY}")]
    tok = _Tok()
    graders = Graders(0, rewards={"code": RewardConfig(name="code", timeout_s=10.0)})
    try:
        Evaluator(_Engine(tok, read_release(HE_TINY, "humaneval")), tok, PromptSpec(chat_template="none"),
                  EvalSettings(runs=1, samples=2), graders).evaluate(str(tmp_path / "out"), benches)
    finally:
        graders.close()
    s = json.loads((tmp_path / "out" / "summary.json").read_text())["benchmarks"]["humaneval_plus"]
    assert s["runs"] == [0.5] and s["base"]["runs"] == [pytest.approx(4 / 6)]  # the add answer: base 1, plus 0
    rows = [json.loads(x) for x in open(tmp_path / "out" / "humaneval_plus_run1.jsonl")]
    assert [(r["problem_id"], r["grade"], r["base"]) for r in rows][-2:] == [("HumanEval/53", 1.0, 1.0),
                                                                            ("HumanEval/53", 0.0, 1.0)]
