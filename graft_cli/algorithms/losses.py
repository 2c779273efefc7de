"""Policy losses and loss aggregation (registry ``POLICY_LOSSES``): one signature for every loss.

A loss is registered with :func:`register_loss` and its parameters, a frozen :class:`~graft_cli.registry.Params`
dataclass declared next to it (the one place their defaults are written; ``algo.loss_params`` is checked against it,
one-line error naming the key, and resolved to every value). It is called as ``spec(inputs)`` with one
:class:`LossInputs`, whose ``params`` is that dataclass's object (``inp.params.gamma``), and returns
``(loss, stats)``. All tensors are ``(B, T)`` over response-token positions
(as :func:`graft_cli.models.logprobs.response_logprobs` lays them out) with a float ``mask`` (the rows'
loss masks); ``weight`` is one number per row (GRAFT's compatibility weight w, 1 for self samples).
``stats`` holds *sums* (token counts, clipped-token counts, ...) that the trainer adds over micro-batches
and divides once per step, so every reported fraction is exact. No loss sees the config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from graft_cli.registry import Params, Registry, params_class

POLICY_LOSSES: Registry = Registry("policy loss", Params)
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


@dataclass(frozen=True)
class Normaliser:
    """Minibatch-level denominators, fixed before the micro-batches of one optimizer step are run, so
    gradient accumulation over micro-batches equals one pass over the whole minibatch (verl's
    ``agg_loss`` with a global token count)."""

    num_tokens: float  # Σ_j Σ_t mask_{j,t} over the minibatch's rows that count in the policy gradient
    num_seqs: float  # rows of the minibatch that count in the policy gradient (``in_pg``) and have loss tokens
    loss_scale_factor: float | None = None  # seq-mean-token-sum-norm constant (max response length)
    aux_seqs: float = 0.0  # rows of the minibatch with ``in_pg`` false (e.g. SGT's NLL rows) and loss tokens

    @classmethod
    def of_rows(cls, tokens, in_pg, loss_scale_factor: float | None = None) -> "Normaliser":
        """The denominators of one minibatch from each row's loss-token count (the sum of its loss mask) and
        its ``in_pg`` flag. A row with no loss tokens (a loss mask that zeroes the whole response: a tandem
        response the junior wrote entirely, a masked-out row) is left out of the sequence counts, as verl's
        ``agg_loss`` leaves it out of the ``seq-mean-*`` denominators (``seq_mask = (Σ_t mask > 0)``); it adds
        nothing to the token count either."""
        tokens, in_pg = [float(x) for x in tokens], [bool(x) for x in in_pg]
        return cls(num_tokens=sum(t for t, p in zip(tokens, in_pg) if p),
                   num_seqs=float(sum(1 for t, p in zip(tokens, in_pg) if p and t > 0)),
                   loss_scale_factor=loss_scale_factor,
                   aux_seqs=float(sum(1 for t, p in zip(tokens, in_pg) if not p and t > 0)))


@dataclass
class LossInputs:
    """Everything a loss may read, for one micro-batch (rows of one minibatch)."""

    logp: torch.Tensor  # (B, T) log π_θ of the response tokens (with grad)
    old_logp: torch.Tensor  # (B, T) log π_old (receiver's own old policy, every row)
    adv: torch.Tensor  # (B, T) advantages (the row's scalar broadcast, or its per-token advantages)
    mask: torch.Tensor  # (B, T) float loss mask
    weight: torch.Tensor  # (B,) per-row weight
    is_peer: torch.Tensor  # (B,) bool: row not sampled by the receiver itself
    norm: Normaliser
    in_pg: torch.Tensor | None = None  # (B,) bool: row counts in the PG denominators (None: all)
    clip_low: float = 0.2
    clip_high: float = 0.28
    clip_ratio_c: float = 0.0  # dual-clip constant c (verl ``clip_ratio_c``; 0 = off): A < 0 loss capped at −c·A
    agg: str = "token-mean"
    mb_index: int = 0  # the minibatch's index within the step's epoch
    step: int = 0  # the training step (0-based)
    columns: dict = field(default_factory=dict)  # per-row lists (batch extra) and padded (B, T) token tensors
    params: Params | None = None  # the loss's checked parameters, an object of its Params class (None: the defaults)
    coefs: dict = field(default_factory=dict)  # coefficients set by the run's controllers this step

    @classmethod
    def of(cls, logp, old_logp, adv, mask, weight, is_peer, *, norm, extra=None, **kw) -> "LossInputs":
        """Build from tensors (tests and callers outside the trainer); ``extra`` are per-row columns."""
        return cls(logp, old_logp, adv, mask, weight, is_peer, norm=norm, columns=dict(extra or {}), **kw)

    def row(self, key: str, default: float) -> torch.Tensor:
        """A per-row column as a float tensor (missing column, None or nan entries → ``default``)."""
        n, dev = self.mask.shape[0], self.mask.device
        vals = self.columns.get(key)
        if vals is None:
            return torch.full((n,), float(default), dtype=torch.float32, device=dev)
        if isinstance(vals, torch.Tensor):
            return vals.to(dev)
        out = []
        for v in vals:
            v = default if v is None else float(v)
            out.append(default if isinstance(v, float) and math.isnan(v) else v)
        return torch.tensor(out, dtype=torch.float32, device=dev)

    def pg_rows(self) -> torch.Tensor:
        """(B,) bool: rows in the policy gradient."""
        if self.in_pg is None:
            return torch.ones(self.mask.shape[0], dtype=torch.bool, device=self.mask.device)
        return self.in_pg


@dataclass(frozen=True)
class LossSpec:
    """A registered loss: the function, its parameters (a :class:`~graft_cli.registry.Params` class; a mapping
of defaults is made one, :func:`~graft_cli.registry.params_class`) and the per-token columns it reads (padded to
``(B, T)`` by the trainer from the batch's ``extra``)."""

    name: str
    fn: Callable
    params: type = Params
    token_columns: tuple = ()
    doc: str = ""

    def __post_init__(self):
        if isinstance(self.params, dict):
            object.__setattr__(self, "params", params_class(self.name, self.params))

    def __call__(self, inp: LossInputs, **params):
        """The loss on ``inp``; keyword ``params`` (checked) override ``inp.params``, None meaning the defaults."""
        if params:
            given = {} if inp.params is None else self.typed(inp.params).to_dict()
            inp.params = self.check({**given, **params})
        return self.fn(self.bound(inp))

    def check(self, params: dict | None, key: str = "algo.loss_params") -> Params:
        """``params`` checked against the loss's parameters, every default filled in: its Params object."""
        return self.params.check(params, key, f"loss {self.name!r}")

    def validate(self, params: dict | None, key: str = "algo.loss_params") -> dict:
        """``params`` checked against the loss's parameters, every default filled in (a resolved config's
        mapping)."""
        return self.check(params, key).to_dict()

    def typed(self, params) -> Params:
        """``params`` when it is an instance of the loss's Params class; a TypeError otherwise (a mapping is
        checked into one first: :meth:`check`)."""
        if not isinstance(params, self.params):
            raise TypeError(f"loss {self.name!r}: parameters must be a {self.params.__name__}, "
                            f"got {type(params).__name__}")
        return params

    def bound(self, inp: LossInputs) -> LossInputs:
        """``inp`` with its parameters checked to be the loss's Params (None: the defaults filled in)."""
        inp.params = self.params() if inp.params is None else self.typed(inp.params)
        return inp


def register_loss(name: str, token_columns: tuple = (), params: type | None = None, **defaults):
    """Register ``fn(inputs) -> (loss, stats)`` as loss ``name`` with its parameters: ``params``, a frozen
    :class:`~graft_cli.registry.Params` dataclass (registered as the name's spec, its defaults the instance), or
    keyword defaults (a tuple default is a choice whose first entry is the default). Returns the :class:`LossSpec`."""
    if params is not None and defaults:
        raise TypeError(f"loss {name!r}: parameters as a Params class or as keyword defaults, not both")
    cls = params if params is not None else params_class(name, defaults) if defaults else Params

    def deco(fn):
        spec = LossSpec(name, fn, cls, tuple(token_columns), (fn.__doc__ or "").strip())
        POLICY_LOSSES.register(name, spec=cls())(spec)
        return spec

    return deco


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, norm: Normaliser) -> torch.Tensor:
    """Aggregate a per-token loss matrix (verl ``agg_loss`` / TRL ``loss_type``):

    - ``token-mean`` (DAPO, TRL ``dapo``): Σ_{j,t} L_{j,t} / Σ_j |o_j|
    - ``seq-mean-token-mean`` (GRPO, TRL ``grpo``): (1/N) Σ_j (Σ_t L_{j,t} / |o_j|)
    - ``seq-mean-token-sum``: (1/N) Σ_j Σ_t L_{j,t}

      (N = ``norm.num_seqs``: the minibatch's rows with |o_j| > 0, :meth:`Normaliser.of_rows`; a row with no
      loss tokens adds 0 to the numerator, as in verl)
    - ``seq-mean-token-sum-norm`` (Dr. GRPO, verl's formula): Σ_j Σ_t L_{j,t} / C, C = ``loss_scale_factor``
      (default: the longest possible response), *not* divided by the number of sequences (verl's ``agg_loss``
      computes ``sum(loss·mask) / loss_scale_factor``; graft applies it to the whole minibatch, whose
      denominators are fixed before micro-batching, so micro-batch sizes never change the loss)
    """
    if mode == "token-mean":
        return (loss_mat * mask).sum() / max(norm.num_tokens, 1.0)
    seq_sum = (loss_mat * mask).sum(-1)
    if mode == "seq-mean-token-mean":
        cnt = mask.sum(-1)
        return (seq_sum / torch.where(cnt > 0, cnt, torch.ones_like(cnt))).sum() / max(norm.num_seqs, 1.0)
    if mode == "seq-mean-token-sum":
        return seq_sum.sum() / max(norm.num_seqs, 1.0)
    if mode == "seq-mean-token-sum-norm":
        c = norm.loss_scale_factor or float(mask.shape[-1])
        return seq_sum.sum() / c
    raise ValueError(f"unknown loss aggregation {mode!r}; known: {', '.join(AGG_MODES)}")


