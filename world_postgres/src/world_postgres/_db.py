"""The connection pool, migrations, and the one place asyncpg errors are translated."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import asyncpg

from world_core import redact
from world_core.errors import (
    BackendUnavailableError,
    ClosedError,
    ConfigurationError,
    WorldError,
)
from world_postgres._schema import MIGRATIONS

__all__ = ["Conn", "Database", "is_transient", "tag", "translate"]

T = TypeVar("T")
Conn = Any
"""An asyncpg connection (asyncpg ships no type information)."""

log = logging.getLogger("world_postgres")

# SQLSTATE classes after which the same call may simply run again: connection exceptions,
# insufficient resources, operator intervention (shutdown, restart), system errors, and the
# transaction rollbacks PostgreSQL asks the client to retry.
_TRANSIENT_CLASSES = ("08", "53", "57", "58")
_TRANSIENT_STATES = ("40001", "40P01", "55P03")
# The schema or one of its objects is gone: another World purged this namespace.
_MISSING_STATES = ("3F000", "42P01", "42883")


def tag(kind: str, ident: str) -> str:
    """The NOTIFY payload naming what changed: a fixed-size routing tag, never data."""
    return kind + hashlib.md5(ident.encode("utf-8"), usedforsecurity=False).hexdigest()


def _int32(hex8: str) -> int:
    value = int(hex8, 16)
    return value - (1 << 32) if value >= 1 << 31 else value


def tag_key(tag: str) -> int:
    """The advisory-lock key of a tag, as ``wake()`` computes it in SQL."""
    return _int32(tag[1:9])


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _sqlstate(exc: BaseException) -> str:
    state = getattr(exc, "sqlstate", None)
    return state if isinstance(state, str) else ""


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a fault after which the same call may run again."""
    if isinstance(exc, asyncpg.PostgresError):
        state = _sqlstate(exc)
        return state.startswith(_TRANSIENT_CLASSES) or state in _TRANSIENT_STATES
    if isinstance(exc, asyncpg.exceptions.ClientConfigurationError):
        return False
    # InternalClientError: a pooled connection caught between the server's FATAL message and
    # the socket's end (a restart) is in no state to run anything; a fresh one is.
    return isinstance(
        exc,
        OSError | TimeoutError | asyncpg.InterfaceError | asyncpg.exceptions.InternalClientError,
    )


def is_missing(exc: BaseException) -> bool:
    return isinstance(exc, asyncpg.PostgresError) and _sqlstate(exc) in _MISSING_STATES


@contextmanager
def translate(what: str, where: str) -> Iterator[None]:
    """Translate asyncpg and socket errors raised inside into :mod:`world_core.errors`."""
    try:
        yield
    except WorldError:
        raise
    except asyncpg.exceptions.InvalidPasswordError as exc:
        raise ConfigurationError(
            f"{what}: PostgreSQL at {where} refused the credentials; fix the user or password "
            "in WORKFLOW_POSTGRES_URL (or DATABASE_URL)"
        ) from exc
    except asyncpg.exceptions.InvalidCatalogNameError as exc:
        raise ConfigurationError(
            f"{what}: the database named in WORKFLOW_POSTGRES_URL ({where}) does not exist; "
            "create it or point the URL at an existing one"
        ) from exc
    except asyncpg.exceptions.InsufficientPrivilegeError as exc:
        raise ConfigurationError(
            f"{what}: the PostgreSQL user lacks a privilege ({exc.__class__.__name__}: "
            f"{exc}); grant CREATE on the database or use another user"
        ) from exc
    except asyncpg.exceptions.ClientConfigurationError as exc:
        raise ConfigurationError(f"{what}: invalid PostgreSQL connection setting: {exc}") from exc
    except (
        asyncpg.PostgresError,
        asyncpg.InterfaceError,
        asyncpg.exceptions.InternalClientError,
        OSError,
        TimeoutError,
    ) as exc:
        if isinstance(exc, asyncpg.InterfaceError) and "pool is clos" in str(exc):
            raise ClosedError(f"{what}: this World is closed; open a new one") from exc
        if is_transient(exc):
            raise BackendUnavailableError(
                f"{what}: PostgreSQL at {where} is unavailable "
                f"({exc.__class__.__name__}); retry later. Whether the call took effect is "
                "unknown."
            ) from exc
        raise WorldError(
            f"{what}: PostgreSQL at {where} failed ({exc.__class__.__name__}: {exc}); "
            "this is a bug in world-postgres or a changed schema, please report it"
        ) from exc


