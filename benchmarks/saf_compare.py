"""SAF-OPD: graft's registered functions against an independent re-implementation of the released code's formulas,
fed the same random inputs; prints the max differences.

    python benchmarks/saf_compare.py [--cases 24] [--steps 30] [--seed 0] [key=value ...]

Exit 0 when every difference is <= 1e-6 and the warm-up stops on the released step; otherwise 1, the last line
naming what differs (``key=value``: graft config overrides, e.g. an old behaviour put back).

The released side (kissshhot/SAF-OPD, a verl v0.6.1 fork) is written out below from the released files' formulas,
not imported (graft does not depend on verl):

- stages (``verl/trainer/ppo/ray_trainer.py``): ``apply_topk_sparse_filter`` (per sequence τ = torch.quantile of
  |A| over the response tokens at 1 − k/100, keep |A| ≥ τ), ``apply_tanh_scaling`` (c·tanh on the kept tokens),
  ``_apply_token_kl_regularizer`` (the KL-triggered warm-up on ``global_steps`` from 1 with the previous step's
  cached ``actor/kl_loss``, the frozen scale, the anneal with its own counter and the remaining budget fixed at
  activation) and the fusion A = g·A_GRPO + o·A_OPD;
- GRPO advantage (``core_algos.compute_grpo_outcome_advantage``): (s − mean)/(std + 1e-6), torch's unbiased std;
- placement of the IS weight (``rollout_corr_helper.compute_rollout_correction_weights``, token level, then
  ``core_algos.compute_policy_loss_vanilla``): w = min(exp(clamp(old − rollout, ±20)), C)·mask multiplies the
  whole per-token loss of the dual-clip PPO surrogate (clip 0.2 / 0.2, clip_ratio_c = 3);
- aggregation and the KL statistic (``workers/actor/dp_actor.py::update_policy`` with the scripts'
  ``ppo_micro_batch_size_per_gpu=1``): each micro-batch is one sequence; its loss is verl's token-mean
  (``masked_mean``, sum/(count + 1e-8)) times ``1/gradient_accumulation``; the gradients of the micro-batches add
  up (over 8 GPUs the all-reduce averages, which is one GPU accumulating all 1,024 rows); ``actor/kl_loss`` is
  each micro-batch's token-mean k3 (``kl_penalty`` low_var_kl) times ``1/gradient_accumulation``, averaged over
  the micro-batches by ``reduce_metrics``.

The released side gets the scripts' flags as values (:data:`RELEASED`), never graft's settings; graft's side is
what a run executes, with nothing the comparison measures passed to it: the composed ``saf`` config on
``pair=saf_qwen3_4b`` (its aggregation, clip, dual clip, TIS settings, the schedule's defaults), the trainer's
token-signal pipeline (``train.update.token_signals``: ``opd_fusion`` then ``is_correction``), the ``saf_schedule``
controller, the GRPO estimator and the registered loss through ``compute_loss`` (with its ``kl_seq_mean`` and
``kl`` statistics; the controller reads the one its ``kl_metric`` names).

Printed: the max |difference| of the GRPO advantages, the fused token advantages after the IS weight, the loss,
its gradient with respect to the log-probs, the KL statistic (the released one times its accumulation factor,
which cancels in the warm-up's relative drop), the warm-up scale, anneal factor and warm-up end step over a
``--steps``-step run driven by each side's own KL statistic (graft's composed schedule, S = the run's steps; then
``anneal_total_steps = 0`` on both sides); then the warm-up stop on a batch whose long answers grow from 15% to
87% of the rows (where the token mean over the step and the per-sequence mean disagree). About 1 random row in 8
is EOS-only (one token); an empty response has no place in the released pipeline (verl's response holds at least
its EOS, and its seq-mean-token-mean would be 0/0 there).
"""

from __future__ import annotations

import argparse

import torch

