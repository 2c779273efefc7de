"""Worker for tests/test_dist.py: one training step of a two-policy run, alone or under torch.distributed.run.

Rollouts come from a deterministic fake engine (responses depend only on the prompt and the sample index), so
the 1-process and the 2-process runs train on exactly the same data. Every rank writes its parameters and
the step's metrics to ``<out>/rank<r>.pt`` (the harness's files; the trainer itself writes nothing here).

usage: python tests/dist_worker.py OUT_DIR MODEL_A MODEL_B PROBLEMS [key=value ...]
"""

from __future__ import annotations

import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from conftest import train_overrides  # noqa: E402

from graft_cli import config as C  # noqa: E402
from graft_cli.batch import Rollouts  # noqa: E402
from graft_cli.rollout.engine import ENGINES, RolloutEngine  # noqa: E402


@ENGINES.register("fixed_test")
class FixedEngine(RolloutEngine):
    """Sample j of a prompt ``a+b`` answers ``\\boxed{a+b}`` or a wrong number: the Qwen3 policy is right when
    (j + a) is even except on a in {1, 5} (all fail), the Llama policy only on sample 0 of a in {1, 5}, so
    GRAFT has groups to exchange both ways. Every third sample has no EOS (truncated). Rollout log-probs are
    a fixed -4.3 per token (about a uniform guess)."""

    def __init__(self, model, tokenizer, max_batch: int = 256, **_):
        self.tok = tokenizer
        self.qwen = model.config.model_type == "qwen3"

    def right(self, a: int, j: int) -> bool:
        if self.qwen:
            return (j + a) % 2 == 0 and a % 4 != 1
        return a % 4 == 1 and j == 0

    def sync_weights(self, model) -> None:
        pass

    def generate(self, prompt_ids, params):
        ids, texts, trunc = [], [], []
        for p in prompt_ids:
            a, b = map(int, re.search(r"(\d+)\+(\d+)", self.tok.decode(p)).groups())
            for j in range(params.n):
                ans = a + b if self.right(a, j) else a + b + 1 + j
                r = self.tok(f"so \\boxed{{{ans}}}", add_special_tokens=False)["input_ids"]
                eos = j % 3 != 2
                ids.append(r + [self.tok.eos_token_id] if eos else r)
                trunc.append(not eos)
                texts.append(self.tok.decode(ids[-1], skip_special_tokens=True))
        return Rollouts(prompt_ids=[list(x) for x in prompt_ids], response_ids=ids, texts=texts,
                        logprobs=[[-4.3] * len(x) for x in ids], truncated=trunc, n=params.n)


def main():
    out, model_a, model_b, problems, *extra = sys.argv[1:]
    torch.set_num_threads(1)
    from graft_cli.train.loop import Trainer

    groups = [x for x in extra if x.split("=")[0] in C.GROUPS]
    rest = [x for x in extra if x.split("=")[0] not in C.GROUPS]
    cfg = C.compose(groups + train_overrides({"a": model_a, "b": model_b}, problems, out,
                                             ["rollout.engine=fixed_test", "run.device=cpu", "run.log_rollouts=false",
                                              "reward.num_workers=0", *rest]))
    trainer = Trainer(cfg, out, progress=False)
    rows = trainer.train_step()
    params = {}
    for name, pol in trainer.policies.items():  # full tensors (FSDP: gathered DTensor shards)
        params[name] = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
                        for k, v in pol.model.state_dict().items()}
    os.makedirs(out, exist_ok=True)
    torch.save({"rank": trainer.dist.rank, "world": trainer.dist.world, "mode": trainer.dist.mode,
                "params": params, "rows": rows}, os.path.join(out, f"rank{trainer.dist.rank}.pt"))
    trainer.close()
    if trainer.dist.enabled:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
