"""The examples the built-in tiny reward model learns from: a built-in task's prompts with right
answers (label 1) and wrong ones (label 0), of the kinds a policy writes.

A wrong answer is a near miss (the sum off by 1-3), another number of the policy's range, the
right number with a digit added or dropped, a few non-numeric characters, or nothing. The
held-out split is drawn apart: none of its (prompt, answer) pairs is in the training split,
except that a right answer is the one answer to its prompt, so the held-out right answers
are the task's facts the model was taught (single_digit_sum has 100 prompts; the reward model
is for scoring them), while its wrong answers are all ones it never saw for that prompt.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

RM_TASKS = ("single_digit_sum", "multi_digit_sum")
"""Built-in tasks whose answers are sums the tiny reward model can learn to check."""

JUNK = "abcxyz+-=*?. "
"""Characters of non-numeric answers (the policy's alphabet has them all)."""

NEAR_MISSES = 0.55
"""The share of wrong answers that are near misses: the hard ones, which only knowing the sum tells apart."""


@dataclass(frozen=True)
class Example:
    prompt: str
    response: str
    label: int
    """1: the right answer; 0: a wrong one."""


def wrong_answer(answer: int, rng: random.Random, largest: int) -> str:
    """One wrong answer to a sum whose answer is ``answer`` (see the module docstring)."""
    kind = rng.random()
    if kind < NEAR_MISSES:
        guess = answer + rng.choice((-3, -2, -1, 1, 2, 3))
        return str(guess) if guess >= 0 else str(answer + 1)
    if kind < NEAR_MISSES + 0.2:
        guess = rng.randint(0, largest)
        return str(guess if guess != answer else guess + 1)
    if kind < NEAR_MISSES + 0.3:
        text = str(answer)
        if len(text) > 1 and rng.random() < 0.5:
            cut = rng.randrange(len(text))
            return text[:cut] + text[cut + 1 :]
        at = rng.randrange(len(text) + 1)
        return text[:at] + str(rng.randint(0, 9)) + text[at:]  # "07" too: the rule wants "7"
    if kind < NEAR_MISSES + 0.37:
        return "".join(rng.choice(JUNK) for _ in range(rng.randint(1, 3)))
    return ""


def task_prompts(task: str, seed: int) -> list[tuple[str, int]]:
    """The distinct (prompt, answer) pairs of the built-in ``task``'s training split."""
    from rl_train.storage.builtin_data import BUILTIN_TASKS

    if task not in RM_TASKS:
        raise ValueError(f"got task {task!r}: the built-in reward model learns one of {', '.join(RM_TASKS)}")
    train, _ = BUILTIN_TASKS.get(task)(seed=seed)
    return sorted({(row["prompt"], int(row["ground_truth"])) for row in train})


def draw_examples(
    task: str, seed: int, count: int, unseen: set[tuple[str, str]] | None = None
) -> list[Example]:
    """``count`` examples, half right answers, drawn by ``seed``; with ``unseen``, wrong answers
    whose (prompt, answer) pair is in it are drawn again (a held-out split)."""
    prompts = task_prompts(task, seed)
    largest = largest_answer(prompts)
    rng = random.Random(seed if unseen is None else seed + 1_000_003)
    drawn: list[Example] = []
    while len(drawn) < count:
        prompt, answer = rng.choice(prompts)
        if rng.random() < 0.5:
            drawn.append(Example(prompt, str(answer), 1))
            continue
        wrong = wrong_answer(answer, rng, largest)
        if unseen is None or (prompt, wrong) not in unseen:
            drawn.append(Example(prompt, wrong, 0))
    return drawn


def candidate_group(prompt: str, answer: int, size: int, rng: random.Random, largest: int) -> list[Example]:
    """The right answer to ``prompt`` first, then ``size - 1`` distinct wrong ones: a group the
    model learns to rank (the right answer above every wrong one) and to classify. All but two
    of the wrong ones are the sums nearest the right one (off by 1-9, the nearest most often):
    ranked against them, only knowing the sum lowers the loss; the other two are of the kinds
    ``wrong_answer`` draws (what wrong answers look like is the easy part)."""
    near = [answer + d for d in range(-9, 10) if d and answer + d >= 0]
    near.sort(key=lambda n: abs(n - answer) + 4 * rng.random())
    wrong = [str(n) for n in near[: size - 3]]
    while len(wrong) < size - 1:
        guess = wrong_answer(answer, rng, largest)
        if guess not in wrong and guess != str(answer):
            wrong.append(guess)
    return [Example(prompt, str(answer), 1)] + [Example(prompt, w, 0) for w in wrong]


def largest_answer(prompts: list[tuple[str, int]]) -> int:
    """The largest wrong number drawn: the policy's pretraining writes up to 198."""
    return max(198, 2 * max(answer for _, answer in prompts))
