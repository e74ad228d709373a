"""``rl-train``: train, evaluate, show the config, create the tiny policy and built-in data, serve deployments."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from rl_train import startup_clock
from rl_train.runtime import apply_local_defaults

apply_local_defaults()  # before Prefect is first imported; the user's own settings win

from rl_train.config import Config, ConfigError, config_to_yaml, describe_fields, load_config  # noqa: E402

EPILOG = """examples:
  rl-train train --config configs/arith-tiny.yaml trainer.total_steps=50
  rl-train config --show --config configs/arith-tiny.yaml actor.lr=3e-4
  rl-train init-model --out models/tiny-qwen2
  rl-train init-reward-model --out models/tiny-rm
  rl-train serve            # then: prefect deployment run rl-train/sync -p config=configs/arith-tiny.yaml
  rl-train eval runs/arith-tiny          # score the run's newest checkpoint on its validation set
  rl-train serve-reward --config configs/arith-tiny.yaml --port 8731   # its rewards over HTTP
"""


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", help="YAML config file (defaults apply when omitted)")
    parser.add_argument(
        "overrides", nargs="*", metavar="dotted.key=value", help="overrides, e.g. trainer.total_steps=50"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rl-train",
        description="Agentic RL post-training: every phase a Prefect task, every model in a Ray worker pool.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser(
        "train", help="run training (through Prefect's local API unless PREFECT_API_URL is set)"
    )
    _add_config_args(train)
    train.add_argument(
        "--no-prefect", action="store_true", help="call the phase functions directly, without Prefect"
    )
    train.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR (a path or s3:// URI) from its newest complete checkpoint, "
        "with the config it was started with (overrides may extend trainer.total_steps). Re-running "
        "the original command does the same.",
    )

    show = sub.add_parser("config", help="print the resolved config")
    _add_config_args(show)
    show.add_argument("--show", action="store_true", help="print the resolved config as YAML (the default)")
    show.add_argument("--docs", action="store_true", help="print every field with its default and docstring")

    init_model = sub.add_parser("init-model", help="create the built-in tiny policy (HF format)")
    init_model.add_argument("--out", required=True, help="directory to write")
    init_model.add_argument("--seed", type=int, default=0)
    init_model.add_argument(
        "--pretrain-steps", type=int, default=300, help="format-pretraining steps (0 = random init)"
    )
    init_model.add_argument(
        "--pretrain-task", choices=("arith", "tool_sum", "tiny_function"), default="arith",
        help="the format it learns: arith (sums answered directly), tool_sum (sums through a calculator "
        "call) or tiny_function (a function body after its prompt)",
    )  # fmt: skip
    init_model.add_argument(
        "--prior-correct", type=float, default=0.1, help="how often the pretraining text is right (0-1)"
    )

    init_rm = sub.add_parser(
        "init-reward-model", help="train the built-in tiny reward model (HF sequence classifier, its own tokenizer)"
    )
    init_rm.add_argument("--out", required=True, help="directory to write (must not exist or be empty)")
    init_rm.add_argument("--task", default="single_digit_sum", help="the built-in task whose answers it judges")
    init_rm.add_argument("--seed", type=int, default=0)
    init_rm.add_argument(
        "--steps", type=int, default=None, help="training steps (batches of 512; default 400, about a minute)"
    )

    init_data = sub.add_parser("init-data", help="write a built-in task's train/val Parquet files")
    init_data.add_argument(
        "--task", default="single_digit_sum", help="single_digit_sum, multi_digit_sum or tool_sum"
    )
    init_data.add_argument("--out", required=True)
    init_data.add_argument("--seed", type=int, default=0)

    serve = sub.add_parser("serve", help="serve the rl-train deployments against the configured Prefect API")
    serve.add_argument("--limit", type=int, default=1, help="concurrent flow runs")
    serve.add_argument("--eval-run-dir", metavar="RUN_DIR", help="the run the eval schedule evaluates")
    serve.add_argument("--eval-every", type=int, metavar="SECONDS", help="evaluate its newest checkpoint every N s")
    serve.add_argument("--eval-cron", metavar="CRON", help="evaluate its newest checkpoint on a cron schedule")
    serve.add_argument("--eval-extra", action="append", default=[], metavar="FILE", help="another dataset to score")

    serve_reward = sub.add_parser(
        "serve-reward", help="serve the config's rewards at one HTTP endpoint (POST /v1/score), for reward.remote clients"
    )
    _add_config_args(serve_reward)
    serve_reward.add_argument("--host", default="127.0.0.1", help="address to bind (beyond loopback a token is required)")
    serve_reward.add_argument("--port", type=int, default=0, help="port to bind (0: a free one; the URL is printed)")
    serve_reward.add_argument(
        "--token-env", default="RL_TRAIN_REWARD_TOKEN", metavar="NAME",
        help="environment variable holding the bearer token clients must send (unset: no token, loopback only)",
    )  # fmt: skip
    serve_reward.add_argument("--max-body-bytes", type=int, default=8 << 20, help="largest request body (413 past it)")
    serve_reward.add_argument("--max-batch", type=int, default=1024, help="most trajectories in one request")
    serve_reward.add_argument("--parallel", type=int, default=1, help="batches scored at once (thread-safe rewards only)")

    evaluate = sub.add_parser("eval", help="evaluate a run's newest complete checkpoint (the rl-eval flow, once)")
    evaluate.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (a path or s3:// URI)")
    evaluate.add_argument("--step", type=int, help="this checkpoint step (default: the newest complete one)")
    evaluate.add_argument("--extra", action="append", default=[], metavar="FILE", help="another dataset to score")
    evaluate.add_argument("--force", action="store_true", help="evaluate a step again that was evaluated already")
    evaluate.add_argument("--no-prefect", action="store_true", help="without a Prefect flow run (no artifacts)")
    return parser


def _print_docs() -> None:
    from rl_train.storage.dataset import COLUMNS_DOC

    for path, default, doc in describe_fields():
        print(f"{path} = {default}\n    {doc}")
    print(f"\n{COLUMNS_DOC}", end="")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "config":
            if args.docs:
                _print_docs()
                return 0
            print(config_to_yaml(load_config(args.config, args.overrides)), end="")
            return 0
        if args.command == "train":
            return _train(args)
        if args.command == "eval":
            return _eval(args)
        if args.command == "serve-reward":
            return _serve_reward(args)
    except ConfigError as exc:
        print(f"rl-train: {exc}", file=sys.stderr)
        return 2
    if args.command == "init-model":
        from rl_train.engines.model.tiny import create_tiny_policy

        print(
            create_tiny_policy(
                args.out, seed=args.seed, pretrain_steps=args.pretrain_steps,
                prior_correct=args.prior_correct, pretrain_task=args.pretrain_task,
            )  # fmt: skip
        )
        return 0
    if args.command == "init-reward-model":
        return _init_reward_model(args)
    if args.command == "init-data":
        from rl_train.storage.builtin_data import write_builtin_task

        for path in write_builtin_task(args.task, args.out, seed=args.seed):
            print(path)
        return 0
    if args.command == "serve":
        from pydantic import ValidationError

        from rl_train.deployments.eval_schedule import EvalScheduleConfig
        from rl_train.deployments.serve import serve_deployments

        try:
            schedule = EvalScheduleConfig(
                run_dir=args.eval_run_dir,
                interval_seconds=args.eval_every,
                cron=args.eval_cron,
                extra_val_files=args.eval_extra,
            )
        except ValidationError as exc:
            print(f"rl-train serve: bad eval schedule (--eval-*): {exc}", file=sys.stderr)
            return 2
        serve_deployments(limit=args.limit, eval_schedule=schedule)
        return 0
    return 1


def _init_reward_model(args: argparse.Namespace) -> int:
    from rl_train.engines.reward.tiny_rm import train_tiny_rm

    try:
        steps = {} if args.steps is None else {"steps": args.steps}
        train_tiny_rm(args.out, task=args.task, seed=args.seed, **steps)
    except (FileExistsError, ValueError) as exc:
        print(f"rl-train init-reward-model: {exc}", file=sys.stderr)
        return 2
    return 0


def resume_overrides(run_dir: str) -> tuple[str, list[str]]:
    """``--resume RUN_DIR``: (a local copy of the run's saved config, the overrides that pin its
    run directory to RUN_DIR itself, wherever the saved config's output_dir pointed)."""
    import tempfile

    import fsspec

    fs, root = fsspec.core.url_to_fs(run_dir)
    root = root.rstrip("/")
    saved = f"{root}/config.yaml"
    if not fs.exists(saved):
        raise ConfigError(f"--resume {run_dir}: no run there ({saved} does not exist)")
    handle, local = tempfile.mkstemp(prefix="rlt-resume-", suffix=".yaml")
    with open(handle, "wb") as out:
        out.write(fs.cat_file(saved))
    parent, _, name = run_dir.rstrip("/").rpartition("/")
    return local, [f"run.output_dir={parent or '.'}", f"run.name={name}", "checkpoint.resume=true"]


def _train(args: argparse.Namespace) -> int:
    if args.resume:
        if args.config:
            raise ConfigError("--resume uses the run's saved config.yaml; drop --config")
        args.config, pinned = resume_overrides(args.resume)
        args.overrides = [*args.overrides, *pinned]
    config = load_config(args.config, args.overrides)  # fails here, before anything starts
    startup_clock.mark("config")
    from rl_train.engines.reward.reward_model import RewardModelError
    from rl_train.engines.sandbox import SandboxUnavailable
    from rl_train.storage.dataset import DatasetError
    from rl_train.storage.metrics import RunDirectoryExistsError

    try:
        check_inputs(config)
    except DatasetError as exc:
        print(f"rl-train: bad dataset: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, RunDirectoryExistsError, SandboxUnavailable, RewardModelError) as exc:
        print(f"rl-train: {exc}", file=sys.stderr)
        return 2
    startup_clock.mark("inputs")
    use_prefect = not args.no_prefect and config.trainer.use_prefect
    config.trainer.use_prefect = use_prefect
    from rl_train.flows.prefect_api import PrefectAPIError
    from rl_train.flows.startup import warm_start

    try:
        # Ray, Prefect's API and the imports at once; the run's actors as soon as Ray is up
        warm_start(
            config.ray.address, config.ray.num_cpus, use_prefect, config.num_actors, after_ray=lambda: _prelaunch(config)
        )
        if not use_prefect:
            from rl_train.flows.train import run_training

            summary = run_training(config)
        else:
            from rl_train.flows.train import train_flow

            summary = train_flow(resolved=config.model_dump(mode="json"))
    except DatasetError as exc:
        print(f"rl-train: bad dataset: {exc}", file=sys.stderr)
        return 2
    except PrefectAPIError as exc:  # its server's output, and what to do where it is known
        print(f"rl-train: {exc}", file=sys.stderr)
        return 2
    finally:
        _abandon_prelaunched()
    print(json.dumps(summary, indent=2))
    return 0


def _prelaunch(config: Config) -> None:
    """Ask Ray for the run's actors now, for the trainer to take over (``flows/prelaunch.py``).
    Best effort: where asking fails, the trainer asks again inside its flow run, which then
    fails with the error and shows it (in Prefect's UI too)."""
    from rl_train.flows.prelaunch import prelaunch
    from rl_train.flows.registry import get_trainer_class

    try:
        prelaunch(config, get_trainer_class(config.trainer.mode).worker_classes)
    except Exception as exc:  # noqa: BLE001 (reported by the trainer's own attempt)
        logging.getLogger(__name__).debug("actors not asked for before the flow: %s", exc)


def _abandon_prelaunched() -> None:
    """Kill prelaunched actors that no trainer took over (the run failed before it began)."""
    if "rl_train.flows.prelaunch" in sys.modules:
        sys.modules["rl_train.flows.prelaunch"].abandon()


def _serve_reward(args: argparse.Namespace) -> int:
    """``rl-train serve-reward``: the config's rewards (built now, so a reward that cannot start
    fails here) on ``--host``:``--port`` until SIGINT or SIGTERM."""
    import os

    from rl_train.engines.reward.remote_server import RewardServer, ServeLimits, create_reward_app
    from rl_train.engines.reward.router import RewardRouter

    config = load_config(args.config, args.overrides)
    token = os.environ.get(args.token_env) or None
    try:
        limits = ServeLimits(max_body_bytes=args.max_body_bytes, max_batch=args.max_batch, parallel=args.parallel)
        if min(limits.max_body_bytes, limits.max_batch, limits.parallel) < 1:
            raise ValueError("--max-body-bytes, --max-batch and --parallel are at least 1")
        router = RewardRouter(config.reward, config.sandbox)
        router.build_configured()
        server = RewardServer(create_reward_app(router, limits, token), args.host, args.port, has_token=token is not None)
    except (ValueError, OSError) as exc:
        print(f"rl-train serve-reward: {exc}", file=sys.stderr)
        return 2
    print(f"serving rewards at {server.url}{' (bearer token required)' if token else ''}", flush=True)
    server.serve()
    return 0


def _eval(args: argparse.Namespace) -> int:
    """``rl-train eval RUN_DIR``: the rl-eval flow once (or its body, with ``--no-prefect``)."""
    from rl_train.flows.evaluate import eval_flow, evaluate_run
    from rl_train.storage.checkpoint import CheckpointError
    from rl_train.storage.dataset import DatasetError

    try:
        if args.no_prefect:
            summary = evaluate_run(args.run_dir, args.step, args.extra, force=args.force).summary()
        else:
            summary = eval_flow(run_dir=args.run_dir, step=args.step, extra_val_files=args.extra, force=args.force)
    except (CheckpointError, DatasetError, FileNotFoundError) as exc:
        print(f"rl-train: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2))
    return 0


def check_inputs(config: Config) -> None:
    """Everything a user gets wrong first, checked before a flow run or Ray starts: the model
    path, every dataset row (built-in data is written first) and that a reward function takes
    its data_source, that a sandbox can start where the run would execute untrusted code, and
    the run directory.

    Raises ``FileNotFoundError``, ``DatasetError``, ``SandboxUnavailable``, ``RewardModelError`` (a
    reward model's directory that is no sequence classifier) or ``RunDirectoryExistsError``. The run
    directory comes last and is only inspected (fresh, resume or overwrite: ``plan_run_start``);
    the trainer acts on it when it starts.
    """
    from rl_train.engines.agent.config import check_agent_loop
    from rl_train.engines.reward.model_config import check_reward_models
    from rl_train.engines.reward.router import RewardRouter
    from rl_train.engines.sandbox import require_sandbox
    from rl_train.engines.teacher.config import check_teacher_path
    from rl_train.flows.resume import plan_run_start
    from rl_train.storage.dataset import load_prompts

    if not config.model.create_if_missing and not Path(config.model.path).exists():
        raise FileNotFoundError(
            f"model.path {config.model.path} does not exist (model.create_if_missing is off)"
        )
    check_reward_models(config.reward.models)
    check_teacher_path(config.teacher)
    data = config.data
    needs_val = bool(config.trainer.val_every_steps or config.trainer.val_before_train)
    files = data.resolved_train_files() + data.resolved_val_files()
    if data.builtin_task and not all(Path(p).exists() for p in files):  # as the trainer would
        from rl_train.storage.builtin_data import write_builtin_task

        write_builtin_task(data.builtin_task, data.data_dir, seed=config.run.seed)
    loops = {config.rollout.agent.default, *config.rollout.agent.by_data_source.values()}

    def agent_loop(name: str) -> str:
        loops.add(check_agent_loop(name))
        return name

    router, rewards = RewardRouter(config.reward, config.sandbox), set()

    def reward_of(data_source: str) -> str:
        rewards.add(router.route(data_source))
        return data_source

    load_prompts(data.resolved_train_files(), check_data_source=reward_of, check_agent_name=agent_loop)
    if needs_val:
        load_prompts(data.resolved_val_files(), check_data_source=reward_of, check_agent_name=agent_loop)
    require_sandbox(config.untrusted_code(loops, rewards), config.sandbox.allow_unsandboxed)
    plan_run_start(config, f"{config.run.output_dir.rstrip('/')}/{config.run.name}")


if __name__ == "__main__":
    sys.exit(main())
