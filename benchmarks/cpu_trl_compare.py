"""GRPO step throughput on CPU: graft's trainer vs TRL's ``GRPOTrainer`` at TRL's best settings, on two workloads.

    pip install "trl==1.16.0"      # only for this benchmark
    python benchmarks/cpu_trl_compare.py                 # both workloads, 1 and 2 threads (~1.5 h on 2 cores)
    python benchmarks/cpu_trl_compare.py --quick         # 3 repeats, 1 thread, both workloads (~17 min, estimated)

Both sides run the same GRPO step on the same random Qwen3 and the same distinct prompts: sample ``n``
completions per prompt (temperature 1, top-p 1, no top-k), grade them with graft's math-verify grader
in-process, group-normalised advantages, the DAPO token-mean PPO-clip loss (ε 0.2 / 0.28, no KL), AdamW (lr 1e-4,
betas 0.9 / 0.999, weight decay 0.01 on both sides, grad-norm clip 1.0), one optimizer step per generation.

Workloads (``--workloads``), each with de-duplicated prompts (no prompt occurs twice in a run):
* ``short``: 1.80M-parameter Qwen3 (hidden 256, 4 layers), 16 prompts x 8 samples x <= 48 new tokens; a prompt
  is ~74 characters (tokens: the tokenizer is character-level), so the prompt is most of a row.
* ``long``: 19.0M-parameter Qwen3 (hidden 512, 6 layers, MLP 1536), prompts of ~150 tokens, 4 prompts x 8 samples
  x <= 512 new tokens: the response is most of a row, as in real RLVR.

Sides. Each run is a fresh process (``--worker``); within a repeat the sides run in a random order (seeded by
``--seed``). Per side and run: one warm-up step, then ``--steps`` timed steps.
* ``trl:mb<R>``: TRL 1.16 with ``gradient_checkpointing=False`` (TRL's default is True since 0.22),
  ``per_device_train_batch_size=R`` and ``gradient_accumulation_steps`` = rows / R, so every generation is
  one optimizer step over all its rows (TRL then computes no old log-probs: ``num_iterations=1``).
  R sweeps rows, rows / 4, rows / 8 (128 / 32 / 16 on ``short``). ``trl:cb`` adds
  ``use_transformers_continuous_batching=True`` at R = rows / 4.
* ``graft:default``: ``graft train``'s shipped defaults for a CPU run (pair=tiny with the model swapped in):
  rollout log-probs (``algo.old_logprobs: auto``), per-row sampling streams with decode compaction and shared
  prompt prefill (``rollout.engine_kwargs`` defaults), the shared-prefix forward and 4,096-token length-sorted
  micro-batches in the update.
* Attribution: ``graft:trl_equiv`` has only the TRL-equivalent options (rollout log-probs: no scoring pass;
  one batch-wide sampling stream, no compaction, no shared prefill, no shared prefix, the update's rows in one
  unsorted pass like TRL's ``mb<rows>``); ``graft:+streams`` adds per-row streams and compaction,
  ``graft:+share_prompts`` shared prefill, ``graft:+micro_batches`` the 4,096-token sorted micro-batches; adding
  the shared-prefix forward gives ``graft:default``.

Phases, per workload and thread count:
1. sweep: every side ``--sweep-repeats`` times; TRL's best setting is the one with the highest median tokens/s.
2. head to head: ``graft:default`` and the best TRL setting until each has ``--repeat`` runs (the sweep's count).
   Ratio: repeat k's graft tokens/s over repeat k's TRL tokens/s; reported as the geometric mean with a 95%
   t-interval over repeats (on log ratios).
3. equal work: the same two sides with EOS suppressed (graft ``rollout.engine_kwargs.ignore_eos``, TRL
   ``generation_kwargs={"min_new_tokens": max}``: every row generates the maximum), ``--fixed-repeats`` runs,
   in s/step (``--fixed-steps`` timed steps after the warm-up).

Timing: graft ``Trainer.train_step`` wall time (rollout, grading, scoring, update); TRL the wall time from
``on_step_begin`` to ``on_step_end`` of its optimizer step (generation, grading, its micro-batches, optimizer),
with ``_generate_and_score_completions`` timed inside as its rollout. Throughput = generated tokens per second of
step time. Each worker prints its effective arguments and ``torch.get_num_threads()``.

The last line is ``JSON {...}``: per workload and thread count, ``graft_default_tokens_per_s``,
``trl_best_tokens_per_s``, ``trl_best_setting``, ``ratio``, ``ratio_ci95`` and more.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

WORKLOADS = {
    "short": dict(prompts=16, n=8, new_tokens=48, hidden=256, layers=4, intermediate=512, heads=4, kv_heads=2,
                  head_dim=16, problem="short"),
    "long": dict(prompts=4, n=8, new_tokens=512, hidden=512, layers=6, intermediate=1536, heads=8, kv_heads=4,
                 head_dim=64, problem="long"),
}
MICRO_TOKENS = 4096  # graft's CPU micro-batch budget (experiments/pair/tiny.yaml)
ATTRIBUTION = ("graft:trl_equiv", "graft:+streams", "graft:+share_prompts", "graft:+micro_batches", "graft:default")
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 14: 2.145, 19: 2.093, 29: 2.045}


# --------------------------------------------------------------------------------------------- inputs
def problems(kind: str, count: int, seed: int = 0) -> list[dict]:
    """``count`` distinct problems: ``a+b`` (short) or a ~80-character word problem (long; with the prompt
    suffix ~150 character tokens)."""
    rng, seen, out = random.Random(seed), set(), []
    while len(out) < count:
        if kind == "short":
            a, b = rng.randint(1, 99), rng.randint(1, 99)
            text, ans = f"{a}+{b}", a + b
        else:
            a, b, c = rng.randint(2, 19), rng.randint(2, 19), rng.randint(1, 9)
            text, ans = f"A farm has {a} rows of {b} trees each and sells {c} of them. How many trees are left?", \
                a * b - c
        if text not in seen:
            seen.add(text)
            out.append({"id": f"p{len(out)}", "problem": text, "answer": str(ans)})
    return out


def build(tmp: str, name: str, w: dict, count: int, seed: int = 0, tied: bool = True) -> tuple[str, str]:
    """A random Qwen3 of the workload's shape (weights from ``seed``; the LM head tied to the embeddings as Qwen3's
    small models have it, or ``tied=False``) with a character tokenizer (pad 0, EOS 1), and its problem file."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from graft_cli.models.shapes import char_tokenizer

    path, data = os.path.join(tmp, f"model-{name}"), os.path.join(tmp, f"train-{name}.jsonl")
    tok = char_tokenizer()
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=len(tok), hidden_size=w["hidden"], intermediate_size=w["intermediate"],
        num_hidden_layers=w["layers"], num_attention_heads=w["heads"], num_key_value_heads=w["kv_heads"],
        head_dim=w["head_dim"], max_position_embeddings=1024, bos_token_id=None, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, tie_word_embeddings=tied))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    with open(data, "w") as f:
        for r in problems(w["problem"], count):
            f.write(json.dumps(r) + "\n")
    return path, data


