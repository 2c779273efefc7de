"""Multi-process (data-parallel) training helpers: one process per GPU, launched by ``torchrun`` or
``accelerate launch`` (``experiments/accelerate/fsdp_*gpu.yaml``). A no-op object when
``WORLD_SIZE`` is 1.

What the trainer does with it (the gradient equals the single-process one):

1. Rollouts are data-parallel: each rollout group (``world / rollout_tp`` of them; a group is the
   ranks of one tensor-parallel vLLM engine) samples and grades a contiguous slice of the prompt
   batch; the ``Rollouts`` and grades are all-gathered, so every rank holds the full step data and
   computes the same rewards, advantages and exchange.
2. Old log-probs: each rank scores a strided shard of the rows; the results are all-gathered.
3. Update: each rank runs a strided shard of every minibatch, divided by the **global**
   ``Normaliser`` of that minibatch (computed from the full batch); the loss is multiplied by
   ``world`` and gradients are averaged across ranks (all-reduce in ``replicate`` mode, FSDP's
   reduce-scatter in ``fsdp`` mode), so the averaged gradient is the sum of the shards' gradients =
   the single-process gradient. Stats (token and clip counts, loss sums, entropy sums) are summed
   across ranks.
4. Only rank 0 writes files (config, metrics, rollouts, checkpoints); checkpoint state dicts are
   gathered collectively first (FSDP).

Modes: ``replicate`` (every rank holds the full model; gradients all-reduced by hand; works on CPU
with gloo) and ``fsdp``: FSDP2 full shard of every policy (``fully_shard`` on each decoder layer and
the root, one wrapper whatever the launcher), selected either by ``GRAFT_FSDP=1`` under ``torchrun``
(bf16 compute / fp32 reduction on CUDA unless ``GRAFT_FSDP_BF16=0``) or by ``accelerate launch``
with an FSDP config (``ACCELERATE_USE_FSDP=true``): accelerate is then the launcher, and the launch
config's FSDP settings are read from the environment it sets (:func:`accelerate_fsdp`:
``mixed_precision``, ``fsdp_reshard_after_forward``, ``fsdp_offload_params``,
``fsdp_transformer_layer_cls_to_wrap``; settings graft cannot honour are refused in one line).
``Accelerator.prepare`` is not used: on CPU its FSDP2 wrapping of these models did not reproduce the
one-process step (``tests/test_dist.py``). On CPU both run with gloo in fp32, which is what the CPU
tests check next to ``replicate``. FSDP ranks must run the same number of forward passes, so
micro-batch counts are equalised across ranks with zero-weight dummy micro-batches and the HF
engine's decode loop stops only when every rank is done.

Faults: the process group is created with ``run.dist_timeout_s`` as its timeout. A rank that dies
closes its connections, so the others' next (or current) collective fails at once; a rank that hangs
makes the others' collective fail after the timeout. Either way each surviving rank stops with one
line (:class:`~graft_cli.errors.PeerLost`, exit 75) instead of a traceback or a hang, and
relaunching all ranks resumes from the last complete checkpoint (every write is rank 0's and
atomic). """

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import timedelta

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from graft_cli.batch import Rollouts
from graft_cli.errors import GraftError, PeerLost
from graft_cli.models import lora
from graft_cli.reward.pool import Grades
from graft_cli.train import checkpoint as ckpt


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def launched_main() -> bool:
    """Whether this process is rank 0 of its launch (the launcher's ``RANK``; a lone process is),
    before any process group exists: the one place a run's writer is decided from the environment
    (:meth:`Dist.is_main` is the same rank once :func:`setup` made the group)."""
    return _env_int("RANK", 0) == 0


