"""A training set re-weighted by the value of one field of its records (``data.mix``).

``data.mix`` maps values of the field ``data.mix_field`` (default ``family``, the tiny task's skill
family) to shares s_v. With G_v the problems whose field equals v, the mixed set takes n_v problems
of each G_v,

    n_v = round(N · s̄_v),   s̄_v = s_v / Σ_u s_u,   N = max { N' : round(N' · s̄_v) ≤ |G_v| for
    every v },   (1)

the largest set with the asked shares that no group runs out of (``round``: half to even). Each G_v
is sampled without replacement with ``numpy.random.default_rng(data.mix_seed)`` (one generator,
groups in sorted value order); the set keeps the file's order within a group, groups in sorted value
order (the prompt sampler shuffles per run seed). Values the mapping does not name are left out. The
same config gives the same set in every run, so arms and seeds of a study train on one set. """

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from graft_cli.data.problems import Problem, load_problems
from graft_cli.errors import GraftError

__all__ = ["check_mix", "load_training_set", "mix_problems", "mix_sizes", "training_problems"]


def mix_sizes(counts: Mapping[str, int], shares: Mapping[str, float]) -> dict[str, int]:
    """n_v of eq. (1) from the group sizes |G_v| and the shares s_v (values with s_v = 0 get 0)."""
    total = float(sum(shares.values()))
    norm = {v: float(s) / total for v, s in shares.items()}
    live = [v for v, s in norm.items() if s > 0]
    n = int(min(counts[v] / norm[v] for v in live)) + 1  # an upper bound on N; walk down to the first fit
    while n > 0 and any(round(n * norm[v]) > counts[v] for v in live):
        n -= 1
    return {v: (int(round(n * norm[v])) if norm[v] > 0 else 0) for v in shares}


def mix_problems(groups: Mapping[str, Sequence[Problem]], shares: Mapping[str, float], seed: int = 0
                 ) -> list[Problem]:
    """The mixed set of eq. (1) from the problems of each value (``groups``, in file order)."""
    sizes = mix_sizes({v: len(groups[v]) for v in shares}, shares)
    rng = np.random.default_rng(seed)
    out: list[Problem] = []
    for v in sorted(shares):
        g = list(groups[v])
        keep = sorted(rng.choice(len(g), size=sizes[v], replace=False).tolist()) if sizes[v] else []
        out += [g[i] for i in keep]
    return out


def check_mix(shares: Mapping, key: str = "data.mix") -> None:
    """One line naming the key when a share is not a number ≥ 0 or none is > 0."""
    for v, s in shares.items():
        if isinstance(s, bool) or not isinstance(s, (int, float)) or s < 0:
            raise GraftError(f"config key '{key}.{v}': a share must be a number >= 0, got {s!r}")
    if shares and not any(float(s) > 0 for s in shares.values()):
        raise GraftError(f"config key '{key}': at least one share must be > 0")


def load_training_set(source: str, fields: dict | None, where: dict | None, mix: Mapping | None = None,
                      mix_field: str = "family", mix_seed: int = 0) -> list[Problem]:
    """The training problems of ``source`` (``where``: only rows whose fields equal these values),
    re-weighted by ``mix`` (value of ``mix_field`` -> share, eq. 1) when it is given."""
    if not mix:
        return load_problems(source, fields, where)
    check_mix(mix)
    groups = {}
    for v in mix:
        try:
            groups[str(v)] = load_problems(source, fields, {**(where or {}), mix_field: v})
        except GraftError as e:
            if str(e).endswith(": no problems"):
                raise GraftError(f"config key 'data.mix.{v}': {source} has no row with {mix_field} = {v!r}") from None
            raise
    return mix_problems(groups, {str(v): float(s) for v, s in mix.items()}, mix_seed)


def training_problems(data, source: str) -> list[Problem]:
    """The training set a run's ``data`` config (``DataConfig``) names, read from ``source`` (its
    ``train`` resolved to a file or hub id): every problem, or the mixed set of eq. (1) under
    ``data.mix``."""
    return load_training_set(source, dict(data.fields) or None, dict(data.where) or None, dict(data.mix) or None,
                             data.mix_field, data.mix_seed)
