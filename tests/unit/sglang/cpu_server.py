"""An HTTP server with sglang's endpoints and schemas, backed by the built-in torch engine, for
testing the sglang backend's contract on CPU: ``python cpu_server.py MODEL_DIR PORT SEED``.

It answers what the backend asks of a real sglang server (``/health``, ``/get_server_info``,
``/generate`` with ``return_logprob``, ``/abort_request``, ``/flush_cache``,
``/release_memory_occupation``, ``/resume_memory_occupation``, ``/update_weights_from_disk``,
``/init_weights_update_group``, ``/update_weights_from_distributed``,
``/destroy_weights_update_group``, ``/get_weights_by_name``, ``/get_load``, and LoRA's
``/load_lora_adapter``, ``/unload_lora_adapter`` and ``lora_path``: ``cpu_lora.py``) in sglang's
request and response shapes. Where the built-in engine differs: a batch is sampled from one stream seeded by its
first request's ``sampling_seed``, requests with different sampling parameters are run as
separate batches, and the weight group is gloo.

Every request is held to sglang's own request type for its endpoint, and every answer that
sglang has a type for to that type (``sglang_schemas.py``: the types of sglang 0.5.9, the
version checked, taken from the installed package): a request sglang would not take is
answered HTTP 422 naming the type and the misfit, and an answer of this server's that does
not fit is turned into HTTP 500, so neither the backend nor this server can drift from sglang
unnoticed. ``GET /test/state`` counts the requests checked per endpoint.

``POST /test/fault`` sets a fault for the tests of the backend's failure handling:
``{"mode": "malformed"}`` (``/generate`` answers a body of the wrong shape), ``{"mode":
"error"}`` (HTTP 500 with a message), ``{"mode": "slow", "seconds": S}`` (answers after S
seconds), ``{"mode": "none"}``, on ``/generate`` or on the ``"endpoint"`` named
(``/update_weights_from_disk``, ``/load_lora_adapter``, ``/unload_lora_adapter``); with ``"skip": K`` the first K calls pass, with ``"times": T``
only T calls fault.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import uvicorn
from cpu_lora import LoraServing, add_lora_endpoints  # beside this script
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from safetensors.torch import load_file
from sglang_schemas import SchemaError, check_request, check_response, io_struct

from rl_train.engines.rollout.protocol import GenerationRequest, SamplingParams
from rl_train.engines.rollout.torch_engine import TorchRolloutEngine

FINISH = {"eos": {"type": "stop"}, "length": {"type": "length"}, "aborted": {"type": "abort", "message": "aborted"}}


def build_app(model_dir: str, seed: int) -> FastAPI:
    app = FastAPI()
    engine = TorchRolloutEngine(model_dir, seed=seed)
    state: dict[str, Any] = {
        "fault": {"mode": "none"},
        "group": None,
        "store": None,
        "weight_version": "0",
        "calls": {},
        "checked": {},
    }
    lock = threading.Lock()  # one weight change at a time
    add_conformance_check(app, state, int(json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]))

    def fault_now(endpoint: str) -> str:
        """The fault mode of this call: only calls of the fault's ``endpoint`` (default
        ``/generate``) count; ``skip`` of them pass first, then ``times`` fault (0: all)."""
        fault = state["fault"]
        if fault["mode"] == "none" or fault.get("endpoint", "/generate") != endpoint:
            return "none"
        if fault.get("skip", 0) > 0:
            fault["skip"] -= 1
            return "none"
        if fault.get("times"):
            fault["times"] -= 1
            if fault["times"] == 0:
                state["fault"] = {"mode": "none"}
        return fault["mode"]

    async def faulted(mode: str) -> Response | None:
        fault = {"mode": mode, "seconds": state["fault"].get("seconds", 5)}
        if fault["mode"] == "slow":
            await asyncio.sleep(float(fault.get("seconds", 5)))
        if fault["mode"] == "error":
            return JSONResponse({"object": "error", "message": "injected server error", "code": 500}, 500)
        return None

    lora = LoraServing(engine, lock)
    add_lora_endpoints(app, lora, asyncio.to_thread, lambda endpoint: faulted(fault_now(endpoint)))

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/get_server_info")
    async def server_info() -> dict[str, Any]:
        return {"tp_size": 1, "model_path": model_dir, "version": "cpu-test-server"}

    @app.get("/get_load")
    async def load() -> list[dict[str, Any]]:
        """As sglang's: per data-parallel rank, the requests it is decoding (here: those inside
        the engine's decode loop, counted once their abort flag is armed)."""
        return [
            {"dp_rank": 0, "num_reqs": engine._in_flight, "num_waiting_reqs": 0, "num_tokens": 0, "ts_tic": time.time()}
        ]

    @app.get("/test/state")
    async def test_state() -> dict[str, Any]:
        return {"fault": state["fault"], "calls": state["calls"], "checked": state["checked"], "lora": lora.state()}

    @app.post("/test/fault")
    async def set_fault(request: Request) -> dict[str, Any]:
        """Set the fault, and count calls afresh from here (``GET /test/state``)."""
        state["fault"] = await request.json()
        state["calls"] = {}
        return state["fault"]

    def run_batch(
        ids: list[list[int]], rids: list[str], params: list[dict[str, Any]], adapters: list[str | None]
    ) -> list[dict[str, Any]]:
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, p in enumerate(params):
            key = (p.get("temperature", 1.0), p.get("top_p", 1.0), p.get("max_new_tokens", 128), p.get("ignore_eos", False))
            groups.setdefault((*key, adapters[i]), []).append(i)
        out: list[dict[str, Any]] = [{} for _ in ids]
        for (temperature, top_p, max_new, ignore_eos, adapter), rows in groups.items():
            sampling = SamplingParams(temperature, top_p, int(max_new), params[rows[0]].get("sampling_seed"), ignore_eos)
            with lora.serving(adapter):
                results = engine.generate([GenerationRequest(rids[i], ids[i]) for i in rows], sampling)
            for i, result in zip(rows, results, strict=True):
                out[i] = {
                    "output_ids": result.response_ids,
                    "meta_info": {
                        "id": rids[i],
                        "finish_reason": FINISH[result.stop_reason],
                        "prompt_tokens": len(ids[i]),
                        "completion_tokens": len(result.response_ids),
                        "output_token_logprobs": [
                            [lp, token, None] for lp, token in zip(result.log_probs, result.response_ids, strict=True)
                        ],
                        "weight_version": state["weight_version"],
                    },
                }
        return out

    @app.post("/generate")
    async def generate(request: Request) -> Any:
        state["calls"]["/generate"] = state["calls"].get("/generate", 0) + 1
        mode = fault_now("/generate")
        if (response := await faulted(mode)) is not None:
            return response
        body = await request.json()
        single = bool(body["input_ids"]) and isinstance(body["input_ids"][0], int)
        ids = [body["input_ids"]] if single else body["input_ids"]
        params = body.get("sampling_params") or {}
        params = params if isinstance(params, list) else [params] * len(ids)
        rids = body.get("rid") or [str(i) for i in range(len(ids))]
        rids = [rids] if isinstance(rids, str) else rids
        adapters = body.get("lora_path")
        adapters = adapters if isinstance(adapters, list) else [adapters] * len(ids)
        try:
            lora.resolve(adapters)
            out = await asyncio.to_thread(run_batch, ids, rids, params, adapters)
        except (RuntimeError, ValueError) as error:  # asleep, the KV cache released, an unknown adapter
            return JSONResponse({"object": "error", "message": str(error), "code": 400}, 400)
        if mode == "malformed":
            return [{"text": "no meta_info here"} for _ in out]
        return out[0] if single else out

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        engine.abort()
        return Response(status_code=200)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        engine.reset_prefix_cache()
        return Response(content="Cache flushed.\n", status_code=200)

    @app.api_route("/release_memory_occupation", methods=["GET", "POST"])
    async def release(request: Request) -> Response:
        tags = (await request.json()).get("tags") or ["kv_cache", "weights"]
        await asyncio.to_thread(engine.sleep if "weights" in tags else engine.release_kv_cache)
        return Response(status_code=200)

    @app.api_route("/resume_memory_occupation", methods=["GET", "POST"])
    async def resume(request: Request) -> Response:
        tags = (await request.json()).get("tags") or ["kv_cache", "weights"]
        await asyncio.to_thread(engine.wake_up if "weights" in tags else engine.resume_kv_cache)
        return Response(status_code=200)

    def load_disk(body: dict[str, Any]) -> None:
        tensors: dict[str, torch.Tensor] = {}
        for file in sorted(Path(body["model_path"]).glob("*.safetensors")):
            tensors.update(load_file(str(file)))
        with lock:
            engine.update_weights(tensors.items(), version=int(body.get("weight_version") or engine.version))
            state["weight_version"] = str(engine.version)
            lora.base_replaced()

    @app.post("/update_weights_from_disk")
    async def update_from_disk(request: Request) -> Any:
        if (response := await faulted(fault_now("/update_weights_from_disk"))) is not None:
            return response
        body = await request.json()
        try:
            await asyncio.to_thread(load_disk, body)
        except (OSError, KeyError, RuntimeError) as error:
            return JSONResponse({"success": False, "message": str(error), "num_paused_requests": 0}, 400)
        return {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}

    def join_group(body: dict[str, Any]) -> None:
        store = dist.TCPStore(body["master_address"], int(body["master_port"]), int(body["world_size"]), False)
        state["store"] = store
        state["group"] = dist.ProcessGroupGloo(store, int(body["rank_offset"]), int(body["world_size"]))

    @app.post("/init_weights_update_group")
    async def init_group(request: Request) -> Any:
        body = await request.json()
        await asyncio.to_thread(join_group, body)
        return {"success": True, "message": "Succeeded to initialize custom process group."}

    def receive(body: dict[str, Any]) -> None:
        tensors = []
        for name, dtype, shape in zip(body["names"], body["dtypes"], body["shapes"], strict=True):
            tensor = torch.empty(shape, dtype=getattr(torch, dtype))
            state["group"].broadcast(tensor, 0).wait()
            tensors.append((name, tensor))
        with lock:
            engine.update_weights(tensors, version=int(body.get("weight_version") or engine.version))
            state["weight_version"] = str(engine.version)
            lora.base_replaced()

    @app.post("/update_weights_from_distributed")
    async def update_distributed(request: Request) -> Any:
        body = await request.json()
        if state["group"] is None:
            return JSONResponse({"success": False, "message": "no weight update group"}, 400)
        await asyncio.to_thread(receive, body)
        return {"success": True, "message": "Succeeded to update parameter online."}

    @app.post("/destroy_weights_update_group")
    async def destroy_group(request: Request) -> Any:
        state["group"], state["store"] = None, None
        return {"success": True, "message": "Succeeded to destroy custom process group."}

    @app.api_route("/get_weights_by_name", methods=["GET", "POST"])
    async def weights_by_name(request: Request) -> Any:
        body = await request.json()
        def base_weights() -> dict[str, torch.Tensor]:
            with lora.serving(None):  # sglang holds the base weights, its adapters apart
                return dict(engine.export_weights())

        weights = await asyncio.to_thread(base_weights)
        if body["name"] not in weights:
            return JSONResponse({"object": "error", "message": f"no parameter {body['name']}", "code": 400}, 400)
        return weights[body["name"]].float().tolist()

    return app


