"""How many GPUs and nodes a real pair needs, worked from the models' configs (docs/scale_out.md).

    python benchmarks/plan_resources.py                  # every real run of experiments/pair, 80 GB and 141 GB GPUs
    python benchmarks/plan_resources.py --gpu-gb 141 --markdown

Model dimensions are the published configs (config.json of each hub model, written out here: this machine has no
hub). Per run it prints the parameters, then the memory per GPU of each part at the chosen GPU count, and the
smallest count (in whole nodes of ``--gpus-per-node``) that fits ``--gpu-gb`` with ``--headroom`` left over:

- trained policies: fp32 master weights + fp32 gradients + AdamW's two fp32 moments = 16 B per parameter
  (graft's FSDP2 setting: ``run.dtype: float32`` with bf16 compute), FSDP-sharded over every GPU; with LoRA
  (``--lora-r``, ``policies.N.lora.r``) the base is frozen in bf16 (2 B per parameter, ``run.dtype: bfloat16``) and
  only the adapters' parameters cost 16 B (a KL reference is the base with the adapter disabled: no copy);
- frozen models (teacher, reference, junior): bf16 weights, 2 B per parameter, sharded the same way;
- activations of the update with gradient checkpointing: one checkpoint (d_model bf16 values) per layer and
  token of a micro-batch (``optim.micro_batch_tokens`` per rank), plus one layer's working set recomputed
  (~ 34·d_model + 5·heads·T bytes per token, Korthikanti et al. 2022, with flash attention: no T² term) and
  the LM-head chunk (``optim.chunk_tokens`` × vocab fp32 logits, twice for the backward);
- the vLLM engine (colocated, asleep while the trainer runs, so it counts against the same GPU only at rollout
  time: the peak is max(trainer, engine)): bf16 weights of the policy split over ``tensor_parallel_size`` GPUs
  plus the KV cache of the rollout batch (2 · layers · kv_heads · head_dim · 2 B per token; prompt +
  ``max_new_tokens`` for ``--concurrent-seqs`` sequences at once (vLLM sizes its cache by
  ``gpu_memory_utilization`` and preempts beyond it: fewer concurrent sequences cost throughput, not feasibility;
  64 is a planning figure). The smallest GPU count (whole nodes past one) and then the smallest tensor
  parallelism that fit are printed.

It is an estimate for planning, not a measurement: allocator fragmentation, NCCL buffers and CUDA graphs take a few
more GB; the headroom covers them.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

GB = 1024 ** 3


@dataclass(frozen=True)
class Shape:
    """The config.json fields the memory depends on (MoE: experts, active experts, expert MLP width)."""

    name: str
    layers: int
    d: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    vocab: int
    tied: bool
    experts: int = 0
    active: int = 0
    expert_mlp: int = 0

    def params(self, active_only: bool = False) -> int:
        attn = self.d * (self.heads + 2 * self.kv_heads) * self.head_dim + self.heads * self.head_dim * self.d
        if self.experts:
            n = self.active if active_only else self.experts
            mlp = n * 3 * self.d * self.expert_mlp + self.d * self.experts  # experts + router
        else:
            mlp = 3 * self.d * self.mlp  # gate, up, down
        norms = 2 * self.d + 2 * self.head_dim  # two RMSNorms per layer (+ Qwen3's q/k norms)
        emb = self.vocab * self.d * (1 if self.tied else 2)
        return self.layers * (attn + mlp + norms) + emb + self.d

    def lora_params(self, r: int) -> int:
        """Parameters of rank-``r`` LoRA adapters on every linear layer but the LM head (``all-linear``): r x (d_in +
        d_out) for q, k, v, o and each MLP projection (each expert's, for a MoE)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = (self.d + q) + 2 * (self.d + kv) + (q + self.d)
        width, n = (self.expert_mlp, self.experts) if self.experts else (self.mlp, 1)
        mlp = n * 3 * (self.d + width)
        return self.layers * r * (attn + mlp)

    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, bf16


# Published configs (hub config.json): Qwen3 dense (1.7B/4B/8B, the 4B-Instruct-2507 has the 4B's shape), Qwen3's
# 30B-A3B MoE, SmolLM3-3B, OctoThinker-3B (a Llama-3.2-3B continued pre-training).
SHAPES = {s.name: s for s in (
    Shape("Qwen/Qwen3-1.7B", 28, 2048, 16, 8, 128, 6144, 151936, True),
    Shape("Qwen/Qwen3-4B", 36, 2560, 32, 8, 128, 9728, 151936, True),
    Shape("Qwen/Qwen3-8B", 36, 4096, 32, 8, 128, 12288, 151936, False),
    Shape("Qwen/Qwen3-30B-A3B-Instruct-2507", 48, 2048, 32, 4, 128, 0, 151936, False, 128, 8, 768),
    Shape("HuggingFaceTB/SmolLM3-3B-Base", 36, 2048, 16, 4, 128, 11008, 128256, True),
    Shape("OctoThinker/OctoThinker-3B-Hybrid-Base", 28, 3072, 24, 8, 128, 8192, 128256, True),
)}
SHAPES["Qwen/Qwen3-1.7B-Base"] = SHAPES["Qwen/Qwen3-1.7B"]
SHAPES["Qwen/Qwen3-4B-Instruct-2507"] = SHAPES["Qwen/Qwen3-4B"]


@dataclass(frozen=True)
class Run:
    """One real configuration: trained and frozen models, the response length and the settings of the scale config
    (experiments/scale/4xh200.yaml: micro-batch 32k tokens per rank, vLLM tensor parallelism 2)."""

    name: str
    trained: tuple
    frozen: tuple
    prompt_tokens: int
    new_tokens: int


RUNS = (
    Run("pair 1 (SmolLM3-3B + Qwen3-1.7B), GRAFT", ("HuggingFaceTB/SmolLM3-3B-Base", "Qwen/Qwen3-1.7B-Base"), (),
        2048, 4096),
    Run("pair 2 (OctoThinker-3B + Qwen3-1.7B), GRAFT",
        ("OctoThinker/OctoThinker-3B-Hybrid-Base", "Qwen/Qwen3-1.7B-Base"), (), 2048, 4096),
    Run("three peers (pair=three), N-peer GRAFT",
        ("HuggingFaceTB/SmolLM3-3B-Base", "Qwen/Qwen3-1.7B-Base", "OctoThinker/OctoThinker-3B-Hybrid-Base"), (),
        2048, 4096),
    Run("SAF-OPD, Qwen3-8B student + Qwen3-30B-A3B teacher", ("Qwen/Qwen3-8B",),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507",), 2048, 16384),
    Run("SAF-OPD, Qwen3-1.7B student + Qwen3-30B-A3B teacher", ("Qwen/Qwen3-1.7B",),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507",), 2048, 16384),
    Run("Tandem RLVR, Qwen3-4B-Instruct senior + Qwen3-1.7B junior", ("Qwen/Qwen3-4B-Instruct-2507",),
        ("Qwen/Qwen3-1.7B",), 1024, 3000),
)


def activations_gb(s: Shape, micro_tokens: int, chunk_tokens: int) -> float:
    """Per rank: checkpoints (bf16 d per layer and token) + one recomputed layer + the LM-head chunk's logits."""
    ckpt = s.layers * s.d * 2 * micro_tokens
    layer = (34 * s.d + 5 * s.heads) * micro_tokens
    head = 2 * chunk_tokens * s.vocab * 4
    return (ckpt + layer + head) / GB


def plan(run: Run, gpus: int, gpu_gb: float, micro_tokens: int, chunk_tokens: int, tp: int,
         concurrent_seqs: int, lora_r: int = 0) -> dict:
    """Memory per GPU of ``run`` on ``gpus`` GPUs; ``lora_r`` > 0: each trained policy is its bf16 base (frozen, 2 B
    per parameter, sharded) plus rank-``lora_r`` adapters at 16 B per adapter parameter; a KL reference would be the
    base with the adapter disabled, so it costs nothing."""
    trained = sum(SHAPES[m].params() for m in run.trained)
    frozen = sum(SHAPES[m].params() for m in run.frozen)
    if lora_r:
        adapter = sum(SHAPES[m].lora_params(lora_r) for m in run.trained)
        states = (2 * trained + 16 * adapter) / gpus / GB
    else:
        adapter = 0
        states = 16 * trained / gpus / GB
    frozen_gb = 2 * frozen / gpus / GB
    act = max(activations_gb(SHAPES[m], micro_tokens, chunk_tokens) for m in run.trained)
    trainer = states + frozen_gb + act
    # rollout time: the engine of one policy at a time awake (sleep mode), the trainer's sharded states resident
    seq = run.prompt_tokens + run.new_tokens
    engine = max(2 * SHAPES[m].params() / tp / GB + SHAPES[m].kv_bytes_per_token() * seq * concurrent_seqs / tp / GB
                 for m in run.trained)
    rollout = states + frozen_gb + engine
    return {"trained_B": trained / 1e9, "frozen_B": frozen / 1e9, "adapter_M": adapter / 1e6, "states": states,
            "frozen": frozen_gb,
            "activations": act, "engine": engine, "peak": max(trainer, rollout), "gpu_gb": gpu_gb}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu-gb", type=float, nargs="+", default=[80.0, 141.0], help="GPU memory (GB) to plan for")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--headroom", type=float, default=0.1, help="share of each GPU left free")
    ap.add_argument("--micro-tokens", type=int, default=32768, help="optim.micro_batch_tokens (per rank)")
    ap.add_argument("--chunk-tokens", type=int, default=4096, help="optim.chunk_tokens")
    ap.add_argument("--max-tp", type=int, default=8, help="largest vLLM tensor_parallel_size to try")
    ap.add_argument("--concurrent-seqs", type=int, default=64,
                    help="sequences a rollout group holds in its KV cache at once (vLLM max_num_seqs)")
    ap.add_argument("--lora-r", type=int, nargs="+", default=[0, 16],
                    help="LoRA ranks to plan for (0: full weights); one table each")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args(argv)
    for r in a.lora_r:
        print(f"\n{'full weights' if not r else f'LoRA r={r} (all-linear adapters, bf16 base)'}\n")
        table(a, r)
    print(f"\nassumptions: 16 B/trained parameter sharded over all GPUs (fp32 weights, grads, AdamW; with LoRA: the "
          f"adapter's parameters, the base at 2 B), frozen bf16 sharded, gradient checkpointing at {a.micro_tokens} "
          f"tokens per rank, LM-head chunks of {a.chunk_tokens} rows, the smallest vLLM tp (<= {a.max_tp}) whose "
          f"engine holds {a.concurrent_seqs} sequences of prompt + max_new_tokens in its KV cache, {a.headroom:.0%} "
          f"headroom. The minimum that fits, not the fastest; launch forms: docs/scale_out.md.")


def table(a, lora_r: int) -> None:
    """One table: per run and GPU size, the smallest layout that fits."""
    print("| run | trained / frozen params (B) | GPU | GPUs (nodes), vLLM tp | per GPU: policy states + frozen + "
          "activations / engine -> peak (GiB) |")
    print("|---|---|---|---|---|")
    for run in RUNS:
        for gb in a.gpu_gb:
            best = None
            for nodes in range(1, 65):
                counts = [g for g in (1, 2, 4, 8) if g <= a.gpus_per_node] + [a.gpus_per_node]
                for gpus in sorted(set(counts)) if nodes == 1 else [a.gpus_per_node]:
                    total = nodes * gpus
                    for tp in (t for t in (1, 2, 4, 8) if t <= min(gpus, a.max_tp)):
                        p = plan(run, total, gb, a.micro_tokens, a.chunk_tokens, tp, a.concurrent_seqs, lora_r)
                        if p["peak"] <= gb * 1e9 / GB * (1 - a.headroom):  # the data sheet's GB -> GiB
                            best = (total, nodes, tp, p)
                            break
                    if best:
                        break
                if best:
                    break
            if best is None:
                print(f"| {run.name} | | {gb:.0f} GB | > 64 nodes | |")
                continue
            total, nodes, tp, p = best
            adapter = f" (adapters {p['adapter_M']:.1f}M)" if lora_r else ""
            print(f"| {run.name} | {p['trained_B']:.2f}{adapter} / {p['frozen_B']:.2f} | {gb:.0f} GB | "
                  f"{total} ({nodes}), tp {tp} | {p['states']:.1f} + {p['frozen']:.1f} + {p['activations']:.1f} / "
                  f"{p['engine']:.1f} -> {p['peak']:.1f} |")


if __name__ == "__main__":
    main()
