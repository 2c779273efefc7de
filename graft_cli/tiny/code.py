"""The tiny code models: SAF-OPD's code domain on a CPU, built the way the arithmetic pair is.

``tiny_code:<name>`` (a model source declared in pyproject.toml: :func:`resolve_tiny_code`)
resolves, building on first use into ``<tiny cache>/code/`` with its own ``manifest.json`` (the
arithmetic pair's cache and hashes are not touched):

* ``tiny_code:junior``: the student, an early snapshot (step ``junior_step``) of a from-scratch SFT
  run on the synthetic "write a one-line Python function" task
  (:mod:`graft_cli.data.synthetic_code`): clearly weaker than the teacher and unsure where it is
  not, as the arithmetic junior is (the SAF student role);
* ``tiny_code:teacher``: that run continued on a balanced, harder mix (levels 1:2:2 instead of
  2:2:1), its logits then sharpened x6 (:func:`graft_cli.tiny.sft.sharpen`; the arithmetic teacher's
  x4 left OPD's advantages at ~4x GRPO's on this task, below SAF-OPD's regime), as the arithmetic
  teacher is built (an instruct-like teacher, confident where its student is unsure);
* ``tiny_code:train`` and ``tiny_code:eval``: the task's training set (4,000 problems) and held-out
  set (300), the ``tiny_code`` benchmark of ``graft eval``.

Both models are ``a``'s architecture (a ``Qwen3ForCausalLM``, hidden 192, 4 layers, 4/2 heads, MLP
576, tied embeddings) with their own Qwen-style byte-level BPE trained on the code task's text
(prompt + reference response; vocabulary 512, digits single tokens), so a program is ~20-30 tokens
and a prompt ~50-70. The SFT target is :func:`graft_cli.data.synthetic_code.reference_response` (the
one-liner in a python fence) after the prompt ``"{problem}\\n"`` (``PromptSpec(suffix="",
raw_template="{problem}\\n")``: what a code benchmark's prompt is in ``graft eval``, and what the
code runs' task overlay sets, experiments/task/tiny_code.yaml; the math suffix asks for a boxed
answer). The build is single-threaded with a fixed seed, its weight hashes in the manifest
(bit-identity per CPU type, as the pair's: docs/tiny_pair.md). """

from __future__ import annotations

import contextlib
import json
import os
import random
import time
from dataclasses import asdict, dataclass

import torch
from rich.table import Table

from graft_cli.console import make_console
from graft_cli.data.prompts import PromptSpec
from graft_cli.data.synthetic_code import FAMILIES, make_problem, reference_response, write_task
from graft_cli.errors import GraftError
from graft_cli.reward import make_grader
from graft_cli.rollout.engine import SamplingParams
from graft_cli.rollout.graded import sample_and_grade
from graft_cli.rollout.hf import HFEngine
from graft_cli.rundir import atomic_write_text
from graft_cli.schema import RewardConfig
from graft_cli.tiny.build import _deterministic_single_thread, _file_hash, _lock, _save, default_cache_dir
from graft_cli.tiny.sft import Shape, Stage, make_model, num_params, sft, sharpen
from graft_cli.tiny.tokenizers import EOS_A, PAD_A, QWEN_PRETOKENIZE, _prompt_text

CODE_VERSION = 1
ROLES = ("junior", "teacher")
TASK_FILES = {"train": "train.jsonl", "eval": "eval_code.jsonl"}
_LEVELS = {1: 2.0, 2: 2.0, 3: 1.0}
_TEACHER_LEVELS = {1: 1.0, 2: 2.0, 3: 2.0}
_ALL = {f: 1.0 for f in FAMILIES}


