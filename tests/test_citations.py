"""Every citation of the method specification resolves (docs/spec/README.md, "How to cite").

A citation names a specification file, bare (``graft.md``) or as ``docs/spec/graft.md``, optionally followed by
section references: ``§2.2``, ranges ``§2.2–§2.3`` / ``§4-5``, items or steps ``§8 item 3``, ``§8 items 3 and
10``, ``§2.2 step 6``, appendices ``App. H`` and equations ``Eq. 6–8``, separated by ``,``, ``/``, ``;`` or
``and``. The checker reads graft_cli/, tests/, docs/, experiments/, benchmarks/, README.md and CHANGELOG.md and
asserts that the file exists in docs/spec/, that each section number is a heading of it, that each item or step
is a numbered list item or numbered table row of that section, and that each appendix or equation is named in
the file. It also rejects a path into the external reference folder and, outside docs/spec/, a bare name that
is also a page of docs/ (the conventions: docs/conventions.md is graft's page, docs/spec/conventions.md the
frameworks' specification).
"""

from __future__ import annotations

import functools
import os
import re

from conftest import ROOT

SPEC = "docs/spec"
SCANNED = ("graft_cli", "tests", "docs", "experiments", "benchmarks", "README.md", "CHANGELOG.md")
# the specification's files, and the names of the sources it was written from that are not (or not yet) in it:
# a citation of one of those is reported as a missing file, not ignored
SOURCE_NAMES = ("graft", "baselines", "opd_saf", "tandem", "conventions", "environment", "rollout_corr",
                "ecosystem", "frameworks_2026")


def spec_names() -> tuple[str, ...]:
    here = {f[:-3] for f in os.listdir(os.path.join(ROOT, SPEC)) if f.endswith(".md") and f != "README.md"}
    return tuple(sorted(here | set(SOURCE_NAMES), key=len, reverse=True))


_SEC = r"§\s?\d+(?:\.\d+)*"
_RANGE_END = r"\s*[–—-]\s*§?\s?\d+(?:\.\d+)*"
_ITEMS = r"\s+(?:items?|steps?)\s+\d+(?:\s*(?:,|\band\b|[–-])\s*\d+)*"
_APP = r"App\.\s?[A-Z](?:\s*[/–-]\s*[A-Z])*"
_EQ = r"[Ee]q\.\s?\d+(?:\s*[–-]\s*\d+)?"
_REF = rf"(?:{_SEC}(?:{_RANGE_END})?(?:{_ITEMS})?|{_APP}|{_EQ})"
_SEP = r"\s*(?:,|/|;|\band\b)\s*"


@functools.lru_cache(maxsize=None)
def citation_re() -> re.Pattern:
    names = "|".join(re.escape(n) for n in spec_names())
    return re.compile(rf"(?:(?<![\w/.\-])(?P<prefix>(?:docs/)?spec/)|(?<![\w/.\-]))(?P<name>{names})\.md(?![\w\-])"
                      rf"(?P<refs>`?\s+{_REF}(?:{_SEP}{_REF})*)?")


def external_re() -> re.Pattern:
    names = "|".join(re.escape(n) for n in spec_names())
    return re.compile(rf"\breference/(?:{names})\.md")


def _uncomment(text: str) -> str:
    """Comment leaders at line starts (``#``, ``//``) become spaces, so a citation that wraps onto a comment line
    reads as one; lengths and line breaks are kept, so positions and line numbers stay those of ``text``."""
    return re.sub(r"(?m)^([ \t]*)(#+|//)", lambda m: m.group(1) + " " * len(m.group(2)), text)


# ------------------------------------------------------------------------------------------- the spec files
@functools.lru_cache(maxsize=None)
def spec_file(name: str) -> tuple[dict[str, str], str] | None:
    """(numbered heading -> the section's own text up to the next heading, the whole text) of docs/spec/<name>.md,
    None when there is no such file. Headings inside code blocks are not headings."""
    path = os.path.join(ROOT, SPEC, f"{name}.md")
    if not os.path.exists(path):
        return None
    text = open(path, encoding="utf-8").read()
    sections: dict[str, list[str]] = {}
    current, fenced = None, False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            num = re.match(r"(\d+(?:\.\d+)*)\.?(?:\s|$)", m.group(1))
            current = num.group(1) if num else None
            if current is not None:
                sections.setdefault(current, [])
            continue
        if current is not None:
            sections[current].append(line)
    return {k: "\n".join(v) for k, v in sections.items()}, text


