"""Atomic, verifiable, pickle-free checkpoints: ``checkpoints/step_NNNNNN/``::

    <policy>/            save_pretrained weights (safetensors), config and tokenizer, optimizer.pt
    state.json           step, data cursor, exchange / controller state, frozen models' hashes, RNG states
    MANIFEST.json        sha256 and size of every other file of the folder (written after them)
    COMPLETE             written last

``optimizer.pt`` holds only tensors and plain values (the optimizer's ``state_dict``) and is read back with
``torch.load(weights_only=True)``: nothing in a run directory is unpickled. RNG states are stored as JSON
lists (Python's Mersenne state, numpy's MT19937 state, torch's byte state).

A checkpoint is written under a temporary name and renamed once complete, so a killed run never leaves a
half-written ``step_*`` folder. :func:`verify` re-hashes a checkpoint against its manifest; resume and
``graft eval --run`` use the newest checkpoint that verifies and name each one they skip (:func:`valid_steps`).
A checkpoint is never written from non-finite weights.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import random
import re
import shutil

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from graft_cli import faults
from graft_cli.errors import GraftError
from graft_cli.models import lora, shards
from graft_cli.models.loading import DTYPES, load_model
from graft_cli.rundir import remove_stale_temporaries, sha256_file, step_name

STEP_RE = re.compile(r"^step_(\d{6,})$")
FORMAT = 2
STATE, MANIFEST, COMPLETE = "state.json", "MANIFEST.json", "COMPLETE"


# ------------------------------------------------------------------------------------------------- RNG
def rng_state() -> dict:
    """Python, numpy and torch (CPU; CUDA when present) RNG states as JSON-able lists."""
    v, mt, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    st = {"python": [v, list(mt), gauss], "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
          "torch": torch.get_rng_state().tolist()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return st


def set_rng_state(st: dict) -> None:
    v, mt, gauss = st["python"]
    random.setstate((v, tuple(mt), gauss))
    name, keys, pos, has_gauss, cached = st["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(st["torch"], dtype=torch.uint8))
    if st.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in st["cuda"]])


# ---------------------------------------------------------------------------------------------- write
def _files(root: str) -> list[str]:
    out = []
    for d, _, names in os.walk(root):
        for n in names:
            rel = os.path.relpath(os.path.join(d, n), root)
            if rel not in (MANIFEST, COMPLETE):
                out.append(rel)
    return sorted(out)


def write_manifest(root: str, known: dict | None = None) -> dict:
    """``MANIFEST.json``: sha256 and size of every file under ``root``; ``known`` (relative path -> ``{sha256,
    bytes}``) are taken as given (the shards each rank hashed as it wrote them) instead of read again."""
    known = known or {}
    man = {"format": FORMAT, "files": {rel: known.get(rel) or {"sha256": sha256_file(os.path.join(root, rel)),
                                                               "bytes": os.path.getsize(os.path.join(root, rel))}
                                       for rel in _files(root)}}
    with open(os.path.join(root, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(man, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    return man


def check_finite(name: str, model) -> None:
    """Refuse to checkpoint a model with a non-finite parameter (``model``: a module, or an FSDP checkpoint view
    with the gathered state dict ``sd``)."""
    tensors = model.sd.items() if hasattr(model, "sd") else model.named_parameters()
    for pname, p in tensors:
        if torch.is_tensor(p) and p.is_floating_point() and not torch.isfinite(p.detach()).all():
            raise GraftError(f"policy {name!r}: parameter {pname} holds non-finite values; no checkpoint written")


class _Writer:
    """A raw file for ``torch.save`` that keeps the OSError of a failed write: torch's zip writer reports a full disk
    or a file-size limit only as ``unexpected pos``."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, b) -> int:
        view, done = memoryview(b), 0
        try:
            while done < len(view):
                n = self.f.write(view[done:])
                if not n:
                    raise OSError(errno.EIO, os.strerror(errno.EIO))
                done += n
        except OSError as e:
            self.error = e
            raise
        return done

    def flush(self) -> None:
        self.f.flush()


