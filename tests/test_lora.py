"""LoRA policies (graft_cli/models/lora.py): the adapted layer against its formula, the base untouched by training,
merged weights against the adapted model, the reference for free, config checks, and runs through `graft train`,
`graft export` and evaluation's loader."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import make_random_model, method_args, metric_rows, write_problems

from graft_cli.errors import GraftError
from graft_cli.models import lora
from graft_cli.models.logprobs import naive_logprobs, pack, response_logprobs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRAFT = [sys.executable, "-m", "graft_cli.cli"]


@pytest.fixture(scope="module")
def base_path(tmp_path_factory):
    return make_random_model(str(tmp_path_factory.mktemp("lora") / "a"), "qwen3", 0)


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _batch():
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 20, (5,), generator=g).tolist(), torch.randint(3, 20, (3,), generator=g).tolist()]
    responses = [torch.randint(3, 20, (6,), generator=g).tolist(), torch.randint(3, 20, (4,), generator=g).tolist()]
    return pack(prompts, responses, 0)


def _randomise_adapter(model, seed=1):
    """B = 0 at start makes every adapted model the base; tests that need a real adapter give B random values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def test_the_adapted_layer_is_w_x_plus_alpha_over_r_b_a_x(base_path):
    """One q_proj of the adapted model against the formula computed by hand from its A, B and W."""
    m = lora.wrap(_load(base_path), r=4, alpha=8.0, dropout=0.0, target_modules="all-linear", init="default")
    _randomise_adapter(m)
    layer = lora.unwrap(m).model.layers[0].self_attn.q_proj
    x = torch.randn(3, layer.in_features, generator=torch.Generator().manual_seed(2))
    W = layer.base_layer.weight
    A, B = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    by_hand = x @ W.T + (8.0 / 4) * (x @ A.T @ B.T)
    assert A.shape == (4, layer.in_features) and B.shape == (layer.out_features, 4)
    assert torch.allclose(layer(x), by_hand, atol=1e-6)


def test_b_zero_at_start_gives_the_base_log_probs_exactly(base_path):
    base, m = _load(base_path), lora.wrap(_load(base_path), 8, 16.0, 0.0, "all-linear", "default")
    ids, att, resp = _batch()
    with torch.no_grad():
        want, _ = response_logprobs(base, ids, att, resp)
        got, _ = response_logprobs(m, ids, att, resp)  # the chunked path through PEFT's wrapper
        full, _ = naive_logprobs(m, ids, att, resp)  # and the plain forward of the wrapper
    assert torch.equal(got, want)  # B A x is exactly 0: not a rounding apart
    assert torch.allclose(full, want, atol=1e-5)


