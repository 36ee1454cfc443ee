"""The connection pool, migrations, and the one place asyncpg errors are translated."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import logging
import os
import random
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

import asyncpg

from world_core import redact
from world_core.errors import (
    BackendUnavailableError,
    ClosedError,
    ConfigurationError,
    WorldError,
)
from world_postgres._schema import MIGRATIONS

__all__ = ["Conn", "Database", "Target", "is_transient", "tag", "translate"]

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


def _reusable(exc: BaseException) -> bool:
    """Whether a connection whose call raised ``exc`` may go back to the pool: not one in
    doubt (after a transient fault other than a rollback the server asked to retry)."""
    return not is_transient(exc) or _sqlstate(exc) in _TRANSIENT_STATES


def is_missing(exc: BaseException) -> bool:
    return isinstance(exc, asyncpg.PostgresError) and _sqlstate(exc) in _MISSING_STATES


# getaddrinfo's answers for a name that does not exist (a typo), as opposed to EAI_AGAIN (the
# resolver did not answer) and the like, which may pass.
_UNKNOWN_HOST = {
    code for code in (getattr(socket, name, None) for name in ("EAI_NONAME", "EAI_NODATA")) if code
}


@dataclass(frozen=True)
class Target:
    """Where a World connects, as messages show it: never with the password."""

    where: str
    """The URL, redacted."""
    address: str
    """``host:port`` (the first of several hosts; the socket folder for a Unix socket)."""
    source: str
    """Where the URL came from: ``WORKFLOW_POSTGRES_URL``, ``DATABASE_URL`` or ``url=``."""
    connect_timeout: float


def address_of(url: str) -> str:
    """``host:port`` of a ``postgresql://`` URL as asyncpg reads it, for messages only."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    host = unquote(parts.netloc.rpartition("@")[2].split(",")[0])  # the password is left of @
    if not host:
        host = query.get("host", [os.environ.get("PGHOST", "localhost")])[0].split(",")[0]
    if host.startswith("/") or ":" in host.rpartition("]")[2]:  # a socket folder, or a port
        return host
    return f"{host}:{query.get('port', [os.environ.get('PGPORT', '5432')])[0]}"


def _reason(exc: BaseException) -> str:
    """The operating system's words for a socket error, without addresses or Python names."""
    errno = getattr(exc, "errno", None)
    if isinstance(exc, socket.gaierror):
        return exc.strerror or str(exc)
    if isinstance(errno, int) and errno > 0:
        return os.strerror(errno)
    return str(exc) or ("no answer in time" if isinstance(exc, TimeoutError) else "no details")


def _not_connected(what: str, target: Target, exc: BaseException) -> WorldError:
    """The World's first connection failed: it never worked, so nothing is retried or unknown."""
    head = f"{what}: cannot connect to PostgreSQL at {target.address}"
    url = f"{target.source} ({target.where})"
    if isinstance(exc, socket.gaierror) and exc.errno in _UNKNOWN_HOST:
        return ConfigurationError(
            f"{head}: the host name is unknown ({_reason(exc)}); fix the host in {url}"
        )
    if isinstance(exc, asyncpg.PostgresError):  # the server answered: starting, full ...
        return BackendUnavailableError(
            f"{head}: the server refused the connection ({exc}); retry later. Nothing was done."
        )
    if isinstance(exc, TimeoutError):
        reason = (
            f"no answer within {target.connect_timeout:g} s (WORKFLOW_POSTGRES_CONNECT_TIMEOUT)"
        )
    else:
        reason = _reason(exc)
    return BackendUnavailableError(
        f"{head}: {reason}. Check that the server runs and that {url} names the right host "
        "and port. Nothing was done."
    )


def translate(what: str, target: Target, *, first: bool = False) -> _Translate:
    """Translate asyncpg and socket errors raised inside into :mod:`world_core.errors`.

    ``first``: the block opens the World's first connection. Its failure is reported as such
    (the World never worked); later connection failures are transient faults, retried by
    :meth:`Database.run`.
    """
    return _Translate(what, target, first)


class _Translate:
    """The context manager of :func:`translate`: a class rather than a generator, which costs
    about 2 us per call on the append path (measured), all of it on entry and exit."""

    __slots__ = ("first", "target", "what")

    def __init__(self, what: str, target: Target, first: bool) -> None:
        self.what = what
        self.target = target
        self.first = first

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if exc is not None and not isinstance(exc, WorldError):
            translated = _translated(self.what, self.target, exc, self.first)
            if translated is not None:
                raise translated from exc


