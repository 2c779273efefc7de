"""The GRAFT paper's reported numbers (docs/spec/graft.md §6), for side-by-side columns in `graft
report`.

Values are percentages as printed in the paper; a cell is ``(mean, std)`` with ``std`` None where
the paper prints none, and a missing cell is None. Rows are kept as the paper's own strings (five
benchmarks, then the average after ``|``) and parsed by :func:`_row`, so every number can be checked
against graft.md by eye. The OCR repairs listed in graft.md §6.0 are already applied there. Method
keys are the method config names of ``experiments/method/`` (``grpo``, ``grpo_n16``, ``grpo_n32``,
``graft``, ``graft_*`` variants, ``graft_stored``) plus ``hacpo``, ``sgt`` and ``grpo_dapo`` (GRPO
n=8 + dynamic sampling) for the baselines. """

# ruff: noqa: E501
from __future__ import annotations

BENCHMARKS = ("math500", "aime24", "aime25", "amc23", "minerva")
MODEL_IDS = {
    "smol": "HuggingFaceTB/SmolLM3-3B-Base",
    "qwen": "Qwen/Qwen3-1.7B-Base",
    "octo": "OctoThinker/OctoThinker-3B-Hybrid-Base",
}
MODEL_NAMES = {"smol": "SmolLM3-3B-Base", "qwen": "Qwen3-1.7B-Base", "octo": "OctoThinker-3B-Hybrid-Base"}
PAIRS = {"1": ("smol", "qwen"), "2": ("octo", "qwen"), "3": ("smol", "octo")}
# graft.md §2.7 / §6.2: share of the receiver's all-fail prompts the other model solves, mean over
# GRPO n=8 training
COMPLEMENTARITY = {("smol", "qwen"): 47.9, ("qwen", "smol"): 18.7}  # (solver, failer) -> %
HEADLINE = {"mean_delta_graft_vs_grpo": 2.108, "max_delta": 4.46, "vs_hacpo": 4.0, "vs_sgt": 1.5}
DEVICES = 4  # Table 5 accounting: GPU-h = 4 x sum of per-step wall-clock (validation and checkpointing excluded)


def _cell(s: str):
    s = s.strip()
    if s in ("—", "-", ""):
        return None
    mean, _, std = s.partition("±")
    return (float(mean), float(std) if std else None)


def _row(method: str, pair: str | None, cells: str, delta: float | None) -> dict:
    """``'72.08±0.52 8.58±1.13 8.50±0.96 46.62±1.49 27.22±0.63 | 32.60±0.49'`` -> a row dict."""
    bench, _, avg = cells.partition("|")
    vals = bench.split()
    if len(vals) != len(BENCHMARKS):
        raise ValueError(f"expected {len(BENCHMARKS)} benchmark cells in {cells!r}")
    out = {"method": method, "pair": pair}
    out.update({b: _cell(v) for b, v in zip(BENCHMARKS, vals)})
    out["avg"] = _cell(avg)
    out["delta"] = delta
    return out


def _compute(s_avg, s_best, s_full, q_avg, q_best, q_full, both_best, both_full) -> dict:
    return {"smol": {"avg": _cell(s_avg), "best": s_best, "full": s_full},
            "qwen": {"avg": _cell(q_avg), "best": q_best, "full": q_full},
            "both": {"best": both_best, "full": both_full}}


