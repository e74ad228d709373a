"""An sglang-compatible HTTP server on CPU for tests (``tests/unit/sglang/cpu_server.py``, the
built-in engine behind sglang's endpoints), one per session, in its own process.

``sglang_server`` starts it and stops it (and its port) at the end. ``sglang_options`` is what
a test passes as ``rollout.sglang`` to attach to it, after putting the server back as it
started: no fault, awake, the policy's own weights at version 0, no LoRA adapter loaded.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SERVER = Path(__file__).parent / "unit" / "sglang" / "cpu_server.py"


@pytest.fixture(scope="session")
def sglang_server(tiny_model_dir: Path) -> Iterator[str]:
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([sys.executable, str(SERVER), str(tiny_model_dir), str(port), "0"])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, f"the CPU sglang server exited with {process.returncode}"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the CPU sglang server did not start"
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(30)


@pytest.fixture
def sglang_options(sglang_server: str, tiny_model_dir: Path) -> dict[str, Any]:
    import httpx

    with httpx.Client(base_url=sglang_server, timeout=60) as http:
        http.post("/test/fault", json={"mode": "none"}).raise_for_status()
        http.post("/resume_memory_occupation", json={"tags": ["kv_cache", "weights"]}).raise_for_status()
        http.post(
            "/update_weights_from_disk", json={"model_path": str(tiny_model_dir), "weight_version": "0"}
        ).raise_for_status()
        for name in http.get("/test/state").json()["lora"]["loaded"]:  # a failed test's leftovers
            http.post("/unload_lora_adapter", json={"lora_name": name}).raise_for_status()
    return {"url": sglang_server, "request_timeout_s": 60.0, "connect_timeout_s": 5.0}