@dataclass(frozen=True)
class ShardSpec:
    """How :func:`fully_shard_model` wraps a model: the module classes sharded one by one (empty:
    the model's ``_no_split_modules``, its decoder layers), whether their parameters are resharded
    after the forward pass (FULL_SHARD; False keeps them gathered until the backward, SHARD_GRAD_OP)
    and whether parameters live on the CPU between uses."""

    layer_classes: tuple = ()
    reshard_after_forward: bool = True
    offload_params: bool = False


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    mode: str = "none"  # none | replicate | fsdp
    rollout_tp: int = 1  # ranks per rollout engine (vLLM tensor_parallel_size when it spans ranks)
    mixed_bf16: bool = False  # FSDP2: bf16 compute, fp32 reduction
    timeout_s: float = 1800.0  # the process group's timeout (run.dist_timeout_s)
    shard_spec: ShardSpec = field(default_factory=ShardSpec)  # how FSDP2 wraps each model

    # --------------------------------------------------------------------------------- basics
    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def fsdp(self) -> bool:
        return self.mode == "fsdp"

    def barrier(self) -> None:
        if self.enabled:
            with self.guard("barrier"):
                torch.distributed.barrier()

    @contextmanager
    def guard(self, what: str):
        """A collective whose failure (a peer died, or hung past the timeout) becomes one line
        (:func:`peer_lost`)."""
        try:
            yield
        except RuntimeError as e:  # gloo raises RuntimeError, NCCL / the store torch.distributed.DistError
            raise peer_lost(self, what, e) from None

    # --------------------------------------------------------------------------------- data split
    @property
    def rollout_groups(self) -> int:
        return self.world // self.rollout_tp

    def rollout_slice(self, n: int) -> tuple[int, int]:
        """Contiguous ``[lo, hi)`` of ``n`` prompts sampled by this rank's rollout group."""
        g, G = self.rank // self.rollout_tp, self.rollout_groups
        per = -(-n // G)
        return min(g * per, n), min((g + 1) * per, n)

    def shard(self, rows: list) -> list:
        """This rank's strided share of ``rows`` (rows of one minibatch, or of a scoring pass)."""
        return rows[self.rank :: self.world] if self.enabled else rows

    # --------------------------------------------------------------------------------- collectives
    def gather_objects(self, obj) -> list:
        if not self.enabled:
            return [obj]
        out = [None] * self.world
        with self.guard("all_gather_object"):
            torch.distributed.all_gather_object(out, obj)
        return out

    def gather_rollout_groups(self, obj) -> list:
        """One object per rollout group (its first rank's), in group order."""
        allv = self.gather_objects(obj)
        return allv[:: self.rollout_tp]

    def max_int(self, x: int) -> int:
        if not self.enabled:
            return x
        t = torch.tensor([x], dtype=torch.long, device=self._coll_device())
        with self.guard("all_reduce"):
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return int(t.item())

    def all_done(self, done: bool) -> bool:
        """True when every rank is done (used by lock-step decode loops under FSDP)."""
        if not self.enabled:
            return done
        return self.max_int(0 if done else 1) == 0

    def _coll_device(self):
        return torch.device("cuda", torch.cuda.current_device()) if torch.distributed.get_backend() == "nccl" \
            else torch.device("cpu")

    # --------------------------------------------------------------------------------- gradients
    @property
    def loss_scale(self) -> float:
        """Factor on each rank's loss: gradients are averaged over ranks, the global loss is their
        sum."""
        return float(self.world)

    def sync_grads(self, model) -> None:
        """``replicate`` mode: average the gradients over ranks (one flat all-reduce). FSDP already
        did."""
        if not self.enabled or self.fsdp:
            return
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        with self.guard("gradient all_reduce"):
            torch.distributed.all_reduce(flat)
        flat /= self.world
        off = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[off : off + n].view_as(p.grad))
            off += n

    def clip_grad_norm(self, model, max_norm: float) -> float:
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # DTensor-aware (FSDP2)
        return float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)

    # --------------------------------------------------------------------------------- models
    def prepare(self, model, optimizer):
        """Wrap a policy for this mode (FSDP2 full shard); returns ``(model, optimizer)``."""
        if not self.fsdp:
            return model, optimizer
        return fully_shard_model(model, self.mixed_bf16, self.shard_spec), _rebuild_optimizer(optimizer, model)

    def prepare_frozen(self, model):
        """Shard a frozen model (no optimizer) like the policies under FSDP; unchanged otherwise."""
        if not self.fsdp:
            return model
        return fully_shard_model(model, self.mixed_bf16, self.shard_spec)

    def full_state(self, model, optimizer) -> tuple[dict | None, dict | None]:
        """Full (unsharded) model and optimizer state dicts, collective in FSDP mode; ``(None,
        None)`` when the local objects already hold everything."""
        if not self.fsdp:
            return None, None

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=opts), get_optimizer_state_dict(model, optimizer, options=opts)

    def load_adapter_state(self, model, optimizer, adapter_sd: dict, optim_sd: dict) -> None:
        """A LoRA policy's saved adapter (PEFT's keys) and its optimizer state into ``model`` (FSDP:
        the full tensors distributed into the shards, the base left as it is)."""
        if not self.fsdp:
            lora.load_adapter_state(model, adapter_sd)
            optimizer.load_state_dict(optim_sd)
            return
        opts = StateDictOptions(full_state_dict=True, strict=False)
        set_model_state_dict(model, lora.model_keys(model, adapter_sd), options=opts)
        set_optimizer_state_dict(model, optimizer, optim_sd, options=StateDictOptions(full_state_dict=True))

    def load_full_state(self, model, optimizer, model_sd: dict, optim_sd: dict) -> None:
        if not self.fsdp:
            model.load_state_dict(model_sd)
            optimizer.load_state_dict(optim_sd)
            return

        opts = StateDictOptions(full_state_dict=True)
        set_model_state_dict(model, model_sd, options=opts)
        set_optimizer_state_dict(model, optimizer, optim_sd, options=opts)


