"""Validation: ranges and cross-field rules of a resolved config, one function per section; nothing
is changed.

Composing a config is compose → resolve (:mod:`graft_cli.config.resolve`) → **validate**. Every
failure is one line naming the key. ``registries=False`` (a config read back from a run directory,
whose plugins were not imported) skips the checks that a registered name exists. """

from __future__ import annotations

import dataclasses
import math
import re

from graft_cli.algorithms import CONTROLLERS, LOSS_MASKS, TOKEN_ADVANTAGES
from graft_cli.algorithms.advantages import ADVANTAGES
from graft_cli.algorithms.controllers import controller_params
from graft_cli.algorithms.correction import IS_CORRECTIONS, ROLLOUT_REJECTIONS
from graft_cli.algorithms.exchange import EXCHANGES
from graft_cli.algorithms.losses import AGG_MODES, KL_KINDS, KL_ROWS, POLICY_LOSSES
from graft_cli.algorithms.minibatch import LAYOUTS, MINIBATCH_ORDERINGS
from graft_cli.data.mix import check_mix
from graft_cli.errors import GraftError
from graft_cli.models.loading import DTYPES
from graft_cli.models.logprobs import AUTOCAST
from graft_cli.models.lora import INITS as LORA_INITS
from graft_cli.models.scoring import SCORERS
from graft_cli.registry import Registry
from graft_cli.reward import REWARDS
from graft_cli.rollout import ENGINES
from graft_cli.schema import ROLES, SYNC_CHECKS, Config, PolicyConfig


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise GraftError(f"config key {key!r}: {msg}")


def _known(name: str, reg: Registry, key: str, registries: bool) -> None:
    if registries:
        _check(name in reg, key, f"unknown {reg.kind} {name!r}; known: {', '.join(reg.names())}")


def _float_fields(obj, prefix: str = ""):
    """(dotted key, value) of every float option of the schema's dataclasses (lists of them
    included)."""

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


def validate_numbers(cfg: Config, registries: bool) -> None:
    """inf / nan pass every range check (inf > 0): every float option must be finite."""
    for key, v in _float_fields(cfg):
        _check(math.isfinite(v), key, f"must be a finite number, got {v}")


def _check_lora(p: PolicyConfig, i: int, cfg: Config) -> None:
    """``policies.<i>.lora`` and ``base_of``: ranges, a known init, LoRA on trained policies only,
    and a frozen base that names a LoRA policy."""
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


def validate_policies(cfg: Config, registries: bool) -> None:
    """Unique, well-formed names; known roles and scorers; a frozen model serves trained policies;
    LoRA."""
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
            _known(p.scorer, SCORERS, f"policies.{i}.scorer", registries)
            for s in p.serves:
                _check(s in trained, f"policies.{i}.serves", f"{s!r} is not a trained policy ({', '.join(trained)})")
    _check(len(trained) >= 1, "policies", "at least one policy with role: train is needed")
    for i, sc in enumerate(cfg.sources):
        _check(sc.kind == "rollout_log", f"sources.{i}.kind", f"must be rollout_log, got {sc.kind!r}")


def validate_kl(cfg: Config, registries: bool) -> None:
    """The KL term's kind, rows and coefficient, and a frozen reference for every trained policy
    when it is on."""
    a = cfg.algo
    _check(a.kl_coef >= 0, "algo.kl_coef", "must be >= 0")
    _check(a.kl_type in KL_KINDS, "algo.kl_type", f"must be one of {', '.join(KL_KINDS)}")
    _check(a.kl_rows in KL_ROWS, "algo.kl_rows", f"must be one of {', '.join(KL_ROWS)}")
    _check(a.reference in ("none", "initial"), "algo.reference", "must be none or initial")
    if a.kl_coef > 0:
        for t in [p.name for p in cfg.policies if p.role == "train"]:
            _check(any(q.role == "frozen" and q.score_column == "ref_logprobs" and (not q.serves or t in q.serves)
                       for q in cfg.policies), "algo.kl_coef",
                   f"a KL term needs a frozen reference for policy {t!r}: algo.reference=initial, or a model with "
                   f"role: frozen and column: ref_logprobs")


