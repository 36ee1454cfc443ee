"""Helpers for a backend's tests of the errors a user sees when a World cannot be opened: a
port nothing listens on, a listener that never answers, a host name that does not exist, the
``world info`` command as a real process, and an error's whole message chain.

Every backend of this repository tests its connection errors with these; an outside backend
can too.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["error_chain", "free_port", "resolves_as_unknown", "silent_listener", "world_info"]

WAIT = 60.0
"""A guard against hanging only: no check depends on how long anything took."""


def error_chain(exc: BaseException) -> str:
    """Every message along the exception's cause/context chain."""
    parts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None:
        parts += [str(seen), repr(seen)]
        seen = seen.__cause__ or seen.__context__
    return "\n".join(parts)


def free_port() -> int:
    """A loopback port nothing listens on (a connection to it is refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def silent_listener() -> Iterator[int]:
    """A loopback port whose connections the kernel accepts and nobody ever answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


def resolves_as_unknown(host: str) -> bool:
    """True if the resolver says ``host`` does not exist (not merely that it failed now)."""
    try:
        socket.getaddrinfo(host, 443)
    except socket.gaierror as exc:
        return exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME))
    return False


def world_info(world: str, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``world info --world <world> <args>`` as a real process, with none of the caller's
    ``WORKFLOW_*`` or ``DATABASE_URL`` settings, plus ``env``."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("WORKFLOW_")}
    environment.pop("DATABASE_URL", None)
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-m", "world_core._cli", "info", "--world", world, *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