def save_tensors(obj, path: str) -> None:
    """``torch.save(obj, path)``; a failed write raises its OSError (naming ``path``)."""
    with open(path, "wb", buffering=0) as raw:
        w = _Writer(raw)
        try:
            torch.save(obj, w)
        except RuntimeError:
            if w.error is None:
                raise
            raise OSError(w.error.errno, os.strerror(w.error.errno), path) from None


def write_error(e: BaseException) -> OSError | None:
    """The OS error behind a failed checkpoint write: an OSError, or safetensors' ``SafetensorError`` ("I/O error:
    File too large (os error 27)"); None for anything else (a bug, not the disk)."""
    if isinstance(e, OSError):
        return e
    m = re.search(r"\(os error (\d+)\)", str(e)) if type(e).__name__ == "SafetensorError" else None
    return OSError(int(m.group(1)), os.strerror(int(m.group(1)))) if m else None


def save(ckpt_root: str, step: int, policies: dict, state: dict, keep: int = 2, protect: tuple = ()) -> str:
    final = step_path(ckpt_root, step)
    tmp = f"{final}.tmp-{os.getpid()}"
    for name, pol in policies.items():
        check_finite(name, pol.model)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        os.makedirs(tmp)
        for name, pol in policies.items():
            d = os.path.join(tmp, name)
            pol.model.save_pretrained(d, safe_serialization=True)
            pol.tokenizer.save_pretrained(d)
            save_tensors(pol.optimizer.state_dict(), os.path.join(d, "optimizer.pt"))
        faults.point("checkpoint", step)
        _seal(tmp, step, state)
    except Exception as e:  # a full disk, a file-size limit: the half-written folder goes, the last complete one stays
        shutil.rmtree(tmp, ignore_errors=True)
        err = write_error(e)
        if err is None:
            raise
        raise _not_written(final, err.strerror or str(err)) from None
    _install(tmp, final, ckpt_root, keep, protect)
    return final


def _seal(tmp: str, step: int, state: dict, known: dict | None = None) -> None:
    """The end of the protocol inside the temporary folder: ``state.json`` (with the RNG states), the manifest
    (``known``: files already hashed by the ranks that wrote them), then ``COMPLETE``."""
    with open(os.path.join(tmp, STATE), "w", encoding="utf-8") as f:
        json.dump({**state, "rng": rng_state()}, f)
        f.flush()
        os.fsync(f.fileno())
    write_manifest(tmp, known)
    faults.point("manifest", step)
    open(os.path.join(tmp, COMPLETE), "w").close()
    faults.point("rename", step)


def _install(tmp: str, final: str, ckpt_root: str, keep: int, protect: tuple) -> None:
    """A sealed temporary folder renamed to its step's name (a previous folder of that step replaced), then the
    rotation."""
    if os.path.exists(final):
        shutil.rmtree(final)
    os.rename(tmp, final)
    prune(ckpt_root, keep, protect)


def _first_nonfinite(name: str, model) -> str | None:
    for pname, p in model.named_parameters():
        part = shards.local_box(p.detach())[0]
        if part.is_floating_point() and not torch.isfinite(part).all():
            return f"policy {name!r}: parameter {pname} holds non-finite values; no checkpoint written"
    return None


def _not_written(final: str, why: str) -> GraftError:
    return GraftError(f"{final}: checkpoint not written ({why}); the last complete checkpoint is kept and the run can "
                      f"resume from it")


def _agree(d, err: str | None, final: str | None = None) -> None:
    """Every rank learns whether any rank failed (``err``), and all raise the first failure: as its own line, or
    with ``final`` as the checkpoint not written."""
    errs = [e for e in d.gather_objects(err) if e]
    if errs:
        raise GraftError(errs[0]) if final is None else _not_written(final, errs[0])


