"""The HF engine's per-row sampling streams and decode-batch compaction (rollout.engine_kwargs rng: per_row,
compact: true): the inverse-CDF draw against the distribution it samples, samples independent of
the batch a row is in, and compaction giving the uncompacted samples while running fewer rows."""

from __future__ import annotations

import pytest
import torch
from conftest import make_char_tokenizer

from graft_cli.data.prompts import PromptSpec
from graft_cli.rollout.engine import SamplingParams
from graft_cli.rollout.hf import HFEngine, row_uniforms, sample_inverse_cdf


def test_inverse_cdf_draws_follow_the_distribution():
    probs = torch.tensor([0.5, 0.0, 0.3, 0.15, 0.05])
    logits = probs.clamp_min(1e-30).log().expand(20000, 1, 5).clone()
    logits[:, :, 1] = float("-inf")
    u = torch.rand(20000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    tok, lp = sample_inverse_cdf(logits, SamplingParams(temperature=1.0, top_p=1.0), u)
    freq = torch.bincount(tok, minlength=5).double() / 20000
    assert freq[1] == 0  # a zero-probability token is never drawn
    assert torch.allclose(freq, probs.double(), atol=0.012), freq
    assert torch.allclose(lp, probs.log()[tok], atol=1e-6)
    # the cut points by hand: u < 0.5 -> 0; 0.5 <= u < 0.8 -> 2; 0.8 <= u < 0.95 -> 3; else 4
    u = torch.tensor([0.0, 0.49, 0.501, 0.79, 0.801, 0.949, 0.951, 0.999], dtype=torch.float64)
    tok, _ = sample_inverse_cdf(logits[:8], SamplingParams(temperature=1.0, top_p=1.0), u)
    assert tok.tolist() == [0, 0, 2, 2, 3, 3, 4, 4]
    # top-p 0.75 keeps {0, 2} (0.5 + 0.3 reaches it), renormalised to 0.625 / 0.375
    u = torch.tensor([0.6, 0.63, 0.99], dtype=torch.float64)
    tok, lp = sample_inverse_cdf(logits[:3], SamplingParams(temperature=1.0, top_p=0.75), u)
    assert tok.tolist() == [0, 2, 2] and lp[0].item() == pytest.approx(torch.tensor(0.625).log().item(), abs=1e-6)


def test_row_uniforms_are_per_row_streams():
    a = row_uniforms(7, 0, 6, 5, "cpu")
    b = row_uniforms(7, 2, 3, 5, "cpu")  # rows 2..4 of the same flat list, in another batch
    assert torch.equal(a[2:5], b) and not torch.equal(a[0], a[1])
    assert not torch.equal(row_uniforms(8, 0, 1, 5, "cpu")[0], a[0])
    assert ((a >= 0) & (a < 1)).all()


@pytest.fixture(scope="module")
def model_tok(tiny_models):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_models["a"], dtype=torch.float32).eval(), make_char_tokenizer()


def _prompts(tok):
    spec = PromptSpec()
    return [spec.encode(f"{a}+{b}", tok) for a, b in ((1, 2), (3, 4), (5, 1), (2, 2), (6, 3))]


def test_per_row_samples_do_not_depend_on_the_batch(model_tok):
    model, tok = model_tok
    sp = SamplingParams(n=4, temperature=1.0, top_p=1.0, max_new_tokens=16, seed=3)
    big = HFEngine(model, tok, rng="per_row", max_batch=64).generate(_prompts(tok), sp)
    small = HFEngine(model, tok, rng="per_row", max_batch=3).generate(_prompts(tok), sp)
    assert big.response_ids == small.response_ids and big.truncated == small.truncated
    # the batch-wide stream does depend on it (why per_row is the default)
    b1 = HFEngine(model, tok, rng="batch", max_batch=64).generate(_prompts(tok), sp)
    b2 = HFEngine(model, tok, rng="batch", max_batch=3).generate(_prompts(tok), sp)
    assert b1.response_ids != b2.response_ids


