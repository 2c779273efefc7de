"""`--launcher slurm` (graft_cli/plan/slurm.py) and the launcher choice (graft_cli/plan/launch.py).

Fast: the job scripts (the train line, the multi-node template's torchrun line, the eval options, #SBATCH lines
from resources, options and the plan's `slurm:` section), GRES parsing, time limits, and the bad inputs that stop
before anything is written (unknown launcher, sbatch missing, an unknown `slurm:` key).

Slow, against a real one-node Slurm on this host (tests/slurm/start_local_slurm.sh: munged, MariaDB + slurmdbd,
slurmctld, slurmd; skipped with the script's reason where it cannot start): the tiny plan tests/slurm/tiny_slurm.yaml
end to end (GRPO through the template's srun + torchrun line as one node of one task, then stored-trajectory GRAFT
after it, evaluations after training, the report last; dependencies read back from sacct), a training job cancelled
mid-run and resumed from its checkpoint by the next submission, `--status` against tables of expected states,
a resubmission that duplicates nothing, `--cancel`, a failed partner whose dependants Slurm cancels, and a plan
asking for more GPUs than sinfo reports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest
import yaml
from click.testing import CliRunner

from graft_cli.cli import main
from graft_cli.errors import GraftError
from graft_cli.plan import slurm as SL
from graft_cli.plan import spec as P
from graft_cli.plan.launch import LaunchOptions
from graft_cli.plan.launchers import get_launcher

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_PLAN = os.path.join(ROOT, "tests", "slurm", "tiny_slurm.yaml")
START = os.path.join(ROOT, "tests", "slurm", "start_local_slurm.sh")


def _invoke(*args: str):
    return CliRunner().invoke(main, list(args))


# ------------------------------------------------------------------------------------------------- fast
def test_gres_and_time_limits():
    assert SL.gres_gpus("gpu:h200:8(S:0-1),shard:4") == 8
    assert SL.gres_gpus("gpu:4,gpu:a100:2") == 6 and SL.gres_gpus("(null)") == 0
    # 1.5 x hours, at least 10 minutes: 20.8 h -> 1872 min = 1 day 07:12; 0.05 h -> 10 min
    assert SL.slurm_time(20.8) == "1-07:12:00" and SL.slurm_time(0.05) == "0-00:10:00"
    assert SL.slurm_time(None) is None


def test_job_scripts_hold_the_runs_commands(tmp_path):
    plan = P.load_reproduce("graft_table1")
    s = SL.merged_settings(plan, LaunchOptions(partition="gpu", account="lab", sbatch=["--constraint=h200"]))
    assert s["overrides"] == ["scale=4xh200"] and s["job_prefix"] == "graft-graft_table1-"
    r = plan.by_key()["2:graft-s1"]
    res = plan.resources_for(r)
    cmd = SL.train_command(plan, r, str(tmp_path), s)
    assert cmd[:11] == ["train", "--pair", "2", "--method", "graft", "--out", str(tmp_path), "--seed", "1", "--name",
                        "2-graft-s1"]
    assert cmd[-2:] == ["run.save_on_signal=true", "scale=4xh200"] and "--steps" in cmd
    header = SL.sbatch_lines(s, "x-train", res, res.gpus, SL.slurm_time(res.hours), str(tmp_path))
    for line in ("--job-name=x-train", "--nodes=1", "--gpus-per-node=4", "--cpus-per-task=32", "--time=1-07:12:00",
                 "--partition=gpu", "--account=lab", "--signal=TERM@120", "--requeue", "--constraint=h200"):
        assert f"#SBATCH {line}" in header
    text = SL.job_script(header, "c", s, cmd, res.uses_torchrun(), res.gpus, res.cpus)
    # 4 GPUs: the template's torchrun line with graft train's arguments in "$@"
    assert "python -m torch.distributed.run" in text and '-m graft_cli.cli train "$@"' in text
    assert "export GPUS_PER_NODE=4" in text and "set -- --pair 2 --method graft" in text
    one = P.Resources(gpus=1, cpus=8)
    text1 = SL.job_script(SL.sbatch_lines(s, "y", one, 1, None, str(tmp_path)), "c", s, cmd, one.uses_torchrun(), 1, 8)
    assert "srun --kill-on-bad-exit=1 python -m graft_cli.cli train --pair 2" in text1
    assert "torch.distributed.run" not in text1
    ev = SL.eval_command(plan, r, str(tmp_path))
    assert ev[:3] == ["eval", "--run", os.path.join(str(tmp_path), "2-graft-s1")]
    assert ev[ev.index("--steps") + 1] == "best" and ev[ev.index("--runs") + 1] == "5"
    assert ev[ev.index("--samples") + 1] == "8"
    with pytest.raises(GraftError, match="launches graft train only"):
        SL.job_script(header, "c", s, ev, True, 4, 32)


def test_bad_launcher_inputs_are_one_line_and_write_nothing(tmp_path, monkeypatch):
    res = _invoke("reproduce", "--pair", "tiny", "--launcher", "pbs", "--out", str(tmp_path / "o"))
    assert res.exit_code == 2 and res.output.strip() == "error: --launcher 'pbs': unknown; known: local, slurm"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no sbatch anywhere
    res = _invoke("ablate", "--sweep", "gate", "--launcher", "slurm", "--out", str(tmp_path / "o"))
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1
    assert "sbatch not found on PATH" in res.output and "nothing submitted" in res.output
    assert not (tmp_path / "o").exists()
    plan = P.build_plan({"slurm": {"partitoin": "gpu"}, "runs": [{"name": "a", "method": "grpo"}]}, source="p.yaml")
    with pytest.raises(GraftError, match="p.yaml: slurm: unknown key 'partitoin'"):
        SL.merged_settings(plan, LaunchOptions())
    with pytest.raises(GraftError, match="--cancel: the local launcher"):
        get_launcher("local", LaunchOptions()).cancel(plan, str(tmp_path))


def test_local_status_reads_the_run_directories(tmp_path):
    from test_plan import fake_run

    fake_run(str(tmp_path), "tiny-graft-s0", [10, 20], 20)
    fake_run(str(tmp_path), "tiny-graft_nogate-s0", [10], 20)
    res = _invoke("ablate", "--sweep", "gate", "--out", str(tmp_path), "--steps", "20", "--status")
    assert res.exit_code == 0, res.output
    rows = [[c.strip() for c in ln.split("|")[1:-1]] for ln in res.output.splitlines()[2:]]
    assert rows == [["tiny-graft-s0", "finished", "—", "20/20", "not started", "—"],
                    ["tiny-graft_nogate-s0", "partial 10/20", "—", "10/20", "not started", "—"]]


# ------------------------------------------------------------------------------------ a real local Slurm
@pytest.fixture(scope="module")
def local_slurm():
    if not os.path.exists("/usr/bin/apt-get") and shutil.which("slurmctld") is None:
        pytest.skip("no Slurm and no apt-get to install it")
    argv = ["bash", START] + (["--install"] if os.environ.get("GRAFT_SLURM_INSTALL") == "1" else [])
    p = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        why = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"
        pytest.skip(f"local Slurm cannot start: {why}")
    conf = p.stdout.strip().splitlines()[-1].split("=", 1)[1]
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    yield conf
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old


# A deadlock guard only: the waits below end on the jobs' own states, however slowly a loaded machine runs them.
GUARD_S = 3 * 3600


def _wait(cond, what: str, gone=None):
    """Poll ``cond`` (every 0.5 s) until it returns something truthy. ``gone`` says (a string) when what is awaited
    can no longer come, e.g. the job that would write it has ended: the wait then fails at once, naming it.
    ``GUARD_S`` stops a wait on a hung cluster."""
    end = time.monotonic() + GUARD_S
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        why = gone() if gone is not None else None
        if why:
            got = cond()  # what ended may have written it just before
            if got:
                return got
            raise AssertionError(f"{what} will not come: {why}")
        time.sleep(0.5)
    raise AssertionError(f"no {what} after {GUARD_S} s: is the local Slurm hung?")


def _ended_as(job: str) -> str | None:
    """``job``'s final state once it has ended (None while it is queued or running, or not known yet)."""
    j = SL.job_states([job])[job]
    return None if j.active or j.state == "UNKNOWN" else f"job {job} ended {j.state}"


