"""HACPO: graft's registered functions against an independent re-implementation of the released code's formulas, fed
the same random inputs; prints the max differences, on the authors' 8-GPU launcher and on one GPU.

    python benchmarks/hacpo_compare.py [--steps 6] [--prompts 8] [--n 4] [--seed 0] [key=value ...]

Exit 0 when every difference is <= 1e-6; otherwise 1, the last line naming what differs (``key=value``: graft
config overrides, e.g. an old behaviour put back, applied to both layouts).

The released side (zzx-peter/HACRL-code, ``recipe/hacpo/`` at commit 81e6c64, verl V1) is written out below from
the released files' formulas, not imported (graft does not depend on verl):

- ``hacpo_trajectory.materialize_rollout_records``: a rollout's terminal EOS is popped from its token ids (an
  EOS-only response would keep it); the pool holds the text, the reward and the source's mean log-prob over the
  remaining ids, recomputed by the source actor (``_rollout_and_score_source``: ``compute_log_prob``);
  ``build_training_view``: self rows keep their (EOS-less) rollout ids, peer rows are ``tokenizer(text)``;
- ``hacpo_core_algos.CapabilityTracker``: ``update`` (each policy's positive-reward rate on its own rollouts,
  floored at 1e-8, into a 5-step deque) runs *before* the advantages; ``capabilities`` = the deque's mean,
  ``ratio`` = clip(P_src / P_tgt, 0.1, 10);
- ``compute_hacpo_advantages`` with ``source_reward_weights`` = 1/ratio(src, tgt) (``_update_target``): per prompt
  over the joint group, b = mean(r) when all rewards are equal, else mean(r·ω) with the binary guard (b > 1 → the
  learner's own mean); A = (r − b)/(std(correction=1) + 1e-6);
- ``_target_trajectories_self_first``, then verl's data-parallel update on ``run_hacpo_math_8gpu.sh``'s 8 GPUs
  (``ppo_mini_batch_size`` 64 of the 128 prompts): the rows dispatched in 8 contiguous chunks, each rank's
  minibatches of ``ppo_mini_batch_size × n / 8`` rows in order (``train_mini_batch``, ``shuffle: false``), one
  optimizer update over every rank's m-th minibatch, m = the update's index in the step
  (``MinibatchUpdateCounter``), each rank's loss scaled by ``local / global · dp`` and averaged by the
  all-reduce; on one GPU the same with one rank;
- an EOS-only response keeps its EOS (its source mean is that token's log-prob; the learner's view is the
  learner's EOS), and a response with no token to score is refused;
- ``compute_hacpo_loss`` inside ``hacpo_ppo_loss``: s = exp(clamp(mean_t log π_θ − source mean, ±10)) on every
  row; self rows min(s·A, clip(s, 1 − 3e-4, 1 + 4e-4)·A); peer rows ŝ·sg(ŝ)·c·A with ŝ = clamp(s, L_m, 1),
  L_m = min(1, 0.8 + 0.025·m); the minibatch's loss −Σ obj / N (``−objective.mean()`` × local/global batch size);
  plus 1e-3 × verl's ``agg_loss`` (``seq-mean-token-mean``, ``global_batch_size`` = N) of the k3 KL over the mask
  ``response_mask & is_self`` (``kl_penalty`` low_var_kl: clamp(ref − logp, ±20), exp(d) − d − 1 clamped ±10).

graft's side is what a run executes: the composed ``hacpo`` config, the registered exchange (``GraftExchange``:
capabilities, joint groups, ``peer_logprobs: recompute`` through the trainer's scoring hook, admission), the
trainer's token signals (``train.update.token_signals``: the loss mask ``strip_eos``), the registered minibatch ordering
and layout (``minibatch_plan``: ``exchange.layout`` as composed; ``whole_batch`` against one GPU), the minibatch
denominators (``Normaliser.of_rows``), the loss inputs as the trainer builds them (``loss_inputs``) and the
registered loss with its KL term (``compute_loss``, ``algo.kl_rows``).

Printed: the max |difference| over ``--steps`` steps of both receivers of the capabilities, the capability ratios
c, the advantages, the minibatch partition (rows placed in another update), each update's L_m, loss, KL term and the
gradient of the loss with respect to every row's log-probs (on the EOS graft masks it is checked to be 0), and
whether graft accepted a response with no token to score (the released code refuses it). The random responses
include EOS-only ones (~10%).
"""

from __future__ import annotations

import argparse
from collections import defaultdict, deque