def test_compaction_gives_the_same_samples_with_fewer_rows(model_tok):
    model, tok = model_tok
    sp = SamplingParams(n=8, temperature=1.0, top_p=1.0, max_new_tokens=24, seed=5)
    rows = []
    hook = model.model.embed_tokens.register_forward_hook(lambda m, a, out: rows.append(out.shape[0]))
    try:
        full = HFEngine(model, tok, rng="per_row", compact=False).generate(_prompts(tok), sp)
        full_rows, rows[:] = sum(rows), []
        comp = HFEngine(model, tok, rng="per_row", compact=True).generate(_prompts(tok), sp)
        comp_rows = sum(rows)
    finally:
        hook.remove()
    ended = [len(r) for r, t in zip(full.response_ids, full.truncated) if not t]
    assert ended and min(ended) < sp.max_new_tokens // 2, "the fixture model must end some rows early"
    assert comp.response_ids == full.response_ids and comp.truncated == full.truncated
    assert max(abs(x - y) for a, b in zip(comp.logprobs, full.logprobs) for x, y in zip(a, b)) < 1e-5
    assert comp_rows < full_rows  # finished rows left the decode batch


def test_option_errors(model_tok):
    model, tok = model_tok
    with pytest.raises(ValueError, match="rng"):
        HFEngine(model, tok, rng="fast")
    with pytest.raises(ValueError, match="per_row"):
        HFEngine(model, tok, rng="batch", compact=True)
    with pytest.raises(ValueError, match="known: auto, true, false"):
        HFEngine(model, tok, compact="yes")
    with pytest.raises(ValueError, match="dynamic"):
        HFEngine(model, tok, rng="per_row", compact=True, cache="static")


def test_config_names_the_bad_engine_option():
    from graft_cli import config as C
    from graft_cli.errors import GraftError

    with pytest.raises(GraftError, match="config key 'rollout.engine_kwargs.compact': needs rng: per_row"):
        C.compose(["rollout.engine_kwargs={rng: batch, compact: true}"])
    with pytest.raises(GraftError, match="'rollout.engine_kwargs.rng'"):
        C.compose(["rollout.engine_kwargs={rng: fast}"])
    cfg = C.compose(["rollout.engine_kwargs={rng: per_row, compact: true}"])
    assert cfg.rollout.engine_kwargs == {"rng": "per_row", "compact": True}


def test_engine_defaults_are_the_fast_path(model_tok):
    """The HF engine's defaults (no engine_kwargs): per-row streams, compaction and shared prefill on the dynamic
    cache; on the static cache (CUDA's auto) compaction and shared prefill stay off without an error; compact auto
    follows the rng layout."""
    model, tok = model_tok
    cases = [  # (kwargs, per_row, compact, share_prompts)
        ({}, True, True, True),
        ({"cache": "static"}, True, False, False),
        ({"rng": "batch"}, False, False, True),
        ({"compact": False}, True, False, True),
        ({"share_prompts": False}, True, True, False),
        ({"rng": "batch", "share_prompts": False}, False, False, False),
    ]
    for kw, per_row, compact, share in cases:
        e = HFEngine(model, tok, **kw)
        assert (e.per_row, e.compact, e.share_prompts) == (per_row, compact, share), kw


def test_ignore_eos_runs_every_row_to_the_maximum(model_tok):
    """rollout.engine_kwargs.ignore_eos (vLLM's name; the benchmarks' equal-work mode): no row stops at EOS."""
    model, tok = model_tok
    sp = SamplingParams(n=8, temperature=1.0, top_p=1.0, max_new_tokens=24, seed=5)
    free = HFEngine(model, tok).generate(_prompts(tok), sp)
    assert any(len(r) < 24 for r in free.response_ids), "the fixture model must end some rows early"
    fixed = HFEngine(model, tok, ignore_eos=True).generate(_prompts(tok), sp)
    assert [len(r) for r in fixed.response_ids] == [24] * len(fixed.response_ids)
    assert all(fixed.truncated)
    # up to each row's first EOS the samples are the same draws (per-row streams)
    for a, b in zip(free.response_ids, fixed.response_ids):
        assert b[: len(a)] == a


