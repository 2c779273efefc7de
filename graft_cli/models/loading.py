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
