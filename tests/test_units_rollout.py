"""Unit tests of rollout modules without a model or a server: sample-and-grade with a fake engine and grader
(rollout/graded.py), the tandem engine's option checks and metrics (rollout/tandem.py), and the vLLM server client's
server discovery, request bodies, response parsing, weight pushes and error lines against a fake HTTP layer
(rollout/vllm_server.py, httpx's MockTransport: no server is started)."""

from __future__ import annotations

import json
import os
import threading
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
import torch

from graft_cli.batch import Rollouts
from graft_cli.errors import GraftError
from graft_cli.rollout import vllm_server
from graft_cli.rollout.engine import ENGINES, SamplingParams, solo_engine
from graft_cli.rollout.graded import Graded, sample_and_grade
from graft_cli.rollout.tandem import OWN_OPTIONS, TandemEngine, author_metrics
from graft_cli.rollout.vllm_server import VLLMServerEngine, _first_line, _same_model


# ============================================================================================== graded.py
class FakeEngine:
    """Returns, for each prompt, ``n`` responses whose text is ``"<prompt id>:<j>"``."""

    def __init__(self):
        self.calls = []

    def generate(self, prompt_ids, params):
        self.calls.append((prompt_ids, params))
        flat = [(p[0], j) for p in prompt_ids for j in range(params.n)]
        return Rollouts(prompt_ids=prompt_ids, response_ids=[[7] for _ in flat],
                        texts=[f"{p}:{j}" for p, j in flat], logprobs=[[-0.5] for _ in flat],
                        truncated=[False] * len(flat), n=params.n)


class TableGrader:
    """Rewards from a table keyed by (text, gold); records what it was asked."""

    def __init__(self, table):
        self.table, self.asked = table, None

    def grade(self, texts, golds):
        self.asked = (list(texts), list(golds))
        return SimpleNamespace(rewards=np.array([self.table[(x, g)] for x, g in zip(texts, golds)]))


def test_sample_and_grade_repeats_golds_per_response_and_counts_k():
    """Each response is graded against its own prompt's gold (prompt-major); k counts rewards above 0.5."""
    grader = TableGrader({("10:0", "A"): 1.0, ("10:1", "A"): 0.5, ("10:2", "A"): 1.0,
                          ("11:0", "B"): 0.0, ("11:1", "B"): 0.51, ("11:2", "B"): 0.0})
    eng = FakeEngine()
    params = SamplingParams(n=3, temperature=0.7, max_new_tokens=5, seed=4)
    g = sample_and_grade(eng, [[10], [11]], ["A", "B"], params, grader)
    assert isinstance(g, Graded) and g.n == 3 and eng.calls == [([[10], [11]], params)]
    assert grader.asked == (["10:0", "10:1", "10:2", "11:0", "11:1", "11:2"], ["A", "A", "A", "B", "B", "B"])
    assert g.rewards == [1.0, 0.5, 1.0, 0.0, 0.51, 0.0] and all(type(r) is float for r in g.rewards)
    # 0.5 is not correct (a reward must exceed 0.5): prompt 10 → 2, prompt 11 → 1
    assert g.k.tolist() == [2, 1]


def test_graded_k_for_hand_built_grades():
    """``Graded.k`` reshapes the rewards into (prompts, n) rows and counts the correct ones per row."""
    ro = Rollouts(prompt_ids=[[1]] * 3, response_ids=[[1]] * 6, texts=[""] * 6, logprobs=[[0.0]] * 6,
                  truncated=[False] * 6, n=2)
    g = Graded(ro, SimpleNamespace(rewards=[1, 1, 0, 0, 0.9, 0.2]), 2)
    assert g.k.tolist() == [2, 0, 1]


# ============================================================================================== tandem.py
def test_author_metrics_by_hand():
    """Senior share, redraws, switches and tokens per author per response, from the author masks."""
    author = [[1, 1, 0, 0, 1], [0, 0, 0], [1]]
    # senior tokens 3 + 0 + 1 = 4 of 9; switches 2 + 0 + 0 = 2; 3 responses; redraws 1 + 0 + 2 = 3
    m = author_metrics(author, [1, 0, 2], boundary_size=17)
    assert m == {"tandem/senior_token_frac": pytest.approx(4 / 9), "tandem/redraws_per_response": 1.0,
                 "tandem/switches_per_response": pytest.approx(2 / 3), "tandem/tokens_senior": pytest.approx(4 / 3),
                 "tandem/tokens_junior": pytest.approx(5 / 3), "tandem/boundary_ids": 17}


