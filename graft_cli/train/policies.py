"""Setting a run up: the trained policies (model, tokenizer, optimizer, rollout engine) and the
frozen models loaded from the config, the prompt cache, and :func:`preflight`, the checks that need
the models' tokenizers (shared vocabularies), run before anything is loaded or written."""

from __future__ import annotations

import copy
import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from graft_cli import config as C
from graft_cli.data.prompts import PromptSpec
from graft_cli.errors import GraftError
from graft_cli.models import lora
from graft_cli.models.loading import (
    check_model_path,
    load_role,
    load_tokenizer,
    looks_local,
    resolve_path,
    vocab_difference,
    weights_sha256,
)
from graft_cli.models.scoring import SCORERS
from graft_cli.models.shapes import shape_config, synthetic_tokenizer
from graft_cli.rollout import ENGINES
from graft_cli.rollout.engine import RolloutEngine
from graft_cli.train import dist as D

if TYPE_CHECKING:  # transformers is slow to import
    from transformers import PreTrainedTokenizerBase


@dataclass
class Policy:
    """A trained policy. With LoRA (``lora.r > 0``) ``model`` is the PEFT model, the optimizer holds
    the adapter's parameters only and ``base_sha256`` is the hash of the frozen base its adapter
    trains on (None: full weights)."""

    name: str
    model: torch.nn.Module  # a transformers causal LM (a PEFT model with LoRA; FSDP-wrapped under accelerate)
    tokenizer: PreTrainedTokenizerBase
    optimizer: torch.optim.Optimizer
    engine: RolloutEngine
    prompt_cache: dict
    base_sha256: str | None = None
    replica: torch.nn.Module | None = None  # run.staleness >= 1 with an engine of its own weights: the copy it
    # samples from, loaded with each rollout's weights by the rollout thread (train/rollouts.py); None:
    # the engine samples from ``model``


@dataclass
class Frozen:
    """A model with ``role: frozen``: scored, never updated (no optimizer, not checkpointed).
    ``scope()`` is the context it is scored in: for the base of a LoRA policy (``base_of``) the
    policy's own model with its adapter disabled (:func:`graft_cli.models.lora.adapter_off`), else
    nothing."""

    name: str
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    cfg: C.PolicyConfig
    sha256: str
    scope: Callable[[], AbstractContextManager] = nullcontext


# ----------------------------------------------------------------------------------------------- setup
def engine_kwargs(cfg: C.Config, frozen: dict) -> dict:
    """``rollout.engine_kwargs`` with the options the engine declares in ``frozen_kwargs`` (the
    tandem junior) replaced by the loaded frozen model they name."""
    kw = dict(cfg.rollout.engine_kwargs)
    for k in ENGINES.get(cfg.rollout.engine).frozen_kwargs:
        kw[k] = frozen[kw[k]].model
    return kw


def _keys(pc: C.PolicyConfig, cfg: C.Config) -> tuple[str, str]:
    """The config keys of a model's ``model`` and tokenizer (for one-line errors)."""
    i = next(j for j, p in enumerate(cfg.policies) if p.name == pc.name)
    return f"policies.{i}.model", f"policies.{i}.{'tokenizer' if pc.tokenizer else 'model'}"


def build_policy(pc: C.PolicyConfig, cfg: C.Config, dist: D.Dist | None = None, frozen: dict | None = None) -> Policy:
    model, tok = load_role(pc.model, pc.tokenizer, cfg.run.dtype, cfg.run.device, _keys(pc, cfg), pc.trust_remote_code,
                           cfg.run.model_init, cfg.run.random_shrink)
    if cfg.optim.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.config.use_cache = True
    base_sha = None
    if pc.lora.r > 0:  # the adapter trains, the base is frozen (models/lora.py)
        lo = pc.lora
        if cfg.optim.gradient_checkpointing:
            model.enable_input_require_grads()  # checkpointed blocks of a frozen base still pass gradients back
        model = lora.wrap(model, lo.r, lo.alpha, lo.dropout, lo.target_modules, lo.init)
        base_sha = lora.base_sha256(model)
    o = cfg.optim
    opt = torch.optim.AdamW(lora.trainable_parameters(model), lr=pc.lr or o.lr, betas=tuple(o.betas), eps=o.eps,
                            weight_decay=o.weight_decay)
    if dist is not None:
        model, opt = dist.prepare(model, opt)  # FSDP wrap under `accelerate launch`; else unchanged
    replica = rollout_replica(model, cfg, dist)
    engine = ENGINES.get(cfg.rollout.engine)(model if replica is None else replica, tok,
                                             max_batch=cfg.rollout.max_batch, **engine_kwargs(cfg, frozen or {}))
    if dist is not None and dist.enabled:
        engine.ranks_done = dist.all_done  # lock-step decoding asks the process group, guarded (Dist.guard)
    return Policy(pc.name, model, tok, opt, engine, {}, base_sha, replica)


