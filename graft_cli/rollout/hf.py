"""The transformers rollout engine: batched sampling with a KV cache and left padding.

A hand-written decode loop rather than ``model.generate`` so that (a) sampling is driven by a seeded
``torch.Generator`` (the global RNG is untouched), and (b) only the sampled token's log-probability
of the *processed* distribution (logits / T, then top-k, then top-p, in transformers' and vLLM's
order) is kept, never a B x T x V score tensor. Responses that emit EOS stop there (the EOS id is
kept in ``response_ids``); the rest are marked ``truncated`` at ``max_new_tokens``. Prompts are
processed in micro-batches of ``max_batch`` sequences.

Fast path (``rollout.engine_kwargs``; ``auto`` = on when the model is on CUDA, so the CPU path is
unchanged): ``cache: static`` preallocates a ``StaticCache`` whose length is rounded up to
``cache_bucket`` tokens and feeds a fixed-length attention mask, so every decode step has the same
shapes; ``compile: true`` then runs the one-token decode step through ``torch.compile``
(``compile_mode``, default ``reduce-overhead`` = CUDA graphs). Sampling, log-probs and stopping are
the same code either way. If the fast path fails on first use it is switched off with a warning and
the batch is redone on the dynamic-cache path.

Under FSDP (data-parallel training, train/dist.py) every rank must run the same number of forward
passes: the decode loop then stops only when all ranks' rows are done.

Three speed options (``rollout.engine_kwargs``), on by default where they change float summation
order only (``auto``: on with the dynamic cache, i.e. the CPU path; the static-cache CUDA path keeps
its fixed shapes):

* ``rng: per_row`` (the default; ``rng`` is the layout of the engine's random streams): each
  response row draws from its own stream, uniforms u_{r,t} from a generator seeded with (seed, r)
  where r is the row's index in the prompt-major flat list, and takes the token by inverse CDF, o_t
  = min{v : Σ_{w ≤ v} p(w) > u_{r,t} Σ_w p(w)}. A row's samples then depend on its own logits only,
  not on which other rows share its batch (``max_batch`` no longer changes the samples either).
  ``rng: batch`` is one ``torch.multinomial`` stream over the batch.
* ``compact`` (``auto`` = on with per-row streams and the dynamic cache; needs both): rows that
  ended on EOS leave the decode batch (their KV cache rows, mask and positions are dropped) once a
  quarter of the live rows have ended, so the remaining steps cost only what the unfinished rows
  need. With per-row streams the samples are those of the uncompacted loop up to float summation
  order (tested).
* ``share_prompts`` (``auto`` = on with the dynamic cache): the rows of one prompt (its ``n``
  samples) share one prefill. The batch's distinct prompts run once and their KV cache, mask and
  positions are indexed out to the rows, so prefill costs ``distinct prompts x prompt length``
  instead of ``rows x prompt length`` (float order only: the rows' first logits are the distinct
  prompt's; tested).

Two more options, off by default: ``ignore_eos: true`` (vLLM's name) runs every row to
``max_new_tokens`` (the benchmarks' equal-work mode), and ``autocast: bfloat16`` runs prefill and
decode under ``torch.autocast`` (sampling stays fp32; ``algo.old_logprobs: auto`` then recomputes
with the trainer). """

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

from graft_cli.models.retokenize import decode_responses
from graft_cli.batch import Rollouts
from graft_cli.models.logprobs import (
    AUTOCAST,
    _is_fsdp,
    autocast,
    cache_kwarg,
    distinct,
    left_pad,
    naive_logprobs,
    pack,
)
from graft_cli.rollout.engine import ENGINES, RolloutEngine, SamplingParams


