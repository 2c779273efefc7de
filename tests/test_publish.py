"""Published results and the CI workflows: `publish copy` takes a study's report with its provenance, the README
block is rendered from the published files (and the suite checks the tree's README against results/tiny/),
`publish compare` flags changed verdicts, and both workflow files are valid YAML calling commands that exist."""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml
from conftest import ROOT

from graft_cli.report import publish as PB

CLAIMS_BODY = "### Claims\n\n| # | claim | verdict |\n|---|---|---|\n| 1 | GRAFT > GRPO | held |"
FIGURE = "![family curves a](family_a.png)"


def fake_study(root, verdict="held"):
    rep = os.path.join(root, "report")
    os.makedirs(os.path.join(rep, "plots"))
    from graft_cli.report.claims import BEGIN, END

    open(os.path.join(rep, "report.md"), "w").write(f"# graft report\n\n{BEGIN}\n## Claims on this pair\n\n"
                                                    f"{CLAIMS_BODY}\n\n{FIGURE}\n{END}\n\n## Runs\n")
    open(os.path.join(rep, "family_a.png"), "wb").write(b"\x89PNG")
    open(os.path.join(rep, "tables.tex"), "w").write("\\begin{tabular}\\end{tabular}\n")
    json.dump({"claims": [{"key": "graft_beats_grpo", "verdict": verdict}, {"key": "gate", "verdict": "held"}]},
              open(os.path.join(rep, "claims.json"), "w"))
    open(os.path.join(rep, "plots", "reward.png"), "wb").write(b"\x89PNG")
    open(os.path.join(root, "plan_tiny.md"), "w").write("| run |\n")
    return root


def test_copy_writes_the_report_and_its_provenance(tmp_path):
    out = fake_study(str(tmp_path / "study"))
    dest = str(tmp_path / "results" / "tiny")
    prov = PB.copy(out, dest, "make publish", 12.5)
    assert sorted(os.listdir(dest)) == ["PROVENANCE.json", "claims.json", "family_a.png", "plan_tiny.md", "plots",
                                        "report.md", "tables.tex"]
    got = json.load(open(os.path.join(dest, "PROVENANCE.json")))
    assert got == prov and got["command"] == "make publish" and got["wall_min"] == 12.5
    assert got["machine"]["cpus"] == os.cpu_count() and "torch" in got["machine"]
    with pytest.raises(SystemExit, match="no report.md"):
        PB.copy(str(tmp_path / "empty"), dest, "x")


def test_readme_block_is_rendered_from_the_published_files(tmp_path):
    dest = str(tmp_path / "results" / "tiny")
    PB.copy(fake_study(str(tmp_path / "study")), dest, "make publish", 3.0)
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n<!-- published: {dest} -->\nstale\n<!-- /published -->\n\nrest\n")
    assert not PB.update_readme(str(readme), dest, check=True)
    PB.update_readme(str(readme), dest)
    text = readme.read_text()
    assert PB.update_readme(str(readme), dest, check=True)
    assert CLAIMS_BODY in text and "3.0 min" in text and "`make publish`" in text and text.endswith("\nrest\n")
    assert "## Claims on this pair" not in text  # the README gives its own heading
    assert "![family curves a](results/tiny/family_a.png)" in text  # figures linked from the README's folder
    assert "Published in [`" + dest + "/`](results/tiny/report.md)" in text
    # the same block on a page under docs/ links one folder up
    page = tmp_path / "docs" / "studies.md"
    page.parent.mkdir()
    page.write_text(f"<!-- published: {dest} -->\n<!-- /published -->\n")
    PB.update_readme(str(page), dest)
    assert "![family curves a](../results/tiny/family_a.png)" in page.read_text()
    assert PB.find_page(dest, str(tmp_path)) == str(tmp_path / "README.md")


def test_relink_images_table():
    for md, want in (("![a](x.png)", "![a](R/x.png)"), ("![b](plots/y.png)", "![b](R/plots/y.png)"),
                     ("![c](https://h/z.png)", "![c](https://h/z.png)"), ("![d](/abs/z.png)", "![d](/abs/z.png)"),
                     ("[link](x.png)", "[link](x.png)"), ("![e](doc.md)", "![e](doc.md)")):
        assert PB.relink_images(md, "R") == want, md


