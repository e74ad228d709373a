"""Shared fixtures: a small HF-format policy on disk, a local Ray, Prefect's test harness; the
rule that only the ``gpu`` and ``slow`` markers skip a test (``skip_policy.py``)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from rl_train.runtime import apply_local_defaults

# The temporary Prefect API servers the tests start keep their SQLite database under
# PREFECT_HOME: a directory of this session's own, not the developer's ~/.prefect (the suite
# would add hundreds of runs to it, and a database migrated by another venv's newer Prefect
# stops an older one from starting). Set PREFECT_HOME to choose another.
_PREFECT_HOME = None if "PREFECT_HOME" in os.environ else tempfile.mkdtemp(prefix="rlt-prefect-home-")
if _PREFECT_HOME is not None:
    os.environ["PREFECT_HOME"] = _PREFECT_HOME
apply_local_defaults()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest_plugins = ["pytester"]  # tests/unit/test_skip_policy.py runs pytest on files of its own


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _PREFECT_HOME is not None:
        import shutil

        shutil.rmtree(_PREFECT_HOME, ignore_errors=True)


@pytest.fixture(autouse=True)
def _restore_denormals():
    """Workers flush denormal floats to zero for speed, process-wide; a test that builds one in
    this process must not leave it so for later tests (hypothesis refuses to draw floats then)."""
    yield
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_flush_denormal(False)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in policy with a short format pretraining (enough to emit EOS)."""
    from rl_train.engines.model.tiny import create_tiny_policy

    return create_tiny_policy(tmp_path_factory.mktemp("model") / "tiny", seed=0, pretrain_steps=60)


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the session, in a private temp dir; stopped by this process only."""
    import ray

    temp_dir = tempfile.mkdtemp(prefix="rlt-ray-", dir="/tmp")
    os.environ["RL_TRAIN_RAY_TMPDIR"] = temp_dir
    os.environ.setdefault("RAY_worker_niceness", "0")
    if not ray.is_initialized():
        from rl_train.engines.workers.ray_start import ensure_ray

        ensure_ray(None, 2, num_actors=6)  # as a run starts its local Ray (the lean head)
    yield ray
    from rl_train.engines.workers.local_ray_head import stop_local_heads

    ray.shutdown()
    stop_local_heads()
    shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def prefect_harness():
    """A throwaway Prefect API backed by a temporary SQLite database."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


sys.path.insert(0, str(Path(__file__).parent))
from moe_fixture import tiny_moe_dir  # noqa: E402, F401

# A local S3 server (moto) for any test: s3_endpoint (session) and s3_root (a bucket per test).
from s3_fixture import s3_endpoint, s3_root  # noqa: E402, F401
from sglang_fixture import sglang_options, sglang_server  # noqa: E402, F401

# Only the gpu and slow markers skip a test; any other skip, and any xfail, fails it.
from skip_policy import (  # noqa: E402, F401
    pytest_collection_modifyitems,
    pytest_make_collect_report,
    pytest_runtest_makereport,
)
