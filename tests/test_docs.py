"""The README is the front door and docs/ holds the rest: every relative link of README.md and
docs/*.md resolves to a file of the repository, and every #anchor to a heading of its page (GitHub's slugs)."""

import glob
import os
import re

import pytest
from conftest import ROOT

PAGES = ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: str) -> set[str]:
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # headings inside code blocks are not headings
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def links(page: str) -> list[str]:
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_slug_table():
    for h, want in (("Scale-out", "scale-out"), ("The miniature study: `graft reproduce --pair tiny`",
                                                 "the-miniature-study-graft-reproduce---pair-tiny"),
                    ("Conventions (and where the papers are silent)", "conventions-and-where-the-papers-are-silent"),
                    ("One 4 x H200 node, both policies", "one-4-x-h200-node-both-policies")):
        assert slug(h) == want


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_resolves(page):
    bad = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(os.path.join(ROOT, dest)):
            bad.append(f"{target}: no file {dest}")
        elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest}")
    assert not bad, f"{page}: " + "; ".join(bad)


def test_the_readme_is_a_front_door():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert text.count("\n") <= 250
    for page in ("docs/methods.md", "docs/studies.md", "docs/tiny_pair.md", "docs/conventions.md",
                 "docs/run_directory.md", "docs/scale_out.md", "docs/performance.md"):
        assert f"]({page})" in text, page