def validate_algo(cfg: Config, registries: bool) -> None:
    """The registered functions a step uses (advantage, token advantages, loss mask, loss,
    controllers) and the ranges of the surrogate's options."""
    a = cfg.algo
    for i, t in enumerate(a.token_advantages):
        _known(t, TOKEN_ADVANTAGES, f"algo.token_advantages.{i}", registries)
    _known(a.loss_mask, LOSS_MASKS, "algo.loss_mask", registries)
    _known(a.advantage, ADVANTAGES, "algo.advantage", registries)
    _known(a.loss, POLICY_LOSSES, "algo.loss", registries)
    for i, c in enumerate(a.controllers):
        _check(isinstance(c, dict) and "name" in c, f"algo.controllers.{i}", "must be a mapping with a name")
        _known(c["name"], CONTROLLERS, f"algo.controllers.{i}.name", registries)
        if registries:  # its parameters (typos, types, ranges), before any model loads
            controller_params(i, c)
    _check(a.clip_ratio_c == 0 or a.clip_ratio_c > 1, "algo.clip_ratio_c", "must be 0 (off) or > 1")
    _check(a.clip_low >= 0, "algo.clip_low", f"must be >= 0, got {a.clip_low}")
    _check(a.clip_high >= 0, "algo.clip_high", f"must be >= 0, got {a.clip_high}")
    _check(a.clip_low < 1, "algo.clip_low", f"must be < 1, got {a.clip_low}")
    _check(a.adv_eps > 0, "algo.adv_eps", "must be > 0")
    _check(a.ppo_epochs >= 1, "algo.ppo_epochs", "must be >= 1")
    _check(a.agg in AGG_MODES, "algo.agg", f"must be one of {', '.join(AGG_MODES)}")
    _check(a.minibatch_prompts >= 1, "algo.minibatch_prompts", "must be >= 1")
    _check(cfg.data.prompt_batch >= 1, "data.prompt_batch", "must be >= 1")
    _check(cfg.data.holdout >= 0, "data.holdout", "must be >= 0")
    check_mix(dict(cfg.data.mix))  # shares: numbers >= 0, one of them > 0 (one line naming the key)
    _check(cfg.data.prompt_batch % a.minibatch_prompts == 0, "algo.minibatch_prompts",
           f"data.prompt_batch={cfg.data.prompt_batch} is not divisible by "
           f"algo.minibatch_prompts={a.minibatch_prompts}")
    fg = a.filter_groups
    _check(fg.metric == "acc", "algo.filter_groups.metric", f"must be acc, got {fg.metric!r}")
    _check(fg.max_num_gen_batches >= 0, "algo.filter_groups.max_num_gen_batches", "must be >= 0 (0 = no cap)")
    _check(not fg.enable or cfg.exchange.name == "none", "algo.filter_groups.enable",
           "dynamic sampling gives each policy its own prompts: only with exchange.name=none")
    _check(not fg.enable or cfg.rollout.n >= 2, "algo.filter_groups.enable", "needs rollout.n >= 2")


def validate_correction(cfg: Config, registries: bool) -> None:
    """Where the old log-probs come from, and the rollout-correction weights and masks."""
    a = cfg.algo
    _check(a.old_logprobs in ("auto", "trainer", "rollout"), "algo.old_logprobs", "must be auto, trainer or rollout")
    _known(a.is_correction, IS_CORRECTIONS, "algo.is_correction", registries)
    _check(a.is_threshold > 0, "algo.is_threshold", "must be > 0")
    rc = a.rollout_correction
    _check(rc.veto_threshold >= 0, "algo.rollout_correction.veto_threshold", "must be >= 0 (0 = off)")
    _known(rc.rejection, ROLLOUT_REJECTIONS, "algo.rollout_correction.rejection", registries)
    if rc.rejection in ROLLOUT_REJECTIONS:
        for k in ("threshold", "alpha", "beta"):
            _check(rc.params.get(k, 1.0) > 0, f"algo.rollout_correction.params.{k}", "must be > 0")


