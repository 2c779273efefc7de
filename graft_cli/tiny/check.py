"""Measuring a built tiny pair (:mod:`graft_cli.tiny`): :func:`check_tiny` samples each role with
the project's rollout engine and grades with the reward (pass@1, all-fail share, complementarity
both ways, per family and the regime), :func:`targets_met` against the build's targets, and ``graft
tiny build [--check]`` (:func:`tiny_main`)."""

from __future__ import annotations

import json
import math
import os
import sys
import time

import torch
from rich.table import Table

from graft_cli.algorithms.exchange.selection import filled_share, trigger
from graft_cli.console import make_console
from graft_cli.data.prompts import PromptSpec
from graft_cli.data.synthetic import CANONICAL_STYLE
from graft_cli.reward import make_grader
from graft_cli.rollout.engine import SamplingParams
from graft_cli.rollout.graded import Graded, sample_and_grade
from graft_cli.rollout.hf import HFEngine
from graft_cli.rundir import read_jsonl
from graft_cli.tiny.build import JOBS, POLICY_ROLES, ROLES, _jobs_for, build_tiny, read_manifest
from graft_cli.tiny.regime import REGIME_TARGETS, measure_regime
from graft_cli.tiny.sft import Recipe

# ----------------------------------------------------------------------------------------------------
# Measurement


def sample_groups(model, tokenizer, problems: list[str], golds: list[str], grader, n: int = 8, seed: int = 0,
                  max_new_tokens: int = 48, temperature: float = 1.0) -> Graded:
    """Sample ``n`` responses per problem with the project's rollout engine (prompt-major) and grade
    them."""
    spec = PromptSpec()
    prompt_ids = [spec.encode(p, tokenizer) for p in problems]
    return sample_and_grade(HFEngine(model, tokenizer), prompt_ids, golds,
                            SamplingParams(n=n, temperature=temperature, top_p=1.0, max_new_tokens=max_new_tokens,
                                           seed=seed), grader)


def check_tiny(paths: dict, num_prompts: int = 256, n: int = 8, seed: int = 0, roles=ROLES,
               max_new_tokens: int = 48, heldout: int = 500, grader=None, threads: int = 1) -> dict:
    """Measured properties of a built cache on the training distribution (first ``num_prompts``
    records of ``train.jsonl``), sampling at T = 1.0, ``n`` samples per prompt, fixed seed, with the
    project's rollout engine (:class:`~graft_cli.rollout.hf.HFEngine`), graded by the math-verify
    reward. Per role: ``pass1``, ``all_fail``, ``all_pass``, per-family and per-level pass@1,
    truncation rate, mean response tokens, and ``math500_pass1`` (one sample on the first
    ``heldout`` problems of ``eval_math500.jsonl``; 0 skips it). Pair: ``comp_a_fail_b_mixed``
    (share of a's all-fail prompts on which b's group has 1 <= k < n) and ``comp_b_fail_a_mixed``.
    Sampling runs on ``threads`` threads (1 is as fast for 3M models and immune to
    oversubscription)."""
    # lazy: transformers is slow to import
    from transformers import AutoModelForCausalLM, AutoTokenizer


    recs = read_jsonl(os.path.join(paths["task"], "train.jsonl"))[:num_prompts]
    held = read_jsonl(os.path.join(paths["task"], "eval_math500.jsonl"))[:heldout]
    own = grader is None
    grader = grader or make_grader(num_workers=2, timeout_s=5)
    out: dict = {"num_prompts": len(recs), "n": n, "seed": seed, "temperature": 1.0}
    ks: dict = {}

    built_recipe = (read_manifest(os.path.dirname(paths["a"])) or {}).get("recipe") or {}
    own_styles = built_recipe.get("own_styles") or {}
    side: dict = {}  # a and b: what the regime measurement (regime.measure_regime) needs
    rewards: dict = {}
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for role in roles:
            tok = AutoTokenizer.from_pretrained(paths[role])
            model = AutoModelForCausalLM.from_pretrained(paths[role], dtype=torch.float32)
            t0 = time.time()
            graded = sample_groups(model, tok, [r["problem"] for r in recs], [r["answer"] for r in recs], grader,
                                   n=n, seed=seed, max_new_tokens=max_new_tokens)
            gen_s = time.time() - t0  # sampling and grading
            ro, rew, k = graded.rollouts, graded.rewards, graded.k.tolist()
            ks[role] = k
            if role in ("a", "b"):
                side[role] = {"model": model, "tokenizer": tok, "prompt_ids": ro.prompt_ids, "rollouts": ro,
                              "style": own_styles.get(role, CANONICAL_STYLE)}
                rewards[role] = rew
            fam: dict = {}
            lev: dict = {}
            for r, kk in zip(recs, k):
                fam.setdefault(r["family"], []).append(kk / n)
                lev.setdefault(str(r["level"]), []).append(kk / n)
            res = {
                "pass1": sum(rew) / len(rew),
                "all_fail": sum(x == 0 for x in k) / len(k),
                "all_pass": sum(x == n for x in k) / len(k),
                "family_pass1": {f: sum(v) / len(v) for f, v in sorted(fam.items())},
                "level_pass1": {f: sum(v) / len(v) for f, v in sorted(lev.items())},
                "truncated": sum(ro.truncated) / len(ro.truncated),
                "response_tokens": sum(len(x) for x in ro.response_ids) / len(ro.response_ids),
                "sample_seconds": gen_s,
            }
            if held:
                rh = sample_groups(model, tok, [r["problem"] for r in held], [r["answer"] for r in held], grader,
                                   n=1, seed=seed, max_new_tokens=max_new_tokens).rewards
                res["math500_pass1"] = float(sum(rh)) / len(rh)
            out[role] = res
    finally:
        torch.set_num_threads(prev_threads)
        if own:
            grader.close()
    if "a" in ks and "b" in ks:
        out["comp_a_fail_b_mixed"] = _comp(ks["a"], ks["b"], n)
        out["comp_b_fail_a_mixed"] = _comp(ks["b"], ks["a"], n)
        out["families"] = family_complementarity([r["family"] for r in recs], ks["a"], ks["b"], n)

        out["regime"] = measure_regime(side, [r["family"] for r in recs], rewards, weak_families(built_recipe, out), n)
    peers = {r: ks[r] for r in POLICY_ROLES if r in ks}
    if len(peers) >= 3:
        out["peer_fills"] = peer_fills(peers, n)
        out["peer_fills_by_family"] = {f: peer_fills(peers, n, idx)
                                       for f, idx in _family_index([r["family"] for r in recs]).items()}
    return out


