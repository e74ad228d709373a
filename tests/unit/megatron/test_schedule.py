"""megatron-core's schedules on CPU: forward-only log-probs equal HF's, and the update's
gradients (numerators through the loss-function slot, one global denominator) equal HF's
and do not depend on how the batch is cut into micro-batches (R-4.2, R-4.3)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")

from rl_train.engines.training.megatron.schedule import check_right_padded, split_batch  # noqa: E402


def test_a_batch_with_padding_inside_a_row_is_refused() -> None:
    check_right_padded(torch.tensor([[1, 1, 0], [1, 1, 1]]))
    with pytest.raises(ValueError, match=r"rows \[1\] have padding inside"):
        check_right_padded(torch.tensor([[1, 1, 0], [0, 1, 1]]))


def test_micro_batches_are_consecutive_rows() -> None:
    batch = {"input_ids": torch.arange(10).view(5, 2)}
    parts = split_batch(batch, 2)
    assert [p["input_ids"].shape[0] for p in parts] == [2, 2, 1]
    assert torch.cat([p["input_ids"] for p in parts]).equal(batch["input_ids"])


SCRIPT = """
import json, os, socket, sys, warnings
warnings.filterwarnings("ignore")
import torch, torch.distributed as dist
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from rl_train.engines.training.megatron.cpu_compat import megatron_on_this_device
from rl_train.engines.training.megatron.hf_bridge import build_gpt_model, hf_to_megatron, transformer_config
from rl_train.engines.training.megatron.schedule import forward_backward, forward_log_probs, token_log_probs

folder = sys.argv[1]
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ["GLOO_SOCKET_IFNAME"] = "lo"
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
from megatron.core import parallel_state, tensor_parallel
parallel_state.initialize_model_parallel(1, 1)
hf_config = json.load(open(f"{folder}/config.json"))
with megatron_on_this_device():
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    model = build_gpt_model(hf_config, transformer_config(hf_config))
model.load_state_dict(hf_to_megatron(load_file(f"{folder}/model.safetensors"), hf_config), strict=False)
reference = AutoModelForCausalLM.from_pretrained(folder)

g = torch.Generator().manual_seed(0)
lengths = [10, 7, 9, 5, 8]
mask = torch.tensor([[1] * n + [0] * (10 - n) for n in lengths])
batch = {"input_ids": torch.randint(3, hf_config["vocab_size"], (5, 10), generator=g) * mask, "attention_mask": mask}
response = mask.clone()
response[:, :3] = 0
batch["response_mask"] = response
temperature = 0.7

def loss_fn(outputs, micro_batch):
    numerator = -(outputs["log_probs"] * micro_batch["response_mask"]).sum()
    return numerator, float(micro_batch["response_mask"].sum()), {"nll": 0.0}

def hf_log_probs(train):
    reference.train(train)
    logits = reference(input_ids=batch["input_ids"], attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    return token_log_probs(logits, batch["input_ids"], temperature)

with torch.no_grad():
    want = hf_log_probs(False)
got = forward_log_probs(model, batch, temperature, micro_batch_size=2)
result = {"log_prob_diff": ((got - want).abs() * mask).max().item()}

(-(hf_log_probs(True) * response).sum() / response.sum()).backward()
want_grads = hf_to_megatron({n: p.grad for n, p in reference.named_parameters()}, hf_config)
grads = {}
for cut in (1, 2, 5):
    for p in model.parameters():
        p.grad = None
    numerator, denominator, _ = forward_backward(model, batch, loss_fn, temperature, micro_batch_size=cut)
    grads[cut] = {n: p.grad / denominator for n, p in model.named_parameters()}
    result[f"denominator_{cut}"] = denominator
result["grad_diff_vs_hf"] = max((grads[2][n] - want_grads[n]).abs().max().item() for n in want_grads)
result["grad_diff_between_cuts"] = max((grads[c][n] - grads[5][n]).abs().max().item() for c in (1, 2) for n in want_grads)
print(json.dumps(result))
dist.destroy_process_group()
"""


def test_schedules_match_hf_and_the_cut_does_not_matter(tiny_model_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "schedule.py"
    script.write_text(textwrap.dedent(SCRIPT))
    run = subprocess.run([sys.executable, str(script), str(tiny_model_dir)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["log_prob_diff"] < 1e-5, result
    assert result["denominator_1"] == result["denominator_2"] == result["denominator_5"] == float(7 + 4 + 6 + 2 + 5)
    assert result["grad_diff_vs_hf"] < 1e-5, result
    assert result["grad_diff_between_cuts"] < 1e-6, result
