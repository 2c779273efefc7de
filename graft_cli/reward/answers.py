"""The math answer rule: the last boxed answer of a response, equivalent to the gold under
math-verify.

:func:`grade_one` / :func:`grade_status` grade one answer in this process;
:mod:`graft_cli.reward.pool` runs them in worker processes with a hard timeout (the reward
``math_verify`` of the registry ``REWARDS``).

The rule (graft.md §1): a response scores 1.0 when the content of its LAST ``\\boxed{...}`` (also
``\\boxed x`` and ``\\fbox{...}``) is equivalent to the reference answer under math-verify, else
0.0. No format or length reward. A response without a boxed answer, a parse failure, an exception or
a verification timeout all score 0.0.

math-verify usage (docs/spec/conventions.md §7):

* ``verify(gold, pred)`` with the GOLD FIRST: verify is not symmetric (assignments ``x=5`` and
  equation/interval conversions follow the gold's format).
* ``parsing_timeout=None`` / ``timeout_seconds=None``: math-verify's own timeouts use
  ``signal.alarm`` (main thread only; in other threads ``parse`` raises). :class:`MathVerifyGrader`
  enforces a hard wall-clock deadline instead, by killing the worker process that holds a stuck
  item.
* Extraction configs (chosen deliberately):

  - prediction: we cut the last box out ourselves with :func:`last_boxed` (linear time, brace
    balanced) and parse ``\\boxed{<content>}`` with ``LatexExtractionConfig(boxed_match_priority=0,
    try_extract_without_anchor=False)`` and ``extraction_mode="first_match"`` (TRL's prediction
    config): only the boxed content is ever read, never a stray number elsewhere in the response.
    Default normalisation (units, ``^\\circ``, ``\\text{}``, ``\\dfrac``, malformed operators)
    applies. ``fallback_mode="first_match"`` keeps the normalised string, so two answers that sympy
    cannot parse still match when their normalised strings are identical.
  - gold: a bare answer string (``\\frac{1}{2}``, ``(0,\\infty)``, ``x=5``, ``\\text{Evelyn}``,
    ``10\\%``) is parsed the same way as ``\\boxed{<gold>}`` (surrounding ``$...$`` stripped first),
    so gold and prediction go through identical normalisation. Only if that yields no sympy object
    do we try ``$<gold>$`` with the default ``LatexExtractionConfig()``; an unparsable gold (e.g.
    with ``\\hbar``) then compares by normalised string, so an identical answer still scores 1.
    Never ``ExprExtractionConfig`` on a gold: it would pull a stray number out of an unparsable
    expression.

* Percentages: with the antlr4 runtime 4.9.3 (pinned by hydra/omegaconf), latex2sympy2_extended
  1.11's generated parser lacks ``AtomContext.FUNC_GAMMA``, so every LaTeX percentage (``50\\%``)
  raises ``AttributeError`` and falls back to string comparison. :func:`_ensure_math_verify` adds
  the missing accessor (returning ``None``, as the 4.13.2 parser does for a non-gamma atom), which
  restores math-verify's designed behaviour: ``50\\%`` == ``50`` == ``0.5`` == ``\\frac{1}{2}``, but
  ``12.5\\%`` != ``12.5`` (non-integer percentages compare as their value, 0.125).
* Repeating decimals (``0.\\overline{3}``), which latex2sympy reads as ``0``, are rewritten as
  fractions before parsing (gold and prediction).
* An answer whose text equals the gold's (up to whitespace) scores 1.0 before math-verify runs:
  identical text is equal, and some long identical answers otherwise take sympy over 5 s.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from fractions import Fraction
from functools import lru_cache

_BOX_CMDS = ("\\boxed", "\\fbox")

# ----------------------------------------------------------------------------------------------------
# Final-answer extraction


def _skip_ws(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in " \t\r\n":
        i += 1
    return i


def _braced_arg(text: str, i: int) -> str | None:
    """Content of the brace group opening at ``text[i] == '{'``; None if it never closes.

    ``\\{`` / ``\\}`` (and any other escaped character) do not count as group braces."""
    depth = 0
    n = len(text)
    j = i
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
        j += 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the LAST ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed x`` in ``text``, stripped.

    Brace balanced (escaped ``\\{``/``\\}`` are content). Returns None when there is no box, when
    the last box never closes (e.g. a truncated response: the last box is the final answer, an
    earlier one is not used instead), or when it is empty. ``\\boxed x`` (no braces) takes the text
    up to the next ``$``, newline or end, without a trailing ``.``/``,``. Linear time: one
    right-to-left search per command and at most one forward brace scan."""
    if not isinstance(text, str) or not text:
        return None
    best, best_cmd = -1, ""
    for cmd in _BOX_CMDS:
        end = len(text)
        while True:
            k = text.rfind(cmd, 0, end)
            if k < 0:
                break
            after = k + len(cmd)
            # `\boxedx` is another command name; keep looking further left.
            if after < len(text) and text[after].isalpha():
                end = k
                continue
            if k > best:
                best, best_cmd = k, cmd
            break
    if best < 0:
        return None
    i = _skip_ws(text, best + len(best_cmd))
    if i < len(text) and text[i] == "{":
        content = _braced_arg(text, i)
        if content is None:
            return None
    elif best_cmd == "\\boxed" and i > best + len(best_cmd) and i < len(text):
        stop = len(text)
        for ch in ("$", "\n"):
            s = text.find(ch, i)
            if 0 <= s < stop:
                stop = s
        content = text[i:stop].rstrip().rstrip(".,").rstrip()
    else:
        return None
    content = content.strip()
    return content or None


