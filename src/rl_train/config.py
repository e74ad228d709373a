"""The one typed config tree of a run, loaded from YAML with dotted command-line overrides.

Every section forbids unknown keys and documents each field (``rl-train config --show
--docs`` prints the docs). Errors name the dotted path, the offending value and what is
allowed, and are raised before anything starts.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from rl_train.algorithms.advantage import outcome_estimators
from rl_train.algorithms.config import AlgorithmConfig, StrictModel
from rl_train.algorithms.teacher_fields import TEACHER_TOPK_IDS, teacher_fields
from rl_train.engines.agent.config import AgentConfig
from rl_train.engines.agent.gateway_modes import GATEWAY_MODES
from rl_train.engines.reward.config import RewardConfig
from rl_train.engines.rollout.registry import RolloutEngineName
from rl_train.engines.rollout.sglang.config import SglangConfig, resolve_lora
from rl_train.engines.rollout.tool_env import ToolEnvConfig
from rl_train.engines.sandbox import SandboxConfig
from rl_train.engines.teacher.config import TeacherConfig
from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.critic_config import CriticConfig, check_critic_enable
from rl_train.engines.weight_sync.adapters import sends_adapters
from rl_train.engines.weight_sync.config import WeightSyncConfig
from rl_train.modes import MODES
from rl_train.storage.checkpoint_config import CheckpointConfig
from rl_train.storage.replay_config import ReplayConfig


class RunConfig(StrictModel):
    name: str = "arith-tiny"
    """Run name; the run directory is <output_dir>/<name>."""
    output_dir: str = "runs"
    """Where run directories (metrics.jsonl, resolved config) are written: a path or s3:// URI."""
    seed: int = 0
    """Seed of sampling, shuffling and model init."""
    overwrite: bool = False
    """Start over in a run directory that holds a previous run, removing its metrics and checkpoints; off, the run continues it (checkpoint.resume) or is refused."""


class ModelConfig(StrictModel):
    path: str = "models/tiny-qwen2"
    """HF-format policy directory (config.json + safetensors + tokenizer.json)."""
    create_if_missing: bool = True
    """Create the built-in tiny policy at `path` when the directory does not exist."""
    pretrain_steps: int = Field(300, ge=0)
    """Format-pretraining steps when the built-in policy is created."""
    pretrain_task: Literal["arith", "tool_sum", "tiny_function"] = "arith"
    """The format the built-in policy learns when created: arith (sums answered directly), tool_sum (sums through a calculator call, then the answer) or tiny_function (a function body after its prompt, for the code task)."""
    pretrain_prior_correct: float = Field(0.1, ge=0, le=1)
    """How often the built-in policy's pretraining text is right (its faint prior for the task)."""
    impl: Literal["auto", "native", "transformers"] = "auto"
    """The torch engines' model code: native (plain torch, for the dense Qwen2/Llama models it covers: starts and decodes faster), transformers (any model), or auto (native where it covers the model)."""


class DataConfig(StrictModel):
    builtin_task: str | None = "single_digit_sum"
    """Built-in task to generate into data_dir when the files are missing (None: use your files)."""
    data_dir: str = "data/single_digit_sum"
    """Directory of the built-in task's train.parquet / val.parquet."""
    train_files: list[str] = Field(default_factory=list)
    """Parquet/JSONL training files; empty means <data_dir>/train.parquet."""
    val_files: list[str] = Field(default_factory=list)
    """Parquet/JSONL validation files; empty means <data_dir>/val.parquet."""

    def resolved_train_files(self) -> list[str]:
        return self.train_files or [str(Path(self.data_dir) / "train.parquet")]

    def resolved_val_files(self) -> list[str]:
        return self.val_files or [str(Path(self.data_dir) / "val.parquet")]