@pytest.fixture
def cancel_leftovers(tmp_path):
    """After the test, cancel every job a ledger under ``tmp_path`` names: a failed test leaves no job holding the
    node for the next one."""
    yield
    for path in tmp_path.rglob("slurm/jobs.json"):
        ledger = SL.Ledger(str(path.parent))
        ids = [j for r in ledger.runs.values() for js in r.values() for j in js]
        ids += [j for js in ledger.reports.values() for j in js]
        SL.cancel_jobs([j.id for j in SL.job_states(ids).values() if j.active])


def _sacct(ids: list[str]) -> dict[str, dict]:
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", ",".join(ids),
                          "--format=JobID,JobName%60,State,Submit,Eligible,Start,End,Reason,SubmitLine"],
                         capture_output=True, text=True, check=True).stdout
    keys = ("id", "name", "state", "submit", "eligible", "start", "end", "reason", "line")
    return {r[0]: dict(zip(keys, r)) for r in (ln.split("|", 8) for ln in out.splitlines()) if r[0] in ids}


def _ended(ids: list[str]) -> bool:
    rows = _sacct(ids)
    return len(rows) == len(ids) and all(r["state"].split()[0] not in SL.QUEUED | SL.RUNNING for r in rows.values())


def _ledger(out: str) -> dict:
    with open(os.path.join(out, "slurm", "jobs.json")) as f:
        return json.load(f)


