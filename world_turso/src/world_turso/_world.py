"""TursoWorld and its factory."""

from __future__ import annotations

from collections.abc import Mapping

from world_core import redact
from world_core.spi import Capabilities, World, validate_namespace
from world_turso._db import Conn, Database, Tx
from world_turso._log import TursoLog
from world_turso._queue import TursoQueue
from world_turso._schema import Store, Tables
from world_turso._settings import Settings, read_settings
from world_turso._stream import TursoStream

__all__ = ["TursoWorld", "connect"]

_CAPABILITIES = Capabilities(outbox=True, shared=True, native_wakeups=False)


class TursoWorld(World):
    """A World on one libSQL database: a local file, a remote server, or an embedded replica.

    Open it with :func:`connect` (or ``open_world("turso")``). One connection per World, used
    from one worker thread at a time; namespaces are table prefixes in the same database.
    Opening creates nothing: the namespace's tables (and a local file that does not exist)
    are made by the first call that stores something.
    """

    name = "turso"

    def __init__(self, store: Store, namespace: str) -> None:
        self.namespace = namespace
        self._db: Database = store.db
        self._store = store
        self.log = TursoLog(store)
        self.queue = TursoQueue(store)
        self.stream = TursoStream(store)

    def __repr__(self) -> str:
        mode = self._db.settings.mode.value
        where = redact(self._db.settings.url)
        return f"<TursoWorld {mode} {where!r} namespace={self.namespace!r}>"

    @property
    def capabilities(self) -> Capabilities:
        return _CAPABILITIES

    def settings(self) -> Mapping[str, str]:
        s: Settings = self._db.settings
        shown = {
            "world": self.name,
            "mode": s.mode.value,
            "url": redact(s.url),
            "namespace": self.namespace,
            "auth_token": "(set, hidden)" if s.auth_token else "(none)",
            "connect_timeout": f"{s.connect_timeout:g}",
            "busy_timeout": f"{s.busy_timeout:g}",
        }
        if s.path is not None:
            shown["path"] = s.path
        return shown

    async def purge(self) -> None:
        tables = self._store.tables

        def run(conn: Conn) -> None:
            for table in tables.data:
                conn.exec(f"DELETE FROM {table}")

        await self._store.use(run, lambda: None, tx=Tx.WRITE)

    async def aclose(self) -> None:
        await self._db.aclose()


async def connect(*, url: str | None = None, namespace: str = "default") -> TursoWorld:
    """Open the Turso/libSQL World (the ``turso`` entry point of ``workflow.worlds``).

    Args:
        url: ``file:`` path, ``libsql://``, ``https://`` or ``http://`` URL; None reads
            ``WORKFLOW_TURSO_URL``. See the package README for the other variables
            (auth token, embedded replica path, timeouts).
        namespace: the table prefix (``w_<namespace>_...``) isolating this World.

    Opening creates nothing: neither the namespace's tables nor a local database file that
    does not exist yet (its folder must exist). Both are made by the first call that stores
    something (an append, an enqueue, a stream write or close), in its own transaction; until
    then reads answer as for an empty namespace. An embedded replica's local file is a copy of
    the server's database and is made (synced) on opening.

    Raises:
        ConfigurationError: no URL, a bad one, or a bad setting (names the variable).
        BackendUnavailableError: the file cannot be opened or the server does not answer
            within ``WORKFLOW_TURSO_CONNECT_TIMEOUT``.
    """
    namespace = validate_namespace(namespace)
    settings = read_settings(url)
    db = await Database.open(settings)
    store = Store(db, Tables(namespace))
    try:
        await store.check()
    except BaseException:
        await db.aclose()
        raise
    return TursoWorld(store, namespace)
