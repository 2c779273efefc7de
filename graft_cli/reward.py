"""Binary math-verify reward on the final boxed answer (registry ``REWARDS``).

The rule (graft.md §1): a response scores 1.0 when the content of its LAST ``\\boxed{...}`` (also
``\\boxed x`` and ``\\fbox{...}``) is equivalent to the reference answer under math-verify, else 0.0.
No format or length reward. A response without a boxed answer, a parse failure, an exception or a
verification timeout all score 0.0.

math-verify usage (conventions.md §7):

* ``verify(gold, pred)`` with the GOLD FIRST: verify is not symmetric (assignments ``x=5`` and
  equation/interval conversions follow the gold's format).
* ``parsing_timeout=None`` / ``timeout_seconds=None``: math-verify's own timeouts use ``signal.alarm``
  (main thread only; in other threads ``parse`` raises). :class:`MathVerifyGrader` enforces a hard
  wall-clock deadline instead, by killing the worker process that holds a stuck item.
* Extraction configs (chosen deliberately):

  - prediction: we cut the last box out ourselves with :func:`last_boxed` (linear time, brace
    balanced) and parse ``\\boxed{<content>}`` with ``LatexExtractionConfig(boxed_match_priority=0,
    try_extract_without_anchor=False)`` and ``extraction_mode="first_match"`` (TRL's prediction
    config): only the boxed content is ever read, never a stray number elsewhere in the response.
    Default normalisation (units, ``^\\circ``, ``\\text{}``, ``\\dfrac``, malformed operators) applies.
    ``fallback_mode="first_match"`` keeps the normalised string, so two answers that sympy cannot
    parse still match when their normalised strings are identical.
  - gold: a bare answer string (``\\frac{1}{2}``, ``(0,\\infty)``, ``x=5``, ``\\text{Evelyn}``,
    ``10\\%``) is parsed the same way as ``\\boxed{<gold>}`` (surrounding ``$...$`` stripped first), so
    gold and prediction go through identical normalisation. Only if that yields no sympy object do we
    try ``$<gold>$`` with the default ``LatexExtractionConfig()``; an unparsable gold (e.g. with
    ``\\hbar``) then compares by normalised string, so an identical answer still scores 1. Never
    ``ExprExtractionConfig`` on a gold: it would pull a stray number out of an unparsable expression.

* Percentages: with the antlr4 runtime 4.9.3 (pinned by hydra/omegaconf), latex2sympy2_extended
  1.11's generated parser lacks ``AtomContext.FUNC_GAMMA``, so every LaTeX percentage (``50\\%``)
  raises ``AttributeError`` and falls back to string comparison. :func:`_ensure_math_verify` adds the
  missing accessor (returning ``None``, as the 4.13.2 parser does for a non-gamma atom), which
  restores math-verify's designed behaviour: ``50\\%`` == ``50`` == ``0.5`` == ``\\frac{1}{2}``, but
  ``12.5\\%`` != ``12.5`` (non-integer percentages compare as their value, 0.125).
* Repeating decimals (``0.\\overline{3}``), which latex2sympy reads as ``0``, are rewritten as
  fractions before parsing (gold and prediction).
* An answer whose text equals the gold's (up to whitespace) scores 1.0 before math-verify runs:
  identical text is equal, and some long identical answers otherwise take sympy over 5 s.

Hard timeout: some answers never finish. ``\\boxed{10^{10^{10^{10}}}}`` makes sympy's ``doit`` inside
``verify`` evaluate ``10**(10**10)`` in C, where not even math-verify's ``signal.alarm`` could interrupt
it. :class:`MathVerifyGrader` therefore grades in worker processes (``forkserver``: forked from a clean
server that preloaded math-verify, so a killed worker is replaced in ~0.2 s; never plain ``fork``,
since the trainer holds torch threads) and kills a worker that overruns ``timeout_s`` on an item.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from multiprocessing.connection import wait as mp_wait

import numpy as np

from graft_cli.registry import Registry

# a registered reward is a factory ``(num_workers, timeout_s, chunk_size, sci_notation, memory_mb) -> grader`` (the
# ``reward:`` section's options; make_grader); a grader has ``grade(responses, golds) -> Grades`` and ``close()``
REWARDS: Registry = Registry("reward")

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

    Brace balanced (escaped ``\\{``/``\\}`` are content). Returns None when there is no box, when the
    last box never closes (e.g. a truncated response: the last box is the final answer, an earlier one
    is not used instead), or when it is empty. ``\\boxed x`` (no braces) takes the text up to the next
    ``$``, newline or end, without a trailing ``.``/``,``. Linear time: one right-to-left search per
    command and at most one forward brace scan."""
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
       which ``convert_atom`` probes before ``PERCENT_NUMBER``; add it (always ``None``, as in 4.13.2).
    2. Speed: ``parse_number`` calls ``sympy.Number(text)``, which goes through ``parse_expr`` and a
       fresh ``from sympy import *`` (~0.5 ms, about half of a whole grade). Plain integers and
       decimals are built directly; the results are identical (``Integer(int(t))`` after the
       leading-zero strip it does itself; ``Float(t)`` keeps the string's precision like sympify).
    3. Speed: ANTLR's full-context (LL) prediction costs 10-30 ms for intervals, sets and equations.
       math-verify's LaTeX parses use ANTLR's standard two-stage strategy instead: SLL prediction
       first, which per ANTLR's ``PredictionMode.SLL`` contract returns the same tree as LL or a
       syntax error (latex2sympy's error listener raises on any error); on any exception the parse is
       redone in full LL, so results equal LL's, ~20x faster for those answers."""
    import sympy
    from latex2sympy2_extended import latex2sympy2 as l2s
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
    import math_verify.parser as mv_parser

    if not getattr(mv_parser.latex2sympy, "_graft_two_stage", False):
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
    - repeating decimals ``0.\\overline{3}`` / ``1.2\\overline{45}`` become fractions (latex2sympy reads
      ``0.\\overline{3}`` as 0, which would match a wrong ``0``);
    - scientific e-notation ``4e33`` / ``2.7778e-6`` becomes ``4\\times 10^{33}`` (math-verify reads the ``e``
      as Euler's number; 58 of Minerva's 272 golds are written this way); off with ``OPTIONS["sci_notation"]``
      (``reward.sci_notation: false``);
    - a space between a digit and the imaginary unit (``6+9 i``) is dropped: ``9 i`` parses as the symbol
      ``i`` times 9, ``9i`` as 9·I."""
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
    """Parsed ``\\boxed{content}`` (``units``: with math-verify's unit stripping). Short answers are cached
    per process: samples of one prompt often repeat an answer, and ANTLR's full-context prediction makes
    intervals and sets cost ~10 ms each."""
    return _parse_boxed_cached(content, units) if len(content) <= 512 else _parse_boxed_uncached(content, units)


def strips_gold_variable(content: str, gold: str) -> bool:
    """Whether math-verify's unit stripping would drop a trailing word of ``content`` that the gold uses as a
    variable (``\\frac{1}{m} t`` against ``\\frac{t}{m}``: the ``t`` is not tonnes). Then both sides are
    parsed without unit stripping."""
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
    math-verify's plain-expression extraction on the raw gold: it would pick a stray number out of an
    unparsable answer (``\\hbar\\omega(v+1/2)`` -> ``2``)."""
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
    """Deepest nesting of ``{[(`` in ``text`` (escaped characters skipped; unbalanced closers ignored)."""
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
    """``(reward, extracted, status)``; status ``ok``, ``rejected`` (too long or too deeply nested to parse:
    scored 0 before math-verify sees it), ``memory`` (the worker's address-space cap was hit) or ``error``."""
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


# ----------------------------------------------------------------------------------------------------
# Worker processes with a hard wall-clock timeout


def _cap_memory(memory_mb: int) -> None:
    """An address-space limit for this worker (``RLIMIT_AS``): an answer that needs more raises MemoryError
    inside sympy and scores 0 (status ``memory``) instead of taking the machine's memory."""
    if memory_mb and memory_mb > 0:
        import resource

        cap = int(memory_mb) * 2**20
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))


def _vm_peak() -> int:
    """This process's peak virtual memory in bytes (``VmPeak``; 0 where /proc is not there)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmPeak:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _worker_main(conn, options: dict | None = None) -> None:
    """Worker loop: ``("grade", [(idx, response, gold), ...])`` -> one ``("r", idx, reward, extracted, status)``
    message per item, sent as soon as the item is done (the parent times each item from the previous
    answer). ``("stop",)`` or a closed pipe ends the loop. ``options``: ``sci_notation``, ``memory_mb``."""
    options = dict(options or {})
    OPTIONS["sci_notation"] = bool(options.get("sci_notation", True))
    _ensure_math_verify()
    grade_one("\\boxed{\\frac{1}{2}}", "0.5")  # warm regex/parser caches before the clock starts
    cap = int(options.get("memory_mb", 0)) * 2**20
    _cap_memory(int(options.get("memory_mb", 0)))
    conn.send(("ready", os.getpid()))

    def answer(idx, response, gold):
        reward, extracted, status = grade_status(response, gold)
        near_cap = cap > 0 and _vm_peak() >= 0.9 * cap
        # math-verify swallows the MemoryError: the peak tells; a fresh worker takes over (stop after this item)
        return ("r", idx, 0.0 if near_cap else reward, extracted, "memory" if near_cap else status), near_cap

    serve(conn, answer)


def serve(conn, answer) -> None:
    """A grading worker's loop: each ``("grade", [(idx, response, gold), ...])`` message -> one message per item,
    ``answer(idx, response, gold)`` giving it and whether the worker stops after it; ``("stop",)`` or a closed
    pipe ends the loop."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] != "grade":
            return
        for idx, response, gold in msg[1]:
            out, stop = answer(idx, response, gold)
            conn.send(out)
            if stop:
                return


def _mp_context(preload=("graft_cli.reward", "math_verify", "latex2sympy2_extended")):
    """forkserver where available (module docstring), else spawn."""
    try:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(list(preload))
        return ctx
    except ValueError:
        return mp.get_context("spawn")


# code_* : the code reward's (graft_cli/code_reward.py)
STATUSES = ("ok", "timeout", "crash", "memory", "rejected", "error", "code_error", "code_timeout", "code_crash",
            "code_no_program", "code_bad_gold")
STATUS_METRICS = {"timeout": "reward/timeouts", "crash": "reward/worker_crashes", "memory": "reward/memory_capped",
                  "rejected": "reward/rejected", "error": "reward/errors"}
CODE_STATUS_METRICS = {"code_timeout": "reward/code_timeouts", "code_crash": "reward/code_crashes",
                       "code_error": "reward/code_errors", "code_no_program": "reward/code_no_program",
                       "code_bad_gold": "reward/code_bad_golds"}


@dataclass
class Grades:
    rewards: np.ndarray  # (N,) float32, 1.0 / 0.0
    timed_out: np.ndarray  # (N,) bool: the item hit the hard timeout (its reward is 0.0)
    extracted: list[str | None] = field(default_factory=list)  # last boxed content per response
    status: list[str] = field(default_factory=list)  # per response, one of STATUSES (non-"ok" scores 0)
    seconds: np.ndarray | None = None  # (N,) wall time per answer where the grader measures it (code), NaN unknown

    def __len__(self) -> int:
        return len(self.rewards)

    def counts(self) -> dict:
        """``reward/<status>`` counts of the responses that did not grade normally (metrics rows); a grader that
        times its answers (code) adds its ``reward/code_*`` counts and the mean / max seconds per answer."""
        st = self.status or ["timeout" if t else "ok" for t in self.timed_out]
        out = {v: sum(1 for x in st if x == k) for k, v in STATUS_METRICS.items()}
        if self.seconds is not None:
            out.update({v: sum(1 for x in st if x == k) for k, v in CODE_STATUS_METRICS.items()})
            sec = self.seconds[np.isfinite(self.seconds)] if len(self.seconds) else self.seconds
            out["reward/code_time_mean_s"] = float(sec.mean()) if len(sec) else 0.0
            out["reward/code_time_max_s"] = float(sec.max()) if len(sec) else 0.0
        return out

    @classmethod
    def concat(cls, parts: list) -> Grades:
        """The grades of several batches, in order."""
        secs = [g.seconds for g in parts]
        return cls(np.concatenate([g.rewards for g in parts]), np.concatenate([g.timed_out for g in parts]),
                   [x for g in parts for x in g.extracted], [x for g in parts for x in g.status],
                   None if any(s is None for s in secs) else np.concatenate(secs))


class _Worker:
    def __init__(self, ctx, options: dict | None = None, target=None):
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=target or _worker_main, args=(child, options), daemon=True,
                                name="graft-reward")
        self.proc.start()
        child.close()
        self.started = time.monotonic()
        self.ready = False
        self.current: deque[int] = deque()  # indices sent and not yet answered, in order
        self.last = 0.0  # when the item at current[0] started (dispatch or previous answer)

    def kill(self) -> None:
        try:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(timeout=5)
        except Exception:
            pass
        try:
            self.conn.close()
        except Exception:
            pass


