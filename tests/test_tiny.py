"""The embedded tiny pair and its synthetic task.

A REDUCED build (tiny shapes, a few dozen SFT steps: seconds) exercises the same code path as the
full one; the full build's targets are measured by ``graft tiny build --check``.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil

import pytest
import torch

from graft_cli.data import synthetic as syn
from graft_cli.data.prompts import PromptSpec
from graft_cli.tiny import build as tiny_build, check as tiny_check, sft as tiny_sft, tokenizers as tiny_tok

# ----------------------------------------------------------------------------------------------------
# Task


def test_task_deterministic_and_seeded():
    a = syn.build_task(0, train_size=300)
    b = syn.build_task(0, train_size=300)
    c = syn.build_task(1, train_size=300)
    assert a == b
    assert a["train"] != c["train"]


def test_write_task_files(tmp_path):
    p1 = syn.write_task(str(tmp_path / "x"), seed=3, train_size=200)
    p2 = syn.write_task(str(tmp_path / "y"), seed=3, train_size=200)
    assert set(p1) == {"train", "eval_math500", "eval_aime24", "eval_aime25", "eval_amc23", "eval_minerva"}
    for k in p1:
        assert os.path.basename(p1[k]) == f"{k}.jsonl"
        assert open(p1[k], "rb").read() == open(p2[k], "rb").read()
    sizes = {k: sum(1 for _ in open(v)) for k, v in p1.items()}
    assert sizes == {"train": 200, "eval_math500": 500, "eval_aime24": 30, "eval_aime25": 30, "eval_amc23": 40,
                     "eval_minerva": 272}
    # loadable by the project's problem loader (the path real data takes)
    from graft_cli.data.problems import load_problems

    probs = load_problems(p1["eval_aime24"])
    assert len(probs) == 30 and all(p.id and p.problem and p.answer for p in probs)


def test_eval_sets_held_out_and_harder():
    t = syn.build_task(0, train_size=2000)
    train = {r["problem"] for r in t["train"]}
    for name in syn.EVAL_SETS:
        recs = t[f"eval_{name}"]
        assert not train & {r["problem"] for r in recs}, name
        assert len({r["problem"] for r in recs}) == len(recs), name
    for name in ("aime24", "aime25"):
        assert all(r["level"] == 3 for r in t[f"eval_{name}"])
    assert {r["family"] for r in t["eval_math500"]} == set(syn.FAMILIES)


def _corrupt(answer: str) -> str:
    m = re.fullmatch(r"\\frac\{(\d+)\}\{(\d+)\}", answer)
    if m:
        return f"\\frac{{{int(m.group(1)) + 1}}}{{{m.group(2)}}}"
    return str(int(answer) + 1)


def test_reference_solutions_score_one_and_corruptions_zero():
    from graft_cli.reward.answers import grade_one

    t = syn.build_task(0, train_size=300)
    recs = t["train"] + t["eval_aime24"] + t["eval_amc23"]
    seen_fams = set()
    for r in recs:
        seen_fams.add((r["family"], r["level"]))
        assert r["solution"].rstrip().endswith("}") and "\\boxed{" in r["solution"]
        score, _ = grade_one(r["solution"], r["answer"])
        assert score == 1.0, r
        bad = r["solution"].rsplit("\\boxed{", 1)[0] + "\\boxed{" + _corrupt(r["answer"]) + "}"
        assert grade_one(bad, r["answer"])[0] == 0.0, (r, bad)
    assert len(seen_fams) == len(syn.FAMILIES) * len(syn.LEVELS)


@pytest.mark.parametrize("style", ["prose", "steps", "words"])
def test_v3_styles_score_one_and_corruptions_zero(style):
    """Every v3 style's text of every family and level grades 1 against the gold (a trailing '.' after the box
    included), and 0 with the boxed answer changed."""
    from graft_cli.reward.answers import grade_one

    rng = random.Random(f"styles:{style}")
    for fam in syn.FAMILIES:
        for lvl in syn.LEVELS:
            for _ in range(6):
                rec = syn.make_problem(rng, fam, lvl)
                text = syn.render(rec["worked"], style)
                assert grade_one(text, rec["answer"])[0] == 1.0, (style, text, rec["answer"])
                head, tail = text.rsplit("\\boxed{", 1)
                bad = head + "\\boxed{" + _corrupt(rec["answer"]) + "}" + tail.split("}", 1)[1]
                assert grade_one(bad, rec["answer"])[0] == 0.0, (style, bad)


# ----------------------------------------------------------------------------------------------------
# Tokenizers


@pytest.fixture(scope="module")
def toks():
    return tiny_tok.build_tokenizer_a(0), tiny_tok.build_tokenizer_b()


def test_tokenizers_differ_and_round_trip(toks):
    ta, tb = toks
    recs = syn.build_task(0, train_size=300)["train"]
    na_tot = nb_tot = 0
    for r in recs:
        for tk in (ta, tb):
            ids = tk(r["solution"], add_special_tokens=False)["input_ids"]
            assert tk.decode(ids + [tk.eos_token_id], skip_special_tokens=True) == r["solution"]
        na_tot += len(ta(r["solution"], add_special_tokens=False)["input_ids"])
        nb_tot += len(tb(r["solution"], add_special_tokens=False)["input_ids"])
    # two subword tokenizers of comparable granularity: the re-tokenized length ratio of the reference responses
    # lies in [0.85, 1.18] both ways (DeepSeek's vs SmolLM2's tokenizer on MATH500 solutions: 0.86)
    assert 0.85 <= nb_tot / na_tot <= 1.18 and 0.85 <= na_tot / nb_tot <= 1.18, nb_tot / na_tot
    # different vocabularies and merges: the same string gets different ids, the vocabularies differ in content
    sol = recs[0]["solution"]
    assert ta(sol, add_special_tokens=False)["input_ids"] != tb(sol, add_special_tokens=False)["input_ids"]
    assert set(ta.get_vocab()) != set(tb.get_vocab()) and len(ta) != len(tb)
    prompt = PromptSpec().text("8*9+4=?", ta)
    assert prompt.endswith("within \\boxed{}.\n") and "8*9+4=?" in prompt
    na, nb = len(PromptSpec().encode("8*9+4=?", ta)), len(PromptSpec().encode("8*9+4=?", tb))
    assert na <= 10 and nb <= 10, (na, nb)  # the suffix: two learned merges (a), one added token (b)
    # \boxed{ is split comparably: a keeps the command whole (" \boxed", "{"), b splits at punctuation
    assert ta.tokenize(" \\boxed{") == ["Ġ\\boxed", "{"]
    assert tb.tokenize(" \\boxed{") == ["Ġ\\", "boxed", "{"]
    for tk in (ta, tb):
        assert tk.eos_token and tk.pad_token and tk.padding_side == "left"
        assert not getattr(tk, "chat_template", None)
    # arbitrary text survives a round trip through the other model's tokenizer (re-tokenization)
    text = "12*3=36, so x = 7/2  \\boxed{\\frac{7}{2}}\nLet's think"
    for tk in (ta, tb):
        assert tk.decode(tk(text, add_special_tokens=False)["input_ids"], skip_special_tokens=True) == text


def test_third_tokenizer_sentencepiece_style(toks):
    """c (pair=tiny3): Gemma-style SentencePiece BPE (spaces as "▁", no dummy prefix, pieces within words),
    a third vocabulary of the same granularity as a's and b's."""
    ta, tb = toks
    tc = tiny_tok.build_tokenizer_c(0)
    recs = syn.build_task(0, train_size=300)["train"]
    n = {k: sum(len(t(r["solution"], add_special_tokens=False)["input_ids"]) for r in recs)
         for k, t in (("a", ta), ("b", tb), ("c", tc))}
    for x in ("a", "b"):
        assert 0.85 <= n["c"] / n[x] <= 1.18 and 0.85 <= n[x] / n["c"] <= 1.18, (x, n)
    for r in recs:
        ids = tc(r["solution"], add_special_tokens=False)["input_ids"]
        assert tc.decode(ids + [tc.eos_token_id], skip_special_tokens=True) == r["solution"]
    assert tc.tokenize(" \\boxed{") == ["\u2581\\boxed{"]  # merged across the space marker and punctuation
    assert tc.tokenize("6, x=?") == ["6", ",", "\u2581x=?"]  # no dummy prefix; "▁" opens a word
    assert "\u2581" not in "".join(ta.get_vocab()) + "".join(tb.get_vocab())  # a different family of vocabularies
    assert (tc.pad_token_id, tc.eos_token_id, tc.bos_token_id, tc.unk_token_id) == (0, 1, 2, 3)  # Gemma's order
    assert len(tc.convert_ids_to_tokens(tc("1234+5678=6912", add_special_tokens=False)["input_ids"])) == 14
    assert len(PromptSpec().encode("8*9+4=?", tc)) <= 10  # the constant suffix is one added token, as in b
    # a peer's text round-trips through c's tokenizer; a character outside its alphabet becomes <unk>
    text = "12*3=36, so x = 7/2  \\boxed{\\frac{7}{2}}\nLet's think"
    assert tc.decode(tc(text, add_special_tokens=False)["input_ids"], skip_special_tokens=True) == text
    assert tc.unk_token_id in tc("7\u00e9", add_special_tokens=False)["input_ids"]


def test_v3_tokenizers_words_and_ratios():
    """v3: a's pre-tokenizer is Qwen's regex (a word keeps its leading space, so the tandem word schedule sees it;
    digits single; " \\boxed" one piece; the prompt suffix one added token); every tokenizer trained on all three
    styles, so each model's own-style text re-tokenizes into a peer's tokenizer at a length ratio in [0.85, 1.18]."""
    v3 = tiny_sft.Recipe.v3()
    ta = tiny_tok.build_tokenizer_a(0, v3.bpe_vocab, v3.tokenizer_style("a"), v3.split_a)
    tb = tiny_tok.build_tokenizer_b(0, v3.bpe_vocab_b, v3.tokenizer_style("b"))
    tc = tiny_tok.build_tokenizer_c(0, v3.bpe_vocab_c, v3.tokenizer_style("c"))
    text = "To find 1+3*7, multiply first: 3*7=21. Then add: 1+21=22. The answer is \\boxed{22}."
    pieces = ta.tokenize(text)
    assert ta.convert_tokens_to_string(pieces) == text
    assert {"\u0120find", "\u0120multiply", "\u0120Then", "\u0120answer", "\u0120\\boxed"} <= set(pieces)
    assert [p for p in pieces if p.strip("\u0120").isdigit()] == [p for p in pieces if p.isdigit()]  # digits alone
    assert len(PromptSpec().encode("8*9+4=?", ta)) <= 10
    rng = random.Random(5)
    worked = [syn.sample_problem(rng)["worked"] for _ in range(300)]
    toks_ = {"a": ta, "b": tb, "c": tc}
    for x in "abc":
        own = [syn.render(w, v3.own_style(x)) for w in worked]
        n = {y: sum(len(t(own, add_special_tokens=False)["input_ids"][i]) for i in range(len(own)))
             for y, t in toks_.items()}
        for y in "abc":
            assert 0.85 <= n[y] / n[x] <= 1.18, (x, y, n)


@pytest.mark.parametrize("arch", ["a", "b", "c"])
def test_packed_sft_batch_has_the_padded_loss(arch):
    """sft_batch_packed: the examples in rows of 128 tokens, positions restarting per example; transformers masks
    each example to itself, so the loss equals the padded batch's (same label tokens), with fewer tokens computed."""
    v3 = tiny_sft.Recipe.v3()
    tok = {"a": lambda: tiny_tok.build_tokenizer_a(0, v3.bpe_vocab, "prose", "qwen"),
           "b": lambda: tiny_tok.build_tokenizer_b(0, v3.bpe_vocab_b, "steps"),
           "c": lambda: tiny_tok.build_tokenizer_c(0, v3.bpe_vocab_c, "words")}[arch]()
    shape = {"a": v3.shape_a, "b": v3.shape_b, "c": v3.shape_c}[arch]
    model = tiny_sft.make_model(tiny_sft.Shape(shape.arch, 64, 2, 2, 2 if arch != "a" else 1, 128), tok, 0).eval()
    rng = random.Random(1)
    ex = [syn.sft_example(rng, syn.TRAIN_MIX["families"], None, {v3.own_style(arch): 1.0}) for _ in range(32)]

    def loss(logits, labels):
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)),
                                                 labels[:, 1:].reshape(-1), ignore_index=-100)

    ids, mask, labels = tiny_sft.sft_batch(tok, ex)
    ids2, pos, labels2 = tiny_sft.sft_batch_packed(tok, ex, 128)
    with torch.no_grad():
        want = loss(model(input_ids=ids, attention_mask=mask).logits, labels)
        got = loss(model(input_ids=ids2, position_ids=pos, use_cache=False).logits, labels2)
    assert int((labels2 != -100).sum()) == int((labels != -100).sum())
    assert ids2.shape[1] == 128 and ids2.numel() < ids.numel()
    assert float(got) == pytest.approx(float(want), abs=1e-5)
    # the rows hold the examples in order: each one's tokens where its positions run 0..n-1
    flat = [(ids2[r, i].item(), pos[r, i].item()) for r in range(ids2.shape[0]) for i in range(ids2.shape[1])]
    seqs, cur = [], []
    for t, p in flat:
        if p == 0 and cur:
            seqs.append(cur)
            cur = []
        cur.append(t)
    seqs = [q for q in seqs + [cur] if set(q) != {tok.pad_token_id}]  # a row's padded tail restarts at 0 too
    assert seqs == [[t for t in row if t != tok.pad_token_id] for row in ids.tolist()]


