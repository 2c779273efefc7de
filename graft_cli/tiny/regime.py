"""The tiny pair's regime, measured before any RL: do the two models write differently, and can
GRAFT's gate pass what carries each model's missing skill?

``graft tiny build --check`` samples groups of ``n`` from each peer on a fixed prompt set and hands them to
:func:`measure_regime`, which reports per receiver X (with source Y, its peer):

* ``weak_family``: X's weak family, the family of smallest weight in its SFT mix (declared by the recipe, not
  picked after measuring); ``weak_pass1``: X's pass@1 on it;
* ``weak_peer_mixed``: on X's all-fail prompts of that family, the share where Y's group is mixed (1 <= k < n);
* ``weak_admitted``: of Y's responses on those prompts (the responses GRAFT's ``replace`` mode would graft,
  correct and wrong), the share the gate admits at δ (``floor`` gate, strict s > δ);
* ``admitted``: the same share over every would-be grafted response (X all-fail, Y mixed, any family);
* ``style_separability``: how well the rule "written in X's style" (:func:`style_of`, on the text's markers)
  tells X's own responses from Y's: the balanced accuracy (share of X's responses in X's style + share of Y's
  not in it) / 2, so 0.5 when both write the same style; ``own_style_share`` is the first term alone;
* ``own_minus_peer_loglik``: X's mean per-token log-likelihood of its own correct responses minus that of
  Y's correct responses re-tokenized into X's tokenizer (both on the same prompts, scored by X).

s is computed as the trainer computes it (graft.md Eq. 6-7, :func:`~graft_cli.algorithms.exchange.gates.
compatibility`): Y's response text re-tokenized with X's tokenizer (:func:`~graft_cli.models.retokenize.
retokenize`, X's EOS appended when Y ended with EOS and excluded from the mean), X's log-probs at the rollout
temperature under X's own prompt encoding, over Y's *rollout* log-probs with the terminal EOS excluded
(``peer_logprobs: rollout``, the default).

The targets (:data:`REGIME_TARGETS`) were fixed before any study of a pair in this regime ran
(docs/tiny_pair.md).
"""

from __future__ import annotations

import math
import re

import torch

from graft_cli.algorithms.exchange.gates import compatibility, source_mean_logprob
from graft_cli.algorithms.exchange.graft import GraftParams
from graft_cli.batch import TrainBatch
from graft_cli.models.retokenize import retokenize
from graft_cli.models.scoring import ScoreSettings, score_rows

REGIME_TARGETS = {
    "style_separability": 0.95,  # >=
    "own_minus_peer_loglik": 0.0,  # >
    "weak_pass1": (0.03, 0.20),  # within
    "weak_peer_mixed": 0.30,  # >=
    "weak_admitted": 0.20,  # >=
    "admitted": (0.25, 0.75),  # within
}

# Markers of the three styles of :mod:`graft_cli.data.synthetic` (STYLES), checked in this order.
_STYLE_RULES = (
    ("words", re.compile(r"[0-9)] is [0-9]|, answer \\boxed")),
    ("steps", re.compile(r"^Let's compute|; so the final answer")),
    ("prose", re.compile(r"^To find|\. The answer is")),
    ("chain", re.compile(r"[0-9)]=[0-9]")),
)


def style_of(text: str) -> str | None:
    """The style a response is written in, by rule (first match): ``words`` if it has ``<digit> is <digit>`` or
    ``, answer \\boxed``; ``steps`` if it opens with ``Let's compute`` or has ``; so the final answer``; ``prose`` if
    it opens with ``To find`` or has ``. The answer is``; ``chain`` if it has ``=`` between digits; ``None`` when no
    marker is there (e.g. a response that is only ``\\boxed{7}``)."""
    for name, rx in _STYLE_RULES:
        if rx.search(text):
            return name
    return None


def _within(x: float, band) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and band[0] <= x <= band[1]


def regime_met(per_model: dict) -> dict:
    """``{key: bool}`` for one model's regime figures against :data:`REGIME_TARGETS`."""
    t = REGIME_TARGETS
    return {
        "style_separability": per_model["style_separability"] >= t["style_separability"],
        "own_minus_peer_loglik": per_model["own_minus_peer_loglik"] > t["own_minus_peer_loglik"],
        "weak_pass1": _within(per_model["weak_pass1"], t["weak_pass1"]),
        "weak_peer_mixed": per_model["weak_peer_mixed"] >= t["weak_peer_mixed"],
        "weak_admitted": per_model["weak_admitted"] >= t["weak_admitted"],
        "admitted": _within(per_model["admitted"], t["admitted"]),
    }


def score_responses(model, prompts: list[list[int]], responses: list[list[int]], pad_id: int,
                    temperature: float = 1.0) -> list[list[float]]:
    """Per-token log-probs of each response under ``model``: the trainer's scoring pass
    (:func:`graft_cli.models.scoring.score_rows`, as for the receiver's old log-probs)."""
    if not prompts:
        return []
    batch = TrainBatch()
    for q, (p, r) in enumerate(zip(prompts, responses)):
        batch.append(prompt_ids=p, response_ids=r, advantages=0.0, weights=1.0, source="self", group=q)
    return score_rows(model, pad_id, batch, ScoreSettings(temperature=temperature))


def _mean(xs) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else math.nan


