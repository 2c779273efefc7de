"""The machine's own limit, and how much of it a graft training step reaches on CPU.

    python benchmarks/cpu_peak.py                       # short workload, 1 and 2 threads (~6 min on 2 cores)
    python benchmarks/cpu_peak.py --workload long --threads 2

1. **Peak.** ``torch.mm`` of square fp32 (and bf16, where the CPU has AVX512-BF16 or AMX) matrices of
   256..4096, best of several runs per size, at each thread count: the matmul peak in GFLOP/s. Memory
   bandwidth: a 512 MiB fp32 copy (read + write bytes per second).
2. **The step.** graft's default trainer on the benchmark workload of ``benchmarks/cpu_trl_compare.py`` (same
   model, batch and problems): one warm-up step, then ``--steps`` timed steps with the phases from the
   trainer's ``time/*`` metrics. The FLOPs of the same steps are counted by
   ``torch.utils.flop_counter.FlopCounterMode`` on a second, identical trainer (same seeds, same samples: the
   CPU run is deterministic), split into the rollout (``engine.generate``) and the update (scoring + forward +
   backward). Achieved GFLOP/s = FLOPs / phase seconds, as a share of the peak. FlopCounterMode counts matmuls
   (mm, bmm, addmm, linear) and attention; element-wise work, softmax and the optimizer are not counted.
3. **What bounds each phase.** For the update, the matmul rate at the update's own shapes (tokens x hidden @
   hidden x MLP) against the square peak; for the rollout, one decode step's time against the FLOPs it does,
   and the time of an empty forward-sized Python loop of the same number of module calls.
4. **bf16 autocast** (``--bf16``, where supported): the same step with ``optim.autocast=bfloat16`` and
   ``rollout.engine_kwargs.autocast=bfloat16`` (phases and s/step), and the error of bf16 autocast log-probs
   against fp32 on the step's rows (max and mean absolute difference per token).

The last line is ``JSON {...}`` with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


# bf16 keeps the rollout log-probs explicitly (auto would add the trainer's scoring pass under autocast), so the
# two rows do the same work
TAGS = {"fp32": [], "bf16": ["optim.autocast=bfloat16", "+rollout.engine_kwargs.autocast=bfloat16",
                             "algo.old_logprobs=rollout"],
        "before": ["algo.old_logprobs=trainer", "optim.shared_prefix=false", "+rollout.engine_kwargs.rng=batch",
                   "+rollout.engine_kwargs.compact=false", "+rollout.engine_kwargs.share_prompts=false"]}


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def bf16_supported() -> bool:
    f = cpu_flags()
    return "avx512_bf16" in f or "amx_bf16" in f


def mm_rate(m: int, k: int, n: int, dtype, reps: int = 0) -> float:
    """Best GFLOP/s of ``(m, k) @ (k, n)`` over a few timed runs."""
    import torch

    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    flops = 2.0 * m * k * n
    reps = reps or max(3, min(50, int(2e10 / flops)))
    torch.mm(a, b)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b)
        best = min(best, (time.perf_counter() - t) / reps)
    return flops / best / 1e9


def peak(threads: int, dtypes: list) -> dict:
    import torch

    torch.set_num_threads(threads)
    out = {}
    for dt in dtypes:
        rates = {n: mm_rate(n, n, n, dt) for n in (256, 512, 1024, 2048, 4096)}
        out[str(dt).replace("torch.", "")] = {"gflops_by_size": {str(k): round(v, 1) for k, v in rates.items()},
                                              "peak_gflops": round(max(rates.values()), 1)}
    x = torch.empty(128 * 1024 * 1024)
    x.fill_(1.0)
    y = torch.empty_like(x)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        y.copy_(x)
        best = min(best, time.perf_counter() - t)
    out["copy_GBps"] = round(2 * x.numel() * 4 / best / 1e9, 1)
    return out


def make_trainer(model: str, data: str, out: str, w: dict, extra: list[str]):
    from cpu_trl_compare import graft_overrides

    from graft_cli import config as C
    from graft_cli.train.loop import Trainer

    cfg = C.compose(["pair=tiny", "method=grpo", f"policies=[{{name: a, model: '{model}'}}]", f"data.train={data}",
                     f"run.out={out}", f"data.prompt_batch={w['prompts']}", f"algo.minibatch_prompts={w['prompts']}",
                     f"rollout.n={w['n']}", f"rollout.max_new_tokens={w['new_tokens']}", "reward.num_workers=0",
                     "optim.lr=1e-4", "run.device=cpu", "run.dtype=float32", "run.log_rollouts=false",
                     f"rollout.max_batch={w['prompts'] * w['n']}", "prompt.chat_template=none",
                     *graft_overrides("graft:default", w, False), *extra])
    return Trainer(cfg, out, progress=False)


def timed_steps(model, data, tmp, w, steps: int, extra: list[str], tag: str) -> list[dict]:
    tr = make_trainer(model, data, os.path.join(tmp, f"time-{tag}"), w, extra)
    rows = []
    for _ in range(steps + 1):
        t = time.perf_counter()
        m = tr.train_step()[0]
        rows.append({"s": time.perf_counter() - t, "rollout_s": m["time/rollout"],
                     "update_s": m["time/update"] + m["time/old_logprob"], "tokens": m["num_tokens"]})
    tr.close()
    return rows[1:]


def counted_steps(model, data, tmp, w, steps: int, extra: list[str], tag: str) -> list[dict]:
    """FLOPs of the same steps as :func:`timed_steps`, split into rollout and the rest."""
    from torch.utils.flop_counter import FlopCounterMode

    tr = make_trainer(model, data, os.path.join(tmp, f"count-{tag}"), w, extra)
    pol = next(iter(tr.policies.values()))
    fc = FlopCounterMode(display=False)
    gen = {"flops": 0}
    orig = pol.engine.generate

    def generate(*a, **k):
        before = fc.get_total_flops()
        r = orig(*a, **k)
        gen["flops"] += fc.get_total_flops() - before
        return r

    pol.engine.generate = generate
    rows = []
    with fc:
        for _ in range(steps + 1):
            gen["flops"] = 0
            before = fc.get_total_flops()
            tr.train_step()
            total = fc.get_total_flops() - before
            rows.append({"rollout_flops": gen["flops"], "update_flops": total - gen["flops"]})
    tr.close()
    return rows[1:]


def decode_bound(model_path: str, w: dict) -> dict:
    """One decode step of the rollout's batch: its time, its FLOPs, and the matmul time those FLOPs need."""
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    B, L = w["prompts"] * w["n"], 80 if w["problem"] == "short" else 160
    ids = torch.randint(3, 90, (B, L))
    with torch.no_grad():
        cache = DynamicCache()
        model(input_ids=ids, use_cache=True, past_key_values=cache)
        tok = torch.randint(3, 90, (B, 1))
        times = []
        for _ in range(24):
            s = time.perf_counter()
            model(input_ids=tok, use_cache=True, past_key_values=cache, logits_to_keep=1)
            times.append(time.perf_counter() - s)
    n_layers = model.config.num_hidden_layers
    nonemb = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n)
    step_flops = 2.0 * B * nonemb + 2.0 * B * model.config.hidden_size * model.config.vocab_size
    h, mlp = model.config.hidden_size, model.config.intermediate_size
    mm = mm_rate(B, h, mlp, torch.float32)
    step_s = statistics.median(times[4:])
    calls = sum(1 for _ in model.modules())
    s = time.perf_counter()
    x = torch.zeros(1)
    for _ in range(calls):
        x = x + 0.0
    op_s = time.perf_counter() - s
    return {"rows": B, "decode_step_ms": round(step_s * 1e3, 2), "decode_step_mflops": round(step_flops / 1e6, 1),
            "decode_gflops": round(step_flops / step_s / 1e9, 2), "mm_gflops_at_decode_shape": round(mm, 1),
            "matmul_time_share": round(step_flops / (mm * 1e9) / step_s, 3), "layers": n_layers,
            "modules": calls, "one_tiny_op_per_module_ms": round(op_s * 1e3, 3)}