# ----------------------------------------------------------------------------------------------------
# math-verify


_SLL = threading.local()
_INT_RE = re.compile(r"[0-9]+\Z")
_DEC_RE = re.compile(r"(?:0|[1-9][0-9]*)\.[0-9]+\Z")


@lru_cache(maxsize=1)
def _ensure_math_verify():
    """Import math-verify once, apply three narrow fixes to latex2sympy2_extended 1.11 and build the
    extraction configs. Returns ``(parse, verify, boxed_cfg, dollar_cfg)``.

    1. Percentages (module docstring): the antlr 4.9.3/4.11 parsers lack ``AtomContext.FUNC_GAMMA``,
       which ``convert_atom`` probes before ``PERCENT_NUMBER``; add it (always ``None``, as in
       4.13.2).
    2. Speed: ``parse_number`` calls ``sympy.Number(text)``, which goes through ``parse_expr`` and a
       fresh ``from sympy import *`` (~0.5 ms, about half of a whole grade). Plain integers and
       decimals are built directly; the results are identical (``Integer(int(t))`` after the
       leading-zero strip it does itself; ``Float(t)`` keeps the string's precision like sympify).
    3. Speed: ANTLR's full-context (LL) prediction costs 10-30 ms for intervals, sets and equations.
       math-verify's LaTeX parses use ANTLR's standard two-stage strategy instead: SLL prediction
       first, which per ANTLR's ``PredictionMode.SLL`` contract returns the same tree as LL or a
       syntax error (latex2sympy's error listener raises on any error); on any exception the parse
       is redone in full LL, so results equal LL's, ~20x faster for those answers."""
    # lazy: sympy is slow to import
    import sympy

    # lazy: math-verify's LaTeX parser is slow to import
    from latex2sympy2_extended import latex2sympy2 as l2s

    # lazy: math-verify's LaTeX parser is slow to import
    from latex2sympy2_extended.antlr_parser import PSParser

    if not hasattr(PSParser.AtomContext, "FUNC_GAMMA"):
        PSParser.AtomContext.FUNC_GAMMA = lambda self: None
    converter = l2s._Latex2Sympy
    if not getattr(converter.parse_number, "_graft_fast", False):
        slow = converter.parse_number

        def parse_number(self, text):
            t = text.replace(",", "")
            try:
                if _INT_RE.match(t):
                    return sympy.Integer(int(t))
                if _DEC_RE.match(t):
                    return sympy.Float(t)
            except Exception:
                pass
            return slow(self, text)

        parse_number._graft_fast = True
        converter.parse_number = parse_number
    # lazy: math-verify's parser is slow to import
    import math_verify.parser as mv_parser

    if not getattr(mv_parser.latex2sympy, "_graft_two_stage", False):
        # lazy: math-verify's parser is slow to import
        from antlr4.atn.PredictionMode import PredictionMode

        make_parser, full_ll = converter.create_parser, mv_parser.latex2sympy

        def create_parser(self, latex_str):
            parser = make_parser(self, latex_str)
            if getattr(_SLL, "on", False):
                parser._interp.predictionMode = PredictionMode.SLL
            return parser

        def latex2sympy(*args, **kwargs):
            _SLL.on = True
            try:
                return full_ll(*args, **kwargs)
            except Exception:
                pass
            finally:
                _SLL.on = False
            return full_ll(*args, **kwargs)

        latex2sympy._graft_two_stage = True
        converter.create_parser = create_parser
        mv_parser.latex2sympy = latex2sympy
    # lazy: math-verify's parser is slow to import
    from math_verify import LatexExtractionConfig, parse, verify

    for name in ("math_verify.parser", "math_verify.grader"):  # we disable its timeouts on purpose
        logging.getLogger(name).addFilter(lambda r: not str(r.msg).startswith("Timeout is disabled"))

    boxed_cfg = (LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False),)
    dollar_cfg = (LatexExtractionConfig(),)
    units_off = dataclasses.replace(boxed_cfg[0].normalization_config, units=False)
    plain_cfg = (LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False,
                                       normalization_config=units_off),)
    return parse, verify, boxed_cfg, dollar_cfg, plain_cfg


