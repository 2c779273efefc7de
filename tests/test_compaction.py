"""The HF engine's per-row sampling streams and decode-batch compaction (rollout.engine_kwargs sampler: per_row,
compact: true; issue 16): the inverse-CDF draw against the distribution it samples, samples independent of
the batch a row is in, and compaction giving the uncompacted samples while running fewer rows."""

from __future__ import annotations

import pytest
import torch
from conftest import make_char_tokenizer

from graft_cli.data.prompts import PromptSpec
from graft_cli.rollout.base import SamplingParams
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
    big = HFEngine(model, tok, sampler="per_row", max_batch=64).generate(_prompts(tok), sp)
    small = HFEngine(model, tok, sampler="per_row", max_batch=3).generate(_prompts(tok), sp)
    assert big.response_ids == small.response_ids and big.truncated == small.truncated
    # the default batch stream does depend on it (why per_row is its own option)
    b1 = HFEngine(model, tok, max_batch=64).generate(_prompts(tok), sp)
    b2 = HFEngine(model, tok, max_batch=3).generate(_prompts(tok), sp)
    assert b1.response_ids != b2.response_ids


def test_compaction_gives_the_same_samples_with_fewer_rows(model_tok):
    model, tok = model_tok
    sp = SamplingParams(n=8, temperature=1.0, top_p=1.0, max_new_tokens=24, seed=5)
    rows = []
    hook = model.model.embed_tokens.register_forward_hook(lambda m, a, out: rows.append(out.shape[0]))
    try:
        full = HFEngine(model, tok, sampler="per_row").generate(_prompts(tok), sp)
        full_rows, rows[:] = sum(rows), []
        comp = HFEngine(model, tok, sampler="per_row", compact=True).generate(_prompts(tok), sp)
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
    with pytest.raises(ValueError, match="sampler"):
        HFEngine(model, tok, sampler="fast")
    with pytest.raises(ValueError, match="per_row"):
        HFEngine(model, tok, compact=True)
    with pytest.raises(ValueError, match="dynamic"):
        HFEngine(model, tok, sampler="per_row", compact=True, cache="static")


def test_config_names_the_bad_engine_option():
    from graft_cli import config as C
    from graft_cli.errors import GraftError

    with pytest.raises(GraftError, match="config key 'rollout.engine_kwargs.compact': needs sampler: per_row"):
        C.compose(["rollout.engine_kwargs={compact: true}"])
    with pytest.raises(GraftError, match="'rollout.engine_kwargs.sampler'"):
        C.compose(["rollout.engine_kwargs={sampler: fast}"])
    cfg = C.compose(["rollout.engine_kwargs={sampler: per_row, compact: true}"])
    assert cfg.rollout.engine_kwargs == {"sampler": "per_row", "compact": True}


def test_sampler_logprobs_equal_the_trainers_on_cpu(model_tok):
    """scale=cpu_fast's algo.old_logprobs=sampler rests on this: the HF engine's log-probs of the sampled tokens
    (KV-cached decode, compacted batch) equal the trainer's recomputation (one padded forward) to float order."""
    from graft_cli.batch import TrainBatch
    from graft_cli.models.scoring import ScoreSettings, score_rows

    model, tok = model_tok
    sp = SamplingParams(n=4, temperature=1.0, top_p=1.0, max_new_tokens=16, seed=9)
    ro = HFEngine(model, tok, sampler="per_row", compact=True).generate(_prompts(tok), sp)
    b = TrainBatch()
    for i, (ids, lp) in enumerate(zip(ro.response_ids, ro.logprobs)):
        b.append(prompt_ids=ro.prompt_ids[i // 4], response_ids=ids, advantages=0.0, weights=1.0, source="self",
                 group=i // 4, sampler_logprobs=lp)
    trainer = score_rows(model, tok.pad_token_id, b, ScoreSettings())
    assert max(abs(x - y) for s, t in zip(b.sampler_logprobs, trainer) for x, y in zip(s, t)) < 1e-4


def test_cpu_fast_overlay_and_its_guard():
    from graft_cli import config as C
    from graft_cli.errors import GraftError

    cfg = C.compose(["pair=tiny", "method=graft", "scale=cpu_fast"])
    assert cfg.algo.old_logprobs == "sampler" and cfg.optim.shared_prefix is True
    assert cfg.rollout.engine_kwargs == {"sampler": "per_row", "compact": True, "share_prompts": True}
    with pytest.raises(GraftError, match="config key 'algo.old_logprobs'"):  # tandem's log-probs are the writer's
        C.compose(["pair=tiny", "method=tandem", "scale=cpu_fast"])