def validate_exchange(cfg: Config, registries: bool) -> None:
    """A known exchange and minibatch ordering, the rank layout's divisibility, the exchange's own
    parameters (:meth:`Exchange.validate`)."""
    ex, a = cfg.exchange, cfg.algo
    _known(ex.name, EXCHANGES, "exchange.name", registries)
    _known(ex.ordering, MINIBATCH_ORDERINGS, "exchange.ordering", registries)
    _check(ex.layout in LAYOUTS, "exchange.layout", f"unknown layout {ex.layout!r}; known: {', '.join(LAYOUTS)}")
    if ex.layout == "rank_chunks":
        _check(ex.ordering == "self_first_rows", "exchange.layout",
               f"rank_chunks splits the rows of ordering self_first_rows, not {ex.ordering!r}")
        _check(ex.layout_ranks >= 1, "exchange.layout_ranks", "must be >= 1")
        _check((a.minibatch_prompts * cfg.rollout.n) % ex.layout_ranks == 0, "exchange.layout_ranks",
               f"must divide the minibatch's rows, algo.minibatch_prompts × rollout.n = "
               f"{a.minibatch_prompts * cfg.rollout.n} (exchange.layout=whole_batch: one process's minibatches)")
    if ex.name in EXCHANGES:
        EXCHANGES.get(ex.name).validate(cfg)


def validate_rollout(cfg: Config, registries: bool) -> None:
    """A known engine with options it accepts, old log-probs it can give, sampling ranges."""
    a, r = cfg.algo, cfg.rollout
    hint = " (vLLM is not installed: pip install -e '.[vllm]')" if r.engine == "vllm" else ""
    _check(r.engine in ENGINES, "rollout.engine", f"unknown; known: {', '.join(ENGINES.names())}{hint}")
    engine = ENGINES.get(r.engine)
    try:
        engine.check_kwargs(**dict(r.engine_kwargs))
    except ValueError as e:
        key, _, why = str(e).partition(": ")
        _check(False, key, why)
    _check(a.old_logprobs != "rollout" or engine.policy_logprobs,
           "algo.old_logprobs", f"rollout: engine {r.engine!r} returns the log-probs of the model that wrote each "
           "token, not the policy's; use trainer")
    _check(a.old_logprobs != "rollout" or r.top_p >= 1.0, "algo.old_logprobs",
           f"rollout with rollout.top_p={r.top_p}: the engine's log-probs are of the top-p truncated distribution "
           "and the trainer's are not; use trainer (or auto)")
    frozen = [p.name for p in cfg.policies if p.role == "frozen"]
    for k in engine.frozen_kwargs:  # options that name a frozen model (tandem)
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


def validate_optim(cfg: Config, registries: bool) -> None:
    """Optimizer ranges, the shared prompt prefix against gradient checkpointing, autocast,
    non-finite policy."""
    o = cfg.optim
    _check(o.lr > 0, "optim.lr", "must be > 0")
    _check(o.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
    _check(len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas), "optim.betas", "must be two numbers in [0, 1)")
    _check(o.max_grad_norm > 0, "optim.max_grad_norm", "must be > 0")
    _check(o.micro_batch_tokens >= 1, "optim.micro_batch_tokens", "must be >= 1")
    _check(o.shared_prefix in (True, False), "optim.shared_prefix",
           f"must be auto, true or false, got {o.shared_prefix!r}")
    _check(not (o.shared_prefix and o.gradient_checkpointing), "optim.shared_prefix",
           "needs the KV cache, which gradient checkpointing turns off (set one of the two to false)")
    _check(o.autocast in AUTOCAST, "optim.autocast", f"must be one of {', '.join(AUTOCAST)}, got {o.autocast!r}")
    _check(o.on_nonfinite in ("stop", "skip"), "optim.on_nonfinite", f"must be stop or skip, got {o.on_nonfinite!r}")


