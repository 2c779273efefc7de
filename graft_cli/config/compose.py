"""Config composition and validation.

The Hydra tree in ``experiments/`` is composed (``config.yaml`` + ``pair/*.yaml`` + ``method/*.yaml`` +
command-line overrides) and merged into the schema's dataclasses (:mod:`graft_cli.schema`), so an unknown key
fails with the key's name, and :func:`validate` checks ranges and cross-field rules. Every failure is one line
naming the key.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import re
import sys
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from graft_cli.algorithms import CONTROLLERS, LOSS_MASKS, TOKEN_ADVANTAGES
from graft_cli.algorithms.advantages import ADVANTAGES
from graft_cli.algorithms.controllers import controller_params
from graft_cli.algorithms.correction import IS_CORRECTIONS, ROLLOUT_REJECTIONS
from graft_cli.algorithms.exchange import EXCHANGES
from graft_cli.algorithms.losses import AGG_MODES, KL_KINDS, KL_ROWS, POLICY_LOSSES
from graft_cli.algorithms.minibatch import LAYOUTS, MINIBATCH_ORDERINGS
from graft_cli.algorithms.signals import loss_mask_params, token_adv_params
from graft_cli.errors import GraftError
from graft_cli.models.loading import DTYPES
from graft_cli.models.lora import INITS as LORA_INITS
from graft_cli.models.logprobs import AUTOCAST
from graft_cli.models.scoring import SCORERS
from graft_cli.registry import validate_params
from graft_cli.reward import REWARDS
from graft_cli.rollout import ENGINES
from graft_cli.schema import ROLES, SYNC_CHECKS, Config, PolicyConfig, SourceConfig


def _scaled(x, f) -> int:
    """``${graft_scale:${data.prompt_batch},0.5}``: an int scaled from another key (a method's minibatch as a
    share of the pair's prompt batch)."""
    return max(1, int(round(int(x) * float(f))))


OmegaConf.register_new_resolver("graft_scale", _scaled, replace=True)

EXPERIMENTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments")


def _one_line(e: Exception) -> str:
    msg = str(e).strip().splitlines()
    key = getattr(e, "full_key", None)
    head = msg[0] if msg else type(e).__name__
    return f"config key {key!r}: {head}" if key else f"config: {head}"


# scale=<name>: an optional hardware overlay (experiments/scale/); task=<name>: an optional task overlay
# (experiments/task/: another task's data, reward, prompt, student and teacher for the pair); both applied last
GROUPS = ("pair", "method", "scale", "task")
OVERLAYS = ("scale", "task")


def compose(overrides: list[str] | None = None, config_dir: str | None = None) -> Config:
    """Compose ``config.yaml`` with Hydra (config groups ``pair=`` and ``method=`` select files),
    merge into the schema, apply the ``key=value`` overrides, validate. Raises :class:`GraftError`
    with one line on any problem (an unknown key names the key)."""
    # lazy: Hydra only composes configs
    from hydra import compose as hcompose

    # lazy: Hydra only composes configs
    from hydra import initialize_config_dir

    # lazy: Hydra only composes configs
    from hydra.core.global_hydra import GlobalHydra

    # lazy: Hydra only composes configs
    from hydra.errors import HydraException

    config_dir = config_dir or EXPERIMENTS_DIR
    groups, rest = [], []
    for ov in overrides or []:
        key, eq, val = ov.partition("=")
        if not eq:
            raise GraftError(f"override {ov!r}: expected key=value")
        if key in GROUPS:
            val = val.strip("'\"")
            if not os.path.exists(os.path.join(config_dir, key, f"{val}.yaml")):
                known = sorted(f[:-5] for f in os.listdir(os.path.join(config_dir, key))
                               if f.endswith(".yaml") and not f.startswith("_"))
                raise GraftError(f"{key} {val!r}: no {key}/{val}.yaml in {config_dir}; known: {', '.join(known)}")
            groups.append(f"{'+' if key in OVERLAYS else ''}{key}='{val}'")
        else:
            rest.append(ov)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            raw = hcompose(config_name="config", overrides=groups)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        raise GraftError(f"config: {str(e).strip().splitlines()[0]}") from None
    return from_dictconfig(raw, rest)


def from_dictconfig(raw: DictConfig | dict, overrides: list[str] | None = None, load_plugins: bool = True) -> Config:
    """Merge into the schema, apply overrides, import plugins (``load_plugins``), validate. A config read back
    from a run directory (:func:`load_yaml`) imports no plugin: code runs only when the user names it."""

    schema = OmegaConf.structured(Config)
    try:
        merged = OmegaConf.merge(schema, raw)
        for path in FREE_DICTS:
            OmegaConf.set_struct(OmegaConf.select(merged, path), False)

        def apply(ovs):
            for ov in ovs:
                key, _, val = ov.partition("=")
                key = key.lstrip("+")
                try:
                    value = yaml.safe_load(val) if val != "" else ""
                except yaml.YAMLError:
                    value = val
                if OmegaConf.select(merged, key, default="__missing__") == "__missing__" and not _dict_field(merged,
                                                                                                         key):
                    raise GraftError(f"config key {key!r}: unknown key")
                OmegaConf.update(merged, key, value, merge=True)

        # overrides of other keys first: the model lists may interpolate them (e.g. ${distill.student})
        lists = [ov for ov in overrides or [] if ov.lstrip("+").split("=")[0].split(".")[0] in ("policies", "sources")]
        apply([ov for ov in overrides or [] if ov not in lists])
        merged.policies = [OmegaConf.merge(OmegaConf.structured(PolicyConfig), p) for p in merged.policies]
        merged.sources = [OmegaConf.merge(OmegaConf.structured(SourceConfig), p) for p in merged.sources]
        for ov in lists:  # a list given whole holds plain mappings: into the schema (nested sections typed) at once,
            apply([ov])  # so a later override may set their keys (policies=[...] +policies.0.lora.r=8)
            merged.policies = [OmegaConf.merge(OmegaConf.structured(PolicyConfig), p) if isinstance(p, DictConfig)
                               else p for p in merged.policies]
        cfg: Config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise GraftError(_one_line(e)) from None
    for key in ("policies", "sources"):
        for i, p in enumerate(getattr(cfg, key)):
            if not isinstance(p, (PolicyConfig, SourceConfig, dict)):
                raise GraftError(f"config key '{key}.{i}': must be a mapping like {{name: a, model: PATH}}, got {p!r}")
    cfg.policies = [p if isinstance(p, PolicyConfig) else PolicyConfig(**p) for p in cfg.policies]
    cfg.sources = [p if isinstance(p, SourceConfig) else SourceConfig(**p) for p in cfg.sources]
    if load_plugins:
        import_plugins(cfg.plugins)
    validate(cfg, registries=load_plugins)
    return cfg


def import_plugins(plugins: list) -> None:
    """Import each plugin (a module name, or a path to a ``.py`` file) so that its registered functions exist
    before the config is validated: how a new method is added without editing graft."""

    for i, name in enumerate(plugins or []):
        name = str(name)
        try:
            if name.endswith(".py"):
                mod = f"graft_plugin_{os.path.splitext(os.path.basename(name))[0]}"
                if mod in sys.modules:
                    continue
                spec = importlib.util.spec_from_file_location(mod, name)
                if spec is None or not os.path.exists(name):
                    raise FileNotFoundError(name)
                module = importlib.util.module_from_spec(spec)
                sys.modules[mod] = module
                spec.loader.exec_module(module)
            else:
                importlib.import_module(name)
        except GraftError:
            raise
        except Exception as e:
            raise GraftError(f"config key 'plugins.{i}': cannot import {name!r}: {type(e).__name__}: {e}") from None


def _dict_field(cfg: DictConfig, key: str) -> bool:
    """True when ``key`` adds an entry under a free-form dict field (``exchange.params.x``, ``extra.y``)."""
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    return parent in FREE_DICTS or any(parent.startswith(p + ".") for p in FREE_DICTS)


FREE_DICTS = ("exchange.params", "extra", "data.fields", "data.where", "rollout.engine_kwargs", "algo.loss_params",
              "algo.token_adv_params", "algo.loss_mask_params", "algo.rollout_correction.params", "distill", "tandem",
              "eval.final.bench_runs")


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def load_yaml(path: str) -> Config:
    try:
        raw = OmegaConf.load(path)
    except Exception as e:
        raise GraftError(f"{path}: {str(e).splitlines()[0]}") from None
    return from_dictconfig(raw, load_plugins=False)


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise GraftError(f"config key {key!r}: {msg}")


def _float_fields(obj, prefix: str = ""):
    """(dotted key, value) of every float option of the schema's dataclasses (lists of them included)."""

    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        key = f"{prefix}{f.name}"
        if isinstance(v, float):
            yield key, v
        elif dataclasses.is_dataclass(v):
            yield from _float_fields(v, key + ".")
        elif isinstance(v, list):
            for i, x in enumerate(v):
                if isinstance(x, float):
                    yield f"{key}.{i}", x
                elif dataclasses.is_dataclass(x):
                    yield from _float_fields(x, f"{key}.{i}.")


def _check_lora(p: PolicyConfig, i: int, cfg: Config) -> None:
    """``policies.<i>.lora`` and ``base_of``: ranges, a known init, LoRA on trained policies only, and a frozen
    base that names a LoRA policy."""
    lo, key = p.lora, f"policies.{i}.lora"
    _check(isinstance(lo.r, int) and lo.r >= 0, f"{key}.r", f"must be an integer >= 0 (0: full weights), got {lo.r!r}")
    _check(lo.alpha > 0, f"{key}.alpha", f"must be > 0, got {lo.alpha}")
    _check(0 <= lo.dropout < 1, f"{key}.dropout", f"must be in [0, 1), got {lo.dropout}")
    _check(lo.init in LORA_INITS, f"{key}.init", f"must be one of {', '.join(LORA_INITS)}, got {lo.init!r}")
    tm = lo.target_modules
    _check((isinstance(tm, str) and bool(tm)) or (isinstance(tm, (list, tuple)) and len(tm) > 0
                                                  and all(isinstance(x, str) and x for x in tm)),
           f"{key}.target_modules", "must be all-linear or a non-empty list of module names")
    _check(lo.r == 0 or p.role == "train", f"{key}.r", "LoRA adapters are for trained policies (role: train)")
    if p.base_of is not None:
        by_name = {q.name: q for q in cfg.policies}
        q = by_name.get(p.base_of)
        _check(p.role == "frozen", f"policies.{i}.base_of", "only a frozen model is the base of a policy")
        _check(q is not None and q.role == "train" and q.lora.r > 0, f"policies.{i}.base_of",
               f"{p.base_of!r} is not a trained policy with LoRA adapters (lora.r > 0)")
        _check(p.model == q.model, f"policies.{i}.model", f"the base of {p.base_of!r} is its model {q.model!r}")


def validate(cfg: Config, registries: bool = True) -> None:
    """Ranges and cross-field rules. ``registries=False`` (a config read back from a run directory, whose
    plugins were not imported) skips the checks that a registered name exists."""

    def _known(name, reg, key):
        if registries:
            _check(name in reg, key, f"unknown {reg.kind} {name!r}; known: {', '.join(reg.names())}")

    a, r, o = cfg.algo, cfg.rollout, cfg.optim
    for key, v in _float_fields(cfg):  # inf / nan pass every range check below (inf > 0): refuse them first
        _check(math.isfinite(v), key, f"must be a finite number, got {v}")
    _check(len(cfg.policies) >= 1, "policies", "at least one policy is needed")
    names = [p.name for p in cfg.policies] + [s.name for s in cfg.sources]
    _check(len(set(names)) == len(names), "policies", f"policy names must be unique, got {names}")
    trained = [p.name for p in cfg.policies if p.role == "train"]
    for i, p in enumerate(cfg.policies):
        _check(bool(p.name) and p.name.replace("-", "").replace("_", "").isalnum(), f"policies.{i}.name",
               "must be a non-empty alphanumeric name")
        _check(p.role in ROLES, f"policies.{i}.role", f"must be one of {', '.join(ROLES)}, got {p.role!r}")
        _check_lora(p, i, cfg)
        if p.role == "frozen":
            _known(p.scorer, SCORERS, f"policies.{i}.scorer")
            for s in p.serves:
                _check(s in trained, f"policies.{i}.serves", f"{s!r} is not a trained policy ({', '.join(trained)})")
    _check(len(trained) >= 1, "policies", "at least one policy with role: train is needed")
    for i, sc in enumerate(cfg.sources):
        _check(sc.kind == "rollout_log", f"sources.{i}.kind", f"must be rollout_log, got {sc.kind!r}")
    for i, t in enumerate(a.token_advantages):
        _known(t, TOKEN_ADVANTAGES, f"algo.token_advantages.{i}")
    if all(t in TOKEN_ADVANTAGES for t in a.token_advantages):
        flat = {}
        for d in token_adv_params(list(a.token_advantages), a.token_adv_params).values():
            flat.update(d)
        a.token_adv_params = flat
    _known(a.loss_mask, LOSS_MASKS, "algo.loss_mask")
    if a.loss_mask in LOSS_MASKS:
        a.loss_mask_params = loss_mask_params(a.loss_mask, a.loss_mask_params)
    _check(a.clip_ratio_c == 0 or a.clip_ratio_c > 1, "algo.clip_ratio_c", "must be 0 (off) or > 1")
    _check(a.kl_coef >= 0, "algo.kl_coef", "must be >= 0")
    _check(a.kl_type in KL_KINDS, "algo.kl_type", f"must be one of {', '.join(KL_KINDS)}")
    _check(a.kl_rows in KL_ROWS, "algo.kl_rows", f"must be one of {', '.join(KL_ROWS)}")
    _check(a.reference in ("none", "initial"), "algo.reference", "must be none or initial")
    fg = a.filter_groups
    _check(fg.metric == "acc", "algo.filter_groups.metric", f"must be acc, got {fg.metric!r}")
    _check(fg.max_num_gen_batches >= 0, "algo.filter_groups.max_num_gen_batches", "must be >= 0 (0 = no cap)")
    _check(not fg.enable or cfg.exchange.name == "none", "algo.filter_groups.enable",
           "dynamic sampling gives each policy its own prompts: only with exchange.name=none")
    _check(not fg.enable or r.n >= 2, "algo.filter_groups.enable", "needs rollout.n >= 2")
    if a.reference == "initial":  # a frozen copy of each policy's initial weights, scored into ref_logprobs
        for p in [p for p in cfg.policies if p.role == "train"]:
            if not any(q.name == f"{p.name}_ref" for q in cfg.policies):
                cfg.policies.append(PolicyConfig(name=f"{p.name}_ref", model=p.model, tokenizer=p.tokenizer,
                                                 role="frozen", serves=[p.name], column="ref_logprobs",
                                                 base_of=p.name if p.lora.r > 0 else None))
    if a.kl_coef > 0:
        for t in trained:
            _check(any(q.role == "frozen" and q.score_column == "ref_logprobs" and (not q.serves or t in q.serves)
                       for q in cfg.policies), "algo.kl_coef",
                   f"a KL term needs a frozen reference for policy {t!r}: algo.reference=initial, or a model with "
                   f"role: frozen and column: ref_logprobs")
    for i, c in enumerate(a.controllers):
        _check(isinstance(c, dict) and "name" in c, f"algo.controllers.{i}", "must be a mapping with a name")
        _known(c["name"], CONTROLLERS, f"algo.controllers.{i}.name")
        if registries:  # its parameters (typos, types, ranges), before any model loads

            controller_params(i, c)
    _check(cfg.data.prompt_batch >= 1, "data.prompt_batch", "must be >= 1")
    _check(cfg.data.holdout >= 0, "data.holdout", "must be >= 0")
    _check(a.minibatch_prompts >= 1, "algo.minibatch_prompts", "must be >= 1")
    _check(cfg.data.prompt_batch % a.minibatch_prompts == 0, "algo.minibatch_prompts",
           f"data.prompt_batch={cfg.data.prompt_batch} is not divisible by "
           f"algo.minibatch_prompts={a.minibatch_prompts}")
    _check(a.clip_low >= 0, "algo.clip_low", f"must be >= 0, got {a.clip_low}")
    _check(a.clip_high >= 0, "algo.clip_high", f"must be >= 0, got {a.clip_high}")
    _check(a.clip_low < 1, "algo.clip_low", f"must be < 1, got {a.clip_low}")
    _check(a.adv_eps > 0, "algo.adv_eps", "must be > 0")
    _check(a.ppo_epochs >= 1, "algo.ppo_epochs", "must be >= 1")
    _check(a.agg in AGG_MODES, "algo.agg", f"must be one of {', '.join(AGG_MODES)}")
    _check(a.old_logprobs in ("auto", "trainer", "sampler"), "algo.old_logprobs", "must be auto, trainer or sampler")
    _known(a.is_correction, IS_CORRECTIONS, "algo.is_correction")
    _check(a.is_threshold > 0, "algo.is_threshold", "must be > 0")
    rc = a.rollout_correction
    _check(rc.veto_threshold >= 0, "algo.rollout_correction.veto_threshold", "must be >= 0 (0 = off)")
    _known(rc.rejection, ROLLOUT_REJECTIONS, "algo.rollout_correction.rejection")
    if rc.rejection in ROLLOUT_REJECTIONS:
        rc.params = validate_params(ROLLOUT_REJECTIONS.get(rc.rejection).defaults, rc.params,
                                    "algo.rollout_correction.params", f"rejection mask {rc.rejection!r}")
        for k in ("threshold", "alpha", "beta"):
            _check(rc.params.get(k, 1.0) > 0, f"algo.rollout_correction.params.{k}", "must be > 0")
    _known(a.advantage, ADVANTAGES, "algo.advantage")
    _known(a.loss, POLICY_LOSSES, "algo.loss")
    if a.loss in POLICY_LOSSES:
        a.loss_params = POLICY_LOSSES.get(a.loss).validate(a.loss_params)
    _known(cfg.exchange.name, EXCHANGES, "exchange.name")
    _known(cfg.exchange.ordering, MINIBATCH_ORDERINGS, "exchange.ordering")
    ex = cfg.exchange
    _check(ex.layout in LAYOUTS, "exchange.layout", f"unknown layout {ex.layout!r}; known: {', '.join(LAYOUTS)}")
    if ex.layout == "rank_chunks":
        _check(ex.ordering == "self_first_rows", "exchange.layout",
               f"rank_chunks splits the rows of ordering self_first_rows, not {ex.ordering!r}")
        _check(ex.layout_ranks >= 1, "exchange.layout_ranks", "must be >= 1")
        _check((a.minibatch_prompts * r.n) % ex.layout_ranks == 0, "exchange.layout_ranks",
               f"must divide the minibatch's rows, algo.minibatch_prompts × rollout.n = {a.minibatch_prompts * r.n} "
               f"(exchange.layout=whole_batch: one process's minibatches)")
    hint = " (vLLM is not installed: pip install -e '.[vllm]')" if r.engine == "vllm" else ""
    _check(r.engine in ENGINES, "rollout.engine", f"unknown; known: {', '.join(ENGINES.names())}{hint}")
    if r.engine in ENGINES:  # the engine's own option check; then options that name a frozen model (tandem)
        engine = ENGINES.get(r.engine)
        try:
            engine.check_kwargs(**dict(r.engine_kwargs))
        except ValueError as e:
            key, _, why = str(e).partition(": ")
            _check(False, key, why)
        _check(a.old_logprobs != "sampler" or engine.policy_logprobs,
               "algo.old_logprobs", f"sampler: engine {r.engine!r} returns the log-probs of the model that wrote each "
               "token, not the policy's; use trainer")
        _check(a.old_logprobs != "sampler" or r.top_p >= 1.0, "algo.old_logprobs",
               f"sampler with rollout.top_p={r.top_p}: the engine's log-probs are of the top-p truncated distribution "
               "and the trainer's are not; use trainer (or auto)")
        if a.old_logprobs == "auto":
            exact = (engine.exact_logprobs and cfg.run.dtype == "float32"
                     and o.autocast == "none" and r.engine_kwargs.get("autocast", "none") == "none")
            a.old_logprobs = "sampler" if exact and a.ppo_epochs == 1 and r.top_p >= 1.0 else "trainer"
        frozen = [p.name for p in cfg.policies if p.role == "frozen"]
        for k in engine.frozen_kwargs:
            v = r.engine_kwargs.get(k)
            _check(v in frozen, f"rollout.engine_kwargs.{k}",
                   f"engine {r.engine!r} needs the name of a role: frozen model here, got {v!r} "
                   f"(frozen: {', '.join(frozen) or 'none'})")
    _check(r.n >= 1, "rollout.n", "must be >= 1")
    _check(r.temperature > 0, "rollout.temperature",
           f"must be > 0 for training (the loss divides the logits by it), got {r.temperature}; greedy decoding "
           "is an evaluation option: graft eval --temperature 0")
    _check(0 < r.top_p <= 1, "rollout.top_p", "must be in (0, 1]")
    _check(r.max_new_tokens >= 1, "rollout.max_new_tokens", "must be >= 1")
    _check(r.max_prompt_tokens >= 1, "rollout.max_prompt_tokens", "must be >= 1")
    _check(o.lr > 0, "optim.lr", "must be > 0")
    _check(o.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
    _check(len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas), "optim.betas", "must be two numbers in [0, 1)")
    _check(o.max_grad_norm > 0, "optim.max_grad_norm", "must be > 0")
    _check(o.micro_batch_tokens >= 1, "optim.micro_batch_tokens", "must be >= 1")
    _check(o.shared_prefix in ("auto", True, False), "optim.shared_prefix",
           f"must be auto, true or false, got {o.shared_prefix!r}")
    if o.shared_prefix == "auto":
        o.shared_prefix = not o.gradient_checkpointing
    _check(not (o.shared_prefix and o.gradient_checkpointing), "optim.shared_prefix",
           "needs the KV cache, which gradient checkpointing turns off (set one of the two to false)")
    _check(o.autocast in AUTOCAST, "optim.autocast", f"must be one of {', '.join(AUTOCAST)}, got {o.autocast!r}")
    _check(o.on_nonfinite in ("stop", "skip"), "optim.on_nonfinite", f"must be stop or skip, got {o.on_nonfinite!r}")
    _check(cfg.run.dtype in DTYPES, "run.dtype", f"must be one of {', '.join(DTYPES)}")
    _check(cfg.run.steps is None or cfg.run.steps >= 1, "run.steps", "must be >= 1")
    _check(cfg.run.save_every >= 0, "run.save_every", "must be >= 0 (0: no checkpoint at all)")
    _check(cfg.run.save_every or not (cfg.eval.every > 0 or cfg.run.save_on_signal), "run.save_every",
           "0 (no checkpoint) leaves nothing for eval.every > 0 or run.save_on_signal; set one of them to 0/false")
    _check(cfg.run.keep_rollouts >= 0, "run.keep_rollouts", "must be >= 0 (0 = keep all)")
    _check(cfg.run.wandb_mode in ("online", "offline", "disabled"), "run.wandb_mode",
           "must be online, offline or disabled")
    _check(cfg.run.log_every >= 1, "run.log_every", "must be >= 1")
    _check(cfg.run.sync_check in SYNC_CHECKS, "run.sync_check", f"must be one of {', '.join(SYNC_CHECKS)}")
    _check(cfg.run.sync_tolerance is None or cfg.run.sync_tolerance > 0, "run.sync_tolerance", "must be > 0")
    _check(cfg.run.dist_timeout_s > 0, "run.dist_timeout_s", "must be > 0 (seconds)")
    _check(cfg.run.checkpoint_format in ("auto", "full", "sharded"), "run.checkpoint_format",
           f"{cfg.run.checkpoint_format!r}: one of auto, full, sharded")
    _check(cfg.run.model_init in ("pretrained", "random"), "run.model_init", "must be pretrained or random")
    _known(cfg.reward.name, REWARDS, "reward.name")
    _check(cfg.reward.chunk_size >= 1, "reward.chunk_size", "must be >= 1")
    _check(cfg.reward.timeout_s > 0, "reward.timeout_s", "must be > 0")
    _check(cfg.reward.num_workers >= 0, "reward.num_workers", "must be >= 0")
    _check(cfg.reward.memory_mb == 0 or cfg.reward.memory_mb >= 512, "reward.memory_mb",
           "must be 0 (no cap) or >= 512 (a worker needs ~300 MiB to start)")
    _check(cfg.prompt.chat_template in ("auto", "none", "required"), "prompt.chat_template",
           "must be auto, none or required")
    e = cfg.eval
    _check(e.every >= 0, "eval.every", "must be >= 0 (0 = no validation)")
    _check(e.samples >= 1, "eval.samples", "must be >= 1")
    _check(e.runs >= 1, "eval.runs", "must be >= 1")
    f = e.final
    for key, val, ok in (("runs", f.runs, f.runs is None or f.runs >= 1),
                         ("samples", f.samples, f.samples is None or f.samples >= 1),
                         ("temperature", f.temperature, f.temperature is None or f.temperature >= 0),
                         ("top_p", f.top_p, f.top_p is None or 0 < f.top_p <= 1),
                         ("top_k", f.top_k, f.top_k is None or f.top_k >= 0),
                         ("max_new_tokens", f.max_new_tokens, f.max_new_tokens is None or f.max_new_tokens >= 1)):
        _check(ok, f"eval.final.{key}", f"out of range: {val!r}")
    for bench, r in dict(f.bench_runs).items():
        _check(isinstance(r, int) and not isinstance(r, bool) and r >= 1, f"eval.final.bench_runs.{bench}",
               f"must be a whole number >= 1, got {r!r}")
    _check(cfg.run.policy_workers >= 0, "run.policy_workers", "must be >= 0 (0 = auto, 1 = sequential)")
    _check(e.rescue_cap >= 0, "eval.rescue_cap", "must be >= 0 (0 = every event)")
    _check(e.max_new_tokens is None or e.max_new_tokens >= 1, "eval.max_new_tokens", "must be >= 1")
    _check(e.temperature >= 0, "eval.temperature", "must be >= 0")
    _check(0 < e.top_p <= 1, "eval.top_p", "must be in (0, 1]")
    _check(e.top_k >= 0, "eval.top_k", "must be >= 0 (0 = off)")
    m = re.fullmatch(r"pass@([1-9][0-9]*)", str(e.select_metric))
    _check(m is not None, "eval.select_metric", f"must be pass@k (e.g. pass@1, pass@4), got {e.select_metric!r}")
    _check(m is None or e.every == 0 or int(m.group(1)) <= e.samples, "eval.select_metric",
           f"{e.select_metric} needs at least {m.group(1) if m else '?'} validation samples (eval.samples = "
           f"{e.samples})")
    if cfg.exchange.name in EXCHANGES:
        for spec in EXCHANGES.get(cfg.exchange.name).validate(cfg) or []:  # step sources the exchange needs
            cfg.sources = [x for x in cfg.sources if x.name != spec["name"]] + [SourceConfig(**spec)]


def asdict(cfg: Config) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
