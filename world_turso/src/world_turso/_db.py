"""The one libsql connection of a World: worker-thread calls, transactions, error translation
and wake-ups.

libsql is synchronous and, as of 0.1.11, keeps the GIL for the whole of every call (including
SQLite's busy wait and network round trips), so a call blocks every Python thread while it
runs. Hence: SQLite's busy timeout is 0 and lock waits happen here, as ``anyio.sleep`` between
attempts; remote servers are probed with a bounded asyncio request before libsql touches them.
"""

from __future__ import annotations

import os
import random
import socket
import ssl
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from enum import Enum
from typing import Protocol, TypeVar, cast
from urllib.parse import urlsplit

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread
import libsql

from world_core import redact
from world_core.errors import (
    BackendUnavailableError,
    ClosedError,
    ConfigurationError,
    WorldError,
)
from world_turso._settings import CONNECT_TIMEOUT_VAR, TOKEN_VAR, Mode, Settings

__all__ = ["Conn", "Database", "Param", "Row", "Tx", "Value"]

T = TypeVar("T")
Value = int | float | str | bytes | None
Param = int | float | str | bytes | None
Row = tuple[Value, ...]

# libsql binds a Python int through a 32-bit extraction and falls back to a double, so larger
# ints lose precision; they are bound as text, which INTEGER column affinity converts back.
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1

_BUSY_MARKERS = ("database is locked", "database is busy", "database table is locked")
_LOGIC_MARKERS = (
    "syntax error",
    "no such table",
    "no such column",
    "constraint failed",
    "datatype mismatch",
    "bad parameter or other api misuse",
)

_AUTH_MARKERS = ("status=401", "status=403")  # Hrana: the server refused the auth token
# getaddrinfo's answers for a name that does not exist (a typo), as opposed to EAI_AGAIN (the
# resolver did not answer) and the like, which may pass.
_UNKNOWN_HOST = {
    code for code in (getattr(socket, name, None) for name in ("EAI_NONAME", "EAI_NODATA")) if code
}

_POLL_FLOOR = 0.005  # least time between two data_version checks of one World


class _Cursor(Protocol):
    def fetchall(self) -> list[Row] | None: ...  # None for statements without result columns


class _Driver(Protocol):
    """The part of ``libsql.Connection`` used here (libsql ships no type information)."""

    in_transaction: bool

    def execute(self, sql: str, parameters: Sequence[Param] = ()) -> _Cursor: ...
    def sync(self) -> None: ...
    def close(self) -> None: ...


class Tx(Enum):
    """How :meth:`Database.run` wraps a call."""

    NONE = "none"  # one statement, atomic by itself
    READ = "read"  # BEGIN DEFERRED: several statements read one snapshot
    WRITE = "write"  # BEGIN IMMEDIATE: the write lock taken up front


class _Busy(Exception):
    """The file's write lock is held by another connection; retried by Database.run."""


def _bind(params: Sequence[Param]) -> list[Param]:
    return [str(p) if isinstance(p, int) and not (_I32_MIN <= p <= _I32_MAX) else p for p in params]


class Conn:
    """Typed statements on the driver connection; used only inside a worker-thread call."""

    def __init__(self, driver: _Driver) -> None:
        self._driver = driver

    def rows(self, sql: str, params: Sequence[Param] = ()) -> list[Row]:
        return self._driver.execute(sql, _bind(params)).fetchall() or []

    def one(self, sql: str, params: Sequence[Param] = ()) -> Row | None:
        found = self.rows(sql, params)
        return found[0] if found else None

    def exec(self, sql: str, params: Sequence[Param] = ()) -> None:
        # fetchall drives statements with RETURNING (or PRAGMAs that answer) to completion.
        self._driver.execute(sql, _bind(params)).fetchall()

    def now(self) -> float:
        """The database's clock, UNIX seconds with millisecond precision."""
        row = self.one("SELECT unixepoch('subsec')")
        assert row is not None
        return as_float(row[0])


def as_int(value: Value) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise WorldError(f"libSQL returned {value!r} where an integer is stored; is the file sane?")


def as_float(value: Value) -> float:
    if isinstance(value, int | float):
        return float(value)
    raise WorldError(f"libSQL returned {value!r} where a number is stored; is the file sane?")


def as_str(value: Value) -> str:
    if isinstance(value, str):
        return value
    raise WorldError(f"libSQL returned {value!r} where text is stored; is the file sane?")


def as_opt_str(value: Value) -> str | None:
    return None if value is None else as_str(value)


def as_bytes(value: Value) -> bytes:
    if isinstance(value, bytes):
        return value
    raise WorldError(f"libSQL returned {type(value).__name__} where bytes are stored")