# ------------------------------------------------------------------------------------------- released side
SAFETY_BOUND = 20.0
# The released scripts' flags (opd_saf.md §4: TOPK_PERCENT=20 TANH_COMPRESS=True TANH_COEF=0.1 OPD_WARMUP_STEPS=100
# KL_DROP_DELTA=0.2 OPD_ANNEAL=True, the defaults ANNEAL_STEPS=200 ANNEAL_MIN=0.0, grpo/opd coefficients 1.0, token
# IS threshold 5.0) given to the released side as values, never read from graft's config, so a changed graft default
# shows as a difference. anneal_total_steps is the run's steps (the paper's "full training budget", graft's
# reading) unless a schedule sets it.
RELEASED = {"grpo_coef": 1.0, "opd_coef": 1.0, "topk_percent": 20.0, "tanh_compress": True, "tanh_coef": 0.1,
            "opd_warmup_steps": 100, "kl_drop_delta": 0.2, "opd_anneal": True, "anneal_steps": 200, "anneal_min": 0.0,
            "anneal_total_steps": None, "is_threshold": 5.0}


def rel_grpo(scores: torch.Tensor, n: int, eps: float = 1e-6) -> torch.Tensor:
    """compute_grpo_outcome_advantage on (B·n,) scores grouped by prompt (consecutive n)."""
    out = torch.zeros_like(scores)
    for g in range(0, len(scores), n):
        s = scores[g:g + n]
        mean, std = (s.mean(), s.std()) if len(s) > 1 else (torch.tensor(0.0), torch.tensor(1.0))
        out[g:g + n] = (s - mean) / (std + eps)
    return out


def rel_topk(raw: torch.Tensor, mask: torch.Tensor, k: float):
    abs_adv = raw.abs()
    keep = torch.zeros_like(mask, dtype=torch.bool)
    for i in range(raw.shape[0]):
        valid = mask[i].bool()
        if valid.sum().item() == 0:
            continue
        tau = torch.quantile(abs_adv[i][valid].float(), 1.0 - k / 100.0)
        keep[i] = valid & (abs_adv[i] >= tau)
    return raw * keep.float(), keep


def rel_tanh(raw: torch.Tensor, keep: torch.Tensor, c: float) -> torch.Tensor:
    return torch.where(keep, c * torch.tanh(raw), raw)


class RelTrainer:
    """The state ``_apply_token_kl_regularizer`` keeps on verl's trainer, and the method itself."""

    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.global_steps = 1
        self._prev_actor_kl_loss = None

    def regularize(self, a_grpo: torch.Tensor, ref: torch.Tensor, old: torch.Tensor, mask: torch.Tensor):
        cfg, current_kl_loss = self.cfg, self._prev_actor_kl_loss
        raw = (ref - old) * mask
        if 0 < cfg["topk_percent"] < 100.0:
            raw, keep = rel_topk(raw, mask, cfg["topk_percent"])
        else:
            keep = mask.bool()
        if cfg["tanh_compress"]:
            raw = rel_tanh(raw, keep, cfg["tanh_coef"])
        nw = int(cfg["opd_warmup_steps"])
        scale = 1.0
        if nw > 0:
            if not hasattr(self, "_warmup_done"):
                self._warmup_done, self._warmup_scale_frozen = False, None
                self._warmup_end_step, self._warmup_kl_init = None, None
            if not self._warmup_done:
                if self._warmup_kl_init is None and current_kl_loss is not None:
                    self._warmup_kl_init = current_kl_loss
                natural = self.global_steps >= nw
                early = (cfg["kl_drop_delta"] > 0 and self._warmup_kl_init is not None and self._warmup_kl_init > 0.0
                         and current_kl_loss is not None
                         and (self._warmup_kl_init - current_kl_loss) / self._warmup_kl_init >= cfg["kl_drop_delta"])
                if natural or early:
                    self._warmup_scale_frozen = min(self.global_steps / nw, 1.0)
                    self._warmup_done, self._warmup_end_step = True, self.global_steps
            scale = self._warmup_scale_frozen if self._warmup_done else min(self.global_steps / nw, 1.0)
            raw = scale * raw
        anneal = 1.0
        if cfg["opd_anneal"]:
            if not hasattr(self, "_anneal_active"):
                self._anneal_active, self._anneal_t, self._anneal_steps_dynamic = False, 0, None
            if not (nw > 0 and not getattr(self, "_warmup_done", False)):
                if not self._anneal_active:
                    self._anneal_active, self._anneal_t = True, 0
                    if cfg["anneal_total_steps"] > 0:
                        end = getattr(self, "_warmup_end_step", None)
                        self._anneal_steps_dynamic = max(1, cfg["anneal_total_steps"] - (end or 0))
                R = self._anneal_steps_dynamic if self._anneal_steps_dynamic is not None else cfg["anneal_steps"]
                anneal = (cfg["anneal_min"] + (1.0 - cfg["anneal_min"]) * max(0.0, 1.0 - self._anneal_t / R)
                          if R > 0 else cfg["anneal_min"])
                self._anneal_t += 1
            raw = anneal * raw
        total = cfg["grpo_coef"] * a_grpo.unsqueeze(1) + cfg["opd_coef"] * raw
        return total, scale, anneal

    def after_update(self, kl_loss: float):
        """update_actor's metrics come back: ``_prev_actor_kl_loss`` for the next step; the step counter moves."""
        self._prev_actor_kl_loss = kl_loss
        self.global_steps += 1


