"""Resolution: the values a composed config implies, written into it before it is validated.

Composing a config is compose → **resolve** → validate (:mod:`graft_cli.config.validate`, which
changes nothing). Each resolver below fills in one section's implied values and is idempotent (a
config read back from a run directory resolves to itself):

* older names of values and keys (:data:`OLDER_VALUES`, :data:`OLDER_KEYS`) read as the current
  ones, so a run's ``config.yaml`` written with them still resumes and evaluates;
* the registered functions' parameters completed with their defaults (token advantages, loss mask,
  loss, rollout-correction rejection): what a run used is written in full in its ``config.yaml``;
* the exchange's implied policies, sources and parameters (:meth:`Exchange.resolve`:
  stored-trajectory GRAFT's partner becomes a ``rollout_log`` source and is not trained);
* ``algo.reference=initial``: a frozen ``<name>_ref`` copy of each trained policy (for a LoRA policy
  its base, the adapter switched off);
* ``algo.old_logprobs=auto``: ``rollout`` where the engine's log-probs are the trainer's (exact
  engine, float32, no autocast, one PPO epoch, no top-p), else ``trainer``;
* ``optim.shared_prefix=auto``: on unless gradient checkpointing is;
* ``run.staleness`` >= 1 (rollouts sampled with older weights): ``algo.old_logprobs=auto`` is
  ``trainer`` (π_old recomputed at the current weights, verl's recompute),
  ``algo.is_correction=auto`` is ``token`` (the rollout log-probs are the behaviour policy's:
  truncated IS against π_old) and the rollout-correction metrics are on; at 0, ``auto`` is ``none``
  and the metrics are off.

A resolver that meets a name no registry knows leaves that section alone: validation names the key.
"""

from __future__ import annotations

from graft_cli.algorithms import LOSS_MASKS, TOKEN_ADVANTAGES
from graft_cli.algorithms.correction import ROLLOUT_REJECTIONS, rejection_params
from graft_cli.algorithms.exchange import EXCHANGES
from graft_cli.algorithms.losses import POLICY_LOSSES
from graft_cli.algorithms.signals import loss_mask_params, token_adv_params
from graft_cli.rollout import ENGINES
from graft_cli.schema import Config, PolicyConfig, samples_ahead


# key -> {older value: current value}; older key -> current key (docs/glossary.md)
OLDER_VALUES = {"algo.old_logprobs": {"sampler": "rollout"},
                "exchange.params.peer_logprobs": {"sampler": "rollout"},
                "algo.token_adv_params.student_logprobs": {"sampler": "rollout"}}
OLDER_KEYS = {"rollout.engine_kwargs.sampler": "rollout.engine_kwargs.rng"}


def _parent(cfg: Config, key: str):
    """The section holding ``key``'s last part (a dataclass or a dict), or None when a part is
    missing."""
    node = cfg
    for part in key.split(".")[:-1]:
        node = node.get(part) if isinstance(node, dict) else getattr(node, part, None)
        if node is None:
            return None
    return node


def rename_older(flat: dict) -> dict:
    """A flat mapping (dotted key -> value, e.g. a run's raw ``config.yaml`` flattened) with the
    older values and keys rewritten to the current names."""
    out = dict(flat)
    for key, values in OLDER_VALUES.items():
        if isinstance(out.get(key), str) and out[key] in values:
            out[key] = values[out[key]]
    for old, new in OLDER_KEYS.items():
        if old in out:
            out.setdefault(new, out.pop(old))
    return out


def resolve_older_names(cfg: Config) -> None:
    """Older values and keys (:data:`OLDER_VALUES`, :data:`OLDER_KEYS`) rewritten to the current
    names."""
    for key, values in OLDER_VALUES.items():
        node, last = _parent(cfg, key), key.rsplit(".", 1)[-1]
        if isinstance(node, dict):
            v = node.get(last)
            if isinstance(v, str) and v in values:
                node[last] = values[v]
        elif node is not None:
            v = getattr(node, last, None)
            if isinstance(v, str) and v in values:
                setattr(node, last, values[v])
    for old, new in OLDER_KEYS.items():
        node, last = _parent(cfg, old), old.rsplit(".", 1)[-1]
        if isinstance(node, dict) and last in node:
            node.setdefault(new.rsplit(".", 1)[-1], node.pop(last))


