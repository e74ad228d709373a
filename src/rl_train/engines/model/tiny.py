"""``rl-train init-model``: the built-in tiny policy, written in HF format.

A Qwen2-architecture causal LM of about 0.2M parameters with the character tokenizer. It is
"pretrained" for a few seconds on arithmetic-shaped text in which the written answer is
right only ``prior_correct`` of the time (random digits otherwise): like a weak base model,
it knows the *format* (digits, then end-of-sequence) and has a faint prior for the sums, so
sampling starts far below 0.2 reward and RL has to sharpen that prior into the skill. From
a fully random prior (``prior_correct=0``) a 0.2M model learns 100 sums far too slowly for a
CPU demo, for the same reason RL on real LLMs amplifies what the base model half-knows.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
from transformers import PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from rl_train.engines.model.tokenizer import build_char_tokenizer
from rl_train.storage.builtin_data import TINY_FUNCTION_CONSTANTS, TINY_FUNCTION_OPS, tiny_function_prompt


def tiny_qwen2_config(
    vocab_size: int, pad_token_id: int, bos_token_id: int, eos_token_id: int
) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
    )  # rope theta: the default, 10000 (transformers 4 names it rope_theta, 5 rope_parameters)


def format_corpus(num_samples: int, seed: int, prior_correct: float = 0.0) -> list[str]:
    """Arithmetic-shaped lines; the answer is right with probability ``prior_correct``."""
    rng = random.Random(seed)
    lines = []
    for _ in range(num_samples):
        if rng.random() < 0.5:
            a, b, answer = rng.randint(0, 9), rng.randint(0, 9), rng.randint(0, 18)
        else:
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            answer = rng.randint(0, 198)
        if rng.random() < prior_correct:
            answer = a + b
        lines.append(f"{a}+{b}={answer}")
    return lines


TOOL_CALL_TEMPLATE = '<tool_call>{{"name":"calculator","arguments":{{"expression":"{expression}"}}}}</tool_call>'


TOOL_ANSWER_COPIED = 0.9
"""How often the tool corpus's final answer copies the tool's: the policy learns to read the
tool (a tiny model learns a weaker copy rule poorly), and RL has the call's numbers to learn."""


def tool_corpus(num_samples: int, seed: int, prior_correct: float = 0.0) -> list[str]:
    """Lines in the tool loop's layout for three-digit sums: the prompt, a calculator call and
    end of turn, the tool's answer, the final answer and end of turn. The call adds the
    prompt's operands with probability ``prior_correct`` (other three-digit numbers
    otherwise), and the final answer copies the tool's ``TOOL_ANSWER_COPIED`` of the time (a
    random number otherwise): the policy knows the format and how to read the tool, and RL
    has to teach it to call with the prompt's numbers."""
    rng = random.Random(seed)
    lines = []
    for _ in range(num_samples):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        x, y = (a, b) if rng.random() < prior_correct else (rng.randint(100, 999), rng.randint(100, 999))
        answer = x + y if rng.random() < TOOL_ANSWER_COPIED else rng.randint(200, 1998)
        call = TOOL_CALL_TEMPLATE.format(expression=f"{x}+{y}")
        lines.append(f"{a}+{b}={call}</s><tool_response>{x + y}</tool_response>{answer}")
    return lines


def function_corpus(num_samples: int, seed: int, prior_correct: float = 0.0) -> list[str]:
    """``tiny_function``'s prompts, each followed by a body ``x<op><digit>``: the prompt's own
    function with probability ``prior_correct``, a random operator and digit otherwise. The
    policy learns to write a body and stop; RL has to learn which one."""
    rng = random.Random(seed)
    ops = list(TINY_FUNCTION_OPS)
    lines = []
    for _ in range(num_samples):
        op, constant = rng.choice(ops), rng.choice(TINY_FUNCTION_CONSTANTS)
        body = f"x{op}{constant}" if rng.random() < prior_correct else f"x{rng.choice(ops)}{rng.randint(0, 9)}"
        lines.append(tiny_function_prompt(op, constant) + body)
    return lines


CORPORA = {"arith": format_corpus, "tool_sum": tool_corpus, "tiny_function": function_corpus}
"""``model.pretrain_task``: the format the built-in policy learns before RL."""


def pretrain_format(
    model: PreTrainedModel,
    tokenizer,
    steps: int,
    seed: int,
    prior_correct: float,
    batch_size: int = 128,
    corpus_name: str = "arith",
) -> float:
    """Teach the output format with plain next-token prediction; returns the final loss."""
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    corpus = CORPORA[corpus_name](steps * batch_size, seed, prior_correct)
    model.train()
    loss_value = float("nan")
    for step in range(steps):
        lines = corpus[step * batch_size : (step + 1) * batch_size]
        encoded = [
            [
                tokenizer.bos_token_id,
                *tokenizer.encode(line, add_special_tokens=False),
                tokenizer.eos_token_id,
            ]
            for line in lines
        ]
        width = max(len(ids) for ids in encoded)
        input_ids = torch.full((len(encoded), width), tokenizer.pad_token_id)
        attention = torch.zeros((len(encoded), width), dtype=torch.long)
        for i, ids in enumerate(encoded):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            attention[i, : len(ids)] = 1
        labels = input_ids.masked_fill(attention == 0, -100)
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss_value = float(loss.detach())
    model.eval()
    return loss_value


def create_tiny_policy(
    out_dir: str | Path,
    seed: int = 0,
    pretrain_steps: int = 300,
    prior_correct: float = 0.1,
    pretrain_task: str = "arith",
) -> Path:
    """Write the tiny policy (config.json, model.safetensors, tokenizer.json) to ``out_dir``."""
    out = Path(out_dir)
    tokenizer = build_char_tokenizer()
    torch.manual_seed(seed)
    config = tiny_qwen2_config(
        len(tokenizer), tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id
    )
    model = Qwen2ForCausalLM(config)
    if pretrain_steps > 0:
        pretrain_format(model, tokenizer, pretrain_steps, seed, prior_correct, corpus_name=pretrain_task)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
