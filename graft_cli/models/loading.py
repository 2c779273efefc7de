"""Load a policy (model + tokenizer) from a hub id, a local folder or a ``<source>:<name>`` of a
model source.

A model source (``tiny:<role>``, ``tiny_code:<name>``) and the build record a run's provenance
keeps of it are provided by a layer above this one (:mod:`graft_cli.tiny`), which this module never
imports, not even by name: the package declares them as Python entry points in its pyproject.toml,
``[project.entry-points."graft.model_sources"]`` (name -> the function resolving ``<name>`` to a
local path) and ``[project.entry-points."graft.source_builds"]`` (name -> the function writing the
build record), and :data:`MODEL_SOURCES` / :data:`SOURCE_BUILDS` import each on its first lookup
(:func:`graft_cli.registry.declared_entry_points`: from the installed metadata, or from the
pyproject.toml of the source checkout the package runs from, whose table stays current where an
editable install's metadata does not). Another installed package adds a source the same way."""

from __future__ import annotations

import hashlib
import os

import torch

from graft_cli.errors import GraftError
from graft_cli.models import lora, shards
from graft_cli.models.shapes import random_model
from graft_cli.registry import Registry

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def looks_local(path: str) -> bool:
    """A filesystem path rather than a hub id (``org/name``): absolute, relative with ./ or ../, ~,
    or existing."""
    return path.startswith(("/", "./", "../", "~", ".\\")) or os.path.exists(path) or path in (".", "..")


def check_model_path(path: str, key: str, what: str = "model") -> None:
    """One line naming the config key when a local model or tokenizer folder is missing or not a
    folder."""
    if looks_local(path):
        full = os.path.expanduser(path)
        if not os.path.exists(full):
            raise GraftError(f"config key {key!r}: {what} folder {path} does not exist")
        if not os.path.isdir(full):
            raise GraftError(f"config key {key!r}: {what} {path} is a file, not a model folder")


def load_tokenizer(path: str, key: str | None = None, trust_remote_code: bool = False):
    """The tokenizer at ``path`` (left padding; pad = EOS when it has no pad token); one line naming
    ``key`` on a missing folder, an unloadable tokenizer or one without an EOS token."""
    # lazy: transformers is slow to import
    from transformers import AutoTokenizer

    where = f"config key {key!r}: " if key else ""
    if key:
        check_model_path(path, key, "tokenizer")
    try:
        tok = AutoTokenizer.from_pretrained(os.path.expanduser(path), trust_remote_code=trust_remote_code)
    except Exception as e:
        raise GraftError(f"{where}tokenizer {path!r}: could not load ({type(e).__name__}: "
                         f"{(str(e).splitlines() or [''])[0]})") from None
    if tok.eos_token is None:
        raise GraftError(f"{where}tokenizer {path!r} has no EOS token: responses could never end")
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(path: str, dtype: str = "float32", device: str = "auto", attn_implementation: str | None = None,
               key: str | None = None, trust_remote_code: bool = False):
    """The causal LM at ``path``; ``trust_remote_code`` only when the user set it for this model."""
    # lazy: transformers is slow to import
    from transformers import AutoModelForCausalLM

    if key:
        check_model_path(path, key)
    kwargs = {"dtype": DTYPES[dtype], "trust_remote_code": trust_remote_code}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        if os.path.isdir(path) and lora.is_adapter_folder(path):  # a LoRA policy's checkpoint: base + adapter
            state = shards.sharded_adapter(path) if shards.is_sharded(path) else None
            model = lora.load_adapter_folder(path, lambda base: load_model(base, dtype, "cpu", attn_implementation,
                                                                           trust_remote_code=trust_remote_code),
                                             state=state)
        elif os.path.isdir(path) and shards.is_sharded(path):  # a sharded checkpoint's policy: assembled whole
            model = from_shards(path, **kwargs)
        else:
            model = AutoModelForCausalLM.from_pretrained(os.path.expanduser(path), **kwargs)
    except GraftError:
        raise
    except Exception as e:
        where = "folder" if os.path.isdir(path) else "hub id"
        why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
        lead = f"config key {key!r}: " if key else ""
        raise GraftError(f"{lead}model {path!r} ({where}): could not load ({why})") from None
    return model.to(resolve_device(device))


