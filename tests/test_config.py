"""Config composition (experiments/), the paper's Table 3 values (graft.md §7) and one-line errors."""

from __future__ import annotations

import functools
import os

import pytest
from conftest import ROOT

from graft_cli.config import Config, compose
from graft_cli.errors import GraftError


@functools.cache
def composed(pair: str, method: str = "grpo") -> Config:
    """Hydra composition takes ~0.2 s; tests that only read a (pair, method) config share one."""
    return compose([f"pair={pair}", f"method={method}"])

PAIRS = ["tiny", "1", "2", "3"]
METHODS = {"grpo": 8, "grpo_n16": 16, "grpo_n32": 32}


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("pair", PAIRS)
def test_compose_every_pair_and_method(pair, method):
    cfg = composed(pair, method)
    assert isinstance(cfg, Config)
    assert cfg.pair == pair and cfg.method == method
    assert cfg.rollout.n == METHODS[method]
    assert len(cfg.policies) == 2
    assert cfg.exchange.name == "none"
    assert cfg.algo.advantage == "grpo" and cfg.algo.loss == "ppo_token" and cfg.algo.agg == "token-mean"
    # GRPO n=16/32 change only the rollout count: the minibatch stays the same number of prompts
    assert cfg.algo.minibatch_prompts == (16 if pair == "tiny" else 32)


def test_default_composition_is_tiny_grpo():
    cfg = compose([])
    assert cfg == composed("tiny", "grpo")
    assert cfg.pair == "tiny" and cfg.method == "grpo"
    assert [p.model for p in cfg.policies] == ["tiny:a", "tiny:b"]
    # the tiny pair keeps 4 minibatches per rollout batch, with half the paper's prompts; lr 5e-5 (README)
    assert cfg.data.prompt_batch == 64 and cfg.algo.minibatch_prompts == 16 and cfg.optim.lr == 5e-5


# Table 3 of the paper (graft.md §7), written out as literals
TABLE3 = {
    "run.epochs": 3,
    "data.prompt_batch": 128,
    "rollout.n": 8,
    "algo.minibatch_prompts": 32,
    "algo.ppo_epochs": 1,
    "rollout.max_prompt_tokens": 2048,
    "rollout.max_new_tokens": 4096,
    "rollout.temperature": 1.0,
    "rollout.top_p": 1.0,
    "optim.lr": 1e-6,
    "optim.betas": [0.9, 0.999],
    "optim.weight_decay": 0.01,
    "optim.max_grad_norm": 1.0,
    "algo.clip_low": 0.2,
    "algo.clip_high": 0.28,
    "algo.adv_eps": 1e-6,
    "run.dtype": "bfloat16",
    "algo.agg": "token-mean",
    "algo.advantage": "grpo",
    "algo.kl_coef": 0.0,
}
# Table 3's method rows, as the method configs compose them on the paper's pairs
TABLE3_METHODS = {
    "graft": {"exchange.params.delta": 0.8},
    "sgt": {"algo.loss_params.nll_coef": 0.1},
    "hacpo": {"algo.clip_low": 3e-4, "algo.clip_high": 4e-4, "algo.loss_params.lower_bound": 0.8,
              "algo.loss_params.lower_bound_step": 0.025, "algo.loss_params.peer_coef": 1.0,
              "algo.minibatch_prompts": 64, "algo.kl_coef": 1e-3},
}


def _get(cfg, dotted):
    obj = cfg
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


@pytest.mark.parametrize("pair", ["1", "2", "3"])
def test_paper_table3_values(pair):
    cfg = composed(pair, "grpo")
    for key, want in TABLE3.items():
        got = _get(cfg, key)
        if isinstance(want, list):
            assert list(got) == want, key
        else:
            assert got == want and type(got) is type(want), (key, got, want)
    # 4 optimizer steps per rollout batch
    assert cfg.data.prompt_batch // cfg.algo.minibatch_prompts == 4
    for method, rows in TABLE3_METHODS.items():
        mcfg = composed(pair, method)
        for key, want in rows.items():
            assert _get(mcfg, key) == want, (method, key)