class _Changes:
    """A counter of commits seen by this process, with an event for waiters: made by the
    first waiter after a commit, so a commit nobody waits for makes none."""

    def __init__(self) -> None:
        self.count = 0
        self._event: anyio.Event | None = None

    def notify(self) -> None:
        self.count += 1
        event, self._event = self._event, None
        if event is not None:
            event.set()

    async def wait(self, since: int, within: float) -> bool:
        if self.count == since:
            if self._event is None:
                self._event = anyio.Event()
            with anyio.move_on_after(within):
                await self._event.wait()
        return self.count != since


class _Unopened:
    """The connection of a local database file that did not exist when the World opened."""


class Database:
    """A World's libsql connection, used by one thread at a time.

    Every call runs as one function inside the transaction the caller asks for, holding a
    capacity limiter of 1, so a transaction never interleaves with another call of the same
    World and is never left open: on the event loop's thread when the limiter is free (libsql
    keeps the GIL for the whole of its calls, so a worker thread would not free the loop), else
    in a worker thread (``anyio.to_thread.run_sync``) once it is.

    A local file that does not exist yet is not created by opening: the connection is opened,
    creating the file, by the first call that runs (callers that only read ask
    :meth:`missing` first and answer without a call).
    """

    def __init__(self, settings: Settings, driver: _Driver | _Unopened) -> None:
        self.settings = settings
        self._driver: _Driver | _Unopened | None = driver  # None once closed
        self._prepared = not isinstance(driver, _Unopened)
        self._limiter = anyio.CapacityLimiter(1)
        self._changes = _Changes()
        self._data_version = 0
        self._last_poll = 0.0
        self._polling = False
        self._where = redact(settings.url)

    # -- opening -------------------------------------------------------------------------

    @classmethod
    async def open(cls, settings: Settings) -> Database:
        """Connect (probing a remote server first, within ``connect_timeout``). A local file
        that does not exist is left to the first call that needs it (see :meth:`missing`)."""
        if settings.mode is Mode.LOCAL:
            db = cls(settings, _Unopened())
            try:
                if not db.missing():  # an existing file: open it now, so its faults show now
                    await db.run(_nothing, tx=Tx.NONE)
            except BaseException:
                await db.aclose()
                raise
            return db
        if settings.remote_url is not None:
            await _probe(settings)
        driver = await anyio.to_thread.run_sync(_connect, settings)
        db = cls(settings, driver)
        try:
            if settings.mode is Mode.REPLICA:
                await db.sync()
            db._data_version = await db.run(_data_version, tx=Tx.NONE)
        except BaseException:
            await db.aclose()
            raise
        return db

    def missing(self) -> bool:
        """True while the local database file does not exist and this World has not made it:
        there is nothing to read, and looking would create it."""
        path = self.settings.path
        return isinstance(self._driver, _Unopened) and path is not None and not os.path.exists(path)

    # -- calls ---------------------------------------------------------------------------

    async def run(self, fn: Callable[[Conn], T], *, tx: Tx, notify: bool = True) -> T:
        """Run ``fn`` in the worker thread inside ``tx``; retry while the file is locked.

        A WRITE that returns wakes this process's waiters (unless ``notify`` is False).

        Raises:
            ClosedError: the World was closed.
            BackendUnavailableError: the lock stayed taken for ``busy_timeout`` seconds, or the
                file or server failed.
        """
        deadline = time.monotonic() + self.settings.busy_timeout
        delay = 0.001
        while True:
            try:
                result = await self._attempt(fn, tx)
            except _Busy as exc:
                if time.monotonic() >= deadline:
                    raise BackendUnavailableError(
                        f"the database {self._where} stayed locked by another connection for "
                        f"{self.settings.busy_timeout:g} s; retry later, or raise "
                        "WORKFLOW_TURSO_BUSY_TIMEOUT if long transactions are expected"
                    ) from exc
                await anyio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.05)
                continue
            except BaseException:
                # Cancelled while the thread finished the call: it may have committed.
                if tx is Tx.WRITE and notify:
                    self._changes.notify()
                raise
            if tx is Tx.WRITE and notify:
                self._changes.notify()
            return result

    async def _attempt(self, fn: Callable[[Conn], T], tx: Tx) -> T:
        """One try of ``fn`` inside ``tx``: on this thread if the connection is free, else in
        the worker thread once it is.

        libsql keeps the GIL for the whole of each of its calls (commit and fsync included), so
        the event loop waits for a worker thread's statement exactly as long as for one run
        here; the hop to the thread and back only adds its own cost (about as much CPU as the
        statements of an append). The checkpoint first is the call's one cancellation point,
        before anything is done, and gives the other tasks their turn as the hop did; nothing
        after it awaits, so a started call runs to its end."""
        await anyio.lowlevel.checkpoint()
        try:
            self._limiter.acquire_nowait()  # refused while a call runs or another task waits
        except anyio.WouldBlock:
            return await anyio.to_thread.run_sync(self._call, fn, tx, limiter=self._limiter)
        try:
            return self._call(fn, tx)
        finally:
            self._limiter.release()

    def check_open(self) -> None:
        """Raise ClosedError once the World was closed."""
        if self._driver is None:
            raise ClosedError("this Turso World is closed; open a new one")

    def _call(self, fn: Callable[[Conn], T], tx: Tx) -> T:
        driver = self._driver
        if driver is None:
            raise ClosedError("this Turso World is closed; open a new one")
        if isinstance(driver, _Unopened):  # a local file, opened (created) at its first use
            driver = self._driver = _connect(self.settings)
        conn = Conn(driver)
        if not self._prepared:
            # Apart from the call: a busy file is retried by run() without the connect again.
            with _translating(self._where, self.settings.auth_token, "a statement"):
                _use_wal(conn)
                self._data_version = _data_version(conn)
            self._prepared = True
        with _translating(self._where, self.settings.auth_token, "a statement"):
            if tx is Tx.NONE:
                return fn(conn)
            driver.execute("BEGIN IMMEDIATE" if tx is Tx.WRITE else "BEGIN").fetchall()
            try:
                result = fn(conn)
                driver.execute("COMMIT").fetchall()
            except BaseException:
                if driver.in_transaction:
                    # A failing ROLLBACK means a broken connection; the original error says why.
                    with suppress(ValueError):
                        driver.execute("ROLLBACK").fetchall()
                raise
            if tx is Tx.WRITE and self.settings.mode is Mode.REPLICA:
                driver.sync()  # read-your-writes from the local copy
            return result

    async def sync(self) -> None:
        """Pull the primary's changes into an embedded replica (no-op for other modes)."""
        if self.settings.mode is Mode.REPLICA:
            await self.run(_sync, tx=Tx.NONE)

    # -- wake-ups ------------------------------------------------------------------------

    def snapshot(self) -> int:
        """Take before a query; pass to :meth:`wait` after it found nothing new."""
        return self._changes.count

    async def wait(self, since: int, within: float) -> bool:
        """Wait up to ``within`` s for a commit after ``since``; True when one may have happened.

        Commits of this World wake at once. Other connections' commits (other Worlds, other
        processes) are looked for when a waiter's time is up, at most one check per World at a
        time: ``PRAGMA data_version`` on a local file; a sync for an embedded replica. A
        remote database has no cheap change signal: False, and the waiter's next query (after
        its backoff) is the poll.
        """
        if await self._changes.wait(since, within):
            return True
        if self._driver is None:
            raise ClosedError("this Turso World is closed; open a new one")
        if self.settings.mode is Mode.REMOTE or self.missing():
            return False  # no file yet: the waiter's next look is the poll
        if self._polling or time.monotonic() - self._last_poll < _POLL_FLOOR:
            return self._changes.count != since
        self._polling = True
        try:
            if self.settings.mode is Mode.REPLICA:
                await self.run(_sync, tx=Tx.NONE)
                return self._changes.count != since
            version = await self.run(_data_version, tx=Tx.NONE)
        finally:
            self._polling = False
            self._last_poll = time.monotonic()
        if version != self._data_version:
            self._data_version = version
            self._changes.notify()
        return self._changes.count != since

    # -- closing -------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Wait for the call in progress, then close the connection. Idempotent."""
        async with self._limiter:
            driver, self._driver = self._driver, None
        if driver is not None and not isinstance(driver, _Unopened):
            await anyio.to_thread.run_sync(_close, driver)
        self._changes.notify()  # waiters wake, see the World closed and stop


