"""Five-run evaluation of a model or of a run's checkpoints (graft.md §1 "Evaluation", conventions.md §6).

Protocol: every problem of every benchmark gets ``samples`` responses (default 8) at temperature 0.6,
top-p 0.95, with the training prompt and verifier; this is repeated in ``runs`` independent runs
(default 5), run ``k`` sampling with its own seed :func:`run_seed` (``k`` = 1, 2, ...). pass@1 and
mean ± std are computed by :mod:`graft_cli.eval.metrics`.

Files (one folder per evaluated model, e.g. ``<run>/eval/<policy>/step_NNNNNN/``)::

    <bench>_run<k>.jsonl   one line per (problem, sample): benchmark, problem_id, problem_index, run,
                           sample, seed, answer, response, extracted, grade, timed_out, truncated,
                           num_tokens; written atomically when the (benchmark, run) is complete
    meta.json              the sampling settings and problem-set fingerprints the files were made with
    summary.json           per benchmark: pass@1 per run, mean, std (ddof=1), unbiased pass@k (k <= samples);
                           the unweighted benchmark average (the five benchmarks when all are present)

Resumable: a (benchmark, run) whose file exists is read back, not regenerated, so runs accumulate: the
in-training validation writes ``run1`` and a later ``graft eval --run DIR --runs 5`` adds runs 2-5.
A folder made with different settings (samples, temperature, top-p, max new tokens, seed, prompt) or a
different problem set is refused with one line (``--force`` starts that folder over).

A run's evaluation also writes ``<run>/eval/<policy>/summary.json`` (every evaluated step) and
``<run>/best.json`` (each policy's best step by ``eval.select_metric`` — pass@1 by default — on the benchmark
average or ``eval.select_benchmarks``; the two policies may pick different steps) — see
:func:`write_policy_summary` and :func:`update_best`. When a run's final sampling (``eval.final``) differs from
its validation's, validation writes ``<run>/validation/<policy>/step_NNNNNN/`` (and selects from there) and
``graft eval --run`` writes ``<run>/eval/`` (:func:`validation_root`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import time
from dataclasses import dataclass, field

import numpy as np

from graft_cli.schema import RewardConfig
from graft_cli.console import make_console
from graft_cli.errors import GraftError
from graft_cli.eval.benchmarks import FIVE, BenchmarkSource, resolve_benchmarks
from graft_cli.eval.files import RUN_FILE_RE, run_file, step_dirs
from graft_cli.eval.metrics import average_over_benchmarks, summarize_benchmark
from graft_cli.rundir import (atomic_write_json, best_path, checkpoint_dir, checkpoints_dir, config_path, eval_step_dir,
                              read_json, read_jsonl, write_jsonl_atomic)
from graft_cli.train.hooks import AfterStep

CHUNK_PROMPTS = 32  # prompts per generate call (progress granularity; each chunk has its own seed)


@dataclass
class EvalSettings:
    runs: int = 5
    samples: int = 8
    temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int = 4096
    seed: int = 0
    extra: dict = field(default_factory=dict)  # further identity (a handoff folder: junior, schedule, delimiter)
    top_k: int = 0  # 0 = off

    def identity(self) -> dict:
        """What the files of a folder depend on (``runs`` only adds files); ``top_k`` only when on, so folders
        made before it existed keep their identity."""
        return {"samples": self.samples, "temperature": self.temperature, "top_p": self.top_p,
                "max_new_tokens": self.max_new_tokens, "seed": self.seed,
                **({"top_k": self.top_k} if self.top_k > 0 else {}), **self.extra}

    def check(self) -> None:
        if self.runs < 1:
            raise GraftError(f"--runs must be >= 1, got {self.runs}")
        if self.samples < 1:
            raise GraftError(f"--samples must be >= 1, got {self.samples}")
        if self.max_new_tokens < 1:
            raise GraftError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise GraftError(f"--temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise GraftError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise GraftError(f"--top-k must be >= 0 (0 = off), got {self.top_k}")


def run_seed(base: int, run: int) -> int:
    """Sampling seed of eval run ``run`` (1-based): distinct per run, independent of the checkpoint, so
    every checkpoint is scored on the same random stream (common random numbers)."""
    return (int(base) * 1_000_003 + int(run) * 7_919 + 12_345) % (2**31 - 1)


def chunk_seed(seed: int, chunk: int) -> int:
    return (seed * 31 + chunk * 104_729 + 1) % (2**31 - 1)


# ----------------------------------------------------------------------------------------------- io
def problems_fingerprint(problems) -> str:
    h = hashlib.sha256()
    for p in problems:
        h.update(f"{p.id}\x00{p.answer}\x00{p.problem}\x01".encode())
    return h.hexdigest()[:16]


def prepare_folder(out_dir: str, settings: EvalSettings, spec, benches: list[tuple[BenchmarkSource, list]],
               force: bool = False) -> None:
    """Check (or start) ``meta.json`` of an output folder before any model is loaded: settings, prompt and
    problem sets must match what its files were made with; ``force`` deletes its results first."""
    path = os.path.join(out_dir, "meta.json")
    template = "auto" if spec.chat_template == "required" else spec.chat_template  # the same prompts (or a refusal)
    prompt = {"suffix": spec.suffix, "chat_template": template, "raw_template": spec.raw_template}
    if getattr(spec, "separator", " ") != " ":  # folders made before the separator existed keep their identity
        prompt["separator"] = spec.separator
    meta = {"settings": settings.identity(), "prompt": prompt, "benchmarks": {}}
    if os.path.exists(path) and not force:
        old = read_json(path)
        for key in ("settings", "prompt"):
            if old.get(key) != meta[key]:
                diff = sorted(k for k in set(old.get(key, {})) | set(meta[key])
                              if old.get(key, {}).get(k) != meta[key].get(k))
                raise GraftError(f"{out_dir}: holds results made with other {key} ({', '.join(diff)}); "
                                 f"use another --out or --force to start it over")
        meta["benchmarks"] = dict(old.get("benchmarks", {}))
    elif os.path.isdir(out_dir) and force:
        for f in os.listdir(out_dir):
            if RUN_FILE_RE.match(f) or f in ("summary.json", "meta.json"):
                os.remove(os.path.join(out_dir, f))
    for b, probs in benches:
        fp = {"source": b.source, "num_problems": len(probs), "fingerprint": problems_fingerprint(probs)}
        if getattr(b, "kind", "math") != "math":  # math folders keep their identity
            fp["kind"] = b.kind
        old_fp = meta["benchmarks"].get(b.name)
        if old_fp and old_fp["fingerprint"] != fp["fingerprint"]:
            raise GraftError(f"{out_dir}: benchmark {b.name!r} was evaluated on a different problem set "
                             f"({old_fp['source']}); use another --out or --force")
        meta["benchmarks"][b.name] = fp
    os.makedirs(out_dir, exist_ok=True)
    atomic_write_json(path, meta)


# ---------------------------------------------------------------------------------------- one model
def context_length(model) -> int | None:
    """The model's context in tokens (``config.max_position_embeddings``), None when it does not say."""
    n = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def code_prompt_spec(spec):
    """The prompt of a code benchmark: its problem text is the whole user message (graft_cli/data/code_problems.py),
    so no suffix is added; the chat template (or none) is the evaluation's."""
    import dataclasses

    return dataclasses.replace(spec, suffix="", raw_template="{problem}\n")