def test_author_metrics_empty_step():
    """No response (or no token): every share and count is 0, never a division by zero."""
    m = author_metrics([], [], 0)
    assert m["tandem/senior_token_frac"] == 0.0 and m["tandem/tokens_senior"] == 0.0
    assert author_metrics([[], []], [0, 0], 3)["tandem/senior_token_frac"] == 0.0


@pytest.mark.parametrize("kw,msg", [
    ({"p_senior": 1.5}, r"p_senior: must be in \[0, 1\], got 1.5"),
    ({"p_senior": -0.1}, r"p_senior: must be in \[0, 1\]"),
    ({"max_gap_tokens": 0}, r"max_gap_tokens and chunk_size must be >= 1"),
    ({"chunk_size": 0}, r"max_gap_tokens and chunk_size must be >= 1"),
    ({"cache": "paged"}, r"rollout.engine_kwargs.cache: 'paged'"),  # the HF engine's options are checked too
])
def test_tandem_option_rules(kw, msg):
    """Options that cannot work are refused with a ValueError naming ``rollout.engine_kwargs.<key>``."""
    with pytest.raises(ValueError, match=msg):
        TandemEngine.check_kwargs(junior="j", **kw)


def test_tandem_options_validated_against_registries():
    """Unknown options and unknown schedules are one-line GraftErrors; the defaults are its own then the HF engine's."""
    with pytest.raises(GraftError, match=r"'rollout.engine_kwargs.shedule': not a parameter of engine TandemEngine"):
        TandemEngine.check_kwargs(shedule="word")
    with pytest.raises(GraftError, match=r"'rollout.engine_kwargs.schedule': must be one of .*chunk.*, got 'coin'"):
        TandemEngine.check_kwargs(schedule="coin")
    opts = TandemEngine.check_kwargs(junior="j", schedule="chunk", chunk_size=8)
    assert (opts["schedule"], opts["chunk_size"], opts["p_senior"], opts["junior"]) == ("chunk", 8, 0.5, "j")
    assert set(OWN_OPTIONS) <= set(opts) and "cache" in opts


def test_tandem_needs_a_junior_and_evaluates_solo_with_hf():
    """Without a junior the engine refuses before loading anything; solo evaluation is the HF engine minus tandem's
    own options."""
    assert ENGINES.get("tandem") is TandemEngine
    with pytest.raises(ValueError, match=r"rollout.engine_kwargs.junior: the tandem engine needs a junior"):
        TandemEngine(model=None, tokenizer=None)
    name, kw = solo_engine("tandem", {"junior": "j", "p_senior": 0.3, "schedule": "word", "cache": "dynamic"})
    assert (name, kw) == ("hf", {"cache": "dynamic"})
    assert TandemEngine.policy_logprobs is False and TandemEngine.frozen_kwargs == ("junior",)


# ======================================================================================== vllm_server.py
class FakeTok:
    """Ids 2.. decode to letters from 'a'; EOS 1 and pad 0 are special (skipped)."""

    eos_token_id = 1

    def batch_decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        assert skip_special_tokens and not clean_up_tokenization_spaces
        return ["".join(chr(ord("a") + i - 2) for i in row if i > 1) for row in ids]


class FakeModel(torch.nn.Module):
    """A 2x2 linear layer that saves like a transformers model (a file per save, recording the state dict)."""

    name_or_path = "org/tiny"

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def save_pretrained(self, path, state_dict=None):
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "weights.json"), "w") as f:
            json.dump({k: v.tolist() for k, v in (state_dict or self.state_dict()).items()}, f)


class FakeLora:
    """What the engine reads of a PEFT model: ``peft_config``, ``get_base_model`` and ``save_pretrained``."""

    name_or_path = "org/tiny"
    peft_config = {"default": None}

    def __init__(self):
        self.base = FakeModel()

    def get_base_model(self):
        return self.base

    def save_pretrained(self, path):
        os.makedirs(path, exist_ok=True)
        open(os.path.join(path, "adapter_model.safetensors"), "w").close()


