"""Building the tiny pair (:mod:`graft_cli.tiny`): the build jobs (one single-threaded worker
process per tokenizer family), the cache folder with its lock and ``manifest.json`` (written last,
atomically), :func:`ensure_tiny`, and the ``tiny`` model source: :func:`resolve_tiny` resolves
``tiny:<role>`` names and :func:`build_record` is a run's record of them (declared as entry points
in pyproject.toml and looked up through :data:`graft_cli.models.loading.MODEL_SOURCES` and
``SOURCE_BUILDS``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import random
import selectors
import shutil
import subprocess
import sys
import tempfile
import time

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from graft_cli.console import make_console
from graft_cli.data import synthetic
from graft_cli.data.synthetic import write_task
from graft_cli.errors import GraftError
from graft_cli.rundir import atomic_write_text, folder_lock, read_jsonl
from graft_cli.tiny.sft import Recipe, default_recipe, make_model, num_params, sft, sharpen, weight_hash
from graft_cli.tiny.tokenizers import _prompt_text, build_tokenizer_a, build_tokenizer_b, build_tokenizer_c

TINY_VERSION = 3
ROLES = ("a", "b", "c", "teacher", "junior")
POLICY_ROLES = ("a", "b", "c")  # the peers (tiny pair a, b; pair=tiny3 adds c)


# ----------------------------------------------------------------------------------------------------
# Paths


def default_cache_dir() -> str:
    return os.environ.get("GRAFT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "graft", "tiny")


# ----------------------------------------------------------------------------------------------------
# Build jobs (run in worker processes, or in-process one after the other)


@contextlib.contextmanager
def _deterministic_single_thread():
    threads = torch.get_num_threads()
    det = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det)


def _save(model, tokenizer, out: str) -> str:
    if os.path.isdir(out):
        shutil.rmtree(out)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return weight_hash(model)


def _job(kind: str, recipe: Recipe, seed: int, cache_dir: str, report) -> dict:
    """One build job (:data:`JOBS`): 'a' builds tokenizer A and model a (its snapshot at
    ``junior_step`` is the junior); 'teacher' continues a's SFT from the saved ``a`` (the same
    float32 weights the in-memory model had, so the teacher is the same whether it is built with a
    or later); 'b' and 'c' their own tokenizer and model. ``report(role, step, total, loss)`` is
    called as training proceeds. Returns role -> info."""

    # lazy: transformers is slow to import
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging  # lazy: as above

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    out: dict = {}
    cpu0 = time.process_time()
    with _deterministic_single_thread():
        if kind == "a":
            tok = build_tokenizer_a(seed, recipe.bpe_vocab, recipe.tokenizer_style("a"), recipe.split_a)
            model = make_model(recipe.shape_a, tok, seed * 1000 + 1)

            def snap(m):
                out["junior"] = {"hash": _save(m, tok, os.path.join(cache_dir, "junior")), "steps": recipe.junior_step,
                                 "arch": recipe.shape_a.arch, "tokenizer": "a", "params": num_params(m)}

            t0 = time.time()
            la = sft(model, tok, recipe.stage_a, f"graft-tiny-sft:{seed}:a",
                     on_step=lambda s, n, loss: report("a", s, n, loss), snapshot_at={recipe.junior_step: snap})
            out["a"] = {"hash": _save(model, tok, os.path.join(cache_dir, "a")), "steps": recipe.stage_a.steps,
                        "final_loss": sum(la[-10:]) / len(la[-10:]), "arch": recipe.shape_a.arch, "tokenizer": "a",
                        "params": num_params(model), "seconds": time.time() - t0}
            out["junior"]["final_loss"] = la[recipe.junior_step - 1]
        elif kind == "teacher":
            t0 = time.time()
            tok = AutoTokenizer.from_pretrained(os.path.join(cache_dir, "a"))
            teacher = AutoModelForCausalLM.from_pretrained(os.path.join(cache_dir, "a"), dtype=torch.float32)
            lt = sft(teacher, tok, recipe.stage_teacher, f"graft-tiny-sft:{seed}:teacher",
                     on_step=lambda s, n, loss: report("teacher", s, n, loss))
            sharpen(teacher, recipe.teacher_sharpen)
            out["teacher"] = {"hash": _save(teacher, tok, os.path.join(cache_dir, "teacher")),
                              "steps": recipe.stage_a.steps + recipe.stage_teacher.steps,
                              "final_loss": sum(lt[-10:]) / len(lt[-10:]), "arch": recipe.shape_a.arch,
                              "tokenizer": "a", "params": num_params(teacher), "seconds": time.time() - t0}
        elif kind in ("b", "c"):
            build_tok, vocab, shape, stage, salt = {
                "b": (build_tokenizer_b, recipe.bpe_vocab_b, recipe.shape_b, recipe.stage_b, 2),
                "c": (build_tokenizer_c, recipe.bpe_vocab_c, recipe.shape_c, recipe.stage_c, 3)}[kind]
            tok = build_tok(seed, vocab, recipe.tokenizer_style(kind))
            model = make_model(shape, tok, seed * 1000 + salt)
            t0 = time.time()
            lb = sft(model, tok, stage, f"graft-tiny-sft:{seed}:{kind}",
                     on_step=lambda s, n, loss: report(kind, s, n, loss))
            out[kind] = {"hash": _save(model, tok, os.path.join(cache_dir, kind)), "steps": stage.steps,
                         "final_loss": sum(lb[-10:]) / len(lb[-10:]), "arch": shape.arch, "tokenizer": kind,
                         "params": num_params(model), "seconds": time.time() - t0}
        else:
            raise ValueError(kind)
    for info in out.values():
        info["job_cpu_seconds"] = time.process_time() - cpu0  # CPU time of the whole job (contention-free)
    return out


def _worker_main(argv: list[str]) -> None:
    """Entry point of a build worker process: ``python -m graft_cli.tiny.build _worker KIND SEED DIR
    RECIPE``.

    Workers are fresh interpreters started with :mod:`subprocess` (not :mod:`multiprocessing`, whose
    spawn/forkserver start methods re-import the caller's ``__main__``, which can deadlock or
    rebuild when the caller is an unguarded script). They speak one JSON object per stdout line."""
    kind, seed, cache_dir, recipe_json = argv
    torch.set_num_threads(1)
    last = [0.0]

    def emit(obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    def report(role, step, total, loss):
        now = time.time()
        if step == total or now - last[0] > 0.5:
            last[0] = now
            emit({"progress": [role, step, total, loss]})

    emit({"done": _job(kind, Recipe.from_dict(json.loads(recipe_json)), int(seed), cache_dir, report)})


# ----------------------------------------------------------------------------------------------------
# Build / ensure


def _stage_totals(recipe: Recipe, jobs=None) -> dict:
    totals = {"a": recipe.stage_a.steps, "b": recipe.stage_b.steps, "c": recipe.stage_c.steps,
              "teacher": recipe.stage_teacher.steps}
    return {k: v for k, v in totals.items() if jobs is None or k in jobs}


@contextlib.contextmanager
def _progress(enabled: bool, recipe: Recipe, jobs=None):
    if not enabled:
        yield lambda role, step, total, loss: None
        return

    prog = Progress(TextColumn("[bold]{task.fields[role]:>8}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(),
                    console=make_console(stderr=True), transient=False)
    tasks = {r: prog.add_task("", total=n, role=f"sft {r}", loss="-") for r, n in _stage_totals(recipe, jobs).items()}
    with prog:
        def update(role, step, total, loss):
            prog.update(tasks[role], completed=step, loss=f"{loss:.3f}")

        yield update


def _lock(cache_dir: str):
    """One build of the cache at a time (``<cache>/.lock``)."""
    return folder_lock(cache_dir)


def _file_hash(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def _manifest_path(cache_dir: str) -> str:
    return os.path.join(cache_dir, "manifest.json")


def _paths(cache_dir: str) -> dict[str, str]:
    out = {r: os.path.join(cache_dir, r) for r in ROLES}
    out["task"] = os.path.join(cache_dir, "task")
    return out


def read_manifest(cache_dir: str | None = None) -> dict | None:
    path = _manifest_path(cache_dir or default_cache_dir())
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def token_stats(paths: dict, n: int = 512, seed: int = 0, recipe: Recipe | None = None,
                roles=POLICY_ROLES) -> dict:
    """Mean/max prompt and reference-response (+EOS) token counts under each tokenizer, the share of
    responses whose token counts differ between a and b, and the re-tokenized length ratios
    ``ratio_{y}_over_{x}``: x's reference responses re-tokenized with y's tokenizer over their
    length under x's. Reference responses are the training split's solutions when every model writes
    the canonical style (v2); with ``recipe``'s own styles (v3) each model's responses are ``n``
    fresh problems written in its own style. Over the peers among ``roles`` (a build of some roles,
    :func:`build_tiny`, has the tokenizers of those alone)."""
    # lazy: transformers is slow to import
    from transformers import AutoTokenizer


    roles = [r for r in POLICY_ROLES if r in roles]
    recs = read_jsonl(os.path.join(paths["task"], "train.jsonl"))[:n]
    styled = recipe is not None and bool(recipe.own_styles)
    if styled:
        rng = random.Random(f"graft-tiny-token-stats:{seed}")
        worked = [synthetic.sample_problem(rng)["worked"] for _ in range(n)]  # the training mix
        texts = {r: [synthetic.render(w, recipe.own_style(r)) for w in worked] for r in roles}
        prompts = [w[0] for w in worked]
    else:
        texts = {r: [x["solution"] for x in recs] for r in roles}
        prompts = [x["problem"] for x in recs]
    toks = {tk: AutoTokenizer.from_pretrained(paths[tk]) for tk in roles}
    out: dict = {}
    counts = {}  # counts[(x, y)]: x's responses under y's tokenizer (+EOS)
    for tk, tok in toks.items():
        p = [len(x) for x in tok([_prompt_text(q) for q in prompts], add_special_tokens=False)["input_ids"]]
        for x in roles:
            counts[(x, tk)] = [len(i) + 1 for i in tok(texts[x], add_special_tokens=False)["input_ids"]]
        s = counts[(tk, tk)]
        out[f"tokens_prompt_{tk}"] = sum(p) / len(p)
        out[f"tokens_response_{tk}"] = sum(s) / len(s)
        out[f"tokens_response_max_{tk}"] = max(s)
        out[f"tokens_total_max_{tk}"] = max(a + b for a, b in zip(p, s))
        out[f"vocab_{tk}"] = len(tok)
    if ("a", "b") in counts:
        out["response_len_differs"] = sum(x != y for x, y in zip(counts[("a", "a")], counts[("a", "b")])) / len(prompts)
    for x in roles:
        for y in roles:
            if x != y:
                out[f"ratio_{y}_over_{x}"] = sum(counts[(x, y)]) / sum(counts[(x, x)])
    return out


def build_tiny(cache_dir: str | None = None, seed: int = 0, force: bool = False, progress: bool = True,
               recipe: Recipe | None = None, workers: int = 2, roles=ROLES) -> dict[str, str]:
    """Build (or reuse) the tiny models ``roles`` (default all of :data:`ROLES`: a, b, c, teacher,
    junior) and the task under ``cache_dir``.

    Returns role -> folder for each of :data:`ROLES` and ``task`` (the folders of roles not built
    are empty). A cache whose manifest matches (version, seed, recipe) is reused for the roles it
    has; the jobs (:data:`JOBS`) of the missing roles run and the manifest is rewritten with them,
    atomically, last (until then it lists the roles built before, so a build stopped half-way loses
    only its own roles): the pair (a with its junior, and b) builds without the teacher and c, which
    are built when first asked for (``tiny:teacher``, ``tiny:c``; a later build gives the same
    weights as one build of all). ``force`` rebuilds from scratch. ``workers >= 2`` trains the jobs
    in single-threaded worker processes at once (the teacher once a is saved); ``workers=1`` runs
    the same jobs in-process (identical weights)."""

    cache_dir = os.path.abspath(cache_dir or default_cache_dir())
    recipe = recipe or default_recipe()
    paths = _paths(cache_dir)
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        raise GraftError(f"tiny roles {unknown}: unknown; known: {', '.join(ROLES)}")
    with _lock(cache_dir):
        man = read_manifest(cache_dir)
        if force or not _manifest_ok(man, cache_dir, seed, recipe, roles=()):
            man = None  # nothing of it is reused
        have = {r for r in (man or {}).get("models", {}) if _role_present(man, cache_dir, r)}
        if man and _manifest_ok(man, cache_dir, seed, recipe, roles=roles):
            return paths
        jobs = _jobs_for(set(roles) - have, have)
        if man is None or any(set(JOBS[k]) & have for k in jobs):  # folders the manifest lists will be rewritten
            with contextlib.suppress(FileNotFoundError):
                os.remove(_manifest_path(cache_dir))
        t0 = time.time()
        if man is None:
            task_paths = write_task(paths["task"], seed=seed, train_size=recipe.train_size)
            task = {k: {"path": os.path.relpath(v, cache_dir), "sha256": _file_hash(v)} for k, v in task_paths.items()}
        else:
            task = man["task"]
        results: dict = dict((man or {}).get("models", {}))
        with _progress(progress, recipe, jobs) as update:
            if workers <= 1:
                for kind in jobs:
                    results.update(_job(kind, recipe, seed, cache_dir, update))
            else:
                results.update(_run_parallel(recipe, seed, cache_dir, update, jobs))
        built = [r for r in ROLES if r in results]
        stats = token_stats(paths, recipe=recipe, roles=built)
        seconds = time.time() - t0
        builds = [*(man or {}).get("builds", []), {"jobs": list(jobs), "seconds": seconds}]
        manifest = {
            "version": TINY_VERSION, "seed": seed, "recipe": recipe.to_dict(),
            "models": {r: results[r] for r in built}, "hashes": {r: results[r]["hash"] for r in built},
            "task": task, "token_stats": stats, "build_seconds": sum(b["seconds"] for b in builds), "builds": builds,
            "max_new_tokens": _suggest_max_new_tokens(stats), "machine": build_machine(),
        }

        atomic_write_text(_manifest_path(cache_dir), json.dumps(manifest, indent=1))
    return paths


def build_machine() -> dict:
    """The CPU the build ran on (``/proc/cpuinfo``'s model name and its vector-instruction flags),
    the kernel level torch dispatched to and torch's version: the weights depend on them (CPU types
    with other float kernels build other weights, docs/tiny_pair.md), so the manifest and ``graft
    tiny build --check`` name them."""
    model, flags = "?", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name") and model == "?":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:  # not Linux
        model = platform.processor() or "?"
    return {"cpu": model, "vector": sorted(f for f in flags if f.startswith(("avx", "fma", "amx"))),
            "kernels": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}


def _suggest_max_new_tokens(stats: dict) -> int:
    """The rollout budget the check samples with: 48 tokens when every reference response fits in 40
    (v2, whose studies were measured at 48), else the longest plus a third, rounded up to a multiple
    of 16 (v3: 64)."""
    longest = max((v for k, v in stats.items() if k.startswith("tokens_response_max_")), default=0)
    if longest <= 40:
        return 48
    return int(math.ceil(longest * 4 / 3 / 16) * 16)


# The build's jobs -> the roles each makes, and the job each needs done first: 'a' (a and its junior
# snapshot), 'b', 'c', and 'teacher' (a's SFT continued, from the saved a). Each is ~700-1000
# single-threaded SFT steps but the teacher's 220; on 2 cores the workers share the cores (the wall
# time is ~their CPU time / 2).
JOBS = {"a": ("a", "junior"), "b": ("b",), "c": ("c",), "teacher": ("teacher",)}
_NEEDS = {"teacher": "a"}
PAIR = ("a", "b", "junior")  # what the GRAFT studies on pair=tiny load


def _jobs_for(missing: set, have: set) -> list[str]:
    """The jobs that build the ``missing`` roles (and the jobs they need whose roles are not in
    ``have``), in :data:`JOBS` order."""
    need = {k for k, made in JOBS.items() if missing & set(made)}
    need |= {_NEEDS[k] for k in need if k in _NEEDS and not set(JOBS[_NEEDS[k]]) <= have}
    return [k for k in JOBS if k in need]


def _run_parallel(recipe: Recipe, seed: int, cache_dir: str, update, jobs=tuple(JOBS)) -> dict:
    """Run ``jobs`` (:data:`JOBS`) in single-threaded worker interpreters, each as soon as the job
    it needs (:data:`_NEEDS`) is done; relay progress."""

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    pypath = [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join(pypath))
    procs: dict = {}
    sel = selectors.DefaultSelector()
    errs: dict = {}
    results: dict = {}
    waiting = list(jobs)

    def start_ready():
        for kind in list(waiting):
            if _NEEDS.get(kind) in waiting or (_NEEDS.get(kind) in procs and _NEEDS[kind] not in results):
                continue
            waiting.remove(kind)
            errs[kind] = tempfile.TemporaryFile()
            p = subprocess.Popen([sys.executable, "-m", "graft_cli.tiny.build", "_worker", kind, str(seed), cache_dir,
                                  json.dumps(recipe.to_dict())], stdout=subprocess.PIPE, stderr=errs[kind], env=env,
                                 cwd=root)
            procs[kind] = p
            sel.register(p.stdout, selectors.EVENT_READ, kind)

    def failed(kind):
        errs[kind].seek(0)
        tail = errs[kind].read().decode(errors="replace")[-3000:]
        return RuntimeError(f"tiny build worker {kind!r} failed (exit code {procs[kind].wait()}):\n{tail}")

    try:
        start_ready()
        while sel.get_map():
            for key, _ in sel.select(timeout=1.0):
                line = key.fileobj.readline()
                if not line:
                    sel.unregister(key.fileobj)
                    if procs[key.data].wait() != 0 or key.data not in results:
                        raise failed(key.data)
                    start_ready()
                    continue
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue  # stray output of a library
                if "progress" in msg:
                    update(*msg["progress"])
                elif "done" in msg:
                    results[key.data] = msg["done"]
        if waiting:  # pragma: no cover - a job whose prerequisite never ran
            raise RuntimeError(f"tiny build jobs {waiting} never started")
        return {role: info for kind in jobs for role, info in results[kind].items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in errs.values():
            f.close()


def _manifest_ok(man: dict | None, cache_dir: str, seed: int, recipe: Recipe, roles=ROLES) -> bool:
    """``man`` is this build's (version, seed, recipe), its task files are in the cache, and so is
    each of ``roles`` (listed in it, with its folder)."""
    if not man or man.get("version") != TINY_VERSION or man.get("seed") != seed:
        return False
    if man.get("recipe") != recipe.to_dict():
        return False
    return all(_role_present(man, cache_dir, r) for r in roles) and _task_files_present(man, cache_dir)


def _role_present(man: dict, cache_dir: str, role: str) -> bool:
    """``role`` is listed in the manifest and its folder holds a model and tokenizer."""
    d = os.path.join(cache_dir, role)
    return role in man.get("models", {}) and all(os.path.isfile(os.path.join(d, f))
                                                 for f in ("config.json", "tokenizer.json"))


def _task_files_present(man: dict, cache_dir: str) -> bool:
    """Every task file the manifest lists is in the cache."""
    return all(os.path.isfile(os.path.join(cache_dir, t["path"])) for t in man.get("task", {}).values())


def ensure_tiny(cache_dir: str | None = None, seed: int = 0, progress: bool = True,
                recipe: Recipe | None = None, roles=ROLES) -> dict:
    """Role -> folder of a tiny cache that has ``roles`` (default all), building what is missing
    first."""
    return build_tiny(cache_dir, seed=seed, force=False, progress=progress, recipe=recipe, roles=roles)


def ensure_task(cache_dir: str | None = None, seed: int = 0) -> str:
    """The tiny task's folder (``train.jsonl`` and the five ``eval_<name>.jsonl``), written if the
    cache has no complete build, without training any model: the synthetic task is a pure function
    of the seed and the training-split size (graft_cli/data/synthetic.py, same seed same bytes,
    atomic writes), so reading the task (``tiny:train``, the synthetic benchmarks) never waits for a
    model build (the pair: ~4 minutes on 2 cores). A complete cache's task is returned as it was
    built."""
    cache_dir = os.path.abspath(cache_dir or default_cache_dir())
    task = _paths(cache_dir)["task"]
    man = read_manifest(cache_dir)
    if not (man and man.get("seed") == seed and man.get("task") and _task_files_present(man, cache_dir)):
        write_task(task, seed=seed, train_size=default_recipe().train_size)
    return task


def build_record(roles: list[str], with_task: bool) -> dict:
    """What a run of the tiny pair was made with: each ``tiny:<role>`` it loads with its manifest
    hash, and, when it trains on ``tiny:`` data, each task file's sha256 (None otherwise)."""
    man = read_manifest() or {}
    hashes = man.get("hashes") or {}
    return {"roles": {r: hashes.get(r) for r in roles},
            "task": {k: v.get("sha256") for k, v in sorted((man.get("task") or {}).items())} if with_task else None}


def resolve_tiny(role: str) -> str:
    """``tiny:<role>``: the folder of a built role (built on first use, with what it needs), or a
    task file of the pair (``tiny:train``, ``tiny:eval_math500``, ...: the task alone, no model is
    built for it)."""
    if role in ROLES:  # a role of the pair builds the pair (its two jobs side by side), a teacher or c itself
        return ensure_tiny(roles=PAIR if role in PAIR else (role,))[role]
    task = ensure_task()
    if role == "task":
        return task
    task_file = os.path.join(task, f"{role}.jsonl")
    if os.path.isfile(task_file):
        return task_file
    known = ", ".join(sorted((*ROLES, "task")))
    raise GraftError(f"unknown tiny name {role!r}; known: {known}, or a task file in {task}")


if __name__ == "__main__":  # a build worker: python -m graft_cli.tiny.build _worker KIND SEED DIR RECIPE
    _worker_main(sys.argv[2:])