class Evaluator:
    """Evaluates one model (an engine + tokenizer) into one folder; resumable per (benchmark, run). ``grader``: one
    grader, or a :class:`Graders` (a code benchmark is then graded by its code grader, with
    :func:`code_prompt_spec`)."""

    def __init__(self, engine, tokenizer, prompt_spec, settings: EvalSettings, grader, progress=None,
                 context_len: int | None = None, console=None):
        self.engine, self.tokenizer, self.spec = engine, tokenizer, prompt_spec
        self.settings, self.grader, self.progress = settings, grader, progress
        self.context_len, self.console = context_len, console

    def todo(self, out_dir: str, benches) -> int:
        """Responses still to generate in ``out_dir`` (for progress totals)."""
        s = self.settings
        return sum(len(p) * s.samples for b, p in benches for k in range(1, s.runs + 1)
                   if not os.path.exists(run_file(out_dir, b.name, k)))

    def run_one(self, out_dir: str, bench: BenchmarkSource, problems, run: int, task=None) -> list[dict]:
        """Generate and grade one (benchmark, run) and write its file; returns its rows."""
        from graft_cli.rollout import SamplingParams

        s = self.settings
        seed = run_seed(s.seed, run)
        rows: list[dict] = []
        skipped = 0
        kind = getattr(bench, "kind", "math")
        grader = self.grader.for_kind(kind) if hasattr(self.grader, "for_kind") else self.grader
        spec = code_prompt_spec(self.spec) if kind == "code" else self.spec
        for c, start in enumerate(range(0, len(problems), CHUNK_PROMPTS)):
            chunk = problems[start:start + CHUNK_PROMPTS]
            prompt_ids = [spec.encode(p.problem, self.tokenizer) for p in chunk]
            # a prompt that leaves no room for max_new_tokens in the model's context is not generated (lm-eval
            # would left-truncate it): it scores 0 and is counted (summary "skipped_long")
            fits = [i for i, ids in enumerate(prompt_ids)
                    if self.context_len is None or len(ids) + s.max_new_tokens <= self.context_len]
            params = SamplingParams(n=s.samples, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                    max_new_tokens=s.max_new_tokens, seed=chunk_seed(seed, c))
            ro = self.engine.generate([prompt_ids[i] for i in fits], params) if fits else None
            golds = [chunk[i].answer for i in fits for _ in range(s.samples)]
            grades = grader.grade(ro.texts, golds) if fits else None
            where = {i: k for k, i in enumerate(fits)}
            for i, p in enumerate(chunk):
                for j in range(s.samples):
                    row = {"benchmark": bench.name, "problem_id": p.id, "problem_index": start + i, "run": run,
                           "sample": j, "seed": seed, "answer": p.answer}
                    if i not in where:
                        row.update(response="", extracted=None, grade=0.0, timed_out=False, truncated=False,
                                   num_tokens=0, skipped="prompt_longer_than_context")
                        rows.append(row)
                        continue
                    r = where[i] * s.samples + j
                    row.update(response=ro.texts[r], extracted=grades.extracted[r], grade=float(grades.rewards[r]),
                               timed_out=bool(grades.timed_out[r]), truncated=bool(ro.truncated[r]),
                               num_tokens=len(ro.response_ids[r]))
                    if "author" in ro.token_columns:  # a co-written answer (handoff): who wrote each token
                        a = ro.token_columns["author"][r]
                        row.update(author=a, senior_frac=sum(a) / len(a) if a else None)
                    rows.append(row)
            skipped += len(chunk) - len(fits)
            if self.progress is not None and task is not None:
                self.progress.advance(task, len(chunk) * s.samples)
        write_jsonl_atomic(run_file(out_dir, bench.name, run), rows)
        if skipped and self.console is not None:
            self.console.print(f"eval {bench.name} run {run}: {skipped} of {len(problems)} prompts leave no room for "
                               f"{s.max_new_tokens} new tokens in the model's {self.context_len}-token context: "
                               f"not generated, scored 0 (summary: skipped_long)", soft_wrap=True)
        return rows

    def evaluate(self, out_dir: str, benches: list[tuple[BenchmarkSource, list]], force: bool = False,
                 task=None, label: str = "") -> dict:
        """Every (benchmark, run) not yet on disk, then ``summary.json``; returns the summary."""
        self.settings.check()
        prepare_folder(out_dir, self.settings, self.spec, benches, force)
        for b, probs in benches:
            for k in range(1, self.settings.runs + 1):
                if os.path.exists(run_file(out_dir, b.name, k)):
                    continue
                if self.progress is not None and task is not None:
                    self.progress.update(task, description=f"{label}{b.name} run{k}")
                self.run_one(out_dir, b, probs, k, task)
        return write_summary(out_dir)


# ------------------------------------------------------------------------------------------ summary
def grades_array(rows: list[dict], num_problems: int, samples: int) -> np.ndarray:
    a = np.full((num_problems, samples), np.nan)
    for r in rows:
        a[int(r["problem_index"]), int(r["sample"])] = float(r["grade"])
    if np.isnan(a).any():
        raise GraftError(f"incomplete run file: {int(np.isnan(a).sum())} of {a.size} grades missing")
    return a


def load_correct(out_dir: str, bench: str, num_problems: int, samples: int) -> np.ndarray:
    """``correct[run, problem, sample]`` from the contiguous run files ``run1, run2, ...``."""
    runs = []
    k = 1
    while os.path.exists(run_file(out_dir, bench, k)):
        runs.append(grades_array(read_jsonl(run_file(out_dir, bench, k)), num_problems, samples))
        k += 1
    return np.stack(runs) if runs else np.zeros((0, num_problems, samples))