class FakeServers:
    """vLLM servers behind one MockTransport: ``models`` maps a base URL to the ids its /v1/models lists; POSTs are
    answered by ``on_post(url, path, body)`` (default 200 {}) and recorded in order."""

    def __init__(self, models, on_post=None, down=()):
        self.models, self.on_post, self.down = models, on_post, set(down)
        self.posts, self.lock = [], threading.Lock()

    def handler(self, request):
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if base in self.down:
            raise httpx.ConnectError("Connection refused", request=request)
        if request.method == "GET" and request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": m, "root": m} for m in self.models.get(base, [])]})
        body = json.loads(request.content) if request.content else None
        with self.lock:
            self.posts.append((base, request.url.path, body))
        if self.on_post is not None:
            out = self.on_post(base, request.url.path, body)
            if out is not None:
                return out
        return httpx.Response(200, json={})

    def install(self, monkeypatch):
        monkeypatch.setattr(httpx, "Client", lambda timeout=None: REAL_CLIENT(
            transport=httpx.MockTransport(self.handler), timeout=timeout))
        return self


H1, H2 = "http://h1:8000", "http://h2:8000"
REAL_CLIENT = httpx.Client  # the engine's client is this one over a MockTransport


def _engine(servers, monkeypatch, tmp_path, model=None, **kw):
    servers.install(monkeypatch)
    kw.setdefault("push_at_start", False)
    kw.setdefault("sync_dir", str(tmp_path / "sync"))
    return VLLMServerEngine(model or FakeModel(), FakeTok(), **kw)


def test_servers_chosen_by_the_model_they_serve(monkeypatch, tmp_path):
    """Only servers whose /v1/models lists the policy's model (or ``served_model``) are used; trailing slashes go."""
    srv = FakeServers({H1: ["other"], H2: ["org/tiny", "x"]})
    eng = _engine(srv, monkeypatch, tmp_path, urls=[H1 + "/", H2 + "/"])
    assert eng.servers == [(H2, "org/tiny")] and eng.eos_ids == [1]
    eng = _engine(srv, monkeypatch, tmp_path, urls=H1, served_model="other")  # one URL as a string
    assert eng.servers == [(H1, "other")]
    assert srv.posts == []  # push_at_start off and a full-weight policy: nothing pushed


def test_no_server_for_the_model_lists_what_each_serves(monkeypatch, tmp_path):
    """No server with the model: one line naming the model and what each server serves."""
    srv = FakeServers({H1: ["other"], H2: []})
    with pytest.raises(GraftError) as e:
        _engine(srv, monkeypatch, tmp_path, urls=[H1, H2])
    assert str(e.value).startswith("rollout.engine_kwargs.urls: no server serves this policy's model 'org/tiny' "
                                   f"({H1} serves other; {H2} serves nothing);")
    assert "rollout.engine_kwargs.served_model" in str(e.value)


def test_a_server_that_does_not_answer_is_one_line(monkeypatch, tmp_path):
    """A server that refuses the connection: a GraftError naming it, the error's first line and how to start one."""
    srv = FakeServers({H1: ["org/tiny"]}, down=[H1])
    with pytest.raises(GraftError) as e:
        _engine(srv, monkeypatch, tmp_path, urls=[H1])
    msg = str(e.value)
    assert msg.startswith(f"rollout.engine_kwargs.urls: {H1}: no vLLM server answers "
                          "(ConnectError: Connection refused)")
    assert "\n" not in msg and "VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --logprobs-mode processed_logprobs" in msg


@pytest.mark.parametrize("urls", [[], ["h1:8000"], ["ftp://h1"], [H1, 8000]])
def test_check_options_refuses_bad_urls(urls):
    """URLs must be a non-empty list of http(s) addresses."""
    with pytest.raises(ValueError, match=r"^rollout.engine_kwargs.urls: the vLLM servers' addresses"):
        VLLMServerEngine.check_options({"urls": urls})
    VLLMServerEngine.check_options({"urls": "https://h:1"})


def test_same_model_by_id_or_by_real_path(tmp_path):
    """A served entry matches a hub id by id/root, a folder by its real path (a symlink to it too)."""
    (tmp_path / "m").mkdir()
    (tmp_path / "n").mkdir()
    os.symlink(tmp_path / "m", tmp_path / "link")
    assert _same_model({"id": "org/x", "root": "org/x"}, "org/x")
    assert not _same_model({"id": "org/x", "root": "org/x"}, "org/y")
    assert _same_model({"id": "served", "root": str(tmp_path / "m")}, str(tmp_path / "link"))
    assert not _same_model({"id": "served", "root": str(tmp_path / "n")}, str(tmp_path / "link"))
    assert not _same_model({"id": "served", "root": None}, str(tmp_path / "missing"))


