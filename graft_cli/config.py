"""Typed config schema and validation.

The Hydra tree in ``experiments/`` is composed (``config.yaml`` + ``pair/*.yaml`` + ``method/*.yaml`` +
command-line overrides) and merged into the dataclasses below, so an unknown key fails with the key's
name, and :func:`validate` checks ranges and cross-field rules. Every failure is one line naming the key.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from graft_cli.errors import GraftError

def _scaled(x, f) -> int:
    """``${graft_scale:${data.prompt_batch},0.5}``: an int scaled from another key (a method's minibatch as a
    share of the pair's prompt batch)."""
    return max(1, int(round(int(x) * float(f))))


OmegaConf.register_new_resolver("graft_scale", _scaled, replace=True)

EXPERIMENTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments")


ROLES = ("train", "frozen")


@dataclass
class PolicyConfig:
    """A model of the run. ``role: train`` is a policy (optimizer, rollout engine, checkpoints); ``role: frozen``
    is only scored (a KL reference, an OPD teacher, a tandem junior): loaded once in the run's dtype and
    device, no optimizer, not copied into checkpoints (the run records its path and weight hash and refuses
    to resume against different weights). Each step the registered ``scorer`` writes one per-row column
    (``column``, default ``<name>_logprobs``) into the batch of every policy it ``serves`` (default: all)."""

    name: str = MISSING  # short name used in files and metrics (e.g. "smol", "qwen", "a")
    model: str = MISSING  # hub id or local folder; "tiny:a" etc. for the embedded tiny pair
    tokenizer: Optional[str] = None  # defaults to model
    lr: Optional[float] = None  # per-policy override of optim.lr
    role: str = "train"  # train | frozen
    serves: list = field(default_factory=list)  # frozen: the policies whose batches it scores ([] = all)
    scorer: str = "logprobs"  # frozen: registered scorer (graft_cli/models/scoring.py)
    column: Optional[str] = None  # frozen: the batch column it fills (default <name>_logprobs)
    trust_remote_code: bool = False  # run the model's own code from its folder / hub repo (off unless set here)

    @property
    def score_column(self) -> str:
        return self.column or f"{self.name}_logprobs"


@dataclass
class SourceConfig:
    """A step source that is not a trained policy (graft_cli/train/sources.py): ``rollout_log`` reads a
    partner's earlier run (``run``, its policy ``policy``), re-graded when ``reverify``."""

    name: str = MISSING
    kind: str = "rollout_log"
    run: str = MISSING
    policy: str = MISSING
    reverify: bool = True


@dataclass
class RunConfig:
    name: Optional[str] = None
    out: str = "results/runs"
    seed: int = 0
    steps: Optional[int] = None  # default: epochs x steps per epoch
    epochs: int = 3
    save_every: int = 10
    save_initial: bool = False  # a checkpoint of the initial weights (step 0), kept through rotation: evaluation then
    # scores the base models by the same code path (graft eval --run, steps all / 0), e.g. a study's gain over them
    save_on_signal: bool = False  # on SIGTERM: finish the step, write its checkpoint, then exit 143 (else the step
    # is abandoned at once, nothing half-written, and the run resumes from its last checkpoint)
    keep_checkpoints: int = 2  # last k complete checkpoints (the best by validation is kept too)
    checkpoint_format: str = "auto"  # full: every policy gathered to rank 0 and saved as a HF folder; sharded: under
    # FSDP each rank writes its part (graft_cli/models/shards.py, no gather; resumes on any world size, `graft export`
    # assembles a HF folder); auto: sharded under FSDP with more than one process, full otherwise
    resume: bool = True
    log_rollouts: bool = True
    keep_rollouts: int = 0  # rollout logs of the last k steps per policy; 0 = all (stored-trajectory GRAFT reads them)
    device: str = "auto"
    dtype: str = "float32"
    threads: Optional[int] = None  # torch CPU threads
    policy_workers: int = 0  # policies stepped in parallel threads (1: one after the other; 0: auto, train/parallel)
    loggers: list = field(default_factory=lambda: ["jsonl"])  # + tensorboard, wandb (graft_cli/train/trackers.py)
    wandb_project: str = "graft"
    wandb_mode: str = "online"  # online | offline (no network; `wandb sync` later) | disabled
    log_every: int = 1  # without a terminal: one plain progress line every N steps
    model_init: str = "pretrained"  # random: the published shapes with random weights (graft_cli/models/shapes.py)
    random_shrink: bool = False  # with model_init=random: the same configs at hidden 64 / 2 layers (CPU tests)
    dist_timeout_s: float = 1800.0  # data-parallel runs: the process group's timeout; a rank that waits this long on
    # a collective (another rank hung) stops with one line (train/dist.py). Must exceed the slowest wait between
    # ranks (rank 0's checkpoint write while the others wait at the barrier)


@dataclass
class DataConfig:
    train: str = MISSING  # local .jsonl/.parquet or hub "name[:split]"; "tiny:train" for the tiny task
    prompt_batch: int = 128
    shuffle: bool = True
    fields: dict = field(default_factory=dict)  # field map; dotted names reach nested ones (reward_model.ground_truth)
    where: dict = field(default_factory=dict)  # keep only the rows whose fields equal these values ({ability: code})
    holdout: int = 0  # problems held out of training (a seeded random slice, e.g. for checkpoint selection)
    holdout_seed: int = 0


@dataclass
class PromptConfig:
    suffix: str = "Let's think step by step and output the final answer within \\boxed{}."
    chat_template: str = "auto"  # auto | none | required (auto, and a tokenizer without a template is refused)
    raw_template: str = "{problem} {suffix}\n"


@dataclass
class RolloutConfig:
    engine: str = "hf"
    n: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 4096
    max_prompt_tokens: int = 2048
    max_batch: int = 256  # sequences per generation micro-batch (hf engine)
    engine_kwargs: dict = field(default_factory=dict)


@dataclass
class RewardConfig:
    name: str = "math_verify"  # math_verify | code (tests run sandboxed, graft_cli/code_reward.py) | coinflip
    num_workers: int = 2
    timeout_s: float = 5.0  # per answer (code: the sandbox's wall clock for all of the answer's tests)
    chunk_size: int = 64
    sci_notation: bool = True  # read 4e33 as 4·10^33 (math-verify alone reads the e as Euler's number)
    memory_mb: int = 4096  # address-space cap of each grading worker (0 = none); over it an answer scores 0


@dataclass
class FilterGroupsConfig:
    """DAPO's dynamic sampling (verl ``algorithm.filter_groups``): drop groups whose ``metric`` is constant and
    sample further prompts until the step holds ``data.prompt_batch`` informative groups (train/collect.py)."""

    enable: bool = False
    metric: str = "acc"  # acc: the binary reward
    max_num_gen_batches: int = 0  # cap on sampling rounds per step (0 = no cap)


@dataclass
class RolloutCorrectionConfig:
    """Rollout rejection and mismatch metrics (verl ``algorithm.rollout_correction``'s ``rollout_rs``,
    ``rollout_token_veto_threshold`` and off-policy metrics; graft_cli/algorithms/correction.py), beside the TIS
    weights of ``algo.is_correction``. Applies to the receiver's own rows (they carry sampler log-probs)."""

    rejection: str = "none"  # registered rejection mask: none | token | sequence | geometric | icepop
    params: dict = field(default_factory=dict)  # its thresholds (token/sequence/geometric: threshold 2.0,
    # threshold_lower 0 = 1/threshold; icepop: alpha 0.5, beta 5.0), validated against its defaults
    veto_threshold: float = 0.0  # drop a response holding a token with ratio below this (0 = off)
    metrics: bool = False  # rollout_corr/* every step: KL, k3 KL, PPLs, log-PPL difference, chi2 (token, sequence);
    # off by default (the HF engine's log-probs are the trainer's: all zero), on in the vLLM scale overlay


@dataclass
class AlgoConfig:
    advantage: str = "grpo"
    adv_eps: float = 1e-6
    norm_by_std: bool = True
    loss: str = "ppo_token"
    agg: str = "token-mean"
    clip_low: float = 0.2
    clip_high: float = 0.28
    minibatch_prompts: int = 32
    ppo_epochs: int = 1
    old_logprobs: str = "auto"  # trainer: recompute before the first update (verl) | sampler: use the engine's
    # | auto: sampler where it is exact (an engine with exact_logprobs, the HF one; run.dtype float32; ppo_epochs 1;
    # rollout.top_p 1), else trainer; resolved at validation, so the run's config.yaml records which
    loss_scale_factor: Optional[float] = None
    log_entropy: bool = True
    is_correction: str = "none"  # truncated IS of the sampler-vs-trainer mismatch: none | token | sequence
    is_threshold: float = 2.0  # truncation C of the IS ratio (verl rollout_is_threshold)
    clip_ratio_c: float = 0.0  # dual-clip PPO constant (verl clip_ratio_c; 0 = off; the real pairs: 3.0)
    kl_coef: float = 0.0  # KL loss to a frozen reference (verl use_kl_loss + kl_loss_coef); 0 = none
    kl_type: str = "low_var_kl"  # KL estimator (verl kl_loss_type): low_var_kl (k3) | kl (k1) | mse (k2)
    kl_rows: str = "all"  # rows the KL term covers: all | self (the policy's own samples; HACPO's released loss)
    reference: str = "none"  # none | initial: a frozen copy of each policy's initial weights, column ref_logprobs
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    loss_params: dict = field(default_factory=dict)  # the loss's parameters, validated against its defaults
    token_adv_params: dict = field(default_factory=dict)  # parameters of the token-advantage functions
    loss_mask: str = "response"  # registered loss-mask function (graft_cli/algorithms/signals.py)
    loss_mask_params: dict = field(default_factory=dict)  # its parameters (e.g. author: junior_weight)
    token_advantages: list = field(default_factory=lambda: ["is_correction"])  # registered, applied in order
    controllers: list = field(default_factory=list)  # [{name: <registered controller>, ...params}]


@dataclass
class OptimConfig:
    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: list = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    max_grad_norm: float = 1.0
    micro_batch_tokens: int = 16384  # token budget per forward/backward micro-batch
    sort_micro_batches: bool = False  # update: rows of a minibatch sorted by length into micro-batches (less padding)
    chunk_tokens: int = 4096  # LM-head rows per chunk in the log-prob computation
    gradient_checkpointing: bool = False
    shared_prefix: Any = "auto"  # each distinct prompt's forward runs once per micro-batch, its KV cache indexed
    # to the group's rows (update and scoring; float order only: graft_cli/models/logprobs.py); auto: on unless
    # gradient_checkpointing (which keeps no KV cache); resolved to true/false at validation
    autocast: str = "none"  # none | bfloat16: the update's and the trainer's scoring forwards under torch.autocast
    # (bf16 matmuls, fp32 log-softmax; docs/performance.md has its speed and log-prob error on CPU)
    on_nonfinite: str = "stop"  # a non-finite log-prob, loss or gradient norm: stop (one line) | skip the update


@dataclass
class ExchangeConfig:
    name: str = "none"  # registered exchange step: none | graft | ...
    ordering: str = "last"  # registered minibatch ordering (graft_cli/algorithms/minibatch.py): last | first |
    # uniform (groups holding peer samples after / before the own groups / shuffled) | self_first_rows (HACPO)
    params: dict = field(default_factory=dict)  # exchange-specific options, validated by the exchange


@dataclass
class FinalEvalConfig:
    """The final evaluation (`graft eval --run` without the matching option) where it differs from validation:
    every None key is the validation's (``eval.*``; runs: 5). E.g. SAF-OPD validates on AIME24/25 and reports
    AIME24/25 + HMMT25 Feb/Nov at avg@32, one run (opd_saf.md §5). A validated step's folder already holds the
    validation's samples: the final evaluation adds runs and benchmarks to it. Where the final sampling differs
    from the validation's (Tandem RLVR: validation n = 4 at T 0.6 / top-p 0.95, the final evaluation n = 8 at
    T 0.7 / top-p 0.8 / top-k 20), validation writes ``<run>/validation/`` instead and the final evaluation
    ``<run>/eval/`` (graft_cli/eval/runner.py ``validation_root``)."""
    benchmarks: Optional[list] = None
    runs: Optional[int] = None
    samples: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    seed: Optional[int] = None
    max_new_tokens: Optional[int] = None


@dataclass
class EvalConfig:
    """Validation during training and defaults of `graft eval --run` (graft.md §1; graft_cli/eval/runner.py)."""
    every: int = 0  # validate every N steps (and at the last step); 0 = off (the CPU default); paper: 5
    benchmarks: list = field(default_factory=list)  # names/NAME=FILE/paths; [] = the five (tiny: synthetic)
    data_dir: Optional[str] = None  # folder with <name>.jsonl benchmark files (else $GRAFT_EVAL_DIR, else hub)
    samples: int = 8  # samples per problem
    runs: int = 1  # eval runs per validation (the final `graft eval` uses 5)
    max_new_tokens: Optional[int] = None  # default: rollout.max_new_tokens (same length limit as training)
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 0  # the k most likely tokens before top-p; 0 = off (Tandem RLVR's evaluation: 20)
    seed: int = 0  # base of the per-run sampling seeds
    save_best: bool = True  # keep each policy's best weights at <run>/best/<policy>/
    select_metric: str = "pass@1"  # checkpoint selection (best.json): pass@k averaged over select_benchmarks
    select_benchmarks: list = field(default_factory=list)  # [] = the benchmark average's (the five when present)
    tandem: bool = False  # `graft eval --run` also runs handoff robustness and legibility (tandem.md §2.10)
    junior: Optional[str] = None  # their junior model (default: the run's tandem junior, else tandem.junior)
    handoff_delimiter: str = "\n\n"  # the handoff evaluation's step end (strict alternation after it)
    rescue: bool = False  # `graft eval --run` also re-draws the run's all-fail prompts at its last step (eval/rescue)
    rescue_cap: int = 128  # at most this many prompts per subset (admitted / not admitted); 0 = all
    prompt_suffix: Optional[str] = None  # the evaluation prompts' suffix (validation and final); None: prompt.suffix
    prompt_separator: str = " "  # between problem and suffix in a chat-templated evaluation prompt (training: " ")
    lcb_window: Optional[str] = None  # LiveCodeBench's contest-date window START..END (None: 2025-02-01..2025-05-01)
    final: FinalEvalConfig = field(default_factory=FinalEvalConfig)  # `graft eval --run`'s own defaults


@dataclass
class Config:
    method: str = "grpo"
    pair: str = "tiny"
    policies: list = field(default_factory=list)  # list[PolicyConfig]: trained policies and frozen models
    sources: list = field(default_factory=list)  # list[SourceConfig]: step sources (e.g. a partner's logs)
    plugins: list = field(default_factory=list)  # modules or .py files imported before validation (new methods)
    distill: dict = field(default_factory=dict)  # a pair's distillation roles: {student: {name, model}, teacher: MODEL}
    tandem: dict = field(default_factory=dict)  # a pair's tandem roles: {senior: {name, model}, junior: MODEL}
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    exchange: ExchangeConfig = field(default_factory=ExchangeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    extra: dict = field(default_factory=dict)  # free-form notes (e.g. the paper's table values)


def _one_line(e: Exception) -> str:
    msg = str(e).strip().splitlines()
    key = getattr(e, "full_key", None)
    head = msg[0] if msg else type(e).__name__
    return f"config key {key!r}: {head}" if key else f"config: {head}"


GROUPS = ("pair", "method", "scale")  # scale=<name>: optional hardware overlay (experiments/scale/), applied last


def compose(overrides: list[str] | None = None, config_dir: str | None = None) -> Config:
    """Compose ``config.yaml`` with Hydra (config groups ``pair=`` and ``method=`` select files),
    merge into the schema, apply the ``key=value`` overrides, validate. Raises :class:`GraftError`
    with one line on any problem (an unknown key names the key)."""
    from hydra import compose as hcompose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
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
            groups.append(f"{'+' if key == 'scale' else ''}{key}='{val}'")
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
    import yaml

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
        apply(lists)
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
    import importlib
    import importlib.util
    import sys

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
              "algo.token_adv_params", "algo.loss_mask_params", "algo.rollout_correction.params", "distill", "tandem")


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
    import dataclasses

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


def validate(cfg: Config, registries: bool = True) -> None:
    """Ranges and cross-field rules. ``registries=False`` (a config read back from a run directory, whose
    plugins were not imported) skips the checks that a registered name exists."""
    from graft_cli.algorithms import CONTROLLERS, LOSS_MASKS, TOKEN_ADVANTAGES
    from graft_cli.algorithms.advantages import ADVANTAGES
    from graft_cli.algorithms.correction import IS_CORRECTIONS, ROLLOUT_REJECTIONS
    from graft_cli.algorithms.exchange import EXCHANGES
    from graft_cli.algorithms.losses import AGG_MODES, KL_KINDS, KL_ROWS, POLICY_LOSSES
    from graft_cli.algorithms.minibatch import MINIBATCH_ORDERINGS
    from graft_cli.models.loading import DTYPES
    from graft_cli.models.logprobs import AUTOCAST
    from graft_cli.models.scoring import SCORERS
    from graft_cli.registry import validate_params
    from graft_cli.reward import REWARDS
    from graft_cli.rollout import ENGINES

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
        from graft_cli.algorithms.signals import token_adv_params

        flat = {}
        for d in token_adv_params(list(a.token_advantages), a.token_adv_params).values():
            flat.update(d)
        a.token_adv_params = flat
    _known(a.loss_mask, LOSS_MASKS, "algo.loss_mask")
    if a.loss_mask in LOSS_MASKS:
        from graft_cli.algorithms.signals import loss_mask_params

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
                                                 role="frozen", serves=[p.name], column="ref_logprobs"))
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
            from graft_cli.algorithms.controllers import controller_params

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
    _check(cfg.run.save_every >= 1, "run.save_every", "must be >= 1")
    _check(cfg.run.keep_rollouts >= 0, "run.keep_rollouts", "must be >= 0 (0 = keep all)")
    _check(cfg.run.wandb_mode in ("online", "offline", "disabled"), "run.wandb_mode",
           "must be online, offline or disabled")
    _check(cfg.run.log_every >= 1, "run.log_every", "must be >= 1")
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