def weak_families(recipe: dict, props: dict) -> dict[str, str]:
    """Each of a and b's weak family: the family of smallest weight in its SFT mix (``recipe``: the
    built cache's, as its manifest holds it), declared before anything is measured; without one, the
    family of lowest measured pass@1."""
    out = {}
    for r in ("a", "b"):
        fams = (recipe.get(f"stage_{r}") or {}).get("families")
        out[r] = (min(fams, key=lambda f: (fams[f], f)) if fams
                  else min(props[r]["family_pass1"], key=props[r]["family_pass1"].get))
    return out


def _family_index(families: list[str]) -> dict[str, list[int]]:
    """family -> the indices of its prompts, families in sorted order."""
    out: dict[str, list[int]] = {}
    for i, f in enumerate(families):
        out.setdefault(f, []).append(i)
    return dict(sorted(out.items()))


def peer_fills(ks: dict, n: int, index: list[int] | None = None) -> dict:
    """Who can fill whose all-fail prompts, among N >= 2 models: the fillable share
    (:func:`~graft_cli.algorithms.exchange.selection.filled_share`, Alg. 1's trigger: the peer's
    group mixed, 1 <= k < n), not the paper's solved share. ``ks`` maps a model to its per-prompt
    success counts in groups of ``n`` (``index``: the prompts counted, default all). Per receiver X:
    ``all_fail`` (share of the prompts), and on X's all-fail prompts ``any`` (some peer's group
    mixed), ``mixed[Y]`` (Y's group mixed) and ``only[Y]`` (Y's mixed and no other peer's): the
    prompts only Y can fill. A share over no all-fail prompt is 0."""
    index = list(range(len(next(iter(ks.values()))))) if index is None else index
    out = {}
    for x, kx in ks.items():
        sub = [kx[i] for i in index]
        fails = [q for q, k in enumerate(sub) if k == 0]
        others = [y for y in ks if y != x]
        fills = {y: set(trigger(sub, [ks[y][i] for i in index], n)) for y in others}
        out[x] = {"n_prompts": len(index), "all_fail": len(fails) / len(index) if index else 0.0,
                  "any": _fill_share(fails, fills, others),
                  "mixed": {y: _fill_share(fails, fills, [y]) for y in others},
                  "only": {y: _fill_share(fails, fills, [y], [z for z in others if z != y]) for y in others}}
    return out