class MathVerifyGrader:
    """Grades responses against gold answers with :func:`grade_one` in worker processes.

    Each response gets a hard wall-clock budget of ``timeout_s`` seconds: a worker that has not
    answered its current item in time is killed and replaced, that item scores 0.0 with
    ``timed_out=True``, and the rest of its chunk is re-queued. Items travel in chunks of
    ``chunk_size``; results are returned in input order. ``num_workers=0`` grades in-process (no
    timeout; for debugging). Workers start lazily on the first :meth:`grade` (or :meth:`start`) and
    are reused across calls; their start-up does not count against ``timeout_s``. One grader serves
    one thread at a time. ``num_timeouts`` / ``num_restarts`` count over the grader's lifetime.

    A subclass grades something else with the same pool (graft_cli/code_reward.py): ``worker_target`` (the worker
    loop; a worker ``i`` gets the grader's options plus ``slot: i``; an answer message may carry its seconds as a
    6th element), ``preload`` (the forkserver's modules), :meth:`extract` (what a timed-out or crashed item reports
    as extracted) and :meth:`grade_inline` (the ``num_workers=0`` path)."""

    worker_target = staticmethod(_worker_main)
    preload = ("graft_cli.reward", "math_verify", "latex2sympy2_extended")

    @staticmethod
    def extract(response: str, gold) -> str | None:
        return last_boxed(response)

    def on_ready(self, msg: tuple) -> None:
        """A worker's ``("ready", pid, ...)`` message (a subclass reads what its workers report there)."""

    def grade_inline(self, response: str, gold):
        """``(reward, extracted, status, seconds or None)`` of one item in the calling process."""
        reward, extracted, status = grade_status(response, gold)
        return reward, extracted, status, None

    def __init__(self, num_workers: int = 2, timeout_s: float = 5.0, chunk_size: int = 64,
                 startup_timeout_s: float = 120.0, sci_notation: bool = True, memory_mb: int = 4096):
        if num_workers < 0 or timeout_s <= 0 or chunk_size < 1:
            raise ValueError("need num_workers >= 0, timeout_s > 0 and chunk_size >= 1")
        self.options = {"sci_notation": bool(sci_notation), "memory_mb": int(memory_mb)}
        OPTIONS["sci_notation"] = bool(sci_notation)  # the in-process path (num_workers = 0) and the caches
        self.num_workers = num_workers
        self.timeout_s = float(timeout_s)
        self.chunk_size = int(chunk_size)
        self.startup_timeout_s = float(startup_timeout_s)
        self.num_timeouts = 0  # over the grader's lifetime
        self.num_restarts = 0
        self.num_crashes = 0
        self._ctx = None
        self._workers: list[_Worker] = []
        self._startup_failures = 0
        self._pid = os.getpid()

    # -- lifecycle
    def _new_worker(self, i: int) -> _Worker:
        return _Worker(self._ctx, {**self.options, "slot": i}, self.worker_target)

    def _start_workers(self) -> None:
        if self._ctx is None:
            self._ctx = _mp_context(self.preload)
        for i in range(self.num_workers):
            if i >= len(self._workers):
                self._workers.append(self._new_worker(i))
            elif not self._workers[i].proc.is_alive():
                self._workers[i].kill()
                self._workers[i] = self._new_worker(i)

    def start(self, wait: bool = True) -> MathVerifyGrader:
        """Start the workers now (otherwise the first :meth:`grade` does) and, with ``wait``, block until
        all of them are ready, e.g. to overlap their start-up with model loading."""
        if self.num_workers == 0:
            return self
        self._start_workers()
        deadline = time.monotonic() + self.startup_timeout_s
        while wait and not all(w.ready for w in self._workers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"reward worker did not start within {self.startup_timeout_s:.0f} s")
            pending = {w.conn: i for i, w in enumerate(self._workers) if not w.ready}
            for conn in mp_wait(list(pending), timeout=max(0.0, deadline - time.monotonic())):
                try:
                    msg = conn.recv()
                    if msg[0] == "ready":
                        self._workers[pending[conn]].ready = True
                        self._startup_failures = 0
                        self.on_ready(msg)
                except (EOFError, OSError):
                    self._startup_failures += 1
                    if self._startup_failures > 3 * self.num_workers:
                        raise RuntimeError("reward workers keep dying at start-up") from None
                    self._restart(pending[conn])
        return self

    def _restart(self, i: int) -> None:
        self._workers[i].kill()
        self._workers[i] = self._new_worker(i)
        self.num_restarts += 1

    def close(self) -> None:
        workers, self._workers = getattr(self, "_workers", []), []
        if getattr(self, "_pid", None) != os.getpid():
            return  # a forked copy does not own the workers
        for w in workers:
            try:
                w.conn.send(("stop",))
            except Exception:
                pass
        deadline = time.monotonic() + 2.0
        for w in workers:
            try:
                w.proc.join(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:
                pass
            w.kill()

    def __enter__(self) -> MathVerifyGrader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- grading
    def grade(self, responses: list[str], golds: list[str]) -> Grades:
        if len(responses) != len(golds):
            raise ValueError(f"{len(responses)} responses but {len(golds)} golds")
        n = len(responses)
        rewards = np.zeros(n, dtype=np.float32)
        timed_out = np.zeros(n, dtype=bool)
        extracted: list[str | None] = [None] * n
        status = ["ok"] * n
        seconds = np.full(n, np.nan) if self.worker_target is not _worker_main else None
        if n == 0:
            return Grades(rewards, timed_out, extracted, status, seconds)
        if self.num_workers == 0:
            for i, (r, g) in enumerate(zip(responses, golds)):
                rewards[i], extracted[i], status[i], sec = self.grade_inline(r, g)
                if seconds is not None:
                    seconds[i] = sec
                timed_out[i] = status[i] in ("timeout", "code_timeout")
            return Grades(rewards, timed_out, extracted, status, seconds)

        try:
            return self._grade(responses, golds, rewards, timed_out, extracted, status, seconds)
        except BaseException:
            self.close()  # workers may hold a half-done chunk: start clean next time
            raise

    def _grade(self, responses, golds, rewards, timed_out, extracted, status, seconds=None) -> Grades:
        n = len(responses)
        self._start_workers()
        queue = deque(list(range(s, min(s + self.chunk_size, n))) for s in range(0, n, self.chunk_size))
        remaining = n
        retried: set[int] = set()  # items whose worker died once: regraded on a fresh worker, then scored 0

        def settle(idx: int, reward: float, ext, st: str = "ok", sec: float | None = None) -> None:
            nonlocal remaining
            rewards[idx], extracted[idx], timed_out[idx], status[idx] = reward, ext, st in ("timeout",
                                                                                          "code_timeout"), st
            if seconds is not None:
                seconds[idx] = np.nan if sec is None else sec
            remaining -= 1

        while remaining > 0:
            now = time.monotonic()
            for w in self._workers:  # dispatch to idle ready workers
                if w.ready and not w.current and queue:
                    chunk = queue.popleft()
                    try:
                        w.conn.send(("grade", [(i, responses[i], golds[i]) for i in chunk]))
                    except Exception:
                        queue.appendleft(chunk)
                        continue
                    w.current.extend(chunk)
                    w.last = now
            waits = [w.last + self.timeout_s - now for w in self._workers if w.current]
            waits += [w.started + self.startup_timeout_s - now for w in self._workers if not w.ready]
            wait_s = max(0.0, min(waits)) if waits else 0.0
            ready = mp_wait([w.conn for w in self._workers], timeout=wait_s)
            now = time.monotonic()
            for i, w in enumerate(self._workers):
                if w.conn not in ready:
                    continue
                crashed = False
                try:
                    while w.conn.poll():
                        msg = w.conn.recv()
                        if msg[0] == "ready":
                            w.ready = True
                            self._startup_failures = 0
                            self.on_ready(msg)
                        elif msg[0] == "r" and w.current and msg[1] == w.current[0]:
                            w.current.popleft()
                            settle(msg[1], msg[2], msg[3], msg[4], msg[5] if len(msg) > 5 else None)
                            w.last = now
                except (EOFError, OSError):
                    crashed = True
                if crashed:  # died mid-item (e.g. the OOM killer): regraded once on a fresh worker, then scored 0
                    if w.current:
                        idx = w.current.popleft()
                        rest = list(w.current)
                        if idx in retried:
                            settle(idx, 0.0, self.extract(responses[idx], golds[idx]), "crash")
                            self.num_crashes += 1
                        else:
                            retried.add(idx)
                            rest = [idx] + rest
                        if rest:
                            queue.appendleft(rest)
                    elif not w.ready:
                        self._startup_failures += 1
                        if self._startup_failures > 3 * self.num_workers:
                            raise RuntimeError("reward workers keep dying at start-up")
                    self._restart(i)
            for i, w in enumerate(self._workers):  # enforce deadlines
                if w.current and now - w.last > self.timeout_s:
                    idx = w.current.popleft()
                    settle(idx, 0.0, self.extract(responses[idx], golds[idx]), "timeout",
                           now - w.last if seconds is not None else None)
                    self.num_timeouts += 1
                    if w.current:
                        queue.appendleft(list(w.current))
                    self._restart(i)
                elif not w.ready and now - w.started > self.startup_timeout_s:
                    raise RuntimeError(f"reward worker did not start within {self.startup_timeout_s:.0f} s")
        return Grades(rewards, timed_out, extracted, status, seconds)


@REWARDS.register("math_verify")
def make_math_verify(num_workers: int = 2, timeout_s: float = 5.0, chunk_size: int = 64, sci_notation: bool = True,
                     memory_mb: int = 4096) -> MathVerifyGrader:
    """Binary math-verify reward on the last boxed answer, graded in worker processes (each capped at
    ``memory_mb`` MiB of address space; 0 = no cap)."""
    return MathVerifyGrader(num_workers=num_workers, timeout_s=timeout_s, chunk_size=chunk_size,
                            sci_notation=sci_notation, memory_mb=memory_mb)


class CoinFlipGrader:
    """A benchmark-only reward: 1.0 for about half the responses, decided by a hash of (response, gold), so
    random-weight models (``run.model_init: random``) still give mixed groups and every exchange path runs. Never a
    measure of anything."""

    def __init__(self, p: float = 0.5, **_):
        self.p = float(p)

    def grade(self, responses: list[str], golds: list[str]) -> Grades:
        import hashlib

        r = np.array([float(int(hashlib.sha256(f"{a}\x00{g}".encode()).hexdigest()[:8], 16) / 2**32 < self.p)
                      for a, g in zip(responses, golds)], dtype=np.float32)
        return Grades(r, np.zeros(len(r), dtype=bool), [last_boxed(a) for a in responses], ["ok"] * len(r))

    def close(self) -> None:
        pass


@REWARDS.register("coinflip")
def make_coinflip(**kwargs) -> CoinFlipGrader:
    """Benchmark-only: a hashed coin flip per response (:class:`CoinFlipGrader`)."""
    return CoinFlipGrader()


REWARDS.lazy("code", "graft_cli.code_reward")  # the sandboxed test-execution reward, imported when asked for


def make_grader(rc=None, **overrides):
    """The grader a ``reward:`` section names (``rc``: a :class:`graft_cli.config.RewardConfig`; registry
    ``REWARDS``), built with that section's options; ``overrides`` replace some (an evaluation's worker count).
    ``rc=None``: the default reward (math-verify, its defaults being ``RewardConfig``'s). The one way the trainer,
    ``graft eval``, the analyses and the tiny pair's check build a grader, so a run is graded by its own reward
    wherever it is graded."""
    if rc is None:
        return REWARDS.get("math_verify")(**overrides)
    opts = {f.name: getattr(rc, f.name) for f in dataclasses.fields(rc) if f.name != "name"}
    return REWARDS.get(rc.name)(**{**opts, **overrides})

