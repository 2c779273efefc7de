"""Five-run evaluation of a model or of a run's checkpoints (graft.md §1 "Evaluation", docs/spec/conventions.md §6).

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
from typing import NamedTuple

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from graft_cli.console import make_console
from graft_cli.data.mix import training_problems
from graft_cli.data.prompts import PromptSpec
from graft_cli.errors import GraftError
from graft_cli.eval import rescue as R
from graft_cli.eval import reuse
from graft_cli.eval import tandem_evals as TE
from graft_cli.eval.benchmarks import BenchmarkSource, resolve_benchmarks
from graft_cli.eval.files import RUN_FILE_RE, run_file
from graft_cli.eval.metrics import pm
from graft_cli.eval.setup import (
    CHUNK_PROMPTS,
    EvalSettings,
    Graders,
    check_bench_runs,
    chunk_seed,
    eval_prompt_spec,
    final_settings,
    load_benches,
    load_run_config,
    make_engine,
    parse_bench_runs,
    parse_steps,
    run_benches,
    run_graders,
    run_seed,
    run_selection,
)
from graft_cli.eval.summary import best_folder_step, load_correct, update_best, write_summary
from graft_cli.models.loading import load_model, load_tokenizer, resolve_path
from graft_cli.rollout import solo_engine
from graft_cli.rollout.engine import SamplingParams
from graft_cli.rollout.graded import sample_and_grade
from graft_cli.rundir import (
    atomic_write_json,
    checkpoint_dir,
    checkpoints_dir,
    eval_step_dir,
    read_json,
    remove_stale_temporaries,
    write_jsonl_atomic,
)
from graft_cli.schema import RewardConfig
from graft_cli.train import checkpoint as ckpt


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
    if spec.separator != " ":  # folders made before the separator existed keep their identity
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
        if b.kind != "math":  # math folders keep their identity
            fp["kind"] = b.kind
        old_fp = meta["benchmarks"].get(b.name)
        if old_fp and old_fp["fingerprint"] != fp["fingerprint"]:
            raise GraftError(f"{out_dir}: benchmark {b.name!r} was evaluated on a different problem set "
                             f"({old_fp['source']}); use another --out or --force")
        meta["benchmarks"][b.name] = fp
    os.makedirs(out_dir, exist_ok=True)
    remove_stale_temporaries(out_dir)  # a file a killed evaluation was writing
    atomic_write_json(path, meta)


# ---------------------------------------------------------------------------------------- one model
def context_length(model) -> int | None:
    """The model's context in tokens (``config.max_position_embeddings``), None when it does not say."""
    n = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def code_prompt_spec(spec):
    """The prompt of a code benchmark: its problem text is the whole user message (graft_cli/data/code_problems.py),
    so no suffix is added; the chat template (or none) is the evaluation's."""

    return dataclasses.replace(spec, suffix="", raw_template="{problem}\n")


class Evaluator:
    """Evaluates one model (an engine + tokenizer) into one folder; resumable per (benchmark, run). ``grader``: a
    :class:`Graders` (a code benchmark is then graded by its code grader, with :func:`code_prompt_spec`), or one
    grader, owned by the caller, for every benchmark."""

    def __init__(self, engine, tokenizer, prompt_spec, settings: EvalSettings, grader, progress=None,
                 context_len: int | None = None, console=None):
        self.engine = engine
        self.tokenizer = tokenizer
        self.spec = prompt_spec
        self.settings = settings
        if not isinstance(grader, Graders):
            grader = Graders(0, given={"math": grader, "code": grader})
        self.grader = grader
        self.progress = progress
        self.context_len = context_len
        self.console = console

    def todo(self, out_dir: str, benches) -> int:
        """Responses still to generate in ``out_dir`` (for progress totals)."""
        s = self.settings
        return sum(len(p) * s.samples for b, p in benches for k in range(1, s.runs_for(b.name) + 1)
                   if not os.path.exists(run_file(out_dir, b.name, k)))

    def run_one(self, out_dir: str, bench: BenchmarkSource, problems, run: int, task=None) -> list[dict]:
        """Generate and grade one (benchmark, run) and write its file; returns its rows."""
        s = self.settings
        seed = run_seed(s.seed, run)
        rows: list[dict] = []
        skipped = 0
        kind = bench.kind
        grader = self.grader.for_kind(kind)
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
            if fits:  # read below only for prompts in fits
                graded = sample_and_grade(self.engine, [prompt_ids[i] for i in fits], [chunk[i].answer for i in fits],
                                          params, grader)
                ro, grades = graded.rollouts, graded.grades
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
                    if grades.base is not None and grades.base[r] == grades.base[r]:  # EvalPlus: the base verdict too
                        row["base"] = float(grades.base[r])
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
            for k in range(1, self.settings.runs_for(b.name) + 1):
                if os.path.exists(run_file(out_dir, b.name, k)):
                    continue
                if self.progress is not None and task is not None:
                    self.progress.update(task, description=f"{label}{b.name} run{k}")
                self.run_one(out_dir, b, probs, k, task)
        return write_summary(out_dir)


