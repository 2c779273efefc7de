"""What an evaluation runs with: its sampling settings (:class:`EvalSettings`, the per-run and
per-chunk seeds), the benchmarks, the graders of the run's reward, the rollout engine, and the
settings, selection and folders a run's config implies for validation and final evaluation."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from graft_cli import config as C
from graft_cli.data.mix import training_problems
from graft_cli.data.problems import split_holdout
from graft_cli.data.prompts import PromptSpec
from graft_cli.errors import GraftError
from graft_cli.eval.benchmarks import BenchmarkSource, resolve_benchmarks
from graft_cli.eval.summary import Selection
from graft_cli.models.loading import resolve_path
from graft_cli.reward import make_grader
from graft_cli.rollout import ENGINES
from graft_cli.rundir import config_path
from graft_cli.schema import RewardConfig

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
    bench_runs: dict = field(default_factory=dict)  # benchmark -> runs where it differs from ``runs``

    def runs_for(self, bench: str) -> int:
        """The runs of benchmark ``bench``: its ``bench_runs`` entry, else ``runs``. A small
        benchmark gets more runs where its sampling noise dominates a study's interval
        (docs/studies.md); runs only add files, so a folder's identity does not depend on them."""
        return int(self.bench_runs.get(bench, self.runs))

    def identity(self) -> dict:
        """What the files of a folder depend on (``runs`` only adds files); ``top_k`` only when on,
        so folders made before it existed keep their identity."""
        return {"samples": self.samples, "temperature": self.temperature, "top_p": self.top_p,
                "max_new_tokens": self.max_new_tokens, "seed": self.seed,
                **({"top_k": self.top_k} if self.top_k > 0 else {}), **self.extra}

    def check(self) -> None:
        if self.runs < 1:
            raise GraftError(f"--runs must be >= 1, got {self.runs}")
        for b, r in self.bench_runs.items():
            if not isinstance(r, int) or isinstance(r, bool) or r < 1:
                raise GraftError(f"--bench-runs {b}={r}: runs must be a whole number >= 1")
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


def parse_bench_runs(raw, where: str = "--bench-runs") -> dict[str, int]:
    """``{benchmark: runs}`` from a mapping or ``"aime24=5,aime25=5"``; one line naming ``where``
    when malformed."""
    if isinstance(raw, str):
        pairs = [x.strip() for x in raw.split(",") if x.strip()]
        if any("=" not in x for x in pairs):
            raise GraftError(f"{where}: expected NAME=RUNS[,NAME=RUNS...], got {raw!r}")
        raw = dict(x.split("=", 1) for x in pairs)
    if not isinstance(raw, dict):
        raise GraftError(f"{where}: must be a mapping benchmark -> runs, got {raw!r}")
    out = {}
    for b, r in raw.items():
        try:
            n = int(str(r).strip())
        except ValueError:
            n = 0
        if n < 1 or isinstance(r, bool) or (isinstance(r, float) and r != int(r)):
            raise GraftError(f"{where}: {b}: runs must be a whole number >= 1, got {r!r}")
        out[str(b).strip()] = n
    return out


def check_bench_runs(settings: EvalSettings, benches) -> None:
    """One line when ``bench_runs`` names a benchmark the evaluation does not score."""
    names = {b.name for b, _ in benches}
    unknown = sorted(set(settings.bench_runs) - names)
    if unknown:
        raise GraftError(f"--bench-runs: {', '.join(unknown)} not among the evaluated benchmarks "
                         f"({', '.join(sorted(names))})")


def parse_steps(spec, available: list[int], best: dict[str, int]) -> list[int] | str:
    """The checkpoint steps ``--steps`` names: ``all`` (or none) the ``available`` ones and each
    policy's ``best`` step, ``last`` the newest available, ``best`` the string ``"best"``, else the
    comma-separated steps."""
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


def run_seed(base: int, run: int) -> int:
    """Sampling seed of eval run ``run`` (1-based): distinct per run, independent of the checkpoint,
    so every checkpoint is scored on the same random stream (common random numbers)."""
    return (int(base) * 1_000_003 + int(run) * 7_919 + 12_345) % (2**31 - 1)