class TrainerConfig(StrictModel):
    mode: str = "sync"
    """Trainer mode from the registry: sync, colocate_async or separate_async (R-2.1)."""
    total_steps: int = Field(60, ge=1)
    """Global steps to train."""
    train_batch_size: int = Field(64, ge=1)
    """Prompt groups per global step."""
    parameter_sync_step: int = Field(1, ge=1)
    """Local updates per global step (R-2.3); train_batch_size must be divisible by it (separate_async's default: 4)."""
    val_every_steps: int = Field(10, ge=0)
    """Validate every N global steps (and after the last); 0 turns validation off."""
    val_before_train: bool = True
    """Validate once before the first step."""
    use_prefect: bool = True
    """Run each global step as a Prefect sub-flow of phase tasks (off: the same phase functions, called directly)."""
    step_layout: Literal["auto", "nested", "flat"] = "auto"
    """How a global step shows in Prefect: nested (its own ``<run>/step-N`` flow run under the training run, the phases its task runs), flat (the phases are task runs ``step-N/<phase>`` of the training run itself: no flow run per step, 0.3-0.7 s less per step on a 2-core machine), or auto: nested on a Prefect server of the user's (one with a UI to watch), flat on the temporary API a run starts for itself (it has no UI and stops with the run)."""


class RolloutConfig(StrictModel):
    engine: RolloutEngineName = "torch"
    """Registered rollout engine (rl_train.engines.rollout.registry.ROLLOUT_ENGINES)."""
    n: int = Field(8, ge=1)
    """Samples per prompt (the group size)."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts, > 0: the training log-probs divide the logits by it (greedy: val_temperature)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass."""
    max_new_tokens: int = Field(6, ge=1)
    """Longest response in tokens (the one source of max_tokens, R-5.2)."""
    num_replicas: int = Field(1, ge=1)
    """Rollout engine replicas (Ray actors)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where the built-in engine's replicas run: cuda gives each replica a GPU (its own in separate_async, shared with a training rank in the colocated modes)."""
    num_threads: int = Field(2, ge=1)
    """torch intra-op threads per replica."""
    keep_kv_mib: int = Field(512, ge=0)
    """Built-in engine: MiB per replica of keys and values a multi-turn trajectory keeps between
    its turns, so that a turn after a tool prefills only the tool's answer (0: keep none,
    prefill the whole context each turn). Dropped whenever the weights change."""
    val_temperature: float = Field(0.0, ge=0)
    """Temperature of validation sampling (0 = greedy)."""
    weight_sync: WeightSyncConfig = Field(default_factory=WeightSyncConfig)
    """How trained weights reach the rollout replicas."""
    tool_env: ToolEnvConfig = Field(default_factory=ToolEnvConfig)
    """Simulated tool call after each train trajectory (long-tail latency for agentic workloads)."""
    agent: AgentConfig = Field(default_factory=AgentConfig)
    """Which agent loop answers each prompt (single_turn, tool_agent) and the tool loop's limits."""
    sglang: SglangConfig = Field(default_factory=SglangConfig)
    """The sglang server of engine sglang: attach or launch, timeouts, how weights reach it."""

    def engine_options(self, model_impl: str = "auto") -> dict[str, Any] | None:
        """The chosen engine's own section, as its builder takes it: ``rollout.sglang`` for
        sglang; for torch the model's implementation (``model.impl``) and ``keep_kv_mib``."""
        if self.engine == "sglang":
            return self.sglang.model_dump()
        return {"model_impl": model_impl, "keep_kv_mib": self.keep_kv_mib} if self.engine == "torch" else None

    @field_validator("temperature")
    @classmethod
    def _temperature_trains(cls, value: float) -> float:
        """Temperature 0 would divide the training logits by zero: every log-prob, loss and
        gradient NaN, and every optimizer step skipped. Greedy decoding is for validation."""
        if not value > 0:  # NaN too
            raise ValueError(
                f"must be > 0 for training, got {value}: the training engine divides the logits by "
                "it, so 0 makes every log-prob and gradient NaN. For greedy decoding in validation "
                "set rollout.val_temperature=0 (its default)"
            )
        return value


