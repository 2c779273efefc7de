"""The embedded tiny heterogeneous pair: two small, *different* models built from scratch on CPU.

``pair=tiny`` (the default) must run every method of the study for real on a laptop. Real pairs are
3B models on MATH; here :func:`build_tiny` builds, in a few minutes on 2 CPU cores,

* ``a``: a ``Qwen3ForCausalLM`` (hidden 192, 4 layers, 4 query / 2 KV heads, MLP 576, tied
  embeddings; 1.83M parameters) with a Qwen-style **byte-level BPE** (single digits, merges free across
  punctuation, a LaTeX command kept whole: ``\\boxed{`` is 2 tokens; vocabulary 324);
* ``b``: a ``LlamaForCausalLM`` (hidden 192, 4 layers, 4/4 heads, MLP 512, tied; 1.83M) with a GPT-2 /
  Llama-3-style **byte-level BPE** (single digits, the GPT-2 pre-tokenizer regex: ``\\boxed{`` is 3
  tokens; vocabulary 308), trained on a differently seeded corpus, plus the constant prompt suffix as
  one added token. The two vocabularies and merge lists differ, but the granularity is that of two real
  subword tokenizers: a reference response re-tokenized from ``a`` to ``b`` is ~1.06x as long
  (DeepSeek's vs SmolLM2's tokenizer on MATH500 solutions: 0.86x), so GRAFT's per-token compatibility
  score compares like with like (a character-level ``b``, this pair's first version, made it 1.5x
  and pulled ``a``'s scores down);
* ``c`` (``pair=tiny3``, the three-model miniature): a ``GPTNeoXForCausalLM`` (hidden 192, 4 layers, 4 heads,
  MLP 640, parallel attention + MLP residual, LayerNorm, rotary on a quarter of each head, untied embeddings;
  1.61M) with a Gemma-style **SentencePiece BPE** (``"▁"`` for spaces, no dummy prefix, pieces within words,
  single digits, a character alphabet with ``<unk>``: :func:`build_tokenizer_c`), blind on multiplication;
  the weakest of the three, as Qwen3-1.7B is the weaker model of the paper's first pair;
* ``teacher``: model ``a`` trained longer (continued SFT on a balanced, harder mix) — same
  architecture and tokenizer as ``a``, stronger everywhere: the on-policy distillation teacher;
* ``junior``: an early snapshot of ``a``'s SFT run — same tokenizer as ``a``, clearly weaker but
  not useless: the junior of tandem training.

Why ~1.8M rather than ~3M parameters: the build has a fixed CPU budget (single-threaded workers,
~800-960 SFT steps per model, under 5 minutes), so model size trades against SFT steps. In calibration runs at equal CPU
time (~270 s), a 3.2M model (hidden 256) reached pass@1 0.13-0.16 after 560 steps while the 1.8M
model (hidden 192) reached 0.33-0.37 after 840 steps; smaller models also make RL steps cheaper.

Structural complementarity by construction, properties by measurement
---------------------------------------------------------------------
The two bases are pretrained (SFT on worked solutions, loss on response tokens + EOS only) with
*different skill mixes* over the synthetic task's six families (:mod:`graft_cli.data.synthetic`), and
each has a **structural blind spot**, as the paper's pairs do (SmolLM3 solves 47.9% of Qwen3's all-fail
prompts): ``a`` almost never sees fractions (``frac`` weight 0.01) and ``b`` almost never sees linear
equations (``lin`` 0.01), while each is trained hard on the other's blind family (``b``: ``frac`` 1.6;
``a``: ``lin`` 1.0). At the start of RL each model all-fails most prompts of its blind family and the
peer's group is mixed on a large share of them: exactly the prompts GRAFT grafts on. :func:`check_tiny`
measures it (pass@1, all-fail share, complementarity both ways, and per family:
:func:`family_complementarity`, :func:`blind_spots`) with the project's own rollout engine and math-verify
reward on the training distribution; ``graft tiny build --check`` prints it.

Speed and determinism
---------------------
* Sequences are kept short (prompt + response + EOS: ~24 tokens on average under ``a`` and ``b``; at
  most 36) because RL step time on a CPU is proportional to tokens.
* The three tokenizer families train in three worker processes (``a`` then ``teacher``; ``b``; ``c``), each
  pinned to **one thread** with deterministic ops, fixed ``torch.manual_seed`` and a data stream
  seeded from ``(seed, role)``: the same seed gives the same weight hashes whether the jobs run in
  parallel processes or one after the other in-process (the hashes go into ``manifest.json``).
  Budgets are step counts, never wall-clock times, for the same reason. (Bit-identity is per
  machine/torch build: other CPU kernels may round differently.)
* The SFT schedule is a short linear warm-up then cosine decay of a high peak learning rate, which
  gets the most out of a few hundred steps; the final learning rate is kept well above zero so the
  models stay plastic for RL at lr ~1e-4.

Cache layout (``$GRAFT_CACHE`` or ``~/.cache/graft/tiny``): ``a/ b/ c/ teacher/ junior/`` (each a
``save_pretrained`` model + tokenizer folder, loadable offline with the Auto classes), ``task/``
(:func:`graft_cli.data.synthetic.write_task` output) and ``manifest.json`` (recipe, seed, hashes,
measured token statistics), written last and atomically: a cache without a valid manifest is
rebuilt by :func:`ensure_tiny`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass

import torch

from graft_cli.console import make_console
from graft_cli.rundir import read_jsonl

TINY_VERSION = 3
ROLES = ("a", "b", "c", "teacher", "junior")
POLICY_ROLES = ("a", "b", "c")  # the peers (tiny pair a, b; pair=tiny3 adds c)
EOS_A, PAD_A = "<|endoftext|>", "<|pad|>"
BOS_B, EOS_B, PAD_B = "<s>", "</s>", "<pad>"
PAD_C, EOS_C, BOS_C, UNK_C = "<pad>", "<eos>", "<bos>", "<unk>"  # Gemma's specials, in Gemma's id order

# ``b``'s tokenizer adds the constant part of the raw prompt template, " Let's think step by step and
# output the final answer within \boxed{}.\n", as ONE added, non-special token: its regex pre-tokenizer
# would otherwise spend ~17 tokens on it in every prompt (RL step time is proportional to sequence length).
# Prompts are never exchanged between the models (each encodes its own), so this changes no response.
def _suffix_tokens_b() -> tuple[str, ...]:
    from graft_cli.data.prompts import RAW_TEMPLATE, SUFFIX

    constant = RAW_TEMPLATE.split("{problem}", 1)[1].format(suffix=SUFFIX)  # " <suffix>\n"
    return (constant,)


# ----------------------------------------------------------------------------------------------------
# Paths


def default_cache_dir() -> str:
    return os.environ.get("GRAFT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "graft", "tiny")


# ----------------------------------------------------------------------------------------------------
# Tokenizers


class _Raw:
    chat_template = None


def _prompt_text(problem: str) -> str:
    from graft_cli.data.prompts import PromptSpec

    return PromptSpec().text(problem, _Raw())


def _bpe(pre_tokenizer, corpus_seed: int, vocab_size: int, specials: list[str], style="chain"):
    """A byte-level BPE (``tokenizers`` trainer, ~0.2 s) over the task's text: prompt + worked solution
    pairs drawn from :func:`graft_cli.data.synthetic.corpus` with ``corpus_seed``, solutions in ``style`` (a name,
    or a list of names drawn uniformly per example: :meth:`Recipe.tokenizer_style`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from graft_cli.data.synthetic import corpus

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_prompt_text(p) + s for p, s in corpus(corpus_seed, 4000, style)], trainer)
    return tok


