"""Moving a response between two policies' tokenizers (graft.md §2.2 step 6, §8 items 3 and 10).

The source's response *string* (decoded with ``skip_special_tokens=True`` and no clean-up of
tokenization spaces: :func:`decode_responses`) is encoded with the receiver's tokenizer,
``tokenizer(text, add_special_tokens=False)``; with byte-identical vocabularies the token ids can be
moved as they are. """

from __future__ import annotations


def decode_responses(tokenizer, ids: list) -> list[str]:
    """Response texts as their source wrote them, for grading and for re-tokenization: special
    tokens skipped and ``clean_up_tokenization_spaces=False`` whatever the tokenizer's default (the
    clean-up drops the space before punctuation and in contractions, ``x , y`` → ``x, y``, so the
    receiver would train on text the source never wrote), as HACPO's released
    ``materialize_rollout_records`` decodes."""
    return tokenizer.batch_decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def retokenize(text: str, tokenizer, ended_with_eos: bool, append_eos: bool = True,
               terminal_only: bool = False) -> tuple[list[int], int]:
    """graft.md §2.2 step 6 / §8 item 3 (HACPO's contract): ``tokenizer(text,
    add_special_tokens=False)``; the receiver's EOS is appended when the source ended with EOS and
    ``append_eos``. Returns ``(ids, n_scored)``, ``n_scored`` = tokens that enter s (the appended
    EOS excluded). ``terminal_only`` (the source wrote only its EOS): the receiver's EOS alone,
    scored (``n_scored`` 1), as HACPO's released ``build_training_view`` does for a terminal-only
    trajectory."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if terminal_only and eos is not None:
        return [int(eos)], 1
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    n_scored = len(ids)
    if append_eos and ended_with_eos and eos is not None:
        ids.append(int(eos))
    return ids, n_scored


def tokenizers_identical(t1, t2) -> bool:
    """graft.md §8 item 10: same vocabulary (token → id) and the same EOS id."""
    if t1 is t2:
        return True
    try:
        return t1.get_vocab() == t2.get_vocab() and t1.eos_token_id == t2.eos_token_id
    except Exception:
        return False
