"""LoRA policies through PEFT: the adapter a trained policy learns instead of its full weights.

A policy with ``policies.N.lora.r > 0`` is its base model with LoRA adapters injected by PEFT
(``get_peft_model``): each targeted linear layer computes ``W x + (alpha / r) B A x`` (Hu et al.
2021, eq. 3; ``A`` is ``r x d_in``, ``B`` is ``d_out x r``, B = 0 at start with ``init: default``,
so the adapted model starts as the base). Only ``A`` and ``B`` require gradients and enter the
optimizer; the base weights are frozen.

What a run does with it:

* the **reference for free**: a method that needs the initial policy (a KL reference,
  ``algo.reference: initial``) scores with the same base, the adapter disabled (:func:`adapter_off`,
  PEFT's ``disable_adapter``), not a second copy of the weights;
* a **merged state dict** (:func:`merged_state_dict`: ``W + (alpha / r) B A`` under the base model's
  own names) for an engine that loads full weights (vLLM), computed without touching the trained
  weights (PEFT's ``merge_adapter`` / ``unmerge_adapter`` would add and subtract the delta in place
  and drift the base by rounding);
* **checkpoints** hold the adapter only (PEFT's ``save_pretrained``: ``adapter_config.json`` and
  ``adapter_model.safetensors``; sharded under FSDP: each rank's part of the adapter and
  ``adapter_config.json``) and its optimizer state; the base's hash is recorded and checked on
  resume;
* a checkpoint's adapter folder loads as a merged model for evaluation
  (:func:`load_adapter_folder`).

Defaults follow verl's (``lora_rank`` 0 = off, ``lora_alpha`` 16, ``target_modules: all-linear``, no
dropout). """

from __future__ import annotations

import hashlib
import json
import os

import torch

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
# PEFT's ``init_lora_weights``: default (A Kaiming-uniform, B = 0: the adapted model starts as the
# base), gaussian (A Gaussian, B = 0), pissa / olora (the adapter starts from the base's principal
# directions; the base is changed)
INITS = {"default": True, "gaussian": "gaussian", "pissa": "pissa", "olora": "olora"}


def is_lora(model) -> bool:
    """A PEFT model (its LoRA adapter is what trains)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def unwrap(model):
    """The transformers model inside a PEFT model (its LoRA layers injected in place); the model
    itself else."""
    return model.get_base_model() if is_lora(model) else model


def wrap(model, r: int, alpha: float, dropout: float, target_modules, init: str):
    """``model`` with LoRA adapters of rank ``r`` on ``target_modules`` (``all-linear``: every
    linear layer but the LM head), only the adapter trainable."""
    # lazy: PEFT imports transformers
    from peft import LoraConfig, get_peft_model

    targets = target_modules if isinstance(target_modules, str) else list(target_modules)
    cfg = LoraConfig(r=int(r), lora_alpha=float(alpha), lora_dropout=float(dropout), target_modules=targets,
                     init_lora_weights=INITS[init], bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, cfg)


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    """The parameters the optimizer steps: all of a full-weight model's, the adapter's of a LoRA
    model."""
    return [p for p in model.parameters() if p.requires_grad]


def base_sha256(model) -> str:
    """sha256 over the frozen base weights of a LoRA model (name without PEFT's wrapping, dtype,
    shape, bytes; the adapter's tensors left out): the base a run's adapters were trained on,
    recorded in every checkpoint."""
    h = hashlib.sha256()
    for name, t in sorted(base_state_dict(model).items()):
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _base_name(key: str) -> str:
    return key.replace(".base_layer.", ".")


def base_state_dict(model) -> dict[str, torch.Tensor]:
    """The base model's weights under its own names (``q_proj.base_layer.weight`` ->
    ``q_proj.weight``), the adapter's tensors left out."""
    return {_base_name(k): v for k, v in unwrap(model).state_dict().items() if ".lora_" not in k}