def summarize_dir(out_dir: str) -> dict:
    """Summary of every benchmark recorded in ``meta.json`` that has at least one run file."""
    meta = read_json(os.path.join(out_dir, "meta.json"))
    samples = int(meta["settings"]["samples"])
    benches = {}
    for name, fp in meta["benchmarks"].items():
        correct = load_correct(out_dir, name, int(fp["num_problems"]), samples)
        if correct.shape[0] == 0:
            continue
        s = summarize_benchmark(correct)
        s["source"] = fp["source"]
        s["timeouts"] = _count(out_dir, name, correct.shape[0], "timed_out")
        s["truncated"] = _count(out_dir, name, correct.shape[0], "truncated")
        s["skipped_long"] = _count(out_dir, name, correct.shape[0], "skipped")
        if fp.get("kind", "math") != "math":
            s["kind"] = fp["kind"]
        benches[name] = s
    order = [b for b in FIVE if b in benches] + [b for b in benches if b not in FIVE]
    benches = {b: benches[b] for b in order}
    code = [b for b in benches if benches[b].get("kind") == "code"]
    maths = [b for b in benches if b not in code]
    use = list(FIVE) if all(b in benches for b in FIVE) else (maths or code)
    avg = average_over_benchmarks({b: benches[b]["runs"] for b in use})
    avg["five"] = use == list(FIVE)
    out = {"settings": meta["settings"], "prompt": meta["prompt"], "benchmarks": benches, "average": avg,
           "num_runs": min((b["num_runs"] for b in benches.values()), default=0)}
    if code and maths:  # the code benchmarks' own average beside the math one (which "average" holds)
        out["code_average"] = average_over_benchmarks({b: benches[b]["runs"] for b in code})
    return out


def _count(out_dir: str, bench: str, runs: int, key: str) -> int:
    return int(sum(bool(r.get(key)) for k in range(1, runs + 1) for r in read_jsonl(run_file(out_dir, bench, k))))


def write_summary(out_dir: str, extra: dict | None = None) -> dict:
    summary = summarize_dir(out_dir)
    path = os.path.join(out_dir, "summary.json")
    if extra is None and os.path.exists(path):
        old = read_json(path)
        extra = {k: old[k] for k in ("model", "policy", "step") if k in old}
    summary = {**(extra or {}), **summary}
    atomic_write_json(path, summary)
    return summary


# ------------------------------------------------------------------------------ run-level bookkeeping
@dataclass(frozen=True)
class Selection:
    """How ``best.json`` picks each policy's checkpoint: ``metric`` (pass@k) averaged over ``benchmarks`` (empty:
    the benchmark average's, the five when present) of the step folders under ``<run>/<root>/<policy>/``."""

    root: str = "eval"
    metric: str = "pass@1"
    benchmarks: tuple = ()

    @property
    def default(self) -> bool:
        return self.metric == "pass@1" and not self.benchmarks

    def criterion(self) -> str:
        if self.default:
            return ("unweighted benchmark average of pass@1 (five benchmarks when present), mean over the eval runs "
                    "common to all compared steps; ties -> earlier step")
        where = ", ".join(self.benchmarks) or "the benchmark average"
        return (f"{self.metric} (unbiased) on {where}, mean over the eval runs common to all compared steps "
                f"({self.root}/); ties -> earlier step")


def selection_runs(summary: dict, metric: str = "pass@1", benchmarks=()) -> list[float] | None:
    """Per eval run of one step's ``summary.json``: the mean over ``benchmarks`` (empty: the benchmark average's)
    of ``metric`` (pass@k, the unbiased estimator); None when a benchmark or that k is missing."""
    k = int(str(metric).split("@")[1])
    names = list(benchmarks) or list((summary.get("average") or {}).get("benchmarks") or summary["benchmarks"])
    per = []
    for b in names:
        v = summary["benchmarks"].get(b)
        runs = None if v is None else (v["runs"] if k == 1 else ((v.get("pass@k") or {}).get(str(k)) or {}).get("runs"))
        if not runs:
            return None
        per.append(runs)
    if not per:
        return None
    return [float(np.mean([p[r] for p in per])) for r in range(min(len(p) for p in per))]


def write_policy_summary(run_dir: str, policy: str, selection: Selection | None = None) -> dict:
    """``<run>/<root>/<policy>/summary.json`` (root ``eval`` unless ``selection`` says otherwise): every evaluated
    step's average and per-benchmark pass@1, and the best step by ``selection``."""
    sel = selection or Selection()
    pdir = os.path.join(run_dir, sel.root, policy)
    steps = {}
    for step, d in step_dirs(pdir).items():
        s = read_json(os.path.join(d, "summary.json"))
        steps[str(step)] = {
            "average": s["average"]["mean"], "std": s["average"]["std"], "num_runs": s["num_runs"],
            "average_runs": s["average"]["runs"], "five": s["average"].get("five", False),
            "benchmarks": {b: {"mean": v["mean"], "std": v["std"]} for b, v in s["benchmarks"].items()},
        }
        if not sel.default:
            steps[str(step)]["select_runs"] = selection_runs(s, sel.metric, sel.benchmarks)
    best = select_best(steps) if sel.default else select_best(steps, key="select_runs")
    out = {"policy": policy, "steps": steps, "best": best, "criterion": sel.criterion()}
    atomic_write_json(os.path.join(pdir, "summary.json"), out)
    return out


def select_best(steps: dict[str, dict], key: str = "average_runs") -> dict | None:
    """The best step on the benchmark average (graft.md §1 "Checkpoint selection").

    Candidates: steps scored on all five benchmarks when any is, else steps scored on the same benchmark
    set as the latest step. Steps are compared on the mean over the eval runs they all have (run 1 for
    in-training validation; all five when every candidate was fully evaluated). Ties go to the earlier step.
    With another ``key`` (a per-run score list of each step, e.g. ``select_runs`` of :func:`selection_runs`) the
    candidates are the steps that have it, compared the same way."""
    if not steps:
        return None
    items = sorted(((int(k), v) for k, v in steps.items()), key=lambda kv: kv[0])
    if key != "average_runs":
        cands = [(k, v) for k, v in items if v.get(key)]
    elif any(v["five"] for _, v in items):
        cands = [(k, v) for k, v in items if v["five"]]
    else:
        last = set(items[-1][1]["benchmarks"])
        cands = [(k, v) for k, v in items if set(v["benchmarks"]) == last]
    cands = [(k, v) for k, v in cands if v[key]]
    if not cands:
        return None
    R = min(len(v[key]) for _, v in cands)
    scored = [(float(np.mean(v[key][:R])), k) for k, v in cands]
    score, step = max(scored, key=lambda t: (t[0], -t[1]))
    return {"step": step, "score": score, "runs_compared": R, "candidates": len(cands)}


