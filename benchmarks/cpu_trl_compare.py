"""GRPO step throughput on CPU: graft's trainer vs TRL's ``GRPOTrainer``, same tiny model, batch and loss.

    pip install trl          # only for this benchmark
    python benchmarks/cpu_trl_compare.py --threads 2 --steps 3 --repeat 3

Both sides run full steps: sample ``n`` completions for each of ``--prompts`` prompts (temperature 1, top-p 1,
at most ``--new-tokens`` new tokens), grade them with graft's math-verify grader in-process, GRPO advantages
(group mean/std), the DAPO token-mean PPO-clip loss (ε_low 0.2, ε_high 0.28, no KL), one AdamW step on the
whole batch. graft: ``Trainer.train_step`` (HF engine, update), once per ``--graft-configs`` entry: ``default``
(the shipped defaults: trainer-recomputed old log-probs, one sampling stream) and ``cpu_fast`` (the CPU speed
overlay ``scale=cpu_fast``: sampler log-probs, per-row streams, compaction, shared prompts). TRL:
``GRPOTrainer.train`` with ``num_generations=n``, ``per_device_train_batch_size=prompts·n``,
``gradient_accumulation_steps=1``, ``loss_type="dapo"``.

Fair comparison: the two sides may generate different numbers of tokens (EOS ends a completion early), so the
figure of merit is **generated tokens per second of step time**; the printout has, per side and repeat, the
generated tokens, the seconds of rollout / scoring / update (graft: its ``time/*`` metrics; TRL: wall time of
``_generate_and_score_completions`` (rollout + reward + old log-probs) and of the optimisation part of the step
(the rest)), tokens per second, and the ratio. ``--repeat K`` runs the sides alternately K times (fresh
trainers, same seeds) and prints the min and median of each. The first step of every run is a warm-up and not
counted. The versions of torch, transformers and TRL are printed with the figures.
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
sys.path.insert(0, os.path.join(ROOT, "tests"))


def build(tmp: str, hidden: int, layers: int) -> tuple[str, str]:
    from conftest import make_random_model, write_problems

    model = make_random_model(os.path.join(tmp, "model"), "qwen3", seed=0, hidden=hidden, layers=layers)
    data = write_problems(os.path.join(tmp, "train.jsonl"), n=64)
    return model, data


def graft_steps(model: str, data: str, out: str, a, scale: str = "default") -> list[dict]:
    from graft_cli import config as C
    from graft_cli.train.loop import Trainer

    cfg = C.compose(["pair=tiny", "method=grpo", f"policies=[{{name: a, model: '{model}'}}]", f"data.train={data}",
                     f"run.out={out}", f"data.prompt_batch={a.prompts}", f"algo.minibatch_prompts={a.prompts}",
                     f"rollout.n={a.n}", f"rollout.max_new_tokens={a.new_tokens}", "rollout.temperature=1.0",
                     "rollout.top_p=1.0", "reward.num_workers=0", "optim.lr=1e-4", "run.device=cpu",
                     "run.dtype=float32", "run.log_rollouts=false", f"rollout.max_batch={a.prompts * a.n}",
                     "algo.log_entropy=true", "prompt.chat_template=none",
                     *([f"scale={scale}"] if scale != "default" else []), *a.graft_override])
    tr = Trainer(cfg, out, progress=False)
    steps = []
    for _ in range(a.steps + 1):
        t = time.perf_counter()
        row = tr.train_step()[0]
        dt = time.perf_counter() - t
        steps.append({"s": dt, "tokens": int(row["num_tokens"]), "rollout_s": row["time/rollout"] + row["time/reward"],
                      "score_s": row["time/old_logprob"], "update_s": row["time/update"]})
    tr.close()
    return steps[1:]


def trl_steps(model: str, data: str, out: str, a) -> list[dict]:
    import json as _json

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from graft_cli.data.prompts import PromptSpec
    from graft_cli.reward import MathVerifyGrader

    tok = AutoTokenizer.from_pretrained(model)
    tok.padding_side = "left"
    spec = PromptSpec(chat_template="none")
    rows = [_json.loads(x) for x in open(data)]
    ds = Dataset.from_list([{"prompt": spec.text(r["problem"], tok), "answer": r["answer"]} for r in rows])
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

    cfg = GRPOConfig(output_dir=out, per_device_train_batch_size=a.prompts * a.n, gradient_accumulation_steps=1,
                     num_generations=a.n, max_completion_length=a.new_tokens, temperature=1.0, top_p=1.0,
                     learning_rate=1e-4, lr_scheduler_type="constant", beta=0.0, loss_type="dapo", epsilon=0.2,
                     epsilon_high=0.28,
                     scale_rewards="group", max_steps=a.steps + 1, logging_steps=1, report_to="none", use_cpu=True,
                     save_strategy="no", seed=0, bf16=False, disable_dropout=True, dataloader_num_workers=0)
    timer = Timer()
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model), reward_funcs=reward, args=cfg,
                          train_dataset=ds, processing_class=tok, callbacks=[timer])
    inner = trainer._generate_and_score_completions  # rollout + reward + old log-probs of one step

    def timed(*args, **kw):
        t = time.perf_counter()
        out_ = inner(*args, **kw)
        gen["s"] += time.perf_counter() - t
        mask = out_.get("completion_mask") if isinstance(out_, dict) else None
        gen["tokens"] += int(mask.sum()) if mask is not None else 0
        return out_

    trainer._generate_and_score_completions = timed
    trainer.train()
    grader.close()
    return timer.steps[1:]


def summary(steps: list[dict]) -> dict:
    tok = sum(s["tokens"] for s in steps)
    sec = sum(s["s"] for s in steps)
    return {"s_per_step": sec / len(steps), "tokens_per_step": tok / len(steps), "tokens_per_s": tok / sec,
            "rollout_s": statistics.mean(s["rollout_s"] for s in steps),
            "update_s": statistics.mean(s["update_s"] for s in steps)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    ap.add_argument("--repeat", type=int, default=1, help="alternate the two sides this many times")
    ap.add_argument("--graft-override", action="append", default=[], help="extra graft config key=value")
    ap.add_argument("--graft-configs", default="default,cpu_fast",
                    help="graft sides, comma-separated: default (the shipped defaults) and/or a scale overlay's name "
                         "(cpu_fast: experiments/scale/cpu_fast.yaml)")
    a = ap.parse_args(argv)
    import torch
    import transformers

    torch.set_num_threads(a.threads)
    try:
        import trl
    except ImportError:
        sys.exit("this benchmark needs TRL: pip install trl")
    sides = [f"graft:{c}" for c in a.graft_configs.split(",")] + ["trl"]
    runs: dict[str, list] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as tmp:
        model, data = build(tmp, a.hidden, a.layers)
        from transformers import AutoModelForCausalLM

        nparam = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model).parameters())
        head = (f"torch {torch.__version__}  transformers {transformers.__version__}  trl {trl.__version__}  "
                f"threads {a.threads}  model {nparam / 1e6:.2f}M params (Qwen3, hidden {a.hidden}, "
                f"{a.layers} layers)\n"
                f"batch: {a.prompts} prompts x {a.n} samples x <= {a.new_tokens} new tokens; {a.steps} timed steps "
                f"after one warm-up, {a.repeat} repeat(s), sides alternating; graft configs: {a.graft_configs} "
                f"(scale=<name>, experiments/scale/)")
        print(head, flush=True)
        for k in range(a.repeat):
            for side in sides:
                out = os.path.join(tmp, f"{side.replace(':', '-')}{k}")
                steps = trl_steps(model, data, out, a) if side == "trl" else graft_steps(model, data, out, a,
                                                                                       side.split(":", 1)[1])
                runs[side].append(summary(steps))
            t = runs["trl"][-1]
            line = " | ".join(f"{side} {runs[side][-1]['tokens_per_step']:.0f} tok/step "
                              f"{runs[side][-1]['s_per_step']:.2f} s/step {runs[side][-1]['tokens_per_s']:.0f} tok/s"
                              + ("" if side == "trl" else
                                 f" (x{runs[side][-1]['tokens_per_s'] / t['tokens_per_s']:.2f})") for side in sides)
            print(f"repeat {k + 1}: {line}", flush=True)
    print("| side | generated tokens / step | s / step (min, median) | rollout s | update s "
          "| tokens / s (min, median) | tokens / s vs TRL (median of repeats) |")
    print("|---|---|---|---|---|---|---|")
    ratios = {}
    for side, rs in runs.items():
        tps = [r["tokens_per_s"] for r in rs]
        sps = [r["s_per_step"] for r in rs]
        ratios[side] = statistics.median(rs[i]["tokens_per_s"] / runs["trl"][i]["tokens_per_s"]
                                         for i in range(a.repeat))
        print(f"| {side} | {statistics.median(r['tokens_per_step'] for r in rs):.0f} | {min(sps):.2f}, "
              f"{statistics.median(sps):.2f} | {statistics.median(r['rollout_s'] for r in rs):.2f} | "
              f"{statistics.median(r['update_s'] for r in rs):.2f} | {min(tps):.0f}, {statistics.median(tps):.0f} | "
              f"{ratios[side]:.2f} |")
    for side in sides[:-1]:
        print(f"{side} / TRL generated tokens per second (median over repeats): {ratios[side]:.2f}")
    ratio = ratios[sides[0]]
    res = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
           "threads": a.threads, "runs": runs, "ratio_tokens_per_s": ratio,
           "ratios_tokens_per_s": {s: r for s, r in ratios.items() if s != "trl"}}
    print("JSON " + json.dumps(res))
    return res


if __name__ == "__main__":
    main()