def test_first_line_of_an_error():
    """Error lines: the type and the first line, cut at 200 characters."""
    assert _first_line(RuntimeError("boom\nmore")) == "RuntimeError: boom"
    assert _first_line(ValueError("")) == "ValueError: "
    assert _first_line(OSError("x" * 300)) == "OSError: " + "x" * 200


def _completions(per_prompt):
    """on_post answering /v1/completions: for each prompt (its first token p) and sample j, the choice
    ``per_prompt(p, j)`` = (token_ids, logprobs, finish_reason); choices returned in reverse index order."""

    def on_post(base, path, body):
        if path != "/v1/completions":
            return None
        choices, idx = [], 0
        for prompt in body["prompt"]:
            for j in range(body["n"]):
                toks, lps, fin = per_prompt(prompt[0], j)
                choices.append({"index": idx, "token_ids": toks, "finish_reason": fin,
                                "logprobs": None if lps is None else {"token_logprobs": lps}})
                idx += 1
        return httpx.Response(200, json={"choices": choices[::-1]})

    return on_post


def test_generate_splits_prompts_builds_requests_parses_choices(monkeypatch, tmp_path):
    """Sampling: prompts split into contiguous chunks per server, one request each with the sampling parameters and
    per-request seeds; choices sorted by index, prompt-major; truncation = length without a final EOS."""

    def answer(p, j):
        if p == 30:
            return [2, 3, 1], [-0.1, -0.2, -0.3], "stop"  # "ab" + EOS
        if p == 31:
            return [4 + j, 5], [-1.0, -2.0], "length"  # hit max_tokens: truncated
        return [6, 1], [-0.5, -0.25], "length"  # length but ended with EOS: not truncated

    srv = FakeServers({H1: ["org/tiny"], H2: ["org/tiny"]}, on_post=_completions(answer))
    eng = _engine(srv, monkeypatch, tmp_path, urls=[H1, H2], per_request_seed=True)
    params = SamplingParams(n=2, temperature=0.7, top_p=0.9, top_k=5, max_new_tokens=4, seed=11)
    ro = eng.generate([[30, 9], [31], [32]], params)
    by_url = {u: b for u, path, b in srv.posts}
    # 3 prompts over 2 servers: [0, 1) and [1, 3); seed = 11 + first·n → 11 and 13
    common = {"model": "org/tiny", "n": 2, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "max_tokens": 4,
              "logprobs": 0, "stop_token_ids": [1], "return_token_ids": True, "skip_special_tokens": True}
    assert by_url[H1] == {**common, "prompt": [[30, 9]], "seed": 11}
    assert by_url[H2] == {**common, "prompt": [[31], [32]], "seed": 13}
    assert ro.response_ids == [[2, 3, 1], [2, 3, 1], [4, 5], [5, 5], [6, 1], [6, 1]]
    assert ro.logprobs == [[-0.1, -0.2, -0.3]] * 2 + [[-1.0, -2.0]] * 2 + [[-0.5, -0.25]] * 2
    assert ro.truncated == [False, False, True, True, False, False]
    assert ro.texts == ["ab", "ab", "cd", "dd", "e", "e"]
    assert (ro.n, ro.prompt_ids, ro.meta) == (2, [[30, 9], [31], [32]], {"engine": "vllm_server"})


def test_greedy_generate_repeats_prompts_and_zeroes_logprobs(monkeypatch, tmp_path):
    """T = 0: each prompt sent n times with n = 1 (vLLM refuses n > 1 greedy), top-p 1, top-k off, log-probs 0."""
    srv = FakeServers({H1: ["org/tiny"]}, on_post=_completions(lambda p, j: ([p - 18, 1], None, "stop")))
    eng = _engine(srv, monkeypatch, tmp_path, urls=[H1])
    ro = eng.generate([[20], [21]], SamplingParams(n=3, temperature=0.0, top_p=0.5, top_k=4, max_new_tokens=2))
    (_, _, body), = srv.posts
    assert body["prompt"] == [[20]] * 3 + [[21]] * 3 and body["n"] == 1
    assert (body["top_p"], body["top_k"], body["temperature"]) == (1.0, -1, 0.0) and "seed" not in body
    assert ro.response_ids == [[2, 1]] * 3 + [[3, 1]] * 3 and ro.logprobs == [[0.0, 0.0]] * 6
    assert ro.texts == ["a"] * 3 + ["b"] * 3 and ro.n == 3