def save_sharded(d, ckpt_root: str, step: int, policies: dict, state: dict, keep: int = 2,
                 protect: tuple = ()) -> str | None:
    """A sharded checkpoint (FSDP, ``run.checkpoint_format``; layout in :mod:`graft_cli.models.shards`): every
    rank writes its part of each policy's weights and optimizer state, nothing is gathered but file hashes and
    error lines. Same protocol as :func:`save`: one temporary folder (rank 0's pid), rank 0 writes the config,
    tokenizer, ``state.json``, the manifest (each shard hashed by the rank that wrote it) and ``COMPLETE``, then
    renames; a failure on any rank removes the temporary folder and every rank raises one line. Returns the path
    on rank 0, None on the others."""
    final = step_path(ckpt_root, step)
    tmp = f"{final}.tmp-{d.gather_objects(os.getpid())[0]}"
    _agree(d, next((e for n, p in policies.items() if (e := _first_nonfinite(n, p.model))), None))
    err = None
    if d.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            for name, pol in policies.items():
                pdir = os.path.join(tmp, name)
                os.makedirs(os.path.join(pdir, shards.SHARDS))
                model = pol.model
                model.config.save_pretrained(pdir)
                if lora.is_lora(model):  # the shards hold the adapter: its config makes the folder an adapter's
                    model.peft_config["default"].save_pretrained(pdir)
                if getattr(model, "generation_config", None) is not None:
                    model.generation_config.save_pretrained(pdir)
                pol.tokenizer.save_pretrained(pdir)
        except Exception as e:
            err = _why(e)
    _agree(d, err, final)
    known, err = {}, None
    try:
        for name, pol in policies.items():
            pdir = os.path.join(tmp, name)
            tensors = shards.model_tensors(pol.model)
            opt_tensors, opt_meta = shards.optimizer_tensors(pol.model, pol.optimizer)
            for path in shards.write_shard(pdir, d.rank, d.world, {**tensors, **opt_tensors}, opt_meta):
                known[os.path.relpath(path, tmp)] = {"sha256": sha256_file(path), "bytes": os.path.getsize(path)}
        faults.point("checkpoint", step)
    except Exception as e:
        err = _why(e)
    metas = d.gather_objects((err, known))  # every rank has every rank's outcome: no further collective to agree
    errs = [e for e, _ in metas if e]
    if errs:
        if d.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise _not_written(final, errs[0])
    err = None
    if d.is_main:
        try:
            _seal(tmp, step, {**state, "world": d.world}, {k: v for _, m in metas for k, v in m.items()})
            _install(tmp, final, ckpt_root, keep, protect)
        except Exception as e:
            shutil.rmtree(tmp, ignore_errors=True)
            err = _why(e)
    _agree(d, err, final)
    return final if d.is_main else None


def _why(e: BaseException) -> str:
    """A failed write in a few words: the OS error's, else the exception's first line (a bug shows its type)."""
    err = write_error(e)
    if err is not None:
        return str(err.strerror or err)
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


# ----------------------------------------------------------------------------------------------- read
def complete_steps(ckpt_root: str) -> list[int]:
    if not os.path.isdir(ckpt_root):
        return []
    out = []
    for d in os.listdir(ckpt_root):
        m = STEP_RE.match(d)
        if m and os.path.exists(os.path.join(ckpt_root, d, COMPLETE)):
            out.append(int(m.group(1)))
    return sorted(out)


def step_path(ckpt_root: str, step: int) -> str:
    return os.path.join(ckpt_root, step_name(step))


