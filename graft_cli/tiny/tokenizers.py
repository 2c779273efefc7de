"""The tiny pair's tokenizers (:mod:`graft_cli.tiny`): ``a`` a Qwen-style byte-level BPE, ``b`` a
GPT-2 / Llama-3-style byte-level BPE with the constant prompt suffix as one added token, ``c`` a
Gemma-style SentencePiece BPE, each trained on its own seeded corpus of the synthetic task."""

from __future__ import annotations

import string

from graft_cli.data.prompts import RAW_TEMPLATE, SUFFIX, PromptSpec
from graft_cli.data.synthetic import corpus

EOS_A, PAD_A = "<|endoftext|>", "<|pad|>"
BOS_B, EOS_B, PAD_B = "<s>", "</s>", "<pad>"
PAD_C, EOS_C, BOS_C, UNK_C = "<pad>", "<eos>", "<bos>", "<unk>"  # Gemma's specials, in Gemma's id order

# ``b``'s tokenizer adds the constant part of the raw prompt template, " Let's think step by step
# and output the final answer within \boxed{}.\n", as ONE added, non-special token: its regex
# pre-tokenizer would otherwise spend ~17 tokens on it in every prompt (RL step time is proportional
# to sequence length). Prompts are never exchanged between the models (each encodes its own), so
# this changes no response.
def _suffix_tokens_b() -> tuple[str, ...]:
    constant = RAW_TEMPLATE.split("{problem}", 1)[1].format(suffix=SUFFIX)  # " <suffix>\n"
    return (constant,)


# ----------------------------------------------------------------------------------------------------
# Tokenizers


class _Raw:
    chat_template = None


def _prompt_text(problem: str, spec: PromptSpec = PromptSpec()) -> str:
    """The prompt a tiny model sees for ``problem`` under ``spec`` (no chat template: the raw
    template)."""
    return spec.text(problem, _Raw())


def _bpe(pre_tokenizer, corpus_seed: int, vocab_size: int, specials: list[str], style="chain"):
    """A byte-level BPE (``tokenizers`` trainer, ~0.2 s) over the task's text: prompt + worked
    solution pairs drawn from :func:`graft_cli.data.synthetic.corpus` with ``corpus_seed``,
    solutions in ``style`` (a name, or a list of names drawn uniformly per example:
    :meth:`Recipe.tokenizer_style`)."""
    # lazy: tokenizers only for building tokenizers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers


    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_prompt_text(p) + s for p, s in corpus(corpus_seed, 4000, style)], trainer)
    return tok


# Qwen2/Qwen3's pre-tokenizer regex (their tokenizer.json): a word with its leading space or one
# punctuation mark (" then" -> "Ġthen"), single digits, punctuation runs, newlines, spaces; preceded
# by the LaTeX command with its leading space that a's earlier split isolates (" \boxed" stays one
# piece)
QWEN_PRETOKENIZE = (r" ?\\[A-Za-z]+|(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def build_tokenizer_a(seed: int = 0, vocab_size: int = 384, style: str = "chain", split: str = "free"):
    """``a``: byte-level BPE in the Qwen style (digits always single tokens). Pre-tokenizer:
    ``Digits( individual_digits=True)``, then a split isolating a LaTeX command with its leading
    space (``" \\boxed"``), then ``split``: ``free`` (v2) lets all other text between digits be one
    pre-token that BPE merges freely (``"x+"``, ``"{}.\\n"``); ``qwen`` (v3, whose responses are
    sentences) splits it with Qwen's own regex (:data:`QWEN_PRETOKENIZE`: a word keeps its leading
    space, ``" then"`` -> ``"Ġthen"``, as in Qwen3's vocabulary, so the tandem ``word`` schedule
    sees word openings). Then ``ByteLevel(use_regex=False)``. ``\\boxed{`` is 2 tokens. Specials:
    ``<|endoftext|>`` (EOS) and ``<|pad|>``; no BOS, no chat template."""
    # lazy: tokenizers only for building tokenizers
    from tokenizers import Regex, pre_tokenizers

    # lazy: transformers is slow to import
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
        # lazy: tokenizers only for building tokenizers
        from tokenizers import AddedToken

        tok.add_tokens([AddedToken(w, normalized=False, lstrip=False, rstrip=False, single_word=False)
                        for w in _suffix_tokens_b()])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_A, pad_token=PAD_A, padding_side="left",
                                   clean_up_tokenization_spaces=False)


def build_tokenizer_b(seed: int = 0, vocab_size: int = 512, style: str = "chain"):
    """``b``: byte-level BPE in the GPT-2 / Llama-3 style: ``Digits(individual_digits=True)`` then
    ``ByteLevel(use_regex=True)`` (the GPT-2 split: letters, digits and punctuation runs never merge
    with each other), trained on a differently seeded corpus with its own vocabulary size, so ids
    and merges differ from ``a``'s throughout. ``\\boxed{`` is 3 tokens (``" \\"``, ``"boxed"``,
    ``"{"``, as in Llama 3). The constant prompt suffix is one added non-special token
    (:func:`_suffix_tokens_b`). Re-tokenized lengths of reference responses: b/a 1.07 (a/b 0.94);
    docs/tiny_pair.md's table has the measured figures. Specials ``<s>`` (unused BOS), ``</s>``
    (EOS), ``<pad>``."""
    # lazy: tokenizers only for building tokenizers
    from tokenizers import AddedToken, pre_tokenizers

    # lazy: transformers is slow to import
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
    """``c``: a SentencePiece-style BPE in the Gemma manner: spaces become ``"▁"`` (``Metaspace``
    with no dummy prefix, as Gemma's ``add_dummy_prefix=False``), pieces never span a word boundary
    (SentencePiece's ``split_by_whitespace``) but merge freely across punctuation (``"▁\\boxed{"``
    is one token), digits always single tokens, a character (not byte) alphabet with ``<unk>`` (a
    peer's text outside it, e.g. a stray byte a byte-level model sampled, re-tokenizes to ``<unk>``,
    as in a SentencePiece model without byte fallback). Trained on a third corpus seed (``seed +
    15485``), so its ids and merges differ from ``a``'s and ``b``'s; the constant prompt suffix is
    one added token, as in ``b``. Specials ``<pad>`` ``<eos>`` ``<bos>`` (unused) ``<unk>``, as
    Gemma numbers them."""

    # lazy: tokenizers only for building tokenizers
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    # lazy: transformers is slow to import
    from transformers import PreTrainedTokenizerFast


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