# Qwen2/Qwen3's pre-tokenizer regex (their tokenizer.json): a word with its leading space or one punctuation mark
# (" then" -> "Ġthen"), single digits, punctuation runs, newlines, spaces; preceded by the LaTeX command with its
# leading space that a's earlier split isolates (" \boxed" stays one piece)
QWEN_PRETOKENIZE = (r" ?\\[A-Za-z]+|(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def build_tokenizer_a(seed: int = 0, vocab_size: int = 384, style: str = "chain", split: str = "free"):
    """``a``: byte-level BPE in the Qwen style (digits always single tokens). Pre-tokenizer: ``Digits(
    individual_digits=True)``, then a split isolating a LaTeX command with its leading space (``" \\boxed"``), then
    ``split``: ``free`` (v2) lets all other text between digits be one pre-token that BPE merges freely (``"x+"``,
    ``"{}.\\n"``); ``qwen`` (v3, whose responses are sentences) splits it with Qwen's own regex
    (:data:`QWEN_PRETOKENIZE`: a word keeps its leading space, ``" then"`` -> ``"Ġthen"``, as in Qwen3's vocabulary,
    so the tandem ``word`` schedule sees word openings). Then ``ByteLevel(use_regex=False)``. ``\\boxed{`` is 2
    tokens. Specials: ``<|endoftext|>`` (EOS) and ``<|pad|>``; no BOS, no chat template."""
    from tokenizers import Regex, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    steps = [pre_tokenizers.Digits(individual_digits=True),
             pre_tokenizers.Split(Regex(r" ?\\[A-Za-z]+"), "isolated")]
    if split == "qwen":
        steps.append(pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE), "isolated"))
    elif split != "free":
        raise ValueError(f"tokenizer a split {split!r}: free or qwen")
    pre = pre_tokenizers.Sequence([*steps, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = _bpe(pre, seed, vocab_size, [EOS_A, PAD_A], style=style)
    if split == "qwen":  # as b's: the constant prompt suffix, which the regex would split into ~12 words, is one token
        from tokenizers import AddedToken

        tok.add_tokens([AddedToken(w, normalized=False, lstrip=False, rstrip=False, single_word=False)
                        for w in _suffix_tokens_b()])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_A, pad_token=PAD_A, padding_side="left",
                                   clean_up_tokenization_spaces=False)


def build_tokenizer_b(seed: int = 0, vocab_size: int = 512, style: str = "chain"):
    """``b``: byte-level BPE in the GPT-2 / Llama-3 style: ``Digits(individual_digits=True)`` then
    ``ByteLevel(use_regex=True)`` (the GPT-2 split: letters, digits and punctuation runs never merge
    with each other), trained on a differently seeded corpus with its own vocabulary size, so ids and
    merges differ from ``a``'s throughout. ``\\boxed{`` is 3 tokens (``" \\"``, ``"boxed"``, ``"{"``, as
    in Llama 3). The constant prompt suffix is one added non-special token (:func:`_suffix_tokens_b`).
    Re-tokenized lengths of reference responses: b/a 1.07 (a/b 0.94); the README's table has the
    measured figures. Specials ``<s>`` (unused BOS), ``</s>`` (EOS), ``<pad>``."""
    from tokenizers import AddedToken, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok = _bpe(pre, seed + 7919, vocab_size, [BOS_B, EOS_B, PAD_B], style=style)
    tok.add_tokens([AddedToken(w, normalized=False, lstrip=False, rstrip=False, single_word=False)
                    for w in _suffix_tokens_b()])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_B, pad_token=PAD_B, bos_token=BOS_B,
                                   padding_side="left", clean_up_tokenization_spaces=False)


def build_tokenizer_c(seed: int = 0, vocab_size: int = 384, style: str = "chain"):
    """``c``: a SentencePiece-style BPE in the Gemma manner: spaces become ``"▁"`` (``Metaspace`` with no
    dummy prefix, as Gemma's ``add_dummy_prefix=False``), pieces never span a word boundary (SentencePiece's
    ``split_by_whitespace``) but merge freely across punctuation (``"▁\\boxed{"`` is one token), digits
    always single tokens, a character (not byte) alphabet with ``<unk>`` (a peer's text outside it, e.g. a
    stray byte a byte-level model sampled, re-tokenizes to ``<unk>``, as in a SentencePiece model without
    byte fallback). Trained on a third corpus seed (``seed + 15485``), so its ids and merges differ from
    ``a``'s and ``b``'s; the constant prompt suffix is one added token, as in ``b``. Specials ``<pad>``
    ``<eos>`` ``<bos>`` (unused) ``<unk>``, as Gemma numbers them."""
    import string

    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from graft_cli.data.synthetic import corpus

    tok = Tokenizer(models.BPE(unk_token=UNK_C))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never", split=True),
    ])
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="never", split=False)
    alphabet = sorted(set(string.printable) - set(" \t\r\x0b\x0c") | {"\u2581"})
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD_C, EOS_C, BOS_C, UNK_C],
                                  show_progress=False, initial_alphabet=alphabet)
    tok.train_from_iterator([_prompt_text(p) + s for p, s in corpus(seed + 15485, 4000, style)], trainer)
    tok.add_tokens([AddedToken(w, normalized=False, lstrip=False, rstrip=False, single_word=False)
                    for w in _suffix_tokens_b()])  # as b's: the constant prompt suffix is one token
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_C, pad_token=PAD_C, bos_token=BOS_C,
                                   unk_token=UNK_C, padding_side="left", clean_up_tokenization_spaces=False)


# ----------------------------------------------------------------------------------------------------
# Recipe


@dataclass(frozen=True)
class Shape:
    arch: str  # qwen3 | llama | gpt_neox
    hidden: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    mlp: int = 768
    max_positions: int = 128


@dataclass(frozen=True)
class Stage:
    """One SFT run (or continuation): step budget, optimiser and the skill mix it sees."""

    steps: int
    lr: float
    batch: int
    families: dict
    levels: dict
    warmup: int = 20
    final_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    clip: float = 1.0
    styles: dict | None = None  # solution style -> weight (graft_cli.data.synthetic.STYLES); None: canonical only
    pack: int = 0  # > 0: pack each batch's examples into rows of this many tokens (sft_batch_packed); 0: pad (v2)


# The skill mixes (module docstring, "Structural complementarity"): each model's blind family at 0.01.
_A_FAMS = {"add": 1.0, "sub": 1.0, "lin": 1.0, "mul": 0.6, "two": 0.6, "frac": 0.01}
_B_FAMS = {"add": 0.6, "sub": 0.6, "lin": 0.01, "mul": 1.0, "two": 1.0, "frac": 1.6}
# v3 (issue 27; Recipe.v3): weak, not blind, families
# v3: a is weak at two-step expressions (precedence, brackets: a plan of one word, "multiply first", that a peer's
# worked steps make easy to follow), b at linear equations; each trained well on the other's weak family
_A3_FAMS = {"add": 1.0, "sub": 1.0, "lin": 1.0, "mul": 0.6, "two": 0.05, "frac": 0.6}
_B3_FAMS = {**_B_FAMS, "lin": 0.11}
# c (pair=tiny3): blind on multiplication (both a and b solve it), trained hard on subtraction (b's weakest
# family after its blind one) and well on fractions (a's blind family), so each model's all-fail prompts are
# filled by two peers, some by one of them only
_C_FAMS = {"add": 1.0, "sub": 1.6, "lin": 0.6, "mul": 0.01, "two": 0.6, "frac": 1.0}
# v3 (issue 27): each model writes its own style (graft_cli.data.synthetic.STYLES) and sees a little of its
# peers'; the teacher and junior are a's (its style).
_V3_OWN_STYLES = {"a": "prose", "b": "steps", "c": "words", "teacher": "prose", "junior": "prose"}
_A_STYLES = {"prose": 0.97, "steps": 0.03}
_B_STYLES = {"steps": 0.96, "prose": 0.04}
_C_STYLES = {"words": 0.95, "prose": 0.025, "steps": 0.025}
_V3_TOKENIZER_STYLES = ("prose", "steps", "words")
# The v3 teacher: a's SFT continued on a balanced, harder mix, its logits then scaled x4 (sharpen): an instruct-like
# teacher, confident where its student is unsure. Calibrated on build 5's teacher and junior against SAF-OPD's regime
# (issue 28 item 18: OPD advantages >= 5x GRPO's): mean |A_OPD| / mean |A_GRPO| over the junior's samples was 1.4 as
# trained, 3.2 / 4.9 / 8.5 with the logits x2 / x3 / x5.
_V3_TEACHER_SHARPEN = 4.0
_PACK = 128  # v3's SFT packs each batch into rows of 128 tokens (sft_batch_packed): the padded loss, less work
_ALL_FAMS = {"add": 1.0, "sub": 1.0, "lin": 1.0, "mul": 1.0, "two": 1.0, "frac": 1.0}
_LEVELS = {1: 2.0, 2: 2.0, 3: 1.0}
_TEACHER_LEVELS = {1: 1.0, 2: 2.0, 3: 2.0}