# Table 1 (graft.md §6.1): updated model -> rows (method, peer pair; GRPO rows have pair None);
# delta vs GRPO n=8.
TABLE1 = {
    'smol': [
        _row('grpo', None, '72.08±0.52 8.58±1.13 8.50±0.96 46.62±1.49 27.22±0.63 | 32.60±0.49', None),
        _row('grpo_n16', None, '72.88±0.40 9.08±0.90 9.83±1.34 47.19±1.01 27.90±0.75 | 33.38±0.25', +0.78),
        _row('grpo_n32', None, '76.68±0.56 11.42±0.81 12.83±1.23 49.56±1.80 28.08±0.57 | 35.71±0.18', +3.11),
        _row('hacpo', '1', '69.58±0.53 7.08±1.79 10.83±1.69 42.88±1.61 27.17±0.61 | 31.51±0.43', -1.09),
        _row('sgt', '1', '75.53±0.51 10.67±1.52 11.50±0.37 49.06±1.51 27.63±0.68 | 34.88±0.21', +2.28),
        _row('graft', '1', '76.86±0.32 14.42±1.49 14.50±0.99 50.87±1.60 28.68±0.57 | 37.06±0.67', +4.46),
        _row('hacpo', '3', '66.66±0.66 5.92±1.68 5.42±1.21 38.94±1.91 25.22±0.77 | 28.43±0.70', -4.17),
        _row('sgt', '3', '72.36±0.43 8.67±1.19 8.67±1.57 43.62±1.07 27.01±0.32 | 32.07±0.48', -0.53),
        _row('graft', '3', '73.28±0.14 10.42±1.02 10.83±0.78 46.44±1.49 25.35±0.24 | 33.26±0.32', +0.66),
    ],
    'qwen': [
        _row('grpo', None, '70.69±0.44 9.17±1.28 4.75±0.91 43.50±1.57 27.89±0.29 | 31.20±0.27', None),
        _row('grpo_n16', None, '71.64±0.60 10.67±1.73 8.25±1.65 41.44±1.12 28.75±0.35 | 32.15±0.73', +0.95),
        _row('grpo_n32', None, '71.90±0.10 10.17±0.56 5.75±0.75 45.62±2.31 28.71±0.56 | 32.43±0.65', +1.23),
        _row('hacpo', '1', '63.74±0.60 7.17±0.90 4.17±1.18 36.06±1.20 25.04±0.44 | 27.24±0.30', -3.96),
        _row('sgt', '1', '70.97±0.77 10.17±1.34 5.92±0.85 40.75±0.87 28.39±0.43 | 31.24±0.56', +0.04),
        _row('graft', '1', '72.22±0.25 12.50±0.42 7.67±1.34 45.56±1.09 29.23±0.32 | 33.44±0.23', +2.24),
        _row('hacpo', '2', '66.93±0.30 6.83±0.96 4.00±0.48 36.69±1.78 27.64±0.38 | 28.42±0.38', -2.78),
        _row('sgt', '2', '69.47±0.25 9.58±0.29 5.83±1.28 41.69±1.90 28.42±0.81 | 31.00±0.40', -0.20),
        _row('graft', '2', '71.75±0.36 11.33±0.99 7.25±1.20 44.56±3.88 29.02±0.77 | 32.78±0.49', +1.58),
    ],
    'octo': [
        _row('grpo', None, '56.32±0.60 2.50±0.93 1.08±0.86 27.94±1.75 18.06±0.81 | 21.18±0.40', None),
        _row('grpo_n16', None, '58.39±0.69 3.25±0.54 1.83±0.48 28.69±0.87 19.86±0.50 | 22.40±0.43', +1.22),
        _row('grpo_n32', None, '60.89±0.33 3.42±1.19 1.75±0.46 31.19±2.33 19.70±0.73 | 23.39±0.56', +2.21),
        _row('hacpo', '2', '55.44±0.51 3.58±1.49 0.92±0.19 26.38±1.62 18.12±0.44 | 20.89±0.38', -0.29),
        _row('sgt', '2', '58.11±0.41 2.17±1.26 2.08±0.59 28.69±1.89 18.63±0.62 | 21.93±0.45', +0.75),
        _row('graft', '2', '58.01±0.36 3.42±0.80 1.25±0.78 34.75±2.98 19.90±0.71 | 23.47±0.68', +2.29),
        _row('hacpo', '3', '56.70±0.40 2.92±1.02 1.33±0.35 29.12±0.78 19.37±0.68 | 21.89±0.25', +0.71),
        _row('sgt', '3', '57.82±0.31 3.50±0.48 1.83±0.63 29.12±0.97 20.26±0.89 | 22.51±0.32', +1.33),
        _row('graft', '3', '57.59±0.50 4.25±0.75 2.25±0.70 30.19±1.30 18.74±0.76 | 22.60±0.22', +1.42),
    ],
}

