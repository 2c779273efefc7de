"""The vLLM engine on CPU (vllm-cpu, in its own venv: `make test-vllm`), against the engine protocol and the
trainer's log-probs. Skipped where vLLM is not installed (the main venv).

Tolerances: fp32 on CPU, vLLM's CPU attention kernels vs the trainer's SDPA forward: per-token log-probs agree
within 1e-4 (measured: ~1e-6; the max |diff| is printed with -s).
"""

from __future__ import annotations

import math
import os

import pytest
import torch

pytest.importorskip("vllm")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from conftest import assert_top_k_sampling, make_char_tokenizer  # noqa: E402

from graft_cli.models.logprobs import pack, response_logprobs  # noqa: E402
from graft_cli.rollout import ENGINES  # noqa: E402
from graft_cli.rollout.engine import SamplingParams  # noqa: E402

pytestmark = pytest.mark.vllm
EOS, PAD = 1, 0
TOL = 1e-4
H = 128  # head_dim 32: vLLM's CPU attention has no kernel for head_dim 16


def make_untied_llama(path: str, seed: int = 0):
    """A 2-layer Llama with an untied LM head and a constant residual coordinate 0 (embedding column 0 = 10):
    the final hidden state's coordinate 0 is then ~sqrt(H) for every position, so ``lm_head[EOS, 0]`` acts
    as an EOS logit bias that weight pushes can turn up or down."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = make_char_tokenizer()
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=H, intermediate_size=2 * H, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, bos_token_id=None,
                      eos_token_id=EOS, pad_token_id=PAD, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 10.0
        model.lm_head.weight[:, 0] = 0.0
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def set_eos_bias(model, bias: float):
    with torch.no_grad():
        model.lm_head.weight[EOS, 0] = bias / math.sqrt(H)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = make_untied_llama(str(tmp_path_factory.mktemp("vllm_model") / "m"))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = make_char_tokenizer()
    eng = ENGINES.get("vllm")(model, tok, max_batch=64, max_model_len=128)
    prompts = [tok(t)["input_ids"] for t in ("1+2=", "What is 12 times 7? ", "x")]
    return model, tok, eng, prompts


def trainer_rows(model, prompt_rows, responses, temperature):
    ids, att, resp = pack(prompt_rows, responses, PAD)
    with torch.no_grad():
        lp, _ = response_logprobs(model, ids, att, resp, temperature, chunk_tokens=64)
    return [lp[i, len(p) - 1 : len(p) - 1 + len(r)] for i, (p, r) in enumerate(zip(prompt_rows, responses))]


def check_eos_contract(ro, max_new):
    for ids, trunc in zip(ro.response_ids, ro.truncated):
        if trunc:
            assert len(ids) == max_new and EOS not in ids
        else:
            assert ids[-1] == EOS and EOS not in ids[:-1] and len(ids) <= max_new


def max_gap(model, ro, prompts, temperature):
    n = ro.n
    rows = [prompts[i // n] for i in range(len(ro))]
    train = trainer_rows(model, rows, ro.response_ids, temperature)
    return max(float((torch.tensor(lp, dtype=torch.float64) - t.double()).abs().max())
               for lp, t in zip(ro.logprobs, train))


def test_protocol_shapes_order_and_greedy(setup):
    model, tok, eng, prompts = setup
    ro = eng.generate(prompts, SamplingParams(n=3, temperature=1.0, top_p=1.0, max_new_tokens=6, seed=0))
    assert ro.n == 3 and ro.num_prompts == 3 and len(ro) == 9 and ro.prompt_ids == prompts
    assert len(ro.texts) == len(ro.logprobs) == len(ro.truncated) == 9
    for ids, lps, text in zip(ro.response_ids, ro.logprobs, ro.texts):
        assert 1 <= len(ids) <= 6 and len(lps) == len(ids)
        assert text == tok.decode(ids, skip_special_tokens=True)
    check_eos_contract(ro, 6)
    # prompt-major: greedy rows of a prompt are identical and equal that prompt's greedy answer alone
    g = eng.generate(prompts, SamplingParams(n=3, temperature=0.0, max_new_tokens=6, seed=0))
    for i, p in enumerate(prompts):
        rows = g.response_ids[i * 3 : (i + 1) * 3]
        assert rows == [rows[0]] * 3
        alone = eng.generate([p], SamplingParams(n=1, temperature=0.0, max_new_tokens=6, seed=0))
        assert alone.response_ids[0] == rows[0]


def test_seeds_per_call(setup):
    _, _, eng, prompts = setup
    sp = {"n": 4, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 8}
    a = eng.generate(prompts, SamplingParams(seed=11, **sp))
    eng.generate(prompts, SamplingParams(seed=99, **sp))  # an unrelated call in between
    b = eng.generate(prompts, SamplingParams(seed=11, **sp))
    c = eng.generate(prompts, SamplingParams(seed=12, **sp))
    assert a.response_ids == b.response_ids
    assert a.response_ids != c.response_ids
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    eng.generate(prompts, SamplingParams(seed=11, **sp))
    assert torch.equal(torch.rand(1), before)  # the caller's RNG is untouched


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_trainer(setup, temperature):
    model, _, eng, prompts = setup
    ro = eng.generate(prompts, SamplingParams(n=4, temperature=temperature, max_new_tokens=12, seed=3))
    gap = max_gap(model, ro, prompts, temperature)
    print(f"vLLM-CPU vs trainer log-prob max |diff| at T={temperature}: {gap:.2e}")
    assert gap < TOL


def test_top_k_samples_within_the_k_most_likely_with_renormalised_logprobs(setup):
    """top_k reaches vLLM's SamplingParams: every token is among the 3 most likely and its processed log-prob is
    the softmax over those 3 (the HF engine's tests/test_engine.py twin)."""
    model, _, eng, prompts = setup
    ro = eng.generate(prompts, SamplingParams(n=3, temperature=0.7, top_k=3, max_new_tokens=6, seed=0))
    assert_top_k_sampling(model, prompts, ro, k=3, temperature=0.7, atol=TOL)


def test_weight_push_changes_samples_eos_and_truncation(setup):
    model, _, eng, prompts = setup
    sp = SamplingParams(n=8, temperature=1.0, max_new_tokens=10, seed=5)
    base = eng.generate(prompts, sp)
    try:
        set_eos_bias(model, 40.0)  # EOS certain
        eng.sync_weights(model)
        ro = eng.generate(prompts, sp)
        assert ro.response_ids == [[EOS]] * 24 and ro.truncated == [False] * 24 and ro.texts == [""] * 24
        assert all(abs(lp[0]) < 1e-4 for lp in ro.logprobs)
        set_eos_bias(model, -40.0)  # EOS impossible: every row truncated
        eng.sync_weights(model)
        ro = eng.generate(prompts, sp)
        assert ro.truncated == [True] * 24 and all(len(x) == 10 and EOS not in x for x in ro.response_ids)
        set_eos_bias(model, 3.5)  # both kinds; the EOS token's log-prob is kept and matches the trainer's
        eng.weight_sync = "disk"  # the save_pretrained + reload_weights(weights_path) path
        eng.sync_weights(model)
        ro = eng.generate(prompts, sp)
        check_eos_contract(ro, 10)
        assert any(ro.truncated) and not all(ro.truncated)
        assert max_gap(model, ro, prompts, 1.0) < TOL
    finally:
        eng.weight_sync = "iterator"
        set_eos_bias(model, 0.0)
        eng.sync_weights(model)
    assert eng.generate(prompts, sp).response_ids == base.response_ids  # the original weights are back


def vllm_trainer(tmp_path, extra=()):
    """A GRPO trainer of one policy on ``rollout.engine=vllm`` (built from the config like any engine), the parity
    reward, CPU."""
    from conftest import register_parity_reward, train_overrides, write_problems

    from graft_cli import config as C
    from graft_cli.train.loop import Trainer

    register_parity_reward()
    path = make_untied_llama(str(tmp_path / "m"), seed=1)
    data = write_problems(str(tmp_path / "train.jsonl"))
    cfg = C.compose(train_overrides({"a": path}, data, str(tmp_path / "runs"),
                                    ["rollout.engine=vllm", "+rollout.engine_kwargs.max_model_len=128",
                                     "algo.is_correction=token", "reward.name=first_char_parity", "run.device=cpu",
                                     "run.log_rollouts=false", *extra]))
    return Trainer(cfg, str(tmp_path / "runs" / "x"), progress=False)


def test_trainer_steps_with_vllm_engine(tmp_path):
    """Two GRPO steps through the trainer with ``rollout.engine=vllm``: the weights are pushed after each update, so
    the engine's log-probs stay within TOL of the trainer's recomputation at step 2 although the update moved the
    policy; the IS metrics are logged (ratio ~ 1)."""
    tr = vllm_trainer(tmp_path, ["optim.lr=3e-3"])
    before = {k: v.clone() for k, v in tr.policies["a"].model.state_dict().items()}
    rows = [tr.train_step()[0], tr.train_step()[0]]
    tr.close()
    moved = max(float((v - before[k]).abs().max()) for k, v in tr.policies["a"].model.state_dict().items())
    assert moved > 1e-3 and min(r["grad_norm"] for r in rows) > 0
    for r in rows:
        lo, hi = r["sampling/importance_sampling_ratio/min"], r["sampling/importance_sampling_ratio/max"]
        print(f"step {r['step']}: logp diff max {r['sampling/sampling_logp_difference/max']:.2e}, "
              f"IS ratio {lo:.6f}..{hi:.6f}, grad_norm {r['grad_norm']:.3g}")
        assert r["sampling/sampling_logp_difference/max"] < TOL
        assert abs(r["sampling/importance_sampling_ratio/mean"] - 1.0) < 1e-3