def test_the_built_optimizer_is_adamw_with_the_configs_values(tmp_path):
    """Table 3: AdamW. The policy the trainer builds holds a torch AdamW over its parameters with optim.*'s lr,
    betas, eps and weight decay (a policy's own lr wins)."""
    import torch
    from conftest import make_random_model

    from graft_cli.train.policies import build_policy

    path = make_random_model(str(tmp_path / "m"), "qwen3", seed=0)
    cfg = compose([f"policies=[{{name: a, model: '{path}'}}, {{name: b, model: '{path}', lr: 2.5e-6}}]",
                   "optim.lr=3e-6", "optim.betas=[0.8,0.95]", "optim.weight_decay=0.05", "optim.eps=1e-7",
                   "run.device=cpu"])
    for pc, lr in zip(cfg.policies, (3e-6, 2.5e-6)):
        pol = build_policy(pc, cfg)
        opt = pol.optimizer
        assert type(opt) is torch.optim.AdamW
        (g,) = opt.param_groups
        assert (g["lr"], g["betas"], g["eps"], g["weight_decay"]) == (lr, (0.8, 0.95), 1e-7, 0.05)
        assert {id(x) for x in g["params"]} == {id(x) for x in pol.model.parameters()}


@pytest.mark.parametrize("pair,models", [
    ("1", ["HuggingFaceTB/SmolLM3-3B-Base", "Qwen/Qwen3-1.7B-Base"]),
    ("2", ["OctoThinker/OctoThinker-3B-Hybrid-Base", "Qwen/Qwen3-1.7B-Base"]),
    ("3", ["HuggingFaceTB/SmolLM3-3B-Base", "OctoThinker/OctoThinker-3B-Hybrid-Base"]),
])
def test_pair_hf_ids(pair, models):
    cfg = composed(pair)
    assert [p.model for p in cfg.policies] == models


def test_overrides_apply_after_pair_and_method():
    cfg = compose(["pair=1", "method=grpo_n16", "algo.clip_high=0.3", "data.prompt_batch=64", "run.seed=5"])
    assert cfg.algo.clip_high == 0.3 and cfg.data.prompt_batch == 64 and cfg.run.seed == 5
    assert cfg.rollout.n == 16
    # free-form dicts accept new keys
    assert compose(["extra.note=hello"]).extra["note"] == "hello"


# --- errors: one line, naming the key ------------------------------------------------------------------------
ERRORS = [
    (["algo.foo=1"], "algo.foo"),
    (["nonsense=1"], "nonsense"),
    (["algo.clip_low=-0.1"], "algo.clip_low"),
    (["algo.clip_high=-0.01"], "algo.clip_high"),
    (["pair=1", "data.prompt_batch=100"], "algo.minibatch_prompts"),
    (["algo.minibatch_prompts=5"], "algo.minibatch_prompts"),  # tiny: 32 prompts are not divisible by 5
    (["rollout.n=abc"], "rollout.n"),
    (["optim.lr=fast"], "optim.lr"),
    (["run.epochs=[1,2]"], "run.epochs"),
    (["pair=9"], "pair"),
    (["method=zzz"], "method"),
]


@pytest.mark.parametrize("overrides,key", ERRORS, ids=[" ".join(e[0]) for e in ERRORS])
def test_errors_are_one_line_naming_the_key(overrides, key):
    with pytest.raises(GraftError) as ei:
        compose(overrides)
    msg = str(ei.value)
    assert "\n" not in msg, msg
    assert key in msg, msg


def test_unknown_pair_and_method_name_the_value_and_known_ones():
    with pytest.raises(GraftError) as ei:
        compose(["pair=9"])
    pairs = sorted(f[:-5] for f in os.listdir(os.path.join(ROOT, "experiments", "pair")) if f.endswith(".yaml"))
    assert {"1", "2", "3", "tiny", "tandem_qwen3_4b"} <= set(pairs)
    known = "known: " + ", ".join(pairs)
    assert "'9'" in str(ei.value) and known in str(ei.value)
    with pytest.raises(GraftError) as ei:
        compose(["method=zzz"])
    assert "'zzz'" in str(ei.value) and "grpo" in str(ei.value)


