"""Prompt construction (graft.md §1 and §8 item 1).

The paper's prompt is one user message: the problem followed by the suffix ``Let's think step by
step and output the final answer within \\boxed{}.``. ``chat_template: auto`` wraps it (problem,
``separator`` — a space —, suffix) in the tokenizer's chat template when the tokenizer defines one
(``add_generation_prompt=True``; ``enable_thinking=False`` is passed for templates that read it),
otherwise ``raw_template`` formats the text. ``chat_template: none`` always uses ``raw_template``.

A problem that is a JSON list of chat messages (verl-style RL data such as Eurus-2-RL-Data, whose
rows carry a system and a user message; graft_cli/data/problems.py keeps them so) is rendered as
those messages, the suffix (if any) after the last one's content; without a chat template their
contents are joined by blank lines. ``chat_template: required`` is ``auto`` where the prompt must be
the chat template (the SAF-OPD and Tandem RLVR pairs: instruct-style Qwen3 prompts): a tokenizer
without one is refused in one line (:meth:`PromptSpec.check`), not silently prompted with the raw
text. """

from __future__ import annotations

import json
from dataclasses import dataclass

from graft_cli.errors import GraftError

SUFFIX = "Let's think step by step and output the final answer within \\boxed{}."
RAW_TEMPLATE = "{problem} {suffix}\n"


@dataclass(frozen=True)
class PromptSpec:
    suffix: str = SUFFIX
    chat_template: str = "auto"  # auto | none | required
    raw_template: str = RAW_TEMPLATE
    separator: str = " "  # between problem and suffix in the chat message (SAF-OPD's evaluation: "\n")

    @classmethod
    def from_config(cls, prompt_cfg) -> "PromptSpec":
        """The spec of a config's ``prompt`` section (``suffix``, ``chat_template``,
        ``raw_template``)."""
        return cls(prompt_cfg.suffix, prompt_cfg.chat_template, prompt_cfg.raw_template)

    def templated(self, tokenizer) -> bool:
        """Whether prompts for ``tokenizer`` are its chat template (refusing one without it when
        ``required``)."""
        has = bool(getattr(tokenizer, "chat_template", None))
        if self.chat_template == "required" and not has:
            self.check(tokenizer)
        return self.chat_template != "none" and has

    def check(self, tokenizer, where: str = "") -> None:
        """One line (naming ``where``, e.g. the config key of the model) when ``required`` and
        ``tokenizer`` has no chat template."""
        if self.chat_template == "required" and not getattr(tokenizer, "chat_template", None):
            name = getattr(tokenizer, "name_or_path", "") or "the tokenizer"
            raise GraftError(f"{where + ': ' if where else ''}tokenizer {name} has no chat template, which "
                             "prompt.chat_template=required needs (chat_template: auto would prompt it with "
                             "prompt.raw_template instead)")

    def text(self, problem: str, tokenizer) -> str:
        """The prompt string for ``problem`` under ``tokenizer``'s conventions."""
        messages = chat_messages(problem)
        if messages is not None:
            last = messages[-1]["content"]
            messages[-1] = {**messages[-1], "content": f"{last}{self.separator}{self.suffix}" if self.suffix else last}
            if not self.templated(tokenizer):
                return self.raw_template.format(problem="\n\n".join(m["content"] for m in messages), suffix="")
        content = f"{problem}{self.separator}{self.suffix}" if self.suffix else problem
        if self.templated(tokenizer):
            return tokenizer.apply_chat_template(
                messages or [{"role": "user", "content": content}],
                tokenize=False,
                add_generation_prompt=True,
                enable_thinking=False,
            )
        return self.raw_template.format(problem=problem, suffix=self.suffix)

    def encode(self, problem: str, tokenizer) -> list[int]:
        """Token ids of the prompt. Chat templates already contain BOS, so no special tokens are
        added to templated text; raw text gets the tokenizer's own ``add_special_tokens``
        behaviour."""
        text = self.text(problem, tokenizer)
        return tokenizer(text, add_special_tokens=not self.templated(tokenizer))["input_ids"]


def chat_messages(problem: str) -> list[dict] | None:
    """The messages of a problem stored as a JSON chat list (``[{"role": ..., "content": ...},
    ...]``), else None."""
    if not (isinstance(problem, str) and problem.startswith('[{"role"')):
        return None
    try:
        msgs = json.loads(problem)
    except ValueError:
        return None
    ok = isinstance(msgs, list) and msgs and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in msgs)
    return [dict(m) for m in msgs] if ok else None