def _numbers(spec: str) -> list[int]:
    """'3', '3 and 10', '3, 10', '3–4' -> the numbers named (a range expanded)."""
    out: list[int] = []
    for part in re.split(r"\s*(?:,|\band\b)\s*", spec.strip()):
        ends = [int(x) for x in re.split(r"\s*[–-]\s*", part)]
        out += list(range(ends[0], ends[-1] + 1))
    return out


def _letters(spec: str) -> set[str]:
    """'A/B/G' -> {A, B, G}; 'A–I' -> A..I."""
    out: set[str] = set()
    for part in re.split(r"\s*/\s*", spec.strip()):
        ends = re.split(r"\s*[–-]\s*", part)
        out |= {chr(c) for c in range(ord(ends[0]), ord(ends[-1]) + 1)}
    return out


def _has_item(section_text: str, n: int) -> bool:
    return re.search(rf"(?m)^\s*{n}\.\s|^\|\s*{n}\s*\|", section_text) is not None


def check_ref(ref: str, sections: dict[str, str], text: str) -> str | None:
    """Why ``ref`` does not resolve in the file (``sections``, ``text``), or None."""
    ref = ref.strip()
    m = re.fullmatch(r"App\.\s?(?P<x>.+)", ref)
    if m:
        named = set().union(*(_letters(a) for a in re.findall(r"App\.\s?([A-Z](?:\s*[/–-]\s*[A-Z])*)", text)))
        missing = sorted(_letters(m.group("x")) - named)
        return f"no App. {', '.join(missing)} named" if missing else None
    m = re.fullmatch(r"[Ee]q\.\s?(?P<x>.+)", ref)
    if m:
        named = set().union(*(_numbers(e) for e in re.findall(r"[Ee]q\.\s?(\d+(?:\s*[–-]\s*\d+)?)", text)))
        missing = sorted(set(_numbers(m.group("x"))) - named)
        return f"no Eq. {', '.join(map(str, missing))} named" if missing else None
    m = re.fullmatch(r"§\s?(?P<a>\d+(?:\.\d+)*)(?:\s*[–—-]\s*§?\s?(?P<b>\d+(?:\.\d+)*))?"
                     r"(?:\s+(?:items?|steps?)\s+(?P<items>.+))?", ref, re.S)
    if not m:
        return f"unreadable reference {ref!r}"
    a, b = m.group("a"), m.group("b")
    if b is not None and b.count(".") < a.count("."):  # §2.2–3 means §2.2–§2.3
        b = ".".join(a.split(".")[: a.count(".") - b.count(".")] + [b])
    for sec in (a, b):
        if sec is not None and sec not in sections:
            return f"no section {sec}"
    if m.group("items"):
        missing = [n for n in _numbers(m.group("items")) if not _has_item(sections[a], n)]
        if missing:
            return f"no item {', '.join(map(str, missing))} in §{a}"
    return None


# ------------------------------------------------------------------------------------------- the checker
def citations(text: str) -> list[tuple[int, str, str, str | None, list[str]]]:
    """Each citation of ``text``: (line, the citation as written, name, prefix or None, its references)."""
    src = _uncomment(text)
    out = []
    for m in citation_re().finditer(src):
        if src[max(0, m.start() - 2):m.start()] == "](":
            continue  # a markdown link target: tests/test_docs.py resolves links
        refs = re.findall(_REF, m.group("refs") or "")
        cited = re.sub(r"\s+", " ", text[m.start():m.end()])
        out.append((src.count("\n", 0, m.start()) + 1, cited, m.group("name"), m.group("prefix"), refs))
    return out


def check_text(rel_path: str, text: str) -> list[str]:
    """``path:line: citation: why`` for every citation of ``text`` (a file at ``rel_path``) that does not resolve."""
    bad: list[tuple[int, str]] = []
    in_spec = os.path.dirname(rel_path).replace(os.sep, "/") == SPEC
    for m in external_re().finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        bad.append((line, f"{rel_path}:{line}: {m.group(0)}: the external reference folder; cite {SPEC}/"
                          f"{m.group(0).rsplit('/', 1)[1]}"))
    for line, cited, name, prefix, refs in citations(text):
        where = f"{rel_path}:{line}: {cited}"
        if prefix is None and not in_spec and os.path.exists(os.path.join(ROOT, "docs", f"{name}.md")):
            bad.append((line, f"{where}: ambiguous (docs/{name}.md is a page too); write {SPEC}/{name}.md"))
            continue
        spec = spec_file(name)
        if spec is None:
            bad.append((line, f"{where}: no file {SPEC}/{name}.md"))
            continue
        sections, whole = spec
        bad += [(line, f"{where}: {why}") for why in (check_ref(r, sections, whole) for r in refs) if why]
    return [msg for _, msg in sorted(bad, key=lambda x: x[0])]


