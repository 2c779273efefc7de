"""Sharing identical evaluations between the runs of a plan.

A plan's runs that start from the same weights and save them (``run.save_initial``: GRPO and GRAFT
of every seed in ``experiments/reproduce/tiny.yaml``) evaluate the same model at step 0 with the
same settings and seed: the same samples, byte for byte, once per run. :func:`shared` evaluates such
a checkpoint once and gives the other runs its ``<bench>_run<k>.jsonl`` files, which the evaluator
reads back as it reads a resumed folder's.

The key of an evaluation (:func:`reuse_key`) is the model's files (weights, config, tokenizer: not
the optimizer state), the output folder's ``meta.json`` (sampling settings, prompt, problem-set
fingerprints: :func:`graft_cli.eval.runner.prepare_folder`) and what else decides the samples and
their grades (dtype, device type, rollout engine and its options, reward): two evaluations share
files only when all of these are equal. A per-key lock makes a run that reaches the same evaluation
while another is computing it wait and copy, instead of computing it twice; the shared copy is
written to a temporary folder and renamed into place (a killed run leaves no half copy)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile

from graft_cli.eval.files import RUN_FILE_RE

MODEL_FILES = (".safetensors", ".bin", ".json", ".model", ".txt", ".tiktoken")  # what the evaluation loads
SKIP_PREFIXES = ("optimizer", "scheduler", "rng", "trainer_state", "training_args")


def model_fingerprint(folder: str) -> str:
    """SHA-256 over the names and bytes of the model folder's weight, config and tokenizer files
    (sorted by name); optimizer and trainer state are left out."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not os.path.isfile(path) or not name.endswith(MODEL_FILES) or name.startswith(SKIP_PREFIXES):
            continue
        h.update(f"{name}\0".encode())
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def reuse_key(model_folder: str, out_dir: str, extra: dict) -> str:
    """The evaluation's identity: :func:`model_fingerprint`, ``out_dir``'s ``meta.json`` and
    ``extra`` (JSON)."""
    with open(os.path.join(out_dir, "meta.json"), encoding="utf-8") as f:
        meta = json.load(f)
    blob = json.dumps({"model": model_fingerprint(model_folder), "meta": meta, "extra": extra}, sort_keys=True,
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _run_files(folder: str) -> list[str]:
    return sorted(f for f in os.listdir(folder) if RUN_FILE_RE.match(f)) if os.path.isdir(folder) else []


@contextlib.contextmanager
def shared(reuse_dir: str | None, key: str | None, out_dir: str):
    """Around one evaluation into ``out_dir``: under ``reuse_dir/<key>.lock``, copy the run files a
    previous evaluation with the same key left in ``reuse_dir/<key>/`` into ``out_dir`` (those it
    lacks), then let the evaluation run (it reads them back and samples only what is missing); on
    success, store ``out_dir``'s run files under the key if none are stored. Yields the number of
    files copied in. ``reuse_dir`` None: no-op."""
    if not reuse_dir or not key:
        yield 0
        return
    os.makedirs(reuse_dir, exist_ok=True)
    stored = os.path.join(reuse_dir, key)
    try:
        import fcntl  # POSIX: the lock is skipped elsewhere (then two runs may compute the same evaluation)
    except ImportError:  # pragma: no cover - non-POSIX
        fcntl = None
    with open(os.path.join(reuse_dir, f"{key}.lock"), "w") as lock:
        if fcntl:
            fcntl.flock(lock, fcntl.LOCK_EX)
        copied = 0
        have = set(_run_files(out_dir))
        for name in _run_files(stored):
            if name not in have:
                tmp = os.path.join(out_dir, f".{name}.reuse")
                shutil.copyfile(os.path.join(stored, name), tmp)
                os.replace(tmp, os.path.join(out_dir, name))
                copied += 1
        yield copied
        files = _run_files(out_dir)
        if files and not os.path.isdir(stored):
            tmp = tempfile.mkdtemp(prefix=f".{key}.", dir=reuse_dir)
            for name in files:
                shutil.copyfile(os.path.join(out_dir, name), os.path.join(tmp, name))
            os.replace(tmp, stored)
