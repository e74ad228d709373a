"""The bubblewrap command line of one sandbox, and whether bubblewrap can start here at all.

Namespaces: a new user (the program is uid/gid 65534 inside, without capabilities, and may not
make further user namespaces), network (loopback only), PID (``/proc`` shows the sandbox's
own processes; when its first process dies the kernel kills the rest), IPC, mount, UTS and,
where the kernel allows, cgroup. The host's root is mounted read-only; the places where
secrets and live sockets usually sit (homes, ``/run``, ``/var/tmp``, ``/mnt``) are hidden
under empty tmpfs, and ``/tmp``, the working folder and ``/dev/shm`` are private tmpfs of a
capped size. The environment holds only the variables given.

The options go to bubblewrap through a memory file (``--args FD``), not on its command line,
where any user of the host could read them: the environment given (an agent's key) is in them.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from rl_train.engines.sandbox.config import Limits

log = logging.getLogger(__name__)
SANDBOX_UID = 65534
WORKDIR = "/tmp/work"
"""The program's working folder inside the sandbox (a tmpfs of its own)."""
GATEWAY_DIR = "/tmp/.gateway"
"""Where the gateway's unix socket appears inside the sandbox."""
HIDDEN = ("/root", "/home", "/run", "/var/tmp", "/mnt", "/media", "/srv")
"""Host folders replaced by an empty tmpfs: homes (keys, cloud credentials), runtime sockets."""
SHIM = str(Path(__file__).resolve().with_name("shim.py"))
PROBE_TIMEOUT_S = 30.0


class SandboxUnavailable(RuntimeError):
    """No sandbox can start here and running without one was not allowed."""


def unavailable_message(problem: str) -> str:
    return (
        f"untrusted code needs a sandbox and none can start here: {problem}. Install bubblewrap "
        "(apt-get install bubblewrap) on a kernel that allows user namespaces, or set "
        "sandbox.allow_unsandboxed: true to run it with rlimits only (a warning on every run)"
    )


def needed_paths() -> list[str]:
    """What the sandbox must see even under a hidden folder: this interpreter and the shim."""
    return sorted({str(Path(p).resolve()) for p in (sys.base_prefix, sys.prefix, Path(SHIM).parent)})


def bwrap_options(
    limits: Limits, env: Mapping[str, str], gateway_dir: str | None = None, visible: Sequence[str] = ()
) -> list[str]:
    """bubblewrap's options (before ``-- COMMAND``) for a sandbox under ``limits`` with ``env``."""
    tmpfs_bytes = str(limits.tmpfs_mb << 20)
    args = [
        "--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
        "--disable-userns", "--die-with-parent", "--new-session", "--hostname", "sandbox",
        "--ro-bind", "/", "/",
    ]  # fmt: skip
    hidden = [h for h in HIDDEN if os.path.isdir(h) and not os.path.islink(h)]
    for folder in hidden:
        args += ["--tmpfs", folder]
    args += ["--proc", "/proc", "--dev", "/dev"]
    for folder in ("/dev/shm", "/tmp", WORKDIR):
        args += ["--size", tmpfs_bytes, "--tmpfs", folder]
    # what must stay visible (the interpreter, a venv or checkout under /tmp or a home) is bound
    # back read-only over the empty mounts, after them, so that they do not cover it again
    masked = [*hidden, "/dev/shm", "/tmp"]
    for path in [*needed_paths(), *visible]:
        under = any(path == m or path.startswith(m + "/") for m in masked)
        if under and not (path == WORKDIR or path.startswith(WORKDIR + "/")):
            args += ["--ro-bind", path, path]
    if gateway_dir is not None:
        args += ["--ro-bind", gateway_dir, GATEWAY_DIR]
    args += ["--clearenv"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    args += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--chdir", WORKDIR]
    return args


def bwrap_command(path: str, options_fd: int, command: Sequence[str]) -> list[str]:
    """The command line: the options come from ``options_fd`` (they hold the environment);
    bubblewrap takes the command from its own command line only."""
    return [path, "--args", str(options_fd), "--", *command]


def args_file(args: Sequence[str]) -> int:
    """A memory file holding ``args`` NUL-separated, read from the start (for ``--args FD``)."""
    fd = os.memfd_create("bwrap-args", 0)
    data = b"".join(arg.encode() + b"\0" for arg in args)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


@functools.cache
def sandbox_problem() -> str | None:
    """None when bubblewrap starts a sandbox here, else why not (checked once per process:
    ``sandbox_problem.cache_clear()`` asks again)."""
    path = bwrap_path()
    if path is None:
        return "bubblewrap (bwrap) is not on PATH"
    fd = args_file(bwrap_options(Limits(wall_s=PROBE_TIMEOUT_S), {}))
    try:
        probe = subprocess.run(
            bwrap_command(path, fd, ["true"]),
            pass_fds=(fd,),
            env={},
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{path} could not be run: {error}"
    finally:
        os.close(fd)
    if probe.returncode != 0:
        said = probe.stderr.decode(errors="replace").strip()[-500:] or f"exit code {probe.returncode}"
        return f"{path} cannot make a sandbox here (user namespaces not allowed?): {said}"
    return None


def require_sandbox(uses: Sequence[str], allow_unsandboxed: bool) -> None:
    """At the start of a run: where it would run untrusted code (``uses``, named for the user)
    and no sandbox can start, ``SandboxUnavailable`` naming the fix, or a warning when
    ``allow_unsandboxed`` (each run warns again)."""
    problem = sandbox_problem() if uses else None
    if problem is None:
        return
    if not allow_unsandboxed:
        raise SandboxUnavailable(f"{', '.join(uses)}: {unavailable_message(problem)}")
    log.warning(
        "%s will run WITHOUT a sandbox (sandbox.allow_unsandboxed is true): %s", ", ".join(uses), problem
    )
