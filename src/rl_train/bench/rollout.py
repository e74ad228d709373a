"""Generation throughput of the built-in rollout engine against transformers' ``generate``.

Both sides sample the same batch of prompts from the same policy with the same settings
(temperature 1.0, no top-k, no top-p, EOS ignored so that every sequence generates exactly
the requested number of new tokens) and both return the chosen tokens' log-probs:

- built-in: ``TorchRolloutEngine.generate`` (``engines/rollout/torch_engine.py``) with
  ``SamplingParams(ignore_eos=True)``, timed from the requests (token lists) to the results
  (token and log-prob lists per request), as the rollout worker calls it;
- transformers: ``AutoModelForCausalLM.from_pretrained`` and ``model.generate(do_sample=True,
  output_logits=True, return_dict_in_generate=True)`` on the left-padded batch, timed from
  the token lists to the chosen tokens' log-probs, ``log_softmax(logits / T)`` gathered at
  the sampled tokens (as tensors: the per-request lists the engine builds are not charged
  to transformers).

Prompts are the demo task's (``single_digit_sum``: ``"3+4="``), encoded as the rollout
worker encodes them (BOS, then the text's tokens). Tokens/s counts generated tokens only.
Repetitions are interleaved (transformers then built-in, built-in then transformers, ...)
after one warm-up of each, and the table reports medians, so that a noisy machine hurts both
alike, and the median and range of each rep's own ratio (its two runs back to back).
Both run in this process with the same torch thread count (``--threads``) and the same heap:
by default it keeps freed memory as a rollout worker's process does (``--heap kept``,
``engines/workers/host_memory.py``), or runs on glibc's own settings (``--heap default``),
and once both models are built takes its objects out of the collector's full passes as a
rollout worker does (``--gc frozen``; ``--gc default``: Python's own collector).

    python -m rl_train.bench.rollout                        # 1,024 x 4 and 256 x 32
    python -m rl_train.bench.rollout --reps 7 --threads 1
    python -m rl_train.bench.rollout --case 64x16 --case 1024x4
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rl_train.engines.rollout.protocol import GenerationRequest, SamplingParams
from rl_train.engines.rollout.torch_engine import TorchRolloutEngine
from rl_train.engines.workers.host_memory import freeze_built_objects, keep_freed_memory

REPO = Path(__file__).resolve().parents[3]
DEFAULT_MODEL = REPO / "models" / "tiny-qwen2"
DEFAULT_CASES = ("1024x4", "256x32")
TEMPERATURE = 1.0


@dataclass
class Case:
    prompts: int
    new_tokens: int
    hf_seconds: list[float] = field(default_factory=list)
    engine_seconds: list[float] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        """Generated tokens per run (every sequence generates exactly ``new_tokens``)."""
        return self.prompts * self.new_tokens

    def tokens_per_second(self, seconds: list[float]) -> float:
        return self.tokens / statistics.median(seconds) if seconds else float("nan")

    def pair_ratios(self) -> list[float]:
        """built-in / transformers tokens/s of each rep's two runs, taken back to back: the
        machine's drift over the whole bench (its speed moves by a third within minutes
        here) cancels within a pair."""
        return [hf / engine for hf, engine in zip(self.hf_seconds, self.engine_seconds, strict=True)]


@dataclass
class Output:
    """What one side generated: per request, its new tokens and their log-probs."""

    token_counts: list[int]
    log_probs: torch.Tensor
    """[prompts, new_tokens] log-probs of the chosen tokens."""


def parse_case(text: str) -> Case:
    """``PROMPTSxTOKENS``, e.g. ``1024x4``."""
    prompts, _, tokens = text.lower().partition("x")
    return Case(int(prompts), int(tokens))


def demo_prompts(tokenizer: Any, count: int, seed: int = 0) -> list[list[int]]:
    """``count`` single-digit sums, encoded as the rollout worker encodes a prompt."""
    rng = random.Random(seed)
    texts = [f"{rng.randint(0, 9)}+{rng.randint(0, 9)}=" for _ in range(count)]
    return [[tokenizer.bos_token_id, *tokenizer.encode(t, add_special_tokens=False)] for t in texts]


def run_engine(engine: TorchRolloutEngine, prompts: list[list[int]], new_tokens: int, seed: int) -> Output:
    requests = [GenerationRequest(str(i), ids) for i, ids in enumerate(prompts)]
    params = SamplingParams(TEMPERATURE, 1.0, new_tokens, seed=seed, ignore_eos=True)
    results = engine.generate(requests, params)
    counts = [len(r.response_ids) for r in results]
    return Output(counts, torch.tensor([r.log_probs for r in results]))


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of the prompts, left-padded to the longest."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids, mask


def load_hf(model_path: Path) -> Any:
    """transformers' model of the policy, its generation config set to sample without EOS."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32, local_files_only=True).eval()
    model.generation_config.eos_token_id = None
    return model


