"""The transformers rollout engine: batched sampling with a KV cache and left padding.

A hand-written decode loop rather than ``model.generate`` so that (a) sampling is driven by a seeded
``torch.Generator`` (the global RNG is untouched), and (b) only the sampled token's log-probability of
the *processed* distribution (logits / T, then top-p) is kept, never a B x T x V score tensor.
Responses that emit EOS stop there (the EOS id is kept in ``response_ids``); the rest are marked
``truncated`` at ``max_new_tokens``. Prompts are processed in micro-batches of ``max_batch`` sequences.
"""

from __future__ import annotations

import inspect

import torch

from graft_cli.rollout.base import ENGINES, Rollouts, SamplingParams


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filtering: keep the smallest set of tokens whose probability mass reaches ``top_p``
    (the most likely token is always kept); the rest get -inf."""
    if top_p >= 1.0:
        return logits
    sorted_logits, idx = torch.sort(logits, descending=True, dim=-1)
    probs = sorted_logits.softmax(-1)
    cum = probs.cumsum(-1)
    remove = (cum - probs) >= top_p  # mass before this token already reaches top_p
    remove[..., 0] = False
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, idx, sorted_logits)


def eos_ids_of(tokenizer, model=None) -> list[int]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_cfg = getattr(model, "generation_config", None)
    extra = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
    if isinstance(extra, int):
        ids.add(extra)
    elif isinstance(extra, (list, tuple)):
        ids.update(int(e) for e in extra)
    return sorted(ids)


@ENGINES.register("hf")
class HFEngine:
    def __init__(self, model, tokenizer, max_batch: int = 256, **_):
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.eos_ids = eos_ids_of(tokenizer, model)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.eos_ids[0])
        # transformers >= 5.2x renamed ``past_key_values`` to ``cache``; support both
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def sync_weights(self, model) -> None:
        self.model = model  # same process, same parameters: nothing to copy

    @torch.no_grad()
    def _sample_batch(self, prompts: list[list[int]], p: SamplingParams, gen: torch.Generator):
        model = self.model
        dev = next(model.parameters()).device
        B = len(prompts)
        L = max(len(x) for x in prompts)
        ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, L), dtype=torch.long)
        for i, x in enumerate(prompts):
            ids[i, L - len(x) :] = torch.tensor(x, dtype=torch.long)
            mask[i, L - len(x) :] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        eos = torch.tensor(self.eos_ids, device=dev)
        out_tok = torch.full((B, p.max_new_tokens), self.pad_id, dtype=torch.long, device=dev)
        out_lp = torch.zeros((B, p.max_new_tokens), dtype=torch.float32, device=dev)
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        lengths = torch.full((B,), p.max_new_tokens, dtype=torch.long, device=dev)
        from transformers import DynamicCache

        cache = DynamicCache()
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1,
                    **{self._cache_kw: cache})
        next_pos = pos[:, -1] + 1
        for t in range(p.max_new_tokens):
            logits = out.logits[:, -1, :].float()
            if p.temperature <= 0:
                tok = logits.argmax(-1)
                lp = torch.zeros(B, device=dev)
            else:
                logits = top_p_filter(logits / p.temperature, p.top_p)
                logp = torch.log_softmax(logits, -1)
                tok = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
                lp = logp.gather(-1, tok[:, None]).squeeze(-1)
            tok = torch.where(done, torch.full_like(tok, self.pad_id), tok)
            out_tok[:, t] = tok
            out_lp[:, t] = torch.where(done, torch.zeros_like(lp), lp)
            hit = (~done) & torch.isin(tok, eos)
            lengths = torch.where(hit, torch.full_like(lengths, t + 1), lengths)
            done |= hit
            if bool(done.all()) or t == p.max_new_tokens - 1:
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                        use_cache=True, **{self._cache_kw: cache})
            next_pos = next_pos + 1
        res_ids, res_lp, trunc = [], [], []
        for i in range(B):
            n = int(lengths[i])
            res_ids.append(out_tok[i, :n].tolist())
            res_lp.append(out_lp[i, :n].tolist())
            trunc.append(not bool(done[i]))
        return res_ids, res_lp, trunc

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollouts:
        was_training = self.model.training
        self.model.eval()
        dev = next(self.model.parameters()).device
        gen = torch.Generator(device=dev).manual_seed(int(params.seed))
        flat = [x for x in prompt_ids for _ in range(params.n)]  # prompt-major
        ids, lps, trunc = [], [], []
        # sort by prompt length inside each chunk is unnecessary for equal-format prompts; keep order
        for s in range(0, len(flat), self.max_batch):
            a, b, c = self._sample_batch(flat[s : s + self.max_batch], params, gen)
            ids += a
            lps += b
            trunc += c
        if was_training:
            self.model.train()
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        return Rollouts(prompt_ids=[list(x) for x in prompt_ids], response_ids=ids, texts=texts,
                        logprobs=lps, truncated=trunc, n=params.n)
