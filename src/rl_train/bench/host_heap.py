"""Forward and update passes of the tool-task policy with the worker heap kept, and with glibc's own.

A training rank or rollout replica keeps freed heap for its next tensors
(``engines/workers/host_memory.py``). This bench measures what that buys on the passes a
training rank runs: each side in a fresh interpreter (the allocator settings are a process's
for good), one torch thread as separate_async's trainer has, the built-in tool policy
(``models/tiny-qwen2-tools``; the same architecture untrained if it is missing) on random token ids of the tool task's length
(130 tokens), micro-batches of ``--rows``:

- ``forward``: one forward-only pass (log-probs of every token), as old_log_prob and ref run;
- ``update``: forward, backward and an AdamW step.

Each process warms up, then times ``--passes`` passes of each kind and counts the page faults
they meet (``ru_minflt``). The two sides run ``--rounds`` times in turns (kept, default, kept,
...), and the table gives the medians, their ratio, and the median of each round's own ratio.

    python -m rl_train.bench.host_heap
    python -m rl_train.bench.host_heap --rows 64 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DEFAULT_MODEL = REPO / "models" / "tiny-qwen2-tools"
SIDES = ("kept", "default")

CHILD = """
import json, resource, sys, time
from rl_train.engines.workers.host_memory import keep_freed_memory
side, model_dir, rows, passes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if side == "kept":
    keep_freed_memory(1024)
import torch
torch.set_num_threads(1)
torch.set_flush_denormal(True)  # as the workers do
torch.manual_seed(0)
from rl_train.engines.model.loading import load_policy
from rl_train.engines.training.token_outputs import token_log_probs
model, _ = load_policy(model_dir, dtype=torch.float32, impl="auto")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
ids = torch.randint(3, 90, (rows, 130))
positions = torch.arange(130).expand(rows, 130)
def forward():
    logits = model(input_ids=ids, attention_mask=None, position_ids=positions).logits
    return token_log_probs(logits, ids, 1.0)
def infer():
    with torch.no_grad():
        forward()
def update():
    forward().sum().backward()
    optimizer.step()
    optimizer.zero_grad()
def timed(fn):
    fn(); fn()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    for _ in range(passes):
        fn()
    seconds = (time.perf_counter() - start) / passes
    return seconds, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / passes
out = {}
for name, fn in (("forward", infer), ("update", update)):
    model.train(name == "update")
    out[name] = timed(fn)
print(json.dumps(out))
"""


def run_side(side: str, model: str, rows: int, passes: int) -> dict[str, tuple[float, float]]:
    """One fresh interpreter's (seconds, page faults) per pass of each kind."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, side, model, str(rows), str(passes)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return {k: (float(v[0]), float(v[1])) for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def policy_dir(path: Path, scratch: Path) -> Path:
    """``path`` if it holds a policy, else the same architecture untrained, in ``scratch``
    (the passes' cost does not depend on what the weights learnt)."""
    if (path / "config.json").exists():
        return path
    from rl_train.engines.model.tiny import create_tiny_policy

    return create_tiny_policy(scratch / "policy", seed=0, pretrain_steps=0)


def format_table(rounds: list[dict[str, dict[str, tuple[float, float]]]]) -> str:
    lines = [
        "| pass | kept: ms / faults | glibc default: ms / faults | kept / default | per round: median (range) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for kind in ("forward", "update"):
        kept = [r["kept"][kind] for r in rounds]
        default = [r["default"][kind] for r in rounds]
        k_ms, d_ms = statistics.median(s for s, _ in kept) * 1e3, statistics.median(s for s, _ in default) * 1e3
        k_f, d_f = statistics.median(f for _, f in kept), statistics.median(f for _, f in default)
        pairs = [r["kept"][kind][0] / r["default"][kind][0] for r in rounds]
        lines.append(
            f"| {kind} | {k_ms:.1f} / {k_f:,.0f} | {d_ms:.1f} / {d_f:,.0f} | {k_ms / d_ms:.2f}x "
            f"| {statistics.median(pairs):.2f}x ({min(pairs):.2f}-{max(pairs):.2f}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(DEFAULT_MODEL), help="HF policy directory")
    parser.add_argument("--rows", type=int, default=32, help="trajectories per micro-batch")
    parser.add_argument("--passes", type=int, default=10, help="timed passes of each kind per process")
    parser.add_argument("--rounds", type=int, default=3, help="processes per side, in turns")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rlt-heap-") as scratch:
        model = str(policy_dir(Path(args.model), Path(scratch)))
        rounds = []
        for i in range(args.rounds):
            order = SIDES if i % 2 == 0 else SIDES[::-1]
            rounds.append({side: run_side(side, model, args.rows, args.passes) for side in order})
            print(f"round {i + 1}/{args.rounds} done", file=sys.stderr)
    print(f"{model}: {args.rows} x 130 tokens, 1 thread, {args.passes} passes each, medians of {args.rounds} rounds")
    print(format_table(rounds))


if __name__ == "__main__":
    main()