import torch

CLIP_LOW, CLIP_HIGH, DELTA, DELTA_STEP, MAX_LOG_RATIO, KL_COEF = 3e-4, 4e-4, 0.2, 0.025, 10.0, 1e-3
# run_hacpo_math_8gpu.sh: PPO_MINI_BATCH_SIZE / TRAIN_BATCH_SIZE = 64 / 128 of the prompts, trainer.n_gpus_per_node=8
MINI_OF_BATCH, N_GPUS = 64 / 128, 8


# ------------------------------------------------------------------------------------------- released side
class RelTracker:
    """CapabilityTracker (positive_rate, window 5, minimum 1e-8, ratio in [0.1, 10], warmup 0)."""

    def __init__(self, ids, window=5, minimum=1e-8, lo=0.1, hi=10.0):
        self.min, self.lo, self.hi = minimum, lo, hi
        self.hist = {k: deque(maxlen=window) for k in ids}

    def update(self, rewards: dict) -> dict:
        for k, r in rewards.items():
            self.hist[k].append(max(float((r > 0).float().mean()), self.min))
        return self.capabilities()

    def capabilities(self) -> dict:
        return {k: max(sum(h) / len(h), self.min) if h else 1.0 for k, h in self.hist.items()}

    def ratio(self, src, tgt) -> float:
        c = self.capabilities()
        return min(max(c[src] / c[tgt], self.lo), self.hi)


def rel_advantages(rewards, prompt_ids, sources, learner, weights, eps=1e-6):
    """compute_hacpo_advantages with source_reward_weights (float32 tensors as theirs)."""
    adv = torch.empty_like(rewards)
    groups = defaultdict(list)
    for i, p in enumerate(prompt_ids):
        groups[p].append(i)
    for idx in groups.values():
        r = rewards[idx]
        if torch.unique(r).numel() == 1:
            b = r.mean()
        else:
            b = torch.stack([rewards[i] * weights[sources[i]] for i in idx]).mean()
            if b > 1.0:
                b = torch.stack([rewards[i] for i in idx if sources[i] == learner]).mean()
        adv[idx] = (r - b) / (r.std(correction=1) + eps)
    return adv


def rel_strip_eos(ids, eos):
    ids = list(ids)
    return ids[:-1] if len(ids) > 1 and ids[-1] == eos else ids


def rel_kl(logp, ref):
    d = torch.clamp(ref - logp, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(d) - d - 1, min=-10.0, max=10.0)


