#!/usr/bin/env bash
# Issue 17's proof on one GPU (<= 8 min on an H200): graft's training, scoring and rollout kernels on real-shape
# models, then two GRAFT and two GRPO steps of pair 1's shapes (SmolLM3-3B <-> Qwen3-1.7B, random weights:
# run.model_init=random, no download) through `graft train` in bf16 on the HF engine's CUDA fast path.
# Everything goes under $OUT (default results/gpu_proof): gpu_bench.json, runs/, proof.json.
#
#   bash benchmarks/gpu_proof.sh              # on the GPU machine (torch + transformers there; the pure-Python
#                                             # deps below come in .gpu_deps, built here by `make gpu-deps`)
#   GPU_PROOF_SMOKE=1 bash benchmarks/gpu_proof.sh   # the same script on a CPU, shrunk shapes (seconds)
#
# Batch shape scaled to one GPU: 16 prompts x 8 samples per policy (the paper: 128 x 8 on 8 GPUs), 512 new tokens
# (the paper: 4096), 2 minibatches; prompts are the tiny task's problems after a long preamble (~600 tokens under
# the synthetic character tokenizer); the reward is the benchmark-only coin flip, so groups are mixed and the
# exchange runs (random weights never solve anything).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-results/gpu_proof}"
mkdir -p "$OUT"
if [ -d .gpu_deps ]; then export PYTHONPATH="$PWD/.gpu_deps:$PWD${PYTHONPATH:+:$PYTHONPATH}"; else export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"; fi
PY="${PY:-python3}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
if [ -n "${GPU_PROOF_SMOKE:-}" ]; then
  BENCH=(--tiny); SHAPE=(run.random_shrink=true run.dtype=float32 run.device=cpu); B=4; N=2; T=8; PRE=2
else
  BENCH=(); SHAPE=(run.dtype=bfloat16 run.device=cuda); B=16; N=8; T=512; PRE=12
fi

# 1. kernels: train / score / rollout throughput, MFU, peak memory, engine-vs-trainer log-prob gap
$PY benchmarks/gpu_bench.py "${BENCH[@]}" 2>&1 | tee "$OUT/gpu_bench.log"
grep '^JSON ' "$OUT/gpu_bench.log" | sed 's/^JSON //' > "$OUT/gpu_bench.json"

# 2. a problem file with long prompts (the tiny task's problems after a preamble)
$PY - "$OUT/problems.jsonl" "$PRE" <<'PYEOF'
import json, sys
from graft_cli.data.synthetic import build_task
pre = " ".join(["Read the problem carefully, reason step by step, check each intermediate result, and give the "
                "final answer in a box."] * int(sys.argv[2]))
with open(sys.argv[1], "w") as f:
    for r in build_task(0, 512)["train"]:
        f.write(json.dumps({"id": r["id"], "problem": pre + " " + r["problem"], "answer": r["answer"]}) + "\n")
PYEOF

# 3. two steps each of GRPO and GRAFT on pair 1's shapes
for m in grpo graft; do
  $PY -m graft_cli.cli train --pair 1 --method "$m" --steps 2 --out "$OUT/runs" --no-progress \
    run.model_init=random "${SHAPE[@]}" reward.name=coinflip "data.train=$OUT/problems.jsonl" \
    data.prompt_batch=$B rollout.n=$N rollout.max_new_tokens=$T algo.minibatch_prompts=$((B / 2)) \
    rollout.max_prompt_tokens=4096 run.log_rollouts=false run.save_every=100 eval.every=0 run.resume=false \
    optim.gradient_checkpointing=true 2>&1 | tee "$OUT/train_$m.log"
done

# 4. the figures: s/step (step 2: compiled), GRAFT/GRPO, per-phase time and peak memory
$PY - "$OUT" <<'PYEOF'
import json, os, sys
out = sys.argv[1]
res = {}
for m in ("grpo", "graft"):
    rows = [json.loads(x) for x in open(os.path.join(out, "runs", f"1-{m}-s0", "metrics.jsonl")) if x.strip()]
    last = [r for r in rows if r["step"] == 2 and "time/step" in r]
    res[m] = {"s_per_step": last[0]["time/step"],
              "phases_s": {k: max(r.get(k, 0) for r in last) for k in ("time/rollout", "time/reward",
                                                                      "time/old_logprob", "time/update")},
              "peak_gib": {k: max(r.get(k, 0) for r in last) for k in last[0] if k.startswith("memory/")},
              "tokens": sum(r.get("num_tokens", 0) for r in last)}
res["graft_over_grpo"] = res["graft"]["s_per_step"] / res["grpo"]["s_per_step"]
bench = json.load(open(os.path.join(out, "gpu_bench.json"))) if os.path.getsize(os.path.join(out, "gpu_bench.json")) else {}
res["gpu_bench"] = bench
json.dump(res, open(os.path.join(out, "proof.json"), "w"), indent=1)
for m in ("grpo", "graft"):
    r = res[m]
    print(f"{m}: {r['s_per_step']:.2f} s/step (step 2), phases {r['phases_s']}, peak GiB {r['peak_gib']}")
print(f"GRAFT / GRPO step time: {res['graft_over_grpo']:.3f} (target <= 1.10)")
print(f"written: {os.path.join(out, 'proof.json')}")
PYEOF