def clipped_token_mask(ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float):
    """Tokens where the clipped surrogate is strictly smaller than the unclipped one (graft.md §4,
    App. H; TRL ``clip_ratio/low`` and ``/high``): low = â<0 ∧ ρ<1−ε_low, high = â>0 ∧ ρ>1+ε_high."""
    low = (adv < 0) & (ratio < 1.0 - clip_low)
    high = (adv > 0) & (ratio > 1.0 + clip_high)
    return low, high


def clip_stats(ratio, adv, mask, is_peer, clip_low, clip_high) -> dict[str, torch.Tensor]:
    """Sums for clip metrics and the mean importance ratio, split into self and peer tokens."""
    low, high = clipped_token_mask(ratio, adv, clip_low, clip_high)
    m = mask > 0
    peer = is_peer[:, None].expand_as(m) & m
    own = (~is_peer)[:, None].expand_as(m) & m
    f = lambda x: x.sum().detach().to(torch.float64)  # noqa: E731
    return {
        "tokens": f(m), "tokens_self": f(own), "tokens_peer": f(peer),
        "clip_low": f(low & m), "clip_high": f(high & m),
        "clip_self": f((low | high) & own), "clip_peer": f((low | high) & peer),
        # the mean importance ratio ρ of own and of grafted tokens (reported as ratio/self, ratio/peer)
        "ratio/self/sum": f(ratio * own), "ratio/self/n": f(own),
        "ratio/peer/sum": f(ratio * peer), "ratio/peer/n": f(peer),
    }


