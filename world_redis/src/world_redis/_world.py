"""RedisWorld and its factory."""

from __future__ import annotations

from collections.abc import Mapping

from redis.asyncio.cluster import RedisCluster

from world_core.spi import Capabilities, World, validate_namespace
from world_redis._conn import Connection, open_connection, resolve_url, translate
from world_redis._keys import Keys
from world_redis._log import RedisLog
from world_redis._queue import RedisQueue
from world_redis._stream import RedisStream

__all__ = ["RedisWorld", "connect"]

_SCAN_COUNT = 1000


class RedisWorld(World):
    """Log, Queue and Stream of one namespace on a Redis server or Redis Cluster."""

    name = "redis"

    def __init__(self, conn: Connection, namespace: str) -> None:
        self.namespace = namespace
        self._conn = conn
        self._keys = Keys(namespace)
        self.log = RedisLog(conn, self._keys)
        self.queue = RedisQueue(conn, self._keys)
        self.stream = RedisStream(conn, self._keys)
        # Outbox needs the log and the queue in one script; in a cluster they are in
        # different slots, so it is offered on a single node only.
        self._capabilities = Capabilities(outbox=not conn.cluster, native_wakeups=True)

    @property
    def cluster(self) -> bool:
        """True when connected to a Redis Cluster."""
        return self._conn.cluster

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    def settings(self) -> Mapping[str, str]:
        return {
            "url": self._conn.safe_url,
            "namespace": self.namespace,
            "mode": "cluster" if self._conn.cluster else "single",
            "connect_timeout": f"{self._conn.connect_timeout:g}",
            "max_waits": str(self._conn.max_waits),
        }

    def __repr__(self) -> str:
        mode = "cluster" if self._conn.cluster else "single"
        return f"RedisWorld(url={self._conn.safe_url!r}, namespace={self.namespace!r}, {mode})"

    async def purge(self) -> None:
        """Delete every key under ``world:<namespace>:`` (SCAN on every primary), nothing else."""
        client = self._conn.main
        with translate("purge"):
            if isinstance(client, RedisCluster):
                for node in client.get_primaries():
                    cursor = 0
                    while True:
                        # The cluster client answers SCAN as ({node: cursor}, keys).
                        cursors, found = await client.execute_command(
                            "SCAN",
                            cursor,
                            "MATCH",
                            self._keys.pattern,
                            "COUNT",
                            _SCAN_COUNT,
                            target_nodes=node,
                        )
                        cursor = cursors[node.name] if isinstance(cursors, dict) else cursors
                        if found:
                            await client.unlink(*found)  # split by slot by the client
                        if int(cursor) == 0:
                            break
            else:
                cursor = 0
                while True:
                    cursor, found = await self._conn.command(
                        "SCAN", cursor, "MATCH", self._keys.pattern, "COUNT", _SCAN_COUNT
                    )
                    if found:
                        await self._conn.command("UNLINK", *found)
                    if int(cursor) == 0:
                        break

    async def aclose(self) -> None:
        await self._conn.aclose()


async def connect(*, url: str | None = None, namespace: str = "default") -> RedisWorld:
    """Open a RedisWorld.

    Args:
        url: ``redis://[user:password@]host:port/db``, ``rediss://`` (TLS), ``unix://``, or
            ``redis+cluster://host:port`` / ``rediss+cluster://`` for Redis Cluster (any
            node; the others are discovered). A plain ``redis://`` URL that reaches a cluster
            node is detected (``INFO cluster``) and also opens the cluster client. None reads
            ``WORKFLOW_REDIS_URL``.
        namespace: key prefix ``world:<namespace>:``; worlds of different namespaces on one
            server never see each other's keys.

    ``WORKFLOW_REDIS_CONNECT_TIMEOUT`` (seconds, default 5) bounds the opening: connecting and
    the first answer. The opening is not retried, and its errors name the host, the port and
    where the URL came from (``WORKFLOW_REDIS_URL`` or ``url=``). The same timeout bounds each
    later TCP connect.

    Raises:
        ConfigurationError: no URL, a URL that is not a Redis URL, a bad connect timeout, an
            unknown host name, refused credentials (WRONGPASS, NOAUTH) or a user without the
            permissions world-redis needs (NOPERM; also when a later call meets it).
        InvalidIdentifierError: a bad namespace.
        BackendUnavailableError: the server refused the connection or did not answer within
            the connect timeout; nothing was done.
    """
    validate_namespace(namespace)
    conn = await open_connection(*resolve_url(url))
    return RedisWorld(conn, namespace)