def _fill_share(fails: list[int], fills: dict, by: list[str], not_by: tuple | list = ()) -> float:
    """Share of ``fails`` some model in ``by`` fills and none in ``not_by`` (0 over no prompt)."""
    hit = [q for q in fails if any(q in fills[y] for y in by) and not any(q in fills[z] for z in not_by)]
    return len(hit) / len(fails) if fails else 0.0


def family_complementarity(families: list[str], k_a: list[int], k_b: list[int], n: int) -> dict:
    """Per skill family: each model's all-fail rate and, on its all-fail prompts, the share on which
    the peer's group is mixed (1 <= k < n): the prompts GRAFT can graft on. ``k_*`` are the
    per-prompt success counts of groups of ``n``; returns family -> {n_prompts, all_fail_a,
    all_fail_b, peer_mixed_a (b mixed on a's all-fail), peer_mixed_b}."""
    out = {}
    for fam, idx in _family_index(families).items():
        f = peer_fills({"a": k_a, "b": k_b}, n, idx)
        out[fam] = {"n_prompts": len(idx), "all_fail_a": f["a"]["all_fail"], "all_fail_b": f["b"]["all_fail"],
                    "peer_mixed_a": f["a"]["mixed"]["b"], "peer_mixed_b": f["b"]["mixed"]["a"]}
    return out


def blind_spots(families: dict, all_fail_min: float | None = None, peer_mixed_min: float | None = None) -> dict:
    """Per model, the families that are structural blind spots: all-fail rate >= ``all_fail_min``
    and the peer's group mixed on >= ``peer_mixed_min`` of those prompts (defaults: :data:`TARGETS`,
    60% and 40%)."""
    all_fail_min = TARGETS["blind_all_fail"] if all_fail_min is None else all_fail_min
    peer_mixed_min = TARGETS["blind_peer_mixed"] if peer_mixed_min is None else peer_mixed_min
    return {r: [f for f, v in families.items() if v[f"all_fail_{r}"] >= all_fail_min
                and v[f"peer_mixed_{r}"] >= peer_mixed_min] for r in ("a", "b")}


def _comp(k_fail: list[int], k_other: list[int], n: int) -> float:
    """The fillable share of the first model's all-fail prompts by the other (0 when it has
    none)."""
    share = filled_share(k_fail, [k_other], n)[0]
    return 0.0 if math.isnan(share) else share


TARGETS = {"pass1": (0.15, 0.60), "all_fail": (0.15, 0.60), "comp": 0.10, "comp_one_way": 0.20,
           "blind_all_fail": 0.60, "blind_peer_mixed": 0.40, "only_fill": 0.05, "ratio": (0.85, 1.18)}


def targets_met(props: dict) -> dict:
    """Which of the pair's targets hold for measured ``props``: pass@1 and all-fail bands for a and
    b; complementarity >= 10 % both ways and >= 20 % one way; re-tokenized length ratios in [0.85,
    1.18] both ways (with ``props["token_stats"]``); and each model's regime targets
    (``props["regime"]``: :data:`graft_cli.tiny.regime.REGIME_TARGETS`). v2's blind-spot targets are
    reported (:func:`blind_spots`) but no longer required."""
    lo, hi = TARGETS["pass1"]
    flo, fhi = TARGETS["all_fail"]
    met = {}
    for r in POLICY_ROLES:
        if r in props:
            met[f"{r}_pass1"] = lo <= props[r]["pass1"] <= hi
            met[f"{r}_all_fail"] = flo <= props[r]["all_fail"] <= fhi
    comps = [props[k] for k in ("comp_a_fail_b_mixed", "comp_b_fail_a_mixed") if k in props]
    for key in ("comp_a_fail_b_mixed", "comp_b_fail_a_mixed"):
        if key in props:
            met[key] = props[key] >= TARGETS["comp"]
    if len(comps) == 2:
        met["comp_one_way_20"] = max(comps) >= TARGETS["comp_one_way"]
    ts = props.get("token_stats") or {}
    for x in ("a", "b"):  # re-tokenized length ratios (v2's target, kept)
        for y in ("a", "b"):
            key = f"ratio_{y}_over_{x}"
            if x != y and key in ts:
                met[key] = TARGETS["ratio"][0] <= ts[key] <= TARGETS["ratio"][1]
    reg = props.get("regime") or {}
    for r in ("a", "b"):  # v3's regime (regime.REGIME_TARGETS), replacing v2's blind spots
        for k, ok in (reg.get(r) or {}).get("met", {}).items():
            met[f"{r}_{k}"] = bool(ok)
    for x, v in props.get("peer_fills", {}).items():  # three models: each peer alone fills some of x's prompts
        for y, share in v["only"].items():
            met[f"{x}_only_{y}_fills"] = share >= TARGETS["only_fill"]
    return met


