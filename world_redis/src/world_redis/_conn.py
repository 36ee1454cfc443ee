"""Connections, script calls and the one place driver exceptions are translated."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit, urlunsplit

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
from world_redis._pipe import ClosedInFlight, Encode, Pipe, encode_command, encode_head
from world_redis._scripts import Script

__all__ = [
    "Connection",
    "connect_timeout",
    "max_waits",
    "open_connection",
    "resolve_url",
    "translate",
]

Client = Redis | RedisCluster
Arg = bytes | str | int | float

BLOCK_SECONDS = 10.0
"""Longest single blocking call (XREAD BLOCK, BLPOP); waits longer loop, never spin."""

URL_VARIABLE = "WORKFLOW_REDIS_URL"
CONNECT_TIMEOUT_VARIABLE = "WORKFLOW_REDIS_CONNECT_TIMEOUT"
DEFAULT_CONNECT_TIMEOUT = 5.0
"""Seconds to open a World (connect and first answer), and for each later TCP connect."""
MAX_WAITS_VARIABLE = "WORKFLOW_REDIS_MAX_WAITS"
DEFAULT_MAX_WAITS = 1000
"""Blocking calls (XREAD BLOCK, BLPOP) one World may have in flight at once, on as many
connections (per node on a cluster). Claims waiting on the same queue share one, so what counts
is log watches, stream reads and queues waited on at once. redis-py's own default is 100."""

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
# getaddrinfo's answers for a name that does not exist (a typo), as opposed to EAI_AGAIN (the
# resolver did not answer) and the like, which may pass.
_UNKNOWN_HOST = {
    code for code in (getattr(socket, name, None) for name in ("EAI_NONAME", "EAI_NODATA")) if code
}
_logger = logging.getLogger("world_redis")
_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
_KEY_CACHE_SIZE = 4096


@dataclass(frozen=True)
class Opening:
    """A World being opened: what its first connection's errors say (never the password)."""

    where: str
    """The URL, redacted."""
    address: str
    """``host:port``, or the socket path."""
    source: str
    """Where the URL came from: ``WORKFLOW_REDIS_URL`` or ``url=``."""
    timeout: float
    has_password: bool


class translate:
    """Turn redis-py and socket errors into world errors, chained; transient ones into
    BackendUnavailableError. Messages never carry the password.

    With ``opening``, the block opens a World: a failure to connect says so (the World never
    worked, nothing was done) and names the setting; later, connection faults are transient.

    With ``writes``, the block writes: a round trip the World's closing cut off on the wire
    (ClosedInFlight, a ClosedError) may have taken effect, so it raises
    BackendUnavailableError, the outcome unknown, never ClosedError (the SPI's
    ``World.aclose``). Reads and waits keep ClosedError.

    A class rather than a generator context manager: it wraps every call, so it is kept cheap.
    """

    __slots__ = ("_opening", "_what", "_writes")

    def __init__(self, what: str, opening: Opening | None = None, *, writes: bool = False) -> None:
        self._what = what
        self._opening = opening
        self._writes = writes

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        if exc is None or not isinstance(exc, Exception):
            return
        if isinstance(exc, WorldError):
            if self._writes and isinstance(exc, ClosedInFlight):
                raise BackendUnavailableError(
                    f"{self._what}: this RedisWorld was closed while the call was on the wire: "
                    "whether it took effect is unknown; read to find out, or repeat it "
                    "idempotently on a World opened again"
                ) from exc
            return
        translated = _translated(self._what, exc, self._opening)
        if translated is not None:
            raise translated from exc


