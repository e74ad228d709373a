"""A whole run leaves torch out of the driver: its steps, weight syncs and checkpoints."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

RUN = """
import json, sys
from rl_train.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "torch": "torch" in sys.modules}))
"""


def test_a_run_without_prefect_never_imports_torch_in_the_driver(tiny_model_dir: Path, tmp_path: Path) -> None:
    ray_tmp = tempfile.mkdtemp(prefix="rlt-ray-", dir="/tmp")  # Ray's socket paths must stay short
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RL_TRAIN_RAY_TMPDIR": ray_tmp}
    command = [
        sys.executable, "-c", RUN, "train", "--no-prefect", "--config", "configs/arith-tiny.yaml",
        f"model.path={tiny_model_dir}", "model.create_if_missing=false", f"data.data_dir={tmp_path}/data",
        f"run.output_dir={tmp_path}/runs", "run.name=r", "trainer.total_steps=2", "trainer.val_every_steps=0",
        "trainer.val_before_train=false", "checkpoint.every_steps=1",
    ]  # fmt: skip
    root = Path(__file__).resolve().parents[2]
    try:
        done = subprocess.run(command, env=env, cwd=root, capture_output=True, text=True, timeout=300, check=False)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"code": 0, "torch": False}
    assert (tmp_path / "runs" / "r" / "policy").is_dir()  # the saved policy too, from the trainer actor