def ppo_surrogate(logp, old_logp, adv, clip_low: float, clip_high: float, log_ratio_clamp: float = 20.0,
                  clip_ratio_c: float = 0.0):
    """Per-token PPO loss L = −min(ρÂ, clip(ρ, 1−ε_low, 1+ε_high)Â), ρ = exp(logπ_θ − logπ_old)
    (log-ratio clamped to ±20 as verl does, for numerical safety only). With ``clip_ratio_c`` = c > 0 it is
    verl's dual-clip PPO (``compute_policy_loss_vanilla``): for Â < 0, L = min(L, −c·Â), so a token whose
    ratio has grown far above 1 under a negative advantage contributes at most c·|Â|. Returns (loss, ρ)."""
    ratio = torch.exp((logp - old_logp).clamp(-log_ratio_clamp, log_ratio_clamp))
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    if clip_ratio_c > 0:
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * clip_ratio_c), loss)
    return loss, ratio


def dual_clip_stats(ratio, adv, mask, clip_ratio_c: float) -> dict:
    """Tokens the dual clip acts on (Â < 0 and ρ > c, where −ρÂ > −c·Â), summed (verl ``pg_clipfrac_lower``)."""
    if clip_ratio_c <= 0:
        return {}
    return {"clip_dual": ((adv < 0) & (ratio > clip_ratio_c) & (mask > 0)).sum().detach().to(torch.float64)}