def verify(path: str) -> str | None:
    """None when every file listed in the manifest exists with its size and sha256 (and no manifest-less
    pickle state is there); else what is wrong, naming the file."""
    mpath = os.path.join(path, MANIFEST)
    if not os.path.exists(mpath):
        if os.path.exists(os.path.join(path, "state.pt")):
            return f"{path}: written by an older graft (pickled state.pt, no manifest); not loaded"
        return f"{mpath}: missing"
    try:
        with open(mpath, encoding="utf-8") as f:
            man = json.load(f)
        files = man["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{mpath}: unreadable"
    if STATE not in files:
        return f"{mpath}: lists no {STATE}"
    for rel, meta in files.items():
        p = os.path.join(path, rel)
        if not os.path.isfile(p):
            return f"{p}: missing"
        if os.path.getsize(p) != meta.get("bytes"):
            return f"{p}: size {os.path.getsize(p)} != {meta.get('bytes')} in the manifest"
        if sha256_file(p) != meta.get("sha256"):
            return f"{p}: sha256 differs from the manifest"
    return None


def valid_steps(ckpt_root: str, warn=None) -> list[int]:
    """Complete steps whose checkpoint verifies, oldest first; ``warn(msg)`` is called for each one skipped."""
    out = []
    for s in complete_steps(ckpt_root):
        bad = verify(step_path(ckpt_root, s))
        if bad is None:
            out.append(s)
        elif warn is not None:
            warn(f"checkpoint step {s} skipped: {bad}")
    return out


def latest(ckpt_root: str, warn=None) -> str | None:
    """The newest checkpoint that verifies (None when there is none)."""
    steps = valid_steps(ckpt_root, warn)
    return step_path(ckpt_root, steps[-1]) if steps else None


def prune(ckpt_root: str, keep: int, protect: tuple = ()) -> None:
    """Remove stale temporary folders of other processes and all but the last ``keep`` complete checkpoints
    (``protect``: steps never removed, e.g. the best by validation)."""
    remove_stale_temporaries(ckpt_root)
    if keep <= 0:
        return
    for s in complete_steps(ckpt_root)[:-keep]:
        if s not in protect:
            shutil.rmtree(step_path(ckpt_root, s), ignore_errors=True)


def load_state(path: str) -> dict:
    """``state.json`` of a checkpoint (JSON only)."""
    with open(os.path.join(path, STATE), encoding="utf-8") as f:
        return json.load(f)


class RefusedCheckpoint(ValueError):
    """An ``optimizer.pt`` holding anything but tensors and plain values: refused, its code never runs."""


def load_optimizer_state(path: str) -> dict:
    """An ``optimizer.pt`` read with ``weights_only=True``: tensors and plain values only, never a pickle. A file
    that needs more (a crafted pickle) raises :class:`RefusedCheckpoint` in graft's words (torch's message ends
    on advice to load it with ``weights_only=False``, which is exactly what must not be done)."""

    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError:
        raise RefusedCheckpoint(f"{path}: refused as unsafe: it holds objects other than tensors and plain values, "
                               "which graft never unpickles") from None


# ---------------------------------------------------------------------------------------------- export
EXPORT_SKIP = ("optimizer.pt",)  # the trainer's state; an exported folder is what from_pretrained needs


def read_policy_states(path: str, policies: dict) -> dict:
    """Every policy's saved state in checkpoint ``path``, read without touching the policies: ``name ->
    (model state, optimizer state, kind)``, kind ``sharded`` (this rank's part, on any world size: the shards'
    boxes re-cut), ``adapter`` (a LoRA policy's adapter; its base was checked against the checkpoint's record)
    or ``full``. Raises what a damaged file raises; the caller skips that checkpoint."""
    # lazy: transformers is slow to import
    from transformers import AutoModelForCausalLM

    loaded = {}
    for name, pol in policies.items():
        d = os.path.join(path, name)
        if shards.is_sharded(d):
            reader = shards.ShardReader(d)
            loaded[name] = (shards.read_model(reader, pol.model),
                            shards.read_optimizer(reader, pol.model, pol.optimizer), "sharded")
            continue
        osd = load_optimizer_state(os.path.join(d, "optimizer.pt"))
        if pol.base_sha256 is not None:
            loaded[name] = (load_file(os.path.join(d, lora.ADAPTER_WEIGHTS)), osd, "adapter")
            continue
        model = AutoModelForCausalLM.from_pretrained(d, dtype=next(pol.model.parameters()).dtype)
        loaded[name] = (model.state_dict(), osd, "full")
    return loaded


def export(run_dir: str, out: str, step: int | None = None, policies: list | None = None,
           merge: bool = False) -> dict[str, str]:
    """Copy the policies of one verified checkpoint of ``run_dir`` into Hugging Face folders ``out/<policy>/``
    (weights, config, generation config, tokenizer; no optimizer state). A LoRA policy's folder is a PEFT adapter
    folder (``adapter_config.json``, ``adapter_model.safetensors``); with ``merge`` it is the merged model instead
    (the adapter added into its base: a plain transformers folder). ``step`` None: the newest checkpoint that
    verifies; a named step must verify. Nothing is written unless the checkpoint verifies and every policy exists;
    each folder is written under a temporary name and renamed; an existing ``out/<policy>`` is refused. Returns
    policy -> folder."""
    root = os.path.join(run_dir, "checkpoints")
    steps = complete_steps(root)
    if not steps:
        raise GraftError(f"{run_dir}: no complete checkpoint under {root}")
    if step is None:
        valid = valid_steps(root)
        if not valid:
            raise GraftError(f"{root}: no checkpoint verifies against its manifest")
        step = valid[-1]
    elif step not in steps:
        raise GraftError(f"--step {step}: no complete checkpoint of that step in {root} (steps: "
                         f"{', '.join(map(str, steps))})")
    src = step_path(root, step)
    bad = verify(src)
    if bad is not None:
        raise GraftError(f"checkpoint step {step} does not verify: {bad}")
    have = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    names = list(policies) if policies else have
    for n in names:
        if n not in have:
            raise GraftError(f"--policy {n}: not in checkpoint step {step} (policies: {', '.join(have)})")
        if os.path.exists(os.path.join(out, n)):
            raise GraftError(f"{os.path.join(out, n)}: exists; choose another --out or remove it")
    os.makedirs(out, exist_ok=True)
    done = {}
    for n in names:
        final = os.path.join(out, n)
        tmp = f"{final}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            if merge and lora.is_adapter_folder(os.path.join(src, n)):
                _export_merged(os.path.join(src, n), tmp)
                os.rename(tmp, final)
                done[n] = final
                continue
            shutil.copytree(os.path.join(src, n), tmp, ignore=shutil.ignore_patterns(*EXPORT_SKIP, shards.SHARDS))
            if shards.is_sharded(os.path.join(src, n)) and lora.is_adapter_folder(os.path.join(src, n)):
                save_file({k: v.contiguous() for k, v in shards.sharded_adapter(os.path.join(src, n)).items()},
                          os.path.join(tmp, lora.ADAPTER_WEIGHTS), metadata={"format": "pt"})
            elif shards.is_sharded(os.path.join(src, n)):  # every rank's part of the weights assembled in one file
                full = shards.ShardReader(os.path.join(src, n)).full_state()
                save_file({k: v.contiguous() for k, v in full.items()}, os.path.join(tmp, "model.safetensors"),
                          metadata={"format": "pt"})
            os.rename(tmp, final)
        except Exception as e:  # a full disk (OSError, or safetensors' error naming the os error)
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(e, GraftError) or (err := write_error(e)) is None:
                raise
            raise GraftError(f"{final}: not written ({err.strerror or err})") from None
        done[n] = final
    return done


def _export_merged(adapter_dir: str, dest: str) -> None:
    """A LoRA policy's checkpoint folder as a merged transformers folder: its base with the adapter added in
    (``merge_and_unload``) in the base's dtype, saved as safetensors with the checkpoint's tokenizer."""
    # lazy: transformers is slow to import
    from transformers import AutoConfig, AutoTokenizer

    base = AutoConfig.from_pretrained(lora.adapter_base(adapter_dir))
    dtype = str(getattr(base, "dtype", None) or getattr(base, "torch_dtype", None) or "float32").replace("torch.", "")
    model = load_model(adapter_dir, dtype if dtype in DTYPES else "float32", "cpu")
    model.save_pretrained(dest, safe_serialization=True)
    AutoTokenizer.from_pretrained(adapter_dir).save_pretrained(dest)