def run_hf(model: Any, prompts: list[list[int]], new_tokens: int, seed: int, pad_id: int) -> Output:
    from transformers import GenerationConfig

    ids, mask = left_pad(prompts, pad_id)
    config = GenerationConfig(
        do_sample=True, temperature=TEMPERATURE, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
        eos_token_id=None, pad_token_id=pad_id, output_logits=True, return_dict_in_generate=True,
    )  # fmt: skip
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        chosen = out.sequences[:, ids.shape[1] :]
        logits = torch.stack(out.logits, dim=1).float() / TEMPERATURE
        log_probs = torch.log_softmax(logits, dim=-1).gather(-1, chosen[..., None]).squeeze(-1)
    return Output([chosen.shape[1]] * len(prompts), log_probs)


def timed(fn: Callable[[int], Output], seed: int) -> tuple[float, Output]:
    start = time.perf_counter()
    output = fn(seed)
    return time.perf_counter() - start, output


def check(case: Case, output: Output, side: str) -> None:
    """Every request generated exactly the requested tokens, each with a log-prob <= 0."""
    if output.token_counts != [case.new_tokens] * case.prompts:
        raise RuntimeError(f"{side}: generated {sorted(set(output.token_counts))} tokens, not {case.new_tokens}")
    if tuple(output.log_probs.shape) != (case.prompts, case.new_tokens) or bool((output.log_probs > 0).any()):
        raise RuntimeError(f"{side}: log-probs of shape {tuple(output.log_probs.shape)} or above 0")


def measure(case: Case, engine: TorchRolloutEngine, hf_model: Any, reps: int, warmup: bool = True) -> tuple[Output, Output]:
    """Time ``reps`` interleaved runs of each side (after one warm-up of each); the last outputs."""
    prompts = demo_prompts(engine.tokenizer, case.prompts)
    pad_id = engine.pad_token_id
    hf_run = lambda seed: run_hf(hf_model, prompts, case.new_tokens, seed, pad_id)  # noqa: E731
    engine_run = lambda seed: run_engine(engine, prompts, case.new_tokens, seed)  # noqa: E731
    if warmup:
        check(case, hf_run(0), "transformers")
        check(case, engine_run(0), "built-in")
    hf_out = engine_out = None
    for rep in range(reps):
        for side in ("hf", "engine") if rep % 2 == 0 else ("engine", "hf"):  # either side first, in turns
            if side == "hf":
                seconds, hf_out = timed(hf_run, rep + 1)
                case.hf_seconds.append(seconds)
                check(case, hf_out, "transformers")
            else:
                seconds, engine_out = timed(engine_run, rep + 1)
                case.engine_seconds.append(seconds)
                check(case, engine_out, "built-in")
    assert hf_out is not None and engine_out is not None
    return hf_out, engine_out


def format_table(cases: list[Case]) -> str:
    lines = [
        "| prompts x new tokens | transformers tokens/s | built-in tokens/s | built-in / transformers "
        "| per pair: median (range) |",
        "|---|---|---|---|---|",
    ]
    for c in cases:
        hf, engine = c.tokens_per_second(c.hf_seconds), c.tokens_per_second(c.engine_seconds)
        pairs = c.pair_ratios()
        paired = f"{statistics.median(pairs):.2f}x ({min(pairs):.2f}-{max(pairs):.2f})" if pairs else "-"
        lines.append(f"| {c.prompts:,} x {c.new_tokens} | {hf:,.0f} | {engine:,.0f} | {engine / hf:.2f}x | {paired} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(DEFAULT_MODEL), help="HF policy directory")
    parser.add_argument("--case", action="append", help="PROMPTSxTOKENS (repeatable; default 1024x4 and 256x32)")
    parser.add_argument("--reps", type=int, default=5, help="timed runs of each side per case")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads for both sides")
    parser.add_argument(
        "--heap",
        choices=("kept", "default"),
        default="kept",
        help="kept: the process keeps freed memory as a rollout worker's does (host_memory); default: glibc's own",
    )
    parser.add_argument(
        "--gc",
        choices=("frozen", "default"),
        default="frozen",
        help="frozen: once both models are built, the process's objects leave the collector's full passes, as a "
        "rollout worker's do (host_memory.freeze_built_objects); default: Python's own",
    )
    args = parser.parse_args(argv)
    if args.heap == "kept":
        keep_freed_memory()
    torch.set_num_threads(args.threads)
    cases = [parse_case(c) for c in args.case or DEFAULT_CASES]
    engine = TorchRolloutEngine(args.model, max_batch_size=max(c.prompts for c in cases))
    hf_model = load_hf(Path(args.model))
    if args.gc == "frozen":
        freeze_built_objects()
    for case in cases:
        measure(case, engine, hf_model, args.reps)
    print(
        f"{args.model}: medians of {args.reps} interleaved runs per side; {args.threads} torch threads; "
        f"{args.heap} heap; {args.gc} objects"
    )
    print(format_table(cases))


if __name__ == "__main__":
    main()
