"""The config schema: one dataclass per section of ``experiments/config.yaml`` (``run``, ``data``,
``prompt``, ``rollout``, ``reward``, ``algo``, ``optim``, ``exchange``, ``eval``) and the
:class:`Config` that holds them. Composition and validation are :mod:`graft_cli.config`'s."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING


ROLES = ("train", "frozen")
SYNC_CHECKS = ("every", "first", "off")  # run.sync_check


@dataclass
class LoraConfig:
    """LoRA adapters for a trained policy (graft_cli/models/lora.py, through PEFT): ``r`` 0 trains
    the full weights; ``r > 0`` trains rank-``r`` adapters scaled by ``alpha / r`` on
    ``target_modules`` (``all-linear``: every linear layer but the LM head, or a list of module
    names), the base frozen. ``init``: default (B = 0, the adapted model starts as the base),
    gaussian, pissa, olora (PEFT's ``init_lora_weights``)."""

    r: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: Any = "all-linear"
    init: str = "default"


@dataclass
class PolicyConfig:
    """A model of the run. ``role: train`` is a policy (optimizer, rollout engine, checkpoints);
    ``role: frozen`` is only scored (a KL reference, an OPD teacher, a tandem junior): loaded once
    in the run's dtype and device, no optimizer, not copied into checkpoints (the run records its
    path and weight hash and refuses to resume against different weights). Each step the registered
    ``scorer`` writes one per-row column (``column``, default ``<name>_logprobs``) into the batch of
    every policy it ``serves`` (default: all)."""

    name: str = MISSING  # short name used in files and metrics (e.g. "smol", "qwen", "a")
    model: str = MISSING  # hub id or local folder; "tiny:a" etc. for the embedded tiny pair
    tokenizer: Optional[str] = None  # defaults to model
    lr: Optional[float] = None  # per-policy override of optim.lr
    role: str = "train"  # train | frozen
    serves: list = field(default_factory=list)  # frozen: the policies whose batches it scores ([] = all)
    scorer: str = "logprobs"  # frozen: registered scorer (graft_cli/models/scoring.py)
    column: Optional[str] = None  # frozen: the batch column it fills (default <name>_logprobs)
    trust_remote_code: bool = False  # run the model's own code from its folder / hub repo (off unless set here)
    lora: LoraConfig = field(default_factory=LoraConfig)  # train: LoRA adapters instead of the full weights (r > 0)
    base_of: Optional[str] = None  # frozen: the LoRA policy whose base this is (its adapter disabled; no second copy)

    @property
    def score_column(self) -> str:
        return self.column or f"{self.name}_logprobs"


@dataclass
class SourceConfig:
    """A step source that is not a trained policy (graft_cli/train/sources.py): ``rollout_log``
    reads a partner's earlier run (``run``, its policy ``policy``), re-graded when ``reverify``."""

    name: str = MISSING
    kind: str = "rollout_log"
    run: str = MISSING
    policy: str = MISSING
    reverify: bool = True


def samples_ahead(run) -> bool:
    """Whether a run samples ahead of its updates (``run.staleness`` k >= 1: step t trains on
    rollouts sampled with the weights of step t - k, generated while earlier steps update): the one
    decision every asynchronous part reads (resolution's defaults, the rollout replica, the
    collection, the grader's lock)."""
    return run.staleness > 0


@dataclass
class RunConfig:
    name: Optional[str] = None
    out: str = "results/runs"
    seed: int = 0
    steps: Optional[int] = None  # default: epochs x steps per epoch
    epochs: int = 3
    save_every: int = 10  # and at the last step; 0: no checkpoint at all (benchmarks: nothing to resume from)
    save_initial: bool = False  # a checkpoint of the initial weights (step 0), kept through rotation: evaluation then
    # scores the base models by the same code path (graft eval --run, steps all / 0), e.g. a study's
    # gain over them
    sync_check: str = "every"  # every | first | off: after a weight sync, the engine's and the trainer's log-probs of a
    # fixed probe must agree (graft_cli/train/sync_check.py), else the run stops in one line
    sync_tolerance: Optional[float] = None  # nats/token the probe gap may reach (default by run.dtype)
    save_on_signal: bool = False  # on SIGTERM: finish the step, write its checkpoint, then exit 143 (else the step
    # is abandoned at once, nothing half-written, and the run resumes from its last checkpoint)
    keep_checkpoints: int = 2  # last k complete checkpoints (the best by validation is kept too)
    checkpoint_format: str = "auto"  # full: every policy gathered to rank 0 and saved as a HF folder; sharded: under
    # FSDP each rank writes its part (graft_cli/models/shards.py, no gather; resumes on any world
    # size, `graft export` assembles a HF folder); auto: sharded under FSDP with more than one
    # process, full otherwise
    resume: bool = True
    log_rollouts: bool = True
    keep_rollouts: int = 0  # rollout logs of the last k steps per policy; 0 = all (stored-trajectory GRAFT reads them)
    device: str = "auto"
    dtype: str = "float32"
    threads: Optional[int] = None  # torch CPU threads
    policy_workers: int = 0  # policies stepped in parallel threads (1: one after the other; 0: auto, train/parallel)
    staleness: int = 0  # k: step t trains on rollouts sampled with the weights of step max(0, t - k), generated while
    # the steps before it update (graft_cli/train/rollouts.py); 0: each step samples with its own
    # weights
    loggers: list = field(default_factory=lambda: ["jsonl"])  # + tensorboard, wandb (graft_cli/train/trackers.py)
    wandb_project: str = "graft"
    wandb_mode: str = "online"  # online | offline (no network; `wandb sync` later) | disabled
    log_every: int = 1  # without a terminal: one plain progress line every N steps
    model_init: str = "pretrained"  # random: the published shapes with random weights (graft_cli/models/shapes.py)
    random_shrink: bool = False  # with model_init=random: the same configs at hidden 64 / 2 layers (CPU tests)
    dist_timeout_s: float = 1800.0  # data-parallel runs: the process group's timeout; a rank that waits this long on
    # a collective (another rank hung) stops with one line (train/dist.py). Must exceed the slowest
    # wait between ranks (rank 0's checkpoint write while the others wait at the barrier)


@dataclass
class DataConfig:
    train: str = MISSING  # local .jsonl/.parquet or hub "name[:split]"; "tiny:train" for the tiny task
    prompt_batch: int = 128
    shuffle: bool = True
    fields: dict = field(default_factory=dict)  # field map; dotted names reach nested ones (reward_model.ground_truth)
    where: dict = field(default_factory=dict)  # keep only the rows whose fields equal these values ({ability: code})
    holdout: int = 0  # problems held out of training (a seeded random slice, e.g. for checkpoint selection)
    holdout_seed: int = 0
    holdout_distinct: bool = False  # also drop training problems whose text equals a held-out one's
    mix: dict = field(default_factory=dict)  # value of mix_field -> share: a re-weighted training set (data/mix.py)
    mix_field: str = "family"  # the record field data.mix weighs (the tiny task's skill family)
    mix_seed: int = 0  # which problems of each group the mixed set keeps


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
class CodeRewardConfig:
    allow_root: bool = False  # as root, grade even where answers cannot run under a uid of their own


@dataclass
class RewardConfig:
    name: str = "math_verify"  # math_verify | code (tests run sandboxed, graft_cli/reward/code_grader.py) | coinflip
    num_workers: int = 2
    timeout_s: float = 5.0  # per answer (code: the sandbox's wall clock for all of the answer's tests)
    chunk_size: int = 64
    sci_notation: bool = True  # read 4e33 as 4·10^33 (math-verify alone reads the e as Euler's number)
    memory_mb: int = 4096  # address-space cap of each grading worker (0 = none); over it an answer scores 0
    coinflip_p: float = 0.5  # coinflip only: the share of responses scored 1 (0.2 leaves ~17% all-fail groups of 8)
    code: CodeRewardConfig = field(default_factory=CodeRewardConfig)  # code only: graft_cli/reward/code_grader.py


@dataclass
class FilterGroupsConfig:
    """DAPO's dynamic sampling (verl ``algorithm.filter_groups``): drop groups whose ``metric`` is
    constant and sample further prompts until the step holds ``data.prompt_batch`` informative
    groups (train/rollouts.py)."""

    enable: bool = False
    metric: str = "acc"  # acc: the binary reward
    max_num_gen_batches: int = 0  # cap on sampling rounds per step (0 = no cap)


@dataclass
class RolloutCorrectionConfig:
    """Rollout rejection and mismatch metrics (verl ``algorithm.rollout_correction``'s
    ``rollout_rs``, ``rollout_token_veto_threshold`` and off-policy metrics;
    graft_cli/algorithms/correction.py), beside the TIS weights of ``algo.is_correction``. Applies
    to the receiver's own rows (they carry rollout log-probs)."""

    rejection: str = "none"  # registered rejection mask: none | token | sequence | geometric | icepop
    # a mapping: Hydra cannot type keys that depend on the name chosen; resolution checks it into
    # its Params class
    params: dict = field(default_factory=dict)  # its thresholds (token/sequence/geometric: threshold 2.0,
    # threshold_lower 0 = 1/threshold; icepop: alpha 0.5, beta 5.0), validated against its defaults
    veto_threshold: float = 0.0  # drop a response holding a token with ratio below this (0 = off)
    metrics: Optional[bool] = None  # rollout_corr/* every step: KL, k3 KL, PPLs, log-PPL difference, chi2 (token,
    # sequence); None: on at run.staleness >= 1 (behaviour vs proximal policy), else off (the HF
    # engine's log-probs are the trainer's: all zero); on in the vLLM scale overlay


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
    old_logprobs: str = "auto"  # trainer: recompute before the first update (verl) | rollout: use the engine's
    # | auto: rollout where it is exact (an engine with exact_logprobs, the HF one; run.dtype float32; ppo_epochs 1;
    # rollout.top_p 1), else trainer; resolved at validation, so the run's config.yaml records which
    loss_scale_factor: Optional[float] = None
    log_entropy: bool = True
    grad_share_every: int = 0  # every N steps: grafted rows' share of each minibatch's gradient norm (0: off)
    is_correction: str = "auto"  # truncated IS of the rollout-vs-trainer mismatch: none | token | sequence | auto
    # (token at run.staleness >= 1, else none)
    is_threshold: float = 2.0  # truncation C of the IS ratio (verl rollout_is_threshold)
    clip_ratio_c: float = 0.0  # dual-clip PPO constant (verl clip_ratio_c; 0 = off; the real pairs: 3.0)
    kl_coef: float = 0.0  # KL loss to a frozen reference (verl use_kl_loss + kl_loss_coef); 0 = none
    kl_type: str = "low_var_kl"  # KL estimator (verl kl_loss_type): low_var_kl (k3) | kl (k1) | mse (k2)
    kl_rows: str = "all"  # rows the KL term covers: all | self (the policy's own samples; HACPO's released loss)
    reference: str = "none"  # none | initial: a frozen copy of each policy's initial weights, column ref_logprobs
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    # *_params: mappings (Hydra cannot type keys that depend on the name chosen); resolution checks each into its Params
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
    # to the group's rows (update and scoring; float order only: graft_cli/models/logprobs.py);
    # auto: on unless gradient_checkpointing (which keeps no KV cache); resolved to true/false at
    # validation
    autocast: str = "none"  # none | bfloat16: the update's and the trainer's scoring forwards under torch.autocast
    # (bf16 matmuls, fp32 log-softmax; docs/performance.md has its speed and log-prob error on CPU)
    on_nonfinite: str = "stop"  # a non-finite log-prob, loss or gradient norm: stop (one line) | skip the update


@dataclass
class ExchangeConfig:
    name: str = "none"  # registered exchange step: none | graft | ...
    ordering: str = "last"  # registered minibatch ordering (graft_cli/algorithms/minibatch.py): last | first |
    # uniform (groups holding peer samples after / before the own groups / shuffled) |
    # self_first_rows (HACPO)
    layout: str = "whole_batch"  # whole_batch: the ordering cuts one process's rows | rank_chunks (self_first_rows
    # only): the rows split over layout_ranks data-parallel ranks first, as verl dispatches them
    # (HACPO's 8-GPU launcher); optimizer step m = every rank's m-th minibatch
    # (graft_cli/algorithms/minibatch.py)
    layout_ranks: int = 8  # W of rank_chunks: (algo.minibatch_prompts × rollout.n) % W == 0
    # a mapping: Hydra cannot type keys that depend on the name chosen; resolution checks it into
    # its Params class
    params: dict = field(default_factory=dict)  # exchange-specific options, validated by the exchange


@dataclass
class FinalEvalConfig:
    """The final evaluation (`graft eval --run` without the matching option) where it differs from
    validation: every None key is the validation's (``eval.*``; runs: 5). E.g. SAF-OPD validates on
    AIME24/25 and reports AIME24/25 + HMMT25 Feb/Nov at avg@32, one run (opd_saf.md §5). A validated
    step's folder already holds the validation's samples: the final evaluation adds runs and
    benchmarks to it. Where the final sampling differs from the validation's (Tandem RLVR:
    validation n = 4 at T 0.6 / top-p 0.95, the final evaluation n = 8 at T 0.7 / top-p 0.8 / top-k
    20), validation writes ``<run>/validation/`` instead and the final evaluation ``<run>/eval/``
    (graft_cli/eval/setup.py ``validation_root``)."""
    benchmarks: Optional[list] = None
    runs: Optional[int] = None
    bench_runs: dict = field(default_factory=dict)  # benchmark -> runs where it differs from ``runs`` ({}: none)
    samples: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    seed: Optional[int] = None
    max_new_tokens: Optional[int] = None


@dataclass
class EvalConfig:
    """Validation during training and defaults of `graft eval --run` (graft.md §1;
    graft_cli/eval/runner.py)."""
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
