"""Settings: where the database is (local file, remote server or embedded replica) and how to
reach it, read from the factory arguments or the environment."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from urllib.parse import unquote, urlsplit

from world_core import redact
from world_core.errors import ConfigurationError

__all__ = ["Mode", "Settings", "read_settings"]

URL_VAR = "WORKFLOW_TURSO_URL"
TOKEN_VAR = "WORKFLOW_TURSO_AUTH_TOKEN"
REPLICA_VAR = "WORKFLOW_TURSO_REPLICA_PATH"
CONNECT_TIMEOUT_VAR = "WORKFLOW_TURSO_CONNECT_TIMEOUT"
BUSY_TIMEOUT_VAR = "WORKFLOW_TURSO_BUSY_TIMEOUT"

DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_BUSY_TIMEOUT = 30.0

_REMOTE_SCHEMES = ("libsql", "https", "http")


class Mode(Enum):
    LOCAL = "local"
    REMOTE = "remote"
    REPLICA = "replica"


@dataclass(frozen=True)
class Settings:
    """What :func:`read_settings` resolved. ``auth_token`` is never shown by ``repr``."""

    mode: Mode
    url: str
    """The URL as given (``file:...``, ``libsql://...``); shown only through ``redact``."""
    path: str | None
    """The local database file (LOCAL and REPLICA), absolute."""
    remote_url: str | None
    """The server (REMOTE and REPLICA), as libsql takes it."""
    connect_timeout: float
    busy_timeout: float
    auth_token: str = field(default="", repr=False)
    source: str = URL_VAR
    """Where ``url`` came from, for messages: ``WORKFLOW_TURSO_URL`` or ``url=``."""


def _seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{name}={raw!r} is not a positive number of seconds")
    return value


def _file_path(url: str, var: str = URL_VAR) -> str:
    if url.startswith("file://"):
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise ConfigurationError(
                f"{var}: {redact(url)!r} names a host; a file: URL is a local path "
                "(file:relative/x.db, file:/abs/x.db or file:///abs/x.db)"
            )
        raw = unquote(parts.path)
    elif url.startswith("file:"):
        raw = url[len("file:") :]
    else:
        raw = url
    if not raw or raw == ":memory:" or raw.startswith("file::memory:"):
        raise ConfigurationError(
            f"{var}={redact(url)!r}: give a database file path (an in-memory database "
            "is neither durable nor shared; use a temporary file for tests)"
        )
    path = Path(raw).expanduser()
    if path.is_dir():
        raise ConfigurationError(
            f"{var}: {str(path)!r} is a folder; name a database file inside it "
            f"(for example file:{path / 'world.db'})"
        )
    if not path.parent.is_dir():
        blocker = next((p for p in reversed(path.parents) if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            raise ConfigurationError(
                f"{var}: {str(blocker)!r} is a file, not a folder; name a database file in a folder"
            )
        raise ConfigurationError(
            f"{var}: the folder {str(path.parent)!r} does not exist; create it first"
        )
    return str(path.resolve())


def read_settings(url: str | None) -> Settings:
    """Resolve the database location.

    ``url`` (else ``WORKFLOW_TURSO_URL``) is a ``file:`` URL or plain path (a local database
    file), or ``libsql://``, ``https://`` or ``http://`` (a libSQL server or Turso database,
    with ``WORKFLOW_TURSO_AUTH_TOKEN``). With a remote URL, ``WORKFLOW_TURSO_REPLICA_PATH``
    selects an embedded replica: that local file, synced from the URL.

    Raises:
        ConfigurationError: no URL, an unknown scheme, a missing folder, a replica path with a
            local URL, or a bad timeout value; the message names the variable to fix.
    """
    source = "url=" if url is not None else URL_VAR
    given = url if url is not None else os.environ.get(URL_VAR, "")
    given = given.strip()
    if not given:
        raise ConfigurationError(
            f"no Turso/libSQL database configured: set {URL_VAR} to a file: path "
            "(file:/var/lib/app/world.db) or a libsql:// URL"
        )
    token = os.environ.get(TOKEN_VAR, "")
    replica = os.environ.get(REPLICA_VAR, "").strip()
    connect_timeout = _seconds(CONNECT_TIMEOUT_VAR, DEFAULT_CONNECT_TIMEOUT)
    busy_timeout = _seconds(BUSY_TIMEOUT_VAR, DEFAULT_BUSY_TIMEOUT)
    scheme = given.split("://", 1)[0].lower() if "://" in given else ""
    if scheme in ("", "file") or given.startswith("file:"):
        if replica:
            raise ConfigurationError(
                f"{REPLICA_VAR} is set but {source} is a local file; an embedded replica "
                "needs a libsql:// or https:// URL to sync from (or unset the replica path)"
            )
        return Settings(
            mode=Mode.LOCAL,
            url=given,
            path=_file_path(given, source),
            remote_url=None,
            connect_timeout=connect_timeout,
            busy_timeout=busy_timeout,
            auth_token=token,
            source=source,
        )
    if scheme not in _REMOTE_SCHEMES:
        hint = " (libsql speaks HTTP: use https:// or libsql://)" if scheme in ("ws", "wss") else ""
        raise ConfigurationError(
            f"{redact(given)!r} (from {source}): unsupported scheme {scheme!r}{hint}; use file:, "
            "libsql://, https:// or http://"
        )
    try:
        parts = urlsplit(given)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ConfigurationError(
            f"{redact(given)!r} (from {source}) is not a valid URL: {exc}"
        ) from exc
    if not parts.hostname:
        raise ConfigurationError(f"{redact(given)!r} (from {source}) has no host name")
    if replica:
        return Settings(
            mode=Mode.REPLICA,
            url=given,
            path=_file_path(replica, REPLICA_VAR),
            remote_url=given,
            connect_timeout=connect_timeout,
            busy_timeout=busy_timeout,
            auth_token=token,
            source=source,
        )
    return Settings(
        mode=Mode.REMOTE,
        url=given,
        path=None,
        remote_url=given,
        connect_timeout=connect_timeout,
        busy_timeout=busy_timeout,
        auth_token=token,
        source=source,
    )