# --------------------------------------------------------------------------------------------- the sides
def graft_overrides(side: str, w: dict, fixed: bool) -> list[str]:
    rows = w["prompts"] * w["n"]
    one_pass = rows * (200 + w["new_tokens"])  # every row of the minibatch in one micro-batch (TRL's mb<rows>)
    levels = {"graft:trl_equiv": 0, "graft:+streams": 1, "graft:+share_prompts": 2, "graft:+micro_batches": 3,
              "graft:default": 4}
    if side not in levels:
        raise SystemExit(f"unknown graft side {side!r}; known: {', '.join(levels)}")
    k = levels[side]
    ov = ["algo.old_logprobs=rollout"] if k < 4 else []  # default: auto (resolves to rollout here)
    if k < 1:
        ov += ["+rollout.engine_kwargs.rng=batch", "+rollout.engine_kwargs.compact=false"]
    if k < 2:
        ov += ["+rollout.engine_kwargs.share_prompts=false"]
    if k < 3:
        ov += [f"optim.micro_batch_tokens={one_pass}", "optim.sort_micro_batches=false"]
    if k < 4:
        ov += ["optim.shared_prefix=false"]
    if fixed:
        ov += ["+rollout.engine_kwargs.ignore_eos=true"]
    return ov


def graft_run(model: str, data: str, out: str, w: dict, steps: int, side: str, fixed: bool) -> tuple[list, dict]:
    import torch

    from graft_cli import config as C
    from graft_cli.train.loop import Trainer

    cfg = C.compose(["pair=tiny", "method=grpo", f"policies=[{{name: a, model: '{model}'}}]", f"data.train={data}",
                     f"run.out={out}", f"data.prompt_batch={w['prompts']}", f"algo.minibatch_prompts={w['prompts']}",
                     f"rollout.n={w['n']}", f"rollout.max_new_tokens={w['new_tokens']}", "rollout.temperature=1.0",
                     "rollout.top_p=1.0", "reward.num_workers=0", "optim.lr=1e-4", "optim.weight_decay=0.01",
                     "run.device=cpu", "run.dtype=float32", "run.log_rollouts=false",
                     f"rollout.max_batch={w['prompts'] * w['n']}", "algo.log_entropy=true",
                     "prompt.chat_template=none", *graft_overrides(side, w, fixed)])
    tr = Trainer(cfg, out, progress=False)
    eng = next(iter(tr.policies.values())).engine
    eff = {"algo.old_logprobs": cfg.algo.old_logprobs, "rollout.engine_kwargs": dict(cfg.rollout.engine_kwargs),
           "optim.shared_prefix": cfg.optim.shared_prefix, "optim.micro_batch_tokens": cfg.optim.micro_batch_tokens,
           "optim.sort_micro_batches": cfg.optim.sort_micro_batches, "optim.weight_decay": cfg.optim.weight_decay,
           "optim.gradient_checkpointing": cfg.optim.gradient_checkpointing, "optim.lr": cfg.optim.lr,
           "algo.agg": cfg.algo.agg, "algo.loss": cfg.algo.loss}
    eff["engine"] = {k: getattr(eng, k, None) for k in ("per_row", "compact", "share_prompts", "static", "ignore_eos")}
    res = []
    for _ in range(steps + 1):
        t = time.perf_counter()
        row = tr.train_step()[0]
        dt = time.perf_counter() - t
        res.append({"s": dt, "tokens": int(row["num_tokens"]), "rollout_s": row["time/rollout"] + row["time/reward"],
                    "score_s": row["time/old_logprob"], "update_s": row["time/update"]})
    eff["torch.get_num_threads"] = torch.get_num_threads()
    tr.close()
    return res[1:], eff