@pytest.mark.parametrize("reply,msg", [
    (httpx.Response(500, text="  engine dead \n"), r"^vLLM server http://h1:8000: completion answered HTTP 500 "
                                                   r"\(engine dead\)$"),
    (httpx.Response(200, json={"choices": [{"index": 0, "token_ids": [2], "logprobs": {"token_logprobs": [-1]}}]}),
     r"^vLLM server http://h1:8000: 1 completions for 1 prompts x 2$"),
    (httpx.Response(200, json={"choices": [{"index": i, "token_ids": [2, 3], "logprobs": {"token_logprobs": [-1]}}
                                           for i in range(2)]}),
     r"^vLLM server: 1 log-probs for 2 tokens \(start it with --logprobs-mode processed_logprobs"),
])
def test_generate_error_lines(monkeypatch, tmp_path, reply, msg):
    """A failing or inconsistent completion answer is a one-line GraftError that says what was wrong."""
    srv = FakeServers({H1: ["org/tiny"]}, on_post=lambda base, path, body: reply)
    eng = _engine(srv, monkeypatch, tmp_path, urls=[H1])
    with pytest.raises(GraftError, match=msg):
        eng.generate([[5]], SamplingParams(n=2, temperature=1.0, max_new_tokens=2))


def test_score_reads_prompt_logprobs_of_the_response_tokens(monkeypatch, tmp_path):
    """Scoring sends prompt + response at T = 1 with ``prompt_logprobs: 0`` and reads the response positions."""

    def on_post(base, path, body):
        choices = []
        for i, row in enumerate(body["prompt"]):
            # position t's entry keyed by its token id; the log-prob is −(t + 1)/10 − token/100
            plp = [None] + [{str(tok): {"logprob": -(t + 1) / 10 - tok / 100, "rank": 1}} for t, tok in
                            enumerate(row) if t > 0]
            choices.append({"index": i, "prompt_logprobs": plp})
        return httpx.Response(200, json={"choices": choices})

    srv = FakeServers({H1: ["org/tiny"]}, on_post=on_post)
    eng = _engine(srv, monkeypatch, tmp_path, urls=[H1])
    out = eng.score([[5, 6], [7]], [[8, 9], [4]])
    (_, path, body), = srv.posts
    assert path == "/v1/completions"
    assert body == {"model": "org/tiny", "prompt": [[5, 6, 8, 9], [7, 4]], "max_tokens": 1, "temperature": 1.0,
                    "prompt_logprobs": 0}
    # row 0: positions 2, 3 (tokens 8, 9) → −0.3 − 0.08, −0.4 − 0.09; row 1: position 1 (token 4) → −0.2 − 0.04
    assert out == [pytest.approx([-0.38, -0.49]), pytest.approx([-0.24])]