def validate_run(cfg: Config, registries: bool) -> None:
    """The run's length, checkpoints, logging, weight-sync check and process options."""
    run = cfg.run
    _check(run.dtype in DTYPES, "run.dtype", f"must be one of {', '.join(DTYPES)}")
    _check(run.steps is None or run.steps >= 1, "run.steps", "must be >= 1")
    _check(run.save_every >= 0, "run.save_every", "must be >= 0 (0: no checkpoint at all)")
    _check(run.save_every or not (cfg.eval.every > 0 or run.save_on_signal), "run.save_every",
           "0 (no checkpoint) leaves nothing for eval.every > 0 or run.save_on_signal; set one of them to 0/false")
    _check(run.keep_rollouts >= 0, "run.keep_rollouts", "must be >= 0 (0 = keep all)")
    _check(run.wandb_mode in ("online", "offline", "disabled"), "run.wandb_mode",
           "must be online, offline or disabled")
    _check(run.log_every >= 1, "run.log_every", "must be >= 1")
    _check(run.sync_check in SYNC_CHECKS, "run.sync_check", f"must be one of {', '.join(SYNC_CHECKS)}")
    _check(run.sync_tolerance is None or run.sync_tolerance > 0, "run.sync_tolerance", "must be > 0")
    _check(run.dist_timeout_s > 0, "run.dist_timeout_s", "must be > 0 (seconds)")
    _check(run.checkpoint_format in ("auto", "full", "sharded"), "run.checkpoint_format",
           f"{run.checkpoint_format!r}: one of auto, full, sharded")
    _check(run.model_init in ("pretrained", "random"), "run.model_init", "must be pretrained or random")
    _check(run.policy_workers >= 0, "run.policy_workers", "must be >= 0 (0 = auto, 1 = sequential)")
    _check(run.staleness >= 0, "run.staleness", "must be >= 0 (0: every step samples with its own weights)")
    _check(run.staleness == 0 or cfg.algo.old_logprobs != "rollout", "algo.old_logprobs",
           f"rollout with run.staleness={run.staleness}: the rollout log-probs are those of weights up to "
           f"{run.staleness} updates old, not π_old; use trainer (or auto)")


def validate_reward(cfg: Config, registries: bool) -> None:
    """A known reward, its workers' options, the prompt's chat template mode."""
    rw = cfg.reward
    _known(rw.name, REWARDS, "reward.name", registries)
    _check(rw.chunk_size >= 1, "reward.chunk_size", "must be >= 1")
    _check(rw.timeout_s > 0, "reward.timeout_s", "must be > 0")
    _check(rw.num_workers >= 0, "reward.num_workers", "must be >= 0")
    _check(rw.memory_mb == 0 or rw.memory_mb >= 512, "reward.memory_mb",
           "must be 0 (no cap) or >= 512 (a worker needs ~300 MiB to start)")
    _check(cfg.prompt.chat_template in ("auto", "none", "required"), "prompt.chat_template",
           "must be auto, none or required")


def validate_eval(cfg: Config, registries: bool) -> None:
    """Validation during training and the final evaluation's overrides."""
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


VALIDATORS = (validate_numbers, validate_policies, validate_kl, validate_algo, validate_correction,
              validate_exchange, validate_rollout, validate_optim, validate_run, validate_reward, validate_eval)


def validate(cfg: Config, registries: bool = True) -> None:
    """Every section's rules (:data:`VALIDATORS`); raises :class:`GraftError` with one line on the
    first failure."""
    for fn in VALIDATORS:
        fn(cfg, registries)
