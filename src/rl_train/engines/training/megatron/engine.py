"""The megatron-core training engine (``actor.engine: megatron``): the ``TrainingEngine`` contract
on a megatron ``GPTModel``, its schedules and its distributed optimizer.

- **Parallel layout.** ``actor.megatron.tensor_parallel_size`` and ``pipeline_parallel_size``
  come from config; data parallelism is what is left of the world (``actor.num_ranks``).
  The trainer worker joins the ranks in one ``torch.distributed`` world (gloo on CPU, NCCL on
  GPU); this engine then sets up megatron's groups in it, in megatron's own rank order
  (tensor parallel fastest, then data, then pipeline). A single process with no world gets
  one of its own, of size 1, over an in-memory store (no port is opened).
- **Weights.** The policy's HF safetensors are converted once (``hf_bridge``: names, fused QKV,
  gated MLP) and each rank keeps its own tensor-parallel shard of its pipeline stage.
  ``export_weights`` gathers them back into HF-named tensors (a collective over the tensor and
  pipeline groups: every rank of those groups calls it together).
- **Passes.** ``compute_log_probs`` runs the forward-only schedule; ``train_batch`` puts the
  project's loss function in the schedule's loss slot, then one update with the distributed
  optimizer, dividing the summed gradients once by the global token denominator (R-4.3).
- **Learning rate.** The same warm-up and decay as the torch engine (``lr_lambda``), set on
  the optimizer's groups before each step. megatron skips weight decay on biases and norms
  (its standard parameter groups); the torch engine decays every parameter.
- **State.** ``state_dict`` is this rank's own: its parameter shard, its shard of the Adam
  moments (the distributed optimizer keeps only those) and the step count, with the layout it
  was saved under. A checkpoint is restored by the same layout; another one is refused by
  name.

On a machine without CUDA every megatron call runs behind ``cpu_compat``.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.megatron.cpu_compat import megatron_on_this_device
from rl_train.engines.training.megatron.export import broadcast_json, export_hf_weights, local_parameters
from rl_train.engines.training.megatron.hf_bridge import (
    build_gpt_model,
    check_supported,
    hf_to_megatron,
    shard_for_pipeline,
    shard_for_tensor_parallel,
    transformer_config,
)
from rl_train.engines.training.megatron.optimizer import optimizer_step, wrap_for_training, zero_grads
from rl_train.engines.training.megatron.schedule import forward_backward, forward_log_probs, pad_positions
from rl_train.engines.training.micro_batch import split_micro_batches
from rl_train.engines.training.protocol import Batch, LossFn
from rl_train.engines.training.snapshot import WeightSnapshots
from rl_train.engines.training.torch_engine import lr_lambda

warnings.filterwarnings("ignore", message="Apex is not installed")
warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
warnings.filterwarnings("ignore", message="full scope is deprecated")
warnings.filterwarnings("ignore", message=r"`torch\.distributed\.(reduce_scatter_tensor|all_gather_into_tensor)` is deprecated")
warnings.filterwarnings("ignore", message="The .grad attribute of a Tensor that is not a leaf")
"""megatron-core's own known noise (at import: the optional fused kernels it falls back from, a
config default it deprecates; on every step: its optimizer reads the grads of its shard views on
purpose, and it calls torch's older collective names), not the user's concern."""

HF_SIDE_FILES = ("config.json", "generation_config.json")
"""Files of the HF model directory that ``save_pretrained`` copies as they are."""
T = TypeVar("T")


def _entry(state: dict[str, object], key: str, kind: type[T]) -> T:
    """``state[key]``, which ``state_dict`` made a ``kind``; anything else is not this engine's state."""
    value = state[key]
    if not isinstance(value, kind):
        raise TypeError(f"megatron engine state: {key!r} is a {type(value).__name__}, not a {kind.__name__}")
    return value


class LayoutMismatchError(ValueError):
    """A checkpoint saved under another parallel layout than this engine's."""


