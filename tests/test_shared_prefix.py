"""Shared prompts: the rows of a GRPO group share one prompt, so its forward runs once.

- ``optim.shared_prefix`` (update and scoring): log-probs, entropies and gradients equal the full pass to float
  order; the micro-batch planner keeps a prompt's rows together within the token budget (a table of cases by
  hand); a training run with it equals one without, metric by metric and weight by weight.
- ``rollout.engine_kwargs.share_prompts`` (HF engine prefill): the same samples, log-probs within 1e-5.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_char_tokenizer

from graft_cli.batch import TrainBatch, plan_micro_batches, prefix_cost, prefix_micro_batches
from graft_cli.models.logprobs import pack, prefix_groups, response_logprobs


def _model(arch: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    tok = make_char_tokenizer()
    torch.manual_seed(0)
    common = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, pad_token_id=tok.pad_token_id)
    if arch == "qwen3":
        return tok, Qwen3ForCausalLM(Qwen3Config(head_dim=16, **common))
    if arch == "gpt_neox":  # the tiny c's family: parallel residual, rotary on a quarter of each head
        from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

        common.pop("num_key_value_heads")
        return tok, GPTNeoXForCausalLM(GPTNeoXConfig(rotary_pct=0.25, use_parallel_residual=True,
                                                     tie_word_embeddings=False, **common))
    return tok, LlamaForCausalLM(LlamaConfig(**common))


def _rows(V: int, seed: int = 0):
    """Four prompts of different lengths (left padding differs), 3-5 rows each, responses of 1-9 tokens
    (one of a single token: it is predicted by the prompt's last position alone)."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for u, (plen, k) in enumerate(((5, 3), (9, 4), (3, 5), (7, 3))):
        p = torch.randint(3, V, (plen,), generator=g).tolist()
        for j in range(k):
            n = 1 if (u, j) == (2, 0) else int(torch.randint(2, 10, (1,), generator=g))
            prompts.append(p)
            responses.append(torch.randint(3, V, (n,), generator=g).tolist())
    perm = torch.randperm(len(prompts), generator=g).tolist()  # a prompt's rows need not be adjacent
    return [prompts[i] for i in perm], [responses[i] for i in perm]


@pytest.mark.parametrize("arch", ["qwen3", "llama", "gpt_neox"])
def test_shared_prefix_equals_the_full_pass(arch):
    tok, m = _model(arch)
    m.train()
    prompts, responses = _rows(len(tok))
    ids, att, resp = pack(prompts, responses, tok.pad_token_id)
    groups = prefix_groups(prompts, responses, tok.pad_token_id)
    assert groups.prompt_ids.shape[0] == 4 and groups.row_prompt.shape[0] == len(prompts)
    got = {}
    for name, g in (("full", None), ("shared", groups)):
        m.zero_grad()
        lp, ent = response_logprobs(m, ids, att, resp, temperature=0.7, chunk_tokens=16, with_entropy=True, groups=g)
        (lp * torch.linspace(0.5, 1.5, lp.shape[1])).sum().backward()  # position-dependent weights
        got[name] = lp.detach(), ent, torch.cat([p.grad.flatten() for p in m.parameters()])
    (lf, ef, gf), (ls, es, gs) = got["full"], got["shared"]
    sel = resp[:, 1:].bool()
    assert (ls[~sel] == 0).all() and int(sel.sum()) == sum(len(r) for r in responses)
    assert torch.allclose(ls, lf, atol=1e-5) and torch.allclose(es, ef, atol=1e-5)
    assert float((gs - gf).norm() / gf.norm()) < 1e-5
    # the shared pass ran each prompt once: 4 prompts, not 15 rows, in the first forward
    seen = []
    emb = m.get_input_embeddings()
    h = emb.register_forward_hook(lambda mod, args, out: seen.append(tuple(out.shape[:2])))
    with torch.no_grad():
        response_logprobs(m, ids, att, resp, groups=groups)
    h.remove()
    assert seen == [(4, 9), (len(prompts), max(map(len, responses)) - 1)]


def test_prefix_micro_batches_by_hand():
    # rows: 0 A, 1 B, 2 A, 3 B, 4 C; prompt lengths A 4, B 6, C 2; response lengths below
    keys, plen, rlen = ["A", "B", "A", "B", "C"], [4, 6, 4, 6, 2], [5, 3, 2, 9, 4]
    assert prefix_cost(keys, plen, rlen, [0, 1, 2]) == 2 * 6 + 3 * 4
    # group-major order: groups by their longest response, C (4), A (5), B (9); rows by response length:
    # 4; 2, 0; 1, 3. By-length order: 2, 1, 4, 0, 3.
    # budget 100: everything fits in both: 3 prompts x 6 + 5 rows x 8 = 58; a tie keeps group-major
    assert prefix_micro_batches(keys, plen, rlen, 100) == [[4, 2, 0, 1, 3]]
    # budget 20, group-major: [4] 2 + 3 = 5; + row 2: 2 x 4 + 2 x 3 = 14; + row 0: 2 x 4 + 3 x 4 = 20 fits;
    # + row 1 (B): 3 x 6 + 4 x 4 = 34 > 20 -> new; [1] 6 + 2 = 8; + row 3: 6 + 2 x 8 = 22 > 20 -> new [3] 14:
    # 20 + 8 + 14 = 42 in all. By length: [2, 1] 2 x 6 + 2 x 2 = 16; + 4: 27 -> [4, 0] 2 x 4 + 2 x 4 = 16;
    # + 3: 42 -> [3] 14: 46 in all. Group-major wins.
    assert prefix_micro_batches(keys, plen, rlen, 20) == [[4, 2, 0], [1], [3]]
    # budget 1: one row each (at least one row per micro-batch), group-major order (a tie)
    assert prefix_micro_batches(keys, plen, rlen, 1) == [[4], [2], [0], [1], [3]]
    # spread lengths within each group: A = rows 0, 1, B = rows 2, 3, prompts of 2, responses 1 and 9, budget 20.
    # group-major [0, 1] 2 + 2 x 8 = 18, [2, 3] 18: 36. By length [0, 2] 2 x 2 + 0 = 4, + 1: 2 x 2 + 3 x 8 = 28
    # -> [1, 3] 2 x 2 + 2 x 8 = 20: 24. By length wins: each prompt runs twice, no short row pads to 9.
    assert prefix_micro_batches(["A", "A", "B", "B"], [2] * 4, [1, 9, 1, 9], 20) == [[0, 2], [1, 3]]
    # the planner: shared -> the table above; otherwise length-sorted by prompt + response
    prompts = [[1] * n for n in plen]
    prompts[4] = [2, 2]
    responses = [[5] * n for n in rlen]
    assert plan_micro_batches(prompts, responses, 20, shared_prefix=True) == [[4, 2, 0], [1], [3]]
    # lengths 9, 9, 6, 15, 6 sorted (stable): 2, 4, 0, 1, 3; budget 20: [2, 4] (6 x 2 = 12), [0, 1] (18), [3]
    assert plan_micro_batches(prompts, responses, 20) == [[2, 4], [0, 1], [3]]
    assert plan_micro_batches(prompts, responses, 20, sort=False) == [[0, 1], [2], [3], [4]]


def test_shared_prefix_scoring_matches():
    from graft_cli.models.scoring import ScoreSettings, score_rows

    tok, m = _model("llama")
    m.eval()
    prompts, responses = _rows(len(tok), seed=3)
    b = TrainBatch()
    for i, (p, r) in enumerate(zip(prompts, responses)):
        b.append(prompt_ids=p, response_ids=r, advantages=0.0, weights=1.0, source="self", group=i)
    for budget in (100000, 24):
        full = score_rows(m, tok.pad_token_id, b, ScoreSettings(token_budget=budget))
        shared = score_rows(m, tok.pad_token_id, b, ScoreSettings(token_budget=budget, shared_prefix=True))
        assert [len(x) for x in shared] == [len(r) for r in responses]
        assert max(abs(u - v) for x, y in zip(full, shared) for u, v in zip(x, y)) < 1e-5


def test_shared_prefix_training_equals_the_full_pass(tiny_models, problems_file, tmp_path):
    """A GRAFT run (grafted rows in the receiver's groups) with optim.shared_prefix equals one without, up to
    float order: the same metric rows, losses, gradient norms and weights."""
    from test_parallel import _weights, float_order_runs

    dirs, ra, rb = float_order_runs(tiny_models, problems_file, tmp_path, "optim.shared_prefix",
                                    ["optim.micro_batch_tokens=96"], "p")
    assert any(r.get("graft/transferred", 0) > 0 for r in ra)  # the exchange put peer rows into the update
    assert [x["num_tokens"] for x in ra] == [y["num_tokens"] for y in rb]
    # Adam divides by sqrt(v): on entries whose gradient is ~0, float-order noise moves the step by a fraction
    # of lr (1e-3 here); measured 2.6e-5 after 3 steps. A tenth of one step's lr is the bound.
    w1, w2 = _weights(dirs[False]), _weights(dirs[True])
    for p in ("a", "b"):
        assert all(torch.allclose(w1[p][k], w2[p][k], rtol=0, atol=1e-4) for k in w1[p])


@pytest.mark.parametrize("rng", ["batch", "per_row"])
def test_shared_prefill_gives_the_same_samples(tiny_models, rng):
    from transformers import AutoModelForCausalLM

    from graft_cli.data.prompts import PromptSpec
    from graft_cli.rollout.engine import SamplingParams
    from graft_cli.rollout.hf import HFEngine

    model = AutoModelForCausalLM.from_pretrained(tiny_models["a"], dtype=torch.float32).eval()
    tok = make_char_tokenizer()
    spec = PromptSpec()
    prompts = [spec.encode(f"{a}+{b}", tok) for a, b in ((1, 2), (13, 4), (5, 1), (2, 22))]
    sp = SamplingParams(n=4, temperature=1.0, top_p=1.0, max_new_tokens=16, seed=5)
    seen = []
    h = model.get_input_embeddings().register_forward_hook(lambda mod, args, out: seen.append(out.shape[0]))
    ref = HFEngine(model, tok, rng=rng, share_prompts=False).generate(prompts, sp)
    first_ref, seen[:] = seen[0], []
    got = HFEngine(model, tok, rng=rng, share_prompts=True).generate(prompts, sp)
    h.remove()
    assert (first_ref, seen[0]) == (16, 4)  # the prefill ran 4 distinct prompts instead of 16 rows
    assert got.response_ids == ref.response_ids and got.truncated == ref.truncated
    assert max(abs(u - v) for x, y in zip(got.logprobs, ref.logprobs) for u, v in zip(x, y)) < 1e-5


def test_shared_options_refused_where_they_cannot_work():
    from graft_cli import config as C
    from graft_cli.errors import GraftError
    from graft_cli.rollout.hf import HFEngine

    with pytest.raises(ValueError, match="rollout.engine_kwargs.share_prompts: needs the dynamic cache"):
        HFEngine.check_kwargs(cache="static", share_prompts=True)
    with pytest.raises(GraftError, match="config key 'optim.shared_prefix': needs the KV cache"):
        C.compose(["optim.shared_prefix=true", "optim.gradient_checkpointing=true"])


def test_prefix_micro_batches_cover_every_row_within_the_budget():
    import random

    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 40)
        keys = [rng.randrange(6) for _ in range(n)]
        by_key = {k: rng.randint(1, 9) for k in range(6)}
        plen, rlen, budget = [by_key[k] for k in keys], [rng.randint(0, 12) for _ in range(n)], rng.randint(1, 80)
        plan = prefix_micro_batches(keys, plen, rlen, budget)
        assert sorted(i for m in plan for i in m) == list(range(n))
        assert all(len(m) == 1 or prefix_cost(keys, plen, rlen, m) <= budget for m in plan)


def test_shared_prefix_equals_the_full_pass_for_a_lora_policy():
    """A LoRA policy (adapters injected into the decoder the shared pass calls directly): the same log-probs and the
    same adapter gradients as the full pass."""
    from graft_cli.models import lora

    tok, base = _model("qwen3")
    m = lora.wrap(base, 4, 16.0, 0.0, "all-linear", "default")
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    m.train()
    prompts, responses = _rows(len(tok))
    ids, att, resp = pack(prompts, responses, tok.pad_token_id)
    got = {}
    for name, grp in (("full", None), ("shared", prefix_groups(prompts, responses, tok.pad_token_id))):
        m.zero_grad()
        lp, _ = response_logprobs(m, ids, att, resp, temperature=0.7, chunk_tokens=16, groups=grp)
        lp.sum().backward()
        got[name] = lp.detach(), torch.cat([p.grad.flatten() for p in lora.trainable_parameters(m)])
    (lf, gf), (ls, gs) = got["full"], got["shared"]
    assert torch.allclose(ls, lf, atol=1e-5) and float(gf.abs().max()) > 0
    assert float((gs - gf).norm() / gf.norm()) < 1e-5
