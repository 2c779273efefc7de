"""Evaluations shared between a plan's runs (graft_cli/eval/reuse.py): the key, the copy under a lock, and two runs
whose step-0 checkpoints are the same weights evaluated once."""

from __future__ import annotations

import json
import os
import threading

from conftest import train_overrides

from graft_cli.eval import reuse


def _model(folder, weights=b"w", optimizer=b"o"):
    os.makedirs(folder, exist_ok=True)
    for name, data in (("model.safetensors", weights), ("config.json", b"{}"), ("tokenizer.json", b"{}"),
                       ("optimizer.pt", optimizer)):
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    return folder


def _meta(out_dir, settings):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump({"settings": settings}, f)
    return out_dir


def test_key_follows_weights_settings_and_extra_not_the_optimizer(tmp_path):
    m1 = _model(str(tmp_path / "m1"))
    m2 = _model(str(tmp_path / "m2"), optimizer=b"other state")  # same weights, another optimizer state
    m3 = _model(str(tmp_path / "m3"), weights=b"w2")
    out = _meta(str(tmp_path / "o1"), {"samples": 4})
    out2 = _meta(str(tmp_path / "o2"), {"samples": 8})
    k = reuse.reuse_key(m1, out, {"dtype": "float32"})
    assert reuse.reuse_key(m2, out, {"dtype": "float32"}) == k
    assert reuse.reuse_key(m3, out, {"dtype": "float32"}) != k
    assert reuse.reuse_key(m1, out2, {"dtype": "float32"}) != k
    assert reuse.reuse_key(m1, out, {"dtype": "bfloat16"}) != k


def _write_runs(out_dir, text):
    for name in ("math_run1.jsonl", "aime_run1.jsonl"):
        with open(os.path.join(out_dir, name), "w") as f:
            f.write(text)


def test_shared_stores_then_copies_and_a_second_waits_for_the_first(tmp_path, monkeypatch):
    import fcntl

    store = str(tmp_path / "store")
    first, second = _meta(str(tmp_path / "first"), {}), _meta(str(tmp_path / "second"), {})
    with reuse.shared(None, "k", first) as n:  # no reuse folder: nothing happens
        assert n == 0
    assert not os.path.exists(store)
    order, blocked = [], []
    first_in, second_at_lock, release = threading.Event(), threading.Event(), threading.Event()
    real_flock = fcntl.flock

    def flock(f, op):  # the second evaluation finds the lock taken (a non-blocking try fails), then waits on it
        if threading.current_thread().name == "second":
            try:
                real_flock(f, op | fcntl.LOCK_NB)
                second_at_lock.set()
                return
            except BlockingIOError:
                blocked.append(True)
                second_at_lock.set()
        real_flock(f, op)

    monkeypatch.setattr(fcntl, "flock", flock)

    def evaluate_first():
        with reuse.shared(store, "k", first) as n:
            order.append(("first in", n))
            first_in.set()
            assert release.wait(60)  # the second evaluation is at the lock: only now does this one finish
            _write_runs(first, "x\n")

    def evaluate_second():
        with reuse.shared(store, "k", second) as n:
            order.append(("second in", n))

    t = threading.Thread(target=evaluate_first)
    t.start()
    assert first_in.wait(60)
    t2 = threading.Thread(target=evaluate_second, name="second")
    t2.start()
    assert second_at_lock.wait(60)
    release.set()
    t.join(60)
    t2.join(60)
    # the second found the lock held and entered only after the first had stored its 2 run files
    assert blocked == [True] and order == [("first in", 0), ("second in", 2)]
    assert sorted(os.listdir(os.path.join(store, "k"))) == ["aime_run1.jsonl", "math_run1.jsonl"]
    assert open(os.path.join(second, "math_run1.jsonl")).read() == "x\n"
    # a failed evaluation stores nothing; a folder that has the files keeps its own
    try:
        with reuse.shared(store, "k2", _meta(str(tmp_path / "failing"), {})):
            _write_runs(str(tmp_path / "failing"), "half\n")
            raise RuntimeError("killed")
    except RuntimeError:
        pass
    assert not os.path.exists(os.path.join(store, "k2"))
    _write_runs(second, "own\n")
    with reuse.shared(store, "k", second) as n:
        assert n == 0
    assert open(os.path.join(second, "math_run1.jsonl")).read() == "own\n"


def test_two_runs_from_the_same_weights_evaluate_step_0_once(tiny_models, problems_file, tmp_path, monkeypatch):
    """Two seeds of one method saving their initial weights: step 0 is the same model; the second run's step-0
    evaluation files are the first's (byte for byte) and are not sampled again; step 1 differs and is sampled."""
    from graft_cli.config import compose
    from graft_cli.eval import runner
    from graft_cli.train.run import train

    out = tmp_path / "runs"
    runs = []
    for seed in (0, 1):
        cfg = compose(train_overrides(tiny_models, problems_file, str(out),
                                      ["run.steps=1", f"run.name=s{seed}", f"run.seed={seed}", "run.save_initial=true",
                                       "eval.samples=2", f"eval.benchmarks=[arith={problems_file}]",
                                       "eval.max_new_tokens=6"]))
        runs.append(train(cfg, progress=False))
    made = []
    real = runner.make_engine

    def counting(*a, **k):
        eng = real(*a, **k)
        gen = eng.generate

        def generate(prompts, params):
            made.append(len(prompts))
            return gen(prompts, params)

        eng.generate = generate
        return eng

    monkeypatch.setattr(runner, "make_engine", counting)
    store = str(tmp_path / "store")
    runner.evaluate_run(runner.EvalOptions(run_dir=runs[0], steps="0,1", policies="a", runs=1, workers=1,
                                           progress=False, reuse_dir=store))
    first_calls = len(made)
    assert first_calls >= 2  # step 0 and step 1 sampled
    made.clear()
    runner.evaluate_run(runner.EvalOptions(run_dir=runs[1], steps="0", policies="a", runs=1, workers=1, progress=False,
                                           reuse_dir=store))
    assert made == []  # step 0: copied
    f0 = [os.path.join(r, "eval", "a", "step_000000", "arith_run1.jsonl") for r in runs]
    assert open(f0[0], "rb").read() == open(f0[1], "rb").read()
    summ = json.load(open(os.path.join(runs[1], "eval", "a", "step_000000", "summary.json")))
    assert summ["benchmarks"]["arith"]["num_runs"] == 1
    runner.evaluate_run(runner.EvalOptions(run_dir=runs[1], steps="1", policies="a", runs=1, workers=1, progress=False,
                                           reuse_dir=store))
    assert made  # step 1: other weights, sampled
