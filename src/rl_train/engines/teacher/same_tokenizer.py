"""The teacher's tokenizer must be the student's: distillation compares the two models' log-probs
token by token, so one id must mean one string to both."""

from __future__ import annotations

from typing import Any

SPECIAL_ROLES = ("bos", "eos", "pad", "unk")


class TokenizerMismatchError(ValueError):
    """The teacher's tokenizer differs from the student's (named by config path)."""


def vocab_of(tokenizer: Any) -> dict[str, int]:
    """Token -> id, added tokens included, of a transformers or a light tokenizer."""
    backend = getattr(tokenizer, "backend", None)
    if backend is not None and hasattr(backend, "get_vocab"):
        return dict(backend.get_vocab(with_added_tokens=True))
    return dict(tokenizer.get_vocab())


def tokenizer_difference(teacher: Any, student: Any) -> str | None:
    """How the two tokenizers differ, in a few words (None: they are the same)."""
    mine, theirs = vocab_of(teacher), vocab_of(student)
    if len(mine) != len(theirs):
        return f"{len(mine)} tokens against the student's {len(theirs)}"
    moved = sorted(token for token, index in mine.items() if theirs.get(token) != index)
    if moved:
        shown = ", ".join(repr(t) for t in moved[:5]) + (" ..." if len(moved) > 5 else "")
        return f"{len(moved)} of {len(mine)} tokens have other ids or are not the student's ({shown})"
    for role in SPECIAL_ROLES:
        a, b = getattr(teacher, f"{role}_token_id", None), getattr(student, f"{role}_token_id", None)
        if a != b:
            return f"its {role} token id is {a}, the student's {b}"
    return None


def check_same_tokenizer(teacher: Any, student: Any, teacher_path: str, student_path: str) -> None:
    """Raise ``TokenizerMismatchError`` unless the teacher's tokenizer is the student's."""
    difference = tokenizer_difference(teacher, student)
    if difference is not None:
        raise TokenizerMismatchError(
            f"teacher.path: the tokenizer of {teacher_path!r} is not the student's (model.path {student_path!r}): "
            f"{difference}; distillation compares log-probs token by token and needs one tokenizer"
        )
