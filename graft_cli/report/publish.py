"""Published results: the measured output of a miniature study, kept in the repository
(``results/<name>/``), and the README block that quotes it, so the two cannot drift apart.

    python -m graft_cli.report.publish copy OUT [--dest results/tiny] [--command CMD] [--wall-min M]
    python -m graft_cli.report.publish readme [--dest results/tiny] [--readme PAGE] [--check]
    python -m graft_cli.report.publish compare PUBLISHED_CLAIMS NEW_CLAIMS

``copy`` takes a finished `graft reproduce --out OUT` folder: ``report.md``, ``tables.tex``,
``claims.json``, ``plots/*.png`` and the report's own ``*.png`` (the mechanism plots), the plan's
results table, the study's ``registration.json`` (a study registered in DEST is published only with
that registration), plus ``PROVENANCE.json`` (the command, the commit and whether the tree was
clean, the machine, the date, the wall time; each execution stage with its commit and wall time,
their total, every run's commit and config and tiny build hashes, and the runs reused from an
earlier stage). ``readme`` rewrites the block between ``<!-- published: DEST -->`` and ``<!--
/published -->`` of the page that holds it (README.md or a docs/ page; links relative to the page)
from those files (``--check``: exit 1 when it differs: the test suite runs this). ``compare`` lists
the claims whose verdict changed (exit 1 if any): the weekly reproduction workflow fails on a
changed verdict. ``make publish`` runs the study and the first two. """

from __future__ import annotations

import argparse
import glob
import os
import platform
import re
import shutil
import subprocess
import sys
import time

import torch

from graft_cli.report.claims import BEGIN, END
from graft_cli.rundir import REGISTRATION, atomic_write_json, atomic_write_text, read_json

FILES = ("report.md", "tables.tex", "claims.json")


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def machine() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "cuda": torch.cuda.is_available()}


def machine_free(text: str, root: str | None = None) -> str:
    """``text`` with the checkout's folder (``root``, default the working directory) written as a
    path relative to it, and the home folder as ``~``: a published file names no machine's
    folders."""
    root = os.path.abspath(root or ".")
    return text.replace(root + os.sep, "").replace(os.path.expanduser("~") + os.sep, "~" + os.sep)


def copy(out: str, dest: str, command: str, wall_min: float | None = None) -> dict:
    """Copy a finished study's report into ``dest`` (replacing it) with its provenance; returns the
    provenance."""
    rep = os.path.join(out, "report")
    missing = [f for f in FILES if not os.path.exists(os.path.join(rep, f))]
    if missing:
        raise SystemExit(f"{rep}: no {', '.join(missing)} (run `graft reproduce --out {out}` first)")
    tmp = f"{dest}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, "plots"))
    for f in FILES:
        shutil.copy2(os.path.join(rep, f), os.path.join(tmp, f))
    for png in glob.glob(os.path.join(rep, "plots", "*.png")):
        shutil.copy2(png, os.path.join(tmp, "plots", os.path.basename(png)))
    for png in glob.glob(os.path.join(rep, "*.png")):  # the mechanism plots the claims section links to
        shutil.copy2(png, os.path.join(tmp, os.path.basename(png)))
    for f in glob.glob(os.path.join(out, "plan_*.md")) + glob.glob(os.path.join(out, "plan_*.json")):
        with open(f, encoding="utf-8") as fh:
            text = fh.read()
        atomic_write_text(os.path.join(tmp, os.path.basename(f)), machine_free(text))
    kept = os.path.join(dest, REGISTRATION)
    if os.path.exists(os.path.join(out, REGISTRATION)):
        shutil.copy2(os.path.join(out, REGISTRATION), os.path.join(tmp, REGISTRATION))
    if os.path.exists(kept) and (not os.path.exists(os.path.join(tmp, REGISTRATION))
                                 or read_json(kept) != read_json(os.path.join(tmp, REGISTRATION))):
        shutil.rmtree(tmp, ignore_errors=True)
        raise SystemExit(f"{kept}: the study was registered, and {out} holds no such registration: run it with "
                         f"--registration {kept}")
    prov = {"command": command, "commit": _git("rev-parse", "HEAD"), "clean_tree": _git("status", "--porcelain") == "",
            "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "wall_min": wall_min,
            **run_provenance(out)}
    atomic_write_json(os.path.join(tmp, "PROVENANCE.json"), prov)
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(tmp, dest)
    return prov


def run_provenance(out: str) -> dict:
    """What the study's runs were made with, from its plan results (``plan_<name>.json``): each
    execution stage (commit, wall time, runs it trained), the total wall time over the stages, each
    run's first session (commit, config and tiny build hashes) and the runs reused from an earlier
    stage (made at another commit than the last stage that trained runs)."""
    plans = sorted(glob.glob(os.path.join(out, "plan_*.json")))
    if not plans:
        return {}
    res = read_json(plans[0])
    stages = list(res.get("executions") or [])
    runs = []
    for r in res.get("runs") or []:
        p = r.get("provenance") or {}
        runs.append({"run": r.get("run"), "commit": p.get("commit"), "dirty": p.get("dirty"),
                     "started": p.get("started"), "sessions": p.get("sessions"), "config_hash": p.get("config_hash"),
                     "tiny_build_hash": p.get("tiny_build_hash"), "train_s": r.get("train_time_s")})
    training = [st for st in stages if st.get("trained")]
    last = training[-1].get("commit") if training else None
    reused = [r["run"] for r in runs if last and r["commit"] != last]
    return {"stages": stages, "wall_min_total": round(sum(float(st.get("wall_s") or 0) for st in stages) / 60, 1),
            "runs": runs, "reused": reused,
            "run_commits": {c: sum(str(r["commit"]) == c for r in runs)
                            for c in sorted({str(r["commit"]) for r in runs})}}


