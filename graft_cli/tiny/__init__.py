"""The embedded tiny heterogeneous pair: two small, *different* models built from scratch on CPU.

``pair=tiny`` (the default) must run every method of the study for real on a laptop. Real pairs are
3B models on MATH; here :func:`build_tiny` builds, in a few minutes on 2 CPU cores,

* ``a``: a ``Qwen3ForCausalLM`` (hidden 192, 4 layers, 4 query / 2 KV heads, MLP 576, tied
  embeddings; 1.83M parameters) with a Qwen-style **byte-level BPE** (single digits, merges free
  across punctuation, a LaTeX command kept whole: ``\boxed{`` is 2 tokens; vocabulary 324);
* ``b``: a ``LlamaForCausalLM`` (hidden 192, 4 layers, 4/4 heads, MLP 512, tied; 1.83M) with a GPT-2
  / Llama-3-style **byte-level BPE** (single digits, the GPT-2 pre-tokenizer regex: ``\boxed{`` is 3
  tokens; vocabulary 308), trained on a differently seeded corpus, plus the constant prompt suffix
  as one added token. The two vocabularies and merge lists differ, but the granularity is that of
  two real subword tokenizers: a reference response re-tokenized from ``a`` to ``b`` is ~1.06x as
  long (DeepSeek's vs SmolLM2's tokenizer on MATH500 solutions: 0.86x), so GRAFT's per-token
  compatibility score compares like with like (a character-level ``b``, this pair's first version,
  made it 1.5x and pulled ``a``'s scores down);
* ``c`` (``pair=tiny3``, the three-model miniature): a ``GPTNeoXForCausalLM`` (hidden 192, 4 layers,
  4 heads, MLP 640, parallel attention + MLP residual, LayerNorm, rotary on a quarter of each head,
  untied embeddings; 1.61M) with a Gemma-style **SentencePiece BPE** (``"▁"`` for spaces, no dummy
  prefix, pieces within words, single digits, a character alphabet with ``<unk>``:
  :func:`build_tokenizer_c`), blind on multiplication; the weakest of the three, as Qwen3-1.7B is
  the weaker model of the paper's first pair;
* ``teacher``: model ``a`` trained longer (continued SFT on a balanced, harder mix) — same
  architecture and tokenizer as ``a``, stronger everywhere: the on-policy distillation teacher;
* ``junior``: an early snapshot of ``a``'s SFT run — same tokenizer as ``a``, clearly weaker but
  not useless: the junior of tandem training.

Why ~1.8M rather than ~3M parameters: the build has a fixed CPU budget (single-threaded workers,
~800-960 SFT steps per model, under 5 minutes), so model size trades against SFT steps. In
calibration runs at equal CPU time (~270 s), a 3.2M model (hidden 256) reached pass@1 0.13-0.16
after 560 steps while the 1.8M model (hidden 192) reached 0.33-0.37 after 840 steps; smaller models
also make RL steps cheaper.

Structural complementarity by construction, properties by measurement
--------------------------------------------------------------------- The two bases are pretrained
(SFT on worked solutions, loss on response tokens + EOS only) with *different skill mixes* over the
synthetic task's six families (:mod:`graft_cli.data.synthetic`), and each has a **structural blind
spot**, as the paper's pairs do (SmolLM3 solves 47.9% of Qwen3's all-fail prompts): ``a`` almost
never sees fractions (``frac`` weight 0.01) and ``b`` almost never sees linear equations (``lin``
0.01), while each is trained hard on the other's blind family (``b``: ``frac`` 1.6; ``a``: ``lin``
1.0). At the start of RL each model all-fails most prompts of its blind family and the peer's group
is mixed on a large share of them: exactly the prompts GRAFT grafts on. :func:`check_tiny` measures
it (pass@1, all-fail share, complementarity both ways, and per family:
:func:`family_complementarity`, :func:`blind_spots`) with the project's own rollout engine and
math-verify reward on the training distribution; ``graft tiny build --check`` prints it.

Speed and determinism
---------------------
* Sequences are kept short (prompt + response + EOS: ~24 tokens on average under ``a`` and ``b``; at
  most 36) because RL step time on a CPU is proportional to tokens.
* The three tokenizer families train in three worker processes (``a`` then ``teacher``; ``b``;
  ``c``), each pinned to **one thread** with deterministic ops, fixed ``torch.manual_seed`` and a
  data stream seeded from ``(seed, role)``: the same seed gives the same weight hashes whether the
  jobs run in parallel processes or one after the other in-process (the hashes go into
  ``manifest.json``). Budgets are step counts, never wall-clock times, for the same reason.
  (Bit-identity is per machine/torch build: other CPU kernels may round differently.)
* The SFT schedule is a short linear warm-up then cosine decay of a high peak learning rate, which
  gets the most out of a few hundred steps; the final learning rate is kept well above zero so the
  models stay plastic for RL at lr ~1e-4.

Cache layout (``$GRAFT_CACHE`` or ``~/.cache/graft/tiny``): ``a/ b/ c/ teacher/ junior/`` (each a
``save_pretrained`` model + tokenizer folder, loadable offline with the Auto classes), ``task/``
(:func:`graft_cli.data.synthetic.write_task` output) and ``manifest.json`` (recipe, seed, hashes,
measured token statistics, each build's jobs and seconds), written last and atomically: a cache
without a valid manifest is rebuilt by :func:`ensure_tiny`. Roles are built when first asked for
(``tiny:a``, ``tiny:b`` and ``tiny:junior`` build the pair, ``tiny:teacher`` and ``tiny:c``
themselves, with the weights one build of all five gives); the manifest grows with them. The task
alone (``tiny:train``, the synthetic benchmarks) is written by
:func:`graft_cli.tiny.build.ensure_task` without building the models. """
