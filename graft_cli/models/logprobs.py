"""Per-token log-probabilities of response tokens under a causal LM, memory-lean.

Only positions that predict a response token go through the LM head, in chunks of ``chunk_tokens``
rows; with gradients on, each chunk is recomputed in backward (activation checkpointing), so the
fp32 full-vocabulary logits of the whole batch are never held at once. ``naive_logprobs`` is the
reference implementation (full logits, log_softmax, gather) used by tests.

Shared prompts (``optim.shared_prefix``): the rows of a GRPO group share one prompt, so the prompt's
forward can run once per distinct prompt and its KV cache be indexed out to the group's rows
(:func:`shared_prefix_hidden`); the response tokens then run against that cache. It is the same
function (the attention of a response token over ``prompt + response`` keys is unchanged), so
log-probs and gradients agree with the full pass to float order (``tests/test_shared_prefix.py``),
and the prompt's matmuls are paid once instead of ``n`` times. Gradients flow through the indexed
cache into the prompt's forward (its backward sums the rows' contributions), as in Prefix Grouper
(Liu et al. 2025, arXiv:2506.05433). """

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from graft_cli.models.lora import unwrap


def _head_chunk(head, h, tgt, temperature: float, with_entropy: bool):
    logits = head(h).float()
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, -1)
    lp = logits.gather(-1, tgt[:, None]).squeeze(-1) - lse
    if not with_entropy:
        return lp, torch.zeros_like(lp)
    p = torch.softmax(logits, -1)
    ent = lse - (p * logits).sum(-1)
    return lp, ent


def _backbone(model):
    model = unwrap(model)  # a LoRA policy: the transformers model inside PEFT's wrapper (its adapters injected)
    base = getattr(model, "base_model", None)
    if base is None or base is model:
        base = getattr(model, "model", None)
    return base


def _is_fsdp(model) -> bool:
    try:
        # lazy: FSDP2 is absent from older torch builds
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover
        return False
    return isinstance(model, FSDPModule)


def hidden_via_root(model, base, input_ids, attention_mask):
    """The backbone's last hidden state, computed through the *root* module's forward (LM head on
    the last position only) and captured with a forward hook. Under FSDP2 the root's parameters
    (embeddings, final norm, tied head) are all-gathered only by the root forward — calling the
    backbone directly would meet sharded parameters — and the root keeps them unsharded after
    forward, so the chunked head below works."""
    captured = {}

    def hook(_m, _i, out):
        captured["h"] = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    handle = base.register_forward_hook(hook)
    try:
        model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=1, use_cache=False)
    finally:
        handle.remove()
    return captured["h"]


