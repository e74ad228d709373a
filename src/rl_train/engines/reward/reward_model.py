"""A discriminative reward model (R-6.1, R-6.3): an HF sequence classifier scores prompt and
response in one forward pass.

Each trajectory is re-templated and re-encoded with the reward model's own tokenizer
(``chat_encoding.py``), the batch is right-padded (the classifier reads its last real token;
causal attention never sees the padding to its right, so a batch scores as its members would
one by one) and run under ``torch.no_grad`` on the configured device, ``batch_size`` at a
time. The logit is logged as the sub-score ``rm_logit`` and normalised into the score as the
config says; a ``log_rule`` reward's score is logged beside it as ``rule``.

A batch the model cannot run (out of memory, an input it refuses) is a grader failure: its
trajectories get ``RewardResult.infra`` with the error, never a made-up 0, and are scored again
by the router. A trajectory the template cannot render is infra on its own.

Sleep and wake (R-6.8), the engines' contract: ``sleep`` drops the model (the weights are
frozen, so nothing is lost: ``wake_up`` loads them again from the directory, from the page
cache after the first time) and frees the device's cache; the tokenizer stays. Scoring while
asleep raises ``EngineStateError``: whoever put the model to sleep (the reward pool, to lend
its memory to a colocated rollout) wakes it before scoring, and a model loaded silently into
memory lent to someone else would be the worse failure.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl_train.engines.reward.base import BatchReward, Reward, RewardResult, Trajectory, score_all
from rl_train.engines.reward.chat_encoding import ChatEncoder, EncodingError
from rl_train.engines.rollout.protocol import EngineStateError

if TYPE_CHECKING:
    from rl_train.engines.reward.model_config import RewardModelConfig

CLASSIFIER_SUFFIX = "ForSequenceClassification"


class RewardModelError(ValueError):
    """A reward model's directory cannot be loaded as one (named with its config path)."""


def check_model_dir(path: str | Path, where: str) -> None:
    """Raise ``RewardModelError`` unless ``path`` looks like an HF sequence classifier: it exists
    and its config.json names a ``...ForSequenceClassification`` architecture (transformers
    would otherwise load a causal LM with a fresh, random score head and say nothing)."""
    config = Path(path) / "config.json"
    if not Path(path).is_dir():
        raise RewardModelError(
            f"{where}.path: {str(path)!r} is not a directory (an HF sequence-classification model directory)"
        )
    if not config.is_file():
        raise RewardModelError(
            f"{where}.path: {str(path)!r} has no config.json; it is not an HF model directory"
        )
    try:
        architectures = json.loads(config.read_text()).get("architectures") or []
    except (json.JSONDecodeError, AttributeError) as error:
        raise RewardModelError(f"{where}.path: {config} is not a JSON object ({error})") from None
    if not any(str(a).endswith(CLASSIFIER_SUFFIX) for a in architectures):
        raise RewardModelError(
            f"{where}.path: {str(path)!r} holds {', '.join(map(str, architectures)) or 'no architectures'}; a reward "
            f"model is an AutoModelForSequenceClassification (an architecture ending in {CLASSIFIER_SUFFIX}), e.g. "
            "one made by `rl-train init-reward-model`"
        )


AS_WRITTEN = {"PreTrainedTokenizerFast", "TokenizersBackend"}
"""Tokenizer classes that mean "exactly tokenizer.json": transformers 5's ``AutoTokenizer``
would give a model whose config says ``qwen2`` Qwen2's own tokenizer class instead, which
splits text its own way (the built-in tiny reward model is a Qwen2 classifier)."""