@dataclass(frozen=True)
class Recipe:
    """Everything that determines the built models (with the seed). :meth:`full` is the default;
    :meth:`reduced` is a seconds-long build with the same code path, for tests.

    ``c`` (v2, two builds): MLP 640 with rotary on a quarter of each head (Pythia's) reached pass@1
    0.168 in 120 CPU-s; MLP 768 with full rotary 0.181 in 152 CPU-s: the first was kept.
    Calibration (single-threaded SFT, pass@1 at T=1 on the training distribution): batch 32 beat 16
    and 64 per CPU-second; peak lr 3e-3 fell to pass@1 0.07 where 2e-3 gave 0.15 (3.2M model);
    level weights 2:2:1 (facts first). Skill mixes (v2, one build each, measured with
    ``check_tiny`` on 256-512 prompts): blind weights 0.03 left ``b`` solving linear equations too
    often (all-fail 24%) and ``b``'s fractions at weight 1.0 too rarely mixed on ``a``'s all-fail
    fraction prompts (29%); 0.01 and ``frac`` 1.6 gave both blind spots (README table). ``a`` then
    ``teacher`` (one worker) and ``b`` (the other) take about the same CPU time."""

    shape_a: Shape = Shape("qwen3", 192, 4, 4, 2, 576)
    shape_b: Shape = Shape("llama", 192, 4, 4, 4, 512)
    shape_c: Shape = Shape("gpt_neox", 192, 4, 4, 4, 640)
    stage_a: Stage = Stage(steps=740, lr=2e-3, batch=32, families=_A_FAMS, levels=_LEVELS, warmup=30)
    stage_b: Stage = Stage(steps=780, lr=2e-3, batch=32, families=_B_FAMS, levels=_LEVELS, warmup=30)
    stage_c: Stage = Stage(steps=780, lr=2e-3, batch=32, families=_C_FAMS, levels=_LEVELS, warmup=30)
    stage_teacher: Stage = Stage(steps=220, lr=1.5e-3, batch=32, families=_ALL_FAMS, levels=_TEACHER_LEVELS,
                                 warmup=10)
    junior_step: int = 400  # snapshot of a's run
    train_size: int = 8192
    bpe_vocab: int = 384
    bpe_vocab_b: int = 512
    bpe_vocab_c: int = 384
    name: str = "v2"
    own_styles: dict | None = None  # role -> the style it writes (graft_cli.data.synthetic.STYLES); None: v2's chain
    # the styles every tokenizer's corpus is drawn from (uniformly), as real tokenizers are trained on general text
    # that covers every model's writing; None: each tokenizer on its own model's style (v2)
    tokenizer_styles: tuple | None = None
    split_a: str = "free"  # a's pre-tokenizer between digits (build_tokenizer_a): free (v2) or qwen (v3)
    teacher_sharpen: float = 1.0  # the teacher's logits x this (sharpen): 1 = as trained (v2)

    def own_style(self, role: str) -> str:
        from graft_cli.data.synthetic import CANONICAL_STYLE

        return (self.own_styles or {}).get(role, CANONICAL_STYLE)

    def tokenizer_style(self, role: str):
        """The style(s) of ``role``'s tokenizer corpus: :attr:`tokenizer_styles` (a list) or its own style."""
        return list(self.tokenizer_styles) if self.tokenizer_styles else self.own_style(role)

    @classmethod
    def full(cls) -> Recipe:
        """The v2 pair (the default until 2026-12-03; ``GRAFT_TINY_RECIPE=v2``): one writing style, blind families
        (weight 0.01); :meth:`reduced` and the tests' builds start from it."""
        return cls()

    @classmethod
    def v3(cls) -> Recipe:
        """Tiny pair v3 (issue 27; the default): each model writes its own style (a prose, b steps, c words; the
        teacher and junior a's), sees 3-5% of its peers', and has a weak (not blind) family (a: two-step expressions,
        b: linear equations); a's tokenizer splits words as Qwen's does; SFT packed; the teacher sharpened. Build 7
        (seed 0) meets every regime target (README, "The tiny pair")."""
        base = cls()
        return dataclasses.replace(
            base, name="v3", own_styles=dict(_V3_OWN_STYLES), split_a="qwen", tokenizer_styles=_V3_TOKENIZER_STYLES,
            teacher_sharpen=_V3_TEACHER_SHARPEN,
            stage_a=dataclasses.replace(base.stage_a, families=_A3_FAMS, styles=_A_STYLES, pack=_PACK),
            stage_b=dataclasses.replace(base.stage_b, families=_B3_FAMS, styles=_B_STYLES, pack=_PACK),
            stage_c=dataclasses.replace(base.stage_c, steps=1000, styles=_C_STYLES, pack=_PACK),
            stage_teacher=dataclasses.replace(base.stage_teacher, styles=_A_STYLES, pack=_PACK))

    @classmethod
    def named(cls, name: str) -> Recipe:
        """The recipe called ``name`` (:data:`RECIPES`); a one-line error naming the known ones otherwise."""
        if name not in RECIPES:
            from graft_cli.errors import GraftError

            raise GraftError(f"tiny recipe {name!r}: unknown; known: {', '.join(RECIPES)} "
                             f"(GRAFT_TINY_RECIPE or graft tiny build --recipe)")
        return getattr(cls, RECIPES[name])()

    @classmethod
    def reduced(cls, steps: int = 30) -> Recipe:
        small_a = Shape("qwen3", 64, 2, 2, 1, 128)
        small_b = Shape("llama", 64, 2, 2, 2, 128)
        small_c = Shape("gpt_neox", 64, 2, 2, 2, 128)
        return cls(shape_a=small_a, shape_b=small_b, shape_c=small_c,
                   stage_a=dataclasses.replace(cls.stage_a, steps=steps, batch=16, warmup=3),
                   stage_b=dataclasses.replace(cls.stage_b, steps=steps, batch=16, warmup=3),
                   stage_c=dataclasses.replace(cls.stage_c, steps=steps, batch=16, warmup=3),
                   stage_teacher=dataclasses.replace(cls.stage_teacher, steps=max(2, steps // 3), batch=16,
                                                                     warmup=2),
                   junior_step=max(1, steps // 3), train_size=512)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        return json.loads(json.dumps(d))  # int level keys -> str, JSON-safe

    @classmethod
    def from_dict(cls, d: dict) -> Recipe:
        def stage(x):
            return Stage(**{**x, "levels": {int(k): v for k, v in x["levels"].items()}})

        return cls(shape_a=Shape(**d["shape_a"]), shape_b=Shape(**d["shape_b"]), shape_c=Shape(**d["shape_c"]),
                   stage_a=stage(d["stage_a"]), stage_b=stage(d["stage_b"]), stage_c=stage(d["stage_c"]),
                   stage_teacher=stage(d["stage_teacher"]), junior_step=d["junior_step"],
                   train_size=d["train_size"], bpe_vocab=d["bpe_vocab"], bpe_vocab_b=d["bpe_vocab_b"],
                   bpe_vocab_c=d["bpe_vocab_c"], name=d.get("name", "v2"), own_styles=d.get("own_styles"),
                   split_a=d.get("split_a", "free"), teacher_sharpen=d.get("teacher_sharpen", 1.0),
                   tokenizer_styles=tuple(d["tokenizer_styles"]) if d.get("tokenizer_styles") else None)


RECIPES = {"v2": "full", "v3": "v3"}


def default_recipe() -> Recipe:
    """``$GRAFT_TINY_RECIPE`` (default ``v3``, the pair in the GRAFT paper's regime; ``v2`` the earlier pair of the
    studies published before 2026-12-03): the recipe :func:`build_tiny` / :func:`ensure_tiny` build."""
    return Recipe.named(os.environ.get("GRAFT_TINY_RECIPE") or "v3")


# ----------------------------------------------------------------------------------------------------
# Models


def make_config(shape: Shape, tokenizer):
    from transformers import GPTNeoXConfig, LlamaConfig, Qwen3Config

    common = dict(vocab_size=len(tokenizer), hidden_size=shape.hidden, intermediate_size=shape.mlp,
                  num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                  num_key_value_heads=shape.kv_heads, max_position_embeddings=shape.max_positions,
                  tie_word_embeddings=True, rope_theta=10000.0, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id)
    if shape.arch == "qwen3":
        return Qwen3Config(head_dim=shape.hidden // shape.heads, **common)
    if shape.arch == "llama":
        return LlamaConfig(**common)
    if shape.arch == "gpt_neox":  # parallel attention + MLP residual, LayerNorm, rotary on a quarter of each head
        common.pop("num_key_value_heads")
        common.pop("rope_theta")
        return GPTNeoXConfig(rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                              "partial_rotary_factor": 0.25}, **common)
    raise ValueError(f"unknown tiny architecture {shape.arch!r}")


def make_model(shape: Shape, tokenizer, seed: int):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(make_config(shape, tokenizer), dtype=torch.float32)
    gc = model.generation_config
    gc.eos_token_id, gc.pad_token_id, gc.bos_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id, None
    return model


def sharpen(model, factor: float) -> None:
    """Scale ``model``'s output logits by ``factor`` (its distribution at temperature 1/factor), in its weights: the
    final norm's weight times ``factor`` (the LM head is linear without bias after it, so the logits scale exactly;
    tied embeddings are left as they are). 1 leaves the model unchanged."""
    if factor == 1.0:
        return
    norm = model.get_decoder().norm if hasattr(model.get_decoder(), "norm") else model.get_decoder().final_layer_norm
    with torch.no_grad():
        norm.weight.mul_(factor)
        if getattr(norm, "bias", None) is not None:
            norm.bias.mul_(factor)


def weight_hash(model) -> str:
    """SHA-256 over the state dict (names, dtypes, shapes and bytes, in sorted key order)."""
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        t = v.detach().cpu().contiguous()
        h.update(f"{k}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def num_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------------------------------
# SFT


def _lr_at(stage: Stage, step: int) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``final_lr_ratio * lr`` (step is 0-based)."""
    if step < stage.warmup:
        return stage.lr * (step + 1) / stage.warmup
    span = max(1, stage.steps - stage.warmup)
    prog = min(1.0, (step - stage.warmup) / span)
    return stage.lr * (stage.final_lr_ratio + (1 - stage.final_lr_ratio) * 0.5 * (1 + math.cos(math.pi * prog)))


def sft_batch(tokenizer, examples: list[tuple[str, str]]):
    """Right-padded ``(input_ids, attention_mask, labels)`` for (problem, solution) pairs: the prompt
    is :class:`PromptSpec` text, the target the solution + EOS; labels are -100 except on the target."""
    prompts = tokenizer([_prompt_text(p) for p, _ in examples], add_special_tokens=False)["input_ids"]
    targets = tokenizer([s for _, s in examples], add_special_tokens=False)["input_ids"]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    seqs = [(p, t + [eos]) for p, t in zip(prompts, targets)]
    L = max(len(p) + len(t) for p, t in seqs)
    ids = torch.full((len(seqs), L), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    labels = torch.full((len(seqs), L), -100, dtype=torch.long)
    for i, (p, t) in enumerate(seqs):
        n = len(p) + len(t)
        ids[i, :n] = torch.tensor(p + t)
        mask[i, :n] = 1
        labels[i, len(p):n] = torch.tensor(t)
    return ids, mask, labels


def sft_batch_packed(tokenizer, examples: list[tuple[str, str]], row_len: int):
    """The examples of :func:`sft_batch` packed into rows of ``row_len`` tokens, in order (a row takes the next
    example while it fits; an example longer than a row gets a row of its own): ``(input_ids, position_ids,
    labels)``. Positions restart at 0 with every example, which is how transformers recognises packed sequences and
    masks attention block-diagonally (each example sees only itself, as in a padded batch), so the loss is the
    padded batch's (same tokens, same labels) without computing the padding: ~30% less SFT work on the v3 styles'
    ~20-60-token examples. Padding fills each row's tail (label -100, positions counting on)."""
    prompts = tokenizer([_prompt_text(p) for p, _ in examples], add_special_tokens=False)["input_ids"]
    targets = tokenizer([s for _, s in examples], add_special_tokens=False)["input_ids"]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    rows: list[list[tuple[list[int], int]]] = [[]]
    used = 0
    for p, t in zip(prompts, targets):
        seq = p + t + [eos]
        if rows[-1] and used + len(seq) > row_len:
            rows.append([])
            used = 0
        rows[-1].append((seq, len(p)))
        used += len(seq)
    L = max(row_len, max(sum(len(q) for q, _ in r) for r in rows))
    ids = torch.full((len(rows), L), pad, dtype=torch.long)
    pos = torch.zeros((len(rows), L), dtype=torch.long)
    labels = torch.full((len(rows), L), -100, dtype=torch.long)
    for i, row in enumerate(rows):
        at = 0
        for seq, np_ in row:
            n = len(seq)
            ids[i, at:at + n] = torch.tensor(seq)
            pos[i, at:at + n] = torch.arange(n)
            labels[i, at + np_:at + n] = torch.tensor(seq[np_:])
            at += n
        pos[i, at:] = torch.arange(L - at)
    return ids, pos, labels


def _example_stream(tokenizer, stage: Stage, rng: random.Random):
    """Batches of fresh SFT examples drawn i.i.d. from the stage's mix.

    Not grouped by length: sorting a pool of batches by length (HF's ``group_by_length``) cut padded
    tokens by ~20 %, but a length-homogeneous batch is nearly a single skill (level-1 facts vs
    level-3 fractions), and a calibration build trained that way ended at a third of the pass@1."""
    from graft_cli.data.synthetic import sft_example

    while True:
        yield [sft_example(rng, stage.families, stage.levels, stage.styles) for _ in range(stage.batch)]


def sft(model, tokenizer, stage: Stage, data_seed: str, on_step=None, snapshot_at: dict | None = None):
    """Supervised pretraining on freshly generated worked solutions (never repeats a batch).

    Loss: token-mean cross-entropy over response tokens + EOS. AdamW (betas 0.9/0.98, fused CPU
    kernel), gradient clipping, :func:`_lr_at` schedule, i.i.d. batches (:func:`_example_stream`).
    Batch 32 beat 16 and 64 per CPU-second in the calibration runs.
    ``snapshot_at`` maps a step count to a callback receiving the model after that many steps (the
    junior). Returns the list of per-step losses."""
    rng = random.Random(data_seed)
    stream = _example_stream(tokenizer, stage, rng)
    opt = torch.optim.AdamW(model.parameters(), lr=stage.lr, betas=(0.9, 0.98), eps=1e-8,
                            weight_decay=stage.weight_decay, fused=True)
    model.train()
    losses = []
    for step in range(stage.steps):
        for g in opt.param_groups:
            g["lr"] = _lr_at(stage, step)
        if stage.pack:
            ids, pos, labels = sft_batch_packed(tokenizer, next(stream), stage.pack)
            logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        else:
            ids, mask, labels = sft_batch(tokenizer, next(stream))
            logits = model(input_ids=ids, attention_mask=mask).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)),
                                                 labels[:, 1:].reshape(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), stage.clip)
        opt.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step + 1, stage.steps, losses[-1])
        if snapshot_at and (step + 1) in snapshot_at:
            snapshot_at[step + 1](model)
    model.eval()
    return losses


