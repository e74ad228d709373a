"""``rl-train init-reward-model``: the built-in tiny discriminative reward model, in HF format.

A Qwen2-architecture sequence classifier (one output, random init, about 0.1M parameters) is
trained for about a minute of one CPU thread to tell a built-in task's right answers from wrong
ones (``tiny_rm_data.py``), near misses included: each step ranks a prompt's right answer above
its nearest wrong sums, so it learns the table, not only what answers look like (on
single_digit_sum it ranks every near miss below the right answer, which is what lets a policy
train on it alone: ``tests/slow/test_rm_learns.py``). It has a tokenizer of its own, unlike the
policy's character one: a byte-level BPE with its own merges, its own special tokens and its own
chat template, which writes the BOS itself. So the policy's ids mean nothing to it and every
trajectory is decoded, re-templated and re-encoded on the way (R-6.3), BOS and tool markup
included, for real.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForSequenceClassification

from rl_train.engines.reward.reward_model import load_rm_tokenizer
from rl_train.engines.reward.tiny_rm_data import (
    Example,
    candidate_group,
    draw_examples,
    largest_answer,
    task_prompts,
)

TOKENIZER_CORPUS, HELD_OUT = 4000, 1000
"""Examples the tokenizer's merges are learnt from; held-out examples the accuracy is measured on."""
GROUP = 16
"""Answers per prompt in a training step: the right one and fifteen wrong ones, most of them near misses."""
STEPS, BATCH_SIZE = 400, 512
"""32 prompts a step (a third of single_digit_sum's 100). Large batches learn the table in fewer
examples than small ones: 400 steps of 512 rank near misses right 1.000 of the time (seed 0;
0.941 with seed 1) in about a minute of one thread, where 4,000 steps of 32 (2 prompts) reached
0.715, 1,000 of 256 0.976 and 200 of 1,024 0.980. Wider (96) or deeper (3 layers) did worse."""
LR, BETAS, GRAD_CLIP = 3e-3, (0.9, 0.98), 1.0
"""The loss sits on a plateau (answers that look right) and then drops once the model starts to
add; a shorter memory of the gradient's scale and a clipped norm get there sooner (600 steps of
256: 0.946 against 0.903 without them); lr 5e-3 did worse, 1e-2 stayed at chance."""

MAX_RANKED_PROMPTS = 200
"""Prompts the near-miss ranking is measured on (all of single_digit_sum's 100)."""

BOS, PAD, END = "<|bos|>", "<|pad|>", "<|end|>"
ROLES = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>")
CHAT_TEMPLATE = "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
"""The reward model's own template: the BOS first, then each message between its role's token and
<|end|> (no newlines: a different layout from the policy's, on purpose)."""

TOOL_LINES = (
    '<tool_call>{"name":"calculator","arguments":{"expression":"12+34"}}</tool_call>',
    "<user>what is it?</user>",
)
"""Tool-format text the tokenizer's merges are learnt from too (tool trajectories use them)."""


@dataclass(frozen=True)
class TrainingReport:
    out: Path
    seconds: float
    held_out_accuracy: float
    """Examples drawn apart from the training ones whose logit has their label's sign."""
    near_miss_ranking: float
    """Of every prompt's near misses (its sum off by 1-3), the fraction scored below its right answer."""
    num_parameters: int