# Table 5 (§6.3, Pair 1): per-model Avg, best-checkpoint and 3-epoch GPU-h; joint cost of both
# models.
TABLE5 = {  # method: (smol Avg, smol best, smol 3-ep, qwen Avg, qwen best, qwen 3-ep, both best, both 3-ep)
    'grpo': _compute('32.60', 17.2, 17.4, '31.20', 11.4, 12.5, 28.6, 29.9),
    'grpo_n16': _compute('33.38', 21.0, 34.8, '32.15', 22.1, 22.5, 43.1, 57.3),
    'grpo_n32': _compute('35.71', 48.7, 99.5, '32.43', 43.3, 45.6, 92.0, 145.1),
    'grpo_dapo': _compute('34.99±0.35', 29.4, 40.5, '32.59±0.33', 21.4, 27.4, 50.8, 67.9),
    'hacpo': _compute('31.51', 23.5, 25.1, '27.24', 5.9, 22.0, 44.0, 47.1),
    'sgt': _compute('34.88', 24.0, 30.9, '31.24', 19.4, 22.2, 46.2, 53.1),
    'graft': _compute('37.06', 25.3, 26.7, '33.44', 15.0, 16.6, 40.9, 43.3),
    'graft_stored': _compute('35.28±0.33', 11.1, 20.0, '33.01±0.53', 12.1, 13.3, 23.2, 33.3),
}

# Table 2a / 7 (§6.4, Pair 1): receiver -> ablation rows; delta vs full GRAFT (δ = 0.8).
TABLE7 = {
    'smol': [
        _row('graft', '1', '76.86±0.32 14.42±1.49 14.50±0.99 50.87±1.60 28.68±0.57 | 37.06±0.67', None),
        _row('graft_nogate', '1', '68.66±0.40 5.42±1.47 4.92±1.12 39.19±1.66 25.33±0.57 | 28.70±0.78', -8.36),
        _row('graft_nofloor', '1', '75.66±0.49 11.75±1.23 12.17±1.16 49.38±1.86 26.89±0.66 | 35.17±0.59', -1.89),
        _row('graft_nobalance', '1', '75.05±0.25 10.08±1.68 12.50±0.78 49.44±2.20 28.24±0.48 | 35.06±0.27', -2.00),
        _row('graft_seqratio', '1', '75.83±0.58 10.50±1.04 12.50±1.56 48.94±1.80 28.26±0.49 | 35.21±0.65', -1.85),
        _row('graft_randprompts', '1', '75.81±0.31 10.08±1.12 11.75±0.68 47.94±1.69 27.70±0.71 | 34.66±0.47', -2.40),
        _row('graft_randadmit', '1', '76.00±0.45 11.25±1.53 11.25±1.67 50.25±3.02 27.24±0.53 | 35.20±0.85', -1.86),
        _row('graft_first', '1', '75.74±0.32 9.83±1.49 11.25±0.51 49.06±1.98 27.18±0.53 | 34.61±0.43', -2.45),
        _row('graft_uniform', '1', '72.47±0.68 12.58±1.30 9.92±0.90 45.06±2.53 27.42±0.63 | 33.49±0.47', -3.57),
        _row('graft_pooled', '1', '74.21±0.44 9.58±1.32 9.17±1.06 45.88±1.39 26.53±0.61 | 33.07±0.47', -3.99),
        _row('grpo', '1', '— — — — — | 32.60±0.49', -4.46),
    ],
    'qwen': [
        _row('graft', '1', '72.22±0.25 12.50±0.42 7.67±1.34 45.56±1.09 29.23±0.32 | 33.44±0.23', None),
        _row('graft_nogate', '1', '69.20±0.25 8.00±0.80 5.75±1.12 42.81±1.89 28.88±0.37 | 30.93±0.52', -2.51),
        _row('graft_nofloor', '1', '66.97±0.60 8.50±1.05 4.58±1.18 41.69±1.87 27.66±0.73 | 29.88±0.62', -3.56),
        _row('graft_nobalance', '1', '71.77±0.59 11.25±1.14 7.67±0.48 44.94±2.01 29.17±0.33 | 32.96±0.56', -0.48),
        _row('graft_seqratio', '1', '72.18±0.46 11.67±1.69 6.50±1.09 44.81±1.44 29.77±0.33 | 32.99±0.33', -0.45),
        _row('graft_randprompts', '1', '71.51±0.29 9.50±1.39 6.50±1.09 43.44±1.29 28.35±0.56 | 31.86±0.48', -1.58),
        _row('graft_randadmit', '1', '71.29±0.29 11.08±1.09 6.50±1.52 44.56±1.03 28.29±0.39 | 32.35±0.32', -1.09),
        _row('graft_first', '1', '71.29±0.53 9.75±0.56 5.42±0.88 43.69±2.33 28.48±0.36 | 31.73±0.58', -1.71),
        _row('graft_uniform', '1', '71.25±0.28 11.08±1.09 6.58±0.75 44.31±1.88 28.80±0.43 | 32.41±0.55', -1.03),
        _row('graft_pooled', '1', '69.77±0.70 8.92±1.00 5.50±0.90 41.88±1.45 27.87±0.58 | 30.78±0.48', -2.66),
        _row('grpo', '1', '— — — — — | 31.20±0.27', -2.24),
    ],
}