def _connect(settings: Settings) -> _Driver:
    with _translating(redact(settings.url), settings.auth_token, "connect"):
        if settings.mode is Mode.LOCAL:
            raw = libsql.connect(settings.path, isolation_level=None, timeout=0.0)
        elif settings.mode is Mode.REMOTE:
            raw = libsql.connect(
                settings.remote_url, isolation_level=None, auth_token=settings.auth_token
            )
        else:
            raw = libsql.connect(
                settings.path,
                isolation_level=None,
                timeout=0.0,
                sync_url=settings.remote_url,
                auth_token=settings.auth_token,
            )
        return cast(_Driver, raw)


def _nothing(conn: Conn) -> None:
    """A call that only opens the connection."""


def _close(driver: _Driver) -> None:
    with suppress(ValueError):  # a broken connection has nothing left to release
        driver.close()


def _use_wal(conn: Conn) -> None:
    row = conn.one("PRAGMA journal_mode=WAL")
    mode = str(row[0]).lower() if row else "?"
    if mode != "wal":
        raise ConfigurationError(
            f"the database file cannot use write-ahead logging (journal_mode is {mode!r}); "
            "put WORKFLOW_TURSO_URL on a local file system"
        )
    conn.exec("PRAGMA synchronous=FULL")


def _data_version(conn: Conn) -> int:
    row = conn.one("PRAGMA data_version")
    return as_int(row[0]) if row else 0


