"""Tandem rollout throughput against single-model generation on the same batch and lengths (tandem.md §2.3).

    python benchmarks/tandem_speed.py                       # CPU: the tiny pair's senior a and junior (GRAFT_CACHE)
    python benchmarks/tandem_speed.py --threads 1 --repeat 5
    python benchmarks/tandem_speed.py --real                # CUDA: two random-initialised Qwen3-4B-shape models

Both sides generate exactly ``--new-tokens`` tokens per row (EOS is switched off), so the work is equal and
tokens per second compare directly: the single-model side is the HF engine (``graft_cli.rollout.hf``) on the
senior, the tandem side the tandem engine (``graft_cli.rollout.tandem``, ``word`` schedule) on senior + junior.
Both models run every decode step of a tandem rollout, so the physical bound is 0.5x single-model throughput;
the target is >= 0.45x. On CUDA both engines take the static-cache compiled path (one warm-up call of the same
shapes first) and the script also prints the peak memory against the two models' weights plus their two KV
caches (layers x 2 x batch x (prompt + new) x kv_heads x head_dim x bytes, per model).

Prints one table row per repeat and the min / median of the ratio; the last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from graft_cli.rollout.engine import SamplingParams  # noqa: E402
from graft_cli.rollout.hf import HFEngine  # noqa: E402
from graft_cli.rollout.tandem import TandemEngine  # noqa: E402


class _VocabTok:
    """A stand-in tokenizer for random-token models: ids whose string starts with 'Ġ' (about Qwen3's share,
    53,021 / 151,936) are word openings; decoding returns empty strings."""

    def __init__(self, vocab: int, eos: int, share: float = 0.35, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        opens = torch.rand(vocab, generator=g) < share
        self._toks = [("\u0120" if o else "") + f"t{i}" for i, o in enumerate(opens.tolist())]
        self.eos_token_id = self.pad_token_id = eos
        self.all_special_ids = [eos]

    def __len__(self):
        return len(self._toks)

    def get_vocab(self):
        return {t: i for i, t in enumerate(self._toks)}

    def convert_ids_to_tokens(self, ids):
        return [self._toks[i] for i in ids]

    def batch_decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=None):
        return [""] * len(ids)


def qwen3_4b():
    from transformers import Qwen3Config

    # Qwen3-4B(-Instruct-2507): 36 layers, d 2560, 32 heads / 8 KV heads, head_dim 128, MLP 9728, vocab 151936, tied
    return Qwen3Config(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                       rope_theta=5_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, eos_token_id=151645,
                       attn_implementation="sdpa")


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def no_eos(engine):
    """Every row runs to max_new_tokens (equal work on both sides)."""
    for e in (engine, getattr(engine, "senior", None), getattr(engine, "junior", None)):
        if e is not None:
            e.eos_ids = [-1]


def kv_bytes(cfg, batch: int, length: int, dtype) -> int:
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return cfg.num_hidden_layers * 2 * batch * length * cfg.num_key_value_heads * hd * torch.finfo(dtype).bits // 8


def weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def load_pair(args, dev):
    if args.real:
        from transformers import AutoModelForCausalLM

        cfg = qwen3_4b()
        torch.manual_seed(0)
        senior = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).to(dev).eval()
        torch.manual_seed(1)
        junior = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).to(dev).eval()
        tok = _VocabTok(cfg.vocab_size, cfg.eos_token_id)
        g = torch.Generator().manual_seed(0)
        prompts = torch.randint(2, cfg.vocab_size, (args.batch, args.prompt_len), generator=g).tolist()
        return senior, junior, tok, prompts, cfg
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from graft_cli.data.prompts import PromptSpec
    from graft_cli.data.problems import load_problems
    from graft_cli.tiny.build import ensure_tiny

    paths = ensure_tiny(progress=False)
    tok = AutoTokenizer.from_pretrained(paths["a"])
    senior = AutoModelForCausalLM.from_pretrained(paths["a"], dtype=torch.float32).eval()
    junior = AutoModelForCausalLM.from_pretrained(paths["junior"], dtype=torch.float32).eval()
    probs = load_problems(os.path.join(paths["task"], "train.jsonl"))[: args.batch]
    prompts = [PromptSpec().encode(p.problem, tok) for p in probs]
    return senior, junior, tok, prompts, senior.config


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", action="store_true", help="CUDA: random-initialised Qwen3-4B-shape senior and junior")
    ap.add_argument("--batch", type=int, default=None, help="sequences [tiny: 512 = 64 prompts x 8; real: 64]")
    ap.add_argument("--prompt-len", type=int, default=256, help="--real: random prompt tokens")
    ap.add_argument("--new-tokens", type=int, default=None, help="tokens per row [tiny: 48; real: 512]")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-compile", action="store_true", help="CUDA: static cache without torch.compile")
    args = ap.parse_args(argv)
    args.batch = args.batch or (64 if args.real else 512)
    args.new_tokens = args.new_tokens or (512 if args.real else 48)
    torch.set_num_threads(args.threads)
    dev = torch.device("cuda" if args.real else "cpu")
    if args.real and not torch.cuda.is_available():
        print("--real needs CUDA")
        return 2
    senior, junior, tok, prompts, cfg = load_pair(args, dev)
    kw = {"cache": "static", "compile": not args.no_compile} if dev.type == "cuda" else {}
    single = HFEngine(senior, tok, max_batch=args.batch, **kw)
    tandem = TandemEngine(senior, tok, junior=junior, max_batch=args.batch, **kw)
    no_eos(single)
    no_eos(tandem)
    sp = SamplingParams(n=1, temperature=1.0, top_p=1.0, max_new_tokens=args.new_tokens, seed=0)
    if dev.type == "cuda":  # warm-up: compilation / CUDA graphs for these shapes
        single.generate(prompts, sp)
        tandem.generate(prompts, sp)
        torch.cuda.reset_peak_memory_stats(dev)
    print(f"# {'real Qwen3-4B shape, bf16, cuda' if args.real else 'tiny pair a + junior, fp32, cpu'}; batch "
          f"{len(prompts)}, {args.new_tokens} new tokens per row, {args.threads} threads, torch {torch.__version__}")
    print("| repeat | single tok/s | tandem tok/s | tandem / single | senior token share |")
    print("|---|---|---|---|---|")
    ratios, rows = [], []
    for r in range(args.repeat):
        out = {}
        for name, eng in (("single", single), ("tandem", tandem)):
            sync(dev)
            t = time.perf_counter()
            ro = eng.generate(prompts, sp)
            sync(dev)
            dt = time.perf_counter() - t
            out[name] = (sum(len(x) for x in ro.response_ids) / dt, ro)
        ratio = out["tandem"][0] / out["single"][0]
        share = out["tandem"][1].meta["metrics"]["tandem/senior_token_frac"]
        ratios.append(ratio)
        rows.append({"single_tok_s": out["single"][0], "tandem_tok_s": out["tandem"][0], "ratio": ratio})
        print(f"| {r + 1} | {out['single'][0]:.0f} | {out['tandem'][0]:.0f} | {ratio:.3f} | {share:.3f} |")
    res = {"ratio_min": min(ratios), "ratio_median": statistics.median(ratios), "repeats": rows,
           "batch": len(prompts), "new_tokens": args.new_tokens, "device": dev.type, "threads": args.threads}
    print(f"ratio tandem / single: min {min(ratios):.3f}, median {statistics.median(ratios):.3f} "
          f"(bound 0.5, target >= 0.45)")
    if dev.type == "cuda":
        length = max(len(p) for p in prompts) + args.new_tokens
        budget = 2 * weight_bytes(senior) + 2 * kv_bytes(cfg, len(prompts), length, torch.bfloat16)
        peak = torch.cuda.max_memory_allocated(dev)
        res.update(peak_gib=peak / 2**30, two_models_two_caches_gib=budget / 2**30)
        print(f"peak memory {peak / 2**30:.2f} GiB vs two models + two caches {budget / 2**30:.2f} GiB")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