@dataclass
class PrefixGroups:
    """A micro-batch laid out for :func:`shared_prefix_hidden`: its ``U`` distinct prompts
    left-padded (``prompt_ids``, ``prompt_mask``: (U, P)), which prompt each of the ``B`` rows has
    (``row_prompt``: (B,)), and the responses right-padded (``response_ids``, ``response_mask``: (B,
    R))."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    row_prompt: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor  # (its padded cost: graft_cli.batch.prefix_cost)


def distinct(prompts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """The distinct prompts (in order of first appearance) and, per row, the index of its prompt
    among them."""
    index: dict[tuple, int] = {}
    rows = [index.setdefault(tuple(p), len(index)) for p in prompts]
    return [list(k) for k in index], rows


def left_pad(prompts: list[list[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded prompts: ``ids``, ``mask`` and the positions the mask gives (0 on padding), all
    ``(B, L)``."""
    B, L = len(prompts), max(len(x) for x in prompts)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.long)
    for i, x in enumerate(prompts):
        ids[i, L - len(x):] = torch.tensor(x, dtype=torch.long)
        mask[i, L - len(x):] = 1
    ids, mask = ids.to(device), mask.to(device)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def prefix_groups(prompts: list[list[int]], responses: list[list[int]], pad_id: int, device=None) -> PrefixGroups:
    """Group the rows by identical prompt token ids (in order of first appearance)."""
    uniq, row_prompt = distinct(prompts)
    pid, pm, _ = left_pad(uniq, pad_id, device)
    B, R = len(responses), max([len(r) for r in responses] + [0])
    rid = torch.full((B, R), pad_id, dtype=torch.long)
    rm = torch.zeros((B, R), dtype=torch.long)
    for i, r in enumerate(responses):
        rid[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
        rm[i, : len(r)] = 1
    return PrefixGroups(pid, pm, torch.tensor(row_prompt, device=device), rid.to(device), rm.to(device))


def cache_kwarg(module) -> str:
    """transformers >= 5.2x renamed the forward's ``past_key_values`` to ``cache``; support both (a
    wrapper whose forward takes ``**kwargs``, e.g. PEFT's, is looked through to its ``model``)."""
    for m in (module, getattr(module, "model", None)):
        params = inspect.signature(m.forward).parameters if m is not None else {}
        for name in ("cache", "past_key_values"):
            if name in params:
                return name
    return "past_key_values"


def shared_prefix_hidden(base, g: PrefixGroups) -> tuple[torch.Tensor, torch.Tensor]:
    """The backbone's hidden states that predict each row's response tokens, and those tokens,
    flattened row-major over (row, response position) — the order of ``hidden[:,
    :-1][response_mask[:, 1:]]`` in a ``pack``ed batch. Pass 1 runs the U prompts (left-padded,
    positions from the mask) into a KV cache; the cache is indexed to the B rows; pass 2 runs the
    responses (but their last token) at positions ``len(prompt) + t`` against it. The last prompt
    position predicts response token 0, response position ``t`` predicts token ``t + 1``."""
    # lazy: transformers is slow to import
    from transformers import DynamicCache

    kw = cache_kwarg(base)
    cache = DynamicCache()
    pm = g.prompt_mask
    P = pm.shape[1]
    hp = base(input_ids=g.prompt_ids, attention_mask=pm, position_ids=(pm.cumsum(-1) - 1).clamp(min=0),
              use_cache=True, **{kw: cache}).last_hidden_state
    if cache.get_seq_length() != P:  # e.g. gradient checkpointing, which turns the cache off in training
        raise ValueError(f"optim.shared_prefix: the model {type(base).__name__} kept no KV cache of the prompts "
                         "(gradient checkpointing turns it off: optim.gradient_checkpointing: false, or "
                         "optim.shared_prefix: false)")
    first = hp[g.row_prompt, -1:]  # (B, 1, H): predicts response token 0
    R = g.response_ids.shape[1]
    if R > 1:
        cache.batch_select_indices(g.row_prompt)
        plen = pm.sum(-1)[g.row_prompt]
        rin = g.response_ids[:, :-1]
        att = torch.cat([pm[g.row_prompt], g.response_mask[:, :-1]], 1)
        pos = plen[:, None] + torch.arange(R - 1, device=rin.device)[None]
        hr = base(input_ids=rin, attention_mask=att, position_ids=pos, use_cache=True,
                  cache_position=torch.arange(P, P + R - 1, device=rin.device), **{kw: cache}).last_hidden_state
        hidden = torch.cat([first, hr], 1)
    else:
        hidden = first[:, :R]
    sel = g.response_mask.bool()
    return hidden[sel], g.response_ids[sel]


AUTOCAST = {"none": None, "bfloat16": torch.bfloat16}


def autocast(kind: str, device) -> "contextlib.AbstractContextManager":
    """``torch.autocast`` to ``kind`` (``optim.autocast`` / ``rollout.engine_kwargs.autocast``:
    none | bfloat16) on ``device``'s type, or a null context for ``none``. Matmuls run in bf16
    (AVX512-BF16 / AMX on CPUs that have them), reductions and the log-softmax stay fp32 (the LM
    head's logits are cast up in :func:`_head_chunk`)."""
    dtype = AUTOCAST[kind]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def response_logprobs(model, input_ids, attention_mask, response_mask, temperature: float = 1.0,
                      chunk_tokens: int = 4096, with_entropy: bool = False, groups: PrefixGroups | None = None,
                      autocast_dtype: str = "none"):
    """:func:`_response_logprobs` under :func:`autocast` (``autocast_dtype``)."""
    with autocast(autocast_dtype, input_ids.device):
        return _response_logprobs(model, input_ids, attention_mask, response_mask, temperature, chunk_tokens,
                                  with_entropy, groups)


def _response_logprobs(model, input_ids, attention_mask, response_mask, temperature: float = 1.0,
                       chunk_tokens: int = 4096, with_entropy: bool = False, groups: PrefixGroups | None = None):
    """Returns ``(logp, entropy)`` of shape ``(B, L-1)``: entry ``t`` scores ``input_ids[:, t+1]``;
    zero where ``response_mask[:, 1:]`` is 0. ``entropy`` is zeros unless ``with_entropy``. With
    ``groups`` (the same rows, :func:`prefix_groups`), the prompts run once each
    (:func:`shared_prefix_hidden`); under FSDP the full pass is used."""
    base, head = _backbone(model), model.get_output_embeddings()
    if base is None or head is None:
        return naive_logprobs(model, input_ids, attention_mask, response_mask, temperature, with_entropy)
    sel = response_mask[:, 1:].bool()
    if groups is not None and not _is_fsdp(model):
        h, tgt = shared_prefix_hidden(base, groups)
    else:
        if _is_fsdp(model):
            hidden = hidden_via_root(model, base, input_ids, attention_mask)
        else:
            hidden = base(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        h = hidden[:, :-1][sel]
        tgt = input_ids[:, 1:][sel]
    lps, ents = [], []
    for s in range(0, h.shape[0], chunk_tokens):
        args = (head, h[s : s + chunk_tokens], tgt[s : s + chunk_tokens], temperature, with_entropy)
        if torch.is_grad_enabled() and h.requires_grad:
            lp, ent = checkpoint(_head_chunk, *args, use_reentrant=False)
        else:
            lp, ent = _head_chunk(*args)
        lps.append(lp)
        ents.append(ent)
    B, L = input_ids.shape
    logp = torch.zeros((B, L - 1), dtype=torch.float32, device=input_ids.device)
    ent = torch.zeros_like(logp)
    if lps:
        logp = logp.masked_scatter(sel, torch.cat(lps))
        ent = ent.masked_scatter(sel, torch.cat(ents).detach())
    return logp, ent


def naive_logprobs(model, input_ids, attention_mask, response_mask, temperature=1.0, with_entropy=False):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float() / temperature
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    m = response_mask[:, 1:].float()
    ent = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else torch.zeros_like(logp)
    return logp * m, ent.detach() * m


def pack(prompts: list[list[int]], responses: list[list[int]], pad_id: int, device=None):
    """Right-padded ``prompt + response`` rows: ``input_ids``, ``attention_mask`` and
    ``response_mask`` (1 on response tokens), all ``(B, L)``."""
    L = max(len(p) + len(r) for p, r in zip(prompts, responses))
    B = len(prompts)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    att = torch.zeros((B, L), dtype=torch.long)
    resp = torch.zeros((B, L), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        n = len(p) + len(r)
        ids[i, :n] = torch.tensor(list(p) + list(r), dtype=torch.long)
        att[i, :n] = 1
        resp[i, len(p) : n] = 1
    return ids.to(device), att.to(device), resp.to(device)


def to_padded(rows: list[list[float]], prompts: list[list[int]], L: int, device=None) -> torch.Tensor:
    """Per-response-token values (e.g. rollout log-probs) laid out like ``response_logprobs``'s
    output."""
    out = torch.zeros((len(rows), L - 1), dtype=torch.float32)
    for i, (v, p) in enumerate(zip(rows, prompts)):
        if len(v):
            out[i, len(p) - 1 : len(p) - 1 + len(v)] = torch.tensor(v, dtype=torch.float32)
    return out.to(device)


@torch.no_grad()
def autocast_gap(model, prompts: list[list[int]], responses: list[list[int]], pad_id: int,
                 kind: str = "bfloat16") -> torch.Tensor:
    """|log p_autocast - log p_fp32| of every response token (one flat tensor): how far
    ``optim.autocast=kind`` moves the log-probs the loss and the ratio see (benchmarks/cpu_peak.py
    reports it; tested)."""
    dev = next(model.parameters()).device
    ids, att, resp = pack(prompts, responses, pad_id, dev)
    fp, _ = response_logprobs(model, ids, att, resp)
    low, _ = response_logprobs(model, ids, att, resp, autocast_dtype=kind)
    m = resp[:, 1:].bool()
    return (fp - low)[m].abs()
