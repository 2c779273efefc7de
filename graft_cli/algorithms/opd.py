"""On-policy distillation fused with GRPO, and SAF-OPD's four stages (opd_saf.md §2–3).

Pure functions over ``(B, T)`` tensors (response-token positions, float ``mask``):

- :func:`opd_advantage` (opd_saf.md §1.2, Stage 0): A_OPD,t = log π_T(y_t) − log π_S,old(y_t) on
  every response token (the teacher's log-probs of the student's own tokens at the rollout
  temperature, as verl scores its reference slot; 1 on the SAF pairs and tiny);
- :func:`topk_sparsify` (Stage 1): per sequence τ_i = quantile(|A_i[valid]|, 1 − k/100) (torch's
  linear interpolation), keep = valid ∧ |A| ≥ τ_i (ties at τ kept); k = 100 keeps every response
  token;
- :func:`tanh_compress` (Stage 2): A ← where(keep, c·tanh(A), A), bounded in (−c, c);
- :class:`SafSchedule` (Stages 3–4, a registered controller ``saf_schedule``): the KL-triggered
  linear warm-up scale_w(s) = min(s/N_w, 1) over 1-based steps s, stopped (and frozen at its value)
  once the relative drop of the previous step's sampled k3 KL from KL_0 reaches δ, or at s ≥ N_w;
  then the linear anneal anneal(t) = c_min + (1 − c_min)·max(0, 1 − t/R), t = 0 on the activation
  step, R = the remaining budget max(1, S − s*) with S = ``anneal_total_steps`` (default: the run's
  steps, so the OPD term reaches c_min at the run's end), or R = ``anneal_steps`` when S = 0; N_w =
  0 anneals from step 1 (the code);
- :func:`fused_advantages` (the fusion, §2–3.2): A_total = g·A_GRPO + o·anneal·scale·stages(A_OPD),
  registered as the token-advantage function ``opd_fusion``. Fixed fusion is every stage off (k =
  100, no tanh, no controller); OPD-only is g = 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from graft_cli.algorithms.controllers import CONTROLLERS, Controller
from graft_cli.algorithms.losses import kl_penalty
from graft_cli.algorithms.signals import register_token_advantage, scalar_broadcast
from graft_cli.errors import GraftError
from graft_cli.registry import Params, choice


def opd_advantage(teacher_logp: torch.Tensor, student_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Stage 0: (log π_T − log π_S) · mask."""
    return (teacher_logp - student_logp) * mask


