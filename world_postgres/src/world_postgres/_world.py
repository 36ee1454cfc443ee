"""PostgresWorld and its factory ``connect``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from world_core import redact
from world_core.errors import ConfigurationError
from world_core.spi import Capabilities, World, validate_namespace
from world_postgres._db import Database
from world_postgres._log import PostgresLog
from world_postgres._notify import Listener
from world_postgres._queue import PostgresQueue
from world_postgres._stream import PostgresStream

__all__ = ["PostgresWorld", "connect"]

DEFAULT_POOL_SIZE = 10
DEFAULT_RETRY_SECONDS = 15.0
DEFAULT_CONNECT_TIMEOUT = 5.0


def _env_number(name: str, default: float, *, integer: bool) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        value = -1
    if value <= 0:
        kind = "a positive integer" if integer else "a positive number of seconds"
        raise ConfigurationError(f"{name} must be {kind}, got {raw!r}")
    return value


def _url(url: str | None) -> tuple[str, str]:
    """The URL as asyncpg takes it, and where it came from (for messages)."""
    if url is not None:
        source = "url="
    elif os.environ.get("WORKFLOW_POSTGRES_URL"):
        url, source = os.environ["WORKFLOW_POSTGRES_URL"], "WORKFLOW_POSTGRES_URL"
    elif os.environ.get("DATABASE_URL"):
        url, source = os.environ["DATABASE_URL"], "DATABASE_URL"
    else:
        raise ConfigurationError(
            "no PostgreSQL URL: set WORKFLOW_POSTGRES_URL (or DATABASE_URL), e.g. "
            "postgresql://user:password@host:5432/dbname"
        )
    scheme, sep, rest = url.partition("://")
    # SQLAlchemy-style URLs name a driver after '+' (postgresql+asyncpg://): asyncpg is ours.
    base = scheme.split("+", 1)[0].lower()
    if not sep or base not in ("postgres", "postgresql"):
        raise ConfigurationError(
            f"{redact(url)!r} (from {source}) is not a postgresql:// URL; "
            "use postgresql://user:password@host:5432/dbname"
        )
    try:
        urlsplit(url)  # an unclosed '[' of an IPv6 host, say: refused here, not as a traceback
    except ValueError as exc:
        raise ConfigurationError(
            f"{redact(url)!r} (from {source}) is not a valid URL: {exc}; use "
            "postgresql://user:password@host:5432/dbname ([...] around an IPv6 address)"
        ) from None
    return f"postgresql://{rest}", source


class PostgresWorld(World):
    """A World in one PostgreSQL schema, ``world_<namespace>``, through an asyncpg pool.

    The schema is made by the first call that stores something, never by opening or reading
    (see ``Database.run``). Quirks beyond the SPI: ``purge`` drops the schema, which the next
    write (from any process) recreates; once open, calls retry transient faults for
    ``WORKFLOW_POSTGRES_RETRY_SECONDS`` (writes check first whether their earlier try
    committed), then raise BackendUnavailableError. Opening does not retry its first
    connection.
    """

    name = "postgres"

    def __init__(self, db: Database, namespace: str) -> None:
        self.namespace = namespace
        self._db = db
        self._listener = Listener(db)
        self.log = PostgresLog(db, self._listener)
        self.queue = self._queue = PostgresQueue(db, self._listener)
        self.stream = PostgresStream(db, self._listener)
        self._closed = False

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(outbox=True, shared=True, native_wakeups=True)

    def settings(self) -> Mapping[str, str]:
        return {
            "url": self._db.where,
            "namespace": self.namespace,
            "schema": self._db.schema_name,
            "channel": self._db.channel,
            "pool_size": str(self._db.pool_size),
            "retry_seconds": f"{self._db.retry_seconds:g}",
            "connect_timeout": f"{self._db.connect_timeout:g}",
        }

    @property
    def listener_reconnects(self) -> int:
        """How often the LISTEN connection was reopened after a loss."""
        return self._listener.reconnects

    async def purge(self) -> None:
        await self._db.purge()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._listener.aclose()
        await self._db.close()
        await self._queue.aclose()

    def __repr__(self) -> str:
        return f"PostgresWorld(url={self._db.where!r}, namespace={self.namespace!r})"


async def connect(*, url: str | None = None, namespace: str = "default") -> PostgresWorld:
    """Open the PostgreSQL World. Creates nothing: the namespace's schema is made by its first
    write. An existing schema of an older version is migrated; a newer one is refused.

    Args:
        url: a ``postgresql://`` URL; None reads ``WORKFLOW_POSTGRES_URL``, then
            ``DATABASE_URL``.
        namespace: maps to the schema ``world_<namespace>``.

    Settings read from the environment: ``WORKFLOW_POSTGRES_POOL_SIZE`` (connections, default
    10, plus one LISTEN connection once something waits), ``WORKFLOW_POSTGRES_RETRY_SECONDS``
    (how long transient faults are retried once the World is open, default 15),
    ``WORKFLOW_POSTGRES_CONNECT_TIMEOUT`` (seconds one connection may take to open, default 5).

    The first connection is not retried: a server that refuses it or does not answer within
    the connect timeout fails the call at once, and the message names the host, the port and
    the setting the URL came from (``WORKFLOW_POSTGRES_URL``, ``DATABASE_URL`` or ``url=``).

    Raises:
        ConfigurationError: no URL, a malformed setting, an unknown host name, a refused login
            (wrong password, unknown role), a missing privilege (``CREATE`` on the database,
            when the schema is still to be made) or database, a schema newer than this
            world-postgres.
        BackendUnavailableError: the server refused the connection or did not answer within
            the connect timeout; nothing was done.
    """
    namespace = validate_namespace(namespace)
    url, source = _url(url)
    db = Database(
        url=url,
        source=source,
        namespace=namespace,
        pool_size=int(_env_number("WORKFLOW_POSTGRES_POOL_SIZE", DEFAULT_POOL_SIZE, integer=True)),
        retry_seconds=_env_number(
            "WORKFLOW_POSTGRES_RETRY_SECONDS", DEFAULT_RETRY_SECONDS, integer=False
        ),
        connect_timeout=_env_number(
            "WORKFLOW_POSTGRES_CONNECT_TIMEOUT", DEFAULT_CONNECT_TIMEOUT, integer=False
        ),
    )
    await db.open()
    return PostgresWorld(db, namespace)