# Table 7 δ sweep (§6.5, Pair 1): method -> receiver -> row; δ = 0 is the w/o-floor run; delta vs δ
# = 0.8.
DELTA_SWEEP = {
    'graft_nofloor': {
        'smol': _row('graft_nofloor', '1', '75.66 11.75 12.17 49.38 26.89 | 35.17±0.59', None),
        'qwen': _row('graft_nofloor', '1', '66.97 8.50 4.58 41.69 27.66 | 29.88±0.62', None),
    },
    'graft_delta0p7': {
        'smol': _row('graft_delta0p7', '1', '74.16±0.48 11.17±1.54 9.58±1.06 48.69±1.16 27.26±0.88 | 34.17±0.49', -2.89),
        'qwen': _row('graft_delta0p7', '1', '71.94±0.21 10.83±0.78 7.00±1.30 46.31±1.87 28.41±0.79 | 32.90±0.50', -0.54),
    },
    'graft_delta0p9': {
        'smol': _row('graft_delta0p9', '1', '77.38±0.26 9.83±1.43 14.00±0.48 51.75±1.65 27.75±0.65 | 36.14±0.18', -0.92),
        'qwen': _row('graft_delta0p9', '1', '71.33±0.66 9.58±1.95 6.08±1.83 43.38±1.91 29.14±0.50 | 31.90±0.63', -1.54),
    },
}