def topk_sparsify(a: torch.Tensor, mask: torch.Tensor, k: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1: keep, per sequence, the tokens whose |A| is at least the (1 − k/100) quantile of the
    sequence's
    |A| over its response tokens; returns ``(A·keep, keep)``. k ≥ 100: keep = mask."""
    valid = mask > 0
    if k >= 100:
        return a * valid, valid
    keep = torch.zeros_like(valid)
    for i in range(a.shape[0]):
        v = valid[i]
        if v.any():
            tau = torch.quantile(a[i][v].abs(), 1.0 - k / 100.0)  # in A's own dtype, so ties at τ are exact
            keep[i] = v & (a[i].abs() >= tau)
    return a * keep, keep


def tanh_compress(a: torch.Tensor, keep: torch.Tensor, c: float) -> torch.Tensor:
    """Stage 2: c·tanh(A) on the kept tokens (the raw log-ratio, no rescaling), A elsewhere."""
    return torch.where(keep, c * torch.tanh(a), a)


def sampled_reverse_kl(teacher_logp, student_logp, mask) -> float:
    """App. C's clipped k3 of the sampled tokens, token-mean over the mask: k3 = r − log r − 1, r =
    π_T/π_S."""
    k3 = kl_penalty(student_logp, teacher_logp, "low_var_kl")
    return float((k3 * mask).sum() / mask.sum().clamp(min=1.0))


def warmup_scale(step: int, warmup_steps: int) -> float:
    """scale_w(s) = min(s / N_w, 1) (s counts from 1); N_w = 0 → 1."""
    return 1.0 if warmup_steps <= 0 else min(step / warmup_steps, 1.0)


def anneal_factor(t: int, steps: int, c_min: float) -> float:
    """anneal(t) = c_min + (1 − c_min)·max(0, 1 − t/R)."""
    return c_min + (1.0 - c_min) * max(0.0, 1.0 - t / max(steps, 1))


def fused_advantages(a_grpo: torch.Tensor, teacher_logp: torch.Tensor, student_logp: torch.Tensor,
                     mask: torch.Tensor, *, grpo_coef: float = 1.0, opd_coef: float = 1.0, topk: float = 100.0,
                     tanh: bool = False, tanh_coef: float = 0.1, scale: float = 1.0, anneal: float = 1.0):
    """A_total = g·A_GRPO·mask + o·anneal·scale·stage2(stage1(A_OPD)) (opd_saf.md §3.2 "Fusion");
    ``a_grpo`` is ``(B,)`` or ``(B, T)``. Returns ``(A_total, A_OPD raw, A_OPD after the stages,
    keep)``."""
    raw = opd_advantage(teacher_logp, student_logp, mask)
    staged, keep = topk_sparsify(raw, mask, topk)
    if tanh:
        staged = tanh_compress(staged, keep, tanh_coef)
    base = a_grpo[:, None] * mask if a_grpo.dim() == 1 else a_grpo * mask
    return grpo_coef * base + opd_coef * anneal * scale * staged, raw, staged, keep


def _pad(rows: list, T: int) -> torch.Tensor:
    """float32, as verl computes the advantages (the loss sees float32 advantages either way)."""
    out = torch.zeros(len(rows), T, dtype=torch.float32)
    for i, r in enumerate(rows):
        if len(r):
            out[i, : len(r)] = torch.tensor([float(x) for x in r], dtype=torch.float32)
    return out


@dataclass(frozen=True)
class OpdFusionParams(Params):
    """``algo.token_adv_params`` of ``opd_fusion`` (:func:`fused_advantages`)."""

    grpo_coef: float = 1.0
    opd_coef: float = 1.0
    topk: float = 100.0
    tanh: bool = False
    tanh_coef: float = 0.1
    student_logprobs: str = choice("old", "rollout")  # the recomputed old log-probs | the rollout's
    teacher_column: str = "ref_logprobs"  # the frozen teacher's column


@register_token_advantage("opd_fusion", params=OpdFusionParams)
def opd_fusion(batch, ctx):
    """GRPO + OPD advantages per token (module docstring); the teacher's log-probs come from a
    frozen model's column (default ``ref_logprobs``, as verl's SAF puts the teacher in the reference
    slot); the student's are the recomputed old log-probs (S0's form) or the rollout log-probs.
    ``ctx.coefs`` may carry ``saf/scale`` and ``saf/anneal`` (the ``saf_schedule`` controller);
    without them both are 1."""
    p: OpdFusionParams = ctx.params
    col = p.teacher_column
    if col not in batch.extra:
        raise GraftError(f"config key 'algo.token_advantages': opd_fusion needs the teacher's column {col!r} "
                         f"(a policy with role: frozen and column: {col})")
    student = batch.old_logprobs if p.student_logprobs == "old" else batch.rollout_logprobs
    lens = [len(r) for r in batch.response_ids]
    T = max(lens, default=0)
    if T == 0:
        return batch.token_adv, {}
    mask = _pad([batch.mask_of(i) for i in range(len(batch))], T)
    teacher = _pad(batch.extra[col], T) * mask
    stud = _pad(student, T) * mask
    grpo = _pad([scalar_broadcast(batch, i) for i in range(len(batch))], T)
    scale, anneal = float(ctx.coefs.get("saf/scale", 1.0)), float(ctx.coefs.get("saf/anneal", 1.0))
    total, raw, staged, keep = fused_advantages(grpo, teacher, stud, mask, grpo_coef=p.grpo_coef,
                                                opd_coef=p.opd_coef, topk=p.topk, tanh=p.tanh,
                                                tanh_coef=p.tanh_coef, scale=scale, anneal=anneal)
    n = float(mask.sum().clamp(min=1.0))
    m = mask > 0
    grpo_abs = float((grpo.abs() * mask).sum()) / n
    met = {
        "opd/reverse_kl": sampled_reverse_kl(teacher, stud, mask),
        "opd/abs_mean": float((raw.abs() * mask).sum()) / n,
        "opd/abs_max": float(raw.abs()[m].max()) if m.any() else 0.0,
        "opd/topk_kept_frac": float(keep[m].float().mean()) if m.any() else 0.0,
        "opd/tanh_saturated_frac": float(((raw.abs() > 2.0) & keep)[m].float().mean()) if p.tanh and m.any()
        else 0.0,  # |A| > 2: tanh within 4% of its bound
        "opd/fused_abs_mean": float(((total - p.grpo_coef * grpo * mask).abs() * mask).sum()) / n,
        "grpo/abs_mean": grpo_abs,
        "opd/grpo_magnitude_ratio": float((raw.abs() * mask).sum()) / n / grpo_abs if grpo_abs > 0 else math.nan,
        "saf/scale_used": scale, "saf/anneal_used": anneal,
    }
    out = [total[i, : lens[i]].tolist() for i in range(len(batch))]
    return out, met


@dataclass(frozen=True)
class SafScheduleParams(Params):
    """An ``algo.controllers`` entry of ``saf_schedule`` (:class:`SafSchedule`)."""

    warmup_steps: int = 100
    kl_delta: float = 0.2
    warmup: bool = True
    anneal: bool = True
    anneal_steps: int = 200
    anneal_min: float = 0.0
    anneal_total_steps: int | None = None
    policy: str | None = None
    kl_metric: str = "kl_seq_mean"


@CONTROLLERS.register("saf_schedule", spec=SafScheduleParams())
class SafSchedule(Controller):
    """SAF's Stage 3 (KL-triggered warm-up) and Stage 4 (linear anneal) as coefficients
    ``saf/scale`` and ``saf/anneal`` (module docstring; opd_saf.md §3.2 and its reference snippet).

    The KL signal is the previous step's ``kl_metric`` metric of policy ``policy`` (default: the
    first row), verl's 1-step-lagged ``actor/kl_loss``: by default ``kl_seq_mean``, the mean over
    the step's sequences of each sequence's token-mean clipped k3 of the student at update time
    against the teacher column, which is what the released runs log (one sequence per micro-batch,
    the micro-batches' token means averaged; their constant 1/accumulation factor cancels in the
    relative drop); ``kl`` is the token mean over the step.

    ``anneal_total_steps`` S: ``None`` (default) is the run's steps (``total_steps``), so the anneal
    spans the training budget left after the warm-up and reaches ``anneal_min`` at the run's last
    step (the paper's "spans the full training budget"; S0's script takes ``ANNEAL_TOTAL_STEPS``,
    default 0); 0 uses ``anneal_steps``. R is fixed when the anneal starts (the released
    ``_anneal_steps_dynamic``), so a run resumed with another ``--steps`` keeps its anneal."""

    PARAMS = SafScheduleParams

    @classmethod
    def check(cls, p: SafScheduleParams, key: str) -> None:
        if p.warmup_steps < 0 or p.anneal_steps < 1 or not 0 <= p.anneal_min <= 1:
            raise GraftError(f"config key '{key}': saf_schedule needs warmup_steps >= 0, anneal_steps >= 1 and "
                             "0 <= anneal_min <= 1")
        S = p.anneal_total_steps
        if S is not None and (isinstance(S, bool) or not isinstance(S, (int, float)) or S < 0):
            raise GraftError(f"config key '{key}.anneal_total_steps': saf_schedule needs anneal_total_steps >= 0 (0: "
                             "anneal_steps; null: the run's steps)")

    def __init__(self, params: SafScheduleParams | None = None, total_steps: int = 0):
        super().__init__(params, total_steps)
        self.check(self.params, "algo.controllers")  # checked at config time too
        self.st = {"done": False, "frozen": None, "end": None, "kl0": None, "prev_kl": None, "t": 0, "R": None}

    def anneal_budget(self, end: int) -> int:
        """R for an anneal that starts after warm-up end ``end``: max(1, S − end) with S =
        ``anneal_total_steps`` (None: the run's steps), or ``anneal_steps`` when S = 0 (or the run's
        length is unknown)."""
        p = self.params
        S = int(self.total_steps if p.anneal_total_steps is None else p.anneal_total_steps)
        return max(1, S - int(end)) if S > 0 else int(p.anneal_steps)

    def _decide(self, s: int) -> tuple[dict, float, float]:
        """The state after step s (1-based) and that step's (scale, anneal); pure."""
        p, st = self.params, dict(self.st)
        nw = int(p.warmup_steps) if p.warmup else 0
        if not st["done"] and nw == 0:  # no warm-up: scale 1, annealing from step 1 (the code)
            st.update(done=True, frozen=1.0, end=0)
        if not st["done"]:
            if st["kl0"] is None and st["prev_kl"] is not None:
                st["kl0"] = st["prev_kl"]
            kl0, kl = st["kl0"], st["prev_kl"]
            early = p.kl_delta > 0 and bool(kl0) and kl0 > 0 and kl is not None and (kl0 - kl) / kl0 >= p.kl_delta
            if s >= nw or early:
                st.update(done=True, frozen=warmup_scale(s, nw), end=s)
        scale = st["frozen"] if st["done"] else warmup_scale(s, nw)
        anneal = 1.0
        if st["done"] and p.anneal:
            if st.get("R") is None:  # the anneal starts on this step: its budget is fixed now
                st["R"] = self.anneal_budget(st["end"])
            anneal = anneal_factor(st["t"], int(st["R"]), float(p.anneal_min))
            st["t"] += 1
        return st, float(scale), float(anneal)

    def coefs(self, step: int) -> dict:
        _, scale, anneal = self._decide(step + 1)
        return {"saf/scale": scale, "saf/anneal": anneal}

    def observe(self, step: int, rows: list[dict]) -> dict:
        st, scale, anneal = self._decide(step + 1)
        row = next((r for r in rows if self.params.policy in (None, r.get("policy"))), rows[0] if rows else {})
        kl = row.get(self.params.kl_metric)
        st["prev_kl"] = float(kl) if kl is not None and math.isfinite(float(kl)) else st["prev_kl"]
        self.st = st
        return {"saf/warmup_scale": scale, "saf/anneal": anneal, "saf/warmup_done": float(st["done"]),
                "saf/kl0": st["kl0"], "saf/warmup_end_step": st["end"]}

    def state_dict(self) -> dict:
        return dict(self.st)

    def load_state_dict(self, st: dict) -> None:
        self.st = {**self.st, **(st or {})}
