"""How likely a policy finds the gold solutions of its weak family, before and after training: the
transfer ladder's mechanism figure (docs/studies.md, "Can anything the peer writes teach the
receiver").

For a run directory and each of its trained policies p with weak family f_p, over the held-out
problems of f_p that the run evaluated (the ``benchmark`` evaluation file's problem ids, read back
from the run's training file), the **mean per-token log-likelihood** of the gold worked solution
(:func:`graft_cli.data.synthetic.gold_solution`) followed by the policy's EOS,

    ℓ(p, style) = Σ_problems Σ_t log π_p(y_t | x, y_<t) / Σ_problems |y|,   (1)

at temperature 1, under the training prompt (``prompt.*``), in the policy's own style and in its
peer's (``styles``), for the weights the run started from (``policies.<i>.model``) and those of
its last complete checkpoint. Δℓ = ℓ_after − ℓ_before says whether training moved the policy
toward the gold solutions and in which style. Reads models and files only; writes nothing.
"""

from __future__ import annotations

import os

import torch

from graft_cli.data.problems import field_value
from graft_cli.data.prompts import PromptSpec
from graft_cli.data.synthetic import gold_solution
from graft_cli.eval.files import read_jsonl
from graft_cli.eval.setup import load_run_config
from graft_cli.models.loading import load_model, load_tokenizer, resolve_path
from graft_cli.models.logprobs import pack, response_logprobs
from graft_cli.rundir import checkpoint_dir, checkpoints_dir, eval_step_dir
from graft_cli.train import checkpoint as ckpt

__all__ = ["gold_loglik", "run_gold_likelihood", "weak_problems"]


@torch.no_grad()
def gold_loglik(model, tok, spec: PromptSpec, problems: list[str], style: str, batch: int = 64) -> float:
    """Eq. (1) for one model: the mean per-token log-likelihood of the gold solutions of
    ``problems`` in ``style`` plus EOS."""
    total, count = 0.0, 0
    model.eval()
    for i in range(0, len(problems), batch):
        chunk = problems[i:i + batch]
        prompts = [spec.encode(p, tok) for p in chunk]
        responses = [tok(gold_solution(p, style), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                     for p in chunk]
        ids, att, resp = pack(prompts, responses, tok.pad_token_id, next(model.parameters()).device)
        logp, _ = response_logprobs(model, ids, att, resp)
        total += float(logp.sum())
        count += int(resp[:, 1:].sum())
    return total / max(count, 1)


def weak_problems(train: dict, eval_file: str, family: str) -> list[str]:
    """The problem texts graded in ``eval_file`` (a benchmark's ``<bench>_run1.jsonl``) whose family
    in the training file's rows (``train``: id -> row) is ``family``, in problem order."""
    ids: dict[int, str] = {}
    for r in read_jsonl(eval_file):
        ids[int(r["problem_index"])] = str(r["problem_id"])
    out = []
    for _, pid in sorted(ids.items()):
        row = train.get(pid)
        if row is not None and field_value(row, "family") == family:
            out.append(str(row["problem"]))
    return out


def run_gold_likelihood(run_dir: str, weak: dict, styles: dict, benchmark: str = "heldout",
                        device: str = "cpu", cache: dict | None = None) -> dict:
    """policy -> {"before": {style_role: ℓ}, "after": {...}, "step": last checkpoint, "problems": n}
    for each policy of ``weak`` (policy -> family) that the run trained; ``style_role`` is ``own``
    (``styles[policy]``) and ``peer`` (the other policy's style, the first other entry of
    ``styles``). ``cache`` keeps the values of the starting weights (the same for every run of a
    study that shares its problems) across calls."""
    cfg = load_run_config(run_dir)
    spec = PromptSpec.from_config(cfg.prompt)  # the training prompt, as the trainer builds it
    steps = ckpt.valid_steps(checkpoints_dir(run_dir))
    if not steps:
        return {}
    last = steps[-1]
    train = {str(r["id"]): r for r in read_jsonl(resolve_path(str(cfg.data.train))) if r.get("id") is not None}
    out = {}
    for pol in cfg.policies:
        name = pol.name
        if name not in weak or pol.role != "train":
            continue
        problems = weak_problems(train, os.path.join(eval_step_dir(run_dir, name, last), f"{benchmark}_run1.jsonl"),
                                 weak[name])
        peer = next(s for p, s in styles.items() if p != name)
        res = {"step": last, "problems": len(problems)}
        for when, path in (("before", resolve_path(str(pol.model))), ("after", checkpoint_dir(run_dir, last, name))):
            key = (path, tuple(problems), styles[name], peer)
            if when == "before" and cache is not None and key in cache:
                res[when] = cache[key]
                continue
            model = load_model(path, "float32", device)
            tok = load_tokenizer(path)
            res[when] = {"own": gold_loglik(model, tok, spec, problems, styles[name]),
                         "peer": gold_loglik(model, tok, spec, problems, peer)}
            if when == "before" and cache is not None:
                cache[key] = res[when]
            del model
        out[name] = res
    return out

