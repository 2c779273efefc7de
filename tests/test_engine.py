"""The transformers rollout engine and the trainer's log-prob computation, on small random models.

References are written here: per-row full forward passes without any padding, then
log_softmax(logits / T) and a gather (never the engine's or the trainer's own code path).
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_top_k_sampling, make_char_tokenizer, make_random_model

from graft_cli.models.logprobs import naive_logprobs, pack, response_logprobs
from graft_cli.rollout.engine import SamplingParams
from graft_cli.rollout.hf import HFEngine, processed_logprobs, top_k_filter, top_p_filter

EOS = 1  # the char tokenizer's <eos>
PAD = 0


@pytest.fixture(scope="module")
def model_paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("engine_models")
    return {"qwen3": make_random_model(str(d / "q"), "qwen3", seed=0),
            "llama": make_random_model(str(d / "l"), "llama", seed=1)}


def load(path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tok():
    return make_char_tokenizer()


@pytest.fixture(scope="module")
def prompts(tok):
    # different lengths so the engine's left padding and the trainer's right padding both matter
    return [tok(t)["input_ids"] for t in ("1+2=", "What is 12 times 7? ", "x")]


def ref_logprobs(model, prompt: list[int], response: list[int], temperature: float = 1.0) -> torch.Tensor:
    """log π(response_t | prompt, response_<t) at temperature T, one unpadded row at a time."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    lp = torch.log_softmax(logits[len(prompt) - 1 : -1] / temperature, -1)
    return lp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def trainer_rows(model, prompt_rows, responses, temperature):
    """The trainer's log-probs (right-padded pack + response_logprobs), cut back to one list per row."""
    ids, att, resp = pack(prompt_rows, responses, PAD)
    with torch.no_grad():
        lp, _ = response_logprobs(model, ids, att, resp, temperature, chunk_tokens=7)
    return [lp[i, len(p) - 1 : len(p) - 1 + len(r)] for i, (p, r) in enumerate(zip(prompt_rows, responses))]


def with_eos_bias(model, bias: float):
    """Give the (tied) LM head a bias that shifts the EOS logit by ``bias``."""
    head = model.get_output_embeddings()
    new = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    new.weight = head.weight
    with torch.no_grad():
        new.bias.zero_()
        new.bias[EOS] = bias
    model.lm_head = new
    return model


# --- order, shape, seeds -------------------------------------------------------------------------------------
def test_prompt_major_order_and_shape(model_paths, tok, prompts):
    model = load(model_paths["qwen3"])
    eng = HFEngine(model, tok, max_batch=4)  # 9 rows in micro-batches of 4, 4, 1
    n = 3
    ro = eng.generate(prompts, SamplingParams(n=n, temperature=1.0, top_p=1.0, max_new_tokens=6, seed=0))
    assert ro.n == n and ro.num_prompts == 3 and len(ro) == 9
    assert ro.prompt_ids == prompts
    assert len(ro.texts) == len(ro.logprobs) == len(ro.truncated) == 9
    for ids, lps, text in zip(ro.response_ids, ro.logprobs, ro.texts):
        assert 1 <= len(ids) <= 6 and len(lps) == len(ids)
        assert text == tok.decode(ids, skip_special_tokens=True)
    # greedy decoding: the n rows of a prompt are identical and equal that prompt's greedy answer alone
    g = eng.generate(prompts, SamplingParams(n=n, temperature=0.0, max_new_tokens=6, seed=0))
    for i, p in enumerate(prompts):
        rows = g.response_ids[i * n : (i + 1) * n]
        assert rows == [rows[0]] * n
        alone = eng.generate([p], SamplingParams(n=1, temperature=0.0, max_new_tokens=6, seed=0))
        assert alone.response_ids[0] == rows[0]
    assert model.training is False


def test_seeds(model_paths, tok, prompts):
    eng = HFEngine(load(model_paths["qwen3"]), tok)
    sp = {"n": 4, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 8}
    a = eng.generate(prompts, SamplingParams(seed=11, **sp))
    b = eng.generate(prompts, SamplingParams(seed=11, **sp))
    c = eng.generate(prompts, SamplingParams(seed=12, **sp))
    assert a.response_ids == b.response_ids and a.logprobs == b.logprobs
    assert a.response_ids != c.response_ids
    # the global RNG is not used
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    eng.generate(prompts, SamplingParams(seed=11, **sp))
    assert torch.equal(torch.rand(1), before)