def trl_micro(side: str, rows: int) -> tuple[int, bool]:
    """(per_device_train_batch_size, continuous batching) of a TRL side."""
    if side == "trl:cb":
        return max(1, rows // 4), True
    return int(side.removeprefix("trl:mb")), False


def trl_sides(w: dict) -> list[str]:
    rows = w["prompts"] * w["n"]
    return [f"trl:mb{rows}", f"trl:mb{rows // 4}", f"trl:mb{rows // 8}", "trl:cb"]


def trl_run(model: str, data: str, out: str, w: dict, steps: int, side: str, fixed: bool) -> tuple[list, dict]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from graft_cli.data.prompts import PromptSpec
    from graft_cli.reward.pool import MathVerifyGrader

    rows = w["prompts"] * w["n"]
    mb, cb = trl_micro(side, rows)
    if rows % mb:
        raise SystemExit(f"{side}: {rows} rows are not a multiple of {mb}")
    tok = AutoTokenizer.from_pretrained(model)
    tok.padding_side = "left"
    spec = PromptSpec(chat_template="none")
    recs = [json.loads(x) for x in open(data)]
    ds = Dataset.from_list([{"prompt": spec.text(r["problem"], tok), "answer": r["answer"]} for r in recs])
    grader = MathVerifyGrader(num_workers=0)
    gen = {"s": 0.0, "tokens": 0}

    def reward(completions, answer, **_):
        return [float(x) for x in grader.grade(list(completions), list(answer)).rewards]

    class Timer(TrainerCallback):
        def __init__(self):
            self.steps: list[dict] = []

        def on_step_begin(self, args, state, control, **kw):
            gen["s"], gen["tokens"] = 0.0, 0
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            dt = time.perf_counter() - self.t
            self.steps.append({"s": dt, "tokens": gen["tokens"], "rollout_s": gen["s"], "score_s": None,
                               "update_s": dt - gen["s"]})

    cfg = GRPOConfig(output_dir=out, per_device_train_batch_size=mb, gradient_accumulation_steps=rows // mb,
                     num_generations=w["n"], max_completion_length=w["new_tokens"], temperature=1.0, top_p=1.0,
                     top_k=0, learning_rate=1e-4, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.01,
                     adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0, beta=0.0, loss_type="dapo", epsilon=0.2,
                     epsilon_high=0.28, num_iterations=1, scale_rewards="group", gradient_checkpointing=False,
                     use_transformers_continuous_batching=cb, max_steps=steps + 1, logging_steps=1,
                     report_to="none", use_cpu=True, save_strategy="no", seed=0, bf16=False, disable_dropout=True,
                     dataloader_num_workers=0,
                     generation_kwargs={"min_new_tokens": w["new_tokens"]} if fixed else None)
    timer = Timer()
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model), reward_funcs=reward, args=cfg,
                          train_dataset=ds, processing_class=tok, callbacks=[timer])
    inner = trainer._generate_and_score_completions  # rollout + reward (+ old log-probs when TRL needs them)

    def timed(*args, **kw):
        t = time.perf_counter()
        out_ = inner(*args, **kw)
        gen["s"] += time.perf_counter() - t
        mask = out_.get("completion_mask") if isinstance(out_, dict) else None
        gen["tokens"] += int(mask.sum()) if mask is not None else 0
        return out_

    trainer._generate_and_score_completions = timed
    a = trainer.args
    eff = {k: getattr(a, k) for k in ("per_device_train_batch_size", "gradient_accumulation_steps",
                                      "gradient_checkpointing", "weight_decay", "learning_rate", "loss_type", "beta",
                                      "num_iterations", "steps_per_generation", "generation_batch_size",
                                      "use_transformers_continuous_batching", "bf16", "torch_compile",
                                      "max_grad_norm", "epsilon", "epsilon_high", "scale_rewards", "top_k",
                                      "generation_kwargs")}
    trainer.train()
    eff["torch.get_num_threads"] = torch.get_num_threads()
    grader.close()
    return timer.steps[1:], eff