def resolve_signal_params(cfg: Config) -> None:
    """``algo.token_adv_params`` (one flat dict over the token advantages) and
    ``algo.loss_mask_params`` with every default filled in."""
    a = cfg.algo
    if all(t in TOKEN_ADVANTAGES for t in a.token_advantages):
        flat = {}
        for p in token_adv_params(list(a.token_advantages), a.token_adv_params).values():
            flat.update(p.to_dict())
        a.token_adv_params = flat
    if a.loss_mask in LOSS_MASKS:
        a.loss_mask_params = loss_mask_params(a.loss_mask, a.loss_mask_params).to_dict()


def resolve_loss_params(cfg: Config) -> None:
    """``algo.loss_params`` and ``algo.rollout_correction.params`` with their registered
    defaults."""
    a = cfg.algo
    rc = a.rollout_correction
    if rc.rejection in ROLLOUT_REJECTIONS:
        rc.params = rejection_params(rc.rejection, rc.params).to_dict()
    if a.loss in POLICY_LOSSES:
        a.loss_params = POLICY_LOSSES.get(a.loss).validate(a.loss_params)


def resolve_exchange(cfg: Config) -> None:
    """The policies, sources and parameters the exchange implies (:meth:`Exchange.resolve`)."""
    if cfg.exchange.name in EXCHANGES:
        EXCHANGES.get(cfg.exchange.name).resolve(cfg)


def resolve_reference(cfg: Config) -> None:
    """``algo.reference=initial``: a frozen copy of each trained policy's initial weights, scored
    into ``ref_logprobs`` (a LoRA policy's is its own base: ``base_of``)."""
    if cfg.algo.reference != "initial":
        return
    for p in [p for p in cfg.policies if p.role == "train"]:
        if not any(q.name == f"{p.name}_ref" for q in cfg.policies):
            cfg.policies.append(PolicyConfig(name=f"{p.name}_ref", model=p.model, tokenizer=p.tokenizer,
                                             role="frozen", serves=[p.name], column="ref_logprobs",
                                             base_of=p.name if p.lora.r > 0 else None))


def resolve_old_logprobs(cfg: Config) -> None:
    """``algo.old_logprobs=auto``: the rollout log-probs where they are exactly the trainer's, else
    a trainer forward."""
    a, r = cfg.algo, cfg.rollout
    if a.old_logprobs != "auto" or r.engine not in ENGINES:
        return
    if samples_ahead(cfg.run):  # the rollout log-probs are an older policy's
        a.old_logprobs = "trainer"
        return
    engine = ENGINES.get(r.engine)
    exact = (engine.exact_logprobs and cfg.run.dtype == "float32"
             and cfg.optim.autocast == "none" and r.engine_kwargs.get("autocast", "none") == "none")
    a.old_logprobs = "rollout" if exact and a.ppo_epochs == 1 and r.top_p >= 1.0 else "trainer"


def resolve_staleness(cfg: Config) -> None:
    """``algo.is_correction=auto`` and the rollout-correction metrics by ``run.staleness`` (module
    docstring)."""
    stale = samples_ahead(cfg.run)
    if cfg.algo.is_correction == "auto":
        cfg.algo.is_correction = "token" if stale else "none"
    if cfg.algo.rollout_correction.metrics is None:
        cfg.algo.rollout_correction.metrics = stale


def resolve_shared_prefix(cfg: Config) -> None:
    """``optim.shared_prefix=auto``: the prompt's KV cache shared across its group unless gradient
    checkpointing (which turns the cache off) is on."""
    if cfg.optim.shared_prefix == "auto":
        cfg.optim.shared_prefix = not cfg.optim.gradient_checkpointing


# in order: older names first; the exchange may drop a policy (the partner of stored-trajectory
# GRAFT) before references are made for the trained ones
RESOLVERS = (resolve_older_names, resolve_signal_params, resolve_loss_params, resolve_exchange, resolve_reference,
             resolve_old_logprobs, resolve_staleness, resolve_shared_prefix)


def resolve(cfg: Config) -> None:
    """Every resolver, in order (module docstring)."""
    for fn in RESOLVERS:
        fn(cfg)
