"""Problem sets: a local JSONL/parquet file or a hub dataset, normalised to ``{id, problem,
answer}``.

Hub datasets use common field names (``problem``/``question``/``prompt`` and
``answer``/``solution``/``final_answer``/``expected_answer``); a field map can be given explicitly
as ``name:split`` plus ``fields``. An answer given as a list (OlympiadBench's ``final_answer``) is
its items joined with ", ". A malformed local line raises :class:`GraftError` naming file and line.

For verl-style RL data (Eurus-2-RL-Data, the code runs' training set): a field map may name a nested
field with dots (``answer: reward_model.ground_truth``); a problem given as a list of chat messages
(``prompt: [{role, content}, ...]``) is kept as those messages, JSON-encoded
(graft_cli/data/prompts.py renders them with the chat template, system message included); ``where``
keeps only the rows whose fields equal its values (``{ability: code}``); a local path may be a glob
(``data/eurus2-rl-code/train-*.parquet``: the matching files, sorted, joined). """

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass

import numpy as np

from graft_cli.reward.answers import last_boxed
from graft_cli.data import hub
from graft_cli.errors import GraftError

PROBLEM_KEYS = ("problem", "question", "prompt", "query")
ANSWER_KEYS = ("answer", "final_answer", "expected_answer", "gt_answer", "solution")


@dataclass(frozen=True)
class Problem:
    id: str
    problem: str
    answer: str


_MISSING = object()


def field_value(row: dict, key: str):
    """``row[key]``, where a dotted key walks nested mappings (``reward_model.ground_truth``); a
    missing key gives the module's ``_MISSING``."""
    if key in row:
        return row[key]
    cur = row
    for part in key.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return _MISSING
        cur = cur[part]
    return cur


def _messages(value) -> str | None:
    """A chat-message list (``[{role, content}, ...]``) as JSON, else None."""
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ndarray":
        items = list(value)
        if items and all(isinstance(m, dict) and "role" in m and "content" in m for m in items):
            return json.dumps([{"role": str(m["role"]), "content": str(m["content"])} for m in items])
    return None


def keep_row(row: dict, where: dict | None) -> bool:
    return not where or all(field_value(row, k) == v for k, v in where.items())


def _normalise(row: dict, where: str, fields: dict | None = None) -> Problem:
    fields = fields or {}
    pk = fields.get("problem") or next((k for k in PROBLEM_KEYS if k in row), None)
    ak = fields.get("answer") or next((k for k in ANSWER_KEYS if k in row), None)
    if pk is None or field_value(row, pk) is _MISSING:
        raise GraftError(f"{where}: no problem field (looked for {pk or ', '.join(PROBLEM_KEYS)})")
    if ak is None or field_value(row, ak) is _MISSING:
        raise GraftError(f"{where}: no answer field (looked for {ak or ', '.join(ANSWER_KEYS)})")
    problem, answer = field_value(row, pk), field_value(row, ak)
    problem = _messages(problem) or problem
    if isinstance(answer, (list, tuple)) or type(answer).__name__ == "ndarray":  # e.g. OlympiadBench final_answer
        parts = [str(a).strip() for a in answer if a is not None and str(a).strip()]
        if not parts:
            raise GraftError(f"{where}: field {ak!r} is an empty list")
        answer = ", ".join(parts)
    if not isinstance(problem, str) or not problem.strip():
        raise GraftError(f"{where}: field {pk!r} must be a non-empty string")
    if answer is None or (isinstance(answer, str) and not answer.strip()):
        raise GraftError(f"{where}: field {ak!r} is empty")
    if ak == "solution" and "answer" not in row:
        boxed = last_boxed(str(answer))
        if boxed is None:
            raise GraftError(f"{where}: 'solution' has no \\boxed{{}} answer")
        answer = boxed
    rid = row.get(fields.get("id", "id"))
    return Problem(id=str(rid) if rid is not None else "", problem=problem, answer=str(answer))


def _check_unique(rows: list[tuple[Problem, str]]) -> list[Problem]:
    """The problems of ``(problem, where)`` rows; a repeated id is one line naming where it repeats
    and where it was first (ids key rollout logs, evaluation files and the stored-trajectory
    partner's prompts)."""
    first: dict[str, str] = {}
    for p, where in rows:
        if p.id in first:
            raise GraftError(f"{where}: duplicate id {p.id!r} (first at {first[p.id]})")
        first[p.id] = where
    return [p for p, _ in rows]