# ----------------------------------------------------------------------------------------------------
# CLI entry point


def _summary_table(man: dict):
    builds = " + ".join(f"{'/'.join(b['jobs'])} {b['seconds']:.0f} s" for b in man.get("builds", []))
    t = Table(title=f"tiny pair (seed {man['seed']}, built in {man['build_seconds']:.0f} s"
                    f"{': ' + builds if len(man.get('builds', [])) > 1 else ''})")
    for c in ("role", "arch", "tokenizer", "params", "SFT steps", "final loss", "weights sha256"):
        t.add_column(c)
    for r in ROLES:
        if r not in man["models"]:
            continue
        m = man["models"][r]
        t.add_row(r, m["arch"], m["tokenizer"], f"{m['params'] / 1e6:.2f}M", str(m["steps"]),
                  f"{m.get('final_loss', float('nan')):.3f}", m["hash"][:12])
    return t


def _props_table(props: dict):
    t = Table(title=f"measured on {props['num_prompts']} training prompts x {props['n']} samples, T=1.0")
    for c in ("role", "pass@1", "all-fail", "all-pass", "math500 pass@1", "resp. tokens", "truncated"):
        t.add_column(c)
    for r in ROLES:
        if r in props:
            p = props[r]
            t.add_row(r, f"{p['pass1']:.3f}", f"{p['all_fail']:.3f}", f"{p['all_pass']:.3f}",
                      f"{p.get('math500_pass1', float('nan')):.3f}", f"{p['response_tokens']:.1f}",
                      f"{p['truncated']:.3f}")
    return t


def _families_table(props: dict):
    t = Table(title="per skill family: all-fail share, and the peer's group mixed on those prompts")
    for c in ("family", "prompts", "a pass@1", "b pass@1", "a all-fail", "b mixed | a all-fail", "b all-fail",
              "a mixed | b all-fail"):
        t.add_column(c)
    for f, v in props["families"].items():
        fp = (props["a"]["family_pass1"][f], props["b"]["family_pass1"][f])
        t.add_row(f, str(v["n_prompts"]), f"{fp[0]:.3f}", f"{fp[1]:.3f}",
                  f"{v['all_fail_a']:.3f}", f"{v['peer_mixed_a']:.3f}", f"{v['all_fail_b']:.3f}",
                  f"{v['peer_mixed_b']:.3f}")
    return t


def _regime_table(reg: dict):
    t = Table(title=f"regime before RL (gate δ = {reg['delta']}): target / a <- b / b <- a")
    for c in ("figure", "target", "a", "b"):
        t.add_column(c)

    def tgt(v):
        return f"[{v[0]:g}, {v[1]:g}]" if isinstance(v, tuple) else (f"> {v:g}" if v == 0 else f">= {v:g}")

    t.add_row("weak family", "declared", reg["a"]["weak_family"], reg["b"]["weak_family"])
    for k in ("weak_pass1", "weak_peer_mixed", "weak_admitted", "admitted", "style_separability",
              "own_minus_peer_loglik"):
        t.add_row(k, tgt(REGIME_TARGETS[k]),
                  *(f"{reg[r][k]:.3f} {'met' if reg[r]['met'][k] else 'NOT met'}" for r in ("a", "b")))
    t.add_row("grafted responses (weak)", "", *(f"{reg[r]['grafted']} ({reg[r]['weak_grafted']})" for r in "ab"))
    return t