def add_conformance_check(app: FastAPI, state: dict[str, Any], vocab_size: int) -> None:
    """Hold every request, and every answer sglang has a type for, to sglang's types
    (``/test/*`` excepted: it is this server's own)."""
    io_struct()  # fail at start, naming the version, where sglang's types cannot be loaded

    @app.middleware("http")
    async def conform(request: Request, call_next: Any) -> Response:
        endpoint = request.url.path
        if endpoint.startswith("/test/"):
            return await call_next(request)
        raw = await request.body()
        try:
            check_request(endpoint, json.loads(raw) if raw else None, vocab_size)
        except (SchemaError, json.JSONDecodeError) as error:
            return JSONResponse({"object": "error", "message": str(error), "code": 422}, 422)
        state["checked"][endpoint] = state["checked"].get(endpoint, 0) + 1
        response = await call_next(request)
        content = b"".join([chunk async for chunk in response.body_iterator])
        is_json = response.headers.get("content-type", "").startswith("application/json")
        answer = json.loads(content) if content and is_json else None
        if response.status_code < 300 or (isinstance(answer, dict) and "success" in answer):
            try:
                check_response(endpoint, answer)
            except SchemaError as error:
                return JSONResponse({"object": "error", "message": f"test server: {error}", "code": 500}, 500)
        return Response(content, response.status_code, dict(response.headers))


def main() -> None:
    model_dir, port, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    uvicorn.run(build_app(model_dir, seed), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