def _peer_scored(X: dict, ro, n: int, temperature: float) -> tuple[list, list, list]:
    """Every response of the peer's rollouts ``ro``, re-tokenized into X's tokenizer and scored by X once (the
    grafted ones give s, the correct ones the peer log-likelihood): (re-tokenized ids and counts, X's per-token
    log-probs, whether each response ended)."""
    ended = [not bool(t) for t in ro.truncated]
    peer_tok = [retokenize(t, X["tokenizer"], e) for t, e in zip(ro.texts, ended)]
    lp_peer = score_responses(X["model"], [X["prompt_ids"][r // n] for r in range(len(ro.texts))],
                              [ids for ids, _ in peer_tok], X["tokenizer"].pad_token_id, temperature)
    return peer_tok, lp_peer, ended


def _own_loglik(X: dict, own_ok: list, n: int, temperature: float) -> float:
    """X's mean per-token log-likelihood of its own correct responses."""
    own_ro = X["rollouts"]
    own_rows = [r for r in range(len(own_ro.texts)) if own_ok[r] > 0]
    own_ids = [list(own_ro.response_ids[r]) for r in own_rows]
    own_n = [len(i) - (0 if own_ro.truncated[r] else 1) for i, r in zip(own_ids, own_rows)]
    lp_own = score_responses(X["model"], [X["prompt_ids"][r // n] for r in own_rows], own_ids,
                             X["tokenizer"].pad_token_id, temperature)
    return _mean([_mean(lp[:k]) for lp, k in zip(lp_own, own_n) if k > 0])


def _style_figures(X: dict, peer_texts: list) -> dict:
    """How X's style tells its responses from the peer's: the balanced accuracy of the rule "written in X's style"
    (0.5 when the two write the same style) and the share of X's own responses in its style."""
    own_styles = [style_of(t) for t in X["rollouts"].texts]
    peer_styles = [style_of(t) for t in peer_texts]
    own_share = sum(st == X["style"] for st in own_styles) / max(1, len(own_styles))
    return {"style_separability": 0.5 * (own_share + sum(st != X["style"] for st in peer_styles)
                                         / max(1, len(peer_styles))),
            "own_style_share": own_share}


def measure_regime(side: dict, families: list[str], answers_ok: dict, weak: dict, n: int,
                   delta: float = GraftParams.delta, temperature: float = 1.0) -> dict:
    """The regime figures (module docstring) for every ordered pair of the models in ``side``.

    ``side[name]`` holds ``model``, ``tokenizer``, ``prompt_ids`` (one per prompt, that model's encoding),
    ``rollouts`` (groups of ``n``, prompt-major; ``response_ids``, ``texts``, ``logprobs``, ``truncated``) and
    ``style`` (its own style's name); ``answers_ok[name]`` is the per-response reward (0/1) list;
    ``families`` the family of each prompt; ``weak[name]`` the model's declared weak family."""
    names = list(side)
    ks = {nm: [int(round(sum(answers_ok[nm][q * n:(q + 1) * n]))) for q in range(len(families))] for nm in names}
    out: dict = {}
    for x in names:
        for y in names:
            if x == y:
                continue
            X, Y = side[x], side[y]
            ro = Y["rollouts"]
            peer_tok, lp_peer, ended = _peer_scored(X, ro, n, temperature)
            rows = [q * n + j for q in range(len(families)) if ks[x][q] == 0 and 1 <= ks[y][q] < n for j in range(n)]
            fams = [families[r // n] for r in rows]
            s = [compatibility(lp_peer[r], peer_tok[r][1], source_mean_logprob(ro.logprobs[r], ended[r]))
                 for r in rows]
            adm = [math.isfinite(v) and v > delta for v in s]
            wf = weak[x]
            weak_idx = [i for i, f in enumerate(fams) if f == wf]
            fail_w = [q for q, f in enumerate(families) if f == wf and ks[x][q] == 0]
            fam_q = [q for q, f in enumerate(families) if f == wf]
            # own vs peer log-likelihood of correct responses, scored by X
            own_ll = _own_loglik(X, answers_ok[x], n, temperature)
            peer_ll = _mean([_mean(lp_peer[r][:peer_tok[r][1]]) for r in range(len(ro.texts))
                             if answers_ok[y][r] > 0 and peer_tok[r][1] > 0])
            res = {
                "source": y,
                "weak_family": wf,
                "weak_pass1": (sum(ks[x][q] for q in fam_q) / (n * len(fam_q))) if fam_q else math.nan,
                "weak_all_fail": len(fail_w) / len(fam_q) if fam_q else math.nan,
                "weak_peer_mixed": (sum(1 <= ks[y][q] < n for q in fail_w) / len(fail_w)) if fail_w else 0.0,
                "weak_grafted": len(weak_idx),
                "weak_admitted": (sum(adm[i] for i in weak_idx) / len(weak_idx)) if weak_idx else 0.0,
                "grafted": len(rows),
                "retok_length_ratio": (sum(len(peer_tok[r][0]) for r in rows)
                                       / max(1, sum(len(ro.response_ids[r]) for r in rows))),
                "admitted": (sum(adm) / len(adm)) if adm else 0.0,
                "admitted_by_family": {f: sum(adm[i] for i in range(len(fams)) if fams[i] == f)
                                       / sum(1 for g in fams if g == f) for f in sorted(set(fams))},
                "s_median": float(torch.tensor([v for v in s if math.isfinite(v)]).median()) if s else math.nan,
                **_style_figures(X, ro.texts),
                "own_loglik": own_ll,
                "peer_loglik": peer_ll,
                "own_minus_peer_loglik": own_ll - peer_ll,
                "s": [v if math.isfinite(v) else None for v in s],
                "s_correct": [bool(answers_ok[y][r] > 0) for r in rows],
                "s_family": fams,
            }
            res["met"] = regime_met(res)
            out[x] = res
    out["delta"] = delta
    out["targets"] = {k: list(v) if isinstance(v, tuple) else v for k, v in REGIME_TARGETS.items()}
    out["all_met"] = all(all(out[nm]["met"].values()) for nm in names if nm in out)
    return out


__all__ = ["REGIME_TARGETS", "style_of", "regime_met", "measure_regime", "score_responses"]