def _load_jsonl(path: str, fields, keep: dict | None = None) -> list[Problem]:
    out = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise GraftError(f"{where}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise GraftError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise GraftError(f"{where}: expected a JSON object")
            if not keep_row(row, keep):
                continue
            p = _normalise(row, where, fields)
            out.append((p if p.id else Problem(f"{os.path.basename(path)}:{lineno}", p.problem, p.answer), where))
    return _check_unique(out)


def _load_parquet(path: str, fields, keep: dict | None = None) -> list[Problem]:
    # lazy: pandas is heavy
    import pandas as pd

    df = pd.read_parquet(path)
    out = []
    for i, row in enumerate(df.to_dict("records")):
        if not keep_row(row, keep):
            continue
        p = _normalise(row, f"{path}: row {i}", fields)
        out.append((p if p.id else Problem(f"{os.path.basename(path)}:{i}", p.problem, p.answer), f"{path}: row {i}"))
    return _check_unique(out)


def _load_hub(spec: str, fields, config: str | None = None, where: dict | None = None,
              drop_answers=()) -> list[Problem]:
    """A hub dataset ``name[:split]`` (config ``config``), its rows normalised; with ``where`` only
    the rows whose fields equal those values, and without the rows whose raw answer is in
    ``drop_answers``."""
    name, _, split = spec.partition(":")
    try:
        # lazy: datasets is heavy and only for hub data
        import datasets
    except ImportError:  # pragma: no cover
        raise GraftError(f"{spec}: loading hub datasets needs the `datasets` package") from None

    why = hub.unreachable()  # one quick request per process, not datasets' retry loop per file
    try:
        with hub.access(why):
            ds = datasets.load_dataset(name, config, split=split or "train") if config else \
                datasets.load_dataset(name, split=split or "train")
    except Exception as e:  # network, missing dataset, bad split
        if why:
            raise GraftError(f"{spec}: could not load hub dataset: not in the local cache, and the hub is not used "
                             f"({why})") from None
        raise GraftError(f"{spec}: could not load hub dataset ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    drop = {str(a) for a in drop_answers}
    ak = (fields or {}).get("answer")
    out = []
    for i, row in enumerate(ds):
        row = dict(row)
        if not keep_row(row, where):
            continue
        if drop and str(row.get(ak or "answer")) in drop:
            continue
        p = _normalise(row, f"{spec}: row {i}", fields)
        out.append((p if p.id else Problem(f"{name}:{i}", p.problem, p.answer), f"{spec}: row {i}"))
    return _check_unique(out)


def load_hub_subset(spec: str, fields: dict | None = None, config: str | None = None, where: dict | None = None,
                    drop_answers=()) -> list[Problem]:
    """Part of a hub dataset (a benchmark built from a selection, e.g. OlympiadBench's single-answer
    rows): ``spec`` ``name[:split]``, its ``config``, the rows matching ``where`` minus those whose
    raw answer is in ``drop_answers``, normalised with the ``fields`` map."""
    return _load_hub(spec, fields, config, where, drop_answers)


def load_problems(source: str, fields: dict | None = None, where: dict | None = None) -> list[Problem]:
    """Load a problem set from a local ``.jsonl``/``.json``/``.parquet`` file (or a glob of them),
    or a hub id ``name[:split]``; ``where``: only the rows whose fields equal these values."""

    if os.path.isdir(source):
        raise GraftError(f"{source}: is a folder; expected a .jsonl, .json or .parquet file (or a hub id "
                         "name[:split])")
    files = sorted(glob.glob(source)) if glob.has_magic(source) else ([source] if os.path.exists(source) else [])
    if glob.has_magic(source) and not files:
        raise GraftError(f"{source}: no file matches")
    if files:
        probs = []
        for f in files:
            part = _load_parquet(f, fields, where) if f.endswith(".parquet") else _load_jsonl(f, fields, where)
            probs += part  # rows without an id are named <file name>:<row>, unique across the files
    elif source.endswith((".jsonl", ".json", ".parquet")) or source.startswith(("/", "./", "../")):
        raise GraftError(f"{source}: file not found")
    else:
        probs = _load_hub(source, fields, where=where)
    if not probs:
        raise GraftError(f"{source}: no problems")
    return probs


def split_holdout(problems: list[Problem], n: int, seed: int = 0, distinct: bool = False
                  ) -> tuple[list[Problem], list[Problem]]:
    """``(train, held_out)``: ``n`` problems drawn uniformly without replacement with ``numpy`` seed
    ``seed`` (``data.holdout``; the tandem paper holds 1,000 DeepScaleR problems out with seed 0),
    the rest in their original order. ``n = 0``: everything trains. ``distinct``
    (``data.holdout_distinct``): a training problem whose text equals a held-out one's (a set with
    repeats under other ids) is dropped from training too."""

    if n <= 0:
        return list(problems), []
    if n >= len(problems):
        raise ValueError(f"data.holdout={n} leaves no training problem (the set has {len(problems)})")
    held = set(np.random.default_rng(seed).choice(len(problems), size=n, replace=False).tolist())
    texts = {problems[i].problem for i in held} if distinct else set()
    return ([p for i, p in enumerate(problems) if i not in held and p.problem not in texts],
            [p for i, p in enumerate(problems) if i in held])