def _sync(conn: Conn) -> None:
    conn._driver.sync()


@contextmanager
def _translating(where: str, secret: str, what: str) -> Iterator[None]:
    """Turn libsql's exceptions (plain ValueError with SQLite's or Hrana's message) into
    world_core errors, without the auth token."""
    try:
        yield
    except WorldError:
        raise
    except Exception as exc:
        if type(exc) is not ValueError and not isinstance(exc, libsql.Error):
            raise
        message = str(exc)
        if secret:
            message = message.replace(secret, "***")
        cause = exc if not secret or secret not in str(exc) else None
        lowered = message.lower()
        if any(marker in lowered for marker in _AUTH_MARKERS):
            raise ConfigurationError(
                f"the libSQL server {where} refused {what}: {message}. Set {TOKEN_VAR} to a "
                "valid auth token for this database"
            ) from cause
        if any(marker in lowered for marker in _BUSY_MARKERS):
            raise _Busy(message) from cause
        if any(marker in lowered for marker in _LOGIC_MARKERS):
            raise WorldError(
                f"libSQL refused {what} on {where}: {message}. The schema may have been "
                "changed by hand, or this is a bug in world_turso: please report it"
            ) from cause
        raise BackendUnavailableError(
            f"libSQL failed on {what} at {where}: {message}. Check that the database is "
            "reachable (file permissions, disk, server, auth token) and retry"
        ) from cause


async def _probe(settings: Settings) -> None:
    """Fail fast when the server does not answer HTTP: libsql itself would wait (holding the
    GIL) for as long as the peer keeps the connection open."""
    url = settings.remote_url
    assert url is not None
    parts = urlsplit(url)
    host = parts.hostname or ""
    tls = parts.scheme.lower() != "http" and "tls=0" not in parts.query.lower()
    port = parts.port or (443 if tls else 80)
    where = redact(settings.url)
    timeout = settings.connect_timeout
    head = b""
    try:
        with anyio.fail_after(timeout):
            stream: anyio.abc.ByteStream
            if tls:
                stream = await anyio.connect_tcp(
                    host,
                    port,
                    ssl_context=ssl.create_default_context(),
                    tls_standard_compatible=False,
                )
            else:
                stream = await anyio.connect_tcp(host, port)
            async with stream:
                request = (
                    f"GET /health HTTP/1.1\r\nHost: {host}\r\nUser-Agent: world-turso\r\n"
                    "Connection: close\r\n\r\n"
                )
                await stream.send(request.encode("ascii", "replace"))
                while b"\r\n" not in head and len(head) < 4096:
                    head += await stream.receive()
    except TimeoutError as exc:
        raise BackendUnavailableError(
            f"cannot reach the libSQL server at {host}:{port}: no answer within {timeout:g} s "
            f"({CONNECT_TIMEOUT_VAR}). Check that the server is up and that {settings.source} "
            f"({where}) names the right host and port. Nothing was done."
        ) from exc
    except (OSError, ssl.SSLError, anyio.EndOfStream, anyio.BrokenResourceError) as exc:
        reason = _reason(exc)
        if isinstance(exc, socket.gaierror) and exc.errno in _UNKNOWN_HOST:
            raise ConfigurationError(
                f"cannot reach the libSQL server at {host}:{port}: the host name is unknown "
                f"({reason}); fix the host in {settings.source} ({where})"
            ) from exc
        raise BackendUnavailableError(
            f"cannot reach the libSQL server at {host}:{port}: {reason}. Check that the server "
            f"is up and that {settings.source} ({where}) names the right host and port. "
            "Nothing was done."
        ) from exc
    if not head.startswith(b"HTTP/"):
        raise BackendUnavailableError(
            f"{where} answered, but not as an HTTP server; is it a libSQL server (sqld) or "
            "Turso URL? (libsql:// and https:// use TLS; http:// does not)"
        )


def _reason(exc: BaseException) -> str:
    """The operating system's words for a socket error (anyio chains the last attempt's under
    "All connection attempts failed"), else the exception's."""
    if isinstance(exc, socket.gaierror):
        return exc.strerror or str(exc)
    found: BaseException | None = exc
    while found is not None:
        errno = getattr(found, "errno", None)
        if isinstance(found, OSError) and isinstance(errno, int) and errno > 0:
            return os.strerror(errno)
        found = found.__cause__
    return str(exc) or type(exc).__name__
