"""Running untrusted programs (the ``python`` tool's code, agent commands) in a sandbox.

``spawn`` starts a program under bubblewrap with new user, network, PID, IPC, mount, UTS (and,
where allowed, cgroup) namespaces, a read-only view of the host's root with homes and runtime
sockets hidden, private size-capped tmpfs for ``/tmp``, the working folder and ``/dev/shm``,
only the environment given, rlimits set inside (CPU, address space, processes, open files,
file size, no core files), and a deadline kept from outside: at ``wall_s + GRACE_S`` the whole
sandbox is SIGKILLed. ``run_python`` is the ``python`` tool's use of it. Where bubblewrap
cannot start, ``spawn`` refuses (``SandboxUnavailable``) unless told ``allow_unsandboxed``.
"""

from rl_train.engines.sandbox.bwrap import SandboxUnavailable, require_sandbox, sandbox_problem
from rl_train.engines.sandbox.config import GRACE_S, Limits, SandboxConfig
from rl_train.engines.sandbox.process import Sandboxed, spawn
from rl_train.engines.sandbox.python_tool import SandboxResult, run_python

__all__ = [
    "GRACE_S",
    "Limits",
    "SandboxConfig",
    "SandboxResult",
    "SandboxUnavailable",
    "Sandboxed",
    "require_sandbox",
    "run_python",
    "sandbox_problem",
    "spawn",
]
