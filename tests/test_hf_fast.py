"""The HF engine's CUDA fast path (static cache, fixed-shape mask, optional torch.compile), checked on CPU:
it samples exactly what the dynamic-cache path samples, with the same log-probs; ``auto`` leaves the CPU path
unchanged; a failing fast path falls back to the dynamic one with a warning."""

from __future__ import annotations

import pytest
import torch
from conftest import make_char_tokenizer, make_random_model

from graft_cli.rollout.engine import SamplingParams
from graft_cli.rollout.hf import HFEngine


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("fast")
    return {"qwen3": make_random_model(str(d / "q"), "qwen3", 0), "llama": make_random_model(str(d / "l"), "llama", 1)}


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def test_auto_keeps_the_cpu_path(paths):
    eng = HFEngine(_load(paths["qwen3"]), make_char_tokenizer())
    assert eng.static is False and eng.compile is False
    assert HFEngine(_load(paths["qwen3"]), make_char_tokenizer(), cache="static").static is True


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_static_cache_equals_dynamic(paths, arch):
    tok = make_char_tokenizer()
    model = _load(paths[arch])
    prompts = [tok(t)["input_ids"] for t in ("1+2=", "What is 12 times 7? ", "x")]
    sp = SamplingParams(n=3, temperature=1.0, top_p=0.9, max_new_tokens=12, seed=4)
    dyn = HFEngine(model, tok, cache="dynamic", max_batch=4).generate(prompts, sp)
    fast = HFEngine(model, tok, cache="static", cache_bucket=16, max_batch=4).generate(prompts, sp)
    assert fast.response_ids == dyn.response_ids and fast.truncated == dyn.truncated
    for a, b in zip(fast.logprobs, dyn.logprobs):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)


def test_fast_path_failure_falls_back(paths, monkeypatch):
    import transformers

    tok = make_char_tokenizer()
    model = _load(paths["qwen3"])
    prompts = [tok(t)["input_ids"] for t in ("1+2=", "x")]
    sp = SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=1)
    want = HFEngine(model, tok, cache="dynamic").generate(prompts, sp)

    def broken(*a, **k):
        raise RuntimeError("no static cache here")

    monkeypatch.setattr(transformers, "StaticCache", broken)
    eng = HFEngine(model, tok, cache="static")
    with pytest.warns(UserWarning, match="fast path"):
        got = eng.generate(prompts, sp)
    assert eng.static is False and got.response_ids == want.response_ids
