"""A real S3-protocol server for tests: moto's server mode on 127.0.0.1, one per session.

``s3_endpoint`` starts it on a port the OS picks (no race for a "free" port) with dummy
credentials in the environment, and closes its socket at the end, so no port is left behind.
``s3_root`` gives each test a bucket of its own and yields ``(s3_uri_root, storage_options)``,
the options naming the endpoint only (no region: the server does not check one).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one log line per request otherwise
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            env.delenv(name, raising=False)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()
            server._server.server_close()  # stop() ends the serving thread but keeps the socket


@pytest.fixture
def s3_root(s3_endpoint: str) -> tuple[str, dict[str, Any]]:
    """A fresh bucket: ``("s3://<bucket>/run", {"client_kwargs": {"endpoint_url": ...}})``."""
    import fsspec

    options = {"client_kwargs": {"endpoint_url": s3_endpoint}}
    bucket = f"rl-train-{uuid.uuid4().hex[:16]}"
    fsspec.filesystem("s3", **options).mkdir(bucket)
    return f"s3://{bucket}/run", options
