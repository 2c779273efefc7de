"""Shared fixtures: a minimal random model + character-level tokenizer, and a small problem file.

These stand in for real checkpoints in fast tests; the embedded tiny pair (graft_cli.tiny) is
the project's default for demos and the slow tests.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def make_char_tokenizer():
    """The tests' tokenizer: pad 0, EOS 1, then printable ASCII and newline (98 ids)."""
    from graft_cli.models.shapes import char_tokenizer

    return char_tokenizer()


def assert_top_k_sampling(model, prompts, ro, k: int, temperature: float, atol: float):
    """Every sampled token of ``ro`` (groups of ro.n per prompt) is among the ``k`` most likely under ``model`` at
    ``temperature``, and its log-prob is of the softmax over those k (not over the vocabulary)."""
    import torch

    for i, (r, lps) in enumerate(zip(ro.response_ids, ro.logprobs)):
        p = prompts[i // ro.n]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1 : -1].double() / temperature
        top = logits.topk(k, -1).indices
        assert all(int(t) in top[j].tolist() for j, t in enumerate(r))  # every token among the k most likely
        want = torch.log_softmax(logits.gather(-1, top), -1)
        want = torch.stack([want[j][top[j].tolist().index(t)] for j, t in enumerate(r)])
        assert torch.allclose(torch.tensor(lps, dtype=torch.float64), want, atol=atol)


def make_random_model(path: str, arch: str = "qwen3", seed: int = 0, hidden: int = 64, layers: int = 2,
                      sft_steps: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    tok = make_char_tokenizer()
    torch.manual_seed(seed)
    common = dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                  tie_word_embeddings=True)
    if arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **common))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))
    if sft_steps:
        _sft_boxed(model, tok, sft_steps, seed)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _sft_boxed(model, tok, steps: int, seed: int):
    """A few seconds of SFT so the random model answers ``\\boxed{d}`` with a guessed number (right about a
    third of the time): rewards then vary within groups and RL updates are non-zero."""
    import random

    import torch

    from graft_cli.data.prompts import PromptSpec

    rng = random.Random(seed)
    spec = PromptSpec()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        rows = []
        for _ in range(16):
            a, b = rng.randint(1, 7), rng.randint(1, 5)
            guess = a + b if rng.random() < 0.35 else rng.randint(2, 12)
            p = spec.encode(f"{a}+{b}", tok)
            r = tok(f"\\boxed{{{guess}}}", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            rows.append((p, r))
        L = max(len(p) + len(r) for p, r in rows)
        ids = torch.full((len(rows), L), tok.pad_token_id)
        labels = torch.full((len(rows), L), -100)
        att = torch.zeros((len(rows), L), dtype=torch.long)
        for i, (p, r) in enumerate(rows):
            ids[i, : len(p) + len(r)] = torch.tensor(p + r)
            labels[i, len(p) : len(p) + len(r)] = torch.tensor(r)
            att[i, : len(p) + len(r)] = 1
        loss = model(input_ids=ids, attention_mask=att, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()


def write_problems(path: str, n: int = 16) -> str:
    with open(path, "w") as f:
        for i in range(n):
            a, b = i % 7 + 1, (3 * i) % 5 + 1
            f.write(json.dumps({"id": f"p{i}", "problem": f"{a}+{b}", "answer": str(a + b)}) + "\n")
    return path


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return {"a": make_random_model(str(d / "a"), "qwen3", 0, sft_steps=60),
            "b": make_random_model(str(d / "b"), "llama", 1, sft_steps=60)}


@pytest.fixture(scope="session")
def problems_file(tmp_path_factory):
    return write_problems(str(tmp_path_factory.mktemp("data") / "train.jsonl"))


def train_overrides(models: dict, data: str, out: str, extra=()) -> list[str]:
    pols = ",".join(f"{{name: {k}, model: '{v}'}}" for k, v in models.items())
    return [f"policies=[{pols}]", f"data.train={data}", f"run.out={out}", "data.prompt_batch=4",
            "algo.minibatch_prompts=2", "rollout.n=4", "rollout.max_new_tokens=12", "reward.num_workers=1",
            "run.save_every=1", "optim.lr=1e-3", *extra]


def method_args(method: str, a: str, b: str, a_model: str, b_model: str, partner: str | None = None) -> list[str]:
    """The overrides that put two test models into ``method``'s roles: ``a``/``b`` are policy entries
    (``{name: a, model: ...}``, LoRA options included), ``a_model``/``b_model`` their model paths (the OPD teacher is a,
    the tandem junior b); ``partner``: stored-trajectory GRAFT's partner run (its policy b)."""
    return {
        "grpo": [f"policies=[{a}]"],
        "grpo_kl": [f"policies=[{a}, {b}]"],
        "grpo_dapo": [f"policies=[{a}, {b}]", "algo.filter_groups.max_num_gen_batches=2"],
        "graft": [f"policies=[{a}, {b}]"],
        "graft_stored": [f"policies=[{a}]", f"exchange.params.partner_run={partner}",
                         "exchange.params.partner_policy=b"],
        "hacpo": [f"policies=[{a}, {b}]"],
        "sgt": [f"policies=[{a}, {b}]"],
        "saf": [f"distill.student={a}", f"distill.teacher={a_model}",
                "algo.controllers=[{name: saf_schedule, warmup_steps: 2, kl_delta: 0.2, anneal_steps: 2}]"],
        "grpo_opd": [f"distill.student={a}", f"distill.teacher={a_model}"],
        "opd_only": [f"distill.student={a}", f"distill.teacher={a_model}"],
        "tandem": [f"tandem.senior={a}", f"tandem.junior={b_model}"],
    }[method]


LOSS_INPUT_FIELDS = ("norm", "extra", "clip_low", "clip_high", "clip_ratio_c", "agg", "mb_index", "step", "in_pg",
                     "coefs")


def call_loss(spec, logp, old, adv, mask, weight, is_peer, **kw):
    """Call a registered loss (one LossInputs) from tensors; keywords that are not LossInputs fields are the
    loss's parameters (validated against its defaults)."""
    from graft_cli.algorithms.losses import LossInputs

    fields = {k: kw.pop(k) for k in list(kw) if k in LOSS_INPUT_FIELDS}
    return spec(LossInputs.of(logp, old, adv, mask, weight, is_peer, **fields), **kw)


def kill_after(cmd: list, marker, env: dict, timeout_s: float = 300.0) -> None:
    """Start ``cmd`` in its own process group, wait until the file ``marker`` exists (a complete checkpoint),
    then SIGKILL the whole group (the run and its reward workers), as a crash would."""
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + timeout_s
    while not os.path.exists(marker) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert os.path.exists(marker), f"{marker} did not appear before the run ended"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def proc_env(**extra) -> dict:
    """Environment of a `graft` subprocess in the tests: unbuffered output, one torch thread."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **extra}


def metric_rows(run: str) -> list[dict]:
    """A run's metrics.jsonl rows without the ``time/*`` values (what an exact resume must reproduce)."""
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")} for line in f if line.strip()]


def tree(pid: int) -> set[int]:
    """Every live process descended from ``pid`` or in its session (read from /proc)."""
    kids: dict[int, list[int]] = {}
    sess = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z":
            continue
        kids.setdefault(int(fields[1]), []).append(int(p))
        sess[int(p)] = int(fields[3])
    out, todo = set(), [pid]
    while todo:
        q = todo.pop()
        for c in kids.get(q, []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out | {p for p, s in sess.items() if s == pid}


def _live(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gone_within(pids: set[int], seconds: float) -> float:
    t0 = time.time()
    while time.time() - t0 < seconds:
        alive = {p for p in pids if _live(p)}
        if not alive:
            return time.time() - t0
        time.sleep(0.1)
    raise AssertionError(f"processes still alive after {seconds} s: {sorted(alive)}")


def register_parity_reward() -> None:
    """Register ``reward.name: first_char_parity`` once: a random model never answers right, so the engine tests'
    trainer steps reward 1 when the response's first character has an even code (both groups of a step mixed)."""
    import numpy as np

    from graft_cli.reward import REWARDS
    from graft_cli.reward.pool import Grades

    if "first_char_parity" in REWARDS:
        return

    @REWARDS.register("first_char_parity")
    class Parity:
        def __init__(self, **_):
            pass

        def start(self, wait=True):
            return self

        def grade(self, texts, golds):
            r = np.array([float(bool(t) and ord(t[0]) % 2 == 0) for t in texts], dtype=np.float32)
            return Grades(r, np.zeros(len(texts), dtype=bool), [None] * len(texts))

        def close(self):
            pass
