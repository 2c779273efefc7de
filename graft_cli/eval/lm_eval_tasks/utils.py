"""Scoring of graft's lm-evaluation-harness tasks: graft's own math-verify reward
(``graft_cli.reward.answers.grade_one``: the last ``\\boxed{}`` of a response against the gold
answer) on each of a problem's samples.

lm-eval calls :func:`process_results` once per problem with the filtered responses: with ``repeats:
8`` and the ``take_first_k`` filter that is ``[[r1, ..., r8]]``; a flat list of strings is accepted
too. Returned per problem: ``pass_at_1`` (share of correct samples; its mean over problems is the
paper's pass@1) and ``pass_at_k`` (unbiased pass@k with k = the number of samples, i.e. pass@8).
Needs ``graft`` importable in the lm-eval environment (``pip install -e <graft checkout>``). """

from __future__ import annotations

import signal
import threading

from graft_cli.reward.answers import grade_one
from graft_cli.batch import is_correct
from graft_cli.eval.metrics import pass_at_k

TIMEOUT_S = 5  # per-response verification budget (math-verify's own timeout is off inside grade_one)


def _responses(results) -> list[str]:
    if results and isinstance(results[0], (list, tuple)):
        results = results[0]
    return [r if isinstance(r, str) else str(r) for r in results]


def _grade(response: str, gold: str) -> float:
    use_alarm = threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGALRM")
    if not use_alarm:
        return grade_one(response, gold)[0]

    def _timeout(signum, frame):
        raise TimeoutError

    old = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(TIMEOUT_S)
    try:
        return grade_one(response, gold)[0]  # a timeout inside scores 0.0 (grade_one never raises)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def process_results(doc: dict, results) -> dict:
    responses = _responses(results)
    gold = str(doc["answer"])
    grades = [_grade(r, gold) for r in responses]
    n, c = len(grades), int(sum(is_correct(g) for g in grades))
    if n == 0:
        return {"pass_at_1": 0.0, "pass_at_k": 0.0}
    return {"pass_at_1": c / n, "pass_at_k": pass_at_k(n, c, n)}