@torch.no_grad()
def eval_loss(model, tokenizer, families: dict, levels: dict, seed: int = 12345, n: int = 256) -> float:
    """Mean response-token loss on ``n`` fresh examples of a mix (used by tests and the summary)."""
    from graft_cli.data.synthetic import sft_example

    rng = random.Random(f"graft-tiny-evalloss:{seed}")
    ids, mask, labels = sft_batch(tokenizer, [sft_example(rng, families, levels) for _ in range(n)])
    logits = model(input_ids=ids, attention_mask=mask).logits
    return float(torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)),
                                                   labels[:, 1:].reshape(-1), ignore_index=-100))


# ----------------------------------------------------------------------------------------------------
# Build jobs (run in worker processes, or in-process one after the other)


@contextlib.contextmanager
def _deterministic_single_thread():
    threads = torch.get_num_threads()
    det = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det)


def _save(model, tokenizer, out: str) -> str:
    if os.path.isdir(out):
        shutil.rmtree(out)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return weight_hash(model)


def _job(kind: str, recipe: Recipe, seed: int, cache_dir: str, report) -> dict:
    """``kind`` 'a': tokenizer A, model a (snapshot -> junior), then the teacher; 'b': model b.
    ``report(role, step, total, loss)`` is called as training proceeds. Returns role -> info."""
    import copy

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    out: dict = {}
    cpu0 = time.process_time()
    with _deterministic_single_thread():
        if kind == "a":
            tok = build_tokenizer_a(seed, recipe.bpe_vocab, recipe.tokenizer_style("a"), recipe.split_a)
            model = make_model(recipe.shape_a, tok, seed * 1000 + 1)

            def snap(m):
                out["junior"] = {"hash": _save(m, tok, os.path.join(cache_dir, "junior")), "steps": recipe.junior_step,
                                 "arch": recipe.shape_a.arch, "tokenizer": "a", "params": num_params(m)}

            t0 = time.time()
            la = sft(model, tok, recipe.stage_a, f"graft-tiny-sft:{seed}:a",
                     on_step=lambda s, n, loss: report("a", s, n, loss), snapshot_at={recipe.junior_step: snap})
            out["a"] = {"hash": _save(model, tok, os.path.join(cache_dir, "a")), "steps": recipe.stage_a.steps,
                        "final_loss": sum(la[-10:]) / len(la[-10:]), "arch": recipe.shape_a.arch, "tokenizer": "a",
                        "params": num_params(model), "seconds": time.time() - t0}
            out["junior"]["final_loss"] = la[recipe.junior_step - 1]
            t0 = time.time()
            teacher = copy.deepcopy(model)
            lt = sft(teacher, tok, recipe.stage_teacher, f"graft-tiny-sft:{seed}:teacher",
                     on_step=lambda s, n, loss: report("teacher", s, n, loss))
            sharpen(teacher, recipe.teacher_sharpen)
            out["teacher"] = {"hash": _save(teacher, tok, os.path.join(cache_dir, "teacher")),
                              "steps": recipe.stage_a.steps + recipe.stage_teacher.steps,
                              "final_loss": sum(lt[-10:]) / len(lt[-10:]), "arch": recipe.shape_a.arch,
                              "tokenizer": "a", "params": num_params(teacher), "seconds": time.time() - t0}
        elif kind in ("b", "c"):
            build_tok, vocab, shape, stage, salt = {
                "b": (build_tokenizer_b, recipe.bpe_vocab_b, recipe.shape_b, recipe.stage_b, 2),
                "c": (build_tokenizer_c, recipe.bpe_vocab_c, recipe.shape_c, recipe.stage_c, 3)}[kind]
            tok = build_tok(seed, vocab, recipe.tokenizer_style(kind))
            model = make_model(shape, tok, seed * 1000 + salt)
            t0 = time.time()
            lb = sft(model, tok, stage, f"graft-tiny-sft:{seed}:{kind}",
                     on_step=lambda s, n, loss: report(kind, s, n, loss))
            out[kind] = {"hash": _save(model, tok, os.path.join(cache_dir, kind)), "steps": stage.steps,
                         "final_loss": sum(lb[-10:]) / len(lb[-10:]), "arch": shape.arch, "tokenizer": kind,
                         "params": num_params(model), "seconds": time.time() - t0}
        else:
            raise ValueError(kind)
    for info in out.values():
        info["job_cpu_seconds"] = time.process_time() - cpu0  # CPU time of the whole job (contention-free)
    return out