def bf16_logprob_error(model_path: str, w: dict, data: str) -> dict:
    """Max / mean |log p_bf16-autocast - log p_fp32| per response token on sampled rows of the workload."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from graft_cli.data.prompts import PromptSpec
    from graft_cli.models.logprobs import autocast_gap
    from graft_cli.rollout.engine import SamplingParams
    from graft_cli.rollout.hf import HFEngine

    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    tok = AutoTokenizer.from_pretrained(model_path)
    spec = PromptSpec(chat_template="none")
    probs = [json.loads(x)["problem"] for x in open(data)][: w["prompts"]]
    prompts = [spec.encode(p, tok) for p in probs]
    ro = HFEngine(model, tok).generate(prompts, SamplingParams(n=w["n"], temperature=1.0, top_p=1.0,
                                                               max_new_tokens=w["new_tokens"], seed=0))
    P = [p for p in prompts for _ in range(w["n"])]
    d = autocast_gap(model, P, ro.response_ids, tok.pad_token_id)
    return {"tokens": int(d.numel()), "max_abs": round(float(d.max()), 5), "mean_abs": round(float(d.mean()), 6),
            "ratio_bounds": [round(float((-d.max()).exp()), 4), round(float(d.max().exp()), 4)]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="short", choices=("short", "long"))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--no-bf16", action="store_true", help="skip the bf16 autocast runs")
    ap.add_argument("--tags", default="fp32,bf16", help="step variants: fp32 (the defaults), bf16 (autocast), "
                    "before (the defaults before 2026-12-02: trainer-recomputed old log-probs, one batch stream, "
                    "no compaction, no shared prompts)")
    a = ap.parse_args(argv)
    import torch

    from cpu_trl_compare import WORKLOADS, build

    w = WORKLOADS[a.workload]
    bf16 = bf16_supported() and not a.no_bf16
    flags = cpu_flags()
    res = {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags, "workload": a.workload}
    print(f"torch {torch.__version__}, capability {res['cpu_capability']}, avx512_bf16 {res['avx512_bf16']}, "
          f"amx_bf16 {res['amx_bf16']}, {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        model, data = build(tmp, a.workload, w, w["prompts"] * (a.steps + 2) * 2)
        for th in [int(x) for x in a.threads.split(",")]:
            torch.set_num_threads(th)
            r = {"peak": peak(th, [torch.float32] + ([torch.bfloat16] if bf16 else []))}
            pk = r["peak"]["float32"]["peak_gflops"]
            print(f"\n## {th} thread(s): fp32 matmul peak {pk} GFLOP/s "
                  f"{r['peak']['float32']['gflops_by_size']}" +
                  (f"; bf16 {r['peak']['bfloat16']['peak_gflops']} GFLOP/s {r['peak']['bfloat16']['gflops_by_size']}"
                   if bf16 else "") + f"; copy {r['peak']['copy_GBps']} GB/s", flush=True)
            torch.set_num_threads(th)
            for tag in [t for t in a.tags.split(",") if t != "bf16" or bf16]:
                extra = TAGS[tag]
                ts = timed_steps(model, data, tmp, w, a.steps, extra, f"{tag}{th}")
                cs = counted_steps(model, data, tmp, w, a.steps, extra, f"{tag}{th}")
                ro_s, up_s = sum(x["rollout_s"] for x in ts), sum(x["update_s"] for x in ts)
                ro_f, up_f = sum(x["rollout_flops"] for x in cs), sum(x["update_flops"] for x in cs)
                ref = r["peak"]["bfloat16" if tag == "bf16" else "float32"]["peak_gflops"]  # the dtype's own
                ph = {"s_per_step": round(statistics.mean(x["s"] for x in ts), 3),
                      "rollout_s": round(ro_s / len(ts), 3), "update_s": round(up_s / len(ts), 3),
                      "rollout_gflop_per_step": round(ro_f / len(cs) / 1e9, 2),
                      "update_gflop_per_step": round(up_f / len(cs) / 1e9, 2),
                      "rollout_gflops": round(ro_f / ro_s / 1e9, 2), "update_gflops": round(up_f / up_s / 1e9, 2),
                      "rollout_share_of_peak": round(ro_f / ro_s / 1e9 / ref, 4),
                      "update_share_of_peak": round(up_f / up_s / 1e9 / ref, 4),
                      "update_share_of_fp32_peak": round(up_f / up_s / 1e9 / pk, 4)}
                r[tag] = ph
                print(f"{tag}: {ph['s_per_step']} s/step; rollout {ph['rollout_s']} s, "
                      f"{ph['rollout_gflop_per_step']} GFLOP -> {ph['rollout_gflops']} GFLOP/s "
                      f"({100 * ph['rollout_share_of_peak']:.1f}% of peak); update {ph['update_s']} s, "
                      f"{ph['update_gflop_per_step']} GFLOP -> {ph['update_gflops']} GFLOP/s "
                      f"({100 * ph['update_share_of_peak']:.1f}% of peak)", flush=True)
            h, mlp = w["hidden"], w["intermediate"]
            tokens_mb = 4096
            r["update_shape_mm_gflops"] = round(mm_rate(tokens_mb, h, mlp, torch.float32), 1)
            if bf16:
                r["update_shape_mm_gflops_bf16"] = round(mm_rate(tokens_mb, h, mlp, torch.bfloat16), 1)
            r["decode"] = decode_bound(model, w)
            print(f"matmul at the update's shape ({tokens_mb} x {h} @ {h} x {mlp}): {r['update_shape_mm_gflops']} "
                  f"GFLOP/s fp32" + (f", {r['update_shape_mm_gflops_bf16']} bf16" if bf16 else "") +
                  f"; decode step: {json.dumps(r['decode'])}", flush=True)
            res[str(th)] = r
        if bf16:
            torch.set_num_threads(2)
            res["bf16_logprob_error"] = bf16_logprob_error(model, w, data)
            print(f"bf16 autocast log-probs vs fp32: {json.dumps(res['bf16_logprob_error'])}")
    print("JSON " + json.dumps(res))
    return res


if __name__ == "__main__":
    main()
