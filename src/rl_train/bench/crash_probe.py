"""``rl-train`` with markers on stderr around the windows a crash test aims its kills at.

``python -m rl_train.bench.crash_probe train --no-prefect ...`` runs the CLI unchanged, in the
same process, after wrapping four driver-side calls so that each writes one line to stderr:

    crash-probe: restore-begin 12 / restore-end 12   loading checkpoint 12
    crash-probe: ckpt-begin 13 / ckpt-end 13         checkpoint 13 started / its manifest committed
    crash-probe: sync-begin 13 / sync-end 13         weights of step 13 pushed / every receiver done

A weight sync of the tiny policy takes some 20 ms and a checkpoint write a few hundred: too
short to find from outside by timing alone, so the harness (``crash_harness``) kills the run
when it reads these lines. The markers only observe; nothing the run does changes. Each is a
single ``write(2)`` of less than PIPE_BUF bytes, so it never lands inside another line.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any
from unittest import mock

MARKER_PREFIX = "crash-probe: "


def emit(event: str, step: int) -> None:
    os.write(2, f"{MARKER_PREFIX}{event} {step}\n".encode())


def _around(owner: type, name: str, begin: str | None, end: str | None, step_of: Callable[..., int]) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        step = step_of(*args, **kwargs)
        if begin:
            emit(begin, step)
        result = original(*args, **kwargs)
        if end:
            emit(end, step)
        return result

    setattr(owner, name, wrapped)


def _watch_push(pending: Any, version: int) -> None:
    """Report ``sync-end`` once the sender and every receiver of the push have returned."""
    import ray

    refs = [pending.metrics.ref, *(receive.ref for receive in pending.receives)]
    try:
        ray.wait(refs, num_returns=len(refs), fetch_local=False)
    except Exception:  # the run is going down; the run itself reports why
        return
    emit("sync-end", version)


def install_markers() -> None:
    from rl_train.engines.workers.weight_sync_link import WeightSyncLink
    from rl_train.flows.base import BaseTrainer
    from rl_train.flows.checkpointing import RunCheckpointer
    from rl_train.storage.checkpoint import CheckpointStore

    def first_int(_self: Any, step: int, *args: Any, **kwargs: Any) -> int:
        return step

    _around(RunCheckpointer, "save", "ckpt-begin", None, first_int)
    _around(CheckpointStore, "commit", None, "ckpt-end", first_int)
    restore = BaseTrainer._restore

    @functools.wraps(restore)
    def _restore(self: Any, store: Any, step: int) -> None:
        emit("restore-begin", step)
        restore(self, store, step)
        emit("restore-end", step)

    mock.patch.object(BaseTrainer, "_restore", _restore).start()  # for the life of the probed process
    start = WeightSyncLink.start_push

    @functools.wraps(start)
    def start_push(self: Any, version: int, overlap: bool = True) -> Any:
        emit("sync-begin", version)
        pending = start(self, version, overlap)
        threading.Thread(target=_watch_push, args=(pending, version), daemon=True).start()
        return pending

    mock.patch.object(WeightSyncLink, "start_push", start_push).start()


def main(argv: list[str] | None = None) -> int:
    from rl_train import cli  # sets Prefect's local defaults before Prefect is imported

    install_markers()
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