@torch.no_grad()
def merged_state_dict(model) -> dict[str, torch.Tensor]:
    """The weights of the adapted model under the base model's names: ``W + (alpha / r) B A`` for
    each LoRA layer (PEFT's ``get_delta_weight``), the other weights as they are. New tensors; the
    model is not changed."""
    # lazy: PEFT imports transformers
    from peft.tuners.lora import LoraLayer

    out = base_state_dict(model)
    for name, mod in unwrap(model).named_modules():
        if not isinstance(mod, LoraLayer):
            continue
        w = f"{name}.weight"
        delta = sum(mod.get_delta_weight(a) for a in mod.active_adapters if a in mod.lora_A)
        out[w] = (out[w] + delta.to(out[w].dtype)) if torch.is_tensor(delta) else out[w]
    return out


def adapter_state(model) -> dict[str, torch.Tensor]:
    """The adapter's tensors as PEFT saves them (``get_peft_model_state_dict``)."""
    # lazy: PEFT imports transformers
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model)


def load_adapter_state(model, sd: dict) -> None:
    """Put a saved adapter (:func:`adapter_state`'s keys) into ``model``; every adapter tensor must
    be there with its shape (a checkpoint of another rank or target set is refused, not
    half-loaded)."""
    # lazy: PEFT imports transformers
    from peft import set_peft_model_state_dict

    want = adapter_state(model)
    missing = sorted(set(want) - set(sd))
    unexpected = sorted(set(sd) - set(want))
    if missing or unexpected:
        what = f"missing {missing[0]!r}" if missing else f"unexpected {unexpected[0]!r}"
        raise ValueError(f"the adapter does not fit this policy's LoRA config ({what})")
    for k, v in sd.items():
        if tuple(v.shape) != tuple(want[k].shape):
            raise ValueError(f"the adapter does not fit this policy's LoRA config ({k}: shape {tuple(v.shape)} vs "
                             f"{tuple(want[k].shape)})")
    set_peft_model_state_dict(model, sd)


def saved_key(name: str, adapter: str = "default") -> str:
    """A parameter's name as PEFT saves it: the adapter's name left out (``lora_A.default.weight``
    -> ``lora_A.weight``)."""
    return name.replace(f".{adapter}.", ".")


def model_keys(model, saved: dict) -> dict:
    """A saved adapter (:func:`adapter_state`'s keys) under the model's own parameter names (the
    FSDP state-dict setters take those)."""
    names = [n for n, p in model.named_parameters() if ".lora_" in n]
    missing = [n for n in names if saved_key(n) not in saved]
    if missing or len(names) != len(saved):
        raise ValueError(f"the adapter does not fit this policy's LoRA config ({len(saved)} saved tensors, "
                         f"{len(names)} in the model{', missing ' + repr(saved_key(missing[0])) if missing else ''})")
    return {n: saved[saved_key(n)] for n in names}


def is_adapter_folder(path: str) -> bool:
    return os.path.isfile(os.path.join(path, ADAPTER_CONFIG))


def adapter_base(path: str) -> str:
    """The base model an adapter folder was trained on (``base_model_name_or_path`` of its
    config)."""
    with open(os.path.join(path, ADAPTER_CONFIG), encoding="utf-8") as f:
        base = json.load(f).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{os.path.join(path, ADAPTER_CONFIG)}: names no base_model_name_or_path")
    return base


def load_adapter_folder(path: str, load_base, merge: bool = True, state: dict | None = None):
    """The model of an adapter folder: its base (``load_base(base_path)``, a model) with the adapter
    loaded (from the folder's ``adapter_model.safetensors``, or ``state``: PEFT's keys, e.g. a
    sharded checkpoint's parts assembled), merged into the weights (``merge_and_unload``: a plain
    transformers model) unless ``merge`` is false."""
    # lazy: PEFT imports transformers
    from peft import LoraConfig, PeftModel, set_peft_model_state_dict

    base = load_base(adapter_base(path))
    if state is not None:
        model = PeftModel(base, LoraConfig.from_pretrained(path))
        set_peft_model_state_dict(model, state)
    else:
        model = PeftModel.from_pretrained(base, path, is_trainable=False)
    return model.merge_and_unload() if merge else model


def adapter_off(model):
    """The context in which a LoRA model computes its base model (PEFT's ``disable_adapter``): the
    reference for free, what the initial policy scored (B = 0 at start), without a second copy of
    the weights."""
    return model.disable_adapter()
