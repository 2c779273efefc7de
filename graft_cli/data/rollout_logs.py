"""Reading a run's rollout logs (``rollouts/<policy>/step_NNNNNN.parquet``, written by the trainer)
back as one step of a partner: the stored-trajectory source (graft.md §5) reads these.

Columns: step, prompt_index, prompt_id, sample_index, answer, response, token_ids, rollout_logprobs,
truncated, reward, advantage, extracted, data_seed. A log whose rollout log-probs are in a column of
an earlier name (:data:`RENAMED_COLUMNS`) is read under the current one. """

from __future__ import annotations

import os

from graft_cli.errors import GraftError

LOG_COLUMNS = ("step", "prompt_index", "prompt_id", "sample_index", "response", "token_ids", "rollout_logprobs",
               "truncated", "reward")
RENAMED_COLUMNS = {"gen_logprobs": "rollout_logprobs", "sampler_logprobs": "rollout_logprobs"}  # earlier names


def _open(path: str, step: int):
    """The parquet schema of one partner log (read without its rows); one line when it is missing,
    unreadable or not a rollout log."""
    # lazy: pyarrow is heavy
    import pyarrow.parquet as pq

    if not os.path.exists(path):
        raise GraftError(f"exchange.params.partner_run: no partner rollout log {path} for step {step + 1} "
                         f"(the partner run must cover every step of this run with run.log_rollouts=true)")
    try:
        names = pq.read_schema(path).names
    except Exception as e:  # a truncated or foreign file
        raise GraftError(f"{path}: not a readable parquet file ({type(e).__name__}: "
                         f"{(str(e).splitlines() or [''])[0][:160]})") from None
    names = [RENAMED_COLUMNS.get(c, c) for c in names]
    missing = [c for c in LOG_COLUMNS if c not in names]
    if missing:
        raise GraftError(f"{path}: not a rollout log (missing columns {', '.join(missing)})")
    return names


def _check_step(df, path: str, step: int, problems, data_seed: int | None) -> int:
    """``df`` (sorted by prompt and sample) holds ``step`` and, when ``problems`` is given, their
    prompt ids in order with the same number of samples each; returns that number (the group
    size)."""
    if len(df) == 0 or set(int(x) for x in df["step"]) != {step}:
        raise GraftError(f"{path}: holds step {sorted(set(int(x) for x in df['step']))} but this run is at step "
                         f"{step} (step mismatch)")
    sizes = df.groupby("prompt_index").size()
    n = int(sizes.iloc[0]) if len(sizes) else 0
    if problems is None:
        return n
    B = len(problems)
    ids = [str(x) for x in df.drop_duplicates("prompt_index")["prompt_id"]]
    want = [str(p.id) for p in problems]
    if len(sizes) != B or (sizes != n).any() or ids != want:
        seeds = sorted(set(int(x) for x in df["data_seed"])) if "data_seed" in df.columns else "?"
        first = next((i for i, (a, b) in enumerate(zip(ids, want)) if a != b), min(len(ids), len(want)))
        theirs = ids[first] if first < len(ids) else None
        ours = want[first] if first < len(want) else None
        raise GraftError(f"{path}: prompt order differs from this run at step {step + 1} (prompt {first}: partner "
                         f"{theirs!r} vs {ours!r}; partner data seed {seeds}, this run {data_seed}); use the "
                         f"partner's data, seed and prompt batch")
    return n


def check_partner_step(path: str, step: int, problems=None, data_seed: int | None = None) -> None:
    """The check of :func:`read_partner_step` on the log's light columns only (its schema, step,
    prompt ids and sample indices; not the responses), so every step of a run is checked before step
    1 in seconds. ``problems`` None (prompts not known in advance): the file and its step only."""
    # lazy: pandas is heavy
    import pandas as pd

    names = _open(path, step)
    cols = [c for c in ("step", "prompt_index", "prompt_id", "sample_index", "data_seed") if c in names]
    df = pd.read_parquet(path, columns=cols).sort_values(["prompt_index", "sample_index"], kind="stable")
    _check_step(df.reset_index(drop=True), path, step, problems, data_seed)


def read_partner_step(path: str, step: int, problems, data_seed: int | None = None) -> dict:
    """Load one partner log and check it against this step: the file exists, its ``step`` column
    equals ``step`` and its prompt ids (in prompt order) equal ``problems``' ids. Returns column
    lists sorted by (prompt_index, sample_index) and the group size ``n``."""
    # lazy: pandas is heavy
    import pandas as pd

    _open(path, step)
    df = pd.read_parquet(path).rename(columns=RENAMED_COLUMNS)
    df = df.sort_values(["prompt_index", "sample_index"], kind="stable").reset_index(drop=True)
    n = _check_step(df, path, step, problems, data_seed)
    return {"n": n, **{c: df[c].tolist() for c in df.columns}}