def update_best(run_dir: str, policies: list[str] | None = None, selection: Selection | None = None) -> dict:
    """Recompute ``<run>/best.json`` from the policies' summaries under ``selection.root`` (default ``eval``)."""
    sel = selection or Selection()
    eval_root = os.path.join(run_dir, sel.root)
    if policies is None:
        policies = sorted(d for d in os.listdir(eval_root) if os.path.isdir(os.path.join(eval_root, d))) \
            if os.path.isdir(eval_root) else []
    out = {"criterion": sel.criterion(), "policies": {}}
    for pol in policies:
        summ = write_policy_summary(run_dir, pol, sel)
        best = summ["best"]
        if best is None:
            continue
        entry = dict(best)
        bdir = os.path.join(run_dir, "best", pol)
        ck = checkpoint_dir(run_dir, best["step"], pol)
        if _best_folder_step(bdir) == best["step"]:
            entry["checkpoint"] = os.path.relpath(bdir, run_dir)
        elif os.path.isdir(ck):
            entry["checkpoint"] = os.path.relpath(ck, run_dir)
        else:
            entry["checkpoint"] = None
        out["policies"][pol] = entry
    atomic_write_json(best_path(run_dir), out)
    return out


def _best_folder_step(bdir: str) -> int | None:
    try:
        with open(os.path.join(bdir, "BEST_STEP")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def save_best_weights(run_dir: str, policy: str, step: int, model, tokenizer) -> str:
    """Keep the selected checkpoint's weights at ``<run>/best/<policy>/`` (checkpoint pruning would delete
    it); written under a temporary name and renamed."""
    final = os.path.join(run_dir, "best", policy)
    tmp = f"{final}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    with open(os.path.join(tmp, "BEST_STEP"), "w") as f:
        f.write(f"{step}\n")
    old = f"{final}.old-{os.getpid()}"
    if os.path.exists(final):
        os.rename(final, old)
    os.rename(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


# ------------------------------------------------------------------------------------ progress (rich)
def _progress(enabled: bool, console=None):
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    console = console or make_console(stderr=True)
    return Progress(TextColumn("[bold]eval[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=console, disable=not enabled,
                    transient=False)


def _load_benches(sources: list[BenchmarkSource]) -> list[tuple[BenchmarkSource, list]]:
    return [(b, b.load()) for b in sources]


HELDOUT = "heldout"


def run_benches(cfg, benchmarks, data=None, eval_dir=None, held_out=None) -> list[tuple[BenchmarkSource, list]]:
    """The benchmarks of a run's evaluation; the name ``heldout`` is the training set's held-out slice
    (``data.holdout`` problems, seed ``data.holdout_seed``; ``held_out``: the trainer's copy, else rebuilt)."""
    names = [b for b in (benchmarks.split(",") if isinstance(benchmarks, str) else (benchmarks or [])) if b.strip()]
    rest = [b for b in names if b.strip() != HELDOUT]
    # a run on the tiny task (pair=tiny, tiny3, ...: data.train is a tiny: name) is scored on its synthetic sets
    pair = "tiny" if str(cfg.data.train).startswith("tiny:") else cfg.pair
    out = [] if names and not rest and not data else _load_benches(resolve_benchmarks(rest or None, data, pair,
                                                                                        eval_dir, cfg.eval.lcb_window))
    if len(rest) < len(names):
        if held_out is None:
            from graft_cli.data.problems import load_problems, split_holdout
            from graft_cli.models.loading import resolve_path

            if cfg.data.holdout <= 0:
                raise GraftError("benchmark 'heldout': the run holds no problem out (data.holdout = 0)")
            probs = load_problems(resolve_path(cfg.data.train), cfg.data.fields or None, cfg.data.where or None)
            held_out = split_holdout(probs, cfg.data.holdout, cfg.data.holdout_seed)[1]
        src = f"{cfg.data.train} held out (data.holdout={cfg.data.holdout}, seed {cfg.data.holdout_seed})"
        out.append((BenchmarkSource(HELDOUT, "held-out", src, kind=reward_kind(cfg)), list(held_out)))
    return out


CODE_EVAL_TIMEOUT_S = 20.0  # wall clock per code answer (all its tests) when the run's reward is not code


def reward_kind(cfg) -> str:
    """The benchmark kind a run's own reward grades (its training prompts, rescue re-draws)."""
    return "code" if cfg.reward.name == "code" else "math"


def default_rewards() -> dict:
    """The reward that grades each benchmark kind when nothing else is said: math-verify for ``math``, the
    sandboxed tests (with :data:`CODE_EVAL_TIMEOUT_S`) for ``code``."""
    return {"math": RewardConfig(), "code": RewardConfig(name="code", timeout_s=CODE_EVAL_TIMEOUT_S)}


class Graders:
    """The graders of an evaluation, one per benchmark kind, each built by :func:`graft_cli.reward.make_grader`
    from ``rewards[kind]`` (a ``reward:`` section; :func:`default_rewards` for a kind it leaves out) with
    ``workers`` workers and started on first use; ``given``: graders owned elsewhere (the trainer's), used as they
    are. :meth:`grade` uses the ``default`` kind's (a run's own reward, for re-draws of its training prompts)."""

    def __init__(self, workers: int, default: str = "math", given: dict | None = None, rewards: dict | None = None):
        self.workers, self.default, self.given = workers, default, dict(given or {})
        self.rewards = {**default_rewards(), **(rewards or {})}
        self.made: dict = {}

    def for_kind(self, kind: str):
        if kind in self.given:
            return self.given[kind]
        if kind not in self.made:
            from graft_cli.reward import make_grader

            self.made[kind] = make_grader(self.rewards[kind], num_workers=self.workers)
        return self.made[kind]

    def grade(self, responses, golds):
        return self.for_kind(self.default).grade(responses, golds)

    def close(self) -> None:
        made, self.made = self.made, {}
        for g in made.values():
            g.close()


def run_graders(cfg, workers: int | None = None, given=None) -> Graders:
    """A run's evaluation graders: its own reward (``cfg.reward``, whatever its name) for the benchmarks of its
    kind, the default reward of the other kind with the run's memory cap (and sci-notation reading)."""
    rc, kind = cfg.reward, reward_kind(cfg)
    other = {k: dataclasses.replace(r, memory_mb=rc.memory_mb, sci_notation=rc.sci_notation)
             for k, r in default_rewards().items() if k != kind}
    return Graders(rc.num_workers if workers is None else workers, kind, given, {kind: rc, **other})


def _make_engine(model, tok, engine: str = "hf", engine_kwargs: dict | None = None, max_batch: int = 256):
    from graft_cli.rollout import ENGINES

    return ENGINES.get(engine)(model, tok, max_batch=max_batch, **(engine_kwargs or {}))


def _print_result(console, label: str, summary: dict) -> None:
    from graft_cli.eval.metrics import pm

    cells = [f"{b}={pm(v['mean'], v['std'])}" for b, v in summary["benchmarks"].items()]
    avg = summary["average"]
    console.print(f"{label}: avg={pm(avg['mean'], avg['std'])} ({summary['num_runs']} runs) " + " ".join(cells))


# ------------------------------------------------------------------------------------- entry points
def evaluate_model(model: str, out_dir: str | None = None, benchmarks=None, data: str | None = None,
                   eval_dir: str | None = None, pair: str | None = None, settings: EvalSettings | None = None,
                   prompt_spec=None, dtype: str = "float32", device: str = "auto", engine: str = "hf",
                   max_batch: int = 256, workers: int = 2, timeout_s: float = 5.0, force: bool = False,
                   progress: bool = True, console=None, lcb_window=None) -> str:
    """``graft eval --model PATH``: evaluate one model folder (or hub id, or ``tiny:<role>``) into
    ``out_dir`` (default ``results/eval/<model name>``); returns the folder."""
    from graft_cli.data.prompts import PromptSpec
    from graft_cli.models.loading import load_model, load_tokenizer
    from graft_cli.models.loading import resolve_path

    console = console or make_console(stderr=True)
    settings = settings or EvalSettings()
    settings.check()
    if pair is None and model.startswith("tiny:"):
        pair = "tiny"
    sources = resolve_benchmarks(benchmarks, data, pair, eval_dir, lcb_window)
    benches = _load_benches(sources)
    path = resolve_path(model)
    out_dir = out_dir or os.path.join("results", "eval", re.sub(r"[^A-Za-z0-9_.-]+", "_", model.strip("/")))
    spec = prompt_spec or PromptSpec()
    prepare_folder(out_dir, settings, spec, benches, force)  # refuse a mismatched folder before loading anything
    tok = load_tokenizer(path)
    m = load_model(path, dtype, device)
    grader = Graders(workers, rewards={"math": RewardConfig(timeout_s=timeout_s)})
    try:
        ev = Evaluator(_make_engine(m, tok, engine, max_batch=max_batch), tok, spec, settings, grader,
                       context_len=context_length(m), console=console)
        with _progress(progress, console) as bar:
            ev.progress = bar
            task = bar.add_task(model, total=ev.todo(out_dir, benches))
            ev.evaluate(out_dir, benches, task=task, label="")
        summary = write_summary(out_dir, {"model": model})
    finally:
        grader.close()
    _print_result(console, model, summary)
    console.print(f"eval results: {out_dir}")
    return out_dir


def parse_steps(spec, available: list[int], best: dict[str, int]) -> list[int] | str:
    if spec is None or spec in ("", "all"):
        return sorted(set(available) | set(best.values()))
    if spec == "last":
        return available[-1:]
    if spec == "best":
        return "best"
    try:
        return sorted({int(x) for x in str(spec).split(",") if x.strip()})
    except ValueError:
        raise GraftError(f"--steps {spec!r}: expected all, last, best or a comma-separated list of steps") from None


def run_junior(cfg, junior: str | None = None) -> str:
    """The junior of a run's handoff and legibility evaluations: ``junior``, else ``eval.junior``, else the
    frozen model the run's rollout engine co-generates with (tandem), else the pair's ``tandem.junior``."""
    from graft_cli.rollout import ENGINES

    if junior or cfg.eval.junior:
        return junior or cfg.eval.junior
    frozen = {p.name: p for p in cfg.policies if p.role == "frozen"}
    for k in ENGINES.get(cfg.rollout.engine).frozen_kwargs if cfg.rollout.engine in ENGINES else ():
        name = cfg.rollout.engine_kwargs.get(k)
        if name in frozen:
            return frozen[name].model
    if (cfg.tandem or {}).get("junior"):
        return cfg.tandem["junior"]
    raise GraftError("the handoff and legibility evaluations need a junior: --junior MODEL, or eval.junior / "
                     "tandem.junior in the run's config")


def eval_prompt_spec(cfg):
    """The prompt of a run's evaluations (validation and ``graft eval --run``): the training prompt
    (``prompt.*``) with ``eval.prompt_suffix`` (None: ``prompt.suffix``) and ``eval.prompt_separator`` between
    problem and suffix (SAF-OPD's released evaluation: ``problem + "\n" + suffix``, math_eval/eval_math.py)."""
    from graft_cli.data.prompts import PromptSpec

    ec = cfg.eval
    suffix = cfg.prompt.suffix if ec.prompt_suffix is None else ec.prompt_suffix
    return PromptSpec(suffix, cfg.prompt.chat_template, cfg.prompt.raw_template, ec.prompt_separator)


def final_settings(cfg, runs: int | None = None, samples: int | None = None, temperature: float | None = None,
                   top_p: float | None = None, max_new_tokens: int | None = None,
                   seed: int | None = None, top_k: int | None = None) -> EvalSettings:
    """``graft eval --run``'s settings: each option given, else ``eval.final.<key>``, else the validation's
    ``eval.<key>`` (runs: 5; max new tokens: the training ``rollout.max_new_tokens``)."""
    ec, fc = cfg.eval, cfg.eval.final

    def pick(given, final, validation):
        return given if given is not None else (final if final is not None else validation)

    return EvalSettings(runs=pick(runs, fc.runs, 5), samples=pick(samples, fc.samples, ec.samples),
                        temperature=pick(temperature, fc.temperature, ec.temperature),
                        top_p=pick(top_p, fc.top_p, ec.top_p),
                        max_new_tokens=max_new_tokens or fc.max_new_tokens or ec.max_new_tokens
                        or cfg.rollout.max_new_tokens,
                        seed=pick(seed, fc.seed, ec.seed), top_k=pick(top_k, fc.top_k, ec.top_k))


def validation_settings(cfg) -> EvalSettings:
    """The in-training validation's settings (``eval.*``; max new tokens: the training ``rollout.max_new_tokens``)."""
    ec = cfg.eval
    return EvalSettings(runs=ec.runs, samples=ec.samples, temperature=ec.temperature, top_p=ec.top_p,
                        top_k=ec.top_k, max_new_tokens=ec.max_new_tokens or cfg.rollout.max_new_tokens, seed=ec.seed)


def validation_root(cfg) -> str:
    """Where the in-training validation writes its step folders: ``eval`` when the final evaluation samples as it
    does (``graft eval --run`` then adds runs and benchmarks to the validated steps' folders), else ``validation``
    (Tandem RLVR: validation n = 4 at T 0.6 / top-p 0.95 on the held-out slice, the final evaluation n = 8 at
    T 0.7 / top-p 0.8 / top-k 20; a folder holds one sampling setting)."""
    return "eval" if validation_settings(cfg).identity() == final_settings(cfg).identity() else "validation"


def run_selection(cfg, run_dir: str | None = None) -> Selection:
    """The run's checkpoint selection: ``eval.select_metric`` on ``eval.select_benchmarks`` over the validation's
    folders (:func:`validation_root`); over ``eval/`` when a ``validation/`` root holds nothing (no validation
    ran)."""
    root = validation_root(cfg)
    if root != "eval" and run_dir is not None and not os.path.isdir(os.path.join(run_dir, root)):
        root = "eval"
    return Selection(root, str(cfg.eval.select_metric), tuple(cfg.eval.select_benchmarks or ()))


def load_run_config(run_dir: str):
    from graft_cli import config as C

    path = config_path(run_dir)
    if not os.path.exists(path):
        raise GraftError(f"{run_dir}: not a run directory (no config.yaml)")
    return C.load_yaml(path)


def evaluate_run(run_dir: str, steps=None, policies=None, benchmarks=None, data: str | None = None,
                 eval_dir: str | None = None, runs: int | None = None, samples: int | None = None,
                 temperature: float | None = None, top_p: float | None = None, max_new_tokens: int | None = None,
                 seed: int | None = None, device: str | None = None, workers: int | None = None,
                 force: bool = False, progress: bool = True, console=None, tandem: bool | None = None,
                 junior: str | None = None, rescue: bool | None = None, top_k: int | None = None,
                 lcb_window=None) -> dict:
    """``graft eval --run DIR``: evaluate the run's checkpoints (every policy; ``steps``: ``all`` complete
    checkpoints and the kept best weights (default), ``last``, ``best`` or a list) into
    ``<run>/eval/<policy>/step_NNNNNN/``; then the policy summaries and ``best.json``.

    Settings default to the run's ``eval.final`` section, then its ``eval`` section (temperature, top-p,
    top-k, samples, seed, benchmarks, max new tokens; the latter falls back to the training
    ``rollout.max_new_tokens``, graft.md §1 "same length limits as training"); ``runs`` defaults to
    ``eval.final.runs``, else 5 (:func:`final_settings`). The prompt: :func:`eval_prompt_spec`. With
    ``tandem`` (default: the run's ``eval.tandem``) each checkpoint also gets the handoff and legibility
    evaluations of :mod:`graft_cli.eval.tandem` with the ``junior`` (default :func:`run_junior`) and a pass@k
    plot per policy. With ``rescue`` (default: the
    run's ``eval.rescue``) each policy's last evaluated step also re-draws the run's all-fail prompts
    (:mod:`graft_cli.eval.rescue`) into ``step_N/rescue/`` (``rescue.json``). ``best.json`` is then recomputed
    by the run's selection (:func:`run_selection`: the validation's folders when they sample otherwise, e.g.
    Tandem RLVR's held-out pass@4). Returns policy -> step -> summary."""
    from graft_cli.data.prompts import PromptSpec
    from graft_cli.models.loading import load_model, load_tokenizer, resolve_path
    from graft_cli.rollout import solo_engine
    from graft_cli.train import checkpoint as ckpt

    console = console or make_console(stderr=True)
    cfg = load_run_config(run_dir)
    ec = cfg.eval
    if lcb_window:
        ec.lcb_window = lcb_window
    settings = final_settings(cfg, runs, samples, temperature, top_p, max_new_tokens, seed, top_k)
    settings.check()
    names = [p.name for p in cfg.policies if p.role == "train"]  # frozen models have no checkpoints
    chosen = names if not policies else [p.strip() for p in (policies.split(",") if isinstance(policies, str)
                                                             else policies)]
    for p in chosen:
        if p not in names:
            raise GraftError(f"{run_dir}: no policy {p!r}; policies: {', '.join(names)}")
    if not benchmarks and not data:
        benchmarks = list(ec.final.benchmarks if ec.final.benchmarks is not None else ec.benchmarks) or None
    benches = run_benches(cfg, benchmarks, data, eval_dir or ec.data_dir)
    spec = eval_prompt_spec(cfg)
    train_spec = PromptSpec.from_config(cfg.prompt)  # the rescue re-draw samples training prompts
    from rich.markup import escape

    available = ckpt.valid_steps(checkpoints_dir(run_dir),  # each damaged checkpoint named, skipped
                                 lambda m: console.print(f"[yellow]warning[/]: {escape(m)}", soft_wrap=True))
    best_steps = {p: s for p in chosen if (s := _best_folder_step(os.path.join(run_dir, "best", p))) is not None}
    want = parse_steps(steps, available, best_steps)
    jobs: list[tuple[str, int, str]] = []  # (policy, step, model folder)
    for p in chosen:
        pol_steps = [best_steps[p]] if want == "best" and p in best_steps else ([] if want == "best" else want)
        for s in pol_steps:
            folder = checkpoint_dir(run_dir, s, p)
            if s in available and os.path.isdir(folder):
                jobs.append((p, s, folder))
            elif best_steps.get(p) == s:
                jobs.append((p, s, os.path.join(run_dir, "best", p)))
            elif want not in ("best",) and steps not in (None, "", "all"):
                raise GraftError(f"{run_dir}: no complete checkpoint for policy {p!r} at step {s}; "
                                 f"complete: {', '.join(map(str, available)) or 'none'}")
    if not jobs:
        raise GraftError(f"{run_dir}: no checkpoint to evaluate (complete checkpoints: "
                         f"{', '.join(map(str, available)) or 'none'})")
    tandem = ec.tandem if tandem is None else tandem
    junior = run_junior(cfg, junior) if tandem else None
    if tandem:
        from graft_cli.eval import tandem as TE

        hsettings = TE.handoff_settings(settings, junior, ec.handoff_delimiter)
        jtok = load_tokenizer(resolve_path(junior))
    for p, s, folder in jobs:  # refuse mismatched folders (and a junior of another vocabulary) before loading a model
        prepare_folder(eval_step_dir(run_dir, p, s), settings, spec, benches, force)
        if tandem:
            TE.check_junior(jtok, load_tokenizer(folder), junior, f"{p} step {s}")
            prepare_folder(os.path.join(eval_step_dir(run_dir, p, s), TE.HANDOFF_DIR), hsettings, spec,
                           benches, force)
    jmodel = load_model(resolve_path(junior), cfg.run.dtype, device or cfg.run.device) if tandem else None
    rescue = ec.rescue if rescue is None else rescue
    rescue_step = {p: max(s for q, s, _ in jobs if q == p) for p, _, _ in jobs} if rescue else {}
    grader = run_graders(cfg, workers)
    results: dict[str, dict[int, dict]] = {}
    try:
        with _progress(progress, console) as bar:
            for p, s, folder in jobs:
                out_dir = eval_step_dir(run_dir, p, s)
                tok = load_tokenizer(folder)
                model = load_model(folder, cfg.run.dtype, device or cfg.run.device)
                engine = _make_engine(model, tok, *solo_engine(cfg.rollout.engine, cfg.rollout.engine_kwargs),
                                      max_batch=cfg.rollout.max_batch)
                ev = Evaluator(engine, tok, spec, settings, grader, bar, context_len=context_length(model),
                               console=console)
                label = f"{p} step {s} "
                task = bar.add_task(label, total=ev.todo(out_dir, benches))
                ev.evaluate(out_dir, benches, task=task, label=label)
                summary = write_summary(out_dir, {"model": os.path.relpath(folder, run_dir), "policy": p, "step": s})
                results.setdefault(p, {})[s] = summary
                if tandem:
                    hdir = os.path.join(out_dir, TE.HANDOFF_DIR)
                    hev = Evaluator(TE.handoff_engine(model, tok, jmodel, ec.handoff_delimiter,
                                                      dict(cfg.rollout.engine_kwargs), cfg.rollout.max_batch),
                                    tok, spec, hsettings, grader, bar, context_len=context_length(model),
                                    console=console)
                    task = bar.add_task(label + "handoff ", total=hev.todo(hdir, benches))
                    hev.evaluate(hdir, benches, task=task, label=label + "handoff ")
                    hsum = write_summary(hdir, {"model": os.path.relpath(folder, run_dir), "policy": p, "step": s,
                                                "junior": junior})
                    leg = TE.legibility(jmodel, tok, spec, out_dir, os.path.join(out_dir, TE.LEGIBILITY_DIR),
                                        benches, junior, cfg.optim.micro_batch_tokens, force)
                    _print_result(console, f"{p} step {s} handoff", hsum)
                    console.print(f"{p} step {s} legibility: junior CE {leg['macro_ce']:.4f} nats/token"
                                  if leg["macro_ce"] is not None else f"{p} step {s} legibility: no tokens")
                if rescue_step.get(p) == s:
                    _evaluate_rescue(run_dir, cfg, p, out_dir, engine, model, tok, train_spec, grader, bar, console,
                                     force)
                del model, ev, engine
    finally:
        grader.close()
    sel = run_selection(cfg, run_dir)  # the validation's folders when it samples otherwise (validation_root)
    sel_root = os.path.join(run_dir, sel.root)
    best = update_best(run_dir, sorted(set(names) & set(os.listdir(sel_root) if os.path.isdir(sel_root) else [])),
                       sel)
    if tandem:
        for p in results:
            png = TE.plot_policy_pass_at_k(run_dir, p)
            if png:
                console.print(f"{p}: pass@k curves {png}")
    for p in results:
        for s, summary in results[p].items():
            _print_result(console, f"{p} step {s}", summary)
        if p in best["policies"]:
            b = best["policies"][p]
            what = "avg" if sel.default else f"{sel.metric} on {', '.join(sel.benchmarks) or 'the average'}"
            console.print(f"{p}: best step {b['step']} ({what} {100 * b['score']:.2f})")
    console.print(f"eval results: {os.path.join(run_dir, 'eval')} (best steps: {os.path.join(run_dir, 'best.json')})")
    return results


def _evaluate_rescue(run_dir: str, cfg, policy: str, step_dir: str, engine, model, tok, spec, grader, bar,
                     console, force: bool) -> dict | None:
    """Re-draw the run's all-fail prompts of ``policy`` (capped, :func:`graft_cli.eval.rescue.capped`) with
    the training sampling and write ``<step_dir>/rescue/rescue.json`` (:func:`rescue_summary`)."""
    from graft_cli.data.problems import load_problems
    from graft_cli.eval import rescue as R
    from graft_cli.models.loading import resolve_path

    events = R.capped(R.rescue_events(R.read_logs(run_dir, policy)), cfg.eval.rescue_cap, cfg.eval.seed)
    if not events:
        console.print(f"{policy}: no all-fail prompt in the rollout logs: no rescue evaluation")
        return None
    by_id = {p.id: p for p in load_problems(resolve_path(cfg.data.train), cfg.data.fields or None,
                                            cfg.data.where or None)}
    missing = [e["prompt_id"] for e in events if e["prompt_id"] not in by_id]
    if missing:
        raise GraftError(f"{run_dir}: rollout logs name prompt {missing[0]!r}, which {cfg.data.train} does not hold")
    probs = [by_id[e["prompt_id"]] for e in events]
    rdir = os.path.join(step_dir, R.RESCUE_DIR)
    ro = cfg.rollout
    settings = EvalSettings(runs=1, samples=ro.n, temperature=ro.temperature, top_p=ro.top_p,
                            max_new_tokens=ro.max_new_tokens, seed=cfg.eval.seed)
    bench = [(BenchmarkSource(R.BENCH, "rescue", f"{cfg.data.train}: all-fail prompts of the rollout logs"), probs)]
    prepare_folder(rdir, settings, spec, bench, force)
    ev = Evaluator(engine, tok, spec, settings, grader, bar, context_len=context_length(model), console=console)
    task = bar.add_task(f"{policy} rescue ", total=ev.todo(rdir, bench))
    ev.evaluate(rdir, bench, task=task, label=f"{policy} rescue ")
    correct = load_correct(rdir, R.BENCH, len(probs), ro.n)[0]
    summary = {"policy": policy, "events": events, **R.rescue_summary(events, correct),
               "settings": settings.identity(), "cap": cfg.eval.rescue_cap}
    atomic_write_json(os.path.join(rdir, "rescue.json"), summary)
    rates = ", ".join(f"{k} {v['rescued']}/{v['events']}" for k, v in summary.items()
                      if k in ("admitted", "not_admitted") and v["events"])
    console.print(f"{policy} rescue (>= 1 of {ro.n} correct on a re-draw of its all-fail prompts): {rates}")
    return summary


# --------------------------------------------------------------------------- validation in training
class _ValidationState:
    def __init__(self):
        self.benches = None
        self.warned = False

    def load(self, cfg, trainer) -> list:
        """The validation benchmarks, loaded once (before step 1 by :meth:`ValidationHook.prepare`)."""
        if self.benches is None:
            self.benches = run_benches(cfg, list(cfg.eval.benchmarks), None, cfg.eval.data_dir,
                                       getattr(trainer, "held_out", None))
        return self.benches


def validation_due(step: int, total_steps: int, every: int) -> bool:
    return every > 0 and (step % every == 0 or step == total_steps)


class ValidationHook(AfterStep):
    """The training loop's after-step hook for validation (``train(..., after_step=(ValidationHook(),))``);
    holds the loaded benchmarks across steps. Due at every ``eval.every``-th step and the last; done when every
    policy's ``<root>/<policy>/step_N/summary.json`` is on disk (the evaluator writes it last; root
    :func:`validation_root`)."""

    def __init__(self):
        self.state = _ValidationState()

    def prepare(self, trainer, cfg) -> None:
        """The validation benchmarks, loaded before step 1 (a set that cannot be loaded stops the run before it
        trains, in one line naming it, instead of at the first validation)."""
        dist = getattr(trainer, "dist", None)
        if cfg.eval.every > 0 and not (dist is not None and dist.enabled):
            self.state.load(cfg, trainer)

    def due(self, trainer, cfg) -> bool:
        return validation_due(trainer.step, trainer.total_steps, cfg.eval.every)

    def done(self, trainer, cfg, run_dir: str) -> bool:
        root = validation_root(cfg)
        return all(os.path.exists(os.path.join(eval_step_dir(run_dir, name, trainer.step, root), "summary.json"))
                   for name in trainer.policies)

    def __call__(self, trainer, cfg, run_dir: str, console=None) -> list[dict]:
        return validate_in_training(trainer, cfg, run_dir, console, self.state)


def validate_in_training(trainer, cfg, run_dir: str, console=None, state: _ValidationState | None = None) -> list[dict]:
    """Called by the training loop after each step: when ``eval.every`` > 0 and the step is a multiple of
    it (or the last step), score each policy's current weights with the eval protocol (``eval.runs``
    runs, default 1; ``eval.samples`` at ``eval.temperature``/``eval.top_p``/``eval.top_k``) into
    ``<run>/<root>/<policy>/step_NNNNNN/`` (root ``eval``, or ``validation`` where the final evaluation samples
    otherwise: :func:`validation_root`), update ``best.json`` (:func:`run_selection`) and, with ``eval.save_best``,
    keep a new best policy's weights at ``<run>/best/<policy>/``. Returns ``validation/*`` metrics rows (one per
    policy; ``validation/selection``: the step's selection score when it is not the pass@1 average) for
    metrics.jsonl; ``[]`` when no validation is due. Sampling uses its own seeded generator, so training is
    unaffected."""
    ec = cfg.eval
    if not validation_due(trainer.step, trainer.total_steps, ec.every):
        return []
    st = state if state is not None else _ValidationState()
    dist = getattr(trainer, "dist", None)
    if dist is not None and getattr(dist, "enabled", False):
        if not st.warned:  # sharded models would need every rank in lock-step: evaluate afterwards instead
            st.warned = True
            import warnings

            warnings.warn("eval.every is ignored in data-parallel training; run `graft eval --run DIR` on the "
                          "checkpoints instead", stacklevel=2)
        return []
    from graft_cli.data.prompts import PromptSpec

    st.load(cfg, trainer)
    spec = eval_prompt_spec(cfg)
    if spec == PromptSpec.from_config(cfg.prompt):
        spec = trainer.spec  # the training prompt (no eval.prompt_* setting)
    settings = validation_settings(cfg)
    root, sel = validation_root(cfg), run_selection(cfg)
    rows = []
    graders = run_graders(cfg, given={reward_kind(cfg): trainer.grader})  # the other kind's grader, if needed
    try:
        rows = _validate_policies(trainer, cfg, run_dir, console, st, spec, settings, root, sel, graders)
    finally:
        graders.close()
    if console is not None:
        console.print("validation step {}: {}".format(
            trainer.step, " ".join(f"{r['policy']}={100 * r['validation/score']:.2f}" for r in rows)))
    return rows


def _validate_policies(trainer, cfg, run_dir, console, st, spec, settings, root, sel, graders) -> list[dict]:
    ec = cfg.eval
    rows = []
    for name, pol in trainer.policies.items():
        t0 = time.perf_counter()
        out_dir = eval_step_dir(run_dir, name, trainer.step, root)
        engine = pol.engine.eval_engine()  # tandem: the senior alone
        ev = Evaluator(engine, pol.tokenizer, spec, settings, graders,
                       context_len=context_length(pol.model), console=console)
        ev.evaluate(out_dir, st.benches)
        summary = write_summary(out_dir, {"model": "in-training", "policy": name, "step": trainer.step})
        row = {"step": trainer.step, "policy": name, "validation/score": summary["average"]["mean"]}
        for b, v in summary["benchmarks"].items():
            row[f"validation/{b}"] = v["mean"]
        if not sel.default:
            runs = selection_runs(summary, sel.metric, sel.benchmarks)
            row["validation/selection"] = float(np.mean(runs)) if runs else None
        best = update_best(run_dir, selection=sel)
        b = best["policies"].get(name)
        if ec.save_best and b is not None and b["step"] == trainer.step:
            save_best_weights(run_dir, name, trainer.step, pol.model, pol.tokenizer)
            best = update_best(run_dir, selection=sel)
        row["validation/best_step"] = best["policies"].get(name, {}).get("step")
        row["time/validation"] = time.perf_counter() - t0
        rows.append(row)
    return rows


__all__ = ["EvalSettings", "Evaluator", "evaluate_model", "evaluate_run", "validate_in_training", "ValidationHook",
           "update_best", "write_policy_summary", "select_best", "run_seed", "summarize_dir", "eval_prompt_spec",
           "final_settings", "validation_settings", "validation_root", "run_selection", "Selection",
           "selection_runs"]


def eval_main(run_dir: str | None = None, model: str | None = None, steps=None, policy=None, data=None,
              benchmarks=None, eval_dir=None, pair=None, runs: int | None = None, samples=None, temperature=None,
              top_p=None,
              max_new_tokens=None, seed=None, out=None, dtype: str = "float32", device=None,
              chat_template: str = "auto", workers=None, force: bool = False, progress: bool = True,
              tandem: bool | None = None, junior: str | None = None, top_k: int | None = None, lcb_window=None):
    """The ``graft eval`` command: exactly one of ``run_dir`` / ``model``."""
    if bool(run_dir) == bool(model):
        raise GraftError("give exactly one of --run DIR or --model PATH")
    if run_dir:
        for opt, val in (("--out", out), ("--pair", pair)):
            if val:
                raise GraftError(f"{opt} applies to --model only (a run writes into <run>/eval/; "
                                 f"its pair is in config.yaml)")
        return evaluate_run(run_dir, steps=steps, policies=policy, benchmarks=benchmarks, data=data, eval_dir=eval_dir,
                            runs=runs, samples=samples, temperature=temperature, top_p=top_p,
                            max_new_tokens=max_new_tokens, seed=seed, device=device, workers=workers, force=force,
                            progress=progress, tandem=tandem, junior=junior, top_k=top_k, lcb_window=lcb_window)
    for opt, val in (("--steps", steps), ("--policy", policy), ("--tandem", tandem), ("--junior", junior)):
        if val:
            raise GraftError(f"{opt} applies to --run only")
    from graft_cli.data.prompts import PromptSpec

    d = EvalSettings()
    settings = EvalSettings(runs=d.runs if runs is None else runs, samples=samples or d.samples,
                            temperature=d.temperature if temperature is None else temperature,
                            top_p=d.top_p if top_p is None else top_p,
                            max_new_tokens=max_new_tokens or d.max_new_tokens,
                            seed=d.seed if seed is None else seed, top_k=d.top_k if top_k is None else top_k)
    return evaluate_model(model, out, benchmarks, data, eval_dir, pair, settings,
                          PromptSpec(chat_template=chat_template), dtype, device or "auto",
                          workers=2 if workers is None else workers, force=force, progress=progress,
                          lcb_window=lcb_window)
