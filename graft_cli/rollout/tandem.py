"""The tandem rollout engine: a trained senior and a frozen junior co-generate every response
(tandem.md §2.2–§2.3, §2.12; ``rollout.engine: tandem``).

Both models step every token of every sequence of the batch together, each with its own KV cache
(the transformers cache classes through :class:`graft_cli.rollout.hf.Decoder`: a ``DynamicCache`` on
CPU, on CUDA the static-cache compiled path of the HF engine). Each samples a candidate from its own
logits with the same sampling parameters, ``chosen = where(senior, senior_token, junior_token)``,
and the chosen token is fed to both caches. Who writes the next token is a registered handoff
schedule (:mod:`graft_cli.rollout.handoff`; default ``word``: Bernoulli(p = 0.5) at the start and
after every word-opening token or 32 tokens without a redraw), with one row of seeded draws per
sequence, so a resumed run co-generates exactly what the uninterrupted one did.

Returned with the rollouts: ``token_columns["author"]``, per response token 1 = senior, 0 = junior
(it goes into the batch as the ``author`` column and into the rollout logs), and
``meta["metrics"]``: ``tandem/senior_token_frac`` (expected in [0.3, 0.7] at p = 0.5),
``tandem/redraws_per_response``, ``tandem/switches_per_response``, ``tandem/tokens_senior`` /
``tandem/tokens_junior`` (per response) and ``tandem/boundary_ids`` (|B|). ``logprobs`` are the
rollout log-probs: each token's log-probability under the processed distribution of the model that
wrote it (senior and junior together are the behaviour policy; the trainer recomputes the senior's
own as π_old).

Senior and junior must share a vocabulary (one token id is fed to both): the trainer checks it
before anything is written. ``eval_engine()`` is the senior alone (validation during training runs
the senior solo, tandem.md §2.6).

Engine options (``rollout.engine_kwargs``): ``junior`` (the name of a ``role: frozen`` model of the
run; the trainer passes the loaded model), ``schedule`` (word | bernoulli | alternating | sentence |
chunk), ``p_senior`` (0.5), ``max_gap_tokens`` (32), ``chunk_size`` (32), ``delimiter``
(``"\\n\\n"``, the ``sentence`` schedule's step end), and the HF engine's ``cache`` / ``compile`` /
``compile_mode`` / ``cache_bucket``. """

from __future__ import annotations

import warnings

import torch

from graft_cli.models.retokenize import decode_responses
from graft_cli.batch import Rollouts
from graft_cli.rollout.engine import ENGINES, RolloutEngine, SamplingParams
from graft_cli.rollout.handoff import HANDOFFS, HandoffContext, boundary_for, initial_state, row_uniforms
from graft_cli.rollout.hf import HFEngine, sample_next, unpad

OWN_OPTIONS = {"junior": None, "schedule": "word", "p_senior": 0.5, "max_gap_tokens": 32, "chunk_size": 32,
               "delimiter": "\n\n"}


