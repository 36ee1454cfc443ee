"""MongoWorld and its factory."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping
from typing import Any

from pymongo import AsyncMongoClient, IndexModel
from pymongo import errors as pe
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.uri_parser import parse_uri

from world_core import redact
from world_core.errors import ClosedError, ConfigurationError
from world_core.spi import Capabilities, World, validate_namespace
from world_mongo._errors import translate
from world_mongo._log import MongoLog
from world_mongo._queue import MongoQueue, queue_indexes
from world_mongo._segments import Doc, Segments
from world_mongo._stream import MongoStream
from world_mongo._wakeup import Backoff, Notifier, follow_change_stream, notifier_for

__all__ = ["DEFAULT_DATABASE", "URL_VARIABLE", "MongoWorld", "connect"]

URL_VARIABLE = "WORKFLOW_MONGO_URL"
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
    ) -> None:
        self.namespace = namespace
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

    async def _open(self) -> None:
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
        if self._replica_set:
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
    """Open a MongoWorld.

    Args:
        url: a ``mongodb://`` or ``mongodb+srv://`` URL; None reads ``WORKFLOW_MONGO_URL``.
            The database is the URL's path (``.../mydb``), else ``world``.
        namespace: prefixes every collection name (``world.<namespace>.``), so namespaces
            share one database and never see each other's data.

    Raises:
        ConfigurationError: no URL, or a URL pymongo refuses (the message never shows it
            unredacted).
        BackendUnavailableError: the server did not answer.
    """
    validate_namespace(namespace)
    if url is None:
        url = os.environ.get(URL_VARIABLE, "").strip()
        if not url:
            raise ConfigurationError(
                f"{URL_VARIABLE} is not set: set it to your MongoDB URL, "
                "e.g. mongodb://127.0.0.1:27017/world"
            )
    options: dict[str, Any] = {"tz_aware": True, "appname": "world_mongo"}
    if "serverselectiontimeoutms" not in url.lower():
        options["serverSelectionTimeoutMS"] = 10_000
    try:
        client: AsyncMongoClient[Doc] = AsyncMongoClient(url, **options)
        database = client.get_default_database(DEFAULT_DATABASE).name
    except (pe.ConfigurationError, pe.InvalidURI, ValueError, TypeError) as exc:
        raise ConfigurationError(
            f"{URL_VARIABLE} ({redact(url)}) is not a usable MongoDB URL: {type(exc).__name__}; "
            "fix the URL"
        ) from exc
    try:
        with translate("connect to MongoDB"):
            hello = await client.admin.command("hello")
        replica_set = bool(hello.get("setName")) or hello.get("msg") == "isdbgrid"
        world = MongoWorld(
            client, url=url, database=database, namespace=namespace, replica_set=replica_set
        )
        await world._open()
    except BaseException:
        await client.close()
        raise
    return world