def _status(out: str, plan: str = TINY_PLAN) -> dict[str, list[str]]:
    res = _invoke("reproduce", "--pair", plan, "--launcher", "slurm", "--out", out, "--status")
    assert res.exit_code == 0, res.output
    rows = [[c.strip() for c in ln.split("|")[1:-1]] for ln in res.output.splitlines()[2:] if ln.startswith("|")]
    return {r[0]: r[1:] for r in rows}


def _submit(out: str, plan: str = TINY_PLAN, *more: str):
    res = _invoke("reproduce", "--pair", plan, "--launcher", "slurm", "--out", out, "--no-progress", *more)
    assert res.exit_code == 0, res.output
    return res


def _timeline(ids: list[str]) -> None:
    """Print the jobs as sacct holds them (pytest -s shows the timeline docs/cluster.md quotes)."""
    rows = _sacct(ids)
    for i in ids:
        r = rows[i]
        print(" | ".join([r["id"], r["name"], r["state"], r["eligible"], r["start"], r["end"], r["reason"],
                          r["line"].split(" /")[0]]))


@pytest.mark.slow
def test_tiny_plan_end_to_end_on_slurm(local_slurm, tmp_path, cancel_leftovers):
    out = str(tmp_path / "plan")
    G, S = "tiny-grpo-s0", "tiny-graft_stored-a-s0"
    _submit(out)
    led = _ledger(out)
    t1, e1 = led["runs"][G]["train"][0], led["runs"][G]["eval"][0]
    t2, e2 = led["runs"][S]["train"][0], led["runs"][S]["eval"][0]
    r1 = led["reports"]["tiny_slurm"][0]
    # the receiver cannot start before its partner's training ends: it is queued on its dependency
    st = _status(out)
    assert st[G][0] in ("queued", "running") and st[G][1] == t1
    assert st[S][:2] == ["queued (Dependency)", t2] and st[S][3:] == ["queued (Dependency)", e2]
    # submitting again while everything is queued or running duplicates nothing
    res = _submit(out)
    assert "0 job(s) submitted, 5 still queued or running" in " ".join(res.output.split())
    assert _ledger(out) == led
    # cancel the receiver's training once it has a checkpoint and before it ends
    ckpt = os.path.join(out, S, "checkpoints")
    _wait(lambda: os.path.exists(os.path.join(ckpt, "step_000001", "COMPLETE")), "the receiver's 1st checkpoint",
          gone=lambda: _ended_as(t2))
    subprocess.run(["scancel", t2], check=True)
    _wait(lambda: _ended([t2, e2]), "the end of the cancelled training job and its evaluation")
    st = _status(out)
    step_at_cancel = int(st[S][2].split("/")[0])
    assert 1 <= step_at_cancel < 8
    assert st[G][:3] == ["finished", t1, "8/8"]
    assert st[S] == ["failed (CANCELLED)", t2, f"{step_at_cancel}/8", "cancelled (training failed)", e2]
    # the rerun resubmits the receiver only (no dependency: its partner is finished), its evaluation and the report
    _submit(out)
    led2 = _ledger(out)
    t3, e3 = led2["runs"][S]["train"][-1], led2["runs"][S]["eval"][-1]
    r2 = led2["reports"]["tiny_slurm"][-1]
    assert led2["runs"][G] == led["runs"][G] and led2["runs"][S]["train"] == [t2, t3]
    assert led2["runs"][S]["eval"] == [e2, e3] and r2 != r1
    _wait(lambda: _ended([t1, e1, t3, e3, r2]), "the end of the resubmitted jobs and the report")
    st = _status(out)
    assert st == {G: ["finished", t1, "8/8", "finished", e1], S: ["finished", t3, "8/8", "finished", e3]}
    # resumed from the checkpoint it had when cancelled (the scheduler's SIGTERM: run.save_on_signal may add one)
    with open(os.path.join(out, "slurm", "logs", f"graft-tiny_slurm-{S}-train-{t3}.out")) as f:
        log = f.read()
    resumed = int(log.split("resumed from step ")[1].split()[0])
    assert step_at_cancel <= resumed < 8
    # the partner's training ran through the multi-node template: srun + torchrun, one node of one task
    with open(os.path.join(out, "slurm", f"{G}.train.sbatch")) as f:
        assert "python -m torch.distributed.run" in f.read()
    # sacct: every dependency as submitted, and no job started before what it waited on ended
    acct = _sacct([t1, e1, t2, e2, t3, e3, r1, r2])
    assert f"--dependency=afterok:{t1}" in acct[t2]["line"] and f"--dependency=afterok:{t1}" in acct[e1]["line"]
    assert f"--dependency=afterok:{t2}" in acct[e2]["line"] and f"--dependency=afterok:{t3}" in acct[e3]["line"]
    assert "--dependency" not in acct[t3]["line"] and "--dependency" not in acct[t1]["line"]
    assert f"--dependency=afterany:{e1}:{e2}" in acct[r1]["line"]
    assert acct[t2]["start"] >= acct[t1]["end"] and acct[e3]["start"] >= acct[t3]["end"]
    assert acct[r2]["start"] >= max(acct[e1]["end"], acct[e3]["end"])
    assert acct[t2]["state"].startswith("CANCELLED") and acct[e2]["state"].startswith("CANCELLED")
    assert acct[t3]["state"] == "COMPLETED" and acct[r2]["state"] == "COMPLETED"
    # the report job wrote the results and the report from the run directories
    with open(os.path.join(out, "plan_tiny_slurm.json")) as f:
        results = json.load(f)
    assert [r["status"] for r in results["runs"]] == ["finished 8/8", "finished 8/8"]
    assert all(r["scores"] for r in results["runs"]) and os.path.exists(os.path.join(out, "report", "report.md"))
    # nothing left: a further submission submits nothing
    res = _submit(out)
    assert "nothing to submit" in res.output and _ledger(out) == led2
    _timeline([t1, e1, t2, e2, r1, t3, e3, r2])