def _worker_main(argv: list[str]) -> None:
    """Entry point of a build worker process: ``python -m graft_cli.models.tiny _worker KIND SEED DIR RECIPE``.

    Workers are fresh interpreters started with :mod:`subprocess` (not :mod:`multiprocessing`, whose
    spawn/forkserver start methods re-import the caller's ``__main__``, which can deadlock or rebuild
    when the caller is an unguarded script). They speak one JSON object per stdout line."""
    kind, seed, cache_dir, recipe_json = argv
    torch.set_num_threads(1)
    last = [0.0]

    def emit(obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    def report(role, step, total, loss):
        now = time.time()
        if step == total or now - last[0] > 0.5:
            last[0] = now
            emit({"progress": [role, step, total, loss]})

    emit({"done": _job(kind, Recipe.from_dict(json.loads(recipe_json)), int(seed), cache_dir, report)})


# ----------------------------------------------------------------------------------------------------
# Build / ensure


def _stage_totals(recipe: Recipe) -> dict:
    return {"a": recipe.stage_a.steps, "b": recipe.stage_b.steps, "c": recipe.stage_c.steps,
            "teacher": recipe.stage_teacher.steps}


@contextlib.contextmanager
def _progress(enabled: bool, recipe: Recipe):
    if not enabled:
        yield lambda role, step, total, loss: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    prog = Progress(TextColumn("[bold]{task.fields[role]:>8}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(),
                    console=make_console(stderr=True), transient=False)
    tasks = {r: prog.add_task("", total=n, role=f"sft {r}", loss="-") for r, n in _stage_totals(recipe).items()}
    with prog:
        def update(role, step, total, loss):
            prog.update(tasks[role], completed=step, loss=f"{loss:.3f}")

        yield update


@contextlib.contextmanager
def _lock(cache_dir: str):
    os.makedirs(cache_dir, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(os.path.join(cache_dir, ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _file_hash(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def _manifest_path(cache_dir: str) -> str:
    return os.path.join(cache_dir, "manifest.json")


def _paths(cache_dir: str) -> dict[str, str]:
    out = {r: os.path.join(cache_dir, r) for r in ROLES}
    out["task"] = os.path.join(cache_dir, "task")
    return out


def read_manifest(cache_dir: str | None = None) -> dict | None:
    path = _manifest_path(cache_dir or default_cache_dir())
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def token_stats(paths: dict, n: int = 512, seed: int = 0, recipe: Recipe | None = None) -> dict:
    """Mean/max prompt and reference-response (+EOS) token counts under each tokenizer, the share of responses
    whose token counts differ between a and b, and the re-tokenized length ratios ``ratio_{y}_over_{x}``: x's
    reference responses re-tokenized with y's tokenizer over their length under x's. Reference responses are the
    training split's solutions when every model writes the canonical style (v2); with ``recipe``'s own styles
    (v3) each model's responses are ``n`` fresh problems written in its own style."""
    from transformers import AutoTokenizer

    from graft_cli.data import synthetic

    recs = read_jsonl(os.path.join(paths["task"], "train.jsonl"))[:n]
    styled = recipe is not None and bool(recipe.own_styles)
    if styled:
        rng = random.Random(f"graft-tiny-token-stats:{seed}")
        worked = [synthetic.sample_problem(rng)["worked"] for _ in range(n)]  # the training mix
        texts = {r: [synthetic.render(w, recipe.own_style(r)) for w in worked] for r in POLICY_ROLES}
        prompts = [w[0] for w in worked]
    else:
        texts = {r: [x["solution"] for x in recs] for r in POLICY_ROLES}
        prompts = [x["problem"] for x in recs]
    toks = {tk: AutoTokenizer.from_pretrained(paths[tk]) for tk in POLICY_ROLES}
    out: dict = {}
    counts = {}  # counts[(x, y)]: x's responses under y's tokenizer (+EOS)
    for tk, tok in toks.items():
        p = [len(x) for x in tok([_prompt_text(q) for q in prompts], add_special_tokens=False)["input_ids"]]
        for x in POLICY_ROLES:
            counts[(x, tk)] = [len(i) + 1 for i in tok(texts[x], add_special_tokens=False)["input_ids"]]
        s = counts[(tk, tk)]
        out[f"tokens_prompt_{tk}"] = sum(p) / len(p)
        out[f"tokens_response_{tk}"] = sum(s) / len(s)
        out[f"tokens_response_max_{tk}"] = max(s)
        out[f"tokens_total_max_{tk}"] = max(a + b for a, b in zip(p, s))
        out[f"vocab_{tk}"] = len(tok)
    out["response_len_differs"] = sum(x != y for x, y in zip(counts[("a", "a")], counts[("a", "b")])) / len(prompts)
    for x in POLICY_ROLES:
        for y in POLICY_ROLES:
            if x != y:
                out[f"ratio_{y}_over_{x}"] = sum(counts[(x, y)]) / sum(counts[(x, x)])
    return out


def build_tiny(cache_dir: str | None = None, seed: int = 0, force: bool = False, progress: bool = True,
               recipe: Recipe | None = None, workers: int = 2) -> dict[str, str]:
    """Build (or reuse) the tiny models (a, b, c, teacher, junior) and task under ``cache_dir``.

    Returns role -> folder for each of :data:`ROLES` and ``task``. An existing cache whose manifest
    matches (version, seed, recipe) is reused unless ``force``. ``workers >= 2`` trains the three
    tokenizer families (:data:`JOBS`) in single-threaded spawned processes at once; ``workers=1`` runs
    the same jobs in-process (identical weights)."""
    from graft_cli.data.synthetic import write_task

    cache_dir = os.path.abspath(cache_dir or default_cache_dir())
    recipe = recipe or default_recipe()
    paths = _paths(cache_dir)
    with _lock(cache_dir):
        man = read_manifest(cache_dir)
        if not force and _manifest_ok(man, cache_dir, seed, recipe):
            return paths
        with contextlib.suppress(FileNotFoundError):
            os.remove(_manifest_path(cache_dir))
        t0 = time.time()
        task_paths = write_task(paths["task"], seed=seed, train_size=recipe.train_size)
        results: dict = {}
        with _progress(progress, recipe) as update:
            if workers <= 1:
                for kind in JOBS:
                    results.update(_job(kind, recipe, seed, cache_dir, update))
            else:
                results.update(_run_parallel(recipe, seed, cache_dir, update))
        stats = token_stats(paths, recipe=recipe)
        manifest = {
            "version": TINY_VERSION, "seed": seed, "recipe": recipe.to_dict(),
            "models": results, "hashes": {r: results[r]["hash"] for r in ROLES},
            "task": {k: {"path": os.path.relpath(v, cache_dir), "sha256": _file_hash(v)}
                     for k, v in task_paths.items()},
            "token_stats": stats, "build_seconds": time.time() - t0,
            "max_new_tokens": _suggest_max_new_tokens(stats),
        }
        from graft_cli.rundir import atomic_write_text

        atomic_write_text(_manifest_path(cache_dir), json.dumps(manifest, indent=1))
    return paths


def _suggest_max_new_tokens(stats: dict) -> int:
    """The rollout budget the check samples with: 48 tokens when every reference response fits in 40 (v2, whose
    studies were measured at 48), else the longest plus a third, rounded up to a multiple of 16 (v3: 64)."""
    longest = max((v for k, v in stats.items() if k.startswith("tokens_response_max_")), default=0)
    if longest <= 40:
        return 48
    return int(math.ceil(longest * 4 / 3 / 16) * 16)


# The build's jobs: 'a' (a, its junior snapshot, then the teacher), 'b', 'c'. Each is ~780-960 single-threaded
# SFT steps; on 2 cores the three workers share the cores (the build's wall time is ~their CPU time / 2).
JOBS = ("a", "b", "c")


def _run_parallel(recipe: Recipe, seed: int, cache_dir: str, update) -> dict:
    """Run the build's jobs (:data:`JOBS`) in single-threaded worker interpreters at once; relay progress."""
    import selectors
    import subprocess
    import tempfile

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    pypath = [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join(pypath))
    procs = {}
    sel = selectors.DefaultSelector()
    errs = {}
    try:
        for kind in JOBS:
            errs[kind] = tempfile.TemporaryFile()
            p = subprocess.Popen([sys.executable, "-m", "graft_cli.models.tiny", "_worker", kind, str(seed), cache_dir,
                                  json.dumps(recipe.to_dict())], stdout=subprocess.PIPE, stderr=errs[kind], env=env,
                                 cwd=root)
            procs[kind] = p
            sel.register(p.stdout, selectors.EVENT_READ, kind)
        results: dict = {}
        open_streams = len(procs)
        while open_streams:
            for key, _ in sel.select(timeout=1.0):
                line = key.fileobj.readline()
                if not line:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                    continue
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue  # stray output of a library
                if "progress" in msg:
                    update(*msg["progress"])
                elif "done" in msg:
                    results[key.data] = msg["done"]
        for kind, p in procs.items():
            if p.wait() != 0 or kind not in results:
                errs[kind].seek(0)
                tail = errs[kind].read().decode(errors="replace")[-3000:]
                raise RuntimeError(f"tiny build worker {kind!r} failed (exit code {p.returncode}):\n{tail}")
        return {role: info for kind in JOBS for role, info in results[kind].items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in errs.values():
            f.close()


def _manifest_ok(man: dict | None, cache_dir: str, seed: int, recipe: Recipe) -> bool:
    if not man or man.get("version") != TINY_VERSION or man.get("seed") != seed:
        return False
    if man.get("recipe") != recipe.to_dict():
        return False
    for r in ROLES:
        d = os.path.join(cache_dir, r)
        if not (os.path.isfile(os.path.join(d, "config.json")) and os.path.isfile(os.path.join(d, "tokenizer.json"))):
            return False
    return all(os.path.isfile(os.path.join(cache_dir, t["path"])) for t in man.get("task", {}).values())


def ensure_tiny(cache_dir: str | None = None, seed: int = 0, progress: bool = True,
                recipe: Recipe | None = None) -> dict:
    """Role -> folder of a complete tiny cache, building it first if missing or half-built."""
    return build_tiny(cache_dir, seed=seed, force=False, progress=progress, recipe=recipe)


# ----------------------------------------------------------------------------------------------------
# Measurement


def sample_groups(model, tokenizer, problems: list[str], n: int = 8, seed: int = 0, max_new_tokens: int = 48,
                  temperature: float = 1.0):
    """Sample ``n`` responses per problem with the project's rollout engine (prompt-major)."""
    from graft_cli.data.prompts import PromptSpec
    from graft_cli.rollout.base import SamplingParams
    from graft_cli.rollout.hf import HFEngine

    spec = PromptSpec()
    prompt_ids = [spec.encode(p, tokenizer) for p in problems]
    eng = HFEngine(model, tokenizer)
    return eng.generate(prompt_ids, SamplingParams(n=n, temperature=temperature, top_p=1.0,
                                                   max_new_tokens=max_new_tokens, seed=seed))


def check_tiny(paths: dict, num_prompts: int = 256, n: int = 8, seed: int = 0, roles=ROLES,
               max_new_tokens: int = 48, heldout: int = 500, grader=None, threads: int = 1) -> dict:
    """Measured properties of a built cache on the training distribution (first ``num_prompts``
    records of ``train.jsonl``), sampling at T = 1.0, ``n`` samples per prompt, fixed seed, with the
    project's rollout engine (:class:`~graft_cli.rollout.hf.HFEngine`), graded by the math-verify
    reward. Per role: ``pass1``, ``all_fail``, ``all_pass``, per-family and per-level pass@1,
    truncation rate, mean response tokens, and ``math500_pass1`` (one sample on the first
    ``heldout`` problems of ``eval_math500.jsonl``; 0 skips it). Pair: ``comp_a_fail_b_mixed`` (share
    of a's all-fail prompts on which b's group has 1 <= k < n) and ``comp_b_fail_a_mixed``.
    Sampling runs on ``threads`` threads (1 is as fast for 3M models and immune to oversubscription)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from graft_cli.reward import make_grader

    recs = read_jsonl(os.path.join(paths["task"], "train.jsonl"))[:num_prompts]
    held = read_jsonl(os.path.join(paths["task"], "eval_math500.jsonl"))[:heldout]
    own = grader is None
    grader = grader or make_grader(num_workers=2, timeout_s=5)
    out: dict = {"num_prompts": len(recs), "n": n, "seed": seed, "temperature": 1.0}
    ks: dict = {}
    from graft_cli.data.synthetic import CANONICAL_STYLE

    built_recipe = (read_manifest(os.path.dirname(paths["a"])) or {}).get("recipe") or {}
    own_styles = built_recipe.get("own_styles") or {}
    side: dict = {}  # a and b: what the regime measurement (tiny_regime.measure_regime) needs
    rewards: dict = {}
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for role in roles:
            tok = AutoTokenizer.from_pretrained(paths[role])
            model = AutoModelForCausalLM.from_pretrained(paths[role], dtype=torch.float32)
            t0 = time.time()
            ro = sample_groups(model, tok, [r["problem"] for r in recs], n=n, seed=seed, max_new_tokens=max_new_tokens)
            gen_s = time.time() - t0
            rew = grader.grade(ro.texts, [r["answer"] for r in recs for _ in range(n)]).rewards
            rew = [float(x) for x in rew]
            k = [int(round(sum(rew[i * n:(i + 1) * n]))) for i in range(len(recs))]
            ks[role] = k
            if role in ("a", "b"):
                side[role] = {"model": model, "tokenizer": tok, "prompt_ids": ro.prompt_ids, "rollouts": ro,
                              "style": own_styles.get(role, CANONICAL_STYLE)}
                rewards[role] = rew
            fam: dict = {}
            lev: dict = {}
            for r, kk in zip(recs, k):
                fam.setdefault(r["family"], []).append(kk / n)
                lev.setdefault(str(r["level"]), []).append(kk / n)
            res = {
                "pass1": sum(rew) / len(rew),
                "all_fail": sum(x == 0 for x in k) / len(k),
                "all_pass": sum(x == n for x in k) / len(k),
                "family_pass1": {f: sum(v) / len(v) for f, v in sorted(fam.items())},
                "level_pass1": {f: sum(v) / len(v) for f, v in sorted(lev.items())},
                "truncated": sum(ro.truncated) / len(ro.truncated),
                "response_tokens": sum(len(x) for x in ro.response_ids) / len(ro.response_ids),
                "sample_seconds": gen_s,
            }
            if held:
                ro_h = sample_groups(model, tok, [r["problem"] for r in held], n=1, seed=seed,
                                     max_new_tokens=max_new_tokens)
                rh = grader.grade(ro_h.texts, [r["answer"] for r in held]).rewards
                res["math500_pass1"] = float(sum(rh)) / len(rh)
            out[role] = res
    finally:
        torch.set_num_threads(prev_threads)
        if own:
            grader.close()
    if "a" in ks and "b" in ks:
        out["comp_a_fail_b_mixed"] = _comp(ks["a"], ks["b"], n)
        out["comp_b_fail_a_mixed"] = _comp(ks["b"], ks["a"], n)
        out["families"] = family_complementarity([r["family"] for r in recs], ks["a"], ks["b"], n)
        from graft_cli.models.tiny_regime import measure_regime

        out["regime"] = measure_regime(side, [r["family"] for r in recs], rewards, weak_families(built_recipe, out), n)
    peers = {r: ks[r] for r in POLICY_ROLES if r in ks}
    if len(peers) >= 3:
        out["peer_fills"] = peer_fills(peers, n)
        out["peer_fills_by_family"] = {f: peer_fills(peers, n, idx)
                                       for f, idx in _family_index([r["family"] for r in recs]).items()}
    return out


def weak_families(recipe: dict, props: dict) -> dict[str, str]:
    """Each of a and b's weak family: the family of smallest weight in its SFT mix (``recipe``: the built cache's,
    as its manifest holds it), declared before anything is measured; without one, the family of lowest measured
    pass@1."""
    out = {}
    for r in ("a", "b"):
        fams = (recipe.get(f"stage_{r}") or {}).get("families")
        out[r] = (min(fams, key=lambda f: (fams[f], f)) if fams
                  else min(props[r]["family_pass1"], key=props[r]["family_pass1"].get))
    return out


def _family_index(families: list[str]) -> dict[str, list[int]]:
    """family -> the indices of its prompts, families in sorted order."""
    out: dict[str, list[int]] = {}
    for i, f in enumerate(families):
        out.setdefault(f, []).append(i)
    return dict(sorted(out.items()))


def peer_fills(ks: dict, n: int, index: list[int] | None = None) -> dict:
    """Who can fill whose all-fail prompts, among N >= 2 models. ``ks`` maps a model to its per-prompt success
    counts in groups of ``n`` (``index``: the prompts counted, default all). Per receiver X: ``all_fail`` (share
    of the prompts), and on X's all-fail prompts ``any`` (some peer's group mixed, 1 <= k < n), ``mixed[Y]``
    (Y's group mixed) and ``only[Y]`` (Y's mixed and no other peer's): the prompts only Y can fill."""
    index = list(range(len(next(iter(ks.values()))))) if index is None else index
    out = {}
    for x, kx in ks.items():
        fail = [i for i in index if kx[i] == 0]
        others = [y for y in ks if y != x]
        mixed = {y: [1 <= ks[y][i] < n for i in fail] for y in others}
        share = (lambda flags: sum(flags) / len(flags) if flags else 0.0)
        out[x] = {"n_prompts": len(index), "all_fail": len(fail) / len(index) if index else 0.0,
                  "any": share([any(mixed[y][j] for y in others) for j in range(len(fail))]),
                  "mixed": {y: share(mixed[y]) for y in others},
                  "only": {y: share([mixed[y][j] and not any(mixed[z][j] for z in others if z != y)
                                     for j in range(len(fail))]) for y in others}}
    return out


def family_complementarity(families: list[str], k_a: list[int], k_b: list[int], n: int) -> dict:
    """Per skill family: each model's all-fail rate and, on its all-fail prompts, the share on which
    the peer's group is mixed (1 <= k < n): the prompts GRAFT can graft on. ``k_*`` are the per-prompt
    success counts of groups of ``n``; returns family -> {n_prompts, all_fail_a, all_fail_b,
    peer_mixed_a (b mixed on a's all-fail), peer_mixed_b}."""
    out = {}
    for fam, idx in _family_index(families).items():
        f = peer_fills({"a": k_a, "b": k_b}, n, idx)
        out[fam] = {"n_prompts": len(idx), "all_fail_a": f["a"]["all_fail"], "all_fail_b": f["b"]["all_fail"],
                    "peer_mixed_a": f["a"]["mixed"]["b"], "peer_mixed_b": f["b"]["mixed"]["a"]}
    return out


def blind_spots(families: dict, all_fail_min: float | None = None, peer_mixed_min: float | None = None) -> dict:
    """Per model, the families that are structural blind spots: all-fail rate >= ``all_fail_min`` and the
    peer's group mixed on >= ``peer_mixed_min`` of those prompts (defaults: :data:`TARGETS`, 60% and 40%)."""
    all_fail_min = TARGETS["blind_all_fail"] if all_fail_min is None else all_fail_min
    peer_mixed_min = TARGETS["blind_peer_mixed"] if peer_mixed_min is None else peer_mixed_min
    return {r: [f for f, v in families.items() if v[f"all_fail_{r}"] >= all_fail_min
                and v[f"peer_mixed_{r}"] >= peer_mixed_min] for r in ("a", "b")}


def _comp(k_fail: list[int], k_other: list[int], n: int) -> float:
    """Share of the first model's all-fail prompts on which the other's group is mixed (:func:`peer_fills`)."""
    return peer_fills({"x": k_fail, "y": k_other}, n)["x"]["mixed"]["y"]


TARGETS = {"pass1": (0.15, 0.60), "all_fail": (0.15, 0.60), "comp": 0.10, "comp_one_way": 0.20,
           "blind_all_fail": 0.60, "blind_peer_mixed": 0.40, "only_fill": 0.05, "ratio": (0.85, 1.18)}


def targets_met(props: dict) -> dict:
    """Which of the pair's targets hold for measured ``props``: pass@1 and all-fail bands for a and b;
    complementarity >= 10 % both ways and >= 20 % one way; re-tokenized length ratios in [0.85, 1.18] both
    ways (with ``props["token_stats"]``); and each model's regime targets (``props["regime"]``:
    :data:`graft_cli.models.tiny_regime.REGIME_TARGETS`). v2's blind-spot targets are reported
    (:func:`blind_spots`) but no longer required."""
    lo, hi = TARGETS["pass1"]
    flo, fhi = TARGETS["all_fail"]
    met = {}
    for r in POLICY_ROLES:
        if r in props:
            met[f"{r}_pass1"] = lo <= props[r]["pass1"] <= hi
            met[f"{r}_all_fail"] = flo <= props[r]["all_fail"] <= fhi
    comps = [props[k] for k in ("comp_a_fail_b_mixed", "comp_b_fail_a_mixed") if k in props]
    for key in ("comp_a_fail_b_mixed", "comp_b_fail_a_mixed"):
        if key in props:
            met[key] = props[key] >= TARGETS["comp"]
    if len(comps) == 2:
        met["comp_one_way_20"] = max(comps) >= TARGETS["comp_one_way"]
    ts = props.get("token_stats") or {}
    for x in ("a", "b"):  # re-tokenized length ratios (v2's target, kept)
        for y in ("a", "b"):
            key = f"ratio_{y}_over_{x}"
            if x != y and key in ts:
                met[key] = TARGETS["ratio"][0] <= ts[key] <= TARGETS["ratio"][1]
    reg = props.get("regime") or {}
    for r in ("a", "b"):  # v3's regime (tiny_regime.REGIME_TARGETS), replacing v2's blind spots
        for k, ok in (reg.get(r) or {}).get("met", {}).items():
            met[f"{r}_{k}"] = bool(ok)
    for x, v in props.get("peer_fills", {}).items():  # three models: each peer alone fills some of x's prompts
        for y, share in v["only"].items():
            met[f"{x}_only_{y}_fills"] = share >= TARGETS["only_fill"]
    return met


# ----------------------------------------------------------------------------------------------------
# CLI entry point


def _summary_table(man: dict):
    from rich.table import Table

    t = Table(title=f"tiny pair (seed {man['seed']}, built in {man['build_seconds']:.0f} s)")
    for c in ("role", "arch", "tokenizer", "params", "SFT steps", "final loss", "weights sha256"):
        t.add_column(c)
    for r in ROLES:
        m = man["models"][r]
        t.add_row(r, m["arch"], m["tokenizer"], f"{m['params'] / 1e6:.2f}M", str(m["steps"]),
                  f"{m.get('final_loss', float('nan')):.3f}", m["hash"][:12])
    return t


def _props_table(props: dict):
    from rich.table import Table

    t = Table(title=f"measured on {props['num_prompts']} training prompts x {props['n']} samples, T=1.0")
    for c in ("role", "pass@1", "all-fail", "all-pass", "math500 pass@1", "resp. tokens", "truncated"):
        t.add_column(c)
    for r in ROLES:
        if r in props:
            p = props[r]
            t.add_row(r, f"{p['pass1']:.3f}", f"{p['all_fail']:.3f}", f"{p['all_pass']:.3f}",
                      f"{p.get('math500_pass1', float('nan')):.3f}", f"{p['response_tokens']:.1f}",
                      f"{p['truncated']:.3f}")
    return t


def _families_table(props: dict):
    from rich.table import Table

    t = Table(title="per skill family: all-fail share, and the peer's group mixed on those prompts")
    for c in ("family", "prompts", "a pass@1", "b pass@1", "a all-fail", "b mixed | a all-fail", "b all-fail",
              "a mixed | b all-fail"):
        t.add_column(c)
    for f, v in props["families"].items():
        fp = (props["a"]["family_pass1"][f], props["b"]["family_pass1"][f])
        t.add_row(f, str(v["n_prompts"]), f"{fp[0]:.3f}", f"{fp[1]:.3f}",
                  f"{v['all_fail_a']:.3f}", f"{v['peer_mixed_a']:.3f}", f"{v['all_fail_b']:.3f}",
                  f"{v['peer_mixed_b']:.3f}")
    return t


def _regime_table(reg: dict):
    from rich.table import Table

    from graft_cli.models.tiny_regime import REGIME_TARGETS

    t = Table(title=f"regime before RL (gate δ = {reg['delta']}): target / a <- b / b <- a")
    for c in ("figure", "target", "a", "b"):
        t.add_column(c)

    def tgt(v):
        return f"[{v[0]:g}, {v[1]:g}]" if isinstance(v, tuple) else (f"> {v:g}" if v == 0 else f">= {v:g}")

    t.add_row("weak family", "declared", reg["a"]["weak_family"], reg["b"]["weak_family"])
    for k in ("weak_pass1", "weak_peer_mixed", "weak_admitted", "admitted", "style_separability",
              "own_minus_peer_loglik"):
        t.add_row(k, tgt(REGIME_TARGETS[k]),
                  *(f"{reg[r][k]:.3f} {'met' if reg[r]['met'][k] else 'NOT met'}" for r in ("a", "b")))
    t.add_row("grafted responses (weak)", "", *(f"{reg[r]['grafted']} ({reg[r]['weak_grafted']})" for r in "ab"))
    return t


def _fills_table(props: dict):
    from rich.table import Table

    fills = props["peer_fills"]
    t = Table(title="three models: on each model's all-fail prompts, the share each peer's group is mixed on "
                    "(only: and no other peer's)")
    for c in ("model", "all-fail", "some peer mixed", *(f"{y} mixed (only {y})" for y in fills)):
        t.add_column(c)
    for x, v in fills.items():
        t.add_row(x, f"{v['all_fail']:.3f}", f"{v['any']:.3f}",
                  *(f"{v['mixed'][y]:.3f} ({v['only'][y]:.3f})" if y in v["mixed"] else "—" for y in fills))
    return t


def tiny_main(check: bool = False, cache_dir: str | None = None, seed: int = 0, force: bool = False, *,
              recipe: Recipe | str | None = None, num_prompts: int = 256, n: int = 8, heldout: int = 500) -> dict:
    """``graft tiny build [--check]``: build or reuse the cache, print a summary table; with
    ``check``, measure the properties and print them, the LAST line being one JSON object."""
    from rich.table import Table

    console = make_console()
    recipe = Recipe.named(recipe) if isinstance(recipe, str) else recipe
    paths = build_tiny(cache_dir, seed=seed, force=force, progress=True, recipe=recipe)
    cache = os.path.dirname(paths["a"])
    man = read_manifest(cache)
    console.print(_summary_table(man))
    ts = man["token_stats"]
    tt = Table(title="tokens per sequence (training split, reference responses + EOS)")
    for c in ("tokenizer", "vocab", "prompt (mean)", "response (mean)", "prompt+response (max)"):
        tt.add_column(c)
    for k in POLICY_ROLES:
        tt.add_row(k, str(ts[f"vocab_{k}"]), f"{ts[f'tokens_prompt_{k}']:.1f}", f"{ts[f'tokens_response_{k}']:.1f}",
                   str(ts[f"tokens_total_max_{k}"]))
    console.print(tt)
    console.print(f"cache: {cache}")
    result: dict = {"cache": cache, "paths": paths, "build_seconds": man["build_seconds"], "hashes": man["hashes"]}
    if check:
        props = check_tiny(paths, num_prompts=num_prompts, n=n, seed=seed, heldout=heldout,
                           max_new_tokens=man.get("max_new_tokens", 48))
        console.print(_props_table(props))
        console.print("re-tokenized length ratios: " + ", ".join(
            f"{y}/{x} {ts[f'ratio_{y}_over_{x}']:.2f}" for x in POLICY_ROLES for y in POLICY_ROLES if x < y))
        console.print(f"complementarity: a all-fail -> b mixed {props['comp_a_fail_b_mixed']:.3f}; "
                      f"b all-fail -> a mixed {props['comp_b_fail_a_mixed']:.3f}")
        console.print(_families_table(props))
        if "peer_fills" in props:
            console.print(_fills_table(props))
        props["blind_spots"] = blind_spots(props["families"])
        for r in ("a", "b"):  # the per-response s lists stay out of the printed JSON (the summary stays)
            for k in ("s", "s_correct", "s_family"):
                props["regime"][r].pop(k, None)
        console.print(_regime_table(props["regime"]))
        props["token_stats"] = ts
        met = targets_met(props)
        props["targets_met"] = met
        props["build_seconds"] = man["build_seconds"]
        result = props
        console.file.flush()
        sys.stdout.flush()
        print(json.dumps(props, sort_keys=True), flush=True)
    return result


__all__ = ["build_tiny", "ensure_tiny", "check_tiny", "tiny_main", "build_tokenizer_a", "build_tokenizer_b",
           "Recipe", "Shape", "Stage", "sft", "weight_hash", "default_cache_dir", "read_manifest", "ROLES",
           "targets_met", "token_stats", "sample_groups", "eval_loss", "make_model", "make_config", "sft_batch"]


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "_worker":
        _worker_main(sys.argv[2:])
    else:
        tiny_main(check="--check" in sys.argv, force="--force" in sys.argv)