# ------------------------------------------------------------------------------------ progress (rich)
def _progress(enabled: bool, console=None):
    console = console or make_console(stderr=True)
    return Progress(TextColumn("[bold]eval[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=console, disable=not enabled,
                    transient=False)


def _print_result(console, label: str, summary: dict) -> None:
    cells = [f"{b}={pm(v['mean'], v['std'])}" for b, v in summary["benchmarks"].items()]
    avg = summary["average"]
    console.print(f"{label}: avg={pm(avg['mean'], avg['std'])} ({summary['num_runs']} runs) " + " ".join(cells))


# ------------------------------------------------------------------------------------- entry points
@dataclasses.dataclass
class EvalOptions:
    """The options of ``graft eval`` (:func:`eval_main`): exactly one of ``run_dir`` (``--run``,
    :func:`evaluate_run`) and ``model`` (``--model``, :func:`evaluate_model`). A sampling option left ``None``
    takes the run's own setting (``--run``: :func:`final_settings`) or the protocol's default (``--model``:
    :meth:`model_settings`). ``out``, ``pair``, ``dtype`` and ``chat_template`` are ``--model``'s own; ``steps``,
    ``policies``, ``tandem``, ``junior``, ``rescue`` and ``reuse_dir`` are ``--run``'s."""

    run_dir: str | None = None
    model: str | None = None
    steps: str | None = None  # all (default), last, best or a comma-separated list of steps
    policies: str | list[str] | None = None  # comma-separated or a list; None: every trained policy
    benchmarks: str | list[str] | None = None  # names, NAME=FILE or files (resolve_benchmarks)
    data: str | None = None  # one problem file or hub id instead of the benchmarks
    eval_dir: str | None = None  # folder with <benchmark>.jsonl files
    pair: str | None = None  # 'tiny': the tiny pair's synthetic benchmarks (a tiny:<role> model implies it)
    runs: int | None = None
    bench_runs: dict[str, int] | str | None = None  # benchmark -> runs; eval_main parses the NAME=RUNS,... text
    samples: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_new_tokens: int | None = None
    seed: int | None = None
    out: str | None = None  # --model's output folder [default: results/eval/<model>]
    dtype: str = "float32"
    device: str | None = None  # None: the run's run.device; --model: auto
    chat_template: str = "auto"  # --model: auto | none | required
    workers: int | None = None  # grading workers per kind [default: the run's reward.num_workers; --model: 2]
    lcb_window: str | None = None  # livecodebench contest dates START..END
    force: bool = False  # start output folders made with other settings over
    tandem: bool | None = None  # handoff and legibility evaluations [default: the run's eval.tandem]
    junior: str | None = None  # the tandem junior [default: tandem_evals.run_junior]
    progress: bool = True
    rescue: bool | None = None  # re-draw the all-fail prompts [default: the run's eval.rescue]
    reuse_dir: str | None = None  # a plan's store of evaluations to copy (graft_cli.eval.reuse)

    @classmethod
    def from_cli(cls, *, policy: str | None = None, no_progress: bool = False, **opts) -> EvalOptions:
        """The options from ``graft eval``'s click parameters (``--policy`` is ``policies``, ``--no-progress`` the
        negation of ``progress``)."""
        return cls(policies=policy, progress=not no_progress, **opts)

    def model_settings(self) -> EvalSettings:
        """``--model``'s sampling: each option given, else the default of :class:`EvalSettings` (``samples`` and
        ``max_new_tokens`` also when 0)."""
        d = EvalSettings()
        return EvalSettings(runs=d.runs if self.runs is None else self.runs, samples=self.samples or d.samples,
                            temperature=d.temperature if self.temperature is None else self.temperature,
                            top_p=d.top_p if self.top_p is None else self.top_p,
                            max_new_tokens=self.max_new_tokens or d.max_new_tokens,
                            seed=d.seed if self.seed is None else self.seed,
                            top_k=d.top_k if self.top_k is None else self.top_k, bench_runs=self.bench_runs or {})


def evaluate_model(o: EvalOptions, prompt_spec: PromptSpec | None = None, console=None, *, engine: str = "hf",
                   max_batch: int = 256, timeout_s: float = 5.0) -> str:
    """``graft eval --model PATH``: evaluate one model folder (or hub id, or ``tiny:<role>``), ``o.model``, with
    :meth:`EvalOptions.model_settings` into ``o.out`` (default ``results/eval/<model name>``); returns the folder.
    ``prompt_spec`` defaults to the plain prompt with ``o.chat_template``."""

    model = o.model
    console = console or make_console(stderr=True)
    settings = o.model_settings()
    settings.check()
    pair = "tiny" if o.pair is None and model.startswith("tiny:") else o.pair
    sources = resolve_benchmarks(o.benchmarks, o.data, pair, o.eval_dir, o.lcb_window)
    benches = load_benches(sources)
    check_bench_runs(settings, benches)
    path = resolve_path(model)
    out_dir = o.out or os.path.join("results", "eval", re.sub(r"[^A-Za-z0-9_.-]+", "_", model.strip("/")))
    spec = prompt_spec or PromptSpec(chat_template=o.chat_template)
    prepare_folder(out_dir, settings, spec, benches, o.force)  # refuse a mismatched folder before loading anything
    tok = load_tokenizer(path)
    m = load_model(path, o.dtype, o.device or "auto")
    grader = Graders(2 if o.workers is None else o.workers, rewards={"math": RewardConfig(timeout_s=timeout_s)})
    try:
        ev = Evaluator(make_engine(m, tok, engine, max_batch=max_batch), tok, spec, settings, grader,
                       context_len=context_length(m), console=console)
        with _progress(o.progress, console) as bar:
            ev.progress = bar
            task = bar.add_task(model, total=ev.todo(out_dir, benches))
            ev.evaluate(out_dir, benches, task=task, label="")
        summary = write_summary(out_dir, {"model": model})
    finally:
        grader.close()
    _print_result(console, model, summary)
    console.print(f"eval results: {out_dir}")
    return out_dir


def evaluate_run(o: EvalOptions, console=None) -> dict:
    """``graft eval --run DIR``: evaluate the checkpoints of the run ``o.run_dir`` (every policy; ``steps``:
    ``all`` complete checkpoints and the kept best weights (default), ``last``, ``best`` or a list) into
    ``<run>/eval/<policy>/step_NNNNNN/``; then the policy summaries and ``best.json``.

    Settings default to the run's ``eval.final`` section, then its ``eval`` section (temperature, top-p,
    top-k, samples, seed, benchmarks, max new tokens; the latter falls back to the training
    ``rollout.max_new_tokens``, graft.md §1 "same length limits as training"); ``runs`` defaults to
    ``eval.final.runs``, else 5 (:func:`final_settings`); ``bench_runs`` (benchmark -> runs) gives some
    benchmarks more. The prompt: :func:`eval_prompt_spec`. With ``tandem`` (default: the run's ``eval.tandem``)
    each checkpoint also gets the handoff and legibility evaluations of :mod:`graft_cli.eval.tandem_evals` with the
    ``junior`` (default :func:`~graft_cli.eval.tandem_evals.run_junior`) and a pass@k plot per policy. With
    ``rescue`` (default: the run's ``eval.rescue``) each policy's last evaluated step also re-draws the run's
    all-fail prompts (:mod:`graft_cli.eval.rescue`) into ``step_N/rescue/`` (``rescue.json``). With ``reuse_dir``
    (a plan's), a checkpoint evaluated before with the same weights and settings (another seed's step 0) is copied,
    not sampled again (:mod:`graft_cli.eval.reuse`). ``best.json`` is then recomputed by the run's selection
    (:func:`run_selection`: the validation's folders when they sample otherwise, e.g. Tandem RLVR's held-out
    pass@4). Returns policy -> step -> summary."""
    run_dir = o.run_dir
    console = console or make_console(stderr=True)
    cfg = load_run_config(run_dir)
    ec = cfg.eval
    if o.lcb_window:
        ec.lcb_window = o.lcb_window
    settings = final_settings(cfg, o.runs, o.samples, o.temperature, o.top_p, o.max_new_tokens, o.seed, o.top_k,
                              o.bench_runs)
    settings.check()
    names = [p.name for p in cfg.policies if p.role == "train"]  # frozen models have no checkpoints
    benchmarks = o.benchmarks
    if not benchmarks and not o.data:
        benchmarks = list(ec.final.benchmarks if ec.final.benchmarks is not None else ec.benchmarks) or None
    benches = run_benches(cfg, benchmarks, o.data, o.eval_dir or ec.data_dir)
    check_bench_runs(settings, benches)
    jobs = _run_jobs(names, o, console)
    tandem = ec.tandem if o.tandem is None else o.tandem
    ctx = _RunContext(cfg, o, console, settings, eval_prompt_spec(cfg), benches,
                      junior=TE.run_junior(cfg, o.junior) if tandem else None)
    ctx.prepare(jobs)  # refuse mismatched folders (and a junior of another vocabulary) before loading a model
    rescue = ec.rescue if o.rescue is None else o.rescue
    rescue_step = {j.policy: max(k.step for k in jobs if k.policy == j.policy) for j in jobs} if rescue else {}
    ctx.grader = run_graders(cfg, o.workers)
    results: dict[str, dict[int, dict]] = {}
    try:
        with _progress(o.progress, console) as bar:
            ctx.bar = bar
            for job in jobs:
                is_last = rescue_step.get(job.policy) == job.step
                results.setdefault(job.policy, {})[job.step] = ctx.evaluate(job, rescue=is_last)
    finally:
        ctx.grader.close()
    _report_run(run_dir, cfg, names, results, tandem, console)
    return results


class _Job(NamedTuple):
    """One checkpoint of :func:`evaluate_run`: a policy at a step, its weights in ``folder``."""

    policy: str
    step: int
    folder: str


def _run_jobs(names: list[str], o: EvalOptions, console) -> list[_Job]:
    """The checkpoints of ``o.run_dir`` to evaluate: ``o.policies`` (default every trained policy) at ``o.steps``
    (``all`` complete checkpoints and the kept best weights, ``last``, ``best`` or a list)."""
    run_dir = o.run_dir
    chosen = names if not o.policies else [p.strip() for p in (o.policies.split(",") if isinstance(o.policies, str)
                                                               else o.policies)]
    for p in chosen:
        if p not in names:
            raise GraftError(f"{run_dir}: no policy {p!r}; policies: {', '.join(names)}")
    available = ckpt.valid_steps(checkpoints_dir(run_dir),  # each damaged checkpoint named, skipped
                                 lambda m: console.print(f"[yellow]warning[/]: {escape(m)}", soft_wrap=True))
    best_steps = {p: s for p in chosen if (s := best_folder_step(os.path.join(run_dir, "best", p))) is not None}
    want = parse_steps(o.steps, available, best_steps)
    jobs: list[_Job] = []
    for p in chosen:
        pol_steps = [best_steps[p]] if want == "best" and p in best_steps else ([] if want == "best" else want)
        for s in pol_steps:
            folder = checkpoint_dir(run_dir, s, p)
            if s in available and os.path.isdir(folder):
                jobs.append(_Job(p, s, folder))
            elif best_steps.get(p) == s:
                jobs.append(_Job(p, s, os.path.join(run_dir, "best", p)))
            elif want not in ("best",) and o.steps not in (None, "", "all"):
                raise GraftError(f"{run_dir}: no complete checkpoint for policy {p!r} at step {s}; "
                                 f"complete: {', '.join(map(str, available)) or 'none'}")
    if not jobs:
        raise GraftError(f"{run_dir}: no checkpoint to evaluate (complete checkpoints: "
                         f"{', '.join(map(str, available)) or 'none'})")
    return jobs


@dataclasses.dataclass
class _RunContext:
    """What every checkpoint of one :func:`evaluate_run` is evaluated with."""

    cfg: object
    o: EvalOptions
    console: object
    settings: EvalSettings
    spec: PromptSpec
    benches: list
    junior: str | None = None
    grader: object = None
    bar: object = None
    hsettings: EvalSettings | None = None
    jmodel: object = None

    @property
    def run_dir(self) -> str:
        return self.o.run_dir

    def prepare(self, jobs: list[_Job]) -> None:
        """Every output folder checked against its settings (the handoff's too, with a junior of the same
        vocabulary), then the tandem junior loaded."""
        cfg, o = self.cfg, self.o
        if self.junior:
            self.hsettings = TE.handoff_settings(self.settings, self.junior, cfg.eval.handoff_delimiter)
            jtok = load_tokenizer(resolve_path(self.junior))
        for job in jobs:
            step_dir = eval_step_dir(self.run_dir, job.policy, job.step)
            prepare_folder(step_dir, self.settings, self.spec, self.benches, o.force)
            if self.junior:
                TE.check_junior(jtok, load_tokenizer(job.folder), self.junior, f"{job.policy} step {job.step}")
                prepare_folder(os.path.join(step_dir, TE.HANDOFF_DIR), self.hsettings, self.spec, self.benches,
                               o.force)
        if self.junior:
            self.jmodel = load_model(resolve_path(self.junior), cfg.run.dtype, o.device or cfg.run.device)

    def evaluate(self, job: _Job, rescue: bool) -> dict:
        """One checkpoint (``job``): sampled and graded into ``eval/<policy>/step_N/`` (or copied from the reuse
        store), its handoff and legibility (tandem), its rescue re-draw (``rescue``); returns its summary."""
        cfg, o = self.cfg, self.o
        out_dir = eval_step_dir(self.run_dir, job.policy, job.step)
        tok = load_tokenizer(job.folder)
        model = load_model(job.folder, cfg.run.dtype, o.device or cfg.run.device)
        engine = make_engine(model, tok, *solo_engine(cfg.rollout.engine, cfg.rollout.engine_kwargs),
                             max_batch=cfg.rollout.max_batch)
        ev = Evaluator(engine, tok, self.spec, self.settings, self.grader, self.bar, context_len=context_length(model),
                       console=self.console)
        label = f"{job.policy} step {job.step} "
        key = reuse.reuse_key(job.folder, out_dir, {
            "dtype": cfg.run.dtype, "device": str(o.device or cfg.run.device).split(":")[0],
            "engine": cfg.rollout.engine, "engine_kwargs": cfg.rollout.engine_kwargs,
            "max_batch": cfg.rollout.max_batch, "reward": cfg.reward}) if o.reuse_dir else None
        with reuse.shared(o.reuse_dir, key, out_dir) as copied:
            if copied:
                self.console.print(f"{job.policy} step {job.step}: {copied} evaluation file(s) of the same weights "
                                   f"and settings reused from {o.reuse_dir}")
            task = self.bar.add_task(label, total=ev.todo(out_dir, self.benches))
            ev.evaluate(out_dir, self.benches, task=task, label=label)
        summary = write_summary(out_dir, {"model": os.path.relpath(job.folder, self.run_dir), "policy": job.policy,
                                          "step": job.step})
        if self.junior:
            self.tandem(job, model, tok, out_dir)
        if rescue:
            self.rescue(job.policy, out_dir, engine, model, tok)
        return summary

    def tandem(self, job: _Job, model, tok, out_dir: str) -> None:
        """Tandem RLVR's handoff evaluation (the junior finishes what the checkpoint starts) and the junior's
        legibility of the checkpoint's own answers."""
        cfg, console = self.cfg, self.console
        label = f"{job.policy} step {job.step} "
        hdir = os.path.join(out_dir, TE.HANDOFF_DIR)
        hev = Evaluator(TE.handoff_engine(model, tok, self.jmodel, cfg.eval.handoff_delimiter,
                                          dict(cfg.rollout.engine_kwargs), cfg.rollout.max_batch),
                        tok, self.spec, self.hsettings, self.grader, self.bar, context_len=context_length(model),
                        console=console)
        task = self.bar.add_task(label + "handoff ", total=hev.todo(hdir, self.benches))
        hev.evaluate(hdir, self.benches, task=task, label=label + "handoff ")
        hsum = write_summary(hdir, {"model": os.path.relpath(job.folder, self.run_dir), "policy": job.policy,
                                    "step": job.step, "junior": self.junior})
        leg = TE.legibility(self.jmodel, tok, self.spec, out_dir, os.path.join(out_dir, TE.LEGIBILITY_DIR),
                            self.benches, self.junior, cfg.optim.micro_batch_tokens, self.o.force)
        _print_result(console, f"{label}handoff", hsum)
        console.print(f"{label}legibility: junior CE {leg['macro_ce']:.4f} nats/token"
                      if leg["macro_ce"] is not None else f"{label}legibility: no tokens")

    def rescue(self, policy: str, step_dir: str, engine, model, tok) -> dict | None:
        """Re-draw the run's all-fail prompts of ``policy`` (capped, :func:`graft_cli.eval.rescue.capped`) with
        the training sampling and the training prompt, and write ``<step_dir>/rescue/rescue.json``
        (:func:`rescue_summary`)."""

        cfg, console = self.cfg, self.console
        events = R.capped(R.rescue_events(R.read_logs(self.run_dir, policy)), cfg.eval.rescue_cap, cfg.eval.seed)
        if not events:
            console.print(f"{policy}: no all-fail prompt in the rollout logs: no rescue evaluation")
            return None
        by_id = {p.id: p for p in training_problems(cfg.data, resolve_path(cfg.data.train))}
        missing = [e["prompt_id"] for e in events if e["prompt_id"] not in by_id]
        if missing:
            raise GraftError(f"{self.run_dir}: rollout logs name prompt {missing[0]!r}, which {cfg.data.train} does "
                             f"not hold")
        probs = [by_id[e["prompt_id"]] for e in events]
        rdir = os.path.join(step_dir, R.RESCUE_DIR)
        ro = cfg.rollout
        settings = EvalSettings(runs=1, samples=ro.n, temperature=ro.temperature, top_p=ro.top_p,
                                max_new_tokens=ro.max_new_tokens, seed=cfg.eval.seed)
        bench = [(BenchmarkSource(R.BENCH, "rescue", f"{cfg.data.train}: all-fail prompts of the rollout logs"),
                  probs)]
        spec = PromptSpec.from_config(cfg.prompt)
        prepare_folder(rdir, settings, spec, bench, self.o.force)
        ev = Evaluator(engine, tok, spec, settings, self.grader, self.bar, context_len=context_length(model),
                       console=console)
        task = self.bar.add_task(f"{policy} rescue ", total=ev.todo(rdir, bench))
        ev.evaluate(rdir, bench, task=task, label=f"{policy} rescue ")
        correct = load_correct(rdir, R.BENCH, len(probs), ro.n)[0]
        summary = {"policy": policy, "events": events, **R.rescue_summary(events, correct),
                   "settings": settings.identity(), "cap": cfg.eval.rescue_cap}
        atomic_write_json(os.path.join(rdir, "rescue.json"), summary)
        rates = ", ".join(f"{k} {v['rescued']}/{v['events']}" for k, v in summary.items()
                          if k in ("admitted", "not_admitted") and v["events"])
        console.print(f"{policy} rescue (>= 1 of {ro.n} correct on a re-draw of its all-fail prompts): {rates}")
        return summary

def _report_run(run_dir: str, cfg, names: list[str], results: dict, tandem: bool, console) -> None:
    """``best.json`` recomputed by the run's selection, the tandem pass@k plots, and every result printed."""
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


def eval_main(o: EvalOptions):
    """The ``graft eval`` command: :func:`evaluate_run` for ``o.run_dir`` or :func:`evaluate_model` for ``o.model``
    (exactly one), each refusing the other's own options."""
    if bool(o.run_dir) == bool(o.model):
        raise GraftError("give exactly one of --run DIR or --model PATH")
    if o.bench_runs is not None:
        o = dataclasses.replace(o, bench_runs=parse_bench_runs(o.bench_runs))
    if o.run_dir:
        for opt, val in (("--out", o.out), ("--pair", o.pair)):
            if val:
                raise GraftError(f"{opt} applies to --model only (a run writes into <run>/eval/; "
                                 f"its pair is in config.yaml)")
        return evaluate_run(o)
    for opt, val in (("--steps", o.steps), ("--policy", o.policies), ("--tandem", o.tandem),
                     ("--junior", o.junior)):
        if val:
            raise GraftError(f"{opt} applies to --run only")
    return evaluate_model(o)