def build_rm_tokenizer(corpus: Sequence[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """A byte-level BPE learnt on ``corpus``, each digit and punctuation mark a token of its own
    (merges that glue "3+" or "=7" into one piece hide the digits the model must add up, and
    numbers it never saw then read like those it did), with the template's special tokens and
    a post-processor that adds the BOS (the trap a template with its own BOS must not fall into
    twice)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Punctuation("isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    core.decoder = decoders.ByteLevel()
    specials = [PAD, BOS, END, *ROLES]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(list(corpus), trainer=trainer)
    # as saved: a freshly trained BPE encodes the words it was trained on from its training cache,
    # which can split them otherwise than its merges do once it is read back from tokenizer.json
    core = Tokenizer.from_str(core.to_str())
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, core.token_to_id(BOS))]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=END,
        pad_token=PAD,
        additional_special_tokens=list(ROLES),
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_rm_config(
    tokenizer: PreTrainedTokenizerFast, hidden_size: int = 64, num_layers: int = 2
) -> Qwen2Config:
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    config.num_labels = 1  # one logit: the reward
    return config


def render(tokenizer: PreTrainedTokenizerFast, example: Example) -> str:
    messages = [
        {"role": "user", "content": example.prompt},
        {"role": "assistant", "content": example.response},
    ]
    return str(tokenizer.apply_chat_template(messages, tokenize=False))


def batch_tensors(rows: Sequence[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and their attention mask."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask


def accuracy(
    model: Qwen2ForSequenceClassification, rows: list[list[int]], labels: list[int], pad: int
) -> float:
    """The fraction of examples whose logit has the label's sign."""
    model.eval()
    right = 0
    with torch.no_grad():
        for start in range(0, len(rows), 256):
            ids, mask = batch_tensors(rows[start : start + 256], pad)
            logits = model(input_ids=ids, attention_mask=mask).logits[:, 0]
            right += sum(
                int((v > 0) == bool(y))
                for v, y in zip(logits.tolist(), labels[start : start + 256], strict=True)
            )
    model.train()
    return right / max(len(rows), 1)


def near_miss_ranking(
    model: Qwen2ForSequenceClassification,
    tokenizer: PreTrainedTokenizerFast,
    prompts: Sequence[tuple[str, int]],
) -> float:
    """The fraction of near misses scored below the right answer to their prompt: only a model
    that knows the sums ranks them right (a model of what answers look like cannot)."""
    above = total = 0
    model.eval()
    with torch.no_grad():
        for prompt, answer in prompts:
            candidates = [str(answer)] + [str(answer + d) for d in (-3, -2, -1, 1, 2, 3) if answer + d >= 0]
            rows = [
                tokenizer.encode(render(tokenizer, Example(prompt, c, 0)), add_special_tokens=False)
                for c in candidates
            ]
            ids, mask = batch_tensors(rows, tokenizer.pad_token_id)
            logits = model(input_ids=ids, attention_mask=mask).logits[:, 0].tolist()
            above += sum(logits[0] > v for v in logits[1:])
            total += len(logits) - 1
    return above / max(total, 1)


def train_tiny_rm(
    out_dir: str | Path,
    task: str = "single_digit_sum",
    seed: int = 0,
    steps: int = STEPS,
    batch_size: int = BATCH_SIZE,
    progress: Callable[[str], None] = print,
) -> TrainingReport:
    """Train the tiny reward model on ``task`` and write it to ``out_dir`` (which must not hold
    anything yet: a user's directory is never overwritten). Deterministic by ``seed``."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(
            f"{out} exists and is not empty; init-reward-model never overwrites (choose another --out)"
        )
    began = time.perf_counter()
    corpus = [f"{e.prompt} {e.response}" for e in draw_examples(task, seed, TOKENIZER_CORPUS)] + list(
        TOOL_LINES
    )
    # written to a staging folder beside out first, and trained on as read back from there: the
    # model learns the ids a reward worker will give it (a BPE fresh from training, or read back
    # once, can split words otherwise); the folder becomes out only when all of it is written
    staging = Path(
        tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent if out.parent.exists() else None)
    )
    build_rm_tokenizer(corpus).save_pretrained(staging)
    tokenizer = load_rm_tokenizer(staging)
    torch.manual_seed(seed)
    model = Qwen2ForSequenceClassification(tiny_rm_config(tokenizer))
    progress(
        f"training the tiny reward model on {task}: {steps} steps of {batch_size} answers ({GROUP} per prompt)"
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small runs 5-10x slower on cores that other work shares
    try:
        seen = _fit(model, tokenizer, task_prompts(task, seed), steps, batch_size, seed, progress)
        held = draw_examples(task, seed, HELD_OUT, unseen=seen)
        rows = [tokenizer.encode(render(tokenizer, e), add_special_tokens=False) for e in held]
        held_out = accuracy(model, rows, [e.label for e in held], tokenizer.pad_token_id)
        ranking = near_miss_ranking(model, tokenizer, task_prompts(task, seed)[:MAX_RANKED_PROMPTS])
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(staging, safe_serialization=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        out.rmdir()  # empty (checked above)
    shutil.move(str(staging), str(out))
    seconds = time.perf_counter() - began
    progress(
        f"held-out accuracy {held_out:.3f} on {len(held)} examples, near misses ranked below the right answer "
        f"{ranking:.3f} ({seconds:.1f} s); written to {out}"
    )
    return TrainingReport(out, seconds, held_out, ranking, sum(p.numel() for p in model.parameters()))


def _fit(
    model: Any, tokenizer: PreTrainedTokenizerFast, prompts: list[tuple[str, int]], steps: int, batch_size: int,
    seed: int, progress: Callable[[str], None],
) -> set[tuple[str, str]]:  # fmt: skip
    """Each step: ``batch_size // GROUP`` prompts, each with its right answer and ``GROUP - 1``
    wrong ones. The loss is the group's cross-entropy (the right answer's logit above every
    wrong one's: the preference objective reward models are trained with, which a model of
    what answers look like cannot lower) plus binary cross-entropy on each logit (its sign
    says right or wrong, so that a sigmoid of it reads as a probability). Returns the
    (prompt, answer) pairs it saw."""
    rng = random.Random(seed)
    largest = largest_answer(prompts)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=0.01)
    warmup = max(steps // 20, 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) * (1.0 - step / steps)
    )
    groups_per_step = max(batch_size // GROUP, 1)
    encoded: dict[Example, list[int]] = {}
    model.train()
    for step in range(steps):
        examples = [
            e
            for p, a in rng.sample(prompts, min(groups_per_step, len(prompts)))
            for e in candidate_group(p, a, GROUP, rng, largest)
        ]
        rows = [
            encoded.setdefault(e, tokenizer.encode(render(tokenizer, e), add_special_tokens=False))
            for e in examples
        ]
        ids, mask = batch_tensors(rows, tokenizer.pad_token_id)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, 0]
        ranked = logits.view(-1, GROUP)
        labels = torch.tensor([float(e.label) for e in examples])
        loss = torch.nn.functional.cross_entropy(ranked, torch.zeros(len(ranked), dtype=torch.long))
        loss = loss + torch.nn.functional.binary_cross_entropy_with_logits(
            logits, labels, pos_weight=torch.tensor(GROUP - 1.0)
        )
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        schedule.step()
        if (step + 1) % max(steps // 5, 1) == 0:
            progress(f"  step {step + 1}/{steps}: loss {float(loss.detach()):.3f}")
    model.eval()
    return {(e.prompt, e.response) for e in encoded}
