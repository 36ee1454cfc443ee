"""MongoWorld and its factory."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
from collections.abc import Mapping
from typing import Any

import pymongo
from pymongo import AsyncMongoClient, IndexModel, monitoring
from pymongo import errors as pe
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.uri_parser import parse_uri

from world_core import redact
from world_core.errors import ClosedError, ConfigurationError
from world_core.spi import Capabilities, World, validate_namespace
from world_mongo._errors import CONNECT_TIMEOUT_VARIABLE, URL_VARIABLE, Opening, translate
from world_mongo._log import MongoLog
from world_mongo._queue import MongoQueue, queue_indexes
from world_mongo._segments import Doc, Segments
from world_mongo._stream import MongoStream
from world_mongo._wakeup import Backoff, Notifier, follow_change_stream, notifier_for

__all__ = [
    "CONNECT_TIMEOUT_VARIABLE",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_DATABASE",
    "URL_VARIABLE",
    "MongoWorld",
    "connect",
]

DEFAULT_CONNECT_TIMEOUT = 5.0
"""Seconds a World may take to reach its server when it opens (``WORKFLOW_MONGO_CONNECT_TIMEOUT``),
and the ``connectTimeoutMS`` of every later connection unless the URL sets one."""
DEFAULT_SERVER_SELECTION_MS = 10_000
"""How long a call of an open World waits for a server (a failover, a restart) unless the URL
sets ``serverSelectionTimeoutMS``."""
DEFAULT_DATABASE = "world"
"""Used when the URL names no database (``mongodb://host/`` rather than ``.../mydb``)."""

POLL_MIN = 0.01
POLL_MAX = 0.5
"""Polling bounds without change streams: idle waiters query at most twice a second."""
POLL_MAX_WITH_CHANGE_STREAM = 2.0
"""With change streams, polling stays on as a safety net (and for delayed messages)."""

_INDEX_RACE_CODES = {
    48,  # NamespaceExists: another process created the collection first
    85,  # IndexOptionsConflict, transiently while another process builds the same index
    276,  # IndexBuildAborted
    11000,  # a concurrent build of the same unique index observed mid-way
}


class MongoWorld(World):
    """A World in one MongoDB database; ``namespace`` prefixes its collection names.

    Collections ``world.<namespace>.log_heads``, ``.log_segments``, ``.stream_heads``,
    ``.stream_segments`` and ``.queue``. See the package README for the design and for which
    guarantee rests on what.

    Opening creates nothing: the collections and their indexes are made by the first call
    that stores something (an append, an enqueue, a stream write or close), before its first
    document, once per World. Reads of a namespace that has none answer as empty.
    """

    name = "mongo"

    def __init__(
        self,
        client: AsyncMongoClient[Doc],
        *,
        url: str,
        database: str,
        namespace: str,
        replica_set: bool,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        self.namespace = namespace
        self._connect_timeout = connect_timeout
        self._client = client
        self._url = url
        self._database = database
        self._prefix = f"world.{namespace}."
        self._replica_set = replica_set
        self._closed = False
        db = client[database]
        self._db = db
        self._collections: dict[str, AsyncCollection[Doc]] = {
            kind: db[self._prefix + kind]
            for kind in ("log_heads", "log_segments", "stream_heads", "stream_segments", "queue")
        }
        c = self._collections
        self._log_segments = Segments(c["log_heads"], c["log_segments"], keyed=True)
        self._stream_segments = Segments(c["stream_heads"], c["stream_segments"], keyed=False)
        nodes = tuple(sorted(f"{h}:{p}" for h, p in parse_uri(url)["nodelist"]))
        self.notifier: Notifier = notifier_for((nodes, database, self._prefix))
        self.log = MongoLog(self, self._log_segments)
        self.queue = MongoQueue(self, c["queue"])
        self.stream = MongoStream(self, self._stream_segments)
        self._relay: asyncio.Task[None] | None = None
        self._relay_live = False
        self._made = False
        self._making = asyncio.Lock()

    def __repr__(self) -> str:
        return f"MongoWorld(database={self._database!r}, namespace={self.namespace!r})"

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(outbox=False, shared=True, native_wakeups=self._replica_set)

    def settings(self) -> Mapping[str, str]:
        return {
            URL_VARIABLE: redact(self._url),
            "WORKFLOW_NAMESPACE": self.namespace,
            "database": self._database,
            "collection_prefix": self._prefix,
            "wakeups": "change streams + polling" if self._replica_set else "polling",
            CONNECT_TIMEOUT_VARIABLE: f"{self._connect_timeout:g}",
        }

    @property
    def closed(self) -> bool:
        """True after ``aclose``."""
        return self._closed

    def check_open(self) -> None:
        if self._closed:
            raise ClosedError("this MongoWorld is closed: open a new one with open_world()")

    def new_backoff(self) -> Backoff:
        return Backoff(POLL_MIN, POLL_MAX_WITH_CHANGE_STREAM if self._relay_live else POLL_MAX)

    def _set_relay_live(self, live: bool) -> None:
        self._relay_live = live

    async def make_storage(self) -> None:
        """Create the namespace's collections and indexes if missing. Every call that stores
        a document awaits this first: the unique indexes must exist before the first document.
        The work is done once per World (concurrent first calls wait for one another); other
        Worlds and processes may do it at the same time, which is harmless."""
        if self._made:
            return
        async with self._making:
            if not self._made:  # unless a concurrent first call did it meanwhile
                await self._make_storage()

    async def _make_storage(self) -> None:
        c = self._collections
        plan: dict[str, list[IndexModel]] = {
            "log_heads": [IndexModel([("status", 1), ("_id", 1)], name="status_id")],
            "log_segments": self._log_segments.segment_indexes(),
            "stream_segments": self._stream_segments.segment_indexes(),
            "queue": queue_indexes(),
        }
        with translate("create indexes"):
            for kind, models in plan.items():
                await _create_indexes(c[kind], models)
        self._made = True

    async def _open(self) -> None:
        if self._replica_set:
            c = self._collections
            kinds = {
                c["log_heads"].name: "log",
                c["stream_heads"].name: "stream",
                c["queue"].name: "queue",
            }
            self._relay = asyncio.create_task(
                follow_change_stream(self._db, kinds, self.notifier, self._set_relay_live)
            )

    async def purge(self) -> None:
        self.check_open()
        self._log_segments.forget()
        self._stream_segments.forget()
        with translate("purge the namespace"):
            for coll in self._collections.values():
                await coll.delete_many({})
        for kind in ("log", "stream", "queue"):
            self.notifier.notify(kind)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._relay is not None:
            self._relay.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._relay
        # Waiters in this process notice the close at their next turn.
        for kind in ("log", "stream", "queue"):
            self.notifier.notify(kind)
        await self._client.close()


async def _create_indexes(coll: AsyncCollection[Doc], models: list[IndexModel]) -> None:
    """Idempotent; tolerates other processes creating the same indexes at the same time."""
    for attempt in range(5):
        try:
            await coll.create_indexes(models)
            return
        except pe.OperationFailure as exc:
            if exc.code not in _INDEX_RACE_CODES or attempt == 4:
                raise
            await asyncio.sleep(0.05 * (attempt + 1))


async def connect(*, url: str | None = None, namespace: str = "default") -> MongoWorld:
    """Open a MongoWorld. Creates nothing: the namespace's collections and indexes are made by
    its first write (see :class:`MongoWorld`).

    Args:
        url: a ``mongodb://`` or ``mongodb+srv://`` URL; None reads ``WORKFLOW_MONGO_URL``.
            The database is the URL's path (``.../mydb``), else ``world``.
        namespace: prefixes every collection name (``world.<namespace>.``), so namespaces
            share one database and never see each other's data.

    ``WORKFLOW_MONGO_CONNECT_TIMEOUT`` (seconds, default 5) bounds the first command: a server
    that cannot be reached fails the call then (at once when every server refused the
    connection or has an unknown name), naming the hosts, the system's reason and where the URL
    came from (``WORKFLOW_MONGO_URL`` or ``url=``). Calls of an open World wait up to
    ``serverSelectionTimeoutMS`` (default 10 s) for a server instead.

    Raises:
        ConfigurationError: no URL, a URL pymongo refuses (the message never shows it
            unredacted), a bad connect timeout, an unknown host name, refused credentials.
        BackendUnavailableError: the server refused the connection or did not answer within
            the connect timeout; nothing was done.
    """
    validate_namespace(namespace)
    source = "url="
    if url is None:
        url, source = os.environ.get(URL_VARIABLE, "").strip(), URL_VARIABLE
        if not url:
            raise ConfigurationError(
                f"{URL_VARIABLE} is not set: set it to your MongoDB URL, "
                "e.g. mongodb://127.0.0.1:27017/world"
            )
    timeout = _connect_timeout()
    options: dict[str, Any] = {"tz_aware": True, "appname": "world_mongo"}
    lowered = url.lower()
    if "serverselectiontimeoutms" not in lowered:
        options["serverSelectionTimeoutMS"] = DEFAULT_SERVER_SELECTION_MS
    if "connecttimeoutms" not in lowered:
        options["connectTimeoutMS"] = max(1, round(timeout * 1000))
    checks = _Checks()
    options["event_listeners"] = [checks]
    try:
        client: AsyncMongoClient[Doc] = AsyncMongoClient(url, **options)
        database = client.get_default_database(DEFAULT_DATABASE).name
    except (pe.ConfigurationError, pe.InvalidURI, ValueError, TypeError) as exc:
        raise ConfigurationError(
            f"{redact(url)} (from {source}) is not a usable MongoDB URL: "
            f"{type(exc).__name__}; fix the URL"
        ) from exc

    def servers() -> dict[str, Exception | None]:
        described = client.topology_description.server_descriptions()
        return {
            f"{host}:{port}": checks.failures.get(f"{host}:{port}") or found.error
            for (host, port), found in described.items()
        }

    opening = Opening(where=redact(url), source=source, timeout=timeout, servers=servers)
    try:
        with translate("connect to MongoDB", opening):
            hello = await _first_hello(client, checks, within=timeout)
        replica_set = bool(hello.get("setName")) or hello.get("msg") == "isdbgrid"
        world = MongoWorld(
            client,
            url=url,
            database=database,
            namespace=namespace,
            replica_set=replica_set,
            connect_timeout=timeout,
        )
        await world._open()
    except BaseException:
        await client.close()
        raise
    return world


class _Checks(monitoring.ServerHeartbeatListener):
    """The failed checks of pymongo's server monitors, by ``host:port``, and a wake-up for
    :func:`_first_hello`."""

    def __init__(self) -> None:
        self.failures: dict[str, Exception] = {}
        self.changed = asyncio.Event()

    def started(self, event: monitoring.ServerHeartbeatStartedEvent) -> None:
        pass

    def succeeded(self, event: monitoring.ServerHeartbeatSucceededEvent) -> None:
        host, port = event.connection_id
        self.failures.pop(f"{host}:{port}", None)

    def failed(self, event: monitoring.ServerHeartbeatFailedEvent) -> None:
        host, port = event.connection_id
        self.failures[f"{host}:{port}"] = event.reply
        self.changed.set()


async def _first_hello(
    client: AsyncMongoClient[Doc], checks: _Checks, within: float
) -> Mapping[str, Any]:
    """``hello``, within ``within`` seconds (a World that never reached its server fails fast; calls
    of an open World wait for a server selection timeout instead). pymongo's server selection
    waits its whole timeout even when every server has refused the connection or has an
    unknown name: that ends the wait as soon as the monitors report it.

    Raises:
        pe.ConnectionFailure: every server's check failed, or the timeout passed. The client is
            closed then: a command cancelled while it selects a server ends only when its
            client closes (or its timeout passes).
    """
    with pymongo.timeout(within):  # the task copies the context, deadline included
        command = asyncio.ensure_future(client.admin.command("hello"))
    try:
        while True:
            checks.changed.clear()
            described = client.topology_description.server_descriptions()
            if described and all(f"{h}:{p}" in checks.failures for h, p in described):
                raise pe.ConnectionFailure("every server's check failed")
            woken = asyncio.ensure_future(checks.changed.wait())
            done, _ = await asyncio.wait({command, woken}, return_when=asyncio.FIRST_COMPLETED)
            woken.cancel()
            if command in done:
                hello: Mapping[str, Any] = command.result()
                return hello
    finally:
        if not command.done():
            command.cancel()
            await client.close()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await command


def _connect_timeout() -> float:
    raw = os.environ.get(CONNECT_TIMEOUT_VARIABLE, "").strip()
    if not raw:
        return DEFAULT_CONNECT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ConfigurationError(
            f"{CONNECT_TIMEOUT_VARIABLE}={raw!r} is not a positive number of seconds"
        )
    return value