def test_rollout_logprobs_equal_the_trainers_on_cpu(model_tok):
    """algo.old_logprobs=auto's choice of the rollout log-probs on the HF engine rests on this: the engine's
    log-probs of the sampled tokens (KV-cached decode, compacted batch) equal the trainer's recomputation (one
    padded forward) to float order."""
    from graft_cli.batch import TrainBatch
    from graft_cli.models.scoring import ScoreSettings, score_rows

    model, tok = model_tok
    sp = SamplingParams(n=4, temperature=1.0, top_p=1.0, max_new_tokens=16, seed=9)
    ro = HFEngine(model, tok, rng="per_row", compact=True).generate(_prompts(tok), sp)
    b = TrainBatch()
    for i, (ids, lp) in enumerate(zip(ro.response_ids, ro.logprobs)):
        b.append(prompt_ids=ro.prompt_ids[i // 4], response_ids=ids, advantages=0.0, weights=1.0, source="self",
                 group=i // 4, rollout_logprobs=lp)
    trainer = score_rows(model, tok.pad_token_id, b, ScoreSettings())
    assert max(abs(x - y) for s, t in zip(b.rollout_logprobs, trainer) for x, y in zip(s, t)) < 1e-4


def test_the_tiny_pair_runs_the_fast_path_by_default_and_tandem_guards_it():
    """What the removed scale=cpu_fast overlay turned on is the default (the engine's options are its own
    defaults, so the config carries none); tandem resolves auto to trainer and refuses explicit rollout
    log-probs."""
    from graft_cli import config as C
    from graft_cli.errors import GraftError

    cfg = C.compose(["pair=tiny", "method=graft"])
    assert cfg.algo.old_logprobs == "rollout" and cfg.optim.shared_prefix is True
    assert cfg.rollout.engine_kwargs == {}
    assert C.compose(["pair=tiny", "method=tandem"]).algo.old_logprobs == "trainer"
    with pytest.raises(GraftError, match="config key 'algo.old_logprobs'"):  # tandem's log-probs are the writer's
        C.compose(["pair=tiny", "method=tandem", "algo.old_logprobs=rollout"])
    with pytest.raises(GraftError, match="scale 'cpu_fast': no scale/cpu_fast.yaml"):
        C.compose(["pair=tiny", "scale=cpu_fast"])


def test_bf16_autocast_logprobs_are_close_to_fp32_and_not_equal(model_tok):
    """optim.autocast / rollout.engine_kwargs.autocast = bfloat16: the forwards run their matmuls in bf16 (so the
    log-probs move, by bf16 rounding: < 0.1 nats per token on this model) and the engine still samples valid rows."""
    from graft_cli.models.logprobs import autocast_gap, pack, response_logprobs

    model, tok = model_tok
    sp = SamplingParams(n=4, temperature=1.0, top_p=1.0, max_new_tokens=16, seed=1)
    prompts = _prompts(tok)
    ro = HFEngine(model, tok, autocast="bfloat16").generate(prompts, sp)
    assert all(0 < len(r) <= 16 for r in ro.response_ids)
    P = [p for p in prompts for _ in range(sp.n)]
    d = autocast_gap(model, P, ro.response_ids, tok.pad_token_id)
    assert d.numel() == sum(len(r) for r in ro.response_ids)
    assert 0 < float(d.max()) < 0.1
    ids, att, resp = pack(P, ro.response_ids, tok.pad_token_id, "cpu")
    with torch.no_grad():  # the loss sees fp32 log-probs either way
        assert response_logprobs(model, ids, att, resp, autocast_dtype="bfloat16")[0].dtype == torch.float32
    with pytest.raises(ValueError, match="rollout.engine_kwargs.autocast"):
        HFEngine(model, tok, autocast="float16")