@pytest.mark.parametrize("lengths,capacity,bins", [
    ([], 10, []),
    ([4, 4, 4], 10, [[0, 1], [2]]),                     # in order: 4+4, then 4
    ([3, 7, 5, 5], 10, [[1, 0], [2, 3]]),               # 7 first, 5 and 5 share; 3 joins 7 (first bin it fits)
    ([6, 5, 4, 3, 2], 10, [[0, 2], [1, 3, 4]]),       # 6+4, 5+3+2
    ([12, 3], 10, [[0], [1]]),                          # longer than a row: a row of its own, nothing joins it
    ([2, 9, 2, 9], 10, [[1], [3], [0, 2]]),             # greedy in order would use 4 rows: 2 | 9 | 2 | 9
])
def test_first_fit_decreasing_table(lengths, capacity, bins):
    got = tiny_sft.first_fit_decreasing(lengths, capacity)
    assert got == bins
    assert sorted(i for b in got for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= capacity or len(b) == 1 for b in got)


def test_ffd_packing_has_the_padded_loss_in_fewer_rows():
    """order="ffd": the same examples and label tokens as the in-order packing, each still at positions 0..n-1, in
    no more rows; the loss (one model, no grad) equals the padded batch's."""
    v3 = tiny_sft.Recipe.v3()
    tok = tiny_tok.build_tokenizer_b(0, v3.bpe_vocab_b, "steps")
    model = tiny_sft.make_model(tiny_sft.Shape("llama", 64, 2, 2, 2, 128), tok, 0).eval()
    rng = random.Random(2)
    ex = [syn.sft_example(rng, syn.TRAIN_MIX["families"], None, {"steps": 1.0}) for _ in range(32)]
    ids, mask, labels = tiny_sft.sft_batch(tok, ex)
    g_ids, _, _ = tiny_sft.sft_batch_packed(tok, ex, 128)
    f_ids, f_pos, f_labels = tiny_sft.sft_batch_packed(tok, ex, 128, order="ffd")
    assert f_ids.shape[0] <= g_ids.shape[0] and f_ids.shape[1] == 128
    assert int((f_labels != -100).sum()) == int((labels != -100).sum())

    def loss(logits, lab):
        return float(torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)),
                                                       lab[:, 1:].reshape(-1), ignore_index=-100))

    with torch.no_grad():
        want = loss(model(input_ids=ids, attention_mask=mask).logits, labels)
        got = loss(model(input_ids=f_ids, position_ids=f_pos, use_cache=False).logits, f_labels)
    assert got == pytest.approx(want, abs=1e-5)
    seqs = []  # every example, whole, once: split the rows where positions restart
    for r in range(f_ids.shape[0]):
        cur = []
        for t, p in zip(f_ids[r].tolist(), f_pos[r].tolist()):
            if p == 0 and cur:
                seqs.append(cur)
                cur = []
            cur.append(t)
        seqs.append(cur)
    seqs = sorted(q for q in seqs if set(q) != {tok.pad_token_id})
    assert seqs == sorted([t for t in row if t != tok.pad_token_id] for row in ids.tolist())
    with pytest.raises(ValueError, match="pack order 'nope'"):
        tiny_sft.sft_batch_packed(tok, ex, 128, order="nope")


