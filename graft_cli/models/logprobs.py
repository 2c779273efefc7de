"""Per-token log-probabilities of response tokens under a causal LM, memory-lean.

Only positions that predict a response token go through the LM head, in chunks of ``chunk_tokens``
rows; with gradients on, each chunk is recomputed in backward (activation checkpointing), so the fp32
full-vocabulary logits of the whole batch are never held at once. ``naive_logprobs`` is the reference
implementation (full logits, log_softmax, gather) used by tests.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


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
    base = getattr(model, "base_model", None)
    if base is None or base is model:
        base = getattr(model, "model", None)
    return base


def _is_fsdp(model) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover
        return False
    return isinstance(model, FSDPModule)


def hidden_via_root(model, base, input_ids, attention_mask):
    """The backbone's last hidden state, computed through the *root* module's forward (LM head on the last
    position only) and captured with a forward hook. Under FSDP2 the root's parameters (embeddings, final
    norm, tied head) are all-gathered only by the root forward — calling the backbone directly would meet
    sharded parameters — and the root keeps them unsharded after forward, so the chunked head below works."""
    captured = {}

    def hook(_m, _i, out):
        captured["h"] = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    handle = base.register_forward_hook(hook)
    try:
        model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=1, use_cache=False)
    finally:
        handle.remove()
    return captured["h"]


def response_logprobs(model, input_ids, attention_mask, response_mask, temperature: float = 1.0,
                      chunk_tokens: int = 4096, with_entropy: bool = False):
    """Returns ``(logp, entropy)`` of shape ``(B, L-1)``: entry ``t`` scores ``input_ids[:, t+1]``;
    zero where ``response_mask[:, 1:]`` is 0. ``entropy`` is zeros unless ``with_entropy``."""
    base, head = _backbone(model), model.get_output_embeddings()
    if base is None or head is None:
        return naive_logprobs(model, input_ids, attention_mask, response_mask, temperature, with_entropy)
    if _is_fsdp(model):
        hidden = hidden_via_root(model, base, input_ids, attention_mask)
    else:
        hidden = base(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    sel = response_mask[:, 1:].bool()
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
    """Per-response-token values (e.g. sampler log-probs) laid out like ``response_logprobs``'s output."""
    out = torch.zeros((len(rows), L - 1), dtype=torch.float32)
    for i, (v, p) in enumerate(zip(rows, prompts)):
        if len(v):
            out[i, len(p) - 1 : len(p) - 1 + len(v)] = torch.tensor(v, dtype=torch.float32)
    return out.to(device)
