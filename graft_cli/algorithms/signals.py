"""Per-token signals of a TrainBatch, produced by registered functions (the loop builds the loss
inputs from these columns only).

- Loss masks (registry ``LOSS_MASKS``, ``algo.loss_mask``, parameters ``algo.loss_mask_params``):
  ``fn(batch, ctx) -> list | None`` gives each row a list of token weights over its response tokens
  (0/1 for a mask; ``None``: every response token). The weights multiply each token's loss and their
  sum is the row's token count in the loss denominators. ``response`` is the default; ``author``
  (tandem RLVR) keeps the senior's tokens; ``strip_eos`` (HACPO) leaves every row's terminal EOS
  out.
- Token advantages (registry ``TOKEN_ADVANTAGES``, ``algo.token_advantages``, applied in order):
  ``fn(batch, ctx) -> (token_adv | None, metrics)`` where ``token_adv`` has one entry per row (a
  list over its response tokens, or ``None`` for the row's scalar advantage broadcast). Each
  function sees the ``batch.token_adv`` the previous one left. ``is_correction`` (on by default; a
  no-op unless ``algo.is_correction`` is ``token`` or ``sequence``) multiplies the advantages the
  functions before it left by the truncated IS weights, so it goes last when the weight is to cover
  the whole advantage (verl multiplies the whole per-token loss by it: ``grpo_opd``, ``saf`` and
  ``opd_only`` run ``[opd_fusion, is_correction]``).
- Rollout rejection (``algo.rollout_correction``, :func:`rollout_rejection`): after the loss mask,
  verl's rejection masks and veto take outlier tokens or responses of the receiver's own rows out of
  the loss mask.

``ctx`` is a :class:`SignalContext`: the step, the algorithm settings, the controllers'
coefficients, the policy's name and the function's parameters (the object of its Params class:
``ctx.params.junior_weight``). """

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from graft_cli.algorithms.correction import batch_is_weights, batch_rejection
from graft_cli.errors import GraftError
from graft_cli.registry import Params, Registry, params_class

# spec of a name: its parameters' defaults (a Params dataclass declared next to the function)
LOSS_MASKS: Registry = Registry("loss mask", Params)
TOKEN_ADVANTAGES: Registry = Registry("token-advantage function", Params)


@dataclass
class SignalContext:
    step: int
    policy: str
    algo: object  # the run's AlgoConfig (read-only)
    coefs: dict = field(default_factory=dict)  # controllers' coefficients for this step
    params: Params = field(default_factory=Params)  # the function's checked parameters, its Params class's object


def _register(registry: Registry, name: str, params: type | None, defaults: dict):
    if params is not None and defaults:
        raise TypeError(f"{registry.kind} {name!r}: parameters as a Params class or as keyword defaults, not both")
    cls = params if params is not None else params_class(name, defaults) if defaults else Params
    return registry.register(name, spec=cls())


def register_token_advantage(name: str, params: type | None = None, **defaults):
    """Register ``fn(batch, ctx)`` as token-advantage function ``name`` with its parameters (read
    from ``algo.token_adv_params``, checked): ``params``, a frozen
    :class:`~graft_cli.registry.Params` dataclass, or keyword defaults (a tuple default is a
    choice)."""
    return _register(TOKEN_ADVANTAGES, name, params, defaults)


def token_adv_params(names: list, params: dict | None) -> dict[str, Params]:
    """name -> checked parameters (its Params class's object) of each listed function:
    ``algo.token_adv_params`` holds the parameters of every function of the pipeline (one flat
    mapping; a key belongs to the function that declares it)."""
    specs = {n: type(TOKEN_ADVANTAGES.spec(n)) for n in names}
    owners = {k: n for n, cls in specs.items() for k in cls.defaults()}
    for k in params or {}:
        if k not in owners:
            known = ", ".join(sorted(owners)) or "none"
            raise GraftError(f"config key 'algo.token_adv_params.{k}': not a parameter of {', '.join(names)}; "
                             f"known: {known}")
    return {n: cls.check({k: v for k, v in (params or {}).items() if owners[k] == n}, "algo.token_adv_params",
                         f"token-advantage function {n!r}") for n, cls in specs.items()}


def register_loss_mask(name: str, params: type | None = None, **defaults):
    """Register ``fn(batch, ctx)`` as loss mask ``name`` with its parameters
    (``algo.loss_mask_params``, checked; ``ctx.params`` holds them): ``params``, a frozen
    :class:`~graft_cli.registry.Params` dataclass, or keyword defaults."""
    return _register(LOSS_MASKS, name, params, defaults)


