"""The trusted first process inside a sandbox: sets the limits, then becomes (or runs) the program.

Run as ``python -I shim.py SPEC ARGV...`` (by path, so it imports nothing but the standard
library: ``-I`` ignores the environment and the user's site). ``SPEC`` is JSON: the rlimits
and, for a gateway, the port to listen on and the unix socket to relay to.

The rlimits are set here, inside the sandbox's own user namespace, rather than by the trainer
before bubblewrap starts: RLIMIT_NPROC counts the processes of a user in every namespace up
the chain, so set outside it would count the trainer's processes too.

Without a gateway the shim sets the limits and execs the program. With one it stays, as the
program's parent: it listens on 127.0.0.1:PORT of the sandbox's private network, relays each
connection to the unix socket (whose other end the trainer holds, and relays on to the one
endpoint it was given), runs the program as its child under the limits and exits with its
code. The program can kill the shim (same user): that ends the sandbox, nothing more.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import resource
import signal
import sys
from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
CHUNK_BYTES = 64 << 10


def set_death_signal() -> None:
    """SIGKILL this process when its parent dies (kept across exec)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def apply_limits(spec: dict[str, Any]) -> None:
    """The program's rlimits, hard and soft; no core files."""
    mib = 1 << 20
    for limit, value in (
        (resource.RLIMIT_CPU, spec["cpu_s"]),
        (resource.RLIMIT_AS, spec["memory_mb"] * mib),
        (resource.RLIMIT_NPROC, spec["nproc"]),
        (resource.RLIMIT_NOFILE, spec["nofile"]),
        (resource.RLIMIT_FSIZE, spec["fsize_mb"] * mib),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(limit, (value, value))


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copies ``reader`` to ``writer`` until end of file or an error, then closes ``writer``."""
    try:
        while chunk := await reader.read(CHUNK_BYTES):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def relay(left: tuple[asyncio.StreamReader, asyncio.StreamWriter], socket_path: str) -> None:
    """One connection to the gateway port, relayed to the unix socket both ways."""
    try:
        right = await asyncio.open_unix_connection(socket_path)
    except OSError:
        left[1].close()
        return
    await asyncio.gather(pipe(left[0], right[1]), pipe(right[0], left[1]))


async def run_with_gateway(spec: dict[str, Any], argv: list[str]) -> int:
    """The shim takes the program's limits itself (a program that took it over would gain
    nothing) and is not dumpable, so the program, the same user, cannot ptrace it."""
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0)
    apply_limits(spec)
    server = await asyncio.start_server(
        lambda r, w: relay((r, w), spec["gateway_socket"]), "127.0.0.1", spec["gateway_port"]
    )
    child = await asyncio.create_subprocess_exec(*argv, preexec_fn=set_death_signal)  # noqa: PLW1509
    code = await child.wait()
    server.close()
    return code if code >= 0 else 128 - code


def main(args: list[str]) -> int:
    spec, argv = json.loads(args[0]), args[1:]
    set_death_signal()
    if spec.get("gateway_port") is None:
        apply_limits(spec)
        try:
            os.execvp(argv[0], argv)
        except OSError as error:
            print(f"sandbox: cannot run {argv[0]!r}: {error}", file=sys.stderr)
            return 127
    return asyncio.run(run_with_gateway(spec, argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
