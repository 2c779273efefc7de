"""Memory-lean loss path: the chunked, checkpointed LM-head log-probs (models/logprobs.py) equal the naive
full-logits reference in bf16 (and in fp32 with gradient checkpointing on; fp32 without it is covered in
tests/test_engine.py), values and gradients; ``optim.gradient_checkpointing`` really recomputes the layers.

Tolerances: fp32 1e-5 absolute. bf16: log-probs 2e-2 absolute (bf16 has ~3 significant digits; both paths
run the same bf16 matmuls and a fp32 log-softmax), gradients 2e-2 relative (‖g − g_ref‖ / ‖g_ref‖ per tensor).
"""

from __future__ import annotations

import copy

import pytest
import torch

from graft_cli.models.logprobs import naive_logprobs, pack, response_logprobs


def _model(dtype):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, max_position_embeddings=128, tie_word_embeddings=True)
    return Qwen3ForCausalLM(cfg).to(dtype).train()


def _run(model, fn, ids, att, resp, coef, **kw):
    model.zero_grad(set_to_none=True)
    lp, _ = fn(model, ids, att, resp, 0.8, **kw)
    (lp * coef).sum().backward()
    return lp.detach().float(), {k: p.grad.detach().float().clone() for k, p in model.named_parameters()}


@pytest.mark.parametrize("dtype,checkpointing", [(torch.bfloat16, False), (torch.bfloat16, True),
                                                 (torch.float32, True)])
def test_chunked_checkpointed_equals_naive(dtype, checkpointing):
    ref_model = _model(dtype)
    model = copy.deepcopy(ref_model)
    calls = []
    mlp = model.model.layers[0].mlp
    mlp_forward = mlp.forward  # counted by wrapping forward (module hooks do not fire in the recompute)
    mlp.forward = lambda *a, **k: calls.append(1) or mlp_forward(*a, **k)
    if checkpointing:
        model.gradient_checkpointing_enable()  # what build_policy calls (optim.gradient_checkpointing)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14]]
    responses = [[20, 21, 22, 23], [30, 31, 32, 33, 34, 35, 1], [40]]
    ids, att, resp = pack(prompts, responses, 0)
    coef = torch.linspace(-1.0, 2.0, ids.shape[1] - 1).expand(ids.shape[0], -1)
    lp_c, g_c = _run(model, response_logprobs, ids, att, resp, coef, chunk_tokens=3)
    lp_n, g_n = _run(ref_model, naive_logprobs, ids, att, resp, coef)
    assert len(calls) == (2 if checkpointing else 1)  # the layer is recomputed in backward
    atol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(lp_c, lp_n, atol=atol), (lp_c - lp_n).abs().max()
    assert lp_c.dtype == torch.float32  # log-probs are fp32 whatever the model dtype
    rtol = 1e-4 if dtype == torch.float32 else 2e-2
    for k in g_n:
        err = float((g_c[k] - g_n[k]).norm() / g_n[k].norm().clamp(min=1e-12))
        assert err < rtol, (k, err)


def test_hidden_via_root_equals_backbone():
    """The FSDP2 path (root forward + hook) gives the backbone's normed last hidden state, with gradients."""
    from graft_cli.models.logprobs import _backbone, hidden_via_root

    model = _model(torch.float32)
    ids = torch.randint(2, 97, (2, 9))
    att = torch.ones_like(ids)
    att[1, 6:] = 0
    base = _backbone(model)
    want = base(input_ids=ids, attention_mask=att).last_hidden_state
    got = hidden_via_root(model, base, ids, att)
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-6)
    got.sum().backward()
    assert model.model.embed_tokens.weight.grad is not None