def loss_mask_params(name: str, params: dict | None) -> Params:
    """The checked parameters of loss mask ``name``, its Params class's object (one-line error
    naming ``algo.loss_mask_params.<key>``)."""
    return type(LOSS_MASKS.spec(name)).check(params, "algo.loss_mask_params", f"loss mask {name!r}")


@register_loss_mask("response")
def response_mask(batch, ctx: SignalContext):
    """Every response token of every row (GRPO, GRAFT): no mask column."""
    return None


@dataclass(frozen=True)
class AuthorMaskParams(Params):
    junior_weight: float = 0.0  # w: the weight of the junior's tokens


@register_loss_mask("author", params=AuthorMaskParams)
def author_mask(batch, ctx: SignalContext):
    """Tandem RLVR's senior gate (tandem.md §2.5): ``mask_t = author_t + w·(1 − author_t)`` with
    ``author_t`` = 1 on the senior's tokens, 0 on the junior's (the ``author`` column the tandem
    engine returns) and ``w`` = ``junior_weight`` (the paper's ``tandem_jr_tkn_weight``, 0: junior
    tokens carry no gradient and do not count in the token-mean denominator, which is then the
    number of senior tokens; they stay in the context). Rows without an author column (e.g. a
    peer's) keep every token."""
    if "author" not in batch.extra:
        raise GraftError("config key 'algo.loss_mask': mask 'author' needs the rollouts' author column "
                         "(rollout.engine: tandem)")
    w = float(ctx.params.junior_weight)
    return [None if a is None else [1.0 if x else w for x in a] for a in batch.extra["author"]]


@register_loss_mask("strip_eos")
def strip_eos_mask(batch, ctx: SignalContext):
    """The terminal EOS of every row out of the loss (HACPO's released trainer strips it from each
    rollout before the probability contract, self rows included, so neither the GSPO ratio, the peer
    ratio, the KL term nor the denominators see it): row j keeps its first ``n_scored`` tokens
    (column ``n_scored``: the response without the EOS it ended with; the exchange's ``hacpo`` mode
    sets it on every row, GRAFT's transfer on peer rows); an EOS-only response (``n_scored`` 0)
    keeps its one token, as HACPO keeps that action. Masking the last token equals removing it: it
    is the last position, so no other token's log-prob depends on it."""
    col = batch.extra.get("n_scored")
    if col is None or any(v is None for v in col):
        raise GraftError("config key 'algo.loss_mask': mask 'strip_eos' needs the column n_scored on every row "
                         "(exchange.params.mode: hacpo sets it)")
    out = []
    for ids, k in zip(batch.response_ids, col):
        k = int(k)
        out.append(None if k <= 0 or k >= len(ids) else [1.0] * k + [0.0] * (len(ids) - k))
    return out


def scalar_broadcast(batch, i: int) -> list[float]:
    """Row i's advantage per token: its per-token advantages when set, else its scalar on every
    token."""
    tadv = None if batch.token_adv is None else batch.token_adv[i]
    return list(tadv) if tadv is not None else [batch.advantages[i]] * len(batch.response_ids[i])


def rollout_rejection(batch, rc, params: Params) -> tuple[list | None, dict]:
    """The batch's loss mask with ``algo.rollout_correction`` applied (its rejection mask, with
    ``params`` its checked parameters, and veto on the receiver's own rows: rejected tokens leave
    the loss and its denominators, as verl's modified response mask) and the ``rollout_corr/*``
    metrics (graft_cli/algorithms/correction.py)."""
    return batch_rejection(batch.old_logprobs, batch.rollout_logprobs, batch.source, batch.loss_mask, rc.rejection,
                           params, float(rc.veto_threshold), bool(rc.metrics))


@TOKEN_ADVANTAGES.register("is_correction")
def is_corrected_advantages(batch, ctx: SignalContext):
    """Â_{j,t} · w_{j,t} with the truncated IS weights of :mod:`graft_cli.algorithms.correction`
    (``algo.is_correction``: none | token | sequence; C = ``algo.is_threshold``), in float32 as the
    loss sees them. ``none``: the batch's token advantages unchanged."""
    isw, met = batch_is_weights(batch.old_logprobs, batch.rollout_logprobs, batch.source, ctx.algo.is_correction,
                                ctx.algo.is_threshold)
    if isw is None:
        return batch.token_adv, met
    out = []
    for i, w in enumerate(isw):
        a = torch.tensor(scalar_broadcast(batch, i), dtype=torch.float32)
        out.append((a * torch.tensor(w, dtype=torch.float32)).tolist())
    return out, met