def worker(spec: dict) -> None:
    """One side's run in this (fresh) process; prints ``RESULT {json}``."""
    import torch

    torch.set_num_threads(spec["threads"])
    w = WORKLOADS[spec["workload"]]
    fn = trl_run if spec["side"].startswith("trl") else graft_run
    with tempfile.TemporaryDirectory() as out:
        steps, eff = fn(spec["model"], spec["data"], out, w, spec["steps"], spec["side"], spec["fixed"])
    print("RESULT " + json.dumps({"steps": steps, "effective": eff}), flush=True)


def summary(steps: list[dict]) -> dict:
    tok = sum(s["tokens"] for s in steps)
    sec = sum(s["s"] for s in steps)
    return {"s_per_step": sec / len(steps), "tokens_per_step": tok / len(steps), "tokens_per_s": tok / sec,
            "rollout_s": statistics.mean(s["rollout_s"] for s in steps),
            "update_s": statistics.mean(s["update_s"] for s in steps)}


def ratio_ci(graft: list[float], trl: list[float]) -> tuple[float, list[float]]:
    """Geometric mean of the paired ratios graft[k] / trl[k] and its 95% t-interval (on log ratios)."""
    logs = [math.log(g / t) for g, t in zip(graft, trl)]
    m = statistics.mean(logs)
    if len(logs) < 2:
        return math.exp(m), [math.exp(m), math.exp(m)]
    df = len(logs) - 1
    t = T975.get(df) or T975[max(k for k in T975 if k <= df)]
    h = t * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(m), [math.exp(m - h), math.exp(m + h)]


# --------------------------------------------------------------------------------------------- driver
class Runner:
    def __init__(self, a, model: str, data: str, workload: str, threads: int):
        self.a, self.model, self.data, self.workload, self.threads = a, model, data, workload, threads
        self.runs: dict[tuple[str, bool], list[dict]] = {}
        self.effective: dict[str, dict] = {}

    def run(self, side: str, fixed: bool = False) -> dict:
        spec = {"side": side, "workload": self.workload, "threads": self.threads, "fixed": fixed,
                "model": self.model, "data": self.data, "steps": self.a.fixed_steps if fixed else self.a.steps}
        env = dict(os.environ, OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads),
                   TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)], env=env,
                           capture_output=True, text=True)
        line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
        if p.returncode or line is None:
            tail = (p.stderr or p.stdout).strip().splitlines()[-5:]
            raise RuntimeError(f"{side} ({self.workload}, {self.threads} threads) failed: " + " | ".join(tail))
        res = json.loads(line[7:])
        s = summary(res["steps"])
        self.runs.setdefault((side, fixed), []).append(s)
        if side not in self.effective:
            self.effective[side] = res["effective"]
            print(f"    {side} effective: {json.dumps(res['effective'], default=str)}", flush=True)
        print(f"  [{self.workload} T={self.threads}{' fixed' if fixed else ''}] {side}: "
              f"{s['tokens_per_step']:.0f} tok/step {s['s_per_step']:.2f} s/step {s['tokens_per_s']:.0f} tok/s "
              f"(rollout {s['rollout_s']:.2f} s, rest {s['update_s']:.2f} s)", flush=True)
        return s

    def rounds(self, sides: list[str], count: int, fixed: bool, rng: random.Random) -> None:
        """Run each side until it has ``count`` runs of this kind, the sides in a random order each round."""
        while True:
            todo = [s for s in sides if len(self.runs.get((s, fixed), [])) < count]
            if not todo:
                return
            rng.shuffle(todo)
            for s in todo:
                self.run(s, fixed)

    def median(self, side: str, key: str = "tokens_per_s", fixed: bool = False) -> float:
        return statistics.median(r[key] for r in self.runs[(side, fixed)])