@dataclass(frozen=True)
class CodeRecipe:
    """Everything that determines the tiny code models (with the seed)."""

    shape: Shape = Shape("qwen3", 192, 4, 4, 2, 576, max_positions=192)
    stage: Stage = Stage(steps=480, lr=2e-3, batch=32, families=_ALL, levels=_LEVELS, warmup=30, pack=256)
    stage_teacher: Stage = Stage(steps=200, lr=1.5e-3, batch=32, families=_ALL, levels=_TEACHER_LEVELS, warmup=10,
                                 pack=256)
    junior_step: int = 160
    # the teacher's logits x this (as the arithmetic teacher's x4); calibrated against SAF-OPD's
    # regime (OPD advantages >= 5x GRPO's over the student's samples,
    # experiments/reproduce/tiny_saf.yaml): mean opd/grpo_magnitude_ratio over the first 5 steps of
    # grpo_opd on the code task 4.14 (3.21-4.88) at x4, 6.99 (5.11-9.01) at x6
    teacher_sharpen: float = 6.0
    vocab: int = 512
    n_train: int = 4000
    n_eval: int = 300

    def to_dict(self) -> dict:
        return json.loads(json.dumps(asdict(self)))

    @classmethod
    def reduced(cls, steps: int = 24) -> CodeRecipe:
        """A seconds-long build with the same code path (tests)."""
        small = Shape("qwen3", 64, 2, 2, 1, 128, max_positions=192)
        return cls(shape=small, stage=Stage(steps=steps, lr=2e-3, batch=16, families=_ALL, levels=_LEVELS,
                                            warmup=3, pack=256),
                   stage_teacher=Stage(steps=max(2, steps // 3), lr=1.5e-3, batch=16, families=_ALL,
                                       levels=_TEACHER_LEVELS, warmup=2, pack=256),
                   junior_step=max(1, steps // 3), n_train=64, n_eval=16)


PROMPT = PromptSpec(suffix="", raw_template="{problem}\n")  # experiments/task/tiny_code.yaml; a code benchmark's


def prompt_text(problem: str) -> str:
    """The code runs' prompt (the problem, a newline): what SFT, RL and evaluation all see."""
    return _prompt_text(problem, PROMPT)


def build_tokenizer(seed: int = 0, vocab_size: int = 512):
    """A Qwen-style byte-level BPE (Qwen's pre-tokenizer regex, single digits) trained on the code
    task's text."""
    # lazy: tokenizers only for building tokenizers
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    # lazy: transformers is slow to import
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_A, PAD_A], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    rng = random.Random(f"graft-tiny-code-tok:{seed}")
    texts = []
    for i in range(3000):
        rec = make_problem(rng, rng.choice(FAMILIES), rng.choice((1, 2, 3)), f"t{i}")
        texts.append(prompt_text(rec["problem"]) + reference_response(rec))
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_A, pad_token=PAD_A, padding_side="left",
                                   clean_up_tokenization_spaces=False)


def example_stream(stage: Stage, seed: str):
    """Batches of fresh (problem, reference response) pairs drawn from the stage's family and level
    weights."""
    rng = random.Random(seed)
    fams, fw = list(stage.families), list(stage.families.values())
    levels, lw = list(stage.levels), list(stage.levels.values())
    i = 0
    while True:
        batch = []
        for _ in range(stage.batch):
            rec = make_problem(rng, rng.choices(fams, fw)[0], rng.choices(levels, lw)[0], f"sft{i}")
            batch.append((rec["problem"], reference_response(rec)))
            i += 1
        yield batch


def cache_dir_of(cache_dir: str | None = None) -> str:
    return os.path.join(os.path.abspath(cache_dir or default_cache_dir()), "code")


def read_manifest(cache_dir: str | None = None) -> dict | None:
    path = os.path.join(cache_dir_of(cache_dir), "manifest.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _ok(man: dict | None, root: str, seed: int, recipe: CodeRecipe) -> bool:
    if not man or man.get("version") != CODE_VERSION or man.get("seed") != seed:
        return False
    if man.get("recipe") != recipe.to_dict():
        return False
    return all(os.path.isfile(os.path.join(root, r, "config.json")) for r in ROLES) and all(
        os.path.isfile(os.path.join(root, "task", f)) for f in TASK_FILES.values())


def paths_of(root: str) -> dict[str, str]:
    return {**{r: os.path.join(root, r) for r in ROLES},
            **{k: os.path.join(root, "task", f) for k, f in TASK_FILES.items()}}


def build_code(cache_dir: str | None = None, seed: int = 0, force: bool = False, recipe: CodeRecipe | None = None,
               progress=None) -> dict[str, str]:
    """Build (or reuse) the tiny code models and task under ``<cache_dir>/code``; returns name ->
    path."""
    recipe = recipe or CodeRecipe()
    root = cache_dir_of(cache_dir)
    os.makedirs(root, exist_ok=True)
    with _lock(root):
        if not force and _ok(read_manifest(cache_dir), root, seed, recipe):
            return paths_of(root)
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(root, "manifest.json"))
        t0 = time.time()
        task = write_task(os.path.join(root, "task"), seed=seed, n_train=recipe.n_train, n_eval=recipe.n_eval)
        with _deterministic_single_thread():
            tok = build_tokenizer(seed, recipe.vocab)
            model = make_model(recipe.shape, tok, seed=seed * 1000 + 31)
            info: dict = {}

            def junior(m):
                info["junior"] = {"hash": _save(m, tok, os.path.join(root, "junior")), "steps": recipe.junior_step}

            def report(step, total, loss):
                if progress is not None:
                    progress(step, total, loss)

            losses = sft(model, tok, recipe.stage, f"graft-tiny-code:{seed}:base", on_step=report,
                         snapshot_at={recipe.junior_step: junior},
                         stream=example_stream(recipe.stage, f"graft-tiny-code:{seed}:base"), prompt=prompt_text)
            t_losses = sft(model, tok, recipe.stage_teacher, f"graft-tiny-code:{seed}:teacher", on_step=report,
                           stream=example_stream(recipe.stage_teacher, f"graft-tiny-code:{seed}:teacher"),
                           prompt=prompt_text)
            sharpen(model, recipe.teacher_sharpen)
            info["teacher"] = {"hash": _save(model, tok, os.path.join(root, "teacher")),
                               "steps": recipe.stage.steps + recipe.stage_teacher.steps,
                               "sharpen": recipe.teacher_sharpen}
            info["params"] = num_params(model)
            info["final_loss"] = {"base": losses[-1], "teacher": t_losses[-1]}
        man = {"version": CODE_VERSION, "seed": seed, "recipe": recipe.to_dict(), "models": info,
               "hashes": {r: info[r]["hash"] for r in ROLES},
               "task": {k: {"path": os.path.relpath(v, root), "sha256": _file_hash(v)} for k, v in task.items()},
               "build_seconds": time.time() - t0}
        atomic_write_text(os.path.join(root, "manifest.json"), json.dumps(man, indent=1))
    return paths_of(root)


def resolve_tiny_code(name: str) -> str:
    """``tiny_code:<name>``: ``junior``, ``teacher`` (folders), ``train``, ``eval`` (task files);
    built on first use."""
    paths = build_code()
    if name not in paths:
        raise GraftError(f"unknown tiny_code name {name!r}; known: {', '.join(sorted(paths))}")
    return paths[name]


# ---------------------------------------------------------------------------------------------- measurement
def check_code(paths: dict, n: int = 8, seed: int = 0, max_new_tokens: int = 40, grader=None) -> dict:
    """Measured before any RL, on the task's held-out problems, T = 1.0, ``n`` samples per problem
    with the project's rollout engine and the code reward: per model pass@1, the share of problems
    whose group is all-fail / mixed / all-pass (GRPO learns only from mixed groups), and pass@1 per
    family."""
    # lazy: transformers is slow to import
    from transformers import AutoModelForCausalLM, AutoTokenizer

    recs = [json.loads(x) for x in open(paths["eval"]) if x.strip()]
    golds = [r["answer"] for r in recs]
    own = grader is None
    grader = grader or make_grader(RewardConfig(name="code", timeout_s=5.0), num_workers=2)
    out: dict = {"problems": len(recs), "samples": n}
    try:
        for role in ROLES:
            tok = AutoTokenizer.from_pretrained(paths[role])
            model = AutoModelForCausalLM.from_pretrained(paths[role], dtype=torch.float32).eval()
            ids = [PROMPT.encode(r["problem"], tok) for r in recs]
            g = sample_and_grade(HFEngine(model, tok), ids, golds,
                                 SamplingParams(n=n, temperature=1.0, top_p=1.0, max_new_tokens=max_new_tokens,
                                                seed=seed), grader)
            k = g.k
            fams: dict = {}
            for r, kk in zip(recs, k):
                fams.setdefault(r["family"], []).append(kk / n)
            out[role] = {"pass1": float(sum(k)) / (n * len(recs)),
                         "all_fail": sum(1 for x in k if x == 0) / len(recs),
                         "mixed": sum(1 for x in k if 0 < x < n) / len(recs),
                         "all_pass": sum(1 for x in k if x == n) / len(recs),
                         "families": {f: sum(v) / len(v) for f, v in sorted(fams.items())},
                         "no_program": sum(1 for s in g.grades.status if s == "code_no_program") / len(g.grades)}
    finally:
        if own:
            grader.close()
    return out


def code_main(check: bool = False, cache_dir: str | None = None, seed: int = 0, force: bool = False) -> dict:
    """``graft tiny build --code [--check]``: build or reuse the tiny code models; with ``check``
    measure them (:func:`check_code`), the last printed line one JSON object."""
    console = make_console()
    paths = build_code(cache_dir, seed=seed, force=force)
    man = read_manifest(cache_dir)
    t = Table(title=f"tiny code models ({cache_dir_of(cache_dir)}; built in {man['build_seconds']:.0f} s)")
    for c in ("role", "SFT steps", "sha256"):
        t.add_column(c)
    for r in ROLES:
        t.add_row(r, str(man["models"][r]["steps"]), man["hashes"][r][:16])
    console.print(t)
    result = {"cache": cache_dir_of(cache_dir), "paths": paths, "hashes": man["hashes"],
              "build_seconds": man["build_seconds"]}
    if check:
        result.update(check_code(paths, seed=seed))
        m = Table(title="before RL: held-out problems, T = 1.0, 8 samples each")
        f = Table(title="pass@1 by family")
        for c in ("role", "pass@1", "all-fail", "mixed", "all-pass", "no program"):
            m.add_column(c)
        for c in ("role", *sorted(FAMILIES)):
            f.add_column(c)
        for r in ROLES:
            x = result[r]
            m.add_row(r, *(f"{x[k]:.3f}" for k in ("pass1", "all_fail", "mixed", "all_pass", "no_program")))
            f.add_row(r, *(f"{x['families'].get(k, 0):.2f}" for k in sorted(FAMILIES)))
        console.print(m)
        console.print(f)
        console.file.flush()
        print(json.dumps(result, sort_keys=True), flush=True)
    return result
