"""``graft_cli.rollout.vllm_launch``: the command and environment a local ``vllm serve`` is started with (read back
from a stand-in server that records them and answers /v1/models on the port it was given), a later argument
overriding an earlier one, a server that exits raising with its log, and ``stop_server`` ending it."""

from __future__ import annotations

import json
import sys

import pytest

from graft_cli.rollout.vllm_launch import CPU_ARGS, start_server, stop_server

STAND_IN = r'''
import http.server, json, os, sys
argv = sys.argv[1:]
with open(os.environ["RECORD"], "w") as f:
    json.dump({"argv": argv, "env": {k: os.environ.get(k) for k in (
        "VLLM_SERVER_DEV_MODE", "OMP_NUM_THREADS", "VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING",
        "EXTRA")}}, f)
port = int(argv[argv.index("--port") + 1])

class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": argv[argv.index("--model") + 1]}]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.end_headers()
        self.wfile.write(body)

http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def test_the_server_command_environment_and_url(tmp_path, monkeypatch):
    import httpx

    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    record = tmp_path / "record.json"
    monkeypatch.setenv("RECORD", str(record))
    # the stand-in runs in front of the real command (as taskset would) and reads the command as its arguments
    proc, url = start_server("/models/m", str(tmp_path / "s.log"), ("--max-model-len", "1024", "--enable-lora"),
                             {"EXTRA": "1"}, prefix=(sys.executable, str(script)))
    try:
        rec = json.loads(record.read_text())
        argv = rec["argv"]
        assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
        assert argv[argv.index("--model") + 1] == "/models/m"
        assert argv[argv.index("--logprobs-mode") + 1] == "processed_logprobs"
        for a in CPU_ARGS:
            assert a in argv
        # the caller's --max-model-len comes after the CPU default's, so vLLM's parser keeps the caller's
        lens = [argv[i + 1] for i, a in enumerate(argv) if a == "--max-model-len"]
        assert lens == ["128", "1024"] and argv[-1] == "--enable-lora"
        assert rec["env"] == {"VLLM_SERVER_DEV_MODE": "1", "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                              "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "EXTRA": "1"}
        assert url == f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "/models/m"
    finally:
        stop_server(proc)
    assert proc.poll() is not None


def test_without_cpu_settings_only_the_engines_own_arguments(tmp_path, monkeypatch):
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    record = tmp_path / "record.json"
    monkeypatch.setenv("RECORD", str(record))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    proc, _ = start_server("m", str(tmp_path / "s.log"), cpu=False, prefix=(sys.executable, str(script)))
    stop_server(proc)
    rec = json.loads(record.read_text())
    assert "--dtype" not in rec["argv"] and "--enforce-eager" not in rec["argv"]
    assert rec["env"]["VLLM_SERVER_DEV_MODE"] == "1" and rec["env"]["OMP_NUM_THREADS"] is None


def test_a_server_that_exits_raises_with_its_log(tmp_path):
    fail = tmp_path / "fail.py"
    fail.write_text("import sys\nprint('no such model: ' + sys.argv[sys.argv.index('--model') + 1])\nsys.exit(3)\n")
    with pytest.raises(RuntimeError, match=r"vllm serve m exited \(3\): no such model: m"):
        start_server("m", str(tmp_path / "s.log"), prefix=(sys.executable, str(fail)))