def run_workload(a, name: str, threads: int, model: str, data: str) -> dict:
    w = WORKLOADS[name]
    rng = random.Random(f"{a.seed}-{name}-{threads}")
    r = Runner(a, model, data, name, threads)
    trl = trl_sides(w) if not a.trl_sides else a.trl_sides.split(",")
    if a.no_cb:
        trl = [t for t in trl if t != "trl:cb"]
    graft = list(ATTRIBUTION) if not a.no_attribution else ["graft:default"]
    print(f"== {name}: {w['prompts']} prompts x {w['n']} x <= {w['new_tokens']} tokens, {threads} thread(s); "
          f"sweep ({a.sweep_repeats} each)", flush=True)
    failed = {}
    for side in trl + graft:  # probe each side once before the rounds, so a side that cannot run is reported
        try:
            r.run(side)
        except RuntimeError as e:
            failed[side] = str(e)
            print(f"  {side}: FAILED ({e})", flush=True)
    live = [s for s in trl + graft if s not in failed]
    r.rounds(live, a.sweep_repeats, False, rng)
    trl_live = [s for s in trl if s not in failed]
    best = max(trl_live, key=r.median)
    print(f"  best TRL setting: {best}; head to head to {a.repeat} runs each", flush=True)
    r.rounds(["graft:default", best], a.repeat, False, rng)
    if a.fixed_repeats:
        r.rounds(["graft:default", best], a.fixed_repeats, True, rng)
    g = [x["tokens_per_s"] for x in r.runs[("graft:default", False)]]
    t = [x["tokens_per_s"] for x in r.runs[(best, False)]]
    ratio, ci = ratio_ci(g, t)
    res = {"graft_default_tokens_per_s": statistics.median(g), "trl_best_tokens_per_s": statistics.median(t),
           "trl_best_setting": best, "trl_best_effective": r.effective.get(best), "ratio": ratio, "ratio_ci95": ci,
           "repeats": len(g), "failed": failed,
           "sides": {s: {"runs": len(r.runs[(s, False)]), "tokens_per_s_median": r.median(s),
                         "s_per_step_median": r.median(s, "s_per_step"),
                         "tokens_per_step_median": r.median(s, "tokens_per_step"),
                         "rollout_s_median": r.median(s, "rollout_s"), "rest_s_median": r.median(s, "update_s")}
                     for s in live}}
    if a.fixed_repeats:
        gs = [x["s_per_step"] for x in r.runs[("graft:default", True)]]
        ts = [x["s_per_step"] for x in r.runs[(best, True)]]
        fr, fci = ratio_ci(ts, gs)  # speed-up: TRL's s/step over graft's
        res["fixed_length"] = {"graft_s_per_step": statistics.median(gs), "trl_s_per_step": statistics.median(ts),
                               "speedup": fr, "speedup_ci95": fci, "repeats": len(gs),
                               "tokens_per_step": r.median("graft:default", "tokens_per_step", True)}
    print_tables(name, threads, w, res)
    return res