# Table 2b / 8 (§6.6, Pair 1): design -> receiver -> Avg (per benchmark where the paper gives it);
# delta vs full GRAFT.
TABLE8 = {
    'graft_pooled': {
        'smol': _row('graft_pooled', '1', '— — — — — | 33.07±0.47', -3.99),
        'qwen': _row('graft_pooled', '1', '— — — — — | 30.78±0.48', -2.66),
    },
    'graft_successonly': {
        'smol': _row('graft_successonly', '1', '— — — — — | 29.22±0.26', -7.84),
        'qwen': _row('graft_successonly', '1', '— — — — — | 29.51±0.65', -3.93),
    },
    'graft_successonly_nofloor': {
        'smol': _row('graft_successonly_nofloor', '1', '— — — — — | 32.14±0.38', -4.92),
        'qwen': _row('graft_successonly_nofloor', '1', '— — — — — | 29.85±0.44', -3.59),
    },
    'graft_hacpo_update': {
        'smol': _row('graft_hacpo_update', '1', '67.73±0.43 6.42±0.37 6.42±1.16 40.06±1.64 24.23±0.58 | 28.97±0.52', -8.09),
        'qwen': _row('graft_hacpo_update', '1', '65.59±0.38 6.25±1.28 4.92±1.60 35.75±2.06 26.45±0.45 | 27.79±0.38', -5.65),
    },
    'graft_sft_update': {
        'smol': _row('graft_sft_update', '1', '75.57±0.39 9.08±1.94 12.08±1.59 46.63±1.49 27.02±0.66 | 34.08±0.15', -2.98),
        'qwen': _row('graft_sft_update', '1', '71.00±0.50 10.58±1.37 5.83±0.78 43.12±1.50 28.90±1.36 | 31.89±0.37', -1.55),
    },
    'graft_luffy': {
        'smol': _row('graft_luffy', '1', '73.62±0.45 9.50±0.90 7.75±1.40 45.19±2.28 26.50±0.39 | 32.51±0.89', -4.55),
        'qwen': _row('graft_luffy', '1', '71.16±0.37 9.42±1.52 5.08±0.95 43.44±1.47 27.94±0.66 | 31.41±0.50', -2.03),
    },
    'hacpo': {
        'smol': _row('hacpo', '1', '— — — — — | 31.51', -5.55),
        'qwen': _row('hacpo', '1', '— — — — — | 27.24', -6.20),
    },
    'sgt': {
        'smol': _row('sgt', '1', '— — — — — | 34.88', -2.18),
        'qwen': _row('sgt', '1', '— — — — — | 31.24', -2.20),
    },
}

# Table 9 (§6.7, Pair 1, steps 1-48): clipped-token fraction (%) by minibatch ordering; self /
# grafted tokens.
TABLE9 = {  # row: {ordering: clipped-token fraction in %}
    'self:smol': {'first': 0.046, 'uniform': 0.043, 'last': 0.045},
    'self:qwen': {'first': 0.068, 'uniform': 0.068, 'last': 0.072},
    'peer:smol': {'first': 0.004, 'uniform': 0.13, 'last': 0.277},
    'peer:qwen': {'first': 0.002, 'uniform': 0.248, 'last': 0.44},
    'zero_peer_steps': {'first': 97.6, 'uniform': 13.0, 'last': 0.0},
}

# Table 4 (§6.8): pair -> model -> method -> mean ± sample std over 3 training runs; delta GRAFT vs
# GRPO n=8.
TABLE4 = {
    '1': {
        'smol': {
            'grpo': _row('grpo', '1', '72.21±2.78 7.91±0.58 8.72±2.01 45.08±2.46 26.84±0.45 | 32.15±1.48', None),
            'graft': _row('graft', '1', '75.37±1.30 13.28±1.32 13.22±1.29 50.37±0.98 28.34±1.36 | 36.12±0.85', +3.97),
        },
        'qwen': {
            'grpo': _row('grpo', '1', '70.69±0.30 9.66±0.43 5.86±0.97 42.60±0.78 28.10±0.35 | 31.38±0.16', None),
            'graft': _row('graft', '1', '71.78±0.38 12.06±0.57 7.33±0.96 45.81±0.29 29.22±0.09 | 33.24±0.33', +1.86),
        },
    },
    '2': {
        'octo': {
            'grpo': _row('grpo', '2', '55.86±0.42 2.94±1.15 0.72±0.38 28.35±0.36 17.82±0.40 | 21.14±0.22', None),
            'graft': _row('graft', '2', '57.36±0.57 3.67±0.90 2.05±0.94 33.56±2.11 19.30±0.72 | 23.19±0.24', +2.05),
        },
        'qwen': {
            'grpo': _row('grpo', '2', '— — — — — | 31.38±0.16', None),
            'graft': _row('graft', '2', '71.17±0.53 11.19±0.64 7.72±0.97 43.19±1.44 28.57±0.48 | 32.37±0.41', +0.99),
        },
    },
    '3': {
        'smol': {
            'grpo': _row('grpo', '3', '— — — — — | 32.15±1.48', None),
            'graft': _row('graft', '3', '72.27±1.13 9.92±1.96 10.19±0.90 46.92±0.94 26.03±0.63 | 33.06±0.31', +0.91),
        },
        'octo': {
            'grpo': _row('grpo', '3', '— — — — — | 21.14±0.22', None),
            'graft': _row('graft', '3', '56.47±2.47 5.03±1.35 1.75±0.60 30.25±0.06 19.29±1.57 | 22.56±1.07', +1.42),
        },
    },
}