def read_hf_weights(model_path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the HF directory's safetensors files (one file or an indexed set)."""
    from safetensors.torch import load_file

    files = sorted(model_path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_path} holds no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


def ensure_parallel_state(tensor_parallel: int, pipeline_parallel: int) -> None:
    """megatron's groups in this process's ``torch.distributed`` world (a world of one, in
    memory, when there is none). The world must divide by TP x PP; a process whose groups
    were set up with other sizes is refused."""
    from megatron.core import parallel_state

    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    world = dist.get_world_size()
    if world % (tensor_parallel * pipeline_parallel):
        raise ValueError(
            f"actor.num_ranks={world} is not divisible by actor.megatron.tensor_parallel_size x "
            f"pipeline_parallel_size = {tensor_parallel} x {pipeline_parallel}"
        )
    if parallel_state.model_parallel_is_initialized():
        have = (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
        )
        if have != (tensor_parallel, pipeline_parallel):
            raise ValueError(
                f"this process already runs megatron with tensor x pipeline parallel {have}, "
                f"not {(tensor_parallel, pipeline_parallel)}"
            )
        return
    with megatron_on_this_device():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tensor_parallel, pipeline_model_parallel_size=pipeline_parallel
        )


class MegatronTrainingEngine:
    def __init__(
        self,
        model_path: str | Path,
        cfg: ActorConfig,
        horizon_steps: int,
        temperature: float = 1.0,
        seed: int = 0,
    ) -> None:
        from megatron.core import parallel_state, tensor_parallel

        from rl_train.engines.model.tokenizer import load_tokenizer

        self.model_path = Path(model_path)
        self.cfg = cfg
        self.temperature = temperature
        self.hf_config: dict[str, Any] = json.loads((self.model_path / "config.json").read_text())
        check_supported(self.hf_config)
        self.tokenizer = load_tokenizer(self.model_path)
        tp, pp = cfg.megatron.tensor_parallel_size, cfg.megatron.pipeline_parallel_size
        ensure_parallel_state(tp, pp)
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        self.dp_rank = parallel_state.get_data_parallel_rank()
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.layout = {"tensor_parallel": tp, "pipeline_parallel": pp, "data_parallel": self.dp_size}
        self.is_last_stage = self.pp_rank == pp - 1
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        dtype = torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32
        torch.manual_seed(seed)
        with megatron_on_this_device():
            tensor_parallel.model_parallel_cuda_manual_seed(seed)
            config = transformer_config(
                self.hf_config, dtype, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp
            )
            model = build_gpt_model(
                self.hf_config, config, pre_process=self.pp_rank == 0, post_process=self.is_last_stage
            )
        whole = hf_to_megatron({k: v.to(dtype) for k, v in read_hf_weights(self.model_path).items()}, self.hf_config)
        stage = shard_for_pipeline(whole, self.hf_config, pp, self.pp_rank)
        missing, unexpected = model.load_state_dict(
            shard_for_tensor_parallel(stage, self.hf_config, tp, self.tp_rank), strict=False
        )
        missing = [name for name in missing if "_extra_state" not in name]
        if missing or unexpected:
            raise ValueError(f"{self.model_path}: weights do not fit the model: missing {missing}, unexpected {unexpected}")
        self.model, self.optimizer = wrap_for_training(
            model,
            config,
            {"lr": cfg.lr, "weight_decay": cfg.weight_decay, "betas": cfg.betas, "grad_clip": cfg.grad_clip},
        )
        self.lr_factor = lr_lambda(cfg, horizon_steps)
        self.steps = 0
        self._set_lr()
        self._pi_old = WeightSnapshots()

    @property
    def module(self) -> torch.nn.Module:
        """The ``GPTModel`` inside megatron's DDP wrapper."""
        return self.model.module

    def _set_lr(self) -> float:
        lr = self.cfg.lr * self.lr_factor(self.steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    # -- passes ---------------------------------------------------------------------------
    def _micro_batches(self, batch: Batch, rows: int | None) -> list[Batch]:
        """Consecutive micro-batches as the torch engine cuts them, each trimmed to its own
        longest row; with pipeline stages every one has the same shape (p2p sends one). On
        the engine's device."""
        return [{k: v.to(self.device) for k, v in micro.items()} for micro in self._cut(batch, rows)]

    def _cut(self, batch: Batch, rows: int | None) -> list[Batch]:
        if self.layout["pipeline_parallel"] > 1:
            size = rows or batch["input_ids"].shape[0]
            if batch["input_ids"].shape[0] % size:
                raise ValueError(
                    f"with pipeline stages the batch ({batch['input_ids'].shape[0]} rows) must divide "
                    f"into micro-batches of {size} rows"
                )
            return [{k: v[i : i + size] for k, v in batch.items()} for i in range(0, batch["input_ids"].shape[0], size)]
        return split_micro_batches(batch, rows, self.cfg.max_tokens_per_micro_batch)

    def compute_log_probs(
        self,
        batch: Batch,
        *,
        with_entropy: bool = False,
        pi_old: bool = False,
        record_routes: bool = False,
        base: bool = False,
    ) -> Batch:
        """The contract's pass; on an MoE model, ``record_routes`` also gives ``routes``
        [B, T, L, k] (the experts each token went to: R2 records them for the update), and a
        batch carrying ``routes`` is routed by them (replay). ``base``: refused (no LoRA here)."""
        if base:
            raise ValueError("the megatron engine has no LoRA adapters to switch off (reference_is_base is False)")
        if pi_old and self._pi_old.active:
            with self._pi_old.swapped_in(self.module):
                return self._log_probs(batch, with_entropy, record_routes)
        return self._log_probs(batch, with_entropy, record_routes)

    def _log_probs(self, batch: Batch, with_entropy: bool, record_routes: bool = False) -> Batch:
        micro_batches = self._micro_batches(batch, self.cfg.infer_micro_batch_size)
        out = forward_log_probs(
            self.model, micro_batches, self.temperature, int(self.hf_config["vocab_size"]), with_entropy, record_routes
        )
        width = batch["input_ids"].shape[1]
        if out is not None:  # as wide as the batch, whatever the widest micro-batch was
            out = {key: pad_positions(value, width) for key, value in out.items()}
        return {key: value.cpu() for key, value in self._from_last_stage(out, batch["input_ids"].shape, with_entropy).items()}

    def _from_last_stage(self, out: Batch | None, shape: torch.Size, with_entropy: bool) -> Batch:
        """The last pipeline stage's outputs on every stage (one broadcast per field)."""
        if self.layout["pipeline_parallel"] == 1:
            assert out is not None
            return out
        from megatron.core import parallel_state

        keys = ["log_probs", "entropy"] if with_entropy else ["log_probs"]
        result = {}
        for key in keys:
            tensor = out[key].contiguous() if out is not None else torch.empty(shape, dtype=torch.float32, device=self.device)
            dist.broadcast(
                tensor,
                src=parallel_state.get_pipeline_model_parallel_last_rank(),
                group=parallel_state.get_pipeline_model_parallel_group(),
            )
            result[key] = tensor
        return result

    def train_batch(self, batch: Batch, loss_fn: LossFn) -> dict[str, float]:
        """One optimizer step over this data-parallel rank's batch (R-4.1-4.3)."""
        zero_grads(self.model, self.optimizer)
        micro_batches = self._micro_batches(batch, self.cfg.micro_batch_size)
        numerator, denominator, metrics = forward_backward(
            self.model,
            micro_batches,
            loss_fn,
            self.temperature,
            int(self.hf_config["vocab_size"]),
            with_entropy=self.cfg.entropy_coeff > 0,
        )
        totals = self._loss_totals(numerator, denominator, metrics)
        lr = self._set_lr()
        out = dict(optimizer_step(self.model, self.optimizer, denominator))
        self.steps += 1
        self._set_lr()
        out.update(totals)
        out["actor/lr"] = lr
        out["actor/num_micro_batches"] = float(len(micro_batches))
        return out

    def _loss_totals(self, numerator: float, denominator: float, metrics: dict[str, float]) -> dict[str, float]:
        """``actor/loss`` over the global batch, and the token-weighted metrics of this rank,
        the same on every rank (the sums come from the last pipeline stage)."""
        from megatron.core import parallel_state

        if self.layout["pipeline_parallel"] > 1:  # only the last stage ran the loss: its names and sums
            document = broadcast_json(
                {"sums": [numerator, denominator], "metrics": metrics} if self.is_last_stage else None,
                parallel_state.get_pipeline_model_parallel_last_rank(),
                parallel_state.get_pipeline_model_parallel_group(),
            )
            (numerator, denominator), metrics = document["sums"], document["metrics"]
        names = sorted(metrics)
        sums = torch.tensor([numerator, denominator, *(metrics[n] for n in names)], dtype=torch.float64)
        if self.dp_size > 1:
            on_device = sums.to(self.device)
            dist.all_reduce(on_device, group=parallel_state.get_data_parallel_group())
            sums = on_device.cpu()
            sums[2:] /= self.dp_size
        out = {name: float(value) for name, value in zip(names, sums[2:], strict=True)}
        out["actor/loss"] = float(sums[0]) / max(float(sums[1]), 1.0)
        return out

    # -- pi_old (R-2.8) -------------------------------------------------------------------
    def snapshot_pi_old(self) -> None:
        self._pi_old.save(self.module)

    def clear_pi_old(self) -> None:
        self._pi_old.clear()

    # -- export and state -----------------------------------------------------------------
    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """HF-named whole tensors (R-4.6), gathered over the tensor and pipeline groups."""
        with megatron_on_this_device():
            weights = export_hf_weights(self.model, self.hf_config)
        if self.hf_config.get("tie_word_embeddings"):  # HF's state dict names the tied head too
            weights.setdefault("lm_head.weight", weights["model.embed_tokens.weight"])
        yield from weights.items()

    def state_dict(self) -> dict[str, object]:
        inner = self.optimizer.optimizer  # torch's Adam over this rank's shards
        main = getattr(self.optimizer, "shard_fp32_from_float16_groups", [])
        return {
            "layout": dict(self.layout, tensor_rank=self.tp_rank, pipeline_rank=self.pp_rank, data_rank=self.dp_rank),
            "model": local_parameters(self.model),
            "optimizer": inner.state_dict(),
            "main_params": [[t for t in group if t is not None] for group in main],
            "scheduler": {"steps": self.steps},
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        layout = dict(_entry(state, "layout", dict))
        mine = dict(self.layout, tensor_rank=self.tp_rank, pipeline_rank=self.pp_rank, data_rank=self.dp_rank)
        if layout != mine:
            raise LayoutMismatchError(f"the checkpoint was saved under the parallel layout {layout}, this rank is {mine}")
        params = dict(self.model.named_parameters())
        saved: dict[str, torch.Tensor] = _entry(state, "model", dict)
        with torch.no_grad():
            for name, tensor in saved.items():
                params[f"module.{name}"].copy_(tensor)
        self.optimizer.optimizer.load_state_dict(state["optimizer"])
        main = getattr(self.optimizer, "shard_fp32_from_float16_groups", [])
        with torch.no_grad():
            for group, saved_group in zip(main, _entry(state, "main_params", list), strict=True):
                for tensor, value in zip([t for t in group if t is not None], saved_group, strict=True):
                    tensor.copy_(value)
        self.steps = int(_entry(state, "scheduler", dict)["steps"])
        self._set_lr()

    def save_pretrained(self, path: Path) -> None:
        """An HF directory ``transformers`` loads as it is: the gathered weights in the HF
        model's own dtype, its config, generation config and tokenizer (a collective, like
        ``export_weights``; only the first rank writes)."""
        from safetensors.torch import save_file

        dtype = getattr(torch, str(self.hf_config.get("torch_dtype") or self.hf_config.get("dtype") or "float32"))
        weights = {name: tensor.to(dtype).contiguous() for name, tensor in self.export_weights()}
        if self.hf_config.get("tie_word_embeddings"):
            weights.pop("lm_head.weight", None)  # one tensor on disk; transformers ties it again
        if dist.get_rank() != 0:
            return
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
        for name in HF_SIDE_FILES:
            if (self.model_path / name).exists():
                shutil.copyfile(self.model_path / name, path / name)
        self.tokenizer.save_pretrained(path)

    @property
    def data_parallel_rank(self) -> int:
        """megatron's data-parallel rank: the ranks of one tensor x pipeline split share it."""
        return self.dp_rank

    def export_adapters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Never called: actor.lora is refused with megatron at config load."""
        raise ValueError("the megatron engine trains no LoRA adapters (actor.lora is refused with megatron)")

    @property
    def reference_is_base(self) -> bool:
        """False: the reference is an engine of its own (actor.lora is refused with megatron)."""
        return False

    @property
    def replays_routes(self) -> bool:
        """True: megatron-core's routers record and replay (a dense model's routes are empty)."""
        return True
