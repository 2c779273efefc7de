"""benchmarks/isa_ops.py's comparison: given two machines' per-module hashes it names the first module
whose output differs in forward order, the gradients that differ and the first step whose loss differs; the
environment specs parse as the build's workers get them. The tables below are written by hand."""

from __future__ import annotations

import importlib.util
import os

from conftest import ROOT

spec = importlib.util.spec_from_file_location("isa_ops", os.path.join(ROOT, "benchmarks", "isa_ops.py"))
isa_ops = importlib.util.module_from_spec(spec)
spec.loader.exec_module(isa_ops)


def _arch(fwd, grads, losses, final, init="i0"):
    return {"init": init, "fwd": fwd, "grad": grads, "losses": losses, "final": final}


def test_parse_env():
    assert isa_ops.parse_env("plain") == {}
    assert isa_ops.parse_env("ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2,STRICT") == {
        "ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT"}


def test_compare_names_the_first_differing_module(capsys):
    fwd_x = [["embed", "Embedding", ["e1"]], ["rotary", "Rotary", ["r1", "r2"]], ["l0.q", "Linear", ["q1"]],
             ["l0.act", "GELUActivation", ["g1"]], ["l0.out", "Linear", ["o1"]]]
    fwd_y = [["embed", "Embedding", ["e1"]], ["rotary", "Rotary", ["r1", "r2"]], ["l0.q", "Linear", ["q1"]],
             ["l0.act", "GELUActivation", ["g2"]], ["l0.out", "Linear", ["o2"]]]
    x = {"envs": {"pin": {"archs": {
        "a": _arch(fwd_x[:3], {"w1": "h1", "w2": "h2"}, ["0x1p+0", "0x1p-1"], "fa"),
        "c": _arch(fwd_x, {"w1": "h1", "w2": "h2", "w3": "h3"}, ["0x1p+0", "0x1p-1", "0x1p-2"], "fc")}},
        "only_x": {"archs": {}}}}
    y = {"envs": {"pin": {"archs": {
        "a": _arch(fwd_x[:3], {"w1": "h1", "w2": "h2"}, ["0x1p+0", "0x1p-1"], "fa"),
        "c": _arch(fwd_y, {"w1": "h1", "w2": "X", "w3": "Y"}, ["0x1p+0", "0x1p-1", "0x1.1p-2"], "gc")}}}}
    isa_ops.compare(x, y)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "pin | a: identical after 2 steps (fa)"
    assert out[1] == ("pin | c: DIFFER; init same; first loss differing at step 3; first module output differing: "
                      "l0.act (GELUActivation); grads differing 2/3: w2, w3")
    assert out[2] == "only_x: not in both"
