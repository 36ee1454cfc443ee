"""Tables of one namespace, created idempotently under the write lock by the first call that
stores something (:class:`Store`), never by opening."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from world_core.errors import ConfigurationError
from world_turso._db import Conn, Database, Tx, as_str

__all__ = ["SCHEMA_VERSION", "Store", "Tables"]

SCHEMA_VERSION = 1

T = TypeVar("T")


@dataclass(frozen=True)
class Tables:
    """Quoted table names of a namespace: ``w_<namespace>_<name>``.

    Names after the namespace have no ``_``, so two namespaces never share a table even when
    one namespace is a prefix of another (``a`` / ``a_b``).
    """

    namespace: str

    def _name(self, suffix: str) -> str:
        return f'"w_{self.namespace}_{suffix}"'

    @property
    def meta(self) -> str:
        return self._name("meta")

    @property
    def logs(self) -> str:
        return self._name("logs")

    @property
    def events(self) -> str:
        return self._name("events")

    @property
    def messages(self) -> str:
        return self._name("messages")

    @property
    def dead(self) -> str:
        return self._name("dead")

    @property
    def streams(self) -> str:
        return self._name("streams")

    @property
    def chunks(self) -> str:
        return self._name("chunks")

    @property
    def data(self) -> tuple[str, ...]:
        """Every table holding logs, messages or streams (what ``purge`` empties)."""
        return (self.logs, self.events, self.messages, self.dead, self.streams, self.chunks)

    def exist(self, conn: Conn) -> bool:
        """Whether the namespace's tables exist (``create`` makes them all in one
        transaction, so one of them stands for all); refuses tables of a newer version."""
        if (
            conn.one(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                [self.meta.strip('"')],
            )
            is None
        ):
            return False
        row = conn.one(f"SELECT v FROM {self.meta} WHERE k = 'schema'")
        if row is not None and int(as_str(row[0])) > SCHEMA_VERSION:
            raise self._too_new(as_str(row[0]))
        return True

    def _too_new(self, version: str) -> ConfigurationError:
        return ConfigurationError(
            f"namespace {self.namespace!r} was created by a newer world-turso (schema "
            f"{version!r}, this one knows {SCHEMA_VERSION}); upgrade world-turso"
        )

    def create(self, conn: Conn) -> None:
        """Create what is missing; call inside a write transaction."""
        ns = self.namespace
        for statement in (
            f"CREATE TABLE IF NOT EXISTS {self.meta} (k TEXT PRIMARY KEY, v TEXT NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {self.logs} ("
            " log_id TEXT PRIMARY KEY, tail INTEGER NOT NULL, status TEXT) WITHOUT ROWID",
            f'CREATE INDEX IF NOT EXISTS "w_{ns}_logsstatus" ON {self.logs} (status, log_id)',
            f"CREATE TABLE IF NOT EXISTS {self.events} ("
            " log_id TEXT NOT NULL, seq INTEGER NOT NULL, key TEXT, data BLOB NOT NULL,"
            " PRIMARY KEY (log_id, seq)) WITHOUT ROWID",
            f'CREATE UNIQUE INDEX IF NOT EXISTS "w_{ns}_eventskey" ON {self.events} (log_id, key)'
            " WHERE key IS NOT NULL",
            # n orders enqueues; visible_at is when the message is (again) visible: the enqueue
            # or release time plus delay while ready, the lease deadline while leased.
            f"CREATE TABLE IF NOT EXISTS {self.messages} ("
            " n INTEGER PRIMARY KEY, queue TEXT NOT NULL, id TEXT NOT NULL,"
            " payload BLOB NOT NULL, visible_at REAL NOT NULL, attempts INTEGER NOT NULL,"
            " max_attempts INTEGER NOT NULL, token TEXT, dedup_key TEXT, UNIQUE (queue, id))",
            f'CREATE INDEX IF NOT EXISTS "w_{ns}_messagesvisible" ON {self.messages}'
            " (queue, visible_at, n)",
            f'CREATE UNIQUE INDEX IF NOT EXISTS "w_{ns}_messagesdedup" ON {self.messages}'
            " (queue, dedup_key) WHERE dedup_key IS NOT NULL",
            f"CREATE TABLE IF NOT EXISTS {self.dead} ("
            " n INTEGER PRIMARY KEY, queue TEXT NOT NULL, id TEXT NOT NULL,"
            " payload BLOB NOT NULL, attempts INTEGER NOT NULL, max_attempts INTEGER NOT NULL,"
            " dedup_key TEXT, reason TEXT NOT NULL, UNIQUE (queue, id))",
            f'CREATE INDEX IF NOT EXISTS "w_{ns}_deadqueue" ON {self.dead} (queue, n)',
            f"CREATE TABLE IF NOT EXISTS {self.streams} ("
            " stream_id TEXT PRIMARY KEY, next_index INTEGER NOT NULL,"
            " closed INTEGER NOT NULL) WITHOUT ROWID",
            f"CREATE TABLE IF NOT EXISTS {self.chunks} ("
            " stream_id TEXT NOT NULL, idx INTEGER NOT NULL, data BLOB NOT NULL,"
            " PRIMARY KEY (stream_id, idx)) WITHOUT ROWID",
        ):
            conn.exec(statement)
        row = conn.one(f"SELECT v FROM {self.meta} WHERE k = 'schema'")
        if row is None:
            conn.exec(f"INSERT INTO {self.meta} (k, v) VALUES ('schema', ?)", [str(SCHEMA_VERSION)])
        elif int(as_str(row[0])) > SCHEMA_VERSION:
            raise self._too_new(as_str(row[0]))


class Store:
    """A namespace's tables on a World's database, made by the first call that stores
    something (an append, an enqueue, a stream write or close), in that call's own write
    transaction; every other call on a namespace without them answers as for an empty one
    and leaves the database (and a local file that does not exist) as it was.

    Once the tables are known to exist (seen or made), a call costs nothing more: tables are
    never dropped (``purge`` deletes rows).
    """

    def __init__(self, db: Database, tables: Tables) -> None:
        self.db = db
        self.tables = tables
        self._exist = False

    async def check(self) -> None:
        """What opening does: look whether the tables exist (refusing a newer version)."""
        if not self.db.missing():
            self._exist = await self.db.run(self.tables.exist, tx=Tx.NONE)

    async def write(self, fn: Callable[[Conn], T], *, notify: bool = True) -> T:
        """Run ``fn`` in a write transaction, the tables made first if they may be missing."""
        if self._exist:
            return await self.db.run(fn, tx=Tx.WRITE, notify=notify)
        tables = self.tables

        def made(conn: Conn) -> T:
            tables.create(conn)
            return fn(conn)

        result = await self.db.run(made, tx=Tx.WRITE, notify=notify)
        self._exist = True
        return result

    async def use(
        self, fn: Callable[[Conn], T], absent: Callable[[], T], *, tx: Tx, notify: bool = True
    ) -> T:
        """Run ``fn`` in ``tx``; while the namespace has no tables, ``absent()`` instead (the
        answer of an empty namespace, which may raise), making nothing."""
        if self._exist:
            return await self.db.run(fn, tx=tx, notify=notify)
        if self.db.missing():
            return absent()

        def looked(conn: Conn) -> T:
            if not self.tables.exist(conn):
                return absent()
            self._exist = True
            return fn(conn)

        return await self.db.run(looked, tx=tx, notify=notify)