def test_weight_push_writes_the_folder_and_reloads_every_server(monkeypatch, tmp_path):
    """A full-weight sync saves the state dict under sync_dir, asks each server to reload it and reset its prefix
    cache, and removes the previous push's folder."""
    srv = FakeServers({H1: ["org/tiny"], H2: ["org/tiny"]})
    model = FakeModel()
    eng = _engine(srv, monkeypatch, tmp_path, model=model, urls=[H1, H2], push_at_start=True)
    d1 = os.path.join(str(tmp_path / "sync"), f"weights-{os.getpid()}-000001")
    assert srv.posts == [(H1, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": d1}}),
                         (H1, "/reset_prefix_cache", None),
                         (H2, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": d1}}),
                         (H2, "/reset_prefix_cache", None)]
    saved = json.load(open(os.path.join(d1, "weights.json")))
    assert saved["lin.weight"] == model.lin.weight.tolist() and not os.path.exists(d1 + ".tmp")
    with torch.no_grad():
        model.lin.weight.fill_(0.5)
    eng.sync_weights(model)
    d2 = d1[:-6] + "000002"
    assert not os.path.exists(d1) and json.load(open(os.path.join(d2, "weights.json")))["lin.weight"] == \
        [[0.5, 0.5], [0.5, 0.5]]
    assert srv.posts[-2][2] == {"method": "reload_weights", "kwargs": {"weights_path": d2}}


def test_weight_push_without_dev_mode_endpoint_says_how_to_start(monkeypatch, tmp_path):
    """A server without /collective_rpc (404: not in dev mode) stops the push with the flag it needs."""
    srv = FakeServers({H1: ["org/tiny"]}, on_post=lambda b, path, body: httpx.Response(404, text="Not Found"))
    with pytest.raises(GraftError) as e:
        _engine(srv, monkeypatch, tmp_path, urls=[H1], push_at_start=True)
    assert str(e.value) == (f"vLLM server {H1} has no /collective_rpc endpoint: start it with VLLM_SERVER_DEV_MODE=1 "
                            "(the weight push reloads through it)")


def test_lora_adapter_versions_are_loaded_named_and_unloaded(monkeypatch, tmp_path):
    """A LoRA policy loads its adapter as graft-<pid>-vN at each sync, unloads the previous one, and names the
    current adapter as the model of every request."""
    srv = FakeServers({H1: ["org/tiny"]}, on_post=_completions(lambda p, j: ([2, 1], [-1.0, -2.0], "stop")))
    eng = _engine(srv, monkeypatch, tmp_path, model=FakeLora(), urls=[H1])  # an adapter is loaded at start
    v1, v2 = f"graft-{os.getpid()}-v1", f"graft-{os.getpid()}-v2"
    sync = str(tmp_path / "sync")
    assert srv.posts == [(H1, "/v1/load_lora_adapter", {"lora_name": v1, "lora_path": os.path.join(sync, v1)})]
    eng.generate([[3]], SamplingParams(n=1, max_new_tokens=2))
    assert srv.posts[-1][2]["model"] == v1
    eng.sync_weights(eng.model)
    assert srv.posts[-2:] == [(H1, "/v1/load_lora_adapter", {"lora_name": v2, "lora_path": os.path.join(sync, v2)}),
                              (H1, "/v1/unload_lora_adapter", {"lora_name": v1})]
    assert os.path.isdir(os.path.join(sync, v2)) and not os.path.exists(os.path.join(sync, v1))


def test_lora_adapter_refused_falls_back_to_merged_weights(monkeypatch, tmp_path):
    """``lora_sync: auto`` and a server that refuses adapters: a warning, then the merged weights are pushed."""

    def on_post(base, path, body):
        return httpx.Response(400, text="runtime LoRA off") if path == "/v1/load_lora_adapter" else None

    monkeypatch.setattr(vllm_server, "full_state_dict", lambda model: {"w": torch.ones(1)})
    srv = FakeServers({H1: ["org/tiny"]}, on_post=on_post)
    with pytest.warns(UserWarning, match=r"does not load LoRA adapters at runtime \(HTTP 400\)"):
        eng = _engine(srv, monkeypatch, tmp_path, model=FakeLora(), urls=[H1])
    assert eng.lora_sync == "merged" and eng._adapter is None
    assert [p for _, p, _ in srv.posts] == ["/v1/load_lora_adapter", "/collective_rpc", "/reset_prefix_cache"]
    pushed = srv.posts[1][2]["kwargs"]["weights_path"]
    assert json.load(open(os.path.join(pushed, "weights.json"))) == {"w": [1.0]}  # the merged dict, base's saver
    # lora_sync: adapter never falls back: the refusal is the error
    srv = FakeServers({H1: ["org/tiny"]}, on_post=on_post)
    with pytest.raises(GraftError, match=r"loading adapter graft-\d+-v1 answered HTTP 400 \(runtime LoRA off\)"):
        _engine(srv, monkeypatch, tmp_path / "b", model=FakeLora(), urls=[H1], lora_sync="adapter")


def test_close_removes_only_its_own_temporary_folder(monkeypatch, tmp_path):
    """Without sync_dir the engine makes a temporary folder and removes it on close; a given one is kept."""
    srv = FakeServers({H1: ["org/tiny"]})
    eng = _engine(srv, monkeypatch, tmp_path, urls=[H1], sync_dir=None)
    own = eng.sync_dir
    assert os.path.isdir(own) and own != str(tmp_path / "sync")
    eng.close()
    assert not os.path.exists(own)
    given = tmp_path / "keep"
    given.mkdir()
    eng = _engine(srv, monkeypatch, tmp_path, urls=[H1], sync_dir=str(given))
    eng.close()
    assert given.is_dir()


def test_a_lock_step_decode_asks_the_process_group_the_trainer_gave_its_engine():
    """all_ranks_done answers through ranks_done (Dist.all_done in a run) and refuses in one line without one."""
    from graft_cli.errors import GraftError
    from graft_cli.rollout.engine import RolloutEngine

    eng = RolloutEngine()
    with pytest.raises(GraftError, match="needs the run's process group"):
        eng.all_ranks_done(True)
    asked = []
    eng.ranks_done = lambda done: asked.append(done) or False  # another rank is still decoding
    assert eng.all_ranks_done(True) is False and asked == [True]