def chunk_seed(seed: int, chunk: int) -> int:
    return (seed * 31 + chunk * 104_729 + 1) % (2**31 - 1)



def load_benches(sources: list[BenchmarkSource]) -> list[tuple[BenchmarkSource, list]]:
    return [(b, b.load()) for b in sources]


HELDOUT = "heldout"


def run_benches(cfg, benchmarks, data=None, eval_dir=None, held_out=None) -> list[tuple[BenchmarkSource, list]]:
    """The benchmarks of a run's evaluation; the name ``heldout`` is the training set's held-out
    slice (``data.holdout`` problems, seed ``data.holdout_seed``; ``held_out``: the trainer's copy,
    else rebuilt)."""
    names = [b for b in (benchmarks.split(",") if isinstance(benchmarks, str) else (benchmarks or [])) if b.strip()]
    rest = [b for b in names if b.strip() != HELDOUT]
    # a run on the tiny task (pair=tiny, tiny3, ...: data.train is a tiny: name) is scored on its
    # synthetic sets
    pair = "tiny" if str(cfg.data.train).startswith("tiny:") else cfg.pair
    out = [] if names and not rest and not data else load_benches(resolve_benchmarks(rest or None, data, pair,
                                                                                        eval_dir, cfg.eval.lcb_window))
    if len(rest) < len(names):
        if held_out is None:
            if cfg.data.holdout <= 0:
                raise GraftError("benchmark 'heldout': the run holds no problem out (data.holdout = 0)")
            probs = training_problems(cfg.data, resolve_path(cfg.data.train))
            held_out = split_holdout(probs, cfg.data.holdout, cfg.data.holdout_seed, cfg.data.holdout_distinct)[1]
        src = f"{cfg.data.train} held out (data.holdout={cfg.data.holdout}, seed {cfg.data.holdout_seed})"
        out.append((BenchmarkSource(HELDOUT, "held-out", src, kind=reward_kind(cfg)), list(held_out)))
    return out


CODE_EVAL_TIMEOUT_S = 20.0  # wall clock per code answer (all its tests) when the run's reward is not code


def reward_kind(cfg) -> str:
    """The benchmark kind a run's own reward grades (its training prompts, rescue re-draws)."""
    return "code" if cfg.reward.name == "code" else "math"


def default_rewards() -> dict:
    """The reward that grades each benchmark kind when nothing else is said: math-verify for
    ``math``, the sandboxed tests (with :data:`CODE_EVAL_TIMEOUT_S`) for ``code``."""
    return {"math": RewardConfig(), "code": RewardConfig(name="code", timeout_s=CODE_EVAL_TIMEOUT_S)}


class Graders:
    """The graders of an evaluation, one per benchmark kind, each built by
    :func:`graft_cli.reward.make_grader` from ``rewards[kind]`` (a ``reward:`` section;
    :func:`default_rewards` for a kind it leaves out) with ``workers`` workers and started on first
    use; ``given``: graders owned elsewhere (the trainer's), used as they are. :meth:`grade` uses
    the ``default`` kind's (a run's own reward, for re-draws of its training prompts)."""

    def __init__(self, workers: int, default: str = "math", given: dict | None = None, rewards: dict | None = None):
        self.workers = workers
        self.default = default
        self.given = dict(given or {})
        self.rewards = {**default_rewards(), **(rewards or {})}
        self.made: dict = {}

    def for_kind(self, kind: str):
        if kind in self.given:
            return self.given[kind]
        if kind not in self.made:
            self.made[kind] = make_grader(self.rewards[kind], num_workers=self.workers)
        return self.made[kind]

    def grade(self, responses, golds):
        return self.for_kind(self.default).grade(responses, golds)

    def close(self) -> None:
        made, self.made = self.made, {}
        for g in made.values():
            g.close()


def run_graders(cfg, workers: int | None = None, given=None) -> Graders:
    """A run's evaluation graders: its own reward (``cfg.reward``, whatever its name) for the
    benchmarks of its kind, the default reward of the other kind with the run's memory cap (and
    sci-notation reading)."""
    rc, kind = cfg.reward, reward_kind(cfg)
    other = {k: dataclasses.replace(r, memory_mb=rc.memory_mb, sci_notation=rc.sci_notation)
             for k, r in default_rewards().items() if k != kind}
    return Graders(rc.num_workers if workers is None else workers, kind, given, {kind: rc, **other})


