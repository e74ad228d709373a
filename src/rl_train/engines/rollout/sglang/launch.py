"""Launching an sglang server for one rollout replica, and stopping it with everything it started.

The server runs as ``python -m sglang.launch_server`` in a session of its own, on a free port
of 127.0.0.1, fed token ids (``--skip-tokenizer-init``: the replica tokenizes) and able to
give back its memory (``--enable-memory-saver``, for sleep and wake). ``stop`` ends the whole
process group (the server's scheduler and detokenizer are its children), and a replica that
dies without stopping it takes it along (the parent-death signal), so no process and no port
outlives the replica.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rl_train.child_process import free_port, own_session_ended_with_parent
from rl_train.engines.rollout.sglang.client import RolloutServerError, SglangClient

STOP_GRACE_S = 30.0


class LaunchedServer:
    def __init__(self, model_path: str | Path, seed: int, extra_args: list[str], startup_timeout_s: float) -> None:
        if importlib.util.find_spec("sglang") is None:
            raise RolloutServerError(
                "rollout.engine=sglang launches `python -m sglang.launch_server`, and sglang is not installed "
                "(pip install 'rl-train[sglang]' on a GPU machine), or set rollout.sglang.url to a running server"
            )
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [
            sys.executable, "-m", "sglang.launch_server",
            "--model-path", str(model_path), "--host", "127.0.0.1", "--port", str(self.port),
            "--random-seed", str(seed), "--skip-tokenizer-init", "--enable-memory-saver",
            *extra_args,
        ]  # fmt: skip
        self.process = subprocess.Popen(command, preexec_fn=own_session_ended_with_parent)  # noqa: PLW1509
        try:
            self._wait_until_healthy(startup_timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_until_healthy(self, timeout_s: float) -> None:
        client = SglangClient(self.url, connect_timeout_s=2.0, request_timeout_s=10.0)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                code = self.process.poll()
                if code is not None:
                    raise RolloutServerError(f"the sglang server on port {self.port} exited with code {code} while starting")
                if client.healthy():
                    return
                time.sleep(1.0)
        finally:
            client.close()
        raise RolloutServerError(f"the sglang server on port {self.port} did not answer /health within {timeout_s:.0f} s")

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after a grace period (idempotent)."""
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        except ProcessLookupError:
            pass
