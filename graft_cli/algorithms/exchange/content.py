"""What a grafted correct response says (``exchange.params.content``), registered.

A content rule (registry ``CONTENTS``) is ``rule(problem, receiver, source, styles) -> str | None``:
the text that stands in for each of the source's *correct* responses to ``problem`` when they are
grafted into ``receiver``'s batch; ``None`` keeps the source's own text. Only the text changes: the
source's wrong responses, every reward and every advantage stay the source's (its group's GRPO
advantages), so the RL signal keeps its structure and only its content moves. A replaced row is
re-tokenized with the receiver's tokenizer like any grafted row, ends with the receiver's EOS (a gold
solution is complete) and has no source log-probs (its compatibility s is undefined: such a row is
kept only with ``gate: none``).

- ``peer`` (GRAFT): the source's own response;
- ``gold_own_style``: the task's gold worked solution written in the *receiver's* style;
- ``gold_peer_style``: the same solution written in the *source's* style.

``styles`` (``exchange.params.styles``) maps each policy name to the style it writes in
(:data:`graft_cli.data.synthetic.STYLES`; the tiny pair: ``{a: prose, b: steps, c: words}``, the
tiny build's recipe). The gold solution is the tiny task's: the problem's numbers replayed through
its family's generator (:func:`graft_cli.data.synthetic.gold_solution`); a problem of another task
has none and stops the step with one line. The transfer ladder (docs/studies.md, "Can anything the
peer writes teach the receiver") varies this rule and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from graft_cli.data.synthetic import gold_solution
from graft_cli.errors import GraftError
from graft_cli.registry import Registry

CONTENTS: Registry = Registry("grafted content")  # (problem, receiver, source, styles) -> text | None

Content = Callable[[str, str, str, Mapping], "str | None"]

__all__ = ["CONTENTS", "gold_text"]


def gold_text(problem: str, policy: str, styles: Mapping) -> str:
    """The gold solution of ``problem`` in the style of ``policy`` (``styles[policy]``)."""
    style = styles.get(policy)
    if style is None:
        raise GraftError(f"config key 'exchange.params.styles': no style for policy {policy!r} (gold content is "
                         f"written in a policy's style; the tiny pair: {{a: prose, b: steps, c: words}})")
    try:
        return gold_solution(problem, str(style))
    except ValueError as e:
        raise GraftError(f"exchange.params.content: no gold solution: {e}") from None


@CONTENTS.register("peer")
def peer_content(problem: str, receiver: str, source: str, styles: Mapping) -> None:
    return None


@CONTENTS.register("gold_own_style")
def gold_own_style(problem: str, receiver: str, source: str, styles: Mapping) -> str:
    return gold_text(problem, receiver, styles)


@CONTENTS.register("gold_peer_style")
def gold_peer_style(problem: str, receiver: str, source: str, styles: Mapping) -> str:
    return gold_text(problem, source, styles)