@ENGINES.register("tandem")
class TandemEngine(RolloutEngine):
    options = {**OWN_OPTIONS, **HFEngine.options}  # its own, then the HF engine's (senior's and junior's decoders)
    choices = {"schedule": HANDOFFS}
    frozen_kwargs = ("junior",)  # engine options that name a frozen model of the run (the trainer resolves them)
    policy_logprobs = False  # its log-probs are the writer's (senior or junior): never the policy's old log-probs
    own_kwargs = tuple(OWN_OPTIONS)
    solo_engine = "hf"  # a checkpoint evaluated alone samples with the HF engine (the other options kept)

    @classmethod
    def check_options(cls, opts: dict) -> None:
        if not 0.0 <= float(opts["p_senior"]) <= 1.0:
            raise ValueError(f"rollout.engine_kwargs.p_senior: must be in [0, 1], got {opts['p_senior']}")
        if int(opts["max_gap_tokens"]) < 1 or int(opts["chunk_size"]) < 1:
            raise ValueError("rollout.engine_kwargs.max_gap_tokens and chunk_size must be >= 1")
        HFEngine.check_options({k: opts[k] for k in HFEngine.options})

    def __init__(self, model, tokenizer, junior=None, schedule: str = "word", p_senior: float = 0.5,
                 max_gap_tokens: int = 32, chunk_size: int = 32, delimiter: str = "\n\n", max_batch: int = 256,
                 **hf_kwargs):
        if junior is None:
            raise ValueError("rollout.engine_kwargs.junior: the tandem engine needs a junior (a role: frozen model)")
        self.check_kwargs(schedule=schedule, p_senior=p_senior, max_gap_tokens=max_gap_tokens, chunk_size=chunk_size,
                          delimiter=delimiter, **hf_kwargs)
        self.senior = HFEngine(model, tokenizer, max_batch=max_batch, **hf_kwargs)
        self.junior = HFEngine(junior, tokenizer, max_batch=max_batch, **hf_kwargs)
        self.tokenizer, self.max_batch = tokenizer, max_batch
        self.schedule, self.p_senior = schedule, float(p_senior)
        self.max_gap_tokens, self.chunk_size = int(max_gap_tokens), int(chunk_size)
        self.boundary = boundary_for(schedule, tokenizer, delimiter)  # once, from the vocabulary
        self.eos_ids, self.pad_id = self.senior.eos_ids, self.senior.pad_id

    @property
    def model(self):
        return self.senior.model

    def sync_weights(self, model) -> None:
        self.senior.sync_weights(model)

    def score(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        """The senior's log-probs: the trained weights this engine samples from."""
        return self.senior.score(prompt_ids, response_ids)

    def eval_engine(self):
        """The senior alone: what validation and solo evaluation sample from (asking the same
        process group)."""
        self.senior.ranks_done = self.ranks_done
        return self.senior

    @torch.no_grad()
    def _sample_batch(self, prompts: list[list[int]], rows: list[int], p: SamplingParams, gen: torch.Generator):
        T = p.max_new_tokens
        ds, dj = self.senior.decoder(prompts, T), self.junior.decoder(prompts, T)
        B, dev = len(prompts), ds.dev
        lockstep = self.senior._lockstep() or self.junior._lockstep()
        ctx = HandoffContext(uniforms=row_uniforms(p.seed, rows, T + 1, dev), boundary=self.boundary.to(dev),
                             p_senior=self.p_senior, max_gap_tokens=self.max_gap_tokens, chunk_size=self.chunk_size)
        step_fn = HANDOFFS.get(self.schedule)
        state = initial_state(self.schedule, ctx, B, dev)
        first_draws = state.draws.clone()
        eos = torch.tensor(self.eos_ids, device=dev)
        out_tok = torch.full((B, T), self.pad_id, dtype=torch.long, device=dev)
        out_lp = torch.zeros((B, T), dtype=torch.float32, device=dev)
        out_author = torch.zeros((B, T), dtype=torch.long, device=dev)
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        lengths = torch.full((B,), T, dtype=torch.long, device=dev)
        draws_at_end = torch.zeros(B, dtype=torch.long, device=dev)
        ls, lj = ds.prefill(), dj.prefill()
        for t in range(T):
            ts, lps = sample_next(ls, p, gen)
            tj, lpj = sample_next(lj, p, gen)
            tok = torch.where(state.senior, ts, tj)
            lp = torch.where(state.senior, lps, lpj)
            tok = torch.where(done, torch.full_like(tok, self.pad_id), tok)
            out_tok[:, t] = tok
            out_lp[:, t] = torch.where(done, torch.zeros_like(lp), lp)
            out_author[:, t] = state.senior.long()
            draws_at_end = torch.where(done, draws_at_end, state.draws)  # draws that chose an emitted token's author
            state = step_fn(state, tok, ctx)
            hit = (~done) & torch.isin(tok, eos)
            lengths = torch.where(hit, torch.full_like(lengths, t + 1), lengths)
            done |= hit
            finished = bool(done.all())
            if lockstep:
                finished = self.all_ranks_done(finished)
            if finished or t == T - 1:
                break
            ls, lj = ds.step(tok), dj.step(tok)
        redraws = (draws_at_end - first_draws).clamp(min=0).tolist()  # redraws after the start
        ids, lps, trunc, author = unpad(out_tok, out_lp, lengths, done, out_author)
        return ids, lps, trunc, author, redraws

    def _sample_fallback(self, prompts, rows, p, gen):
        if not (self.senior.static or self.junior.static):
            return self._sample_batch(prompts, rows, p, gen)
        state = gen.get_state()
        try:
            return self._sample_batch(prompts, rows, p, gen)
        except Exception as e:  # an unsupported model/transformers combination: never fail a run for speed
            if self.senior._lockstep():
                raise
            warnings.warn(f"tandem engine fast path failed ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}); using the dynamic cache", stacklevel=2)
            for eng in (self.senior, self.junior):
                eng.static = eng.compile = False
            gen.set_state(state)
            return self._sample_batch(prompts, rows, p, gen)

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollouts:
        models = (self.senior.model, self.junior.model)
        was = [m.training for m in models]
        for m in models:
            m.eval()
        dev = next(self.senior.model.parameters()).device
        gen = torch.Generator(device=dev).manual_seed(int(params.seed))
        flat = [x for x in prompt_ids for _ in range(params.n)]  # prompt-major
        ids, lps, trunc, author, redraws = [], [], [], [], []
        for s in range(0, len(flat), self.max_batch):
            chunk = flat[s:s + self.max_batch]
            a, b, c, d, e = self._sample_fallback(chunk, list(range(s, s + len(chunk))), params, gen)
            ids += a
            lps += b
            trunc += c
            author += d
            redraws += e
        for m, w in zip(models, was):
            m.train(w)
        texts = decode_responses(self.tokenizer, ids)
        ro = Rollouts(prompt_ids=[list(x) for x in prompt_ids], response_ids=ids, texts=texts, logprobs=lps,
                      truncated=trunc, n=params.n)
        ro.token_columns["author"] = author
        ro.meta["metrics"] = author_metrics(author, redraws, int(self.boundary.sum()))
        return ro


def author_metrics(author: list[list[int]], redraws: list[int], boundary_size: int) -> dict:
    """Per-step tandem metrics from the author masks: senior token share over all tokens, redraws
    and author switches per response, tokens per author per response."""
    n = max(len(author), 1)
    sen = sum(sum(a) for a in author)
    tot = sum(len(a) for a in author)
    switches = sum(sum(1 for x, y in zip(a, a[1:]) if x != y) for a in author)
    return {"tandem/senior_token_frac": sen / tot if tot else 0.0,
            "tandem/redraws_per_response": sum(redraws) / n,
            "tandem/switches_per_response": switches / n,
            "tandem/tokens_senior": sen / n, "tandem/tokens_junior": (tot - sen) / n,
            "tandem/boundary_ids": boundary_size}
