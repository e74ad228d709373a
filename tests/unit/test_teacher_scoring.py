"""The teacher's scores of trajectories (R-4.10): what it writes per response token, when a
trajectory is scored again, what it cannot score, and the tokenizer it must share."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from rl_train.algorithms.teacher_fields import TEACHER_LOG_PROBS, TEACHER_TOPK_IDS, TEACHER_TOPK_LOG_PROBS
from rl_train.engines.model.loading import load_policy
from rl_train.engines.model.tokenizer import load_tokenizer
from rl_train.engines.teacher.same_tokenizer import (
    TokenizerMismatchError,
    check_same_tokenizer,
    tokenizer_difference,
)
from rl_train.engines.teacher.scoring import TEACHER_SCORED_VERSIONS, needs_scoring, score_records
from rl_train.engines.training.token_outputs import token_log_probs


@pytest.fixture(scope="module")
def teacher(tiny_model_dir: Path) -> tuple[Any, Any]:
    model, tokenizer = load_policy(tiny_model_dir)
    return model.eval(), tokenizer


def _records(tokenizer: Any) -> list[dict[str, Any]]:
    texts = [("3+4=", "7"), ("12+9=", "21"), ("5+5=", "10"), ("0+0=", "0")]
    out = []
    for version, (prompt, answer) in enumerate(texts):
        response = tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]
        out.append(
            {
                "prompt_ids": tokenizer.encode(prompt, add_special_tokens=False),
                "response_ids": response,
                "token_versions": [version] * len(response),
            }
        )
    return out


def _score(model: Any, records: list[dict[str, Any]], **options: Any) -> list[dict[str, Any]]:
    settings = {"pad_id": 0, "temperature": 1.0, "top_k": 0, "max_positions": 256, "micro_batch_size": 64}
    settings.update(options)
    return score_records(model, records, **settings)


def _alone(model: Any, record: dict[str, Any], temperature: float = 1.0) -> torch.Tensor:
    """The student's own per-token log-probs of the record's response, computed unpadded."""
    ids = torch.tensor([record["prompt_ids"] + record["response_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=None, position_ids=torch.arange(ids.shape[1])[None]).logits
    start = len(record["prompt_ids"])
    return token_log_probs(logits, ids, temperature)[0, start:]


def test_each_response_token_gets_the_teachers_log_prob_of_it_as_the_trainer_lays_them_out(teacher: Any) -> None:
    model, tokenizer = teacher
    records = _records(tokenizer)
    for temperature in (1.0, 0.7):
        scored = _score(model, records, temperature=temperature, micro_batch_size=3)  # padding in a batch of 3
        for record, fields in zip(records, scored, strict=True):
            expected = _alone(model, record, temperature)
            assert len(fields[TEACHER_LOG_PROBS]) == len(record["response_ids"])
            torch.testing.assert_close(torch.tensor(fields[TEACHER_LOG_PROBS]), expected, atol=1e-5, rtol=0)
            assert fields[TEACHER_SCORED_VERSIONS] == record["token_versions"]
            assert TEACHER_TOPK_IDS not in fields


def test_top_k_holds_the_k_most_likely_next_tokens_and_their_log_probs(teacher: Any) -> None:
    model, tokenizer = teacher
    records = _records(tokenizer)
    scored = _score(model, records, top_k=5)
    for record, fields in zip(records, scored, strict=True):
        ids = torch.tensor([record["prompt_ids"] + record["response_ids"]])
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=None, position_ids=torch.arange(ids.shape[1])[None]).logits
        start = len(record["prompt_ids"])
        full = torch.log_softmax(logits[0, start - 1 : -1].float(), dim=-1)  # row t predicts response token t
        top_ids = torch.tensor(fields[TEACHER_TOPK_IDS])
        top_lp = torch.tensor(fields[TEACHER_TOPK_LOG_PROBS])
        assert top_ids.shape == (len(record["response_ids"]), 5)
        torch.testing.assert_close(top_lp, full.gather(-1, top_ids), atol=1e-5, rtol=0)
        assert bool((top_lp[:, :-1] >= top_lp[:, 1:]).all()), "sorted, most likely first"
        torch.testing.assert_close(top_lp[:, 0], full.max(-1).values, atol=1e-5, rtol=0)
        sampled = torch.tensor(fields[TEACHER_LOG_PROBS])
        assert bool((top_lp[:, 0] >= sampled - 1e-6).all())


def test_a_trajectory_the_teacher_cannot_read_is_infra_with_zeros_and_the_others_are_scored(teacher: Any) -> None:
    model, tokenizer = teacher
    records = _records(tokenizer)
    too_long = {**records[1], "prompt_ids": records[1]["prompt_ids"] * 10}
    empty_prompt = {**records[2], "prompt_ids": []}
    scored = _score(model, [records[0], too_long, empty_prompt, records[3]], top_k=3, max_positions=20)
    assert not scored[0].get("is_infra") and not scored[3].get("is_infra")
    for fields, record, why in ((scored[1], too_long, "positions"), (scored[2], empty_prompt, "empty prompt")):
        assert fields["is_infra"] is True and why in fields["infra_reason"], fields
        assert fields["infra_reason"].startswith("teacher: ")
        assert fields[TEACHER_LOG_PROBS] == [0.0] * len(record["response_ids"])
        assert fields[TEACHER_TOPK_IDS] == [[0, 0, 0]] * len(record["response_ids"])
    torch.testing.assert_close(torch.tensor(scored[3][TEACHER_LOG_PROBS]), _alone(model, records[3]), atol=1e-5, rtol=0)


class _Refuses:
    """A model whose pass fails on any batch holding ``token``."""

    def __init__(self, model: Any, token: int) -> None:
        self.model, self.token = model, token

    def __call__(self, **inputs: Any) -> Any:
        if bool((inputs["input_ids"] == self.token).any()):
            raise RuntimeError("out of memory (simulated)")
        return self.model(**inputs)


def test_a_failed_pass_is_retried_one_trajectory_at_a_time_and_only_the_failing_one_is_infra(teacher: Any) -> None:
    model, tokenizer = teacher
    records = _records(tokenizer)
    bad = tokenizer.encode("9", add_special_tokens=False)[0]  # only "12+9=" holds it
    scored = _score(_Refuses(model, bad), records)
    assert [bool(f.get("is_infra")) for f in scored] == [False, True, False, False]
    assert "out of memory" in scored[1]["infra_reason"]
    torch.testing.assert_close(torch.tensor(scored[0][TEACHER_LOG_PROBS]), _alone(model, records[0]), atol=1e-5, rtol=0)


def test_a_trajectory_is_scored_again_when_its_tokens_are_not_the_ones_scored() -> None:
    record = {"prompt_ids": [1, 2], "response_ids": [3, 4], "token_versions": [0, 0]}
    assert needs_scoring(record, top_k=0)
    scored = {**record, TEACHER_LOG_PROBS: [-1.0, -2.0], TEACHER_SCORED_VERSIONS: [0, 0]}
    assert not needs_scoring(scored, top_k=0)
    assert needs_scoring(scored, top_k=4), "the loss reads top-k that were never written"
    # a partial rollout resumed by version 1: the prefix's scores do not stand for the new tokens
    resumed = {**scored, "response_ids": [3, 4, 5], "token_versions": [0, 0, 1]}
    assert needs_scoring(resumed, top_k=0)
    # the same length, another version's tokens (regenerated in place)
    assert needs_scoring({**scored, "token_versions": [1, 1]}, top_k=0)


def _swapped_tokenizer_copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    spec = json.loads((target / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab["1"], vocab["2"] = vocab["2"], vocab["1"]
    (target / "tokenizer.json").write_text(json.dumps(spec))
    return target


def test_the_teachers_tokenizer_must_be_the_students(tiny_model_dir: Path, tmp_path: Path) -> None:
    student = load_tokenizer(tiny_model_dir)
    assert tokenizer_difference(load_tokenizer(tiny_model_dir), student) is None
    check_same_tokenizer(load_tokenizer(tiny_model_dir), student, "teacher", "student")
    other = _swapped_tokenizer_copy(tiny_model_dir, tmp_path / "other")
    with pytest.raises(TokenizerMismatchError) as error:
        check_same_tokenizer(load_tokenizer(other), student, str(other), str(tiny_model_dir))
    message = str(error.value)
    assert message.startswith("teacher.path:") and str(other) in message and str(tiny_model_dir) in message
    assert "2 of" in message and "'1'" in message