def top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the ``top_k`` largest logits of each row (ties with the k-th kept, as transformers'
    TopKLogitsWarper and vLLM's top-k mask); the rest get -inf. ``top_k`` <= 0 or >= the vocabulary:
    unchanged."""
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def processed_logprobs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """log softmax(top_p(top_k(logits / T))): the distribution a token is drawn from (top-p over the
    top-k tokens renormalised)."""
    return torch.log_softmax(top_p_filter(top_k_filter(logits / p.temperature, p.top_k), p.top_p), -1)


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
class HFEngine(RolloutEngine):
    # its log-probs are the policy's own, of the distribution the trainer scores (logits / T, same
    # weights, same forward): algo.old_logprobs=auto keeps them when the run is fp32, single-epoch
    # and top-p 1 (config.py)
    exact_logprobs = True
    own_weights = True  # built over a rollout replica at run.staleness >= 1 (train/policies.py)
    options = {"cache": "auto", "compile": "auto", "compile_mode": "reduce-overhead", "cache_bucket": 256,
               "rng": "per_row", "compact": "auto", "share_prompts": "auto", "ignore_eos": False,
               "autocast": "none"}

    def __init__(self, model, tokenizer, max_batch: int = 256, cache: str = "auto", compile: bool | str = "auto",
                 compile_mode: str = "reduce-overhead", cache_bucket: int = 256, rng: str = "per_row",
                 compact: bool | str = "auto", share_prompts: bool | str = "auto", ignore_eos: bool = False,
                 autocast: str = "none"):
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        on_cuda = next(model.parameters()).device.type == "cuda"
        self.check_kwargs(cache=cache, compile=compile, compile_mode=compile_mode, cache_bucket=cache_bucket,
                          rng=rng, compact=compact, share_prompts=share_prompts, ignore_eos=ignore_eos,
                          autocast=autocast)
        self.static = cache == "static" or (cache == "auto" and on_cuda)
        self.compile = (compile is True or compile == "true" or (compile == "auto" and on_cuda)) and self.static
        self.compile_mode, self.cache_bucket = compile_mode, max(1, int(cache_bucket))
        self.per_row = rng == "per_row"
        self.compact = _on(compact, self.per_row and not self.static)
        self.share_prompts = _on(share_prompts, not self.static)
        for key in ("compact", "share_prompts"):
            if getattr(self, key) and self.static:  # cache auto on CUDA
                raise ValueError(f"rollout.engine_kwargs.{key}: needs the dynamic cache (cache: dynamic)")
        self._compiled = None
        self.eos_ids = eos_ids_of(tokenizer, model)
        self.ignore_eos = bool(ignore_eos)  # vLLM's ignore_eos: every row runs to max_new_tokens (benchmarks)
        self.autocast = autocast  # none | bfloat16: prefill and decode steps under torch.autocast
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.eos_ids[0])
        self._cache_kw = cache_kwarg(model)  # transformers >= 5.2x renamed past_key_values to cache

    @classmethod
    def check_options(cls, opts: dict) -> None:
        """``ValueError("rollout.engine_kwargs.<key>: <why>")`` for options that cannot work
        together (config validation runs it before anything is loaded or written)."""
        cache, rng, compact, share_prompts, autocast = (opts[k] for k in ("cache", "rng", "compact",
                                                                          "share_prompts", "autocast"))
        if autocast not in AUTOCAST:
            raise ValueError(f"rollout.engine_kwargs.autocast: {autocast!r}; known: {', '.join(AUTOCAST)}")
        if cache not in ("auto", "dynamic", "static"):
            raise ValueError(f"rollout.engine_kwargs.cache: {cache!r}; known: auto, dynamic, static")
        if rng not in ("batch", "per_row"):
            raise ValueError(f"rollout.engine_kwargs.rng: {rng!r}; known: batch, per_row")
        for key, v in (("compact", compact), ("share_prompts", share_prompts)):
            if not (isinstance(v, bool) or v == "auto"):
                raise ValueError(f"rollout.engine_kwargs.{key}: {v!r}; known: auto, true, false")
        if compact is True and rng != "per_row":
            raise ValueError("rollout.engine_kwargs.compact: needs rng: per_row (with the batch stream, dropping "
                             "finished rows would change every later sample)")
        for key, on in (("compact", compact), ("share_prompts", share_prompts)):
            if on is True and cache == "static":
                raise ValueError(f"rollout.engine_kwargs.{key}: needs the dynamic cache (cache: dynamic)")

    def sync_weights(self, model) -> None:
        self.model = model  # same process, same parameters: nothing to copy (FSDP may hand over its wrapper)

    @torch.no_grad()
    def score(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        """The responses' log-probs from the forward this engine samples with (its model, its
        autocast)."""
        was = self.model.training
        self.model.eval()
        try:
            dev = next(self.model.parameters()).device
            ids, att, resp = pack(prompt_ids, response_ids, self.pad_id, dev)
            with autocast(self.autocast, dev):
                lp, _ = naive_logprobs(self.model, ids, att, resp)
        finally:
            self.model.train(was)
        return [lp[i, len(p) - 1: len(p) - 1 + len(r)].tolist() for i, (p, r) in enumerate(zip(prompt_ids,
                                                                                                  response_ids))]

    def _lockstep(self) -> bool:
        """FSDP-sharded model in a multi-process run: forwards are collective, ranks stop
        together."""
        return _is_fsdp(self.model) and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1

    def _step(self, **kw):
        """One decode step (the compiled one on the fast path)."""
        if self.autocast == "none":
            return self._step_logits(**kw)
        with autocast(self.autocast, next(self.model.parameters()).device):
            return self._step_logits(**kw)

    def _step_logits(self, **kw):
        if self.compile:
            if self._compiled is None:
                self._compiled = torch.compile(lambda **k: self.model(**k).logits, mode=self.compile_mode)
            if next(self.model.parameters()).is_cuda:
                torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs were consumed
            return self._compiled(**kw)
        return self.model(**kw).logits

    def decoder(self, prompts: list[list[int]], max_new_tokens: int) -> "Decoder":
        """A one-batch decode state of this engine's model (cache, masks, positions) for
        ``prompts``."""
        return Decoder(self, prompts, max_new_tokens)

    @torch.no_grad()
    def _sample_batch(self, prompts: list[list[int]], p: SamplingParams, gen: torch.Generator, first_row: int = 0):
        dec = self.decoder(prompts, p.max_new_tokens)
        B, dev = len(prompts), dec.dev
        lockstep = self._lockstep()
        eos = torch.tensor([] if self.ignore_eos else self.eos_ids, dtype=torch.long, device=dev)
        out_tok = torch.full((B, p.max_new_tokens), self.pad_id, dtype=torch.long, device=dev)
        out_lp = torch.zeros((B, p.max_new_tokens), dtype=torch.float32, device=dev)
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        lengths = torch.full((B,), p.max_new_tokens, dtype=torch.long, device=dev)
        u = row_uniforms(p.seed, first_row, B, p.max_new_tokens, dev) if self.per_row else None
        live = torch.arange(B, device=dev)  # the original row of each row of the decode batch (compaction)
        logits = dec.prefill()
        for t in range(p.max_new_tokens):
            tok, lp = sample_next(logits, p, gen) if u is None else sample_inverse_cdf(logits, p, u[live, t])
            was_done = done[live]
            tok = torch.where(was_done, torch.full_like(tok, self.pad_id), tok)
            out_tok[live, t] = tok
            out_lp[live, t] = torch.where(was_done, torch.zeros_like(lp), lp)
            hit = (~was_done) & torch.isin(tok, eos)
            lengths[live] = torch.where(hit, torch.full_like(tok, t + 1), lengths[live])
            ended = was_done | hit
            done[live] = ended
            finished = bool(done.all())
            if lockstep:
                finished = self.all_ranks_done(finished)
            if finished or t == p.max_new_tokens - 1:
                break
            n_ended = int(ended.sum())
            if self.compact and n_ended * 4 >= len(live) and n_ended < len(live):  # (lock-step: keep >= 1 row)
                keep = (~ended).nonzero().squeeze(1)
                dec.select(keep)
                live, tok = live[keep], tok[keep]
            logits = dec.step(tok)
        return unpad(out_tok, out_lp, lengths, done)

    def _sample_fallback(self, prompts, p, gen, first_row: int = 0):
        """The fast path, or (if it fails the first time it is used) the dynamic path, same
        generator state."""
        if not self.static:
            return self._sample_batch(prompts, p, gen, first_row)
        state = gen.get_state()
        try:
            return self._sample_batch(prompts, p, gen, first_row)
        except Exception as e:  # an unsupported model/transformers combination: never fail a run for speed
            if self._lockstep():
                raise
            warnings.warn(f"HF engine fast path (static cache{' + torch.compile' if self.compile else ''}) "
                          f"failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                          "using the dynamic cache", stacklevel=2)
            self.static = self.compile = False
            gen.set_state(state)
            return self._sample_batch(prompts, p, gen, first_row)

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollouts:
        was_training = self.model.training
        self.model.eval()
        dev = next(self.model.parameters()).device
        gen = torch.Generator(device=dev).manual_seed(int(params.seed))
        flat = [x for x in prompt_ids for _ in range(params.n)]  # prompt-major
        ids, lps, trunc = [], [], []
        # sort by prompt length inside each chunk is unnecessary for equal-format prompts; keep
        # order
        for s in range(0, len(flat), self.max_batch):
            a, b, c = self._sample_fallback(flat[s : s + self.max_batch], params, gen, s)
            ids += a
            lps += b
            trunc += c
        if was_training:
            self.model.train()
        texts = decode_responses(self.tokenizer, ids)
        return Rollouts(prompt_ids=[list(x) for x in prompt_ids], response_ids=ids, texts=texts,
                        logprobs=lps, truncated=trunc, n=params.n)


def _on(value: bool | str, auto: bool) -> bool:
    """An engine switch: ``True`` / ``False`` as given, ``"auto"`` as the engine's default
    ``auto``."""
    return auto if value == "auto" else bool(value)


def sample_next(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row from the last-position ``logits`` (B, 1, V): greedy at temperature 0
    (log-prob 0), else a draw from softmax(top_p(top_k(logits / T))) with its log-probability under
    that distribution."""
    logits = logits[:, -1, :].float()
    if p.temperature <= 0:
        return logits.argmax(-1), torch.zeros(logits.shape[0], device=logits.device)
    logp = processed_logprobs(logits, p)
    tok = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def row_uniforms(seed: int, first_row: int, rows: int, steps: int, dev) -> torch.Tensor:
    """(rows, steps) uniforms in [0, 1): row j's from a CPU generator seeded with the 63-bit draw of
    ``SeedSequence([seed, first_row + j])`` (one stream per response row, whatever its batch)."""
    out = torch.empty((rows, steps), dtype=torch.float64)
    for j in range(rows):
        s = int(np.random.SeedSequence([int(seed) & (2**63 - 1), first_row + j]).generate_state(1, np.uint64)[0])
        out[j] = torch.rand(steps, generator=torch.Generator().manual_seed(s >> 1), dtype=torch.float64)
    return out.to(dev)


