"""The five evaluation benchmarks (graft.md §1) and how a benchmark list is resolved to problem files.

Registry: name -> display name, default hub source, local file name, paper size.

Resolution of one entry of ``--benchmarks`` / ``eval.benchmarks`` (:func:`resolve_benchmarks`):

* ``math500`` (a registry name): for the tiny pair, the tiny task's ``eval_math500.jsonl``
  (``ensure_tiny()["task"]``); otherwise ``<eval dir>/math500.jsonl`` when an eval data directory is
  given (``--eval-dir``, ``eval.data_dir`` or ``$GRAFT_EVAL_DIR``) and holds it; otherwise the hub id.
* ``name=SOURCE``: benchmark ``name`` read from ``SOURCE`` (a local file or a hub ``id[:split]``).
* a path to a ``.jsonl``/``.json``/``.parquet`` file: named after the file (``eval_`` prefix dropped).

An empty list means the five benchmarks. ``--data FILE`` evaluates one file (named after it).
Files are read with :func:`graft_cli.data.problems.load_problems` (``{id, problem, answer}``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from graft_cli.errors import GraftError


@dataclass(frozen=True)
class Benchmark:
    name: str  # key used in file names and summaries
    display: str  # column header (paper spelling)
    hub: str  # default hub source "id[:split]"
    filename: str  # file name inside an eval data directory
    size: int  # number of problems in the paper's version
    fields: dict = field(default_factory=dict)  # explicit field map for the hub copy, if needed


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark("math500", "MATH500", "HuggingFaceH4/MATH-500:test", "math500.jsonl", 500),
        Benchmark("aime24", "AIME24", "HuggingFaceH4/aime_2024:train", "aime24.jsonl", 30),
        Benchmark("aime25", "AIME25", "MathArena/aime_2025:train", "aime25.jsonl", 30),
        Benchmark("amc23", "AMC23", "math-ai/amc23:test", "amc23.jsonl", 40),
        Benchmark("minerva", "Minerva", "math-ai/minervamath:test", "minerva.jsonl", 272),
    )
}
FIVE = ("math500", "aime24", "aime25", "amc23", "minerva")
EVAL_DIR_ENV = "GRAFT_EVAL_DIR"


@dataclass(frozen=True)
class BenchmarkSource:
    name: str
    display: str
    source: str  # local path or hub id[:split]
    fields: dict = field(default_factory=dict)

    def load(self):
        from graft_cli.data.problems import load_problems

        return load_problems(self.source, self.fields or None)


def display_name(name: str) -> str:
    return BENCHMARKS[name].display if name in BENCHMARKS else name


def tiny_task_dir() -> str:
    """The tiny pair's task folder (``eval_<name>.jsonl`` for the five synthetic sets)."""
    from graft_cli.models.tiny import ensure_tiny

    return ensure_tiny(progress=False)["task"]


def _looks_like_file(s: str) -> bool:
    return s.endswith((".jsonl", ".json", ".parquet")) or os.path.sep in s or os.path.exists(s)


def _name_from_path(path: str) -> str:
    stem = os.path.basename(path)
    for ext in (".jsonl", ".json", ".parquet"):
        if stem.endswith(ext):
            stem = stem[: -len(ext)]
    return stem[5:] if stem.startswith("eval_") else stem


def split_list(spec) -> list[str]:
    """``"a,b"`` or ``["a", "b"]`` or ``None`` -> list of non-empty entries."""
    if spec is None:
        return []
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    return [str(x).strip() for x in items if str(x).strip()]


def resolve_benchmarks(benchmarks=None, data: str | None = None, pair: str | None = None,
                       eval_dir: str | None = None) -> list[BenchmarkSource]:
    """Resolve a benchmark list (see the module docstring) to named sources, in the given order."""
    if data:
        if benchmarks:
            raise GraftError("give --data FILE or --benchmarks LIST, not both")
        if not os.path.exists(data) and _looks_like_file(data):
            raise GraftError(f"{data}: file not found")
        name = _name_from_path(data) if _looks_like_file(data) else data.split(":")[0].replace("/", "_")
        return [BenchmarkSource(name, display_name(name), data)]
    entries = split_list(benchmarks) or list(FIVE)
    eval_dir = eval_dir or os.environ.get(EVAL_DIR_ENV) or None
    if eval_dir and not os.path.isdir(eval_dir):
        raise GraftError(f"eval data directory {eval_dir!r} does not exist")
    out: list[BenchmarkSource] = []
    task_dir = None
    for e in entries:
        if "=" in e:
            name, _, src = e.partition("=")
            name, src = name.strip(), src.strip()
            if not name or not src:
                raise GraftError(f"benchmark {e!r}: expected NAME=FILE")
            if _looks_like_file(src) and not os.path.exists(src):
                raise GraftError(f"benchmark {name!r}: {src}: file not found")
            out.append(BenchmarkSource(name, display_name(name), src))
        elif e in BENCHMARKS:
            b = BENCHMARKS[e]
            if pair == "tiny":
                task_dir = task_dir or tiny_task_dir()
                src = os.path.join(task_dir, f"eval_{e}.jsonl")
                if not os.path.exists(src):
                    raise GraftError(f"tiny task folder {task_dir} has no eval_{e}.jsonl")
                out.append(BenchmarkSource(e, b.display, src))
            elif eval_dir and os.path.exists(os.path.join(eval_dir, b.filename)):
                out.append(BenchmarkSource(e, b.display, os.path.join(eval_dir, b.filename)))
            else:
                out.append(BenchmarkSource(e, b.display, b.hub, dict(b.fields)))
        elif _looks_like_file(e):
            if not os.path.exists(e):
                raise GraftError(f"benchmark file {e}: not found")
            name = _name_from_path(e)
            out.append(BenchmarkSource(name, display_name(name), e))
        else:
            raise GraftError(f"unknown benchmark {e!r}; known: {', '.join(FIVE)} (or NAME=FILE, or a file path)")
    names = [b.name for b in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise GraftError(f"benchmark name {dup[0]!r} appears twice; name files with NAME=FILE")
    return out