def load_rm_tokenizer(path: str | Path) -> Any:
    """The reward model's tokenizer as its directory describes it, offline."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    settings = Path(path) / "tokenizer_config.json"
    declared = json.loads(settings.read_text()).get("tokenizer_class") if settings.is_file() else None
    loader = PreTrainedTokenizerFast if declared in AS_WRITTEN else AutoTokenizer
    return loader.from_pretrained(str(path), local_files_only=True)


class RewardModel:
    """A ``BatchReward`` over an HF sequence classifier (see the module docstring)."""

    def __init__(
        self, where: str, config: RewardModelConfig, rule: Reward | BatchReward | None = None
    ) -> None:
        """``where``: the config path that names it (``reward.models.<name>``), for errors."""
        check_model_dir(config.path, where)
        self.where, self.config, self.rule = where, config, rule
        self.device: str = config.device
        """Where the model scores (a ``ModelReward``: placed, and colocated put to sleep, by the worker)."""
        try:
            tokenizer = load_rm_tokenizer(config.path)
        except Exception as error:  # noqa: BLE001 - whatever loading raised, named with the path
            raise RewardModelError(
                f"{where}.path: its tokenizer does not load ({type(error).__name__}: {error})"
            ) from None
        try:
            self.encoder = ChatEncoder(tokenizer, config.max_length, config.chat_template, where)
        except ValueError as error:
            raise RewardModelError(str(error)) from None
        self.model: Any = None
        self.pad_token_id: int | None = None
        self.wake_up()

    @property
    def asleep(self) -> bool:
        return self.model is None

    def wake_up(self) -> None:
        """Load the model onto its device (nothing to do when awake)."""
        if self.model is not None:
            return
        import torch
        from transformers import AutoModelForSequenceClassification

        try:
            model = AutoModelForSequenceClassification.from_pretrained(
                self.config.path, local_files_only=True, dtype=getattr(torch, self.config.dtype)
            )
        except Exception as error:  # noqa: BLE001 - named with the path
            raise RewardModelError(
                f"{self.where}.path: the model does not load ({type(error).__name__}: {error})"
            ) from None
        if self.config.label_index >= model.config.num_labels:
            raise RewardModelError(
                f"{self.where}.label_index: got {self.config.label_index}; the model has {model.config.num_labels} output(s)"
            )
        text_config = model.config.get_text_config()
        if text_config.pad_token_id is None:  # the classifier finds each row's last token by the padding
            text_config.pad_token_id = self.encoder.tokenizer.pad_token_id
        self.pad_token_id = text_config.pad_token_id
        self.model = model.to(self.config.device).eval()

    def sleep(self) -> None:
        """Drop the model and free the device's cache until ``wake_up``."""
        if self.model is None:
            return
        self.model = None
        if self.config.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()

    def score_batch(self, trajectories: Sequence[Trajectory]) -> list[RewardResult]:
        """One result per trajectory, in order (``EngineStateError`` while asleep)."""
        if self.model is None:
            raise EngineStateError(f"{self.where} is asleep: wake_up() it before scoring (R-6.8)")
        results: list[RewardResult] = []
        size = self.config.batch_size if self.pad_token_id is not None else 1
        for start in range(0, len(trajectories), size):
            results += self._score_chunk(trajectories[start : start + size])
        if self.rule is not None:
            checks = score_all(self.rule, trajectories, f"{self.where}.log_rule")
            results = [_with_rule(r, c) for r, c in zip(results, checks, strict=True)]
        return results

    def _score_chunk(self, trajectories: Sequence[Trajectory]) -> list[RewardResult]:
        """One forward pass over the trajectories that encode; infra results for the rest."""
        encoded: dict[int, list[int]] = {}
        results: list[RewardResult | None] = [None] * len(trajectories)
        for i, trajectory in enumerate(trajectories):
            try:
                encoded[i] = self.encoder.encode(trajectory).ids
            except EncodingError as error:
                results[i] = RewardResult.infra(f"{self.where}: {error}")
        if encoded:
            try:
                logits = self.logits(list(encoded.values()))
            except (RuntimeError, ValueError, IndexError) as error:  # OOM is a RuntimeError too
                self._recover()
                reason = f"{self.where}: the model failed on a batch of {len(encoded)} ({type(error).__name__}: {error})"
                logits = None
            for n, i in enumerate(encoded):
                results[i] = RewardResult.infra(reason) if logits is None else self._result(logits[n])
        return [r for r in results if r is not None]

    def logits(self, rows: list[list[int]]) -> list[float]:
        """The classifier's logit (``label_index``) of each row of ids, in one forward pass."""
        import torch

        width = max(len(r) for r in rows)
        pad = self.pad_token_id if self.pad_token_id is not None else 0
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            attention[i, : len(row)] = 1
        device = self.config.device
        with torch.no_grad():
            output = self.model(input_ids=input_ids.to(device), attention_mask=attention.to(device))
        return [float(v) for v in output.logits[:, self.config.label_index].float().cpu()]

    def score_of(self, logit: float) -> float:
        """The score of a logit under the configured normalisation."""
        kind, scaled = self.config.normalise, self.config.scale * logit + self.config.shift
        if kind == "affine":
            return scaled
        if kind == "sigmoid":
            return 0.5 * (1.0 + math.tanh(0.5 * scaled))  # sigmoid, without overflow at large |x|
        return logit

    def _result(self, logit: float) -> RewardResult:
        if not math.isfinite(logit):
            return RewardResult.infra(f"{self.where}: the model's logit is {logit}")
        return RewardResult(self.score_of(logit), {"rm_logit": logit})

    def _recover(self) -> None:
        """After a failed forward: give back what the failed batch held on the device."""
        if self.config.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()


def _with_rule(result: RewardResult, check: RewardResult) -> RewardResult:
    """``result`` with the rule's score as the sub-score ``rule`` (where the rule gave one)."""
    if check.is_infra:
        return result
    return RewardResult(
        result.score, {**result.sub_scores, "rule": check.score}, result.is_infra, result.reason
    )