def sample_inverse_cdf(logits: torch.Tensor, p: SamplingParams, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sample_next` with the row's own uniform ``u`` (B,): the first token whose cumulative
    probability exceeds u × total (a zero-probability token is never taken); greedy at temperature
    0."""
    logits = logits[:, -1, :].float()
    if p.temperature <= 0:
        return logits.argmax(-1), torch.zeros(logits.shape[0], device=logits.device)
    logp = processed_logprobs(logits, p)
    cdf = logp.double().exp().cumsum(-1)
    tok = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(-1).clamp(max=cdf.shape[-1] - 1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def unpad(out_tok: torch.Tensor, out_lp: torch.Tensor, lengths: torch.Tensor, done: torch.Tensor, *extra):
    """Per-row lists cut at each row's length: (ids, logprobs, truncated, *extra per-token
    columns)."""
    lengths, done = lengths.tolist(), done.tolist()
    tok, lp = out_tok.tolist(), out_lp.tolist()
    cols = [x.tolist() for x in extra]
    res = ([tok[i][:n] for i, n in enumerate(lengths)], [lp[i][:n] for i, n in enumerate(lengths)],
           [not d for d in done])
    return res + tuple([c[i][:n] for i, n in enumerate(lengths)] for c in cols)


class Decoder:
    """The decode state of one model over one left-padded batch: its KV cache (a ``DynamicCache``,
    or on the fast path a ``StaticCache`` of bucketed length with a fixed-length mask), attention
    mask and positions. ``prefill()`` runs the prompts and returns the last position's logits;
    ``step(tok)`` feeds one token per row (every row, finished or not, so shapes stay fixed) and
    returns the next logits."""

    def __init__(self, engine: HFEngine, prompts: list[list[int]], max_new_tokens: int):
        self.engine = engine
        model = engine.model
        self.dev = dev = next(model.parameters()).device
        self.row_prompt = None  # share_prompts: which distinct prompt each row has
        if engine.share_prompts and not engine.static:
            uniq, rows = distinct(prompts)
            if len(uniq) < len(prompts):
                self.row_prompt = torch.tensor(rows, device=dev)
                prompts = uniq
        self.ids, self.mask, self.pos = left_pad(prompts, engine.pad_id, dev)
        B, L = self.ids.shape
        self.L, self.t = L, 0
        if engine.static:  # fixed shapes: cache and mask span the bucketed maximum length
            # lazy: transformers is slow to import
            from transformers import StaticCache

            total = math.ceil((L + max_new_tokens) / engine.cache_bucket) * engine.cache_bucket
            self.cache = StaticCache(config=model.config, max_cache_len=total)
            self.full_mask = torch.zeros((B, total), dtype=self.mask.dtype, device=dev)
            self.full_mask[:, :L] = self.mask
        else:
            # lazy: transformers is slow to import
            from transformers import DynamicCache

            self.cache = DynamicCache()
            self.full_mask = None

    def prefill(self) -> torch.Tensor:
        e = self.engine
        with autocast(e.autocast, self.dev):
            out = e.model(input_ids=self.ids, attention_mask=self.mask if self.full_mask is None else self.full_mask,
                          position_ids=self.pos, use_cache=True, logits_to_keep=1, **{e._cache_kw: self.cache}).logits
        if self.row_prompt is not None:  # from the distinct prompts to the rows
            self.cache.batch_select_indices(self.row_prompt)
            r = self.row_prompt
            self.ids, self.mask, self.pos = self.ids[r], self.mask[r], self.pos[r]
            out = out[r]
        self.next_pos = self.pos[:, -1] + 1
        return out

    def select(self, keep: torch.Tensor) -> None:
        """Keep only the batch rows ``keep`` (dynamic cache): their KV cache rows, mask and next
        positions."""
        self.cache.batch_select_indices(keep)
        self.mask, self.next_pos = self.mask[keep], self.next_pos[keep]

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        e = self.engine
        if self.full_mask is None:
            self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
            step_mask = self.mask
        else:
            self.full_mask[:, self.L + self.t] = 1
            step_mask = self.full_mask
        out = e._step(input_ids=tok[:, None], attention_mask=step_mask, position_ids=self.next_pos[:, None],
                      use_cache=True, **{e._cache_kw: self.cache})
        self.next_pos = self.next_pos + 1
        self.t += 1
        return out