@pytest.mark.slow
def test_cancel_failed_partner_and_partition_fit(local_slurm, tmp_path, cancel_leftovers):
    with open(TINY_PLAN) as f:
        raw = yaml.safe_load(f)
    # --cancel: held jobs (they never start) are all cancelled; --status says so
    held = str(tmp_path / "held")
    _submit(held, TINY_PLAN, "--sbatch=--hold")
    ids = [j for r in _ledger(held)["runs"].values() for k in ("train", "eval") for j in r[k]]
    res = _invoke("reproduce", "--pair", TINY_PLAN, "--launcher", "slurm", "--out", held, "--cancel")
    assert res.exit_code == 0 and "cancelled" in res.output
    _wait(lambda: _ended(ids), "the end of the cancelled jobs")
    st = _status(held)
    assert st["tiny-grpo-s0"][0] == "failed (CANCELLED)"
    assert st["tiny-graft_stored-a-s0"][0] in ("failed (CANCELLED)", "cancelled (partner tiny-grpo-s0 failed)")
    # a partner that fails (its data file does not exist: the config composes, the run cannot start): Slurm
    # cancels the receiver waiting on it, and --status names the partner
    raw["runs"][0]["overrides"] = ["data.train=/nonexistent/train.jsonl"]
    raw["runs"][0]["resources"] = {}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    failing = str(tmp_path / "failing")
    _submit(failing, str(bad))
    led = _ledger(failing)
    t1, t2 = led["runs"]["tiny-grpo-s0"]["train"][0], led["runs"]["tiny-graft_stored-a-s0"]["train"][0]
    _wait(lambda: _ended([t1, t2]), "the end of the failing partner and its dependant")
    st = _status(failing, str(bad))
    assert st["tiny-grpo-s0"][0] == "failed (FAILED)"
    assert st["tiny-graft_stored-a-s0"][0] == "cancelled (partner tiny-grpo-s0 failed)"
    assert st["tiny-graft_stored-a-s0"][3] == "cancelled (partner tiny-grpo-s0 failed)"
    # more GPUs per node than sinfo reports: one line, nothing submitted, nothing written
    raw["runs"][0]["resources"] = {"gpus": 4}
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump(raw))
    res = _invoke("reproduce", "--pair", str(big), "--launcher", "slurm", "--out", str(tmp_path / "big"))
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1
    assert "run tiny-grpo-s0 asks for 4 GPUs per node; partition debug has at most 0 (sinfo)" in res.output
    assert not (tmp_path / "big").exists()
