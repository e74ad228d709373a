"""Building a training engine, updating it and saving its state import no torch compiler
(about 1.7 s of a worker's start-up), and the optimizer behaves exactly as torch's own step."""

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


def test_an_update_imports_no_compiler(tiny_model_dir: Path) -> None:
    statement = (
        "import torch; from rl_train.engines.training.config import ActorConfig; "
        "from rl_train.engines.training.registry import build_training_engine; "
        f"e = build_training_engine('torch', {str(tiny_model_dir)!r}, ActorConfig(), 10); "
        "[p.sum().backward() for p in e.model.parameters()]; m = e.optimizer_step(); "
        "assert m['actor/nonfinite_steps'] == 0.0; e.load_state_dict(e.state_dict())"
    )
    assert imported_after(statement, ("torch._dynamo",)) == []


STEPS = (
    "import torch, sys, warnings\n"
    "warnings.simplefilter('error')\n"
    "from rl_train.engines.training.lazy_dynamo import optimizers_without_compiler, step_without_compiler\n"
    "if sys.argv[1] == '1':\n"
    "    optimizers_without_compiler()\n"
    "step = step_without_compiler if sys.argv[1] == '1' else (lambda o: o.step())\n"
    "torch.manual_seed(0); m = torch.nn.Linear(8, 4)\n"
    "o = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)\n"
    "s = torch.optim.lr_scheduler.LambdaLR(o, lambda k: 1.0 / (k + 1))\n"
    "calls = []\n"
    "o.register_step_pre_hook(lambda *a: calls.append('pre'))\n"
    "o.register_step_post_hook(lambda *a: calls.append('post'))\n"
    "for _ in range(3):\n"
    "    o.zero_grad(); m(torch.randn(5, 8)).pow(2).sum().backward()\n"
    "    grad_mode = []; o.register_step_pre_hook(lambda *a: grad_mode.append(torch.is_grad_enabled()))\n"
    "    step(o); s.step()\n"
    "o.load_state_dict(o.state_dict())\n"
    "print(repr([p.sum().item() for p in m.parameters()]), calls, grad_mode, s.get_last_lr(),\n"
    "      'torch._dynamo' in sys.modules)\n"
)


def test_the_step_without_compiler_is_torchs_step() -> None:
    """Bitwise the same weights, the hooks called in order, no scheduler warning (an error
    here), and only torch's own step imports the compiler."""
    import subprocess
    import sys

    outs = [
        subprocess.run([sys.executable, "-c", STEPS, flag], capture_output=True, text=True, check=True).stdout
        for flag in "01"
    ]
    assert outs[0].endswith("True\n") and outs[1].endswith("False\n")
    assert outs[0].rsplit(" ", 1)[0] == outs[1].rsplit(" ", 1)[0]
    assert "['pre', 'post', 'pre', 'post', 'pre', 'post']" in outs[1]


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