@pytest.mark.parametrize("overrides, expected", [
    ([], "rollout"),                                          # tiny pair: HF engine, fp32, one epoch, top-p 1
    (["run.dtype=bfloat16"], "trainer"),                      # bf16 decode and full forward differ past float order
    (["algo.ppo_epochs=2"], "trainer"),
    (["rollout.top_p=0.9"], "trainer"),                       # the engine's log-probs are of the truncated dist.
    (["optim.autocast=bfloat16"], "trainer"),
    (["+rollout.engine_kwargs.autocast=bfloat16"], "trainer"),
    (["algo.old_logprobs=trainer"], "trainer"),               # explicit choices are kept
    (["algo.old_logprobs=rollout"], "rollout"),
])
def test_old_logprobs_auto_is_rollout_only_where_exact(overrides, expected):
    assert compose(overrides).algo.old_logprobs == expected


@pytest.mark.parametrize("pair", ["1", "2", "3", "saf_qwen3_4b"])
def test_real_pairs_keep_verls_recompute_and_the_full_forward(pair):
    """The GPU pairs (bf16, gradient checkpointing): auto resolves to verl's recompute and no shared prefix."""
    cfg = compose([f"pair={pair}", "method=grpo"])
    assert (cfg.algo.old_logprobs, cfg.optim.shared_prefix) == ("trainer", False)


def test_tandem_engine_resolves_to_trainer():
    assert compose(["method=tandem"]).algo.old_logprobs == "trainer"


def test_rollout_logprobs_with_top_p_are_refused_in_one_line():
    with pytest.raises(GraftError, match=r"config key 'algo.old_logprobs': rollout with rollout.top_p=0.9"):
        compose(["algo.old_logprobs=rollout", "rollout.top_p=0.9"])


@pytest.mark.parametrize("overrides, expected", [
    ([], True),
    (["optim.gradient_checkpointing=true"], False),
    (["optim.shared_prefix=false"], False),
    (["optim.shared_prefix=true"], True),
])
def test_shared_prefix_auto(overrides, expected):
    assert compose(overrides).optim.shared_prefix is expected


@pytest.mark.parametrize("overrides, key", [
    (["optim.shared_prefix=maybe"], "optim.shared_prefix"),
    (["optim.autocast=float16"], "optim.autocast"),
    (["+rollout.engine_kwargs.autocast=float16"], "rollout.engine_kwargs.autocast"),
])
def test_speed_option_errors_name_the_key(overrides, key):
    with pytest.raises(GraftError, match=f"config key '{key}'"):
        compose(overrides)


def test_resolved_choices_round_trip_through_the_run_config(tmp_path):
    """The run directory's config.yaml records what auto resolved to, and reads back the same."""
    from graft_cli.config import load_yaml, to_yaml

    cfg = compose([])
    p = tmp_path / "config.yaml"
    p.write_text(to_yaml(cfg))
    back = load_yaml(str(p))
    assert (back.algo.old_logprobs, back.optim.shared_prefix) == ("rollout", True)


@pytest.mark.parametrize("override, key", [
    ("optim.lr=inf", "optim.lr"), ("optim.lr=.nan", "optim.lr"), ("rollout.temperature=inf", "rollout.temperature"),
    ("algo.clip_high=inf", "algo.clip_high"), ("eval.top_p=.nan", "eval.top_p"), ("reward.timeout_s=inf",
                                                                                  "reward.timeout_s"),
])
def test_non_finite_floats_are_refused_at_validation(override, key):
    """inf passes every `> 0` range check: each float option is checked to be finite first."""
    with pytest.raises(GraftError, match=f"config key '{key}': must be a finite number"):
        compose([override])