def from_shards(path: str, dtype=torch.float32, trust_remote_code: bool = False, attn_implementation=None):
    """The model of a sharded checkpoint's policy folder (:mod:`graft_cli.models.shards`): built
    from its ``config.json`` and loaded with the assembled weights (tied weights tied again); every
    weight must be there."""
    # lazy: transformers is slow to import
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    kw = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code, **kw)
    sd = shards.ShardReader(path).full_state()
    missing, unexpected = model.load_state_dict(sd, strict=False)
    tied = {n for n, p in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
    missing = [m for m in missing if m not in tied and m not in dict(model.named_buffers())]
    if missing or unexpected:
        what = f"missing {missing[0]!r}" if missing else f"unexpected {unexpected[0]!r}"
        raise GraftError(f"{path}: the shards do not fit the model of its config.json ({what})")
    if os.path.exists(os.path.join(path, "generation_config.json")):
        model.generation_config = GenerationConfig.from_pretrained(path)
    return model.eval()


# ``<source>:<name>`` model and data names resolved by the source's function (name -> local path),
# declared in the entry-point group graft.model_sources (module docstring)
MODEL_SOURCES: Registry = Registry("model source", entry_points="graft.model_sources")

# ``<source>`` -> what a run built from that source was made with (the per-run provenance's build
# record): a function of (the names a run loads from it, whether it trains on the source's data)
# returning a JSON-able dict, ``{"roles": name -> its hash, ...}``; declared in the entry-point
# group graft.source_builds
SOURCE_BUILDS: Registry = Registry("source build", entry_points="graft.source_builds")


def resolve_path(spec: str) -> str:
    """``<source>:<name>`` with a registered source (``MODEL_SOURCES``; ``tiny:<role>``: a folder of
    the embedded tiny pair, built on first use, or one of its task files, ``tiny:train``,
    ``tiny:eval_math500``, ...) is that source's path; anything else (a hub id, a local folder or
    file) is returned."""
    source, sep, name = spec.partition(":")
    if sep and source in MODEL_SOURCES:
        return MODEL_SOURCES.get(source)(name)
    return spec


def weights_sha256(model) -> str:
    """sha256 over the model's parameters and buffers (name, dtype, shape and bytes, in name order):
    the identity a run records for a frozen model, independent of the file format it was loaded
    from."""

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def vocab_difference(tok_a, tok_b) -> str | None:
    """None when both tokenizers map every id to the same token string (same vocabulary size
    included); else what differs first: the sizes, or the first id whose token string differs."""
    va, vb = tok_a.get_vocab(), tok_b.get_vocab()
    if len(va) != len(vb):
        return f"vocabulary sizes {len(va)} vs {len(vb)}"
    ia, ib = {i: t for t, i in va.items()}, {i: t for t, i in vb.items()}
    for i in sorted(set(ia) | set(ib)):
        if ia.get(i) != ib.get(i):
            return f"token id {i} is {ia.get(i)!r} vs {ib.get(i)!r}"
    return None


def load_role(model: str, tokenizer: str | None, dtype: str, device: str, keys: tuple[str, str] = (None, None),
              trust_remote_code: bool = False, init: str = "pretrained", shrink: bool = False):
    """``(model, tokenizer)`` of one model of a run: from its folder or hub id (``init:
    pretrained``), or with random weights in its published shape and a synthetic tokenizer (``init:
    random``, :mod:`graft_cli.models.shapes`; no download)."""
    if init == "random":
        return random_model(model, DTYPES[dtype], shrink, resolve_device(device))
    tok = load_tokenizer(resolve_path(tokenizer or model), keys[1], trust_remote_code)
    m = load_model(resolve_path(model), dtype, device, key=keys[0], trust_remote_code=trust_remote_code)
    return m, tok
