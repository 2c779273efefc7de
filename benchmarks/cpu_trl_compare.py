"""Seconds per GRPO step on CPU: graft's trainer vs TRL's ``GRPOTrainer``, same tiny model, batch and loss.

    pip install trl          # only for this benchmark (into .venv it adds trl alone; nothing else changes)
    OMP_NUM_THREADS=2 python benchmarks/cpu_trl_compare.py [--prompts 16 --n 8 --new-tokens 48 --steps 3]

Both sides run one full step per rollout batch: sample ``n`` completions for each of ``--prompts`` prompts
(temperature 1, top-p 1, exactly ``--new-tokens`` tokens: the random model practically never emits EOS),
grade them with graft's math-verify grader in-process, GRPO advantages (group mean/std), the DAPO token-mean
PPO-clip loss (ε_low 0.2, ε_high 0.28, no KL: ``beta=0``), one AdamW step on the whole batch in one
micro-batch. graft: ``Trainer.train_step`` (HF engine, trainer-recomputed old log-probs, update).
TRL: ``GRPOTrainer.train`` with ``num_generations=n``, ``per_device_train_batch_size=prompts·n``,
``gradient_accumulation_steps=1``, ``loss_type="dapo"``; time between ``on_step_begin`` and ``on_step_end``.
The first step of each is a warm-up and is not counted.
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


def graft_steps(model: str, data: str, out: str, a) -> list[float]:
    from graft_cli import config as C
    from graft_cli.train.loop import Trainer

    cfg = C.compose(["pair=tiny", "method=grpo", f"policies=[{{name: a, model: '{model}'}}]", f"data.train={data}",
                     f"run.out={out}", f"data.prompt_batch={a.prompts}", f"algo.minibatch_prompts={a.prompts}",
                     f"rollout.n={a.n}", f"rollout.max_new_tokens={a.new_tokens}", "rollout.temperature=1.0",
                     "rollout.top_p=1.0", "reward.num_workers=0", "optim.lr=1e-4", "optim.micro_batch_tokens=1000000",
                     "run.device=cpu", "run.dtype=float32", "run.log_rollouts=false",
                     f"rollout.max_batch={a.prompts * a.n}", "algo.log_entropy=true", "prompt.chat_template=none"])
    tr = Trainer(cfg, out, progress=False)
    times = []
    for _ in range(a.steps + 1):
        t = time.perf_counter()
        tr.train_step()
        times.append(time.perf_counter() - t)
    tr.close()
    return times[1:]


def trl_steps(model: str, data: str, out: str, a) -> list[float]:
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

    def reward(completions, answer, **_):
        return [float(x) for x in grader.grade(list(completions), list(answer)).rewards]

    class Timer(TrainerCallback):
        times: list[float] = []

        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.t)

    cfg = GRPOConfig(output_dir=out, per_device_train_batch_size=a.prompts * a.n, gradient_accumulation_steps=1,
                     num_generations=a.n, max_completion_length=a.new_tokens, temperature=1.0, top_p=1.0,
                     learning_rate=1e-4, lr_scheduler_type="constant", beta=0.0, loss_type="dapo", epsilon=0.2,
                     epsilon_high=0.28,
                     scale_rewards="group", max_steps=a.steps + 1, logging_steps=1, report_to="none", use_cpu=True,
                     save_strategy="no", seed=0, bf16=False, disable_dropout=True, dataloader_num_workers=0)
    timer = Timer()
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model), reward_funcs=reward, args=cfg,
                          train_dataset=ds, processing_class=tok, callbacks=[timer])
    trainer.train()
    grader.close()
    return timer.times[1:]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    a = ap.parse_args(argv)
    import torch
    import transformers

    torch.set_num_threads(a.threads)
    try:
        import trl
    except ImportError:
        sys.exit("this benchmark needs TRL: pip install trl")
    with tempfile.TemporaryDirectory() as tmp:
        model, data = build(tmp, a.hidden, a.layers)
        from transformers import AutoModelForCausalLM

        nparam = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model).parameters())
        print(f"torch {torch.__version__}  transformers {transformers.__version__}  trl {trl.__version__}  "
              f"threads {a.threads}  model {nparam / 1e6:.2f}M params (Qwen3, hidden {a.hidden}, {a.layers} layers)")
        print(f"batch: {a.prompts} prompts x {a.n} samples x {a.new_tokens} new tokens; {a.steps} timed steps")
        g = graft_steps(model, data, os.path.join(tmp, "graft"), a)
        t = trl_steps(model, data, os.path.join(tmp, "trl"), a)
    res = {"graft_s_per_step": statistics.mean(g), "trl_s_per_step": statistics.mean(t), "graft_steps": g,
           "trl_steps": t}
    print(f"graft  {res['graft_s_per_step']:.2f} s/step  ({', '.join(f'{x:.2f}' for x in g)})")
    print(f"TRL    {res['trl_s_per_step']:.2f} s/step  ({', '.join(f'{x:.2f}' for x in t)})")
    print("JSON " + json.dumps(res))
    return res


if __name__ == "__main__":
    main()