def test_recipe_v6_is_v5_packed_ffd_and_old_caches_keep_their_recipe_dict():
    v5, v6 = tiny_sft.Recipe.v5(), tiny_sft.Recipe.v6()
    for k in ("stage_a", "stage_b", "stage_c", "stage_teacher"):
        assert getattr(v6, k).pack_order == "ffd" and getattr(v5, k).pack_order == "greedy"
        # v5's dict has no pack_order key (a cache built before the field existed still matches its recipe)
        assert "pack_order" not in v5.to_dict()[k] and v6.to_dict()[k]["pack_order"] == "ffd"
    assert v6.stage_b.steps == 700 and v6.stage_a.steps == v5.stage_a.steps
    assert v6.stage_b.families == v5.stage_b.families and v6.shape_b == v5.shape_b
    assert tiny_sft.Recipe.from_dict(v6.to_dict()) == v6 and tiny_sft.Recipe.from_dict(v5.to_dict()) == v5


def test_digits_are_single_tokens(toks):
    ta, tb = toks
    for tk in (ta, tb):
        toks_ = tk.convert_ids_to_tokens(tk("1234+5678=6912", add_special_tokens=False)["input_ids"])
        assert len(toks_) == 14


# ----------------------------------------------------------------------------------------------------
# Reduced build


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("tiny"))
    paths = tiny_build.build_tiny(d, seed=0, recipe=tiny_sft.Recipe.reduced(), workers=1, progress=False)
    return d, paths