# Table 6 (§6.9): pair -> receiver -> stored-trajectory GRAFT; delta vs GRPO n=8.
TABLE6 = {
    '1': {
        'smol': _row('graft_stored', '1', '74.53±0.41 12.00±1.62 12.50±0.29 49.94±2.36 27.44±0.69 | 35.28±0.33', +2.68),
        'qwen': _row('graft_stored', '1', '72.81±0.63 10.92±0.90 5.83±1.21 46.00±1.42 29.49±0.70 | 33.01±0.53', +1.81),
    },
    '2': {
        'octo': _row('graft_stored', '2', '57.91±0.83 4.00±1.76 2.42±0.85 31.06±2.28 20.03±0.51 | 23.08±0.35', +1.90),
        'qwen': _row('graft_stored', '2', '71.86±0.24 11.08±1.46 7.08±0.98 44.06±2.17 29.03±0.33 | 32.63±0.63', +1.43),
    },
    '3': {
        'smol': _row('graft_stored', '3', '73.83±0.36 10.42±1.14 12.67±1.05 48.56±2.51 27.83±0.76 | 34.66±0.62', +2.06),
        'octo': _row('graft_stored', '3', '55.21±0.56 3.50±1.05 2.25±0.76 30.63±2.80 18.31±0.91 | 21.98±0.33', +0.80),
    },
}

METHOD_ORDER_T1 = ("grpo", "grpo_n16", "grpo_n32", "grpo_dapo", "hacpo", "sgt", "graft")


def model_key(model: str | None) -> str | None:
    """``smol``/``qwen``/``octo`` for the paper's hub ids (also a local copy named after them), else
    None."""
    if not model:
        return None
    for k, hub in MODEL_IDS.items():
        if model == hub or model.rstrip("/").endswith(hub.split("/")[1]):
            return k
    return None


def table1(model: str, method: str, pair: str | None) -> dict | None:
    """The paper's Table 1 row for ``model`` updated by ``method`` (GRPO baselines: any pair)."""
    for r in TABLE1.get(model, []):
        if r["method"] == method and (r["pair"] is None or r["pair"] == pair):
            return r
    return None


def ablation(model: str, method: str, pair: str | None = "1") -> dict | None:
    """Pair-1 ablation/design/δ-sweep row for a receiver (Tables 2, 7, 8)."""
    if pair != "1":
        return None
    for r in TABLE7.get(model, []):
        if r["method"] == method:
            return r
    if method in DELTA_SWEEP:
        return DELTA_SWEEP[method].get(model)
    if method in TABLE8:
        return TABLE8[method].get(model)
    return None


def compute(method: str, pair: str | None) -> dict | None:
    return TABLE5.get(method) if pair == "1" else None


def repeats(pair: str | None, model: str, method: str) -> dict | None:
    return TABLE4.get(pair or "", {}).get(model, {}).get(method)


def stored(pair: str | None, model: str) -> dict | None:
    return TABLE6.get(pair or "", {}).get(model)