def peer_lost(d: Dist, what: str, e: BaseException) -> PeerLost:
    """The one line for a failed collective ``what`` on rank ``d.rank``: the library's first line
    without its source path and advice (gloo: ``[.../pair.cc:537] Read error ...: Connection reset
    by peer. This is ...``)."""

    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    first = re.sub(r"^\[[^\]]*\]\s*", "", first).split(". This is typically")[0][:200]
    return PeerLost(f"rank {d.rank} of {d.world}: {what} failed ({first}): another rank died, or did not answer "
                    f"within run.dist_timeout_s={d.timeout_s:g} s")


def fully_shard_model(model, mixed_bf16: bool = False, spec: ShardSpec = ShardSpec()):
    """FSDP2 full shard: each decoder layer (``spec.layer_classes``, else the model's
    ``_no_split_modules``) and then the root; ``mixed_bf16`` = bf16 parameters in compute, fp32
    reduction."""

    kw = {}
    if mixed_bf16:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if spec.offload_params:
        kw["offload_policy"] = CPUOffloadPolicy()
    names = set(spec.layer_classes) or set(getattr(model, "_no_split_modules", None) or [])
    for m in list(model.modules()):
        if type(m).__name__ in names:
            fully_shard(m, reshard_after_forward=spec.reshard_after_forward, **kw)
    # the root keeps its own parameters (embeddings, final norm, LM head) gathered after the forward
    # pass (FSDP2's default for the root): the scoring code calls the LM head on chunks of hidden
    # states after it
    fully_shard(model, **kw)
    return model


def _env_flag(env: dict, name: str, default: bool) -> bool:
    return str(env.get(name, str(default))).lower() in ("1", "true", "yes")


def accelerate_fsdp(env: dict) -> tuple[ShardSpec, bool]:
    """The FSDP settings of an ``accelerate launch`` config, as the environment accelerate sets from
    it: ``(ShardSpec, bf16)``. Settings graft does not honour raise :class:`GraftError` naming the
    config key."""

    def refuse(key: str, why: str):
        raise GraftError(f"accelerate launch config: {key}: {why}")

    if str(env.get("FSDP_VERSION", "1")) != "2":
        refuse("fsdp_config.fsdp_version", f"{env.get('FSDP_VERSION', '1')} (graft shards with FSDP2: set 2)")
    mp = str(env.get("ACCELERATE_MIXED_PRECISION", "no")).lower()
    if mp not in ("no", "bf16"):
        refuse("mixed_precision", f"{mp} (graft runs FSDP2 in fp32 or bf16 with fp32 reduction: set no or bf16)")
    policy = str(env.get("FSDP_AUTO_WRAP_POLICY", "TRANSFORMER_BASED_WRAP"))
    if policy not in ("TRANSFORMER_BASED_WRAP", "None", ""):
        refuse("fsdp_config.fsdp_auto_wrap_policy", f"{policy} (graft wraps each decoder layer: set "
                                                    f"TRANSFORMER_BASED_WRAP)")
    if _env_flag(env, "FSDP_ACTIVATION_CHECKPOINTING", False):
        refuse("fsdp_config.fsdp_activation_checkpointing", "true (use optim.gradient_checkpointing=true instead: "
                                                            "it checkpoints the same layers)")
    layers = tuple(c.strip() for c in str(env.get("FSDP_TRANSFORMER_CLS_TO_WRAP", "")).split(",") if c.strip())
    spec = ShardSpec(layer_classes=layers, reshard_after_forward=_env_flag(env, "FSDP_RESHARD_AFTER_FORWARD", True),
                     offload_params=_env_flag(env, "FSDP_OFFLOAD_PARAMS", False))
    return spec, mp == "bf16"


def _rebuild_optimizer(opt, model):
    """FSDP2 replaced the parameters by sharded DTensors: point the (still stateless) optimizer at
    them."""
    if len(opt.param_groups) != 1 or opt.state:
        raise ValueError("FSDP wrapping expects a fresh optimizer with one parameter group")
    opt.param_groups[0]["params"] = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapter only
    return opt


