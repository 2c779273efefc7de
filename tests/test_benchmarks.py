"""The benchmarks of the other seeds: Tandem RLVR's OlympiadBench, AIME26 and AMC
2023-25, SAF-OPD's HMMT 2025 February and November, by hub id (the hub served from tests/fixtures/benchmarks/hub/,
one file per dataset id, config and split, in the hub's own field layout, so a wrong id, config, split or field
name fails) and by local file (tests/fixtures/benchmarks/local/, an eval data directory). The fixture problems are
made up; which rows each benchmark keeps is worked out by hand next to each expectation."""

from __future__ import annotations

import json
import os

import pytest
from conftest import ROOT

from graft_cli.errors import GraftError
from graft_cli.eval import benchmarks as B

FIX = os.path.join(ROOT, "tests", "fixtures", "benchmarks")
NEW = ("olympiad", "aime26", "amc23_25", "hmmt25_feb", "hmmt25_nov")


@pytest.fixture
def fake_hub(monkeypatch):
    """datasets.load_dataset served from the fixture folder: <id with / as __>[__<config>]__<split>.jsonl."""
    import datasets

    calls = []

    def load_dataset(name, config=None, split="train"):
        calls.append((name, config, split))
        stem = "__".join([name.replace("/", "__")] + ([config] if config else []) + [split])
        path = os.path.join(FIX, "hub", stem + ".jsonl")
        if not os.path.exists(path):
            raise FileNotFoundError(f"no such hub dataset {name!r} config {config!r} split {split!r}")
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f]

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.delenv(B.EVAL_DIR_ENV, raising=False)
    return calls


def _load(names, **kw):
    return {s.name: (s, s.load()) for s in B.resolve_benchmarks(",".join(names), **kw)}


def test_new_benchmarks_by_hub_id(fake_hub):
    got = _load(NEW)
    # OlympiadBench: config OE_TO_maths_en_COMP; row 1607 has two answers (is_multiple_answer) and is left out;
    # final_answer is a list: its one item is the gold
    s, probs = got["olympiad"]
    assert s.display == "OlympiadBench"
    assert [(p.id, p.answer) for p in probs] == [("1606", "$8$"), ("1608", "$\\frac{5}{6}$")]
    assert probs[0].problem.startswith("Compute the smallest positive integer")
    # AIME26: MathArena rows have no id (problem_idx): named <dataset>:<row>; integer answers as strings
    _, probs = got["aime26"]
    assert [(p.id, p.answer) for p in probs] == [("MathArena/aime_2026:0", "24"), ("MathArena/aime_2026:1", "24")]
    # AMC 2023-25: amc23 (question/answer, 2 rows) + AMC 12 2024 (4 rows less "D" and the interval) + AMC 12 2025
    # (2 rows less the clock time "4{:}30"), ids prefixed by part so amc23's id 0 and amc25's do not collide
    _, probs = got["amc23_25"]
    assert [(p.id, p.answer) for p in probs] == [
        ("amc23-0", "27.0"), ("amc23-1", "6.0"), ("amc24-rawsh/2024_AMC12:0", "4"), ("amc24-rawsh/2024_AMC12:3", "42"),
        ("amc25-1", "25")]
    assert probs[0].problem == "What is $3 \\cdot 9$?"
    # HMMT 2025: February (2 rows), November (1 row)
    assert [p.answer for p in got["hmmt25_feb"][1]] == ["55", "4"]
    assert [(p.id, p.answer) for p in got["hmmt25_nov"][1]] == [("MathArena/hmmt_nov_2025:0", "6")]
    assert sorted(set(fake_hub)) == sorted({
        ("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train"), ("MathArena/aime_2026", None, "train"),
        ("math-ai/amc23", None, "test"), ("rawsh/2024_AMC12", None, "train"),
        ("sonthenguyen/amc12-2025-non-figure", None, "train"), ("MathArena/hmmt_feb_2025", None, "train"),
        ("MathArena/hmmt_nov_2025", None, "train")})


def test_new_golds_grade_as_boxed_answers(fake_hub):
    """The normalised golds (OlympiadBench's $...$, amc23's 27.0) are read by the grader."""
    from graft_cli.reward.answers import grade_one

    golds = {p.id: p.answer for _, (_, probs) in _load(("olympiad", "amc23_25")).items() for p in probs}
    assert grade_one("so \\boxed{\\frac56}", golds["1608"])[0] == 1.0
    assert grade_one("so \\boxed{8}", golds["1606"])[0] == 1.0
    assert grade_one("\\boxed{27}", golds["amc23-0"])[0] == 1.0
    assert grade_one("\\boxed{28}", golds["amc23-0"])[0] == 0.0


def test_new_benchmarks_by_local_file(fake_hub):
    """An eval data directory holding <name>.jsonl wins over the hub (no hub call), taken as it is."""
    got = _load(NEW, eval_dir=os.path.join(FIX, "local"))
    assert fake_hub == []
    assert {n: [(p.id, p.answer) for p in probs] for n, (_, probs) in got.items()} == {
        "olympiad": [("ob-1", "42")], "aime26": [("aime26-I-1", "144")],
        "amc23_25": [("amc24-12A-1", "6"), ("amc25-12B-2", "32")], "hmmt25_feb": [("1", "6")],
        "hmmt25_nov": [("1", "24")]}
    assert {n: s.source for n, (s, _) in got.items()} == {
        n: os.path.join(FIX, "local", f"{n}.jsonl") for n in NEW}
    # NAME=FILE works for them too (e.g. SAF-OPD's released data/hmmt25_feb/test.jsonl)
    (s, probs), = _load([f"hmmt25_feb={os.path.join(FIX, 'local', 'hmmt25_feb.jsonl')}"]).values()
    assert s.display == "HMMT25-Feb" and [p.answer for p in probs] == ["6"]


def test_registry_entries():
    assert {n: (B.display_name(n), B.BENCHMARKS[n].filename, B.BENCHMARKS[n].size) for n in NEW} == {
        "olympiad": ("OlympiadBench", "olympiad.jsonl", 581), "aime26": ("AIME26", "aime26.jsonl", 30),
        "amc23_25": ("AMC23-25", "amc23_25.jsonl", 121), "hmmt25_feb": ("HMMT25-Feb", "hmmt25_feb.jsonl", 30),
        "hmmt25_nov": ("HMMT25-Nov", "hmmt25_nov.jsonl", 30)}
    assert set(B.TANDEM) <= set(B.BENCHMARKS) and set(B.SAF_FINAL) <= set(B.BENCHMARKS)
    with pytest.raises(GraftError, match="hmmt25_nov"):  # the error lists every registered name
        B.resolve_benchmarks("hmmt26")


def test_list_answer_joined_and_empty_refused(tmp_path):
    from graft_cli.data.problems import load_problems

    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"id": "a", "question": "q", "final_answer": ["$2$", "$-2$"]}) + "\n")
    assert load_problems(str(f))[0].answer == "$2$, $-2$"
    f.write_text(json.dumps({"id": "a", "question": "q", "final_answer": []}) + "\n")
    with pytest.raises(GraftError, match="empty list"):
        load_problems(str(f))