def rel_is_weights(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    w = torch.exp(torch.clamp(old - rollout, min=-SAFETY_BOUND, max=SAFETY_BOUND)) * mask
    return w.clamp(max=threshold).detach()


def masked_mean(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return (x * m).sum() / (m.sum() + 1e-8)


def rel_low_var_kl(logp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    kl = torch.clamp(ref - logp, min=-20, max=20)
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)


def rel_vanilla(old, logp, adv, mask, w, clip_low=0.2, clip_high=0.2, clip_ratio_c=3.0):
    neg = torch.clamp(logp - old, min=-20.0, max=20.0)
    ratio = torch.exp(neg)
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    c1 = torch.maximum(l1, l2)
    c2 = torch.min(-adv * clip_ratio_c, c1)
    pg = torch.where(adv < 0, c2, c1)
    if w is not None:
        pg = pg * w
    return masked_mean(pg, mask)


def rel_update(old, logp, adv, mask, w, ref):
    """update_policy over one mini-batch, micro-batches of one sequence: (loss summed as backward sees it,
    actor/kl_loss as reduce_metrics reports it, the accumulation factor)."""
    B = logp.shape[0]
    grad_accum = B  # ppo_mini_batch_size // ppo_micro_batch_size_per_gpu (one GPU holding the whole mini-batch)
    total, kls = 0.0, []
    for i in range(B):
        sl = slice(i, i + 1)
        pg = rel_vanilla(old[sl], logp[sl], adv[sl], mask[sl], None if w is None else w[sl])
        kl_loss = masked_mean(rel_low_var_kl(logp[sl], ref[sl]), mask[sl])
        loss = (pg + kl_loss * 0.0) * (1 / grad_accum)  # kl_loss_coef = 0: monitored only
        total = total + loss
        kls.append(kl_loss.detach().item() * (1 / grad_accum))
    return total, sum(kls) / len(kls), grad_accum


# ---------------------------------------------------------------------------------------------- graft side
def graft_config(overrides=()):
    from graft_cli.config import compose

    return compose(["pair=saf_qwen3_4b", "method=saf", *overrides])


def graft_schedule(cfg, total_steps: int, **params):
    from graft_cli.algorithms.controllers import build_controllers

    spec = {**cfg.algo.controllers[0], **params}
    return build_controllers([spec], total_steps)[0][1]


def graft_advantages(cfg, rewards: torch.Tensor):
    from graft_cli.algorithms.advantages import ADVANTAGES

    return ADVANTAGES.get(cfg.algo.advantage)(rewards, eps=cfg.algo.adv_eps, norm_by_std=cfg.algo.norm_by_std)


def graft_token_advantages(cfg, a_grpo, teacher, old, rollout, lens, coefs):
    from graft_cli.batch import TrainBatch
    from graft_cli.train.update import AlgoParams, token_signals

    b = TrainBatch()
    for i, n in enumerate(lens):
        b.append(prompt_ids=[1, 2], response_ids=list(range(n)), advantages=float(a_grpo[i]), weights=1.0,
                 source="self", group=i, rewards=0.0, rollout_logprobs=rollout[i, :n].tolist(), texts="",
                 ref_logprobs=teacher[i, :n].tolist())
    b.old_logprobs = [old[i, :n].tolist() for i, n in enumerate(lens)]
    b, _ = token_signals(b, cfg.algo, AlgoParams.of(cfg.algo), 0, "student", coefs)
    T = teacher.shape[1]
    out = torch.zeros(len(lens), T, dtype=torch.float64)
    for i, n in enumerate(lens):
        out[i, :n] = torch.tensor(b.token_adv[i], dtype=torch.float64)
    return out


def graft_loss(cfg, old, logp, adv, mask, ref):
    from graft_cli.algorithms.losses import POLICY_LOSSES, LossInputs, Normaliser, compute_loss

    a = cfg.algo
    spec = POLICY_LOSSES.get(a.loss)
    B = mask.shape[0]
    norm = Normaliser(num_tokens=float(mask.sum()), num_seqs=float(B),
                      loss_scale_factor=a.loss_scale_factor or float(cfg.rollout.max_new_tokens))
    inp = LossInputs(logp, old, adv, mask, torch.ones(B, dtype=logp.dtype), torch.zeros(B, dtype=torch.bool),
                     norm=norm, in_pg=torch.ones(B, dtype=torch.bool), clip_low=a.clip_low, clip_high=a.clip_high,
                     clip_ratio_c=a.clip_ratio_c, agg=a.agg, columns={"ref_logprobs": ref},
                     params=spec.check(a.loss_params))
    loss, st = compute_loss(spec, inp, a.kl_coef, a.kl_type)
    return loss, float(st["kl_seq_mean/sum"] / st["kl_seq_mean/n"]), float(st["kl/sum"] / st["kl/n"])


# ------------------------------------------------------------------------------------------------- inputs
def random_step(g: torch.Generator, B: int = 16, n: int = 4, T: int = 24, long_frac: float | None = None,
                drift: float = 0.0):
    """One step's inputs: B rows (B/n prompts × n), response lengths 1..T (or a share ``long_frac`` of long rows),
    teacher / old / rollout / current log-probs (float32 like verl's tensors) and binary rewards."""
    if long_frac is None:  # ~1 row in 8 is EOS-only (its one token)
        lens = torch.randint(1, T + 1, (B,), generator=g) * (torch.rand(B, generator=g) >= 0.125)
        lens = lens.clamp(min=1)
    else:  # round(long_frac·B) long rows (T tokens), the others short (T/8)
        lens = torch.where(torch.arange(B) < round(long_frac * B), T, T // 8)
    mask = (torch.arange(T)[None] < lens[:, None]).to(torch.float32)
    old = -torch.rand(B, T, generator=g) * 3 * mask
    if long_frac is None:
        teacher = (-torch.rand(B, T, generator=g) * 3 - drift) * mask
    else:  # long answers: the teacher agrees per token (small gap); short ones: a large gap per token
        gap = torch.where(lens[:, None] == T, 0.1, 2.0) * (0.75 + 0.5 * torch.rand(B, T, generator=g))
        teacher = (old - gap) * mask
    rollout = (old + torch.randn(B, T, generator=g) * 0.3) * mask
    # the update's log-probs: near the old ones, some ratios beyond the clip range and the dual clip's 3
    logp = (old + torch.randn(B, T, generator=g) * (0.6 if long_frac is None else 0.0)) * mask
    rewards = (torch.rand(B // n, n, generator=g) < 0.4).to(torch.float32)
    return dict(lens=lens.tolist(), mask=mask, old=old, teacher=teacher, rollout=rollout, logp=logp, rewards=rewards,
                n=n)


# ----------------------------------------------------------------------------------------------- compare
def compare(cases: int = 24, steps: int = 30, seed: int = 0, overrides=()) -> dict:
    """Max |difference| of every compared quantity (see the module docstring); ``overrides``: graft config
    overrides (e.g. the settings graft used before it matched the released code, to see what they change)."""
    cfg = graft_config(overrides)
    C = float(RELEASED["is_threshold"])
    g = torch.Generator().manual_seed(seed)
    diffs = {k: 0.0 for k in ("grpo_advantage", "fused_advantage_with_is", "loss", "loss_gradient", "kl_statistic",
                              "warmup_scale", "anneal", "warmup_end_step")}

    def upd(key, x):
        diffs[key] = max(diffs[key], float(x.detach() if isinstance(x, torch.Tensor) else x))

    # (1) single steps: the stages at random points of the schedule
    for c in range(cases):
        x = random_step(g)
        a_rel = rel_grpo(x["rewards"].reshape(-1).double(), x["n"]).float()
        a_gr = graft_advantages(cfg, x["rewards"]).reshape(-1)
        upd("grpo_advantage", (a_rel - a_gr).abs().max())
        # the released fusion at a point of its schedule: warm-up frozen at `scale`, anneal counter t of R
        scale, t, R = [(0.01, 0, 20), (0.3, 0, 20), (0.3, 9, 20), (1.0, 20, 20)][c % 4]
        rt = RelTrainer(_rel_cfg(steps))
        rt._warmup_done, rt._warmup_scale_frozen, rt._warmup_end_step, rt._warmup_kl_init = True, scale, 1, 1.0
        rt._anneal_active, rt._anneal_t, rt._anneal_steps_dynamic = True, t, R
        fused, _, anneal = rt.regularize(a_rel, x["teacher"], x["old"], x["mask"])
        w = rel_is_weights(x["old"], x["rollout"], x["mask"], C)
        got = graft_token_advantages(cfg, a_gr, x["teacher"], x["old"], x["rollout"], x["lens"],
                                     {"saf/scale": scale, "saf/anneal": anneal})
        # the released loss weights the per-token loss; graft the advantage: compare the IS-weighted advantage
        upd("fused_advantage_with_is", ((got - (fused * x["mask"] * w).double()) * x["mask"]).abs().max())
        lp_r = x["logp"].clone().double().requires_grad_(True)
        lp_g = x["logp"].clone().double().requires_grad_(True)
        mask, old, ref = x["mask"].double(), x["old"].double(), x["teacher"].double()
        loss_r, kl_r, acc = rel_update(old, lp_r, (fused * x["mask"]).double(), mask, w.double(), ref)
        loss_g, kl_g, _ = graft_loss(cfg, old, lp_g, got, mask, ref)
        loss_r.backward()
        loss_g.backward()
        upd("loss", (loss_r - loss_g).abs())
        upd("loss_gradient", (lp_r.grad - lp_g.grad).abs().max())
        upd("kl_statistic", abs(kl_r * acc - kl_g))
    # (2) a run of `steps` steps, each side driven by its own KL statistic of the step's inputs: graft's composed
    # schedule (its defaults) against the released flags with S = the run's steps; then the option
    # anneal_total_steps = 0 (R = anneal_steps) on both sides
    for total in (None, 0):
        ctrl = graft_schedule(cfg, steps) if total is None else graft_schedule(cfg, steps, anneal_total_steps=0)
        rt = RelTrainer(_rel_cfg(steps) if total is None else {**_rel_cfg(steps), "anneal_total_steps": 0})
        for s in range(steps):
            x = random_step(g, drift=max(0.0, 1.5 - 0.15 * s))  # the teacher gap closes: the KL falls
            a_rel = rel_grpo(x["rewards"].reshape(-1).double(), x["n"]).float()
            _, sc_r, an_r = rt.regularize(a_rel, x["teacher"], x["old"], x["mask"])
            co = ctrl.coefs(s)
            upd("warmup_scale", abs(sc_r - co["saf/scale"]))
            upd("anneal", abs(an_r - co["saf/anneal"]))
            _, kl_r, acc = rel_update(x["old"].double(), x["logp"].double(), torch.zeros_like(x["mask"]).double(),
                                      x["mask"].double(), None, x["teacher"].double())
            _, kl_seq_g, kl_tok_g = graft_loss(cfg, x["old"].double(), x["logp"].double(),
                                               torch.zeros_like(x["mask"]).double(), x["mask"].double(),
                                               x["teacher"].double())
            rt.after_update(kl_r)
            ctrl.observe(s, [{"policy": "student", "kl_seq_mean": kl_seq_g, "kl": kl_tok_g}])
        upd("warmup_end_step", abs((rt._warmup_end_step or 0) - (ctrl.st["end"] or 0)))
    return diffs


def _rel_cfg(total_steps: int) -> dict:
    """The released TokenKLRegConfig: the scripts' flags (:data:`RELEASED`), S = the run's ``total_steps``."""
    out = dict(RELEASED)
    out["anneal_total_steps"] = total_steps if out["anneal_total_steps"] is None else out["anneal_total_steps"]
    return out


def warmup_stop_scenario(seed: int = 0, steps: int = 30, rows: int = 64, overrides=()) -> dict:
    """The step the warm-up stops on when the share of long answers grows from 15% to 87% of the rows (long
    answers agree with the teacher per token, short ones do not): released, graft as composed (with
    ``overrides``), graft with the per-sequence statistic (``kl_seq_mean``) and with the step's token mean
    (``kl``)."""
    cfg = graft_config(overrides)
    g = torch.Generator().manual_seed(seed)
    inputs = [random_step(g, B=rows, T=48, long_frac=0.15 + (0.87 - 0.15) * s / (steps - 1)) for s in range(steps)]
    out = {}
    rt = RelTrainer(_rel_cfg(300))
    for x in inputs:
        rt.regularize(torch.zeros(rows), x["teacher"], x["old"], x["mask"])
        if rt._warmup_done:
            break
        rt.after_update(rel_update(x["old"], x["logp"], torch.zeros_like(x["mask"]), x["mask"], None, x["teacher"])[1])
    out["released"] = rt._warmup_end_step
    for metric in ("composed", "kl_seq_mean", "kl"):
        ctrl = graft_schedule(cfg, 300) if metric == "composed" else graft_schedule(cfg, 300, kl_metric=metric)
        for s, x in enumerate(inputs):
            ctrl.coefs(s)
            zero = torch.zeros_like(x["mask"])
            _, kl_seq, kl_tok = graft_loss(cfg, x["old"], x["logp"], zero, x["mask"], x["teacher"])
            ctrl.observe(s, [{"policy": "student", "kl_seq_mean": kl_seq, "kl": kl_tok}])
            if ctrl.st["done"]:
                break
        out[f"graft ({metric})"] = ctrl.st["end"]
    return out


TOLERANCE = 1e-6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=24)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("overrides", nargs="*", help="graft config overrides (key=value), e.g. an old behaviour")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    try:
        diffs = compare(args.cases, args.steps, args.seed, overrides=args.overrides)
    except Exception as e:  # an old behaviour graft's config refuses
        print(f"FAIL: graft's saf does not run against the released SAF-OPD: {type(e).__name__}: "
              f"{str(e).splitlines()[0] if str(e) else ''}")
        return 1
    print(f"SAF-OPD, graft vs the released formulas ({args.cases} random steps, 2 schedules x {args.steps} steps, "
          f"seed {args.seed}): max |difference|")
    for k, v in diffs.items():
        print(f"  {k:<26} {v:.3e}")
    stop = warmup_stop_scenario(args.seed, overrides=args.overrides)
    print("warm-up stop step, long answers growing from 15% to 87% of the rows: "
          + ", ".join(f"{k} {v}" for k, v in stop.items()))
    bad = [f"{k} {v:.3g}" for k, v in diffs.items() if not v <= TOLERANCE]
    if stop["released"] != stop["graft (composed)"]:
        bad.append(f"warm-up stop step {stop['graft (composed)']} (released {stop['released']})")
    if bad:
        print(f"FAIL: graft differs from the released SAF-OPD beyond {TOLERANCE:g}: " + ", ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