class _FullModel:
    """Checkpoint view of an FSDP policy: ``save_pretrained`` writes the gathered full state
    dict."""

    def __init__(self, model, sd):
        self.model, self.sd = model, sd

    def save_pretrained(self, d, **kw):
        self.model.save_pretrained(d, state_dict=self.sd, **kw)


class _FullOptim:
    def __init__(self, sd):
        self.sd = sd

    def state_dict(self):
        return self.sd


def sharded_checkpoints(d: Dist, fmt: str) -> bool:
    """``run.checkpoint_format``: ``sharded`` / ``auto`` write each rank's part under FSDP with more
    than one process (``auto``'s default); ``full`` (and every run that is not FSDP) gathers to rank
    0."""
    return d.fsdp and d.world > 1 and fmt in ("auto", "sharded")


def save_checkpoint(d: Dist, ckpt_root: str, step: int, policies: dict, state: dict, keep: int, protect: tuple = (),
                    fmt: str = "full"):
    """``checkpoint.save`` on rank 0 with full state dicts gathered first (collective in FSDP mode),
    or with ``fmt`` sharded (:func:`sharded_checkpoints`) ``checkpoint.save_sharded``: every rank
    its part, no gather."""

    if sharded_checkpoints(d, fmt):
        return ckpt.save_sharded(d, ckpt_root, step, policies, state, keep, protect)

    views = {}
    for name, pol in policies.items():
        msd, osd = d.full_state(pol.model, pol.optimizer)
        views[name] = pol if msd is None else replace(pol, model=_FullModel(pol.model, msd), optimizer=_FullOptim(osd))
    path = ckpt.save(ckpt_root, step, views, state, keep, protect) if d.is_main else None
    d.barrier()
    return path


def setup(cfg) -> Dist:
    """Initialise the process group from the launcher's environment (``WORLD_SIZE``, ``RANK``,
    ...)."""
    world = _env_int("WORLD_SIZE", 1)
    if world <= 1:
        return Dist()
    rank, local = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    use_cuda = torch.cuda.is_available() and cfg.run.device != "cpu"
    if use_cuda:
        torch.cuda.set_device(local)
    tp = int(cfg.rollout.engine_kwargs.get("tensor_parallel_size", 1)) if cfg.rollout.engine == "vllm" else 1
    if world % tp:
        raise GraftError(f"config key 'rollout.engine_kwargs.tensor_parallel_size': {tp} does not divide the "
                         f"{world} processes")
    groups = world // tp
    if cfg.data.prompt_batch % groups:
        raise GraftError(f"config key 'data.prompt_batch': {cfg.data.prompt_batch} is not divisible by the "
                         f"{groups} rollout groups ({world} processes / tensor_parallel_size {tp})")
    accel_fsdp = _env_flag(os.environ, "ACCELERATE_USE_FSDP", False)
    fsdp = accel_fsdp or _env_flag(os.environ, "GRAFT_FSDP", False)
    spec, bf16 = accelerate_fsdp(os.environ) if accel_fsdp else \
        (ShardSpec(), os.environ.get("GRAFT_FSDP_BF16", "1") == "1")
    if not torch.distributed.is_initialized():  # the launcher (torchrun, accelerate, srun) set the rendezvous
        torch.distributed.init_process_group(backend="nccl" if use_cuda else "gloo",
                                             timeout=timedelta(seconds=float(cfg.run.dist_timeout_s)))
    return Dist(rank=rank, world=world, local_rank=local, mode="fsdp" if fsdp else "replicate", rollout_tp=tp,
                timeout_s=float(cfg.run.dist_timeout_s), shard_spec=spec, mixed_bf16=fsdp and use_cuda and bf16)


def concat_rollouts(parts: list):
    """Concatenate the ``(Rollouts, Grades)`` of the rollout groups, in prompt order."""

    ros, grs = [p[0] for p in parts], [p[1] for p in parts]
    cat = lambda attr: [x for r in ros for x in getattr(r, attr)]  # noqa: E731
    ro = Rollouts(prompt_ids=cat("prompt_ids"), response_ids=cat("response_ids"), texts=cat("texts"),
                  logprobs=cat("logprobs"), truncated=cat("truncated"), n=ros[0].n, meta=dict(ros[0].meta))
    for k in ros[0].token_columns:
        ro.token_columns[k] = [x for r in ros for x in r.token_columns[k]]
    return ro, Grades.concat(grs)