def _os_error(exc: BaseException) -> OSError | None:
    """The socket error under a driver error (redis-py raises its own from inside except)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, OSError) and not isinstance(seen, TimeoutError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _reason(exc: BaseException) -> str:
    """The operating system's words for a connection failure, else the driver's."""
    found = _os_error(exc)
    if isinstance(found, socket.gaierror):
        return found.strerror or str(found)
    if found is not None and isinstance(found.errno, int) and found.errno > 0:
        return os.strerror(found.errno)
    return str(exc) or type(exc).__name__


def _not_connected(exc: Exception, opening: Opening) -> WorldError:
    head = f"cannot connect to Redis at {opening.address}"
    url = f"{opening.source} ({opening.where})"
    found = _os_error(exc)
    if isinstance(found, socket.gaierror) and found.errno in _UNKNOWN_HOST:
        return ConfigurationError(
            f"{head}: the host name is unknown ({_reason(exc)}); fix the host in {url}"
        )
    if isinstance(exc, rexc.TimeoutError | TimeoutError):
        reason = f"no answer within {opening.timeout:g} s ({CONNECT_TIMEOUT_VARIABLE})"
    else:
        reason = _reason(exc)
    return BackendUnavailableError(
        f"{head}: {reason}. Check that the server runs and that {url} names the right host "
        "and port. Nothing was done."
    )


def _translated(what: str, exc: Exception, opening: Opening | None = None) -> WorldError | None:
    source = f"{opening.source} ({opening.where})" if opening else f"{URL_VARIABLE} (or url=)"
    if isinstance(exc, rexc.AuthenticationError):  # WRONGPASS, NOAUTH
        if opening is not None and not opening.has_password:
            return ConfigurationError(
                f"Redis at {opening.address} wants a password and {source} has none: "
                "use redis://:password@host:port/0 (or redis://user:password@...)"
            )
        at = f"Redis at {opening.address}" if opening else f"Redis, during {what},"
        return ConfigurationError(
            f"{at} refused the credentials ({str(exc).rstrip('.')}); fix the user name or "
            f"password in {source}"
        )
    if isinstance(exc, rexc.AuthorizationError | rexc.NoPermissionError):  # NOPERM
        return ConfigurationError(
            f"Redis refused {what}: {exc}. The user of {source} lacks a permission "
            "world-redis needs (scripts, streams, lists, sorted sets under world:*); grant "
            "it (ACL SETUSER <user> +@all ~world:*) or use another user"
        )
    if isinstance(
        exc,
        rexc.ConnectionError
        | rexc.TimeoutError
        | rexc.ClusterError
        | rexc.RedisClusterException
        | OSError,  # includes TimeoutError from the deadlines around pipe and blocking calls
    ):
        if opening is not None:
            return _not_connected(exc, opening)
        return BackendUnavailableError(
            f"Redis unavailable during {what}: {type(exc).__name__}: {exc}. "
            "Retry later; whether a write took effect is unknown."
        )
    if isinstance(exc, rexc.ResponseError):
        text = str(exc)
        if text.startswith(_TRANSIENT_PREFIXES):
            return BackendUnavailableError(f"Redis refused {what} for now: {text}. Retry later.")
        return WorldError(f"Redis error during {what}: {text}")
    if isinstance(exc, rexc.RedisError):
        return WorldError(f"Redis client error during {what}: {type(exc).__name__}: {exc}")
    return None  # not the driver's: it propagates as it is


class Connection:
    """Two clients on one server or cluster: ``main`` for request/response, ``blocking`` for
    XREAD BLOCK and BLPOP, so waiters never hold connections the other calls need.

    Script calls go through pipes (see _pipe): one for a single server; on a cluster one per
    primary, chosen by the slot of the call's keys from the cluster client's slot map. A call
    that meets a redirection (MOVED, ASK: the slot moved, the script did not run) is sent again
    through the cluster client, which follows it and learns the new map; a connection error on
    a node makes the cluster client refresh its map (at most once a second)."""

    def __init__(
        self,
        main: Client,
        blocking: Client,
        *,
        cluster: bool,
        url: str,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        self._main = main
        self._blocking = blocking
        self.cluster = cluster
        self.safe_url = redact(url)
        self.connect_timeout = connect_timeout
        self._closed = False
        pool: Any = blocking.connection_pool if isinstance(blocking, Redis) else None
        self.max_waits: int = pool.max_connections if pool is not None else max_waits()
        """The blocking client's connection cap (``WORKFLOW_REDIS_MAX_WAITS``)."""
        self.pipe = (
            None
            if isinstance(main, RedisCluster)
            else Pipe(
                main.connection_pool.connection_class,
                main.connection_pool.connection_kwargs,
                timeout=_SOCKET_TIMEOUT,
            )
        )
        """The pipe of a single server; None on a cluster."""
        self._node_pipes: dict[str, Pipe] = {}
        self._refreshed_at = 0.0
        self._heads: dict[tuple[str, bool], bytes] = {}
        self._key_heads: dict[tuple[str, ...], bytes] = {}
        self._encoders: dict[tuple[str, tuple[str, ...]], Encode] = {}
        self._loading: dict[tuple[Pipe, str], asyncio.Future[Any]] = {}

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

    def check_open(self) -> None:
        """Raise ClosedError once ``aclose`` began."""
        if self._closed:
            raise ClosedError("this RedisWorld is closed; open a new one")

    async def command(self, *args: Arg) -> Any:
        """One command on the main client (routed by key in a cluster)."""
        client: Any = self.main  # redis-py's single-node execute_command is untyped
        return await client.execute_command(*args)

    def _pipe_for(self, keys: Sequence[str]) -> Pipe:
        if self._closed:
            raise ClosedError("this RedisWorld is closed; open a new one")
        if self.pipe is not None:
            return self.pipe
        assert isinstance(self._main, RedisCluster)
        node = self._main.get_node_from_key(keys[0])  # SlotNotCoveredError: no node has it
        if node is None:
            raise rexc.SlotNotCoveredError(f"no primary serves the slot of {keys[0]!r}")
        pipe = self._node_pipes.get(node.name)
        if pipe is None:
            pipe = self._node_pipes[node.name] = Pipe(
                node.connection_class, node.connection_kwargs, timeout=_SOCKET_TIMEOUT
            )
        return pipe

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        """EVALSHA, or EVAL when the server does not know the script (restart, new node)."""
        pipe = self._pipe_for(keys)
        key_head = self._key_head(keys)
        count = 3 + len(keys)
        try:
            try:
                return await pipe.call(
                    encode_command(self._head(script, sha=True) + key_head, count, args)
                )
            except rexc.NoScriptError:
                return await pipe.call(
                    encode_command(self._head(script, sha=False) + key_head, count, args)
                )
        except rexc.AskError:  # MOVED too: the script did not run
            return await self._run_routed(script, keys, args)
        except (rexc.ConnectionError, rexc.TimeoutError, OSError):
            await self._node_lost()
            raise

    async def run_merged(self, script: Script, keys: Sequence[str], item: Sequence[Arg]) -> Any:
        """One item of ``script``, which takes any number of items of ``len(item)`` arguments
        and replies with one result per item: concurrent items on the same keys run as one
        script call (see _pipe). Returns this item's result."""
        pipe = self._pipe_for(keys)
        merge_key = (script.name, keys if isinstance(keys, tuple) else tuple(keys))
        encode = self._encoders.get(merge_key)
        if encode is None:
            encode = self._encoder(script, merge_key)
        try:
            try:
                return await pipe.call_merged(merge_key, encode, item)
            except rexc.NoScriptError:
                await self._load(pipe, script)
            try:
                return await pipe.call_merged(merge_key, encode, item)
            except rexc.NoScriptError:
                # The server lost the script again between the load and this retry: the
                # load (ours, or one shared with other callers) was answered by a server that
                # was restarted, flushed or failed over before the retry reached it. Nothing
                # orders the two: in a CI run the old server answered an ack's SCRIPT LOAD
                # just before it was killed, and the ack's retry went out on a new connection
                # to the restarted server, which had no scripts. NOSCRIPT means the script
                # did not run, so it is sent once more with its source (EVAL), which no
                # server answers with NOSCRIPT: one last attempt, not a loop.
                return await pipe.call_merged(
                    (merge_key, "eval"), self._encoder(script, merge_key, sha=False), item
                )
        except rexc.AskError:  # MOVED too: the script did not run
            return (await self._run_routed(script, keys, item))[0]
        except (rexc.ConnectionError, rexc.TimeoutError, OSError):
            await self._node_lost()
            raise

    async def _run_routed(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        """The call through the cluster client, which follows redirections."""
        try:
            return await self.command("EVALSHA", script.sha, len(keys), *keys, *args)
        except rexc.NoScriptError:
            return await self.command("EVAL", script.source, len(keys), *keys, *args)

    async def _node_lost(self) -> None:
        """Cluster: a node stopped answering; a failover may have moved its slots, so the
        cluster client re-reads the slot map (at most once a second; failures ignored: the
        caller reports the outage)."""
        if self.pipe is not None or self._closed:
            return
        now = time.monotonic()
        if now - self._refreshed_at < 1.0:
            return
        self._refreshed_at = now
        assert isinstance(self._main, RedisCluster)
        try:
            await self._main.nodes_manager.initialize()
        except (rexc.RedisError, OSError) as exc:
            _logger.info("Redis Cluster slot map refresh failed: %s", exc)

    async def _load(self, pipe: Pipe, script: Script) -> None:
        """SCRIPT LOAD after NOSCRIPT (a restarted or flushed server); the many calls that
        got NOSCRIPT together share one load."""
        key = (pipe, script.name)
        loading = self._loading.get(key)
        if loading is None:
            loading = asyncio.ensure_future(
                pipe.call(encode_command(b"", 0, ["SCRIPT", "LOAD", script.source]))
            )
            self._loading[key] = loading

            def done(future: asyncio.Future[Any]) -> None:
                self._loading.pop(key, None)
                if not future.cancelled():
                    future.exception()  # retrieved: its waiters, if any are left, raise it

            loading.add_done_callback(done)
        await asyncio.shield(loading)

    def _encoder(
        self, script: Script, merge_key: tuple[str, tuple[str, ...]], *, sha: bool = True
    ) -> Encode:
        """The encoder of merged calls: EVALSHA (cached per key), or EVAL (the rare last
        attempt after NOSCRIPT twice, not cached)."""
        keys = merge_key[1]
        head = self._head(script, sha=sha) + self._key_head(keys)
        count = 3 + len(keys)

        def encode(items: list[Sequence[Arg]]) -> bytes:
            if len(items) == 1:
                return encode_command(head, count, items[0])
            return encode_command(head, count, [arg for one in items for arg in one])

        if sha:
            if len(self._encoders) >= _KEY_CACHE_SIZE:
                self._encoders.clear()
            self._encoders[merge_key] = encode
        return encode

    def _head(self, script: Script, *, sha: bool) -> bytes:
        found = self._heads.get((script.name, sha))
        if found is None:
            words = ("EVALSHA", script.sha) if sha else ("EVAL", script.source)
            found = self._heads[script.name, sha] = encode_head(words)
        return found

    def _key_head(self, keys: Sequence[str]) -> bytes:
        # The numkeys and key arguments of one log, queue or stream, encoded once.
        ident = tuple(keys)
        found = self._key_heads.get(ident)
        if found is None:
            if len(self._key_heads) >= _KEY_CACHE_SIZE:
                self._key_heads.clear()
            found = self._key_heads[ident] = encode_head([len(keys), *keys])
        return found

    async def block(self, *args: Arg) -> Any:
        """One blocking command on the blocking client, bounded by a client-side deadline too
        (a silent network drop must not hang a waiter forever)."""
        client: Any = self.blocking
        try:
            with anyio.fail_after(BLOCK_SECONDS + _SOCKET_TIMEOUT):
                return await client.execute_command(*args)
        except rexc.MaxConnectionsError as exc:
            raise BackendUnavailableError(
                f"this World already has {self.max_waits} blocking waits in flight (log "
                "watches, stream reads, queues waited on), each on a connection of its own; "
                f"raise {MAX_WAITS_VARIABLE} (now {self.max_waits}) or wait on fewer at once. "
                "Nothing was done"
            ) from exc

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for pipe in [*self._node_pipes.values(), *([self.pipe] if self.pipe else [])]:
            await pipe.aclose()
        self._node_pipes.clear()
        for client in (self._blocking, self._main):
            await client.aclose()


def _no_retry() -> Retry:
    # A retried write whose first attempt reached the server would run twice (an append
    # appended twice): never retry; the caller gets BackendUnavailableError and decides.
    return Retry(NoBackoff(), 0)


def _pool_size(blocking: bool) -> int:
    # Only the blocking client's is set: the main one's calls are short, and script calls go
    # through the pipes, which have connections of their own. 100 is redis-py's default.
    return max_waits() if blocking else 100


def _single(url: str, *, blocking: bool, timeout: float) -> Redis:
    return Redis.from_url(
        url,
        max_connections=_pool_size(blocking),
        retry=_no_retry(),
        socket_timeout=None if blocking else _SOCKET_TIMEOUT,
        socket_connect_timeout=timeout,
        decode_responses=False,
    )


def _cluster(url: str, *, blocking: bool, timeout: float) -> RedisCluster:
    return RedisCluster.from_url(
        url,
        max_connections=_pool_size(blocking),
        retry=_no_retry(),
        socket_timeout=None if blocking else _SOCKET_TIMEOUT,
        socket_connect_timeout=timeout,
        decode_responses=False,
    )


def resolve_url(url: str | None) -> tuple[str, str]:
    """The URL to open and where it came from (``url=`` or ``WORKFLOW_REDIS_URL``)."""
    if url is not None:
        return url, "url="
    value = os.environ.get(URL_VARIABLE, "")
    if not value:
        raise ConfigurationError(
            f"{URL_VARIABLE} is not set: set it to redis://host:6379/0 "
            "(redis+cluster://host:port for Redis Cluster), or pass url="
        )
    return value, URL_VARIABLE


def _positive(variable: str, parse: Callable[[str], float], default: float, what: str) -> float:
    """The positive number in the environment ``variable`` (``parse`` reads it), else
    ``default``; anything else is refused naming the variable."""
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return default
    try:
        value = parse(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{variable}={raw!r} is not {what}")
    return value


def connect_timeout() -> float:
    """``WORKFLOW_REDIS_CONNECT_TIMEOUT`` (seconds), else the default."""
    return _positive(
        CONNECT_TIMEOUT_VARIABLE, float, DEFAULT_CONNECT_TIMEOUT, "a positive number of seconds"
    )


def max_waits() -> int:
    """``WORKFLOW_REDIS_MAX_WAITS`` (a positive integer), else the default."""
    what = (
        "a positive whole number of blocking waits (connections) a World may hold at once; "
        f"unset it for {DEFAULT_MAX_WAITS}"
    )
    return int(_positive(MAX_WAITS_VARIABLE, int, DEFAULT_MAX_WAITS, what))


def _address(parts: SplitResult) -> str:
    if parts.scheme.lower() == "unix":
        return parts.path
    try:
        host, port = parts.hostname, parts.port
    except ValueError:  # a bad port: the driver refuses the URL, said our way below
        return parts.netloc.rpartition("@")[2]
    return f"{host or 'localhost'}:{port or 6379}"


async def open_connection(url: str, source: str = URL_VARIABLE) -> Connection:
    """Open clients for ``url`` (from ``source``, for messages).

    ``redis+cluster://`` and ``rediss+cluster://`` always use the cluster client; for
    ``redis://`` and ``rediss://`` the server is asked (``INFO cluster``) and a cluster node
    switches to the cluster client, so any node's address works.

    The first connection and answer must come within ``WORKFLOW_REDIS_CONNECT_TIMEOUT``; a
    failure is not retried and names ``source``, the address and the system's reason.
    """
    timeout = connect_timeout()
    max_waits()  # a bad setting is refused before anything connects
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unclosed '[' of an IPv6 host, say
        raise ConfigurationError(
            f"{redact(url)!r} (from {source}) is not a valid URL: {exc}; use "
            "redis://[user:password@]host:6379/0 ([...] around an IPv6 address)"
        ) from None
    scheme = parts.scheme.lower()
    if scheme not in ("redis", "rediss", "unix", *_CLUSTER_SCHEMES):
        raise ConfigurationError(
            f"{redact(url)!r} (from {source}) has scheme {scheme!r}; use redis://, rediss://, "
            "unix://, redis+cluster:// or rediss+cluster://"
        )
    cluster = scheme in _CLUSTER_SCHEMES
    plain = urlunsplit(parts._replace(scheme=_CLUSTER_SCHEMES[scheme])) if cluster else url
    opening = Opening(
        where=redact(url),
        address=_address(parts),
        source=source,
        timeout=timeout,
        has_password=bool(parts.password),
    )
    try:
        with translate("connect", opening), anyio.fail_after(timeout):
            if not cluster:
                probe: Any = _single(plain, blocking=False, timeout=timeout)
                try:
                    info = await probe.execute_command("INFO", "cluster")
                finally:
                    await probe.aclose()
                if isinstance(info, dict):  # redis-py parses INFO into a dict
                    cluster = str(info.get("cluster_enabled", 0)) == "1"
                else:
                    text = info.decode() if isinstance(info, bytes) else str(info)
                    cluster = "cluster_enabled:1" in text
            if cluster:
                cmain = _cluster(plain, blocking=False, timeout=timeout)
                cblocking = _cluster(plain, blocking=True, timeout=timeout)
                try:
                    await cmain.initialize()
                    await cblocking.initialize()
                except BaseException:
                    await cmain.aclose()
                    await cblocking.aclose()
                    raise
                main: Client = cmain
                blocking: Client = cblocking
            else:
                main = _single(plain, blocking=False, timeout=timeout)
                blocking = _single(plain, blocking=True, timeout=timeout)
    except ValueError as exc:
        if isinstance(exc, WorldError):  # ConfigurationError is a ValueError too
            raise
        # The driver's message may quote the URL, password included: say it our way.
        raise ConfigurationError(
            f"{redact(url)!r} (from {source}) is not a valid Redis URL: check host, port and "
            "database number"
        ) from None
    return Connection(main, blocking, cluster=cluster, url=url, connect_timeout=timeout)