def _translated(what: str, target: Target, exc: BaseException, first: bool) -> WorldError | None:
    """The error ``exc`` becomes, or None for one that passes as it is (a cancellation)."""
    if isinstance(exc, asyncpg.exceptions.InvalidCatalogNameError):
        return ConfigurationError(
            f"{what}: the database named in {target.source} ({target.where}) does not exist; "
            "create it or point the URL at an existing one"
        )
    if isinstance(exc, asyncpg.exceptions.InvalidAuthorizationSpecificationError):
        # 28000 and 28P01: a wrong password, a role that does not exist, no pg_hba.conf entry.
        return ConfigurationError(
            f"{what}: PostgreSQL at {target.address} refused the login ({exc}); fix the user "
            f"or password in {target.source} ({target.where}), or let the server accept them "
            "(pg_hba.conf)"
        )
    if isinstance(exc, asyncpg.exceptions.InsufficientPrivilegeError):
        return ConfigurationError(
            f"{what}: the PostgreSQL user of {target.source} ({target.where}) lacks a "
            f"privilege ({exc}); grant it CREATE on the database (world-postgres creates and "
            "owns its schema) or use another user"
        )
    if isinstance(exc, asyncpg.exceptions.ClientConfigurationError):
        return ConfigurationError(
            f"{what}: invalid PostgreSQL connection setting in {target.source}: {exc}"
        )
    if first and isinstance(exc, ValueError | OverflowError):
        # asyncpg reads the URL's hosts and ports as it connects: a port that is not a number
        # (ValueError) or past 65535 (OverflowError, from the socket) is a bad setting.
        return ConfigurationError(
            f"{what}: invalid PostgreSQL connection setting in {target.source} "
            f"({target.where}): {redact(str(exc))[:200]}"
        )
    if not isinstance(
        exc,
        asyncpg.PostgresError
        | asyncpg.InterfaceError
        | asyncpg.exceptions.InternalClientError
        | OSError
        | TimeoutError,
    ):
        return None
    if first and (is_transient(exc) or not isinstance(exc, asyncpg.PostgresError)):
        return _not_connected(what, target, exc)
    if is_transient(exc):
        return BackendUnavailableError(
            f"{what}: PostgreSQL at {target.where} is unavailable "
            f"({exc.__class__.__name__}: {_reason(exc)}); retry later. Whether the call "
            "took effect is unknown."
        )
    return WorldError(
        f"{what}: PostgreSQL at {target.where} failed ({exc.__class__.__name__}: {exc}); "
        "this is a bug in world-postgres or a changed schema, please report it"
    )