def claims_section(dest: str) -> str:
    """The claims section of the published report.md (between graft's claims markers)."""

    text = open(os.path.join(dest, "report.md"), encoding="utf-8").read()
    if BEGIN not in text or END not in text:
        return ""
    body = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    lines = body.splitlines()
    if lines and lines[0].startswith("## "):  # the README gives its own heading
        lines = lines[1:]
    return "\n".join(lines).strip()


def relink_images(md: str, dest: str) -> str:
    """Image links of the report (relative to its folder) made relative to the page that quotes it:
    ``](x.png)`` -> ``](DEST/x.png)`` with ``dest`` given relative to that page; absolute and
    external links are left alone."""

    return re.sub(r"(!\[[^\]]*\]\()(?![a-z]+://|/)([^)]+\.png\))", lambda m: f"{m.group(1)}{dest}/{m.group(2)}", md)


def readme_block(dest: str, page: str = "README.md") -> str:
    """The block quoting ``dest`` in ``page`` (links made relative to the page's folder)."""
    prov = read_json(os.path.join(dest, "PROVENANCE.json"))
    m = prov.get("machine") or {}
    rel = os.path.relpath(dest, os.path.dirname(os.path.abspath(page))).replace(os.sep, "/")
    wall = f", {prov['wall_min']:.1f} min" if prov.get("wall_min") is not None else ""
    if prov.get("runs"):
        stages = f"{prov['wall_min_total']:.1f} min over {len(prov.get('stages') or [])} recorded stage(s); " if \
            prov.get("wall_min_total") else ""
        wall += (f" ({stages}{len(prov.get('reused') or [])} of {len(prov.get('runs') or [])} runs reused from an "
                 "earlier stage)")
    head = (f"Published in [`{dest}/`]({rel}/report.md) by `{prov.get('command')}` on {prov.get('date')}, commit "
            f"`{(prov.get('commit') or '?')[:10]}`{'' if prov.get('clean_tree') else ' (uncommitted changes)'}, "
            f"{m.get('cpus')} CPUs, torch {m.get('torch')}{wall}:")
    return f"{head}\n\n{relink_images(claims_section(dest), rel)}"


def find_page(dest: str, root: str = ".") -> str:
    """The page (README.md or docs/*.md under ``root``) that holds the block of ``dest``."""
    begin = f"<!-- published: {dest} -->"
    pages = [os.path.join(root, "README.md"), *sorted(glob.glob(os.path.join(root, "docs", "*.md")))]
    for page in pages:
        if os.path.exists(page) and begin in open(page, encoding="utf-8").read():
            return page
    raise SystemExit(f"no page holds a block {begin} (README.md, docs/*.md)")


def update_readme(readme: str, dest: str, check: bool = False) -> bool:
    """Rewrite (or, with ``check``, compare) the README's block for ``dest``; True when it is up to
    date."""
    begin, end = f"<!-- published: {dest} -->", "<!-- /published -->"
    text = open(readme, encoding="utf-8").read()
    if begin not in text or end not in text.split(begin, 1)[1]:
        raise SystemExit(f"{readme}: no block {begin} ... {end}")
    head, rest = text.split(begin, 1)
    old, tail = rest.split(end, 1)
    new = f"\n{readme_block(dest, readme)}\n"
    if check:
        return old == new
    with open(readme, "w", encoding="utf-8") as f:
        f.write(head + begin + new + end + tail)
    return True


def verdicts(claims_json: str) -> dict[str, str]:
    return {c["key"]: c["verdict"] for c in read_json(claims_json).get("claims", [])}


def changed_verdicts(published: str, new: str) -> list[str]:
    a, b = verdicts(published), verdicts(new)
    return [f"{k}: {a.get(k, 'absent')} -> {b.get(k, 'absent')}" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m graft_cli.report.publish", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("copy")
    c.add_argument("out")
    c.add_argument("--dest", default="results/tiny")
    c.add_argument("--command", default="make publish")
    c.add_argument("--wall-min", type=float, default=None)
    r = sub.add_parser("readme")
    r.add_argument("--dest", default="results/tiny")
    r.add_argument("--readme", default=None, help="the page holding the block (default: README.md or the docs/ "
                   "page that has it)")
    r.add_argument("--check", action="store_true")
    k = sub.add_parser("compare")
    k.add_argument("published")
    k.add_argument("new")
    a = ap.parse_args(argv)
    if a.cmd == "copy":
        prov = copy(a.out, a.dest, a.command, a.wall_min)
        print(f"published {a.out}/report into {a.dest}/ (commit {prov['commit'][:10]})")
        return 0
    if a.cmd == "readme":
        a.readme = a.readme or find_page(a.dest)
        ok = update_readme(a.readme, a.dest, a.check)
        if a.check and not ok:
            print(f"{a.readme}: the block of {a.dest} differs from the published files "
                  f"(python -m graft_cli.report.publish readme --dest {a.dest})")
            return 1
        if not a.check:
            print(f"{a.readme}: block of {a.dest} rewritten")
        return 0
    changes = changed_verdicts(a.published, a.new)
    for line in changes:
        print(f"verdict changed: {line}")
    print("verdicts unchanged" if not changes else f"{len(changes)} verdict(s) changed")
    return 1 if changes else 0


if __name__ == "__main__":
    sys.exit(main())
