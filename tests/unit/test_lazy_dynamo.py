"""Building a training engine does not import torch's compiler (about 1.7 s of a worker's
start-up); its first update still works and imports it then."""

from __future__ import annotations

from pathlib import Path

from import_probe import imported_after


def test_building_the_torch_engine_imports_no_compiler(tiny_model_dir: Path) -> None:
    statement = (
        "from rl_train.engines.training.config import ActorConfig; "
        "from rl_train.engines.training.registry import build_training_engine; "
        f"e = build_training_engine('torch', {str(tiny_model_dir)!r}, ActorConfig(), 10); "
        "s = e.state_dict(); e.load_state_dict(s)"
    )
    assert imported_after(statement, ("torch._dynamo", "transformers")) == []


def test_the_optimizer_behaves_as_before_the_setting() -> None:
    """Same steps with and without the setting: bitwise the same weights and state."""
    import subprocess
    import sys

    code = (
        "import torch, sys\n"
        "if sys.argv[1] == '1':\n"
        "    from rl_train.engines.training.lazy_dynamo import optimizers_without_compiler\n"
        "    optimizers_without_compiler()\n"
        "torch.manual_seed(0); m = torch.nn.Linear(8, 4); o = torch.optim.AdamW(m.parameters(), lr=1e-2)\n"
        "for _ in range(3):\n"
        "    o.zero_grad(); m(torch.randn(5, 8)).pow(2).sum().backward(); o.step()\n"
        "o.load_state_dict(o.state_dict())\n"
        "print(repr([p.sum().item() for p in m.parameters()]))\n"
    )
    outs = [subprocess.run([sys.executable, "-c", code, flag], capture_output=True, text=True, check=True).stdout for flag in "01"]
    assert outs[0] == outs[1] and outs[0]