# --- log-probs: engine (left padding, KV cache) == trainer (right padding) == unpadded reference ----------
@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_logprobs_match_trainer(model_paths, tok, prompts, arch, temperature):
    model = load(model_paths[arch])
    eng = HFEngine(model, tok)
    n = 3
    ro = eng.generate(prompts, SamplingParams(n=n, temperature=temperature, top_p=1.0, max_new_tokens=10, seed=3))
    prompt_rows = [prompts[i // n] for i in range(len(ro))]
    train = trainer_rows(model, prompt_rows, ro.response_ids, temperature)
    for i, (p, r, lps) in enumerate(zip(prompt_rows, ro.response_ids, ro.logprobs)):
        eng_lp = torch.tensor(lps, dtype=torch.float64)
        assert torch.allclose(eng_lp, train[i].double(), atol=1e-4), (i, lps, train[i].tolist())
        assert torch.allclose(eng_lp, ref_logprobs(model, p, r, temperature), atol=1e-4), i


def test_temperature_scales_logits_before_log_softmax(model_paths, tok, prompts):
    model = load(model_paths["qwen3"])
    eng = HFEngine(model, tok)
    T = 0.5
    ro = eng.generate(prompts[:2], SamplingParams(n=2, temperature=T, top_p=1.0, max_new_tokens=8, seed=5))
    for i, (r, lps) in enumerate(zip(ro.response_ids, ro.logprobs)):
        p = prompts[i // 2]
        ids = torch.tensor([p + r])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(p) - 1 : -1].double()
        tgt = torch.tensor(r)[:, None]
        want_T = torch.log_softmax(logits / T, -1).gather(-1, tgt).squeeze(-1)
        at_1 = torch.log_softmax(logits, -1).gather(-1, tgt).squeeze(-1)
        got = torch.tensor(lps, dtype=torch.float64)
        assert torch.allclose(got, want_T, atol=1e-4)
        assert not torch.allclose(got, at_1, atol=1e-3)  # it is not the T = 1 distribution


def test_top_p_logprobs_are_of_the_renormalised_nucleus(model_paths, tok, prompts):
    model = load(model_paths["qwen3"])
    eng = HFEngine(model, tok)
    ro = eng.generate(prompts, SamplingParams(n=2, temperature=1.0, top_p=0.5, max_new_tokens=6, seed=0))
    for i, (r, lps) in enumerate(zip(ro.response_ids, ro.logprobs)):
        full = ref_logprobs(model, prompts[i // 2], r, 1.0)
        # renormalising over a nucleus of mass >= 0.5 raises each log-prob by at most ln 2
        diff = torch.tensor(lps, dtype=torch.float64) - full
        assert bool((diff >= -1e-5).all()) and bool((diff <= math.log(2) + 1e-5).all()), diff


@pytest.mark.parametrize("rng", ["per_row", "batch"])
def test_top_k_samples_within_the_k_most_likely_with_renormalised_logprobs(model_paths, tok, prompts, rng):
    model = load(model_paths["qwen3"])
    eng = HFEngine(model, tok, rng=rng)
    ro = eng.generate(prompts, SamplingParams(n=3, temperature=0.7, top_k=3, max_new_tokens=6, seed=0))
    assert_top_k_sampling(model, prompts, ro, k=3, temperature=0.7, atol=1e-4)
    # top-k 1 is greedy decoding (each log-prob 0)
    ro1 = eng.generate(prompts, SamplingParams(n=2, temperature=1.0, top_k=1, max_new_tokens=6, seed=1))
    ro0 = eng.generate(prompts, SamplingParams(n=1, temperature=0.0, max_new_tokens=6, seed=1))
    assert ro1.response_ids == [x for x in ro0.response_ids for _ in range(2)]
    assert all(abs(v) < 1e-6 for lp in ro1.logprobs for v in lp)


# --- EOS and truncation -----------------------------------------------------------------------------------
def _check_eos_contract(ro, max_new):
    for ids, trunc in zip(ro.response_ids, ro.truncated):
        if trunc:
            assert len(ids) == max_new and EOS not in ids
        else:
            assert ids[-1] == EOS and EOS not in ids[:-1] and len(ids) <= max_new


def test_eos_stops_a_row_and_truncated_flag(model_paths, tok, prompts):
    model = with_eos_bias(load(model_paths["qwen3"]), 3.0)  # EOS about 1 in 6 per step
    eng = HFEngine(model, tok)
    max_new = 10
    ro = eng.generate(prompts, SamplingParams(n=8, temperature=1.0, max_new_tokens=max_new, seed=0))
    _check_eos_contract(ro, max_new)
    assert any(ro.truncated) and not all(ro.truncated)  # both kinds occur
    assert any(ids[-1] == EOS and len(ids) < max_new for ids in ro.response_ids)
    # the EOS token's log-prob is kept with the response and matches the trainer's
    prompt_rows = [prompts[i // 8] for i in range(len(ro))]
    train = trainer_rows(model, prompt_rows, ro.response_ids, 1.0)
    for i, lps in enumerate(ro.logprobs):
        assert torch.allclose(torch.tensor(lps), train[i], atol=1e-4)


def test_certain_eos_gives_one_token_responses(model_paths, tok, prompts):
    eng = HFEngine(with_eos_bias(load(model_paths["qwen3"]), 40.0), tok)
    ro = eng.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=5, seed=0))
    assert ro.response_ids == [[EOS]] * 6
    assert ro.truncated == [False] * 6
    assert ro.texts == [""] * 6
    assert all(abs(lp[0]) < 1e-6 for lp in ro.logprobs)


def test_impossible_eos_truncates_every_row(model_paths, tok, prompts):
    eng = HFEngine(with_eos_bias(load(model_paths["qwen3"]), -40.0), tok)
    ro = eng.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=5, seed=0))
    assert ro.truncated == [True] * 6
    assert all(len(ids) == 5 and EOS not in ids for ids in ro.response_ids)


# --- top_p_filter on a hand example -----------------------------------------------------------------------
def test_top_p_filter_hand():
    # probabilities by token: (0.15, 0.5, 0.05, 0.3); sorted: 0.5 (t1), 0.3 (t3), 0.15 (t0), 0.05 (t2)
    # mass before each sorted token: 0, 0.5, 0.8, 0.95. A token is kept while that mass is < top_p.
    #   top_p 0.45 -> {t1}          top_p 0.75 -> {t1, t3}
    #   top_p 0.9  -> {t1, t3, t0}  top_p 1.0 -> everything (unchanged)
    logits = torch.log(torch.tensor([[0.15, 0.5, 0.05, 0.3]]))
    ninf = float("-inf")
    for top_p, keep in [(0.45, [1]), (0.75, [1, 3]), (0.9, [0, 1, 3])]:
        got = top_p_filter(logits.clone(), top_p)
        want = torch.full_like(logits, ninf)
        want[0, keep] = logits[0, keep]
        assert torch.equal(got, want), (top_p, got)
    assert torch.equal(top_p_filter(logits.clone(), 1.0), logits)
    # a batch: rows are filtered independently; a near-one-hot row keeps only its top token even at 0.99
    batch = torch.log(torch.tensor([[0.15, 0.5, 0.05, 0.3], [0.996, 0.002, 0.001, 0.001]]))
    got = top_p_filter(batch, 0.75)
    assert torch.isfinite(got).tolist() == [[False, True, False, True], [True, False, False, False]]
    # the kept probabilities renormalise to 0.5/0.8 and 0.3/0.8
    probs = got[0].softmax(-1)
    assert torch.allclose(probs, torch.tensor([0.0, 0.625, 0.0, 0.375]), atol=1e-6)


def test_top_k_filter_and_its_order_before_top_p_by_hand():
    ninf = float("-inf")
    # probabilities (0.15, 0.5, 0.05, 0.3): top-2 keeps t1, t3; ties with the k-th are kept (transformers, vLLM)
    logits = torch.log(torch.tensor([[0.15, 0.5, 0.05, 0.3]]))
    assert torch.isfinite(top_k_filter(logits, 2)).tolist() == [[False, True, False, True]]
    assert torch.isfinite(top_k_filter(torch.tensor([[2.0, 1.0, 2.0, 0.0]]), 1)).tolist() == [[True, False, True,
                                                                                              False]]
    assert torch.equal(top_k_filter(logits, 0), logits) and torch.equal(top_k_filter(logits, 4), logits)
    # top-k 3 then top-p 0.83: the top 3 renormalise to (0.5, 0.3, 0.15)/0.95 = 0.526, 0.316, 0.158; the mass before
    # t0 is then 0.842 >= 0.83, so t0 goes (top-p alone keeps it: mass before it 0.8 < 0.83)
    lp = processed_logprobs(logits, SamplingParams(temperature=1.0, top_p=0.83, top_k=3))
    assert torch.allclose(lp.exp(), torch.tensor([[0.0, 0.625, 0.0, 0.375]]), atol=1e-6) and lp[0, 2] == ninf
    only_p = processed_logprobs(logits, SamplingParams(temperature=1.0, top_p=0.83))
    assert torch.allclose(only_p.exp(), torch.tensor([[0.15, 0.5, 0.0, 0.3]]) / 0.95, atol=1e-6)


def test_vllm_sampling_params_carry_top_k(monkeypatch):
    """The vLLM engine's SamplingParams (a stub ``vllm`` module records them; the real engine: test_vllm_engine.py):
    top_k k >= 1 as given, 0 (off) as vLLM's -1, greedy rows -1."""
    import sys
    import types

    from graft_cli.rollout.vllm import VLLMEngine

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=lambda **kw: kw))
    eng = object.__new__(VLLMEngine)
    eng.eos_ids = [EOS]
    got = eng._params(SamplingParams(n=8, temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=30), seed=3)
    assert (got["n"], got["temperature"], got["top_p"], got["top_k"], got["max_tokens"], got["seed"]) == (
        8, 0.7, 0.8, 20, 30, 3)
    assert eng._params(SamplingParams(temperature=0.7), None)["top_k"] == -1
    assert eng._params(SamplingParams(temperature=0.0, top_k=20), None)["top_k"] == -1