class RayConfig(StrictModel):
    address: str | None = None
    """Ray cluster to join (e.g. ray://head:10001); None starts a local Ray."""
    num_cpus: int | None = Field(None, ge=1)
    """CPUs of the local Ray (None: all of this machine's)."""
    spread: bool = False
    """Spread each pool's actors over the cluster's nodes (Ray's SPREAD scheduling) instead of packing them onto few."""


class Config(StrictModel):
    run: RunConfig = Field(default_factory=RunConfig)
    """Run identity and output."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """The policy."""
    data: DataConfig = Field(default_factory=DataConfig)
    """Prompt datasets."""
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    """Trainer mode and step counts."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """Rollout sampling and replicas."""
    actor: ActorConfig = Field(default_factory=ActorConfig)
    """Training engine and policy loss."""
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    """Advantage estimator and algorithm knobs."""
    critic: CriticConfig = Field(default_factory=CriticConfig)
    """Value model for the estimators that read values (gae): switch, optimizer, value loss."""
    reward: RewardConfig = Field(default_factory=RewardConfig)
    """Reward pool and which reward scores each data_source."""
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    """Replay buffer: staleness control, group filter, prefetch, custom sampler."""
    ray: RayConfig = Field(default_factory=RayConfig)
    """Ray placement."""
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    """Checkpoints and resume: cadence, location, retention."""
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    """Untrusted code (the python tool's programs, agent commands): run under bubblewrap, with these limits."""
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    """On-policy distillation: the teacher model that scores the student's trajectories, in a pool of its own."""

    def untrusted_code(self, agent_loops: set[str], rewards: AbstractSet[str] = frozenset()) -> list[str]:
        """What of this run executes code nobody vetted, given the agent loops and the rewards
        (beside those the reward section names) its prompts use."""
        uses = []
        if "code_tests" in self.reward.uses({*rewards, *self.reward.names()}):
            uses.append("the code_tests reward (the policy's code run against unit tests)")
        if "tool_agent" in agent_loops:
            uses.append("the python tool (agent loop tool_agent)")
        if "gateway_agent" in agent_loops and GATEWAY_MODES[self.rollout.agent.gateway_mode].runs_untrusted_program:
            uses.append("rollout.agent.gateway_command (agent loop gateway_agent)")
        return uses

    @model_validator(mode="after")
    def _check_consistency(self) -> Config:
        t = self.trainer
        if self.actor.router_replay == "r3" and self.rollout.engine != "torch":
            raise ValueError(
                f"actor.router_replay r3 replays the experts rollout used, and rollout.engine {self.rollout.engine!r} "
                "does not return them yet; use the built-in engine ('torch') or r2"
            )
        if self.actor.router_replay == "r2" and self.algorithm.rollout_correction.bypass_current_version:
            raise ValueError(
                "algorithm.rollout_correction.bypass_current_version: got true: actor.router_replay r2 replays the "
                "routes of old_log_prob's pass, which the copied trajectories skip; set it to false or use r3"
            )
        if self.reward.gar.on and self.algorithm.adv_estimator not in outcome_estimators():
            raise ValueError(
                f"reward.gar: groupwise grading reshapes one advantage per trajectory, and algorithm.adv_estimator "
                f"{self.algorithm.adv_estimator!r} gives one per token; use an outcome estimator "
                f"({', '.join(outcome_estimators())}) or remove reward.gar"
            )
        if t.train_batch_size % t.parameter_sync_step:
            raise ValueError(
                f"trainer.train_batch_size ({t.train_batch_size}) must be divisible by "
                f"trainer.parameter_sync_step ({t.parameter_sync_step})"
            )
        if (
            self.actor.ppo_mini_batch_size
            and (t.train_batch_size // t.parameter_sync_step) % self.actor.ppo_mini_batch_size
        ):
            raise ValueError(
                f"actor.ppo_mini_batch_size ({self.actor.ppo_mini_batch_size}) must divide the groups of one local "
                f"update (trainer.train_batch_size / trainer.parameter_sync_step = {t.train_batch_size // t.parameter_sync_step})"
            )
        return self

    @model_validator(mode="after")
    def _check_teacher(self) -> Config:
        """A distillation loss has a teacher with what it reads; a teacher has a loss that reads it."""
        loss, teacher = self.actor.policy_loss, self.teacher
        fields = teacher_fields(loss, self.actor.distill_term)
        if fields and not teacher.on:
            raise ValueError(
                f"actor.policy_loss {loss!r} trains on a teacher's scores: set teacher.path (an HF causal LM "
                "directory with the student's tokenizer, e.g. runs/arith-tiny/policy, which the demo saves)"
            )
        if teacher.on and not fields:
            raise ValueError(
                f"teacher.path: got {teacher.path!r}, but actor.policy_loss {loss!r} reads no teacher score; use "
                "reverse_kl, forward_kl_topk or distillation_ppo, or remove teacher.path"
            )
        if TEACHER_TOPK_IDS in fields and teacher.top_k == 0:
            raise ValueError(
                "teacher.top_k: got 0, but the forward KL over the teacher's top-k reads its k most likely tokens "
                "at each position; set teacher.top_k (e.g. 8)"
            )
        if (
            self.trainer.mode == "separate_async"
            and teacher.device == "cuda"
            and teacher.placement == "colocate"
        ):
            raise ValueError(
                "teacher.placement: got 'colocate', but separate_async keeps its rollout replicas generating "
                "while the teacher scores (R-2.6); use 'own_pool'"
            )
        return self

    @model_validator(mode="after")
    def _resolve_critic(self) -> Config:
        """``critic.enable`` becomes what the estimator needs, and the critic's unset epochs and
        mini-batches the actor's (the resolved config states them)."""
        critic = self.critic
        enable = check_critic_enable(critic, self.algorithm.adv_estimator)
        if critic.enable != enable:
            critic.enable = enable
        if critic.ppo_epochs is None:
            critic.ppo_epochs = self.actor.ppo_epochs
        if critic.ppo_mini_batch_size is None and self.actor.ppo_mini_batch_size is not None:
            critic.ppo_mini_batch_size = self.actor.ppo_mini_batch_size
        groups = self.trainer.train_batch_size // self.trainer.parameter_sync_step
        mini = critic.ppo_mini_batch_size
        if enable and mini and groups % mini:
            raise ValueError(
                f"critic.ppo_mini_batch_size ({mini}) must divide the groups of one local update "
                f"(trainer.train_batch_size / trainer.parameter_sync_step = {groups})"
            )
        return self

    @model_validator(mode="after")
    def _resolve_sglang_lora(self) -> Config:
        """``rollout.sglang.lora`` as the server must be launched: filled from ``actor.lora`` when
        adapters are synced alone to sglang (the resolved config states it), refused where the
        server could not load them."""
        lora, sglang = self.actor.lora, self.rollout.sglang
        if lora is not None and self.rollout.engine == "sglang" and sends_adapters(lora, self.rollout.engine):
            resolved = resolve_lora(sglang.lora, lora.rank, lora.target_modules)
            if resolved != sglang.lora:
                sglang.lora = resolved
        elif sglang.lora is not None and (sglang.lora.max_rank is None or sglang.lora.target_modules is None):
            raise ValueError(
                f"rollout.sglang.lora: got {sglang.lora.model_dump()}: actor.lora does not sync adapters to sglang, "
                "so nothing fills max_rank and target_modules; set both, or remove rollout.sglang.lora"
            )
        return self

    @property
    def num_actors(self) -> int:
        """The actors a run creates at its start: the queue, the training ranks, the rollout
        replicas, the reward workers, the critic's ranks and the teacher workers (``WorkerPools.create``)."""
        critics = self.critic.num_ranks if self.critic.enable else 0
        teachers = self.teacher.num_workers if self.teacher.on else 0
        return 1 + self.actor.num_ranks + self.rollout.num_replicas + self.reward.num_workers + critics + teachers

    @property
    def optimizer_horizon_steps(self) -> int:
        """LR schedule horizon in optimizer steps (R-2.3)."""
        per_update = (
            (self.trainer.train_batch_size // self.trainer.parameter_sync_step)
            // self.actor.ppo_mini_batch_size
            if self.actor.ppo_mini_batch_size
            else 1
        )
        return (
            self.trainer.total_steps * self.trainer.parameter_sync_step * per_update * self.actor.ppo_epochs
        )


class ConfigError(ValueError):
    """The config is invalid; the message lists every problem with its dotted path."""


def _format_errors(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "(root)"
        kind, msg = err["type"], err["msg"]
        if kind == "extra_forbidden":
            lines.append(f"{path}: unknown key (value {err['input']!r}); {_allowed_keys(err['loc'])}")
        elif kind == "value_error":
            lines.append(f"{path}: {msg.removeprefix('Value error, ')}")
        else:
            lines.append(f"{path}: got {err['input']!r}: {msg}")
    return "invalid config:\n  " + "\n  ".join(lines)


def _allowed_keys(loc: tuple[Any, ...]) -> str:
    model: Any = Config
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if (
            field is None
            or not isinstance(field.annotation, type)
            or not issubclass(field.annotation, StrictModel)
        ):
            return "see `rl-train config --show --docs`"
        model = field.annotation
    return f"allowed keys here: {', '.join(model.model_fields)}"


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], value parsed as a YAML scalar/list)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like dotted.path=value")
    path, raw = item.split("=", 1)
    if not path or any(not part for part in path.split(".")):
        raise ConfigError(f"override {item!r}: empty key in dotted path {path!r}")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    return path.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        keys, value = parse_override(item)
        node = data
        for depth, key in enumerate(keys[:-1]):
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise ConfigError(
                    f"override {item!r}: {'.'.join(keys[: depth + 1])} is {child!r}, not a section"
                )
            node = child
        node[keys[-1]] = value
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """YAML file (optional) + dotted overrides -> validated ``Config``; raises ``ConfigError``."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(
                f"config file {path} must hold a mapping at the top, got {type(loaded).__name__}"
            )
        data = loaded or {}
    apply_overrides(data, overrides or [])
    apply_mode_defaults(data)
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc)) from None
    _check_registered_names(config)
    return config


def apply_mode_defaults(data: dict[str, Any]) -> None:
    """Fill in the trainer mode's own defaults (``rl_train.modes``, R-2.3) for the keys that
    the file and the overrides leave unset; what the user wrote always wins. A callable
    default is computed from the data as filled in so far."""
    trainer = data.get("trainer")
    mode = trainer.get("mode", "sync") if isinstance(trainer, dict) else "sync"
    if not isinstance(mode, str) or mode not in MODES:
        return  # reported, with the registered names, once the tree has loaded
    for dotted, value in MODES[mode].defaults.items():
        if callable(value):  # derived from what is set by now (earlier defaults included)
            try:
                value = value(data)
            except (KeyError, TypeError, ValueError):
                continue  # an input is malformed or missing: validation reports it
        *sections, leaf = dotted.split(".")
        node = data
        for key in sections:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                break  # a malformed section: let validation name it
            node = child
        else:
            node.setdefault(leaf, value)


def mode_config_errors(config: Config) -> list[str]:
    """Registered names and the mode's own refusals, one dotted-path message each."""
    if config.trainer.mode not in MODES:
        return [
            f"trainer.mode: got {config.trainer.mode!r}: unknown name; available: {', '.join(sorted(MODES))}"
        ]
    return MODES[config.trainer.mode].check(config)


def _check_registered_names(config: Config) -> None:
    """Registered names are checked at load time too, so a typo fails before Ray starts.

    (The algorithm and weight-sync sections validate their own names inside pydantic.)
    """
    errors = mode_config_errors(config)
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))


def config_to_yaml(config: Config) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def describe_fields(model: type[StrictModel] = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted path, default, docstring) of every leaf field, for ``rl-train config --docs``."""
    rows = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, StrictModel):
            rows.extend(describe_fields(annotation, path + "."))
        else:
            default = field.get_default(call_default_factory=True)
            rows.append((path, repr(default), (field.description or "").strip()))
    return rows
