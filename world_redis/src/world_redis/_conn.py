"""Connections, script calls and the one place driver exceptions are translated."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
from redis import exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from world_core import redact
from world_core.errors import (
    BackendUnavailableError,
    ClosedError,
    ConfigurationError,
    WorldError,
)
from world_redis._scripts import Script

__all__ = ["Connection", "open_connection", "translate"]

Client = Redis | RedisCluster
Arg = bytes | str | int | float

BLOCK_SECONDS = 10.0
"""Longest single blocking call (XREAD BLOCK, BLPOP); waits longer loop, never spin."""

_SOCKET_TIMEOUT = 30.0
_TRANSIENT_PREFIXES = (
    "LOADING",
    "MASTERDOWN",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "BUSY",
    "OOM",
    "MISCONF",
    "READONLY",
    "NOREPLICAS",
)
_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


@contextmanager
def translate(what: str) -> Iterator[None]:
    """Turn redis-py and socket errors into world errors, chained; transient ones into
    BackendUnavailableError. Messages never carry the URL (it may hold a password)."""
    try:
        yield
    except WorldError:
        raise
    except (
        rexc.ConnectionError,
        rexc.TimeoutError,
        rexc.ClusterError,
        rexc.RedisClusterException,
        OSError,  # includes TimeoutError from anyio.fail_after around blocking calls
    ) as exc:
        raise BackendUnavailableError(
            f"Redis unavailable during {what}: {type(exc).__name__}: {exc}. "
            "Retry later; whether a write took effect is unknown."
        ) from exc
    except rexc.ResponseError as exc:
        text = str(exc)
        if text.startswith(_TRANSIENT_PREFIXES):
            raise BackendUnavailableError(
                f"Redis refused {what} for now: {text}. Retry later."
            ) from exc
        raise WorldError(f"Redis error during {what}: {text}") from exc
    except rexc.RedisError as exc:
        raise WorldError(f"Redis client error during {what}: {type(exc).__name__}: {exc}") from exc


class Connection:
    """Two clients on one server or cluster: ``main`` for request/response, ``blocking`` for
    XREAD BLOCK and BLPOP, so waiters never hold connections the other calls need."""

    def __init__(self, main: Client, blocking: Client, *, cluster: bool, url: str) -> None:
        self._main = main
        self._blocking = blocking
        self.cluster = cluster
        self.safe_url = redact(url)
        self._closed = False

    @property
    def main(self) -> Client:
        if self._closed:
            raise ClosedError("this RedisWorld is closed; open a new one")
        return self._main

    @property
    def blocking(self) -> Client:
        if self._closed:
            raise ClosedError("this RedisWorld is closed; open a new one")
        return self._blocking

    async def command(self, *args: Arg) -> Any:
        """One command on the main client (routed by key in a cluster)."""
        client: Any = self.main  # redis-py's single-node execute_command is untyped
        return await client.execute_command(*args)

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        """EVALSHA, or EVAL when the server does not know the script (restart, new node)."""
        try:
            return await self.command("EVALSHA", script.sha, len(keys), *keys, *args)
        except rexc.NoScriptError:
            return await self.command("EVAL", script.source, len(keys), *keys, *args)

    async def block(self, *args: Arg) -> Any:
        """One blocking command on the blocking client, bounded by a client-side deadline too
        (a silent network drop must not hang a waiter forever)."""
        client: Any = self.blocking
        with anyio.fail_after(BLOCK_SECONDS + _SOCKET_TIMEOUT):
            return await client.execute_command(*args)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for client in (self._blocking, self._main):
            await client.aclose()


def _no_retry() -> Retry:
    # A retried write whose first attempt reached the server would run twice (an append
    # appended twice): never retry; the caller gets BackendUnavailableError and decides.
    return Retry(NoBackoff(), 0)


def _single(url: str, *, blocking: bool) -> Redis:
    return Redis.from_url(
        url,
        retry=_no_retry(),
        socket_timeout=None if blocking else _SOCKET_TIMEOUT,
        socket_connect_timeout=5.0,
        decode_responses=False,
    )


def _cluster(url: str, *, blocking: bool) -> RedisCluster:
    return RedisCluster.from_url(
        url,
        retry=_no_retry(),
        socket_timeout=None if blocking else _SOCKET_TIMEOUT,
        socket_connect_timeout=5.0,
        decode_responses=False,
    )


def resolve_url(url: str | None) -> str:
    value = url if url is not None else os.environ.get("WORKFLOW_REDIS_URL", "")
    if not value:
        raise ConfigurationError(
            "WORKFLOW_REDIS_URL is not set: set it to redis://host:6379/0 "
            "(redis+cluster://host:port for Redis Cluster), or pass url="
        )
    return value


async def open_connection(url: str) -> Connection:
    """Open clients for ``url``.

    ``redis+cluster://`` and ``rediss+cluster://`` always use the cluster client; for
    ``redis://`` and ``rediss://`` the server is asked (``INFO cluster``) and a cluster node
    switches to the cluster client, so any node's address works.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("redis", "rediss", "unix", *_CLUSTER_SCHEMES):
        raise ConfigurationError(
            f"WORKFLOW_REDIS_URL {redact(url)!r} has scheme {scheme!r}; use redis://, rediss://, "
            "unix://, redis+cluster:// or rediss+cluster://"
        )
    cluster = scheme in _CLUSTER_SCHEMES
    plain = urlunsplit(parts._replace(scheme=_CLUSTER_SCHEMES[scheme])) if cluster else url
    try:
        if not cluster:
            probe: Any = _single(plain, blocking=False)
            try:
                with translate("connect"):
                    info = await probe.execute_command("INFO", "cluster")
            finally:
                await probe.aclose()
            if isinstance(info, dict):  # redis-py parses INFO into a dict
                cluster = str(info.get("cluster_enabled", 0)) == "1"
            else:
                text = info.decode() if isinstance(info, bytes) else str(info)
                cluster = "cluster_enabled:1" in text
        if cluster:
            cmain, cblocking = _cluster(plain, blocking=False), _cluster(plain, blocking=True)
            try:
                with translate("connect"):
                    await cmain.initialize()
                    await cblocking.initialize()
            except BaseException:
                await cmain.aclose()
                await cblocking.aclose()
                raise
            main: Client = cmain
            blocking: Client = cblocking
        else:
            main = _single(plain, blocking=False)
            blocking = _single(plain, blocking=True)
    except ValueError:
        # The driver's message may quote the URL, password included: say it our way.
        raise ConfigurationError(
            f"WORKFLOW_REDIS_URL {redact(url)!r} is not a valid Redis URL: check host, port "
            "and database number"
        ) from None
    return Connection(main, blocking, cluster=cluster, url=url)