def scanned_files() -> list[str]:
    out = []
    for top in SCANNED:
        path = os.path.join(ROOT, top)
        if os.path.isfile(path):
            out.append(top)
            continue
        for d, dirs, files in os.walk(path):
            dirs[:] = sorted(x for x in dirs if x != "__pycache__" and not x.startswith("."))
            out += [os.path.relpath(os.path.join(d, f), ROOT) for f in sorted(files)]
    return out


def read_text(rel_path: str) -> str | None:
    path = os.path.join(ROOT, rel_path)
    if os.path.getsize(path) > 2_000_000:
        return None
    try:
        return open(path, encoding="utf-8").read()
    except UnicodeDecodeError:
        return None


# ------------------------------------------------------------------------------------------------ tests
def test_every_citation_resolves():
    bad, found = [], 0
    for rel in scanned_files():
        text = read_text(rel)
        if text is None:
            continue
        found += len(citations(text))
        bad += check_text(rel, text)
    assert found > 200, f"only {found} citations found: is the pattern still reading them?"
    assert not bad, f"{len(bad)} of {found} citations do not resolve:\n" + "\n".join(bad)


def test_the_checker_reads_every_form():
    text = ("(graft.md §2.2–§2.3, §8 items 3 and 10; Eq. 6–8)\n"
            "x (docs/spec/conventions.md §6.1) and `baselines.md` §1.2, opd_saf.md §4-5\n"
            "# as graft.md\n# §4, App. H; tandem.md §2.10.4 / §2.9 item 2\n"
            "[link](conventions.md) docs/conventions.md docs/algo/rollout_corr.md ungraft.md\n")
    got = [(line, name, prefix, refs) for line, _, name, prefix, refs in citations(text)]
    assert got == [(1, "graft", None, ["§2.2–§2.3", "§8 items 3 and 10", "Eq. 6–8"]),
                   (2, "conventions", "docs/spec/", ["§6.1"]),
                   (2, "baselines", None, ["§1.2"]),
                   (2, "opd_saf", None, ["§4-5"]),
                   (3, "graft", None, ["§4", "App. H"]),
                   (4, "tandem", None, ["§2.10.4", "§2.9 item 2"])]
    assert check_text("graft_cli/x.py", text) == []


def test_the_checker_flags_bad_citations():
    # built from pieces so that the scan of this file does not read them as citations
    g, conv, eco = "graft" + ".md", "conventions" + ".md", "ecosystem" + ".md"
    text = "\n".join([f"ok {g} §2.2 step 6", f"a {g} §99", f"b {g} §8 item 42", f"c {g} §2.2 step 12",
                      f"d {g} App. Z", f"e {g} Eq. 99", f"f {g} §6.1–§6.99", f"g {eco} §1",
                      f"h {conv} §5", "i /work/shared/reference/" + g, f"j docs/spec/{conv} §5.2"])
    assert check_text("graft_cli/x.py", text) == [
        f"graft_cli/x.py:2: {g} §99: no section 99",
        f"graft_cli/x.py:3: {g} §8 item 42: no item 42 in §8",
        f"graft_cli/x.py:4: {g} §2.2 step 12: no item 12 in §2.2",
        f"graft_cli/x.py:5: {g} App. Z: no App. Z named",
        f"graft_cli/x.py:6: {g} Eq. 99: no Eq. 99 named",
        f"graft_cli/x.py:7: {g} §6.1–§6.99: no section 6.99",
        f"graft_cli/x.py:8: {eco} §1: no file docs/spec/{eco}",
        f"graft_cli/x.py:9: {conv} §5: ambiguous (docs/{conv} is a page too); write docs/spec/{conv}",
        f"graft_cli/x.py:10: reference/{g}: the external reference folder; cite docs/spec/{g}"]
    # inside docs/spec/ a bare name is its neighbour
    assert check_text(f"docs/spec/{g}", f"see {conv} §5.2") == []


def test_the_spec_is_indexed():
    """docs/spec/README.md names every file of the specification, and no file numbers two headings alike."""
    readme = open(os.path.join(ROOT, SPEC, "README.md"), encoding="utf-8").read()
    for f in sorted(os.listdir(os.path.join(ROOT, SPEC))):
        if f.endswith(".md") and f != "README.md":
            assert f"({f})" in readme, f"docs/spec/README.md does not link {f}"
            text = open(os.path.join(ROOT, SPEC, f), encoding="utf-8").read()
            text = re.sub(r"```.*?```", "", text, flags=re.S)
            nums = re.findall(r"(?m)^#{1,6}\s+(\d+(?:\.\d+)*)\.?\s", text)
            assert len(nums) == len(set(nums)), f"{f}: a section number is used twice"
