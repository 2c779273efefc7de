"""Problem files, prompt batches and the prompt string (graft.md §1, §8 item 1)."""

from __future__ import annotations

import json
import os

import pytest
from conftest import SHARED, make_char_tokenizer

from graft_cli.data.problems import Problem, load_problems
from graft_cli.data.prompts import PromptSpec
from graft_cli.data.sampler import PromptSampler
from graft_cli.errors import GraftError

DATA = os.path.join(SHARED, "data")
EVAL = os.path.join(DATA, "eval")
needs_data = pytest.mark.skipif(not os.path.isdir(EVAL), reason="../shared/data is not present")

PAPER_SUFFIX = "Let's think step by step and output the final answer within \\boxed{}."


# --- the real data files -----------------------------------------------------------------------------------
@needs_data
def test_math500_loads_500_rows_with_ids_and_answers():
    probs = load_problems(os.path.join(EVAL, "math500.jsonl"))
    assert len(probs) == 500
    assert all(isinstance(p, Problem) for p in probs)
    assert all(p.id and p.problem.strip() and p.answer.strip() for p in probs)
    assert len({p.id for p in probs}) == 500
    # first row of the file, read independently
    with open(os.path.join(EVAL, "math500.jsonl"), encoding="utf-8") as f:
        first = json.loads(f.readline())
    assert (probs[0].id, probs[0].problem, probs[0].answer) == (first["id"], first["problem"], first["answer"])
    # the answer column is used, not the solution column
    assert probs[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"


def _eval_files():
    if not os.path.isdir(EVAL):
        return []
    out = []
    for root, _, files in os.walk(EVAL):
        out += [os.path.join(root, f) for f in files if f.endswith((".jsonl", ".json", ".parquet"))]
    return sorted(out)


@needs_data
@pytest.mark.parametrize("path", _eval_files(), ids=lambda p: os.path.relpath(p, EVAL))
def test_every_eval_file_loads(path):
    probs = load_problems(path)
    with open(path, encoding="utf-8") as f:
        n_lines = sum(1 for line in f if line.strip())
    assert len(probs) == n_lines
    assert all(p.id and p.problem.strip() and str(p.answer).strip() for p in probs)


@needs_data
def test_expected_eval_benchmark_sizes():
    # graft.md §1: MATH500 (500), AIME2024 (30), AIME2025 (30), AMC23 (40), Minerva Math (272)
    sizes = {"math500": 500, "aime24": 30, "aime25": 30, "amc23": 40, "minerva": 272}
    for name, n in sizes.items():
        assert len(load_problems(os.path.join(EVAL, f"{name}.jsonl"))) == n, name


# --- malformed lines name the file and the line -----------------------------------------------------------
GOOD = json.dumps({"id": "a", "problem": "1+1", "answer": "2"})
BAD_LINES = [
    ("not json", "{\"id\": \"x\", \"problem\": "),
    ("missing answer", json.dumps({"id": "x", "problem": "2+2"})),
    ("empty problem", json.dumps({"id": "x", "problem": "   ", "answer": "4"})),
    ("empty answer", json.dumps({"id": "x", "problem": "2+2", "answer": ""})),
    ("missing problem", json.dumps({"id": "x", "answer": "4"})),
    ("not an object", json.dumps([1, 2, 3])),
]


@pytest.mark.parametrize("what,bad", BAD_LINES, ids=[b[0] for b in BAD_LINES])
def test_malformed_line_names_file_and_line(tmp_path, what, bad):
    path = tmp_path / "probs.jsonl"
    # line 1 good, line 2 blank (skipped but still counted), line 3 good, line 4 bad
    path.write_text(GOOD + "\n\n" + json.dumps({"id": "b", "problem": "3+3", "answer": "6"}) + "\n" + bad + "\n")
    with pytest.raises(GraftError) as ei:
        load_problems(str(path))
    msg = str(ei.value)
    assert f"{path}:4" in msg, msg
    assert "\n" not in msg


def test_missing_file_and_duplicate_ids(tmp_path):
    with pytest.raises(GraftError, match="nope.jsonl"):
        load_problems(str(tmp_path / "nope.jsonl"))
    path = tmp_path / "dup.jsonl"
    path.write_text(GOOD + "\n" + json.dumps({"id": "b", "problem": "3+3", "answer": "6"}) + "\n" + GOOD + "\n")
    with pytest.raises(GraftError) as ei:  # the file, the line that repeats the id, and where it was first
        load_problems(str(path))
    assert str(ei.value) == f"{path}:3: duplicate id 'a' (first at {path}:1)"


def test_rows_without_id_get_file_and_line_ids(tmp_path):
    path = tmp_path / "noid.jsonl"
    path.write_text(json.dumps({"question": "5+5", "final_answer": 10}) + "\n"
                    + json.dumps({"problem": "1+2", "answer": "3"}) + "\n")
    probs = load_problems(str(path))
    assert probs == [Problem("noid.jsonl:1", "5+5", "10"), Problem("noid.jsonl:2", "1+2", "3")]


def test_parquet_loading(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    path = tmp_path / "probs.parquet"
    pd.DataFrame({"id": ["q1", "q2", "q3"], "problem": ["1+1", "2+3", "7-4"], "answer": ["2", "5", "3"]}
                 ).to_parquet(path)
    probs = load_problems(str(path))
    assert probs == [Problem("q1", "1+1", "2"), Problem("q2", "2+3", "5"), Problem("q3", "7-4", "3")]
    # a parquet row with an empty problem names the file and the row
    bad = tmp_path / "bad.parquet"
    pd.DataFrame({"id": ["q1", "q2"], "problem": ["1+1", ""], "answer": ["2", "5"]}).to_parquet(bad)
    with pytest.raises(GraftError) as ei:
        load_problems(str(bad))
    assert str(bad) in str(ei.value) and "row 1" in str(ei.value)


# --- PromptSampler --------------------------------------------------------------------------------------------
def _take(s: PromptSampler, k: int) -> list[list[int]]:
    return [s.next() for _ in range(k)]


def test_sampler_is_deterministic_by_seed():
    a, b, c = PromptSampler(20, 4, seed=7), PromptSampler(20, 4, seed=7), PromptSampler(20, 4, seed=8)
    ba, bb, bc = _take(a, 10), _take(b, 10), _take(c, 10)
    assert ba == bb
    assert ba != bc


def test_sampler_drop_last_and_epochs():
    # 10 problems, batch 3 -> 3 batches per epoch (9 prompts), the 10th prompt of each epoch is dropped
    s = PromptSampler(10, 3, seed=0)
    assert s.steps_per_epoch == 3
    e0, e1 = _take(s, 3), _take(s, 3)
    for epoch in (e0, e1):
        assert all(len(b) == 3 for b in epoch)
        flat = [i for b in epoch for i in b]
        assert len(set(flat)) == 9 and set(flat) <= set(range(10))  # no repeats inside an epoch
    assert [i for b in e0 for i in b] != [i for b in e1 for i in b]  # a different permutation per epoch
    assert s.step == 6
    # 7500 / 128 -> 58 steps per epoch, 3 epochs = 174 steps (graft.md §1)
    assert PromptSampler(7500, 128, seed=0).steps_per_epoch * 3 == 174


def test_sampler_without_shuffle_is_in_order():
    s = PromptSampler(7, 3, seed=0, shuffle=False)
    assert _take(s, 3) == [[0, 1, 2], [3, 4, 5], [0, 1, 2]]


def test_sampler_resume_gives_the_same_next_batch():
    a = PromptSampler(50, 8, seed=3)
    _take(a, 9)  # past the first epoch boundary (6 steps per epoch)
    st = a.state_dict()
    b = PromptSampler(50, 8, seed=3)
    b.load_state_dict(st)
    assert _take(b, 5) == _take(a, 5)
    with pytest.raises(ValueError):
        PromptSampler(50, 8, seed=4).load_state_dict(st)
    with pytest.raises(ValueError):
        PromptSampler(50, 10, seed=3).load_state_dict(st)
    # the cursor is plain data (goes into a JSON checkpoint)
    assert json.loads(json.dumps(st)) == st


def test_sampler_batch_larger_than_dataset():
    with pytest.raises(ValueError):
        PromptSampler(5, 8, seed=0)


# --- PromptSpec -------------------------------------------------------------------------------------------
def test_paper_suffix_in_raw_prompt():
    tok = make_char_tokenizer()
    assert not getattr(tok, "chat_template", None)
    text = PromptSpec().text("What is $1+1$?", tok)
    assert text == "What is $1+1$? " + PAPER_SUFFIX + "\n"
    assert "within \\boxed{}." in text and text.count("\\") == 1  # one literal backslash
    # raw text keeps the tokenizer's own special-token behaviour (the char tokenizer adds none)
    assert PromptSpec().encode("What is $1+1$?", tok) == tok(text)["input_ids"]
    assert len(PromptSpec().encode("What is $1+1$?", tok)) == len(text)


CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if enable_thinking is defined and not enable_thinking %}<nothink>{% endif %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def test_chat_template_applied_when_tokenizer_has_one():
    tok = make_char_tokenizer()
    tok.chat_template = CHAT
    spec = PromptSpec()
    want = "<|user|>2+3 " + PAPER_SUFFIX + "\n<nothink><|assistant|>"
    assert spec.text("2+3", tok) == want
    ids = spec.encode("2+3", tok)
    assert ids == tok(want, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == want


def test_chat_template_none_forces_raw():
    tok = make_char_tokenizer()
    tok.chat_template = CHAT
    spec = PromptSpec(chat_template="none")
    assert spec.text("2+3", tok) == "2+3 " + PAPER_SUFFIX + "\n"
    assert spec.encode("2+3", tok) == tok("2+3 " + PAPER_SUFFIX + "\n")["input_ids"]


def test_chat_template_required_is_auto_or_one_line():
    """``required`` prompts as ``auto`` does when the tokenizer has a chat template, and refuses one without
    item 6), naming the tokenizer and where it comes from."""
    tok = make_char_tokenizer()
    spec = PromptSpec(chat_template="required")
    with pytest.raises(GraftError) as ei:
        spec.encode("2+3", tok)
    assert "has no chat template, which prompt.chat_template=required needs" in str(ei.value)
    with pytest.raises(GraftError, match="^policies.0.tokenizer: tokenizer .* has no chat template"):
        spec.check(tok, "policies.0.tokenizer")
    tok.chat_template = CHAT
    spec.check(tok)
    assert spec.encode("2+3", tok) == PromptSpec().encode("2+3", tok)


def test_a_folder_a_non_utf8_byte_and_a_10mb_line(tmp_path):
    """A data path that is a folder, a byte that is not UTF-8, and a 10 MB line: the first two
    are one line naming the path (file:line for the byte), the long line loads."""
    with pytest.raises(GraftError, match=f"{tmp_path}: is a folder; expected a .jsonl"):
        load_problems(str(tmp_path))
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(GOOD.encode() + b'\n{"problem": "1+1\xff", "answer": "2", "id": "b"}\n')
    with pytest.raises(GraftError) as ei:
        load_problems(str(bad))
    assert str(ei.value) == f"{bad}:2: not UTF-8 (byte 0xff at column 17)"
    big = tmp_path / "big.jsonl"
    big.write_text(json.dumps({"id": "x", "problem": "1+" * 5_000_000 + "1", "answer": "5000001"}) + "\n")
    (p,) = load_problems(str(big))
    assert len(p.problem) == 10_000_001 and p.answer == "5000001"
