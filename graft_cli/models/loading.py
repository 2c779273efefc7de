"""Load a policy (model + tokenizer) from a hub id or a local folder."""

from __future__ import annotations

import os

import torch

from graft_cli.errors import GraftError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path)
    except Exception as e:
        raise GraftError(f"tokenizer {path!r}: could not load ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(path: str, dtype: str = "float32", device: str = "auto", attn_implementation: str | None = None):
    from transformers import AutoModelForCausalLM

    kwargs = {"dtype": DTYPES[dtype]}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except Exception as e:
        where = "folder" if os.path.isdir(path) else "hub id"
        why = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        raise GraftError(f"model {path!r} ({where}): could not load ({why})") from None
    return model.to(resolve_device(device))


def resolve_path(spec: str) -> str:
    """``tiny:<role>`` names a folder of the embedded tiny pair (built on first use), or one of its task files
    (``tiny:train``, ``tiny:eval_math500``, ...); anything else (a hub id, a local folder or file) is returned."""
    if spec.startswith("tiny:"):
        from graft_cli.models.tiny import ensure_tiny

        paths = ensure_tiny()
        role = spec.split(":", 1)[1]
        if role in paths:
            return paths[role]
        task_file = os.path.join(paths["task"], f"{role}.jsonl")
        if os.path.exists(task_file):
            return task_file
        known = ", ".join(sorted(paths))
        raise GraftError(f"unknown tiny name {role!r}; known: {known}, or a task file in {paths['task']}")
    return spec


def weights_sha256(model) -> str:
    """sha256 over the model's parameters and buffers (name, dtype, shape and bytes, in name order): the
    identity a run records for a frozen model, independent of the file format it was loaded from."""
    import hashlib

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def vocab_difference(tok_a, tok_b) -> str | None:
    """None when both tokenizers map every id to the same token string (same vocabulary size included);
    else what differs first: the sizes, or the first id whose token string differs."""
    va, vb = tok_a.get_vocab(), tok_b.get_vocab()
    if len(va) != len(vb):
        return f"vocabulary sizes {len(va)} vs {len(vb)}"
    ia, ib = {i: t for t, i in va.items()}, {i: t for t, i in vb.items()}
    for i in sorted(set(ia) | set(ib)):
        if ia.get(i) != ib.get(i):
            return f"token id {i} is {ia.get(i)!r} vs {ib.get(i)!r}"
    return None