def _has_expr(parsed: list) -> bool:
    return any(not isinstance(p, str) for p in parsed)


_REPEATING_RE = re.compile(r"(?<![0-9.])([0-9]*)\.([0-9]*)\\overline\s*(?:\{\s*([0-9]+)\s*\}|([0-9]))")


def _repeating_to_frac(m: re.Match) -> str:
    whole, fixed, rep = m.group(1), m.group(2), m.group(3) or m.group(4)
    den = 10 ** len(fixed) * (10 ** len(rep) - 1)
    num = int(whole or "0") * den + int(fixed + rep) - int(fixed or "0")
    q = Fraction(num, den)
    return str(q.numerator) if q.denominator == 1 else f"\\frac{{{q.numerator}}}{{{q.denominator}}}"


_TRAILING_DOT_RE = re.compile(r"(?<![\\.])\.\s*\Z")


OPTIONS = {"sci_notation": True}  # per process; workers get the grader's options at start
_SCI_RE = re.compile(r"(?<![\w.\\])([0-9]+(?:\.[0-9]+)?)[eE]([+-]?[0-9]+)(?![\w.])")
_SPACE_I_RE = re.compile(r"(?<=[0-9])\s+i(?![A-Za-z])")


def _sci(m: re.Match) -> str:
    return f"{m.group(1)}\\times 10^{{{int(m.group(2))}}}"


def _normalise(content: str) -> str:
    """Pre-normalisation math-verify lacks:

    - a sentence-final ``.`` inside the box (``\\boxed{104.}`` does not parse) is dropped;
    - repeating decimals ``0.\\overline{3}`` / ``1.2\\overline{45}`` become fractions (latex2sympy
      reads ``0.\\overline{3}`` as 0, which would match a wrong ``0``);
    - scientific e-notation ``4e33`` / ``2.7778e-6`` becomes ``4\\times 10^{33}`` (math-verify reads
      the ``e`` as Euler's number; 58 of Minerva's 272 golds are written this way); off with
      ``OPTIONS["sci_notation"]`` (``reward.sci_notation: false``);
    - a space between a digit and the imaginary unit (``6+9 i``) is dropped: ``9 i`` parses as the
      symbol ``i`` times 9, ``9i`` as 9·I."""
    content = _TRAILING_DOT_RE.sub("", content)
    if "\\overline" in content:
        content = _REPEATING_RE.sub(_repeating_to_frac, content)
    if OPTIONS["sci_notation"] and ("e" in content or "E" in content):
        content = _SCI_RE.sub(_sci, content)
    if "i" in content:
        content = _SPACE_I_RE.sub("i", content)
    return content


def _parse_boxed_uncached(content: str, units: bool = True) -> tuple:
    parse, _, boxed_cfg, _, plain_cfg = _ensure_math_verify()
    return tuple(parse("\\boxed{" + _normalise(content) + "}", extraction_config=boxed_cfg if units else plain_cfg,
                       fallback_mode="first_match", extraction_mode="first_match", parsing_timeout=None))


_parse_boxed_cached = lru_cache(maxsize=8192)(_parse_boxed_uncached)


def _parse_boxed(content: str, units: bool = True) -> tuple:
    """Parsed ``\\boxed{content}`` (``units``: with math-verify's unit stripping). Short answers are
    cached per process: samples of one prompt often repeat an answer, and ANTLR's full-context
    prediction makes intervals and sets cost ~10 ms each."""
    return _parse_boxed_cached(content, units) if len(content) <= 512 else _parse_boxed_uncached(content, units)


