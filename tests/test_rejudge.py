"""Stored comparisons re-judged under the floored interval (graft_cli/report/rejudge.py), against values by hand."""

import json
import math

import pytest

from graft_cli.report import rejudge as R

T2, T10 = 4.302653, 2.228139  # t_{0.975} at 2 and 10 df (tables)


def _entry(delta, total, ev, df, per_seed=None, **extra):
    h = T2 * math.sqrt(total)  # the stored (unfloored) interval, whatever its df
    return {"interval": [delta, delta - h, delta + h], "verdict": "stored",
            "decomposition": {"total": total, "evaluation": ev, "df": df, "n": [df + 1, df + 1],
                              "per_seed": per_seed or {}}, **extra}


def test_the_floor_binds_when_the_evaluation_variance_exceeds_the_se2():
    f = R.floored(_entry(0.5, 0.04, 0.09, 2))
    h = T2 * 0.3  # sqrt(max(0.04, 0.09))
    assert f["interval"] == pytest.approx([0.5, 0.5 - h, 0.5 + h], abs=1e-5)
    assert f["floor_binds"] is True and f["verdict"] == "underpowered"  # half-width 1.29 > 1, crosses zero


def test_a_resolved_interval_keeps_its_se2_and_its_verdict():
    f = R.floored(_entry(1.0, 0.09, 0.01, 10))
    h = T10 * 0.3
    assert f["interval"] == pytest.approx([1.0, 1.0 - h, 1.0 + h], abs=1e-5)
    assert f["floor_binds"] is False and f["verdict"] == "held"


def test_underpowered_names_the_seeds_one_point_would_take():
    # per-seed variance 4 + 1 = 5: the smallest m with t(m-1) * sqrt(5/m) <= 1
    # (m=22: 2.0796 * 0.4767 = 0.9914; m=21: 2.0860 * 0.4880 = 1.0179)
    f = R.floored(_entry(0.2, 0.5, 0.1, 2, per_seed={"training": 4.0, "evaluation": 1.0}))
    assert f["verdict"] == "underpowered (22 seeds for ±1)"


def test_equivalence_and_nats_claims_keep_their_own_rule():
    eq = R.floored(_entry(0.3, 0.01, 0.04, 10, margin=2.0))  # floored half-width 2.228*0.2 = 0.446 inside ±2
    assert eq["verdict"] == "held"
    wide = R.floored(_entry(0.3, 0.01, 1.0, 10, margin=2.0))  # floored: 0.3 ± 2.228 leaves the margin: inconclusive
    assert wide["verdict"] == "inconclusive"
    nats = R.floored(_entry(-3.0, 0.25, 0.01, 10, unit="nats"))  # -3 ± 1.11: below zero, no power rule
    assert nats["verdict"] == "did not hold"


def test_entries_without_a_decomposition_are_skipped_and_paths_are_named():
    claims = {"claims": [{"key": "c1", "per_model": {"a": _entry(0.5, 0.04, 0.09, 2),
                                                   "b": {"interval": [0, -1, 1]}}}]}
    rows = R.rejudge_stored(claims)
    assert [r["comparison"] for r in rows] == ["[c1].per_model.a"]
    assert rows[0]["floor_binds"] and rows[0]["stored_verdict"] == "stored"


def test_main_writes_both_files_from_a_study_folder(tmp_path, capsys):
    (tmp_path / "claims.json").write_text(json.dumps({"claims": [{"key": "c1", "x": _entry(0.5, 0.04, 0.09, 2)}]}))
    R.main([str(tmp_path)])
    got = json.loads((tmp_path / "rejudge.json").read_text())
    assert got["designs"] == [] and got["stored"][0]["verdict"] == "underpowered"
    md = (tmp_path / "rejudge.md").read_text()
    assert "[c1].x" in md and "+0.50 [-0.79, +1.79]" in md
    assert "rejudge.md" in capsys.readouterr().out
