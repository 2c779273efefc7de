"""run.model_init=random: the paper's models in their published shapes with random weights and a synthetic
tokenizer of their vocabulary (no download), tested here with the shrunk versions of the same configs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT

from graft_cli.models.shapes import SHAPES, char_tokenizer, random_model, shape_config, synthetic_tokenizer

PUBLISHED = {  # hub id: (vocab, hidden, layers, heads, kv heads, MLP, eos)
    "HuggingFaceTB/SmolLM3-3B-Base": (128256, 2048, 36, 16, 4, 11008, 128012),
    "Qwen/Qwen3-1.7B-Base": (151936, 2048, 28, 16, 8, 6144, 151643),
    "Qwen/Qwen3-4B-Instruct-2507": (151936, 2560, 36, 32, 8, 9728, 151645),
    "OctoThinker/OctoThinker-3B-Hybrid-Base": (128256, 3072, 28, 24, 8, 8192, 128001),
}


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_published_dimensions_and_the_shrunk_twin(model):
    c = shape_config(model)
    got = (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
           c.intermediate_size, c.eos_token_id)
    assert got == PUBLISHED[model]
    s = shape_config(model, shrink=True)
    assert type(s) is type(c) and s.vocab_size == c.vocab_size and s.eos_token_id == c.eos_token_id
    assert (s.hidden_size, s.num_hidden_layers) == (64, 2)


def test_synthetic_tokenizer_round_trips_and_puts_eos_at_the_configs_id():
    c = shape_config("HuggingFaceTB/SmolLM3-3B-Base", shrink=True)
    tok = synthetic_tokenizer(c)
    assert len(tok) == c.vocab_size and tok.eos_token_id == 128012 and tok.pad_token_id == 128004
    ids = tok("7*6=42, so \\boxed{42}\n")["input_ids"]
    assert tok.decode(ids) == "7*6=42, so \\boxed{42}\n" and max(ids) < 100


def test_char_tokenizer_ids_by_hand():
    """pad 0, EOS 1, then chr(32)..chr(126) and newline in order: ' ' -> 2, 'A' (65) -> 65 - 32 + 2, '~' -> 96,
    newline -> 97; with 97 ids newline has no id and encodes as pad (the unknown token); with pad None the pad is
    EOS and the characters start at 1; ids past the characters are unused tokens that still decode."""
    t = char_tokenizer(98, eos=1, pad=0)
    assert (len(t), t.pad_token_id, t.eos_token_id, t.padding_side) == (98, 0, 1, "left")
    assert t(" A~\n", add_special_tokens=False)["input_ids"] == [2, 35, 96, 97]
    assert char_tokenizer(97, eos=1, pad=0)("A\n", add_special_tokens=False)["input_ids"] == [35, 0]
    e = char_tokenizer(100, eos=0, pad=None)
    assert (e.pad_token_id, e.eos_token_id) == (0, 0) and e(" A", add_special_tokens=False)["input_ids"] == [1, 34]
    assert e.convert_ids_to_tokens(98) == "<|unused_98|>"


def test_random_model_forward_has_the_vocabulary_width():
    import torch

    m, tok = random_model("Qwen/Qwen3-1.7B-Base", torch.float32, shrink=True)
    out = m(torch.tensor([tok("1+1=")["input_ids"]])).logits
    assert out.shape[-1] == 151936 and sum(p.numel() for p in m.parameters()) < 12e6


def test_unknown_model_is_one_line():
    from graft_cli.errors import GraftError

    with pytest.raises(GraftError, match="no published config for 'org/none'"):
        shape_config("org/none")
    assert "Qwen/Qwen3-1.7B-Base" in SHAPES


@pytest.mark.slow
def test_gpu_proof_script_runs_on_a_cpu(tmp_path):
    """benchmarks/gpu_proof.sh in its CPU smoke mode: gpu_bench (tiny), two GRPO and two GRAFT steps of pair 1's
    shrunk shapes through graft train, GRAFT at run.staleness=1 beside them, and proof.json."""
    env = {**os.environ, "GPU_PROOF_SMOKE": "1", "GPU_PROOF_BENCH_S": "200", "GPU_PROOF_ASYNC": "1",
           "OUT": str(tmp_path / "proof"),
           "PY": sys.executable,
           "OMP_NUM_THREADS": "2"}
    res = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu_proof.sh")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    import json

    proof = json.load(open(tmp_path / "proof" / "proof.json"))
    assert proof["grpo"]["s_per_step"] > 0 and proof["graft"]["s_per_step"] > 0 and proof["graft_over_grpo"] > 0
    assert proof["grpo"]["step"] == proof["graft"]["step"] == 2
    # the exchange's counts are recorded (in this smoke run they are 0: 8 sampled tokens of a ~128k vocabulary with
    # 96 printable characters decode to the same empty text, so every group's coin flips agree; on the GPU's 256-512
    # tokens responses differ and the coin flip at p 0.2 leaves ~17% all-fail groups)
    ex = proof["graft"]["exchange"]
    assert set(ex) == {"graft/candidates", "graft/selected", "graft/admitted", "graft/transferred"}
    assert all(isinstance(v, int) and v >= 0 for v in ex.values())
    # every kernel section of gpu_bench ran (a section that raises is reported in its row as "error")
    assert [r["model"] for r in proof["gpu_bench"]] == ["tiny"]
    assert not [r["error"] for r in proof["gpu_bench"] if "error" in r]
    assert {"train_tok_s", "train_gc_tok_s", "score_tok_s", "rollout_tok_s"} <= set(proof["gpu_bench"][0])
    assert not os.path.exists(tmp_path / "proof" / "runs" / "1-graft-s0" / "checkpoints" / "step_000002")
    assert "GRAFT / GRPO step time" in res.stdout
    # the asynchronous run: its last step trained on rows one version old, and the ratio is reported
    k1 = [json.loads(x) for x in open(tmp_path / "proof" / "runs" / "1-graft_k1-s0" / "metrics.jsonl")]
    assert [r["async/staleness"] for r in k1 if "time/step" in r] == [0, 0, 1, 1]  # steps 1, 2 for a and b
    assert proof["graft_k1"]["step"] == 2 and proof["k1_over_k0_tokens_per_s"] > 0
    assert "GRAFT k = 1 / k = 0 tokens/s" in res.stdout