def strips_gold_variable(content: str, gold: str) -> bool:
    """Whether math-verify's unit stripping would drop a trailing word of ``content`` that the gold
    uses as a variable (``\\frac{1}{m} t`` against ``\\frac{t}{m}``: the ``t`` is not tonnes). Then
    both sides are parsed without unit stripping."""
    # lazy: math-verify's LaTeX parser is slow to import
    from latex2sympy2_extended.math_normalization import units_regex

    m = units_regex.search(content)
    if m is None:
        return False
    word = re.sub(r"^[0-9}\s]+", "", m.group(0)).strip()
    return bool(word) and re.search(rf"(?<![A-Za-z\\]){re.escape(word)}(?![A-Za-z])", gold) is not None


def _bare_gold(gold: str) -> str:
    """The gold answer without surrounding ``$...$`` or ``\\boxed{...}``."""
    g = gold.strip()
    if len(g) >= 2 and g[0] == "$" and g[-1] == "$":
        g = g.strip("$").strip()
    if "\\boxed" in g or "\\fbox" in g:
        g = last_boxed(g) or g
    return g


def _same_text(a: str, b: str) -> bool:
    return " ".join(a.split()) == " ".join(b.split())


@lru_cache(maxsize=4096)
def _parse_gold(gold: str, units: bool = True) -> tuple:
    """Parsed gold answer, cached per process (a group's samples share it).

    ``\\boxed{<gold>}`` first (the prediction's path); if that gives no sympy object, ``$<gold>$``
    with the default LaTeX config; else the normalised string alone (string equality only). Never
    math-verify's plain-expression extraction on the raw gold: it would pick a stray number out of
    an unparsable answer (``\\hbar\\omega(v+1/2)`` -> ``2``)."""
    parse, _, _, dollar_cfg, _ = _ensure_math_verify()
    g = _bare_gold(gold)
    parsed = _parse_boxed(g, units)
    if not _has_expr(parsed):
        alt = parse("$" + _normalise(g) + "$", extraction_config=dollar_cfg, fallback_mode="no_fallback",
                    parsing_timeout=None)
        if _has_expr(alt):
            parsed = tuple(alt) + tuple(p for p in parsed if isinstance(p, str))
    return parsed


MAX_ANSWER_CHARS = 10_000  # a boxed answer longer than this is not parsed (scores 0, counted as rejected)
MAX_NESTING = 64  # nor one whose brackets nest deeper: ANTLR and sympy would spend the whole timeout on it


def nesting_depth(text: str) -> int:
    """Deepest nesting of ``{[(`` in ``text`` (escaped characters skipped; unbalanced closers
    ignored)."""
    depth = best = 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c in "{[(":
            depth += 1
            best = max(best, depth)
        elif c in "}])":
            depth = max(0, depth - 1)
        i += 1
    return best


def grade_status(response: str, gold: str) -> tuple[float, str | None, str]:
    """``(reward, extracted, status)``; status ``ok``, ``rejected`` (too long or too deeply nested
    to parse: scored 0 before math-verify sees it), ``memory`` (the worker's address-space cap was
    hit) or ``error``."""
    extracted = None
    try:
        extracted = last_boxed(response)
        if extracted is None:
            return 0.0, None, "ok"
        gold = str(gold)
        bare = _bare_gold(gold)
        if _same_text(extracted, bare):
            return 1.0, extracted, "ok"  # identical text (up to whitespace): equal without sympy, never times out
        if len(extracted) > MAX_ANSWER_CHARS or nesting_depth(extracted) > MAX_NESTING:
            return 0.0, extracted, "rejected"
        units = not strips_gold_variable(extracted, bare)
        gold_parsed = _parse_gold(gold, units)
        if not gold_parsed:
            return 0.0, extracted, "ok"
        pred_parsed = _parse_boxed(extracted, units)
        if not pred_parsed:
            return 0.0, extracted, "ok"
        _, verify, _, _, _ = _ensure_math_verify()
        ok = verify(list(gold_parsed), list(pred_parsed), timeout_seconds=None)
        return (1.0 if ok else 0.0), extracted, "ok"
    except (KeyboardInterrupt, SystemExit):
        raise
    except MemoryError:
        return 0.0, extracted, "memory"
    except BaseException:  # noqa: BLE001 - a reward never raises (math-verify's TimeoutException is a BaseException)
        return 0.0, extracted, "error"


def grade_one(response: str, gold: str) -> tuple[float, str | None]:
    """``(1.0 or 0.0, extracted final answer or None)`` for one response against a bare gold answer.

    Never raises (any exception scores 0.0) and has no timeout of its own: run it through
    :class:`MathVerifyGrader` for a hard deadline."""
    reward, extracted, _ = grade_status(response, gold)
    return reward, extracted