def make_engine(model, tok, engine: str = "hf", engine_kwargs: dict | None = None, max_batch: int = 256):
    return ENGINES.get(engine)(model, tok, max_batch=max_batch, **(engine_kwargs or {}))



def eval_prompt_spec(cfg):
    """The prompt of a run's evaluations (validation and ``graft eval --run``): the training prompt
    (``prompt.*``) with ``eval.prompt_suffix`` (None: ``prompt.suffix``) and
    ``eval.prompt_separator`` between problem and suffix (SAF-OPD's released evaluation: ``problem +
    "\n" + suffix``, math_eval/eval_math.py)."""

    ec = cfg.eval
    suffix = cfg.prompt.suffix if ec.prompt_suffix is None else ec.prompt_suffix
    return PromptSpec(suffix, cfg.prompt.chat_template, cfg.prompt.raw_template, ec.prompt_separator)


def final_settings(cfg, runs: int | None = None, samples: int | None = None, temperature: float | None = None,
                   top_p: float | None = None, max_new_tokens: int | None = None,
                   seed: int | None = None, top_k: int | None = None, bench_runs: dict | None = None) -> EvalSettings:
    """``graft eval --run``'s settings: each option given, else ``eval.final.<key>``, else the
    validation's ``eval.<key>`` (runs: 5; per-benchmark runs: ``eval.final.bench_runs``; max new
    tokens: the training ``rollout.max_new_tokens``)."""
    ec, fc = cfg.eval, cfg.eval.final

    def pick(given, final, validation):
        return given if given is not None else (final if final is not None else validation)

    return EvalSettings(runs=pick(runs, fc.runs, 5), samples=pick(samples, fc.samples, ec.samples),
                        temperature=pick(temperature, fc.temperature, ec.temperature),
                        top_p=pick(top_p, fc.top_p, ec.top_p),
                        max_new_tokens=max_new_tokens or fc.max_new_tokens or ec.max_new_tokens
                        or cfg.rollout.max_new_tokens,
                        seed=pick(seed, fc.seed, ec.seed), top_k=pick(top_k, fc.top_k, ec.top_k),
                        bench_runs={str(k): int(v) for k, v in dict(pick(bench_runs, fc.bench_runs or None, {})
                                                                    or {}).items()})


def validation_settings(cfg) -> EvalSettings:
    """The in-training validation's settings (``eval.*``; max new tokens: the training
    ``rollout.max_new_tokens``)."""
    ec = cfg.eval
    return EvalSettings(runs=ec.runs, samples=ec.samples, temperature=ec.temperature, top_p=ec.top_p,
                        top_k=ec.top_k, max_new_tokens=ec.max_new_tokens or cfg.rollout.max_new_tokens, seed=ec.seed)


def validation_root(cfg) -> str:
    """Where the in-training validation writes its step folders: ``eval`` when the final evaluation
    samples as it does (``graft eval --run`` then adds runs and benchmarks to the validated steps'
    folders), else ``validation`` (Tandem RLVR: validation n = 4 at T 0.6 / top-p 0.95 on the
    held-out slice, the final evaluation n = 8 at T 0.7 / top-p 0.8 / top-k 20; a folder holds one
    sampling setting)."""
    return "eval" if validation_settings(cfg).identity() == final_settings(cfg).identity() else "validation"


def run_selection(cfg, run_dir: str | None = None) -> Selection:
    """The run's checkpoint selection: ``eval.select_metric`` on ``eval.select_benchmarks`` over the
    validation's folders (:func:`validation_root`); over ``eval/`` when a ``validation/`` root holds
    nothing (no validation ran)."""
    root = validation_root(cfg)
    if root != "eval" and run_dir is not None and not os.path.isdir(os.path.join(run_dir, root)):
        root = "eval"
    return Selection(root, str(cfg.eval.select_metric), tuple(cfg.eval.select_benchmarks or ()))


def load_run_config(run_dir: str):
    path = config_path(run_dir)
    if not os.path.exists(path):
        raise GraftError(f"{run_dir}: not a run directory (no config.yaml)")
    return C.load_yaml(path)