def _every_method_config(tmp_path) -> list:
    """Every method file of experiments/method/ on the tiny pair (stored GRAFT with a partner run), and with a KL
    reference (algo.reference=initial) too."""
    part = tmp_path / "partner" / "rollouts" / "b"
    part.mkdir(parents=True)
    methods = sorted(f[:-5] for f in os.listdir(os.path.join(ROOT, "experiments", "method")) if f.endswith(".yaml"))
    extra = {"graft_stored": [f"exchange.params.partner_run={tmp_path / 'partner'}",
                              "exchange.params.partner_policy=b"]}
    out = []
    for m in methods:
        for more in ([], ["algo.reference=initial", "algo.kl_coef=0.001"]):
            out.append((m, compose([f"method={m}", *extra.get(m, []), *more])))
    return out


def test_validate_changes_nothing_and_resolve_is_idempotent(tmp_path):
    """compose = merge -> resolve -> validate: validating a composed config changes none of its values, and
    resolving it again changes nothing (a run directory's config.yaml reads back as itself)."""
    import copy

    from graft_cli.config import asdict, resolve, validate

    configs = _every_method_config(tmp_path)
    assert len(configs) >= 40
    for name, cfg in configs:
        before = asdict(cfg)
        validate(cfg)
        assert asdict(cfg) == before, name
        again = copy.deepcopy(cfg)
        resolve(again)
        assert asdict(again) == before, name


def test_stored_graft_resolves_its_partner_into_a_source_and_validate_leaves_the_policies(tmp_path):
    """graft_stored: resolve drops the partner from the trained policies (a rollout_log source in its place, no
    KL reference made for it); the exchange's validate reads the config without changing it."""
    from graft_cli.algorithms.exchange import EXCHANGES
    from graft_cli.config import asdict

    (tmp_path / "partner" / "rollouts" / "b").mkdir(parents=True)
    over = ["method=graft_stored", f"exchange.params.partner_run={tmp_path / 'partner'}",
            "exchange.params.partner_policy=b", "algo.reference=initial", "algo.kl_coef=0.001"]
    cfg = compose(over)
    assert [(p.name, p.role) for p in cfg.policies] == [("a", "train"), ("a_ref", "frozen")]
    assert [(s.name, s.kind, s.policy) for s in cfg.sources] == [("b", "rollout_log", "b")]
    assert cfg.exchange.params["receiver"] == "a"
    unresolved = compose(["method=graft_stored"] + over[1:3])
    unresolved.policies.append(type(unresolved.policies[0])(name="b", model="tiny:b"))
    unresolved.sources = []
    before = asdict(unresolved)
    EXCHANGES.get("graft_stored").validate(unresolved)
    assert asdict(unresolved) == before


@pytest.mark.parametrize("method, overrides", [
    ("graft", ["+rollout.engine_kwargs.rng=batch"]),
    ("grpo_opd", ["algo.token_adv_params.student_logprobs=rollout"]),
])
def test_a_stored_config_with_older_names_reads_resumes_and_is_named_as_before(tmp_path, method, overrides):
    """A run's config.yaml written when the rollout log-probs' choice value was `sampler` (algo.old_logprobs,
    exchange.params.peer_logprobs, algo.token_adv_params.student_logprobs) and the HF engine's rng layout was
    rollout.engine_kwargs.sampler reads back under the current names: the run resumes, and a report names its
    variant as it names the same run written now."""
    import yaml

    from graft_cli.config import asdict, load_yaml
    from graft_cli.report.runs import identify
    from graft_cli.train.run import check_resumable

    cfg = compose([f"method={method}", f"run.out={tmp_path}", "run.name=r", *overrides])
    assert cfg.algo.old_logprobs == "rollout"
    raw = asdict(cfg)
    raw["algo"]["old_logprobs"] = "sampler"
    if method == "graft":
        assert raw["exchange"]["params"]["peer_logprobs"] == "rollout"
        raw["exchange"]["params"]["peer_logprobs"] = "sampler"
        raw["rollout"]["engine_kwargs"] = {"sampler": "batch"}
    else:
        raw["algo"]["token_adv_params"]["student_logprobs"] = "sampler"
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(raw))
    back = load_yaml(str(run_dir / "config.yaml"))
    assert asdict(back) == asdict(cfg)
    check_resumable(cfg, str(run_dir))  # raises when the stored config differs
    assert identify(raw) == identify(asdict(cfg))