class _Pool:
    """Idle connections on a stack, at most ``size`` in use.

    asyncpg's own pool runs a reset query on every release and hands each release to a task,
    which together cost about as much as the INSERT an append is compared with. This one
    keeps no session state to reset: a connection comes back only after a clean call, and is
    dropped after a fault, a cancellation, or an open transaction.

    Slots are counted here rather than by an ``asyncio.Semaphore``, whose acquire is a
    coroutine even when a slot is free: ``take`` hands out an idle connection without one
    (the common case of every call). Waiters are served first come, first served; while one
    waits no slot is free, so ``take`` never overtakes it.
    """

    def __init__(self, connect: Callable[[], Awaitable[Conn]], size: int) -> None:
        self._connect = connect
        self._idle: list[Conn] = []
        self._busy: set[Conn] = set()
        self._free = size
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.closed = False

    def take(self) -> Conn | None:
        """An idle connection and its slot at once, or None (no slot is free, or no idle
        connection is open): then ``acquire``."""
        if self._free:
            idle = self._idle
            while idle:
                conn = idle.pop()
                if not conn.is_closed():
                    self._free -= 1
                    self._busy.add(conn)
                    return conn
        return None

    async def acquire(self, within: float) -> Conn:
        conn = self.take()
        if conn is not None:
            return conn
        if self._free:
            self._free -= 1
        else:
            await self._wait_for_slot(within)
        try:
            while self._idle:
                conn = self._idle.pop()
                if not conn.is_closed():
                    break
            else:
                conn = await self._connect()
        except BaseException:
            self._free_slot()
            raise
        self._busy.add(conn)
        return conn

    async def _wait_for_slot(self, within: float) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(within):
                await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._free_slot()  # handed a slot as this caller gave up: pass it on
            else:
                with contextlib.suppress(ValueError):  # already dropped by _free_slot
                    self._waiters.remove(waiter)
            raise

    def _free_slot(self) -> None:
        """Give a slot back: to the first caller still waiting, else to the free ones."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():  # not cancelled
                waiter.set_result(None)
                return
        self._free += 1

    def keep(self, conn: Conn) -> None:
        """Add a connection opened outside the pool to its idle ones."""
        self._idle.append(conn)

    def release(self, conn: Conn, *, reuse: bool, clean: bool = False) -> None:
        """Give a connection back: kept for reuse when ``reuse`` and it is open and outside a
        transaction, else closed. ``clean``: the caller knows that already (its one statement
        just succeeded outside a transaction), so the connection is not asked (two calls, about
        3 us of CPU right after a round trip, with the caches cold; measured alone); one
        closed since is skipped by ``take`` and ``acquire``."""
        self._busy.discard(conn)
        if (
            reuse
            and not self.closed
            and (clean or (not conn.is_closed() and not conn.is_in_transaction()))
        ):
            self._idle.append(conn)
        else:
            conn.terminate()
        self._free_slot()

    async def close(self) -> None:
        self.closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            try:
                await asyncio.wait_for(conn.close(), 2.0)
            except (TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
                conn.terminate()
        for conn in list(self._busy):
            conn.terminate()


def _drop_connection(connecting: asyncio.Future[Conn]) -> None:
    """A connect nobody waits for any more: close what it made, or take its error."""
    if connecting.cancelled():
        return
    if connecting.exception() is None:
        connecting.result().terminate()


class Database:
    """The pool of one World, its schema, and the retry policy shared by every call.

    ``run`` executes an operation on a pooled connection; after a transient fault it runs the
    operation again, with ``retried=True`` so that a write can first check whether its earlier
    try committed, until ``retry_seconds`` have passed. Then the fault surfaces as
    BackendUnavailableError. The first connection (``open``) is not retried: a World that
    never worked fails within ``connect_timeout``, naming the setting to check.
    """

    def __init__(
        self,
        *,
        url: str,
        source: str,
        namespace: str,
        pool_size: int,
        retry_seconds: float,
        connect_timeout: float,
    ) -> None:
        self.url = url
        self.where = redact(url)
        self.target = Target(self.where, address_of(url), source, connect_timeout)
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
        self._pool = _Pool(self.connect, pool_size)

    def check_open(self, what: str) -> None:
        """Raise ClosedError once the World was closed (``run`` does it for every call)."""
        if self._pool.closed:
            raise ClosedError(f"{what}: this World is closed; open a new one")

    def sql(self, text: str) -> str:
        """``text`` with its placeholders filled: the schema (``@s@``, and ``@s_literal@`` as a
        string), the NOTIFY channel and the advisory-lock classes. These, all derived from the
        validated namespace, are the only values ever spliced into SQL besides a claim's count
        (an int, see ``PostgresQueue._claim_sql``); the rest are parameters."""
        return (
            text.replace("@s@", self.schema)
            .replace("@s_literal@", quote_literal(self.schema_name))
            .replace("@channel@", quote_literal(self.channel))
            .replace("@kw@", str(self.writers_class))
            .replace("@kr@", str(self.waiters_class))
        )

    async def connect(self) -> Conn:
        """A new connection (for the pool, and the listener's).

        Not cancelled half-way: asyncpg cancelled within its TLS negotiation (``sslmode``
        prefer, the default) leaves a future whose error nobody retrieves, which the event
        loop reports as an unhandled exception (a worker's lease renewal, cancelled as its
        turn ends, did that). A cancelled caller leaves the connect to finish in the
        background, bounded by ``connect_timeout``, and its connection is closed."""
        connecting = asyncio.ensure_future(
            asyncpg.connect(
                self.url,
                timeout=self.connect_timeout,
                server_settings={"application_name": "world_postgres"},
            )
        )
        try:
            return await asyncio.shield(connecting)
        except asyncio.CancelledError:
            connecting.add_done_callback(_drop_connection)
            raise

    async def open(self) -> None:
        try:
            with translate("open", self.target, first=True):
                first = await self.connect()
            self._pool.keep(first)
            await self.run("open", self._check)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        await self._pool.close()

    async def first_try(
        self, query: str, args: tuple[object, ...]
    ) -> tuple[list[Any] | None, bool]:
        """Run one statement on an idle connection, the first try of a call that has ``run``
        behind it for everything else: no operation to build, no retry loop to set up. For a
        single-event append that is about a third of the CPU it adds to its INSERT (7 to 13 of
        27 to 35 us in a loop like bench_postgres's, measured against a prototype). The
        statement must not open a transaction (``BEGIN``): after it succeeded, its connection
        goes back to the pool unasked (``release``'s ``clean``).

        Returns the statement's rows, or None when no connection was idle or the statement
        failed, and whether it failed in doubt (a transient fault: it may have taken effect).
        A failure is not raised: the call's ``run`` meets it again, translates it, retries
        after it or makes the schema, told by ``retried=True`` that the first try may have
        taken effect when it was in doubt. A cancellation passes; its connection is dropped.
        """
        pool = self._pool
        conn = pool.take()
        if conn is None:
            return None, False
        try:
            rows = await conn.fetch(query, *args)
        except Exception as exc:
            pool.release(conn, reuse=_reusable(exc))
            return None, is_transient(exc)
        except BaseException:
            pool.release(conn, reuse=False)
            raise
        pool.release(conn, reuse=True, clean=True)
        return rows, False

    async def run(
        self,
        what: str,
        op: Callable[[Conn, bool], Awaitable[T]],
        *,
        absent: Callable[[], T] | None = None,
        retried: bool = False,
        stores: bool | None = None,
    ) -> T:
        """Run ``op(connection, retried)``, retrying transient faults for ``retry_seconds``.

        The schema is made by the calls that store something, not by ``open``. Such a call
        (``absent`` None) that finds the schema missing (never made, or dropped by a purge)
        makes it and runs again; any other call answers ``absent()`` instead, the answer of an
        empty namespace, and leaves the database as it was. ``retried``: a first try (see
        ``first_try``) met a transient fault, so that ``op`` is told from the start.
        ``stores``: ``op`` writes (by default, when ``absent`` is None; an ack, which answers
        ``absent`` in an empty namespace, says so), so that cut off by ``aclose`` after it was
        sent, its outcome is unknown: BackendUnavailableError, not ClosedError.
        """
        deadline = time.monotonic() + self.retry_seconds
        delay = 0.05
        remigrated = 0
        pool = self._pool
        if stores is None:
            stores = absent is None
        sent = False  # op was called: what it sent may have taken effect
        while True:
            if pool.closed:
                raise _closed(what, in_doubt=stores and retried)
            try:
                with translate(what, self.target):
                    conn = await pool.acquire(self.connect_timeout)
                    reuse = False
                    try:
                        sent = True
                        result = await op(conn, retried)
                        reuse = True
                        return result
                    except Exception as exc:
                        reuse = _reusable(exc)
                        if not is_missing(exc):
                            raise
                        if absent is not None:
                            return absent()
                        if remigrated >= 3:
                            raise
                    finally:
                        pool.release(conn, reuse=reuse)
                    # The first write to this namespace, or another World purged it: make the
                    # schema and go again.
                    remigrated += 1
                    conn = await pool.acquire(self.connect_timeout)
                    reuse = False
                    try:
                        await self._migrate(conn)
                        reuse = True
                    finally:
                        pool.release(conn, reuse=reuse)
                    retried = True
            except BackendUnavailableError as exc:
                cause = exc.__cause__
                if pool.closed:
                    raise _closed(what, in_doubt=stores and (sent or retried)) from cause
                if cause is None or not is_transient(cause) or time.monotonic() >= deadline:
                    raise
                log.info("%s: retrying after %s", what, cause.__class__.__name__)
                retried = True
                if _sqlstate(cause) not in _TRANSIENT_STATES:
                    await asyncio.sleep(delay * (0.5 + random.random()))
                    delay = min(delay * 2, 1.0)

    # ----------------------------------------------------------------------------------------
    # Migrations
    # ----------------------------------------------------------------------------------------

    async def _check(self, conn: Conn, retried: bool) -> None:
        """What ``open`` does: look, and make nothing. A schema of an older version is
        migrated (its data needs the current layout); a missing one is left to the first
        write, but a user who could not make it is refused now rather than then."""
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
            current = None
        if current is None:
            if not await conn.fetchval(
                "SELECT has_database_privilege(current_database(), 'CREATE')"
            ):
                raise ConfigurationError(
                    f"open: the PostgreSQL user of {self.target.source} ({self.where}) lacks a "
                    f"privilege (permission denied to create schema {self.schema_name}, which "
                    "the first write makes); grant it CREATE on the database (world-postgres "
                    "creates and owns its schema) or use another user"
                )
        elif current > len(MIGRATIONS):
            raise self._too_new(current)
        elif current < len(MIGRATIONS):
            await self._migrate(conn)

    def _too_new(self, version: int) -> ConfigurationError:
        return ConfigurationError(
            f"schema {self.schema_name} is at version {version}, newer than this "
            f"world-postgres knows ({len(MIGRATIONS)}); upgrade world-postgres"
        )

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
                raise self._too_new(current)
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


def _closed(what: str, *, in_doubt: bool) -> WorldError:
    """The error of a call that met the World closed: ClosedError when it wrote nothing; a
    call that stores (``run``'s ``absent`` None) and had sent its statements, which the closing
    cut off before their answer, may have taken effect: BackendUnavailableError, whose outcome
    is unknown (the SPI's ``World.aclose``)."""
    if in_doubt:
        return BackendUnavailableError(
            f"{what}: this World was closed while the call ran, after its statement was sent: "
            "whether it took effect is unknown; read to find out, or repeat it idempotently "
            "on a World opened again"
        )
    return ClosedError(f"{what}: this World is closed; open a new one")