# --- response_logprobs (chunked, checkpointed) == naive_logprobs, values and gradients ----------------------
@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_response_logprobs_matches_naive_values_and_grads(model_paths, arch):
    model = load(model_paths[arch])
    model.train()  # dropout is 0 in these configs; train mode exercises the grad path
    prompts_ = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14]]
    responses = [[20, 21, 22, 23], [30, 31, 32, 33, 34, 35, 1], [40]]
    ids, att, resp = pack(prompts_, responses, PAD)
    T = 0.8
    coef = torch.linspace(-1.0, 2.0, ids.shape[1] - 1).expand(ids.shape[0], -1)

    def run(fn, **kw):
        model.zero_grad(set_to_none=True)
        lp, ent = fn(model, ids, att, resp, T, with_entropy=True, **kw)
        (lp * coef).sum().backward()
        grads = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
        return lp.detach(), ent.detach(), grads

    lp_c, ent_c, g_c = run(response_logprobs, chunk_tokens=3)  # 12 response tokens -> 4 checkpointed chunks
    lp_n, ent_n, g_n = run(naive_logprobs)
    assert torch.allclose(lp_c, lp_n, atol=1e-5)
    assert torch.allclose(ent_c, ent_n, atol=1e-5)
    assert g_c.keys() == g_n.keys() and len(g_c) > 0
    for k in g_c:
        assert torch.allclose(g_c[k], g_n[k], atol=1e-5), k
    # zero outside the response positions; the values equal the unpadded reference
    m = resp[:, 1:].bool()
    assert bool((lp_c[~m] == 0).all())
    for i, (p, r) in enumerate(zip(prompts_, responses)):
        model.eval()
        want = ref_logprobs(model, p, r, T)
        assert torch.allclose(lp_c[i, len(p) - 1 : len(p) - 1 + len(r)].double(), want, atol=1e-5)
    # no grad: the plain (non-checkpointed) path gives the same numbers
    with torch.no_grad():
        lp_ng, _ = response_logprobs(model, ids, att, resp, T, chunk_tokens=5)
    assert torch.allclose(lp_ng, lp_c, atol=1e-5)