def rel_update_plan(order: list, mini_rows: int, world: int) -> list[list[list]]:
    """verl's dispatch and ``train_mini_batch``: ``order`` in ``world`` contiguous equal chunks
    (``chunk_tensordict``), each rank's minibatches of ``mini_rows // world`` rows in order (``make_iterator``,
    shuffle false); returns, per optimizer update m, each rank's rows."""
    assert mini_rows % world == 0 and len(order) % world == 0
    chunk, local = len(order) // world, mini_rows // world
    assert chunk % local == 0
    ranks = [order[r * chunk:(r + 1) * chunk] for r in range(world)]
    return [[rk[m * local:(m + 1) * local] for rk in ranks] for m in range(chunk // local)]


def rel_update_loss(per_rank: list, global_batch: int, m: int):
    """One optimizer update over ``len(per_rank)`` data-parallel ranks: each rank's ``hacpo_ppo_loss``
    (``local_pg_loss · local / global · dp`` plus 1e-3 × ``agg_loss`` of the self-row k3 with
    ``global_batch_size``, ``dp_size``), averaged by DDP's all-reduce. ``per_rank``: per rank the arguments of
    :func:`rel_minibatch_loss`. Returns (loss, KL term / 1e-3, L_m)."""
    W = len(per_rank)
    parts = [rel_minibatch_loss(*args, m, global_batch=global_batch, dp=W) for args in per_rank]
    return (sum(p[0] for p in parts) / W, sum(p[1] for p in parts) / W, parts[0][2])


def rel_minibatch_loss(logps, src_means, adv, is_self, ratio_c, refs, m, global_batch=None, dp=1):
    """One rank's minibatch: the released policy loss plus the self-row KL, in float64 (``global_batch``: the
    update's rows over all ranks; one GPU: this minibatch's). ``logps``/``refs``: per row, the target log-probs
    of its view's tokens (the view holds no EOS, except an EOS-only view, which is its EOS)."""
    N = len(logps)
    G = N if global_batch is None else global_batch
    tgt_mean = torch.stack([lp.double().mean() for lp in logps])
    log_ratio = (tgt_mean - src_means.double()).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    s = log_ratio.exp()
    a = adv.double()
    self_obj = torch.minimum(s * a, s.clamp(1 - CLIP_LOW, 1 + CLIP_HIGH) * a)
    lower = min(1.0, 1.0 - DELTA + m * DELTA_STEP)
    sc = s.clamp(min=lower, max=1.0)
    cross_obj = sc * sc.detach() * ratio_c.double() * a
    obj = torch.where(is_self, self_obj, cross_obj)
    pg = -obj.mean() * N / G * dp
    seq = [rel_kl(lp.double(), rf.double()).mean() for lp, rf, sf in zip(logps, refs, is_self.tolist()) if sf]
    kl = torch.stack(seq).sum() / G * dp if seq else torch.zeros((), dtype=torch.float64)
    return pg + KL_COEF * kl, kl, lower


# ---------------------------------------------------------------------------------------------- graft side
def graft_config(prompts: int, n: int, overrides=()):
    from graft_cli.config import compose

    return compose(["method=hacpo", f"data.prompt_batch={prompts}", f"rollout.n={n}", *overrides])


# ------------------------------------------------------------------------------------------------- inputs
def random_step(g: torch.Generator, tok, names, B: int, n: int, T: int):
    """Both policies' rollouts on B prompts: texts, ids (EOS when ended), rewards, the sources' recomputed
    per-token log-probs, and per (receiver, source, prompt, sample) the receiver's current and reference
    log-probs over the row's graft tokens (the loss's inputs; the released view is their EOS-less prefix)."""
    from graft_cli.algorithms.advantages import grpo_advantages
    from graft_cli.batch import PolicyStep
    from graft_cli.data.problems import Problem
    from graft_cli.batch import Rollouts

    probs = [Problem(f"p{q}", f"{q}+{q}", str(2 * q)) for q in range(B)]
    alphabet = list("0123456789+=x ab")
    steps, recomputed = {}, {}
    for k, name in enumerate(names):
        texts, ids, lps, trunc = [], [], [], []
        for _ in range(B * n):
            L = int(torch.randint(1, T + 1, (1,), generator=g)) * bool(torch.rand(1, generator=g) >= 0.1)
            t = "".join(alphabet[int(i)] for i in torch.randint(0, len(alphabet), (L,), generator=g))
            tr = bool(torch.rand(1, generator=g) < 0.2) and L > 0  # L = 0: an EOS-only response (~10%)
            r = tok(t, add_special_tokens=False)["input_ids"] + ([] if tr else [tok.eos_token_id])
            texts.append(t)
            ids.append(r)
            lps.append((-torch.rand(len(r), generator=g) * 3).tolist())
            trunc.append(tr)
        p_pos = [0.3, 0.6][k % 2]
        rewards = (torch.rand(B, n, generator=g) < p_pos).float()
        rewards[0] = 1.0  # an all-correct group (uniform rewards: b = mean, A = 0)
        ro = Rollouts([tok(p.problem)["input_ids"] for p in probs], ids, texts, lps, trunc, n=n)
        steps[name] = PolicyStep(name, probs, [tok(p.problem)["input_ids"] for p in probs], ro, rewards,
                                 grpo_advantages(rewards))
        by_ids: dict = {}  # the source's scoring: one value per (prompt, token ids), as a forward gives
        recomputed[name] = [by_ids.setdefault((r // n, tuple(x)), (-torch.rand(len(x), generator=g) * 3).tolist())
                            for r, x in enumerate(ids)]
    cur, ref = {}, {}
    for rn in names:
        for sn in names:
            st = steps[sn]
            for q in range(B):
                for j in range(n):
                    r = q * n + j
                    if sn == rn:  # self: the update moves the ratio around the clip range 1 ± 3e-4
                        base = torch.tensor(recomputed[sn][r]) + torch.randn(len(st.rollouts.response_ids[r]),
                                                                             generator=g) * 1e-3
                    else:  # peer: the receiver's tokens of the text (+ EOS when it ended); s_x over [0.3, 3]
                        L = len(st.rollouts.texts[r]) + (not st.rollouts.truncated[r])
                        shift = float(torch.empty(1).uniform_(-1.2, 1.1, generator=g))
                        kept = len(rel_strip_eos(st.rollouts.response_ids[r], tok.eos_token_id))
                        mean_src = float(torch.tensor(recomputed[sn][r][:kept]).mean())
                        base = mean_src + shift + torch.randn(L, generator=g) * 0.5
                    cur[(rn, sn, q, j)] = base.float().clone().requires_grad_(True)
                    ref[(rn, sn, q, j)] = (base + torch.randn(len(base), generator=g) * 0.3).float()
    return steps, recomputed, cur, ref


def row_keys(batch, name):
    """(receiver, source, prompt, sample) of each graft row."""
    keys, seen = [], defaultdict(int)
    for i, s in enumerate(batch.source):
        q = int(batch.group[i])
        if s == "self":
            keys.append((name, name, q, seen[q]))
            seen[q] += 1
        else:
            keys.append((name, batch.extra["src_policy"][i], q, int(batch.extra["src_sample"][i])))
    return keys


# ----------------------------------------------------------------------------------------------- compare
def compare(steps: int = 6, prompts: int = 8, n: int = 4, seed: int = 0, T: int = 10, overrides=(),
            world: int = N_GPUS) -> dict:
    """Max |difference| of every compared quantity (module docstring). The released side runs on ``world`` GPUs
    (the launcher's 8, or 1); graft runs its composed ``hacpo`` config as a run would (its defaults, nothing the
    comparison measures is passed to it) with ``overrides`` (an old behaviour, to see that it is caught)."""
    from graft_cli.algorithms.exchange import EXCHANGES, ExchangeContext, ReceiverFunctions
    from graft_cli.algorithms.losses import POLICY_LOSSES, Normaliser, compute_loss
    from graft_cli.models.logprobs import pack
    from graft_cli.models.shapes import char_tokenizer
    from graft_cli.algorithms.minibatch import layout_ranks, minibatch_plan
    from graft_cli.train.update import AlgoParams, UpdateContext, loss_inputs, row_tokens, token_signals

    cfg = graft_config(prompts, n, overrides)
    a = cfg.algo
    spec = POLICY_LOSSES.get(a.loss)
    tok = char_tokenizer(97)  # printable ASCII, no newline
    names = ["a", "b"]
    ex = EXCHANGES.get(cfg.exchange.name)(cfg)
    params = AlgoParams.of(a)
    rel = RelTracker(names)
    g = torch.Generator().manual_seed(seed)
    diffs = {k: 0.0 for k in ("capability", "capability_ratio", "advantage", "partition", "L_m", "loss", "kl_term",
                              "loss_gradient", "gradient_on_masked_eos")}
    counts = {"minibatches": 0, "self_only": 0, "peer_only": 0, "eos_only_peer_rows": 0}
    mini_rows = round(prompts * MINI_OF_BATCH) * n  # the released minibatch: 64 of 128 prompts × n rows

    def upd(key, x):
        diffs[key] = max(diffs[key], float(x.detach() if isinstance(x, torch.Tensor) else x))

    for step in range(steps):
        st, recomputed, cur, ref = random_step(g, tok, names, prompts, n, T)

        by_ids = {k: {(r // n, tuple(x)): recomputed[k][r] for r, x in enumerate(st[k].rollouts.response_ids)}
                  for k in names}

        def score(name, b, by_ids=by_ids):  # the trainer's scoring hook: the source's recomputed log-probs
            return [by_ids[name][(int(q), tuple(x))] for x, q in zip(b.response_ids, b.group)]

        ctx = ExchangeContext(step=step, seed=seed,
                              tokenizers={k: tok for k in names},
                              receivers=ReceiverFunctions(lambda text, name: tok(text)["input_ids"], score),
                              receiver_names=names)
        batches, met = ex.select(st, ctx)
        caps = rel.update({k: st[k].rewards.flatten() for k in names})
        for rn in names:
            b = batches[rn]
            upd("capability", max(abs(met[rn][f"hacpo/capability/{k}"] - caps[k]) for k in names))
            keys = row_keys(b, rn)
            b.old_logprobs = [by_ids[rn][(k[2], tuple(b.response_ids[i]))] if k[1] == rn
                              else [0.0] * len(b.response_ids[i]) for i, k in enumerate(keys)]
            b, _ = ex.admit(rn, b, ctx)
            keys = row_keys(b, rn)
            b.extra["ref_logprobs"] = [ref[k].tolist() for k in keys]
            b, _ = token_signals(b, a, params, step, rn, {})
            # the released side: self rows first (prompt order), then the peer rows; views without EOS
            order = [(rn, rn, q, j) for q in range(prompts) for j in range(n)]
            order += [(rn, sn, q, j) for sn in names if sn != rn for q in range(prompts) for j in range(n)]
            weights = {sn: 1.0 / rel.ratio(sn, rn) for sn in names}
            rewards = torch.tensor([float(st[k[1]].rewards[k[2], k[3]]) for k in order])
            adv_rel = rel_advantages(rewards, [k[2] for k in order], [k[1] for k in order], rn, weights)
            adv_of = dict(zip(order, adv_rel.tolist()))
            for i, k in enumerate(keys):
                upd("advantage", abs(b.advantages[i] - adv_of[k]))
                if k[1] != rn:
                    upd("capability_ratio", abs(b.extra["hacpo_c"][i] - 1.0 / weights[k[1]]))
            rel_plan = rel_update_plan(order, mini_rows, world)
            rel_mbs = [[k for rk in ranks for k in rk] for ranks in rel_plan]
            mbs = minibatch_plan(b, cfg.exchange.ordering, a.minibatch_prompts, cfg.rollout.n, None,
                                 layout_ranks(cfg.exchange.layout, cfg.exchange.layout_ranks))
            upd("partition", sum(len(set(r) ^ {keys[i] for i in mb}) for r, mb in zip(rel_mbs, mbs))
                + abs(len(rel_mbs) - len(mbs)))
            counts["eos_only_peer_rows"] += sum(k[1] != rn and st[k[1]].rollouts.texts[k[2] * n + k[3]] == ""
                                                for k in order)
            for m, (mb, rmb) in enumerate(zip(mbs, rel_mbs)):
                counts["minibatches"] += 1
                kinds = {keys[i][1] == rn for i in mb}
                counts["self_only"] += kinds == {True}
                counts["peer_only"] += kinds == {False}
                # graft: as update_policy runs one micro-batch
                norm = Normaliser.of_rows([row_tokens(b, i) for i in mb], [b.in_pg[i] for i in mb],
                                          a.loss_scale_factor or float(cfg.rollout.max_new_tokens))
                prompts_ = [b.prompt_ids[i] for i in mb]
                ids, att, resp = pack(prompts_, [b.response_ids[i] for i in mb], 0)
                Lp = ids.shape[1]
                rows = []
                for i, p in zip(mb, prompts_):
                    v = cur[keys[i]]
                    rows.append(torch.cat([torch.zeros(len(p) - 1), v, torch.zeros(Lp - 1 - (len(p) - 1) - len(v))]))
                logp = torch.stack(rows)
                inp = loss_inputs(b, mb, logp, resp, norm, spec, m, UpdateContext(cfg, step=step, params=params))
                loss_g, st_g = compute_loss(spec, inp, a.kl_coef, a.kl_type, a.kl_rows)
                pg_g, _ = spec.fn(inp)
                # released: each rank's rows' views (EOS popped; an EOS-only response keeps its EOS and the
                # learner's view is the learner's EOS), source means, advantages, ratios
                views = {}
                per_rank = []
                for rank_rows in rel_plan[m]:
                    lps, rfs, srcm, advs, is_self, rc = [], [], [], [], [], []
                    for k in rank_rows:
                        sid = st[k[1]].rollouts.response_ids[k[2] * n + k[3]]
                        text = st[k[1]].rollouts.texts[k[2] * n + k[3]]
                        terminal_only = len(sid) == 1 and sid[-1] == tok.eos_token_id
                        view_len = len(rel_strip_eos(sid, tok.eos_token_id)) if k[1] == rn or terminal_only else \
                            len(tok(text, add_special_tokens=False)["input_ids"])
                        lps.append(cur[k][:view_len])
                        rfs.append(ref[k][:view_len])
                        views[k] = view_len
                        src = recomputed[k[1]][k[2] * n + k[3]][:len(rel_strip_eos(sid, tok.eos_token_id))]
                        srcm.append(sum(src) / len(src))
                        advs.append(adv_of[k])
                        is_self.append(k[1] == rn)
                        rc.append(1.0 / weights[k[1]])
                    per_rank.append((lps, torch.tensor(srcm, dtype=torch.float32),
                                     torch.tensor(advs, dtype=torch.float32), torch.tensor(is_self),
                                     torch.tensor(rc, dtype=torch.float32), rfs))
                loss_r, kl_r, lower = rel_update_loss(per_rank, mini_rows, m)
                upd("loss", (loss_g.double() - loss_r).abs())
                upd("kl_term", ((loss_g - pg_g).double() - KL_COEF * kl_r).abs())
                if float(st_g["hacpo/L_m/n"]) > 0:
                    upd("L_m", abs(float(st_g["hacpo/L_m/sum"] / st_g["hacpo/L_m/n"]) - lower))
                leaves_g = [cur[keys[i]] for i in mb]
                leaves_r = [cur[k] for k in rmb]
                gg = torch.autograd.grad(loss_g, leaves_g, allow_unused=True)
                gr = torch.autograd.grad(loss_r, leaves_r, allow_unused=True)
                grad_r = {k: (x if x is not None else torch.zeros_like(cur[k])) for k, x in zip(rmb, gr)}
                for i, x in zip(mb, gg):
                    k = keys[i]
                    x = x if x is not None else torch.zeros_like(cur[k])
                    if k not in grad_r:  # placed in another minibatch (counted in partition)
                        upd("loss_gradient", x.abs().max())
                        continue
                    view = views[k]
                    upd("loss_gradient", (x[:view].double() - grad_r[k][:view].double()).abs().max())
                    if x.shape[0] > view:
                        upd("gradient_on_masked_eos", x[view:].abs().max())
    diffs["partition"] = float(diffs["partition"])
    diffs["empty_response_accepted"] = 0.0 if empty_response_refused(cfg, tok) else 1.0
    return {**diffs, **{f"count/{k}": v for k, v in counts.items()}}


def empty_response_refused(cfg, tok) -> bool:
    """The released code refuses a response with no token to score (``materialize_rollout_records``: no generated
    token; ``build_training_view``: a text that encodes to no learner token): does graft's exchange refuse a
    truncated peer response whose text is empty?"""
    from graft_cli.algorithms.advantages import grpo_advantages
    from graft_cli.algorithms.exchange import EXCHANGES, ExchangeContext, ReceiverFunctions
    from graft_cli.batch import PolicyStep, Rollouts
    from graft_cli.data.problems import Problem
    from graft_cli.errors import GraftError

    probs = [Problem("p0", "1+1", "2")]
    steps = {}
    for name in ("a", "b"):
        ids = [tok("12", add_special_tokens=False)["input_ids"] + [tok.eos_token_id], [tok.pad_token_id]]
        ro = Rollouts([tok("1+1")["input_ids"]], ids, ["12", ""], [[-0.5] * len(x) for x in ids], [False, True], n=2)
        r = torch.tensor([[1.0, 0.0]])
        steps[name] = PolicyStep(name, probs, [tok("1+1")["input_ids"]], ro, r, grpo_advantages(r))
    ctx = ExchangeContext(step=0, seed=0, tokenizers={"a": tok, "b": tok},
                          receivers=ReceiverFunctions(lambda text, name: tok(text)["input_ids"],
                                                      lambda name, b: [[-0.5] * len(x) for x in b.response_ids]),
                          receiver_names=["a", "b"])
    try:
        EXCHANGES.get(cfg.exchange.name)(cfg).select(steps, ctx)
    except GraftError:
        return True
    return False


TOLERANCE = 1e-6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("overrides", nargs="*", help="graft config overrides (key=value) applied to both layouts' runs")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    failed = []
    # the launcher's 8 GPUs against graft's composed default; one GPU against graft's whole_batch layout
    for label, world, over in ((f"{N_GPUS}-GPU launcher", N_GPUS, []), ("one GPU", 1, ["exchange.layout=whole_batch"])):
        try:
            out = compare(args.steps, args.prompts, args.n, args.seed, overrides=[*over, *args.overrides], world=world)
        except Exception as e:  # an old behaviour graft's config or the released contract refuses
            failed.append(f"{label}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            continue
        diffs = {k: v for k, v in out.items() if not k.startswith("count/")}
        print(f"HACPO, graft vs the released formulas on the {label} ({args.steps} steps x 2 receivers, "
              f"{args.prompts} prompts x {args.n} + {args.n}, seed {args.seed}): max |difference|")
        for k, v in diffs.items():
            print(f"  {k:<26} {v:.3e}")
        print("minibatches: " + ", ".join(f"{k[6:]} {v}" for k, v in out.items() if k.startswith("count/")))
        bad = [f"{k} {v:.3g}" for k, v in diffs.items() if not v <= TOLERANCE]
        if bad:
            failed.append(f"{label}: " + ", ".join(bad))
    if failed:
        print(f"FAIL: graft differs from the released HACPO beyond {TOLERANCE:g}: " + "; ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