class Database:
    """The pool of one World, its schema, and the retry policy shared by every call.

    ``run`` executes an operation on a pooled connection; after a transient fault it runs the
    operation again, with ``retried=True`` so that a write can first check whether its earlier
    try committed, until ``retry_seconds`` have passed. Then the fault surfaces as
    BackendUnavailableError.
    """

    def __init__(
        self,
        *,
        url: str,
        namespace: str,
        pool_size: int,
        retry_seconds: float,
        connect_timeout: float,
    ) -> None:
        self.url = url
        self.where = redact(url)
        self.schema_name = f"world_{namespace}"
        self.schema = quote_ident(self.schema_name)
        self.channel = f"world_{namespace}"
        # Advisory-lock classes of wake(): writers in flight, and registered waiters.
        digest = hashlib.md5(self.schema_name.encode(), usedforsecurity=False).hexdigest()
        self.writers_class = _int32(digest[:8])
        self.waiters_class = _int32(digest[8:16])
        self.pool_size = pool_size
        self.retry_seconds = retry_seconds
        self.connect_timeout = connect_timeout
        self._pool: Any = None
        self._closed = False

    def sql(self, text: str) -> str:
        """``text`` with ``@s@`` replaced by the schema (the only name spliced into SQL)."""
        return (
            text.replace("@s@", self.schema)
            .replace("@s_literal@", quote_literal(self.schema_name))
            .replace("@channel@", quote_literal(self.channel))
            .replace("@kw@", str(self.writers_class))
            .replace("@kr@", str(self.waiters_class))
        )

    async def connect(self, **kwargs: Any) -> Conn:
        """A connection outside the pool (the listener's)."""
        return await asyncpg.connect(
            self.url,
            timeout=self.connect_timeout,
            server_settings={"application_name": "world_postgres"},
            **kwargs,
        )

    async def open(self) -> None:
        deadline = time.monotonic() + self.retry_seconds
        while True:
            try:
                with translate("open", self.where):
                    self._pool = await asyncpg.create_pool(
                        self.url,
                        min_size=1,
                        max_size=self.pool_size,
                        timeout=self.connect_timeout,
                        max_inactive_connection_lifetime=60.0,
                        server_settings={"application_name": "world_postgres"},
                    )
                break
            except BackendUnavailableError:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.2)
        try:
            await self.run("open", self._check_and_migrate)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await asyncio.wait_for(pool.close(), timeout=5.0)
            except (TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
                pool.terminate()

    async def run(self, what: str, op: Callable[[Conn, bool], Awaitable[T]]) -> T:
        """Run ``op(connection, retried)``, retrying transient faults for ``retry_seconds``."""
        deadline = time.monotonic() + self.retry_seconds
        retried = False
        delay = 0.05
        remigrated = 0
        while True:
            if self._closed or self._pool is None:
                raise ClosedError(f"{what}: this World is closed; open a new one")
            try:
                with translate(what, self.where):
                    try:
                        async with self._pool.acquire(timeout=self.connect_timeout) as conn:
                            try:
                                return await op(conn, retried)
                            except Exception as exc:
                                if is_transient(exc) and _sqlstate(exc) not in _TRANSIENT_STATES:
                                    # Never hand a connection in doubt back to the pool.
                                    conn.terminate()
                                raise
                    except Exception as exc:
                        if is_missing(exc) and remigrated < 3:
                            # Another World purged the namespace: recreate it and go again.
                            remigrated += 1
                            async with self._pool.acquire(timeout=self.connect_timeout) as conn:
                                await self._migrate(conn)
                            retried = True
                            continue
                        raise
            except BackendUnavailableError as exc:
                cause = exc.__cause__
                if self._closed:
                    raise ClosedError(f"{what}: this World is closed; open a new one") from cause
                if cause is None or not is_transient(cause) or time.monotonic() >= deadline:
                    raise
                log.info("%s: retrying after %s", what, cause.__class__.__name__)
                retried = True
                state = _sqlstate(cause)
                if state not in _TRANSIENT_STATES:
                    await asyncio.sleep(delay * (0.5 + random.random()))
                    delay = min(delay * 2, 1.0)

    # ----------------------------------------------------------------------------------------
    # Migrations
    # ----------------------------------------------------------------------------------------

    async def _check_and_migrate(self, conn: Conn, retried: bool) -> None:
        encoding = await conn.fetchval("SHOW server_encoding")
        if encoding != "UTF8":
            raise ConfigurationError(
                f"the database at {self.where} uses encoding {encoding}; world-postgres needs a "
                "UTF8 database (CREATE DATABASE ... ENCODING 'UTF8')"
            )
        try:
            current = await conn.fetchval(
                self.sql("SELECT coalesce(max(version), 0) FROM @s@.migrations")
            )
        except (asyncpg.exceptions.UndefinedTableError, asyncpg.exceptions.InvalidSchemaNameError):
            current = 0
        if current != len(MIGRATIONS):
            await self._migrate(conn)

    async def _migrate(self, conn: Conn) -> None:
        """Bring the schema to the latest version; many processes may call this at once."""
        async with conn.transaction():
            # Serialises migrations and purges of this schema across processes; the lock goes
            # with the transaction, so a crashed migrator never leaves it held.
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext('world_postgres.migrate'), hashtext($1))",
                self.schema_name,
            )
            await conn.execute(self.sql("CREATE SCHEMA IF NOT EXISTS @s@"))
            await conn.execute(
                self.sql(
                    "CREATE TABLE IF NOT EXISTS @s@.migrations ("
                    " version integer PRIMARY KEY, name text NOT NULL,"
                    " applied_at timestamptz NOT NULL DEFAULT now())"
                )
            )
            current = await conn.fetchval(
                self.sql("SELECT coalesce(max(version), 0) FROM @s@.migrations")
            )
            if current > len(MIGRATIONS):
                raise ConfigurationError(
                    f"schema {self.schema_name} is at version {current}, newer than this "
                    f"world-postgres knows ({len(MIGRATIONS)}); upgrade world-postgres"
                )
            for version, (name, statements) in enumerate(MIGRATIONS, start=1):
                if version <= current:
                    continue
                for statement in statements:
                    await conn.execute(self.sql(statement))
                await conn.execute(
                    self.sql("INSERT INTO @s@.migrations (version, name) VALUES ($1, $2)"),
                    version,
                    name,
                )
                log.info("migrated schema %s to version %d", self.schema_name, version)

    async def purge(self) -> None:
        async def op(conn: Conn, retried: bool) -> None:
            async with conn.transaction():
                await conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtext('world_postgres.migrate'),"
                    " hashtext($1))",
                    self.schema_name,
                )
                await conn.execute(self.sql("DROP SCHEMA IF EXISTS @s@ CASCADE"))

        await self.run("purge", op)
