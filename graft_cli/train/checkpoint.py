"""Atomic checkpoints: ``checkpoints/step_NNNNNN/{<policy>/, state.pt, COMPLETE}``.

Each policy folder holds ``save_pretrained`` weights (safetensors) and tokenizer plus ``optimizer.pt``.
``state.pt`` holds the step, the data cursor, exchange/schedule state and the RNG states. A checkpoint is
written under a temporary name and renamed once complete, so a killed run never leaves a half-written
``step_*`` folder that resume would pick up.
"""

from __future__ import annotations

import os
import random
import re
import shutil

import numpy as np
import torch

STEP_RE = re.compile(r"^step_(\d{6,})$")


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(st: dict) -> None:
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])


def save(ckpt_root: str, step: int, policies: dict, state: dict, keep: int = 2) -> str:
    final = os.path.join(ckpt_root, f"step_{step:06d}")
    tmp = f"{final}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for name, pol in policies.items():
        d = os.path.join(tmp, name)
        pol.model.save_pretrained(d, safe_serialization=True)
        pol.tokenizer.save_pretrained(d)
        torch.save(pol.optimizer.state_dict(), os.path.join(d, "optimizer.pt"))
    torch.save({**state, "rng": rng_state()}, os.path.join(tmp, "state.pt"))
    open(os.path.join(tmp, "COMPLETE"), "w").close()
    if os.path.exists(final):
        shutil.rmtree(final)
    os.rename(tmp, final)
    prune(ckpt_root, keep)
    return final


def complete_steps(ckpt_root: str) -> list[int]:
    if not os.path.isdir(ckpt_root):
        return []
    out = []
    for d in os.listdir(ckpt_root):
        m = STEP_RE.match(d)
        if m and os.path.exists(os.path.join(ckpt_root, d, "COMPLETE")):
            out.append(int(m.group(1)))
    return sorted(out)


def latest(ckpt_root: str) -> str | None:
    steps = complete_steps(ckpt_root)
    return os.path.join(ckpt_root, f"step_{steps[-1]:06d}") if steps else None


def prune(ckpt_root: str, keep: int) -> None:
    for d in os.listdir(ckpt_root):
        if ".tmp-" in d:
            pid = d.rsplit("-", 1)[-1]
            if pid != str(os.getpid()):
                shutil.rmtree(os.path.join(ckpt_root, d), ignore_errors=True)
    if keep <= 0:
        return
    for s in complete_steps(ckpt_root)[:-keep]:
        shutil.rmtree(os.path.join(ckpt_root, f"step_{s:06d}"), ignore_errors=True)


def load_state(path: str) -> dict:
    return torch.load(os.path.join(path, "state.pt"), weights_only=False)
