"""Real-shape models without a download (``run.model_init: random``): the published configs of the
paper's models, written out here, with random weights, and a synthetic tokenizer of the model's
vocabulary size.

Used to measure speed and memory on a GPU with no hub access (benchmarks/gpu_proof.sh). The configs
carry the published dimensions (vocabulary, hidden size, layers, heads, KV heads, MLP width, RoPE,
tied embeddings, special ids). ``run.random_shrink: true`` keeps a model's architecture class,
vocabulary and special ids but shrinks its width and depth (hidden 64, 2 layers), so the same
configs are tested on a CPU.

The synthetic tokenizer maps printable ASCII (and newline) to one id each, fills the rest of the
vocabulary with unused tokens, and puts EOS / pad at the config's ids: prompts encode, responses
decode, and every id the model can sample is a valid token. """

from __future__ import annotations

import torch

from graft_cli.errors import GraftError


def smollm3_3b():
    # lazy: transformers is slow to import
    from transformers import SmolLM3Config

    # SmolLM3-3B(-Base): 36 layers, d 2048, 16 heads / 4 KV heads, MLP 11008, vocab 128256, tied,
    # NoPE every 4th layer
    return SmolLM3Config(vocab_size=128256, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                         num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=65536,
                         rope_theta=5_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=128000,
                         eos_token_id=128012, pad_token_id=128004)


def qwen3_1p7b():
    # lazy: transformers is slow to import
    from transformers import Qwen3Config

    # Qwen3-1.7B(-Base): 28 layers, d 2048, 16 heads / 8 KV heads, head_dim 128, MLP 6144, vocab
    # 151936, tied
    return Qwen3Config(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                       rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=151643,
                       eos_token_id=151643, pad_token_id=151643)


def qwen3_4b():
    # lazy: transformers is slow to import
    from transformers import Qwen3Config

    # Qwen3-4B(-Instruct-2507): 36 layers, d 2560, 32 heads / 8 KV heads, head_dim 128, MLP 9728,
    # vocab 151936, tied
    return Qwen3Config(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=262144,
                       rope_theta=5_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=151643,
                       eos_token_id=151645, pad_token_id=151643)


def octothinker_3b():
    # lazy: transformers is slow to import
    from transformers import LlamaConfig

    # OctoThinker-3B-Hybrid-Base (Llama-3.2-3B): 28 layers, d 3072, 24 heads / 8 KV heads, MLP 8192,
    # vocab 128256, tied
    return LlamaConfig(vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                       num_attention_heads=24, num_key_value_heads=8, max_position_embeddings=131072,
                       rope_theta=500_000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=128000,
                       eos_token_id=128001, pad_token_id=128004,
                       rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})


SHAPES = {
    "HuggingFaceTB/SmolLM3-3B-Base": smollm3_3b, "HuggingFaceTB/SmolLM3-3B": smollm3_3b,
    "Qwen/Qwen3-1.7B-Base": qwen3_1p7b, "Qwen/Qwen3-1.7B": qwen3_1p7b,
    "Qwen/Qwen3-4B-Instruct-2507": qwen3_4b, "Qwen/Qwen3-4B": qwen3_4b,
    "OctoThinker/OctoThinker-3B-Hybrid-Base": octothinker_3b,
}


def shape_config(model: str, shrink: bool = False):
    """The published config of ``model`` (a hub id in :data:`SHAPES`); ``shrink``: the same
    architecture, vocabulary and special ids at hidden 64 / 2 layers / 4 heads (2 KV) for CPU
    tests."""
    if model not in SHAPES:
        raise GraftError(f"config key 'run.model_init': no published config for {model!r} here; known: "
                         f"{', '.join(sorted(SHAPES))}")
    cfg = SHAPES[model]()
    if shrink:
        cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers = 64, 128, 2
        cfg.num_attention_heads, cfg.num_key_value_heads = 4, 2
        if getattr(cfg, "head_dim", None):
            cfg.head_dim = 16
        for k in ("layer_types", "no_rope_layers", "sliding_window"):
            if hasattr(cfg, k) and isinstance(getattr(cfg, k), list):
                setattr(cfg, k, getattr(cfg, k)[:2])
    cfg._attn_implementation = "sdpa"
    return cfg


def char_tokenizer(vocab_size: int = 98, eos: int = 1, pad: int | None = 0):
    """A character-level tokenizer of ``vocab_size`` ids: EOS (``<|eos|>``) at ``eos``, pad
    (``<|pad|>``; EOS when ``pad`` is None) at ``pad``, printable ASCII and newline one id each on
    the lowest other ids, unused tokens on the rest; it pads on the left. Every id decodes, so every
    id a model can sample is a valid token. The defaults are the tests' and the benchmarks' layout:
    pad 0, EOS 1, the characters on 2..97."""
    # lazy: tokenizers only for building tokenizers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    # lazy: transformers is slow to import
    from transformers import PreTrainedTokenizerFast

    pad = eos if pad is None else pad
    chars = [chr(i) for i in range(32, 127)] + ["\n"]
    vocab, it = {}, iter(chars)
    for i in range(vocab_size):
        if i == eos:
            tok = "<|eos|>"
        elif i == pad:
            tok = "<|pad|>"
        else:
            tok = next(it, None) or f"<|unused_{i}|>"
        vocab[tok] = i
    pad_token = "<|pad|>" if pad != eos else "<|eos|>"
    tk = Tokenizer(models.WordLevel(vocab, unk_token=pad_token))
    tk.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|eos|>", pad_token=pad_token)
    tok.padding_side = "left"
    return tok


def synthetic_tokenizer(cfg):
    """The :func:`char_tokenizer` of a config's vocabulary size and EOS / pad ids (module
    docstring)."""
    eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, int) else cfg.eos_token_id[0]
    return char_tokenizer(int(cfg.vocab_size), eos, cfg.pad_token_id)


def random_model(model: str, dtype, shrink: bool = False, device="cpu"):
    """``(model with random weights, synthetic tokenizer)`` of the published shape of ``model``, its
    weights allocated and initialised on ``device`` (on a GPU: a second for a 3B model, where
    initialising on the host first took over 100 s on a 16-core machine, measured on the H200
    machine)."""
    # lazy: transformers is slow to import
    from transformers import AutoModelForCausalLM

    cfg = shape_config(model, shrink)
    with torch.device(device):
        m = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return m, synthetic_tokenizer(cfg)