def rollout_replica(model: torch.nn.Module, cfg: C.Config, dist: D.Dist | None) -> torch.nn.Module | None:
    """The policy's rollout replica (``Policy.replica``): a frozen copy of ``model`` for an engine
    that samples from weights of its own (``own_weights``) at ``run.staleness`` >= 1, so that the
    next steps' rollouts are generated while ``model`` updates; None otherwise."""
    if not C.samples_ahead(cfg.run) or not ENGINES.get(cfg.rollout.engine).own_weights:
        return None
    if dist is not None and dist.enabled:
        raise GraftError(f"run.staleness={cfg.run.staleness}: sampling ahead runs in one process; data-parallel "
                         f"runs sample with each step's own weights (run.staleness=0)")
    # parameters keep requires_grad: sampling runs under no_grad anyway, and CPU kernels pick
    # another path for weights that do not require grad (last-bit differences from the trained
    # model's log-probs)
    return copy.deepcopy(model).eval()


def base_frozen(pc: C.PolicyConfig, policy: Policy) -> Frozen:
    """The frozen model that is a LoRA policy's base (``base_of``): the policy's own model scored
    with its adapter disabled; its hash is the base's."""
    return Frozen(pc.name, policy.model, policy.tokenizer, pc, policy.base_sha256,
                  lambda: lora.adapter_off(policy.model))


def build_frozen(pc: C.PolicyConfig, cfg: C.Config, dist: D.Dist | None = None) -> Frozen:
    """Load a frozen model once in the run's dtype and device (FSDP-sharded like the policies), in
    eval mode with gradients off; its weight hash is recorded in every checkpoint."""
    model, tok = load_role(pc.model, pc.tokenizer, cfg.run.dtype, cfg.run.device, _keys(pc, cfg), pc.trust_remote_code,
                           cfg.run.model_init, cfg.run.random_shrink)
    model.requires_grad_(False)
    digest = weights_sha256(model)
    if dist is not None:
        model = dist.prepare_frozen(model)
    model.eval()
    return Frozen(pc.name, model, tok, pc, digest)


def encode_prompt(pol: Policy, problem: str, spec: PromptSpec) -> list[int]:
    ids = pol.prompt_cache.get(problem)
    if ids is None:
        ids = spec.encode(problem, pol.tokenizer)
        pol.prompt_cache[problem] = ids
    return ids


def preflight(cfg: C.Config) -> None:
    """Checks that need the models' tokenizers, before anything is written: a frozen model whose
    scorer scores the policies' own token ids (a KL reference, an OPD teacher), or that co-generates
    with them (a tandem junior), must share each served policy's vocabulary."""

    trained = {p.name: p for p in cfg.policies if p.role == "train"}
    toks: dict = {}

    random = cfg.run.model_init == "random"

    def tok(pc):
        spec = pc.model if random else resolve_path(pc.tokenizer or pc.model)
        if spec not in toks:
            if random:
                toks[spec] = synthetic_tokenizer(shape_config(pc.model, cfg.run.random_shrink))
            else:
                toks[spec] = load_tokenizer(spec, _keys(pc, cfg)[1], pc.trust_remote_code)
        return toks[spec]

    for i, pc in enumerate(cfg.policies):  # local folders that do not exist: one line naming the key
        if random:
            shape_config(pc.model)  # a model without a published config here: one line
            continue
        check_model_path(resolve_path(pc.model), f"policies.{i}.model")
        if pc.tokenizer:
            check_model_path(resolve_path(pc.tokenizer), f"policies.{i}.tokenizer", "tokenizer")
    data = resolve_path(cfg.data.train)
    if looks_local(data) and not os.path.exists(os.path.expanduser(data)):
        raise GraftError(f"config key 'data.train': {data}: file not found")
    spec = PromptSpec.from_config(cfg.prompt)
    if spec.chat_template == "required":  # a tokenizer without a chat template: one line before anything loads
        for pc in trained.values():  # the prompted ones (a co-generating junior reads the senior's prompt)
            spec.check(tok(pc), f"config key {_keys(pc, cfg)[1]!r}")

    by_name = {p.name: p for p in cfg.policies}
    for k in ENGINES.get(cfg.rollout.engine).frozen_kwargs:  # a co-generating model (tandem junior)
        f = by_name[cfg.rollout.engine_kwargs[k]]
        for name, pc in trained.items():
            if (f.tokenizer or f.model) != (pc.tokenizer or pc.model):
                diff = vocab_difference(tok(f), tok(pc))
                if diff:
                    raise GraftError(f"rollout.engine_kwargs.{k}: {f.name!r} ({f.model}) and policy {name!r} "
                                     f"({pc.model}) do not share a vocabulary ({diff}); the {cfg.rollout.engine} "
                                     f"engine feeds one token id to both")
    for f in [p for p in cfg.policies if p.role == "frozen"]:
        if not SCORERS.spec(f.scorer).shared_vocab:
            continue
        for name in f.serves or list(trained):
            pc = trained[name]
            if (f.tokenizer or f.model) == (pc.tokenizer or pc.model):
                continue
            diff = vocab_difference(tok(f), tok(pc))
            if diff:
                raise GraftError(f"frozen model {f.name!r} ({f.model}) and policy {name!r} ({pc.model}) do not share a "
                                 f"vocabulary ({diff}); scorer {f.scorer!r} scores the policy's own token ids")