def test_only_the_adapter_moves_in_a_step_and_the_optimizer_holds_only_it(base_path):
    m = lora.wrap(_load(base_path), 4, 16.0, 0.0, "all-linear", "default")
    params = lora.trainable_parameters(m)
    assert params and all(any(k in n for k in ("lora_A", "lora_B")) for n, p in m.named_parameters()
                          if p.requires_grad)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    opt = torch.optim.AdamW(params, lr=1e-2)
    ids, att, resp = _batch()
    lp, _ = response_logprobs(m, ids, att, resp)
    (-lp.sum()).backward()
    opt.step()
    moved = {n for n, p in m.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert moved and all(".lora_" in n for n in moved)
    assert any("lora_B" in n for n in moved)  # B leaves 0 after the first step (A alone gets no gradient at B = 0)
    assert sum(p.numel() for p in params) == sum(p.numel() for g in opt.param_groups for p in g["params"])


def test_merged_weights_give_the_adapted_models_logits_and_leave_it_unchanged(base_path):
    m = lora.wrap(_load(base_path), 4, 16.0, 0.0, "all-linear", "default")
    _randomise_adapter(m)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    merged = lora.merged_state_dict(m)
    fresh = _load(base_path)
    assert set(merged) == set(fresh.state_dict())  # the base model's own names, nothing of PEFT's
    fresh.load_state_dict(merged)
    ids, att, _ = _batch()
    with torch.no_grad():
        assert torch.allclose(fresh(input_ids=ids, attention_mask=att).logits,
                              m(input_ids=ids, attention_mask=att).logits, atol=1e-5)
        # PEFT's own merge agrees
        ref = lora.wrap(_load(base_path), 4, 16.0, 0.0, "all-linear", "default")
        ref.load_state_dict(m.state_dict())
        by_peft = ref.merge_and_unload().state_dict()
    assert all(torch.allclose(merged[k], by_peft[k], atol=1e-6) for k in merged)
    assert all(torch.equal(v, before[k]) for k, v in m.state_dict().items())


def test_the_adapter_disabled_is_the_base_model_exactly(base_path):
    base, m = _load(base_path), lora.wrap(_load(base_path), 4, 16.0, 0.0, "all-linear", "default")
    _randomise_adapter(m)
    m.train()
    ids, att, resp = _batch()
    with torch.no_grad():
        want, _ = response_logprobs(base, ids, att, resp)
        adapted, _ = response_logprobs(m, ids, att, resp)
        with lora.adapter_off(m):
            off, _ = response_logprobs(m, ids, att, resp)
    assert torch.equal(off, want)
    assert not torch.allclose(adapted, off)  # the adapter does change the model outside the context
    assert m.training  # the context leaves the policy's mode alone


def test_an_adapter_state_round_trips_and_a_mismatched_one_is_refused(base_path):
    m = lora.wrap(_load(base_path), 4, 16.0, 0.0, "all-linear", "default")
    _randomise_adapter(m)
    sd = {k: v.clone() for k, v in lora.adapter_state(m).items()}
    other = lora.wrap(_load(base_path), 4, 16.0, 0.0, "all-linear", "default")
    lora.load_adapter_state(other, sd)
    assert all(torch.equal(a, b) for a, b in zip(lora.adapter_state(other).values(), sd.values()))
    wider = lora.wrap(_load(base_path), 8, 16.0, 0.0, "all-linear", "default")
    with pytest.raises(ValueError, match="shape"):
        lora.load_adapter_state(wider, sd)
    fewer = lora.wrap(_load(base_path), 4, 16.0, 0.0, ["q_proj"], "default")
    with pytest.raises(ValueError, match="unexpected"):
        lora.load_adapter_state(fewer, sd)


def test_the_base_hash_is_the_base_models_weight_hash(base_path):
    from graft_cli.models.loading import weights_sha256

    m = lora.wrap(_load(base_path), 4, 16.0, 0.0, "all-linear", "default")
    _randomise_adapter(m)
    assert lora.base_sha256(m) == weights_sha256(_load(base_path))


@pytest.mark.parametrize("override,key", [
    ("policies.0.lora.r=-1", "policies.0.lora.r"),
    ("policies.0.lora.r=1.5", "policies.0.lora.r"),
    ("policies.0.lora.alpha=0", "policies.0.lora.alpha"),
    ("policies.0.lora.dropout=1.0", "policies.0.lora.dropout"),
    ("policies.0.lora.init=loftq", "policies.0.lora.init"),
    ("policies.0.lora.target_modules=[]", "policies.0.lora.target_modules"),
])
def test_bad_lora_options_are_one_line_naming_the_key(override, key):
    from graft_cli.config import compose

    pattern = re.escape(key).replace(r"policies\.0", r"policies(\.0|\[0\])")  # the schema's type check says [0]
    with pytest.raises(GraftError, match=f"config key '{pattern}'"):
        compose(["method=grpo", override])


def test_lora_is_for_trained_policies_and_base_of_names_a_lora_policy():
    from graft_cli.config import compose

    with pytest.raises(GraftError, match=r"config key 'policies.1.lora.r'.*role: train"):
        compose(["method=grpo", "policies=[{name: a, model: 'tiny:a'}, {name: r, model: 'tiny:a', role: frozen, "
                 "lora: {r: 4}}]"])
    with pytest.raises(GraftError, match=r"config key 'policies.1.base_of'.*not a trained policy with LoRA"):
        compose(["method=grpo", "policies=[{name: a, model: 'tiny:a'}, {name: r, model: 'tiny:a', role: frozen, "
                 "base_of: a}]"])


def test_the_kl_reference_of_a_lora_policy_is_its_base_not_a_copy():
    from graft_cli.config import compose

    full = compose(["method=grpo_kl"])
    adapted = compose(["method=grpo_kl", "+policies.0.lora.r=8"])
    ref_full = [p for p in full.policies if p.role == "frozen"]
    ref_lora = [p for p in adapted.policies if p.role == "frozen"]
    assert [(p.name, p.base_of) for p in ref_full] == [("a_ref", None), ("b_ref", None)]  # copies of the weights
    # a's reference is a's base (no copy), b (full weights) keeps its frozen copy
    assert [(p.name, p.base_of, p.column, p.serves) for p in ref_lora] == [("a_ref", "a", "ref_logprobs", ["a"]),
                                                                          ("b_ref", None, "ref_logprobs", ["b"])]
    assert adapted.policies[0].lora.r == 8 and adapted.policies[0].lora.alpha == 16.0


# ------------------------------------------------------------------------------------------- through the CLI
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora_cli")
    return {"a": make_random_model(str(d / "a"), "qwen3", 0, sft_steps=40),
            "b": make_random_model(str(d / "b"), "llama", 1, sft_steps=40),
            "data": write_problems(str(d / "train.jsonl")), "root": d}


def _train(w, out, steps, extra=()):
    pols = f"policies=[{{name: a, model: '{w['a']}', lora: {{r: 4}}}}, {{name: b, model: '{w['b']}', lora: {{r: 4}}}}]"
    cmd = GRAFT + ["train", "--method", "graft", "--steps", str(steps), "--no-progress", "--out", out, "--name", "r",
                   pols, f"data.train={w['data']}", "data.prompt_batch=4", "algo.minibatch_prompts=2", "rollout.n=4",
                   "rollout.max_new_tokens=10", "reward.num_workers=1", "run.save_every=2", "optim.lr=1e-2", *extra]
    res = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    return os.path.join(out, "r"), res


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


@pytest.mark.slow
def test_a_lora_graft_run_checkpoints_the_adapter_resumes_identical_and_exports(world, tmp_path):
    from safetensors.torch import load_file

    full, _ = _train(world, str(tmp_path / "full"), 4)
    half, _ = _train(world, str(tmp_path / "split"), 2)
    resumed, res = _train(world, str(tmp_path / "split"), 4)
    assert "resumed from step 2" in res.stderr
    assert _strip(metric_rows(resumed)) == _strip(metric_rows(full))
    ck = os.path.join(full, "checkpoints", "step_000004")
    for p in ("a", "b"):
        files = sorted(os.listdir(os.path.join(ck, p)))
        assert lora.ADAPTER_WEIGHTS in files and "model.safetensors" not in files  # the adapter only
        got, want = load_file(os.path.join(resumed, "checkpoints", "step_000004", p, lora.ADAPTER_WEIGHTS)), \
            load_file(os.path.join(ck, p, lora.ADAPTER_WEIGHTS))
        assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
        assert any(v.abs().max() > 0 for k, v in want.items() if "lora_B" in k)  # it trained
        st = json.load(open(os.path.join(ck, "state.json")))
        assert st["lora_base"][p] == lora.base_sha256(lora.wrap(_load(world[p]), 4, 16.0, 0.0, "all-linear",
                                                                "default"))

    # export: the PEFT folder, and --merge a plain model whose logits are the adapted model's
    out = str(tmp_path / "export")
    res = subprocess.run(GRAFT + ["export", full, "--out", out, "--policy", "a"], cwd=ROOT, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    assert lora.is_adapter_folder(os.path.join(out, "a")) and "optimizer.pt" not in os.listdir(os.path.join(out, "a"))
    res = subprocess.run(GRAFT + ["export", full, "--out", str(tmp_path / "merged"), "--policy", "a", "--merge"],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    merged = _load(str(tmp_path / "merged" / "a"))
    from peft import PeftModel

    from graft_cli.models.loading import load_model

    adapted = PeftModel.from_pretrained(_load(world["a"]), os.path.join(out, "a"))
    via_eval = load_model(os.path.join(ck, "a"), "float32", "cpu")  # what `graft eval --run` loads
    ids, att, _ = _batch()
    with torch.no_grad():
        want = adapted(input_ids=ids, attention_mask=att).logits
        assert torch.allclose(merged(input_ids=ids, attention_mask=att).logits, want, atol=1e-5)
        assert torch.allclose(via_eval(input_ids=ids, attention_mask=att).logits, want, atol=1e-5)


@pytest.mark.slow
def test_resuming_a_lora_run_on_another_base_is_refused(world, tmp_path):
    run, _ = _train(world, str(tmp_path / "x"), 2)
    st_path = os.path.join(run, "checkpoints", "step_000002", "state.json")
    st = json.load(open(st_path))
    assert set(st["lora_base"]) == {"a", "b"}
    # the same config on other base weights: a model folder of the same shapes, other values
    other = make_random_model(str(tmp_path / "a2"), "qwen3", 5)
    os.rename(world["a"], str(tmp_path / "a_saved"))
    os.rename(other, world["a"])
    try:
        pols = f"policies=[{{name: a, model: '{world['a']}', lora: {{r: 4}}}}, {{name: b, model: '{world['b']}', " \
               f"lora: {{r: 4}}}}]"
        cmd = GRAFT + ["train", "--method", "graft", "--steps", "4", "--no-progress", "--out", str(tmp_path / "x"),
                       "--name", "r", pols, f"data.train={world['data']}", "data.prompt_batch=4",
                       "algo.minibatch_prompts=2", "rollout.n=4", "rollout.max_new_tokens=10", "reward.num_workers=1",
                       "run.save_every=2", "optim.lr=1e-2"]
        res = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                             text=True)
    finally:
        os.rename(world["a"], other)
        os.rename(str(tmp_path / "a_saved"), world["a"])
    assert res.returncode != 0
    assert "LoRA adapter was trained on another base model" in res.stderr


def _pol(w, name, r=4):
    return f"{{name: {name}, model: '{w[name]}', lora: {{r: {r}}}}}"


def _method_args(w, method):
    return method_args(method, _pol(w, "a"), _pol(w, "b"), w["a"], w["b"], w.get("partner"))


def _run(w, out, method, steps=2, args=None):
    cmd = GRAFT + ["train", "--method", method, "--steps", str(steps), "--no-progress", "--out", out, "--name", "r",
                   f"data.train={w['data']}", "data.prompt_batch=4", "algo.minibatch_prompts=2", "rollout.n=4",
                   "rollout.max_new_tokens=10", "reward.num_workers=1", "run.save_every=2", "optim.lr=1e-2",
                   *(args if args is not None else _method_args(w, method))]
    return subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["grpo", "grpo_kl", "grpo_dapo", "graft", "graft_stored", "hacpo", "sgt", "saf",
                                    "grpo_opd", "opd_only", "tandem"])
def test_every_method_trains_two_steps_with_lora(world, tmp_path, method):
    """Every trained policy of the method is adapted (its checkpoint an adapter folder, its base unchanged); where
    the method has a KL reference (the initial policy: the adapter disabled), the KL at step 1 is exactly 0."""
    if method == "graft_stored" and "partner" not in world:
        res = _run(world, str(world["root"] / "partner"), "grpo", args=_method_args(world, "graft"))  # a and b
        assert res.returncode == 0, res.stderr[-3000:]
        world["partner"] = str(world["root"] / "partner" / "r")
    res = _run(world, str(tmp_path / "runs"), method)
    assert res.returncode == 0, res.stderr[-3000:]
    run = str(tmp_path / "runs" / "r")
    ck = os.path.join(run, "checkpoints", "step_000002")
    trained = [d for d in sorted(os.listdir(ck)) if os.path.isdir(os.path.join(ck, d))]
    assert trained and all(lora.is_adapter_folder(os.path.join(ck, d)) for d in trained)
    state = json.load(open(os.path.join(ck, "state.json")))
    assert set(state["lora_base"]) == set(trained)
    rows = metric_rows(run)
    assert sorted({r["step"] for r in rows}) == [1, 2]
    if method in ("grpo_kl", "hacpo"):  # a KL term to the initial policy: the base, the adapter disabled
        cfg = yaml.safe_load(open(os.path.join(run, "config.yaml")))
        assert [(p["name"], p["base_of"]) for p in cfg["policies"] if p["role"] == "frozen"] == \
            [("a_ref", "a"), ("b_ref", "b")]  # no second copy of the weights
        # the same run with the references as frozen copies of the base weights: the same numbers, KL included
        copies = ", ".join(f"{{name: {n}_ref, model: '{world[n]}', role: frozen, serves: [{n}], column: ref_logprobs}}"
                           for n in ("a", "b"))
        args = [f"policies=[{_pol(world, 'a')}, {_pol(world, 'b')}, {copies}]"] + _method_args(world, method)[1:]
        res = _run(world, str(tmp_path / "copies"), method, args=args)
        assert res.returncode == 0, res.stderr[-3000:]
        other = metric_rows(str(tmp_path / "copies" / "r"))
        assert any(r["kl"] != 0.0 for r in rows)  # the adapters moved away from their bases within the run
        assert [{k: v for k, v in r.items() if not k.startswith(("time/", "memory/"))} for r in other] == \
            [{k: v for k, v in r.items() if not k.startswith(("time/", "memory/"))} for r in rows]


def test_plan_resources_counts_the_adapter_parameters_peft_makes():
    """benchmarks/plan_resources.py's LoRA parameter count against PEFT's on a Qwen3 of the same dimensions."""
    import importlib.util

    from transformers import Qwen3Config, Qwen3ForCausalLM

    spec = importlib.util.spec_from_file_location("plan_resources_lora", os.path.join(ROOT, "benchmarks",
                                                                                      "plan_resources.py"))
    pr = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = pr
    spec.loader.exec_module(pr)
    cfg = Qwen3Config(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=24, tie_word_embeddings=True)
    m = lora.wrap(Qwen3ForCausalLM(cfg), 4, 16.0, 0.0, "all-linear", "default")
    shape = pr.Shape("q", 3, 64, 4, 2, 24, 96, 97, True)
    assert shape.lora_params(4) == sum(p.numel() for p in lora.trainable_parameters(m))
    full = pr.plan(pr.RUNS[0], 2, 80.0, 32768, 4096, 1, 64)
    with_lora = pr.plan(pr.RUNS[0], 2, 80.0, 32768, 4096, 1, 64, lora_r=16)
    adapters = sum(pr.SHAPES[n].lora_params(16) for n in pr.RUNS[0].trained)
    assert with_lora["states"] == pytest.approx((2 * full["trained_B"] * 1e9 + 16 * adapters) / 2 / pr.GB)
    assert with_lora["activations"] == full["activations"] and with_lora["engine"] == full["engine"]


def test_gradient_checkpointing_with_a_frozen_base_still_trains_the_adapter(base_path):
    """What build_policy does with optim.gradient_checkpointing: the checkpointed blocks of a frozen base pass the
    gradient back to the adapters (enable_input_require_grads); the gradients equal those without checkpointing."""
    grads = []
    for ckpt in (False, True):
        model = _load(base_path)
        if ckpt:
            model.gradient_checkpointing_enable()
            model.enable_input_require_grads()
        torch.manual_seed(0)  # the same A (PEFT draws it from the global generator)
        m = lora.wrap(model, 4, 16.0, 0.0, "all-linear", "default")
        _randomise_adapter(m)
        m.train()
        ids, att, resp = _batch()
        lp, _ = response_logprobs(m, ids, att, resp)
        (-lp.sum()).backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.requires_grad})
    assert all(float(g.abs().max()) > 0 for g in grads[1].values())  # A and B both get gradients (B is not 0)
    assert len(grads[1]) == len(grads[0]) and all(torch.allclose(grads[0][n], grads[1][n], atol=1e-6) for n in grads[0])