def test_build_outputs_and_auto_round_trip(built):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, paths = built
    assert set(paths) == {"a", "b", "c", "teacher", "junior", "task"}
    man = tiny_build.read_manifest(d)
    assert man["version"] == tiny_build.TINY_VERSION and set(man["hashes"]) == set(tiny_build.ROLES)
    # the machine the weights were built on: this one's CPU model, kernel level and torch
    cpu = next((x.split(":", 1)[1].strip() for x in open("/proc/cpuinfo") if x.startswith("model name")), None)
    assert man["machine"]["torch"] == torch.__version__ and man["machine"]["cpu"] == (cpu or man["machine"]["cpu"])
    assert man["machine"]["kernels"] == torch.backends.cpu.get_cpu_capability()
    assert all(f.startswith(("avx", "fma", "amx")) for f in man["machine"]["vector"])
    arch = {}
    for role in tiny_build.ROLES:
        m = AutoModelForCausalLM.from_pretrained(paths[role])
        tk = AutoTokenizer.from_pretrained(paths[role])
        arch[role] = type(m).__name__
        assert tiny_sft.weight_hash(m) == man["hashes"][role]
        assert tk.eos_token_id == m.config.eos_token_id and tk.pad_token_id is not None
        assert tk.padding_side == "left"
        ids = tk(PromptSpec().text("3+4=?", tk), add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            assert torch.isfinite(m(input_ids=ids).logits).all()
    assert arch == {"a": "Qwen3ForCausalLM", "b": "LlamaForCausalLM", "c": "GPTNeoXForCausalLM",
                    "teacher": "Qwen3ForCausalLM", "junior": "Qwen3ForCausalLM"}
    # teacher and junior share a's tokenizer; b's and c's differ
    tj = {r: open(os.path.join(paths[r], "tokenizer.json")).read() for r in tiny_build.ROLES}
    assert tj["a"] == tj["teacher"] == tj["junior"] != tj["b"] != tj["c"] != tj["a"]
    assert os.path.isfile(os.path.join(paths["task"], "eval_minerva.jsonl"))


def test_build_deterministic(built, tmp_path):
    d, _ = built
    again = str(tmp_path / "again")
    tiny_build.build_tiny(again, seed=0, recipe=tiny_sft.Recipe.reduced(), workers=1, progress=False)
    assert tiny_build.read_manifest(again)["hashes"] == tiny_build.read_manifest(d)["hashes"]
    other = str(tmp_path / "other")
    tiny_build.build_tiny(other, seed=1, recipe=tiny_sft.Recipe.reduced(steps=4), workers=1, progress=False)
    assert tiny_build.read_manifest(other)["hashes"]["a"] != tiny_build.read_manifest(d)["hashes"]["a"]


@pytest.mark.slow
def test_parallel_build_matches_in_process(built, tmp_path):
    d, _ = built
    par = str(tmp_path / "par")
    tiny_build.build_tiny(par, seed=0, recipe=tiny_sft.Recipe.reduced(), workers=2, progress=False)
    assert tiny_build.read_manifest(par)["hashes"] == tiny_build.read_manifest(d)["hashes"]


def test_ensure_reuses_and_rebuilds_half_built(built):
    d, paths = built
    man_path = os.path.join(d, "manifest.json")
    before = os.path.getmtime(man_path)
    assert tiny_build.ensure_tiny(d, recipe=tiny_sft.Recipe.reduced(), progress=False) == paths
    assert os.path.getmtime(man_path) == before  # reused, not rebuilt
    hashes = tiny_build.read_manifest(d)["hashes"]
    os.remove(man_path)  # a half-built cache has no manifest
    tiny_build.ensure_tiny(d, recipe=tiny_sft.Recipe.reduced(), progress=False)
    assert tiny_build.read_manifest(d)["hashes"] == hashes


@pytest.mark.parametrize("missing,have,jobs", [
    ({"a", "b", "junior"}, set(), ["a", "b"]),          # the pair
    ({"teacher"}, set(), ["a", "teacher"]),             # the teacher continues a: a first
    ({"teacher"}, {"a", "junior"}, ["teacher"]),        # ... unless a is built
    ({"junior"}, set(), ["a"]),                         # the junior is a snapshot of a's run
    ({"c", "b"}, {"a", "junior"}, ["b", "c"]),
    (set(tiny_build.ROLES), set(), ["a", "b", "c", "teacher"]),
    (set(), {"a"}, []),
])
def test_jobs_for_roles(missing, have, jobs):
    assert tiny_build._jobs_for(missing, have) == jobs


def test_the_pair_builds_alone_and_the_rest_later_gives_the_same_weights(built, tmp_path):
    """roles=("a", "b"): jobs a and b only (a, its junior, b in the manifest; no teacher or c folder); asking for the
    teacher and c later builds them into the same manifest (the teacher from the saved a), with the weights of a
    build of all five at once (the module's `built`)."""
    d, _ = built
    lazy = str(tmp_path / "lazy")
    rec = tiny_sft.Recipe.reduced()
    tiny_build.ensure_tiny(lazy, recipe=rec, progress=False, roles=("a", "b"))
    man = tiny_build.read_manifest(lazy)
    assert set(man["models"]) == {"a", "b", "junior"} == set(man["hashes"])
    assert not os.path.exists(os.path.join(lazy, "teacher")) and not os.path.exists(os.path.join(lazy, "c"))
    assert [b["jobs"] for b in man["builds"]] == [["a", "b"]] and "ratio_a_over_c" not in man["token_stats"]
    full = tiny_build.read_manifest(d)
    assert {r: full["hashes"][r] for r in man["hashes"]} == man["hashes"]
    task_before = man["task"]

    def stopped(kind, *a, **k):
        raise RuntimeError(f"job {kind} stopped")

    with pytest.MonkeyPatch.context() as mp:  # a build of the teacher stopped half-way: the pair stays listed
        mp.setattr(tiny_build, "_job", stopped)
        with pytest.raises(RuntimeError, match="job teacher stopped"):
            tiny_build.build_tiny(lazy, recipe=rec, progress=False, roles=("teacher",), workers=1)
    assert set(tiny_build.read_manifest(lazy)["models"]) == {"a", "b", "junior"}
    tiny_build.ensure_tiny(lazy, recipe=rec, progress=False, roles=("teacher",))
    man = tiny_build.read_manifest(lazy)
    assert set(man["models"]) == {"a", "b", "junior", "teacher"} and man["task"] == task_before
    assert [b["jobs"] for b in man["builds"]] == [["a", "b"], ["teacher"]]
    assert man["build_seconds"] == pytest.approx(sum(b["seconds"] for b in man["builds"]))
    tiny_build.ensure_tiny(lazy, recipe=rec, progress=False)
    man = tiny_build.read_manifest(lazy)
    assert man["hashes"] == full["hashes"] and man["token_stats"] == full["token_stats"]
    # a role the manifest lists whose folder is gone is built again (its job only)
    shutil.rmtree(os.path.join(lazy, "c"))
    tiny_build.ensure_tiny(lazy, recipe=rec, progress=False, roles=("c",))
    man = tiny_build.read_manifest(lazy)
    assert man["hashes"] == full["hashes"] and man["builds"][-1]["jobs"] == ["c"]
    # another recipe: nothing of the cache is reused, the asked-for roles are built from scratch
    tiny_build.ensure_tiny(lazy, recipe=tiny_sft.Recipe.reduced(steps=4), progress=False, roles=("b",))
    man = tiny_build.read_manifest(lazy)
    assert set(man["models"]) == {"b"} and [b["jobs"] for b in man["builds"]] == [["b"]]
    from graft_cli.errors import GraftError

    with pytest.raises(GraftError, match="unknown"):
        tiny_build.ensure_tiny(lazy, recipe=rec, progress=False, roles=("d",))


def test_tiny_build_cli_roles(built, tmp_path, monkeypatch, capsys):
    """`graft tiny build --roles b` builds b alone (its summary row, no other); --roles with --check is refused."""
    from click.testing import CliRunner

    from graft_cli.cli import main

    monkeypatch.setattr(tiny_sft, "default_recipe", lambda: tiny_sft.Recipe.reduced())
    monkeypatch.setattr(tiny_build, "default_recipe", lambda: tiny_sft.Recipe.reduced())
    d = str(tmp_path / "c")
    res = CliRunner().invoke(main, ["tiny", "build", "--cache-dir", d, "--roles", "b"])
    assert res.exit_code == 0, res.output
    assert set(tiny_build.read_manifest(d)["models"]) == {"b"}
    assert tiny_build.read_manifest(d)["hashes"]["b"] == tiny_build.read_manifest(built[0])["hashes"]["b"]
    res = CliRunner().invoke(main, ["tiny", "build", "--cache-dir", d, "--roles", "a,b", "--check"])
    assert res.exit_code != 0 and "--roles: not with --check" in res.output


def test_sft_lowers_loss_and_mixes_specialise(built):
    """SFT lowers the response loss; each base model is relatively better on its favoured families."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, paths = built
    rec = tiny_sft.Recipe.reduced()
    fam_a = {f: 1.0 for f, w in rec.stage_a.families.items() if w >= 1.0}
    fam_b = {f: 1.0 for f, w in rec.stage_b.families.items() if w >= 1.0}
    assert not set(fam_a) & set(fam_b)
    lv = {1: 1.0, 2: 1.0, 3: 1.0}
    loss = {}
    for role in ("a", "b"):
        tk = AutoTokenizer.from_pretrained(paths[role])
        m = AutoModelForCausalLM.from_pretrained(paths[role]).eval()
        shape = rec.shape_a if role == "a" else rec.shape_b
        fresh = tiny_sft.make_model(shape, tk, seed=123).eval()
        for name, fam in (("A", fam_a), ("B", fam_b)):
            loss[role, name] = tiny_sft.eval_loss(m, tk, fam, lv)
            assert loss[role, name] < tiny_sft.eval_loss(fresh, tk, fam, lv) - 0.5
    # a's advantage on A-families over B-families exceeds b's (per-token losses, same texts)
    assert loss["a", "A"] - loss["a", "B"] < loss["b", "A"] - loss["b", "B"]


def test_check_and_main_json_last_line(built, capsys):
    d, paths = built
    props = tiny_check.check_tiny(paths, num_prompts=16, n=4, roles=("a", "b"), max_new_tokens=24, heldout=8)
    for r in ("a", "b"):
        assert 0.0 <= props[r]["pass1"] <= 1.0 and 0.0 <= props[r]["all_fail"] <= 1.0
    assert 0.0 <= props["comp_a_fail_b_mixed"] <= 1.0
    from graft_cli.tiny.regime import REGIME_TARGETS

    assert set(tiny_check.targets_met(props)) == {"a_pass1", "a_all_fail", "b_pass1", "b_all_fail",
                                            "comp_a_fail_b_mixed", "comp_b_fail_a_mixed", "comp_one_way_20",
                                            *(f"{r}_{k}" for r in "ab" for k in REGIME_TARGETS)}
    reg = props["regime"]  # declared weak families: the smallest weights of the reduced recipe's mixes
    assert (reg["a"]["weak_family"], reg["b"]["weak_family"]) == ("frac", "lin")
    assert reg["a"]["grafted"] % 4 == 0 and reg["b"]["grafted"] % 4 == 0  # whole groups of n = 4 are grafted
    fams = props["families"]  # per family, recomputed here from the per-family all-fail shares
    assert set(fams) <= set(syn.FAMILIES) and sum(v["n_prompts"] for v in fams.values()) == 16
    capsys.readouterr()
    tiny_check.tiny_main(check=True, cache_dir=d, seed=0, recipe=tiny_sft.Recipe.reduced(), num_prompts=8, n=2,
                         heldout=0)
    out = capsys.readouterr().out.strip().splitlines()
    last = json.loads(out[-1])
    assert "comp_a_fail_b_mixed" in last and "a" in last and "targets_met" in last
    assert set(last["blind_spots"]) == {"a", "b"} and "families" in last
    assert set(last["regime"]["a"]["met"]) == set(REGIME_TARGETS) and "s" not in last["regime"]["a"]


# ----------------------------------------------------------------------------------------------------
# graft tiny rl-check (the GRPO-gain measurement command; the full 80-step figure is in the README)


def _mean_grade(folder: str) -> tuple[float, int]:
    """Pooled pass@1 of an eval folder, recomputed from the per-sample files."""
    grades = []
    for f in sorted(os.listdir(folder)):
        if f.endswith("_run1.jsonl"):
            with open(os.path.join(folder, f)) as fh:
                grades += [json.loads(line)["grade"] for line in fh if line.strip()]
    return sum(grades) / len(grades), len(grades)


def test_rl_check_compares_final_with_base_on_held_out(built, tmp_path, monkeypatch, capsys):
    from graft_cli.plan.tiny_rl import TinyRLCheckOptions, pooled_pass1, rl_check

    d, paths = built
    monkeypatch.setattr(tiny_build, "ensure_tiny", lambda *a, **k: paths)
    out = tmp_path / "rl"
    res = rl_check(TinyRLCheckOptions(steps=1, out=str(out), samples=2, benchmarks=["aime24", "amc23"],
                                      min_gain_points=-100.0, progress=False,
                                      overrides=("data.prompt_batch=4", "algo.minibatch_prompts=1",
                                                 "reward.num_workers=1", "rollout.max_new_tokens=24")))
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == json.loads((out / "rl_check.json").read_text()) == json.loads(json.dumps(res))
    assert [r["policy"] for r in res["policies"]] == ["a", "b"]
    for r in res["policies"]:
        base, nb = _mean_grade(str(out / "base" / r["policy"]))
        final, nf = _mean_grade(str(out / "grpo-s0" / "eval" / r["policy"] / "step_000001"))
        assert nb == nf == (30 + 40) * 2  # both held-out sets, 2 samples each, base and final alike
        assert r["base_pooled"] == pytest.approx(base) and r["final_pooled"] == pytest.approx(final)
        assert r["gain_points"] == pytest.approx(100 * (final - base))
        assert r["num_problems"] == 70 and r["step"] == 1 and r["met"]
    assert res["met"] and res["settings"]["temperature"] == 1.0 and res["settings"]["max_new_tokens"] == 24
    # pooled pass@1 weights each benchmark by its number of problems (hand values)
    s = {"benchmarks": {"x": {"mean": 0.5, "num_problems": 30}, "y": {"mean": 0.25, "num_problems": 10}}}
    assert pooled_pass1(s) == (pytest.approx((0.5 * 30 + 0.25 * 10) / 40), 40)


def test_the_task_alone_is_written_without_building_a_model(tmp_path, monkeypatch):
    """`tiny:train`, `tiny:task` and the synthetic benchmarks need only the task files: on an empty cache they are
    written (the same bytes as write_task at the default recipe's training size) and no model is trained."""
    from graft_cli.errors import GraftError
    from graft_cli.eval.benchmarks import tiny_task_dir

    cache = tmp_path / "cache"
    monkeypatch.setenv("GRAFT_CACHE", str(cache))

    def no_build(*a, **k):
        raise AssertionError("a model build was started for a task file")

    monkeypatch.setattr(tiny_build, "build_tiny", no_build)
    assert tiny_build.resolve_tiny("eval_math500") == str(cache / "task" / "eval_math500.jsonl")
    assert sorted(os.listdir(cache)) == ["task"]  # no model folder, no manifest
    ref = syn.write_task(str(tmp_path / "ref"), seed=0, train_size=tiny_sft.default_recipe().train_size)
    assert sorted(os.listdir(cache / "task")) == sorted(os.path.basename(p) for p in ref.values())
    for name, p in ref.items():
        assert (cache / "task" / f"{name}.jsonl").read_bytes() == open(p, "rb").read()
    assert tiny_build.resolve_tiny("task") == tiny_task_dir() == str(cache / "task")
    assert tiny_build.resolve_tiny("train") == str(cache / "task" / "train.jsonl")
    with pytest.raises(GraftError, match="unknown tiny name 'nope'"):
        tiny_build.resolve_tiny("nope")
    # a model role still builds the pair
    with pytest.raises(AssertionError, match="a model build was started"):
        tiny_build.resolve_tiny("a")


def test_a_complete_caches_task_is_returned_as_built(tmp_path):
    """A cache whose manifest lists its task files (e.g. a reduced build, 512 training problems) keeps them: the
    task is not rewritten at the default size."""
    task = tmp_path / "task"
    task.mkdir()
    (task / "train.jsonl").write_text('{"id": "x"}\n')
    (tmp_path / "manifest.json").write_text(json.dumps(
        {"seed": 0, "task": {"train": {"path": "task/train.jsonl", "sha256": "-"}}}))
    assert tiny_build.ensure_task(str(tmp_path)) == str(task)
    assert (task / "train.jsonl").read_text() == '{"id": "x"}\n' and os.listdir(task) == ["train.jsonl"]
    # another seed than the cache's: the task of that seed is written
    tiny_build.ensure_task(str(tmp_path), seed=1)
    assert (task / "train.jsonl").read_text() != '{"id": "x"}\n' and len(os.listdir(task)) == 6


def test_tiny_build_says_which_roles_it_builds_and_make_demo_builds_the_pair():
    from graft_cli.tiny.check import roles_line

    # a's job makes the junior too; the teacher's job needs a's
    assert roles_line(("a", "b")) == ("tiny roles built (or reused): a, b, junior; not built: c, teacher (built "
                                      "when a run first asks for them)")
    assert roles_line(("teacher",)).startswith("tiny roles built (or reused): a, teacher, junior; not built: b, c")
    assert roles_line(("a", "b", "c", "teacher", "junior")) == "tiny roles built (or reused): a, b, c, teacher, junior"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    demo = open(os.path.join(root, "Makefile")).read().split("\ndemo:")[1].split("\n\n")[0]
    assert "graft tiny build --roles a,b\n" in demo + "\n" and "graft train --pair tiny --method graft" in demo