def sequence_log_ratio_tokens(logp, old_logp, mask, max_log_ratio: float = 10.0):
    """GSPO's straight-through token form of the sequence ratio: log s_j = mean_t(logπ_θ − logπ_old) over
    the row's mask, returned per token as sg(log s_j) + logπ_θ − sg(logπ_θ) (value log s_j, token gradient),
    clamped above at 10 as verl's ``compute_policy_loss_gspo`` does."""
    log_s = ((logp - old_logp) * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return (log_s.detach()[:, None] + logp - logp.detach()).clamp(max=max_log_ratio)


@register_loss("ppo_token")
def ppo_token_loss(inp: LossInputs):
    """GRAFT's receiver objective (Eq. 9–10), which is the DAPO GRPO surrogate when w ≡ 1:
    L = (1/Σ_j|o_j|) Σ_j w_j Σ_t −min(ρ_{j,t}Â_j, clip(ρ_{j,t}, 1−ε_low, 1+ε_high)Â_j), with ρ against
    the receiver's own old policy for self and peer tokens alike; w does not enter the denominator."""
    per_tok, ratio = ppo_surrogate(inp.logp, inp.old_logp, inp.adv, inp.clip_low, inp.clip_high,
                                   clip_ratio_c=inp.clip_ratio_c)
    loss = agg_loss(per_tok * inp.weight[:, None], inp.mask, inp.agg, inp.norm)
    st = clip_stats(ratio.detach(), inp.adv, inp.mask, inp.is_peer, inp.clip_low, inp.clip_high)
    return loss, {**st, **dual_clip_stats(ratio.detach(), inp.adv, inp.mask, inp.clip_ratio_c)}


@register_loss("ppo_seq")
def ppo_seq_loss(inp: LossInputs):
    """Sequence-level ratio (GSPO; graft.md §8 item 5, "w/o token-level ratio"):
    s_j = exp(mean_t(logπ_θ − logπ_old)), with the straight-through token form of GSPO-token
    (ρ_{j,t} = sg(s_j)·π_θ/sg(π_θ)) so every token of a sequence shares the value s_j; same clip range;
    log s_j clamped at 10 like verl's GSPO. The aggregation is ``algo.agg``: GRAFT's ablation changes only
    the ratio and keeps GRAFT's token-mean (graft.md §8 item 5), whereas verl's GSPO forces
    ``seq-mean-token-mean`` (set ``algo.agg=seq-mean-token-mean`` to run verl's GSPO exactly). No dual clip
    (verl's GSPO has none)."""
    log_tok = sequence_log_ratio_tokens(inp.logp, inp.old_logp, inp.mask)
    per_tok, ratio = ppo_surrogate(log_tok, torch.zeros_like(log_tok), inp.adv, inp.clip_low, inp.clip_high)
    loss = agg_loss(per_tok * inp.weight[:, None], inp.mask, inp.agg, inp.norm)
    return loss, clip_stats(ratio.detach(), inp.adv, inp.mask, inp.is_peer, inp.clip_low, inp.clip_high)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL estimate of π_θ from a reference (verl ``kl_penalty``), d = logπ_ref − logπ_θ:
    ``k1`` (``kl``): −d; ``k2`` (``mse``): ½d²; ``k3`` (``low_var_kl``, Schulman's estimator):
    exp(d) − d − 1, clamped to [−10, 10] as verl does."""
    if kind in ("k1", "kl"):
        return logp - ref_logp
    if kind in ("k2", "mse"):
        return 0.5 * (logp - ref_logp) ** 2
    if kind in ("k3", "low_var_kl"):
        d = (ref_logp - logp).clamp(-20.0, 20.0)
        return (torch.exp(d) - d - 1).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; known: k1, k2, k3 (kl, mse, low_var_kl)")


KL_KINDS = ("low_var_kl", "k3", "kl", "k1", "mse", "k2")


KL_ROWS = ("all", "self")


def compute_loss(spec: LossSpec, inp: LossInputs, kl_coef: float = 0.0, kl_type: str = "low_var_kl",
                 kl_rows: str = "all"):
    """The registered loss plus, when ``kl_coef`` > 0, a KL term to a frozen reference (verl's ``use_kl_loss``:
    L + β·agg(KL(π_θ ‖ π_ref)) with the loss's aggregation over the mask; column ``ref_logprobs``, filled by
    a frozen model's scorer). ``kl_rows`` (``algo.kl_rows``): ``all`` rows, or only the policy's ``self`` rows
    (HACPO's released loss: the KL mask is ``response_mask & is_self``, aggregated with the minibatch's
    denominators, so a peer row adds nothing to the KL term nor to its statistics). Whenever that column is
    there the KL is measured (with β = 0 only logged, as
    verl's ``use_kl_loss=True, kl_loss_coef=0``): stats ``kl/sum`` and ``kl/n``, reported as ``kl`` (the token
    mean over the step), and ``kl_seq_mean/sum`` and ``kl_seq_mean/n``, reported as ``kl_seq_mean``: the mean
    over rows with loss tokens of each row's token-mean KL, which is verl's ``actor/kl_loss`` when every
    micro-batch holds one sequence (the mean over micro-batches of the micro-batch's token mean; SAF-OPD's
    released runs, ``ppo_micro_batch_size_per_gpu=1``; verl also scales it by 1/accumulation, a constant)."""
    loss, st = spec.fn(spec.bound(inp))
    ref = inp.columns.get("ref_logprobs")
    if kl_coef > 0 and not isinstance(ref, torch.Tensor):
        raise ValueError("algo.kl_coef > 0 needs the column ref_logprobs (a frozen reference model)")
    if kl_rows not in KL_ROWS:
        raise ValueError(f"unknown kl_rows {kl_rows!r}; known: {', '.join(KL_ROWS)}")
    if isinstance(ref, torch.Tensor):
        kl = kl_penalty(inp.logp, ref, kl_type)
        mask = inp.mask if kl_rows == "all" else inp.mask * (~inp.is_peer).to(inp.mask.dtype)[:, None]
        if kl_coef > 0:
            loss = loss + kl_coef * agg_loss(kl, mask, inp.agg, inp.norm)
        tok = mask.sum(-1).detach()
        seq = (kl.detach() * mask).sum(-1) / tok.clamp(min=1e-12)
        st = {**st, "kl/sum": (kl.detach() * mask).sum().to(torch.float64),
              "kl/n": mask.sum().detach().to(torch.float64),
              "kl_seq_mean/sum": seq[tok > 0].sum().to(torch.float64),
              "kl_seq_mean/n": (tok > 0).sum().to(torch.float64)}
    return loss, st