def print_tables(name: str, threads: int, w: dict, res: dict) -> None:
    print(f"\n### {name}, {threads} thread(s): {w['prompts']} prompts x {w['n']} x <= {w['new_tokens']} tokens\n")
    print("| side | runs | tokens / step | s / step | rollout s | rest of step s | tokens / s | vs TRL best |")
    print("|---|---|---|---|---|---|---|---|")
    best = res["trl_best_tokens_per_s"]
    for s, v in res["sides"].items():
        print(f"| {s} | {v['runs']} | {v['tokens_per_step_median']:.0f} | {v['s_per_step_median']:.2f} | "
              f"{v['rollout_s_median']:.2f} | {v['rest_s_median']:.2f} | {v['tokens_per_s_median']:.0f} | "
              f"{v['tokens_per_s_median'] / best:.2f} |")
    print(f"\ngraft:default / {res['trl_best_setting']} tokens/s: {res['ratio']:.2f} "
          f"[95% CI {res['ratio_ci95'][0]:.2f}, {res['ratio_ci95'][1]:.2f}] over {res['repeats']} paired repeats")
    if "fixed_length" in res:
        f = res["fixed_length"]
        print(f"equal work (EOS suppressed, {f['tokens_per_step']:.0f} tokens/step): graft {f['graft_s_per_step']:.2f} "
              f"s/step, TRL {f['trl_s_per_step']:.2f} s/step, speed-up {f['speedup']:.2f} "
              f"[{f['speedup_ci95'][0]:.2f}, {f['speedup_ci95'][1]:.2f}] over {f['repeats']} repeats")
    if res["failed"]:
        for s, why in res["failed"].items():
            print(f"{s} could not run: {why}")
    print(flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--workloads", default="short,long")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per run (after one warm-up step)")
    ap.add_argument("--repeat", type=int, default=5, help="runs of graft:default and the best TRL setting")
    ap.add_argument("--sweep-repeats", type=int, default=1, help="runs of every side in the sweep")
    ap.add_argument("--fixed-repeats", type=int, default=3, help="equal-work (EOS suppressed) runs; 0 = skip")
    ap.add_argument("--fixed-steps", type=int, default=1, help="timed steps per equal-work run (after one warm-up)")
    ap.add_argument("--trl-sides", default="", help="comma-separated TRL sides instead of the sweep")
    ap.add_argument("--no-attribution", action="store_true", help="graft:default only (no attribution rows)")
    ap.add_argument("--no-cb", action="store_true", help="leave out TRL's continuous-batching side")
    ap.add_argument("--seed", type=int, default=0, help="seed of the side order")
    ap.add_argument("--quick", action="store_true",
                    help="3 repeats at 1 thread on both workloads, TRL sweep without continuous batching, no "
                         "attribution or equal-work runs (~17 min on 2 cores, estimated)")
    a = ap.parse_args(argv)
    if a.worker:
        return worker(json.loads(a.worker))
    if a.quick:
        # < 20 min on 2 cores: no attribution rows, no equal-work runs, no continuous-batching side (the slowest)
        a.threads, a.repeat, a.sweep_repeats, a.fixed_repeats, a.steps = "1", 3, 1, 0, 2
        a.no_attribution, a.no_cb = True, True
    import platform

    import torch
    import transformers

    try:
        import trl
    except ImportError:
        sys.exit("this benchmark needs TRL: pip install 'trl==1.16.0'")
    print(f"torch {torch.__version__}  transformers {transformers.__version__}  trl {trl.__version__}  "
          f"python {platform.python_version()}  cpu: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores\nrepeats {a.repeat} (sweep {a.sweep_repeats}, equal work {a.fixed_repeats}), "
          f"{a.steps} timed steps after one warm-up per run, sides in random order, each run a fresh process",
          flush=True)
    out = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
           "repeats": a.repeat, "steps": a.steps}
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.workloads.split(","):
            w = WORKLOADS[name]
            need = w["prompts"] * (a.steps + 2) * 2
            model, data = build(tmp, name, w, need)
            from transformers import AutoModelForCausalLM

            nparam = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model).parameters())
            print(f"\n{name}: random Qwen3 {nparam / 1e6:.2f}M params (hidden {w['hidden']}, {w['layers']} layers, "
                  f"MLP {w['intermediate']}), {need} distinct problems", flush=True)
            out[name] = {"params_M": round(nparam / 1e6, 2)}
            for th in [int(x) for x in a.threads.split(",")]:
                out[name][str(th)] = run_workload(a, name, th, model, data)
    out["wall_min"] = round((time.time() - t0) / 60, 1)
    print(f"wall time {out['wall_min']} min")
    print("JSON " + json.dumps(out, default=str))
    return out


if __name__ == "__main__":
    main()