def _fills_table(props: dict):
    fills = props["peer_fills"]
    t = Table(title="three models: on each model's all-fail prompts, the share each peer's group is mixed on "
                    "(only: and no other peer's)")
    for c in ("model", "all-fail", "some peer mixed", *(f"{y} mixed (only {y})" for y in fills)):
        t.add_column(c)
    for x, v in fills.items():
        t.add_row(x, f"{v['all_fail']:.3f}", f"{v['any']:.3f}",
                  *(f"{v['mixed'][y]:.3f} ({v['only'][y]:.3f})" if y in v["mixed"] else "—" for y in fills))
    return t


def roles_line(roles) -> str:
    """What ``graft tiny build`` builds (or reuses): the roles asked for, with the roles their jobs
    make too (a's job makes the junior), and the roles left for a run to build when it first asks
    for them."""
    made = [r for r in ROLES if r in {x for job in _jobs_for(set(roles), set()) for x in JOBS[job]}]
    rest = [r for r in ROLES if r not in made]
    return (f"tiny roles built (or reused): {', '.join(made)}"
            + (f"; not built: {', '.join(rest)} (built when a run first asks for them)" if rest else ""))


def tiny_main(check: bool = False, cache_dir: str | None = None, seed: int = 0, force: bool = False, *,
              recipe: Recipe | str | None = None, num_prompts: int = 256, n: int = 8, heldout: int = 500,
              roles=None) -> dict:
    """``graft tiny build [--check] [--roles a,b]``: build or reuse the cache (``roles``, default
    all), print a summary table; with ``check``, measure the properties and print them, the LAST
    line being one JSON object."""

    console = make_console()
    recipe = Recipe.named(recipe) if isinstance(recipe, str) else recipe
    console.print(roles_line(roles or ROLES))
    paths = build_tiny(cache_dir, seed=seed, force=force, progress=True, recipe=recipe, roles=roles or ROLES)
    cache = os.path.dirname(paths["a"])
    man = read_manifest(cache)
    console.print(_summary_table(man))
    ts = man["token_stats"]
    tt = Table(title="tokens per sequence (training split, reference responses + EOS)")
    for c in ("tokenizer", "vocab", "prompt (mean)", "response (mean)", "prompt+response (max)"):
        tt.add_column(c)
    for k in (r for r in POLICY_ROLES if f"vocab_{r}" in ts):
        tt.add_row(k, str(ts[f"vocab_{k}"]), f"{ts[f'tokens_prompt_{k}']:.1f}", f"{ts[f'tokens_response_{k}']:.1f}",
                   str(ts[f"tokens_total_max_{k}"]))
    console.print(tt)
    console.print(f"cache: {cache}")
    if man.get("machine"):  # the weights depend on the CPU's float kernels (docs/tiny_pair.md)
        mc = man["machine"]
        console.print(f"built on: {mc['cpu']} ({mc['kernels']} kernels), torch {mc['torch']}")
    result: dict = {"cache": cache, "paths": paths, "build_seconds": man["build_seconds"], "hashes": man["hashes"]}
    if check:
        props = check_tiny(paths, num_prompts=num_prompts, n=n, seed=seed, heldout=heldout,
                           max_new_tokens=man.get("max_new_tokens", 48))
        console.print(_props_table(props))
        console.print("re-tokenized length ratios: " + ", ".join(
            f"{y}/{x} {ts[f'ratio_{y}_over_{x}']:.2f}" for x in POLICY_ROLES for y in POLICY_ROLES if x < y))
        console.print(f"complementarity: a all-fail -> b mixed {props['comp_a_fail_b_mixed']:.3f}; "
                      f"b all-fail -> a mixed {props['comp_b_fail_a_mixed']:.3f}")
        console.print(_families_table(props))
        if "peer_fills" in props:
            console.print(_fills_table(props))
        props["blind_spots"] = blind_spots(props["families"])
        for r in ("a", "b"):  # the per-response s lists stay out of the printed JSON (the summary stays)
            for k in ("s", "s_correct", "s_family"):
                props["regime"][r].pop(k, None)
        console.print(_regime_table(props["regime"]))
        props["token_stats"] = ts
        met = targets_met(props)
        props["targets_met"] = met
        props["build_seconds"] = man["build_seconds"]
        props["machine"] = man.get("machine")  # the CPU the weights were built on (absent in older caches)
        result = props
        console.file.flush()
        sys.stdout.flush()
        print(json.dumps(props, sort_keys=True), flush=True)
    return result
