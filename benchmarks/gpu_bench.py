"""GPU throughput of graft's training, scoring and rollout paths on random-initialised real-shape models.

    python benchmarks/gpu_bench.py                      # Qwen3-1.7B and SmolLM3-3B shapes, one H200: < 8 min
    python benchmarks/gpu_bench.py --models qwen3-1.7b --no-compile
    python benchmarks/gpu_bench.py --tiny               # a CPU smoke run of the script itself (seconds)

Models are built from hand-written configs (published dimensions; no download) with random weights in bf16.
Per model it prints:

- **train**: graft's update path (``response_logprobs``: chunked, checkpointed LM-head log-probs, then the
  PPO-clip token-mean loss, backward, AdamW step) at ``--train-batch`` x ``--seq`` tokens (8 x 2048), with and
  without gradient checkpointing: tokens/s, MFU and peak memory. MFU = achieved model FLOP/s (6·N per token
  plus causal attention 6·layers·seq·d_attn, no recomputation counted) / the bf16 matmul ceiling measured here
  (8192³ GEMMs), not the data-sheet peak.
- **score**: the no-grad old-log-prob pass (``score_logprobs``' kernel) at ``--score-batch`` x ``--seq``.
- **rollout**: the HF engine (``graft_cli.rollout.hf``) with its CUDA fast path (static cache + torch.compile;
  ``--no-compile``: static cache only; ``--dynamic``: the plain path) at batch ``--rollout-batch`` (256),
  ``--prompt-len`` random prompt tokens and ``--new-tokens`` sampled tokens; one warm-up call of the same shapes
  first (compilation), then a timed call. Tokens/s counts sampled tokens.

Imports only torch, transformers and graft_cli modules that need nothing else (models.logprobs,
algorithms.losses, rollout.hf): the GPU machine has no hydra, omegaconf, math-verify or vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from graft_cli.algorithms.losses import LossInputs, Normaliser, ppo_token_loss  # noqa: E402
from graft_cli.models.logprobs import response_logprobs  # noqa: E402
from graft_cli.rollout.engine import SamplingParams  # noqa: E402
from graft_cli.rollout.hf import HFEngine  # noqa: E402


# ----------------------------------------------------------------------------------------------- models
def qwen3_1p7b():
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                       rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=151643,
                       eos_token_id=151643, attn_implementation="sdpa")


def smollm3_3b():
    from transformers import SmolLM3Config

    # SmolLM3-3B: 36 layers, d 2048, 16 heads / 4 KV heads (GQA), MLP 11008, vocab 128256, tied embeddings,
    # NoPE on every 4th layer (the config's default no_rope_layer_interval = 4)
    return SmolLM3Config(vocab_size=128256, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                         num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=65536,
                         rope_theta=5_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=128000,
                         eos_token_id=128012, pad_token_id=128004, attn_implementation="sdpa")


def tiny():
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                       tie_word_embeddings=True, eos_token_id=1, attn_implementation="sdpa")


MODELS = {"qwen3-1.7b": qwen3_1p7b, "smollm3-3b": smollm3_3b, "tiny": tiny}


class _Tok:
    """The few tokenizer attributes the HF engine uses (random token ids need no real tokenizer)."""

    def __init__(self, eos: int, pad: int):
        self.eos_token_id, self.pad_token_id = eos, pad

    def batch_decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=None):
        return [""] * len(ids)


# ----------------------------------------------------------------------------------------------- helpers
def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def matmul_ceiling(dev, dtype, n: int) -> float:
    """Measured dense matmul FLOP/s (the MFU denominator)."""
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(dev)
    reps = 20 if dev.type == "cuda" else 3
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(dev)
    return 2 * n**3 * reps / (time.perf_counter() - t)


def flops_per_token(cfg, seq: int, train: bool) -> float:
    """Model FLOPs per token: 2·N_matmul (fwd) + causal attention; x3 for fwd+bwd."""
    d, L, V = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    hd = getattr(cfg, "head_dim", None) or d // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    per_layer = d * (q + 2 * kv) + q * d + 3 * d * cfg.intermediate_size
    n = L * per_layer + d * V  # + LM head
    attn = 2 * L * seq * q  # QK^T and AV, causal (half of 4·seq·q)
    fwd = 2 * n + attn
    return 3 * fwd if train else fwd


def peak_gb(dev) -> float:
    return torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else float("nan")


def reset_peak(dev):
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)


def batch(cfg, B: int, T: int, prompt: int, dev):
    ids = torch.randint(2, cfg.vocab_size, (B, T), device=dev)
    att = torch.ones_like(ids)
    resp = torch.zeros_like(ids)
    resp[:, prompt:] = 1
    return ids, att, resp


# ----------------------------------------------------------------------------------------------- sections
def bench_train(model, cfg, args, dev, ceiling, checkpointing: bool) -> dict:
    if checkpointing:
        model.gradient_checkpointing_enable()
    else:
        model.gradient_checkpointing_disable()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    B, T = args.train_batch, args.seq
    ids, att, resp = batch(cfg, B, T, args.prompt_len, dev)
    mask = resp[:, 1:].float()
    norm = Normaliser(num_tokens=float(mask.sum()), num_seqs=float(B))
    adv = torch.randn(B, 1, device=dev) * mask
    old = None
    reset_peak(dev)
    times = []
    for it in range(args.train_iters + 1):
        sync(dev)
        t = time.perf_counter()
        logp, _ = response_logprobs(model, ids, att, resp, 1.0, args.chunk_tokens)
        if old is None:
            old = logp.detach()
        loss, _ = ppo_token_loss(LossInputs.of(logp, old, adv, mask, torch.ones(B, device=dev),
                                               torch.zeros(B, dtype=torch.bool, device=dev), norm=norm))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(dev)
        if it:  # the first iteration warms up kernels and allocates optimizer state
            times.append(time.perf_counter() - t)
    dt = sum(times) / len(times)
    tps = B * T / dt
    del opt
    return {"tok_s": tps, "mfu": tps * flops_per_token(cfg, T, True) / ceiling, "peak_gb": peak_gb(dev),
            "s_per_step": dt}


@torch.no_grad()
def bench_score(model, cfg, args, dev, ceiling) -> dict:
    model.eval()
    model.gradient_checkpointing_disable()
    B, T = args.score_batch, args.seq
    reset_peak(dev)
    times = []
    for it in range(args.train_iters + 1):
        ids, att, resp = batch(cfg, B, T, args.prompt_len, dev)
        sync(dev)
        t = time.perf_counter()
        response_logprobs(model, ids, att, resp, 1.0, args.chunk_tokens)
        sync(dev)
        if it:
            times.append(time.perf_counter() - t)
    tps = B * T / (sum(times) / len(times))
    return {"score_tok_s": tps, "score_mfu": tps * flops_per_token(cfg, T, False) / ceiling,
            "score_peak_gb": peak_gb(dev)}


def bench_rollout(model, cfg, args, dev) -> dict:
    model.eval()
    eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, int) else 1
    kw = {"cache": "dynamic"} if args.dynamic else {"cache": "static", "compile": not args.no_compile}
    eng = HFEngine(model, _Tok(eos, eos), max_batch=args.rollout_batch, **kw)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(2, cfg.vocab_size, (args.rollout_batch, args.prompt_len), generator=g).tolist()
    sp = SamplingParams(n=1, temperature=1.0, top_p=1.0, max_new_tokens=args.new_tokens, seed=0)
    reset_peak(dev)
    sync(dev)
    t = time.perf_counter()
    eng.generate(prompts, sp)  # warm-up: compilation / CUDA graphs for these shapes
    sync(dev)
    warm = time.perf_counter() - t
    t = time.perf_counter()
    ro = eng.generate(prompts, sp)
    sync(dev)
    dt = time.perf_counter() - t
    ntok = sum(len(x) for x in ro.response_ids)
    path = "static+compile" if eng.compile else ("static" if eng.static else "dynamic")
    # correctness: the engine's log-probs vs the trainer's recomputation on 8 rows (bf16 both: ~1e-2 expected)
    k = min(8, len(ro))
    L = args.prompt_len + max(len(r) for r in ro.response_ids[:k])
    ids = torch.zeros((k, L), dtype=torch.long)
    resp = torch.zeros_like(ids)
    for i in range(k):
        row = prompts[i] + ro.response_ids[i]
        ids[i, : len(row)] = torch.tensor(row)
        resp[i, args.prompt_len : len(row)] = 1
    with torch.no_grad():
        lp, _ = response_logprobs(model, ids.to(dev), (ids > -1).long().to(dev), resp.to(dev), 1.0, args.chunk_tokens)
    gap = max(float((lp[i, args.prompt_len - 1 : args.prompt_len - 1 + len(ro.response_ids[i])].cpu()
                     - torch.tensor(ro.logprobs[i])).abs().max()) for i in range(k))
    return {"rollout_tok_s": ntok / dt, "rollout_s": dt, "rollout_warmup_s": warm, "rollout_path": path,
            "rollout_peak_gb": peak_gb(dev), "rollout_logp_gap": gap}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="qwen3-1.7b,smollm3-3b")
    ap.add_argument("--train-batch", type=int, default=8)
    ap.add_argument("--score-batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--prompt-len", type=int, default=256, help="prompt tokens (train/score rows and rollouts)")
    ap.add_argument("--train-iters", type=int, default=3)
    ap.add_argument("--chunk-tokens", type=int, default=4096)
    ap.add_argument("--rollout-batch", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--dynamic", action="store_true", help="rollout on the plain dynamic-cache path")
    ap.add_argument("--skip", default="", help="comma list of sections to skip: train,score,rollout")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run: tiny model, small shapes")
    args = ap.parse_args(argv)
    if args.tiny:
        args.models, args.train_batch, args.score_batch, args.seq, args.prompt_len = "tiny", 2, 2, 64, 16
        args.train_iters, args.rollout_batch, args.new_tokens, args.no_compile = 1, 4, 8, True
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16
    import transformers

    ceiling = matmul_ceiling(dev, dtype, 8192 if dev.type == "cuda" else 512)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"device {name}  torch {torch.__version__}  transformers {transformers.__version__}  "
          f"bf16 matmul ceiling {ceiling / 1e12:.1f} TFLOP/s", flush=True)
    skip = set(filter(None, args.skip.split(",")))
    results = []
    for mname in args.models.split(","):
        from transformers import AutoModelForCausalLM

        cfg = MODELS[mname]()
        torch.manual_seed(0)
        t0 = time.perf_counter()
        with dev:  # random init directly on the device (seconds, not minutes on the host)
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        nparam = sum(p.numel() for p in model.parameters())
        row = {"model": mname, "params_b": nparam / 1e9, "build_s": time.perf_counter() - t0}
        print(f"\n== {mname}: {nparam / 1e9:.2f}B parameters", flush=True)
        sections = []
        if "train" not in skip:
            sections += [("train (no ckpt)", bench_train, (ceiling, False), "train_"),
                         ("train (grad ckpt)", bench_train, (ceiling, True), "train_gc_")]
        if "score" not in skip:
            sections.append(("score", bench_score, (ceiling,), ""))
        if "rollout" not in skip:
            sections.append(("rollout", bench_rollout, (), ""))
        for label, fn, extra, prefix in sections:
            t = time.perf_counter()
            try:
                res = fn(model, cfg, args, dev, *extra)
            except Exception as e:  # report and go on (e.g. out of memory in one section)
                res = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
            res = {(prefix + k if prefix and k != "error" else k): v for k, v in res.items()}
            row.update(res)
            shown = "  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items())
            print(f"  {label:<18} {shown}  ({time.perf_counter() - t:.0f}s)", flush=True)
        results.append(row)
        print("ROW " + json.dumps(row), flush=True)  # each model's figures at once (a capped run keeps them)
        del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    print("\nJSON " + json.dumps(results))
    return results


if __name__ == "__main__":
    main()