def test_compare_lists_changed_verdicts(tmp_path):
    a = fake_study(str(tmp_path / "a"))
    b = fake_study(str(tmp_path / "b"), verdict="did not hold")
    ca, cb = (os.path.join(x, "report", "claims.json") for x in (a, b))
    assert PB.changed_verdicts(ca, ca) == [] and PB.main(["compare", ca, ca]) == 0
    assert PB.changed_verdicts(ca, cb) == ["graft_beats_grpo: held -> did not hold"]
    assert PB.main(["compare", ca, cb]) == 1


@pytest.mark.parametrize("dest", ["results/tiny", "results/tiny3", "results/tiny_saf", "results/tiny_tandem",
                                  "results/tiny_staleness"])
def test_the_readme_quotes_the_published_miniature(dest):
    """Each published miniature is in the tree and the block of the page quoting it (docs/studies.md,
    docs/methods.md) is exactly what its files render."""
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        assert os.path.exists(os.path.join(dest, "PROVENANCE.json")), f"{dest}/ is not published (make publish)"
        assert PB.update_readme(PB.find_page(dest), dest, check=True), "block differs (publish readme)"
    finally:
        os.chdir(cwd)


def _make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*):", open(os.path.join(ROOT, "Makefile")).read(), re.M))


@pytest.mark.parametrize("name,trigger", [("ci.yml", "push"), ("reproduce.yml", "schedule")])
def test_workflows_are_valid_and_call_what_exists(name, trigger):
    wf = yaml.safe_load(open(os.path.join(ROOT, ".github", "workflows", name)))
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads the key `on` as True
    assert trigger in on
    runs = [s["run"] for job in wf["jobs"].values() for s in job["steps"] if "run" in s]
    assert runs
    for cmd in runs:
        if cmd.startswith("make "):
            assert cmd.split()[1] in _make_targets(), cmd
        else:
            assert cmd == "bash .ci/run" and "make test" in open(os.path.join(ROOT, ".ci", "run")).read()
    uses = [s["uses"] for job in wf["jobs"].values() for s in job["steps"] if "uses" in s]
    assert any(u.startswith("actions/setup-python") for u in uses)


def test_copy_lists_stages_reused_runs_and_keeps_the_registration(tmp_path):
    out = fake_study(str(tmp_path / "study"))
    run = lambda name, commit: {"run": name, "train_time_s": 10.0, "trained": "skipped (finished)",
                                "provenance": {"commit": commit, "dirty": False, "started": "t", "sessions": 1,
                                               "config_hash": "c" + name, "tiny_build_hash": "h"}}
    stages = [{"finished": "1", "wall_s": 600.0, "commit": "old", "trained": 2},
              {"finished": "2", "wall_s": 300.0, "commit": "new", "trained": 1},
              {"finished": "3", "wall_s": 60.0, "commit": "newer", "trained": 0}]
    json.dump({"executions": stages, "runs": [run("r1", "old"), run("r2", "old"), run("r3", "new")]},
              open(os.path.join(out, "plan_tiny.json"), "w"))
    dest = str(tmp_path / "results" / "tiny_x")
    prov = PB.copy(out, dest, "make publish-x", 1.0)
    # 16 min over the three stages; the last stage that trained ran at "new": r1 and r2 were reused from "old"
    assert prov["wall_min_total"] == 16.0 and prov["reused"] == ["r1", "r2"]
    assert prov["run_commits"] == {"new": 1, "old": 2}
    assert [r["config_hash"] for r in prov["runs"]] == ["cr1", "cr2", "cr3"]
    # a registered study is published only with its registration
    os.makedirs(dest, exist_ok=True)
    json.dump({"plan_hash": "abc", "design": {}}, open(os.path.join(dest, "registration.json"), "w"))
    with pytest.raises(SystemExit, match="registration.json: the study was registered"):
        PB.copy(out, dest, "make publish-x", 1.0)
    assert os.path.exists(os.path.join(dest, "registration.json"))  # untouched
    json.dump({"plan_hash": "abc", "design": {}}, open(os.path.join(out, "registration.json"), "w"))
    PB.copy(out, dest, "make publish-x", 1.0)
    assert json.load(open(os.path.join(dest, "registration.json")))["plan_hash"] == "abc"
