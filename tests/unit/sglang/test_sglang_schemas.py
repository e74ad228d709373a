"""The CPU test server holds every request and answer to sglang's own types (sglang_schemas.py):
the version checked is the one installed and pinned, the types are sglang's, a request sglang
would refuse is refused, and every endpoint the backend calls was checked on its way."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from rl_train.engines.rollout.protocol import GenerationRequest, SamplingParams
from rl_train.engines.rollout.registry import build_rollout_engine
from rl_train.engines.rollout.sglang.engine import SglangRolloutEngine
from rl_train.engines.weight_sync.adapters import adapter_names

sys.path.insert(0, str(Path(__file__).parent))
import sglang_schemas  # noqa: E402

ROOT = Path(__file__).parents[3]


def test_the_installed_sglang_is_the_version_checked_and_pinned() -> None:
    assert importlib.metadata.version("sglang") == sglang_schemas.SGLANG_VERSION
    pin = f"sglang=={sglang_schemas.SGLANG_VERSION}"
    assert f'sglang-schemas = ["{pin}"]' in (ROOT / "pyproject.toml").read_text()
    assert f"--no-deps 'sglang=={sglang_schemas.SGLANG_VERSION}'" in (ROOT / "scripts" / "test.sh").read_text()


def test_the_types_are_sglangs_own_and_load_without_its_runtime() -> None:
    """In a clean interpreter: the request types come from the installed package's files, and
    nothing of sglang's serving runtime (nor triton) is imported for them."""
    code = (
        "import sys, sglang_schemas\n"
        "m = sglang_schemas.io_struct()\n"
        "print(m.__file__)\n"
        "print(m.GenerateReqInput.__module__)\n"
        "print(sorted(n for n in sys.modules if n.startswith(('sglang.', 'triton', 'sgl_kernel'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=Path(__file__).parent
    )
    assert result.returncode == 0, result.stderr
    path, module, loaded = result.stdout.splitlines()
    installed = Path(str(importlib.metadata.distribution("sglang").locate_file("sglang")))
    assert Path(path) == installed / "srt" / "managers" / "io_struct.py"
    assert module == "sglang.srt.managers.io_struct"
    assert loaded == "['sglang.srt.managers.io_struct', 'sglang.srt.sampling.sampling_params']"


@pytest.mark.parametrize(
    ("endpoint", "body", "message"),
    [
        ("/update_weights_from_disk", {"model_path": "/m", "weight_versoin": "1"}, r"UpdateWeightFromDiskReqInput does not have: \['weight_versoin'\]"),
        ("/init_weights_update_group", {"master_address": "h", "master_port": "p", "rank_offset": 1, "world_size": 2}, "master_port"),
        ("/generate", {"input_ids": [[1, 2]], "sampling_params": {"max_tokens": 3}}, "unexpected keyword argument 'max_tokens'"),
        ("/generate", {"input_ids": [[1, 2]], "sampling_params": {"top_p": 0.0}}, r"top_p must be in \(0, 1\]"),
        ("/generate", {"rid": ["a"], "input_ids": [[1], [2]]}, "rids length mismatch"),
        ("/flush_cache", {"everything": True}, "takes no body"),
        ("/update_weights_from_tensor", {}, "not an sglang endpoint the backend is checked against"),
    ],
)  # fmt: skip
def test_a_request_sglang_would_refuse_is_refused_naming_the_type(
    sglang_server: str, endpoint: str, body: dict[str, Any], message: str
) -> None:
    answer = httpx.post(f"{sglang_server}{endpoint}", json=body, timeout=30)
    assert answer.status_code == 422
    assert re.search(message, answer.json()["message"]), answer.json()["message"]


def test_an_answer_that_does_not_fit_sglangs_type_is_caught() -> None:
    with pytest.raises(sglang_schemas.SchemaError, match=r"(?s)GetLoadReqOutput.*num_tokens"):
        sglang_schemas.check_response("/get_load", [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0}])
    with pytest.raises(sglang_schemas.SchemaError, match="UpdateWeightFromDiskReqOutput does not have"):
        sglang_schemas.check_response("/update_weights_from_disk", {"success": True, "message": "", "ok": 1})


def test_every_endpoint_the_backend_calls_was_checked(
    tiny_model_dir: Path, sglang_server: str, sglang_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each operation of the backend once, through the checking server: none is refused, and
    every sglang endpoint in the table was checked on the way."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    httpx.post(f"{sglang_server}/test/fault", json={"mode": "none"}, timeout=10).raise_for_status()  # counts afresh
    for weight_update in ("disk", "distributed"):
        engine = build_rollout_engine(
            "sglang", tiny_model_dir, options={**sglang_options, "weight_update": weight_update}
        )
        assert isinstance(engine, SglangRolloutEngine)
        try:
            assert engine.client.healthy()
            prompt = [engine.tokenizer.bos_token_id, 5, 6]
            engine.generate([GenerationRequest("p/0", prompt), GenerationRequest("p/1", prompt)], SamplingParams(1.0, 0.9, 3))
            assert engine.running_requests() == 0
            engine.abort()
            engine.reset_prefix_cache()
            engine.release_kv_cache()
            engine.resume_kv_cache()
            weights = dict(engine.export_weights())
            engine.update_weights(weights.items(), 1)
            engine.sleep()
            engine.update_weights(weights.items(), 2)
            engine.wake_up()
            adapter = small_adapter(weights)
            engine.update_weights(adapter.items(), 3)  # loaded by name
            engine.generate([GenerationRequest("p/2", prompt)], SamplingParams(1.0, 0.9, 3))  # naming it
            engine.update_weights(adapter.items(), 4)  # the last one unloaded
        finally:
            engine.close()
    checked = httpx.get(f"{sglang_server}/test/state", timeout=10).json()["checked"]
    assert sorted(checked) == sorted(sglang_schemas.ENDPOINTS)


def small_adapter(weights: dict[str, torch.Tensor], rank: int = 2) -> dict[str, torch.Tensor]:
    """A and scaled B of rank ``rank`` for every q_proj and v_proj weight (the sync's names)."""
    generator = torch.Generator().manual_seed(0)
    adapter = {}
    for name, weight in weights.items():
        if name.endswith(("q_proj.weight", "v_proj.weight")):
            a_name, b_name = adapter_names(name)
            adapter[a_name] = torch.randn(rank, weight.shape[1], generator=generator) * 0.1
            adapter[b_name] = torch.randn(weight.shape[0], rank, generator=generator) * 0.1
    return adapter
