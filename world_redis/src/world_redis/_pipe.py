"""Automatic pipelining and merging of calls on one Redis server.

A call is either one command already encoded in RESP (``Pipe.call``), or one item of a
mergeable call (``Pipe.call_merged``): the same script on the same keys, taking any number of
items and replying with a list of one result per item, in order (an enqueue of N messages, an
ack of N leases).

When nothing is on the wire, a call is sent at once, in its caller's task. Calls made while
others are on the wire wait for a round trip to end (at most ``max_inflight`` are on the wire)
and then go out together in one write, their replies read back in order; mergeable items with
the same key become one command. A busy process thus sends few large writes, and the server
runs one script per batch of items instead of one per item, which is where the time of a
Python Redis client goes; a lone caller pays nothing extra. Results and errors still belong to
their own call: an error reply fails only the call or merged command it answers.

Each round trip in flight has a dedicated connection made with the pool's own settings
(address, TLS, password, database). A batch runs in its own task, so a caller that is
cancelled abandons only its own result and never tears a connection that carries other calls;
a lone call runs in its caller, and its cancellation drops that connection, as redis-py does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import InvalidResponse, ResponseError

from world_core.errors import ClosedError

__all__ = ["MAX_MERGED", "Pipe", "encode_command", "encode_head"]

MAX_MERGED = 256
"""Most items in one merged command: a script blocks the server while it runs, so a burst of
thousands of calls becomes several commands (still one write) rather than one long script."""

Encodable = bytes | str | int | float
Encode = Callable[[list[Any]], bytes]


def _bulk(value: Encodable) -> bytes:
    if isinstance(value, bytes):
        data = value
    elif isinstance(value, str):
        data = value.encode()
    elif isinstance(value, int):
        data = b"%d" % value
    else:
        data = repr(value).encode()
    return b"$%d\r\n%b\r\n" % (len(data), data)


def encode_command(head: bytes, count: int, args: Sequence[Encodable]) -> bytes:
    """One RESP command: ``head`` holds ``count`` arguments already encoded, ``args`` follow."""
    parts = [b"*%d\r\n" % (count + len(args)), head]
    parts.extend(_bulk(arg) for arg in args)
    return b"".join(parts)


def encode_head(args: Sequence[Encodable]) -> bytes:
    """The encoded form of leading arguments, to cache and pass to ``encode_command``."""
    return b"".join(_bulk(arg) for arg in args)


@dataclass
class _Entry:
    """One command on the wire: a plain call (``encode`` None, one item: the command), or
    the merged items of one key."""

    encode: Encode | None
    items: list[Any] = field(default_factory=list)
    futures: list[asyncio.Future[Any]] = field(default_factory=list)

    def command(self) -> bytes | None:
        """The command for the items whose callers still wait; None when none does."""
        live = [(i, f) for i, f in zip(self.items, self.futures, strict=True) if not f.done()]
        if not live:
            return None
        self.items = [i for i, _ in live]
        self.futures = [f for _, f in live]
        return self.items[0] if self.encode is None else self.encode(self.items)

    def answer(self, reply: Any) -> None:
        if self.encode is None or isinstance(reply, Exception):
            for future in self.futures:
                _settle(future, reply)
            return
        if not _one_per_item(reply, len(self.futures)):
            for future in self.futures:
                _settle(future, _misshapen(len(self.futures)))
            return
        for future, one in zip(self.futures, reply, strict=True):
            _settle(future, one)

    def fail(self, error: Exception) -> None:
        for future in self.futures:
            _settle(future, error)


def _one_per_item(reply: Any, items: int) -> bool:
    return isinstance(reply, list) and len(reply) == items


def _misshapen(items: int) -> InvalidResponse:
    return InvalidResponse(f"a merged call of {items} items got a reply of another shape")


def _settle(future: asyncio.Future[Any], outcome: Any) -> None:
    if future.done():  # its caller was cancelled
        return
    if isinstance(outcome, Exception):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class ClosedInFlight(ClosedError):
    """The World was closed while the call was on the wire: it may have run. A write's caller
    reports it as BackendUnavailableError, its outcome unknown (the SPI's ``World.aclose``)."""


def _closed(*, in_flight: bool) -> ClosedError:
    if in_flight:
        return ClosedInFlight(
            "this RedisWorld was closed while the call was on the wire; whether it ran is unknown"
        )
    return ClosedError("this RedisWorld was closed before the call was sent; open a new one")


class Pipe:
    """Pipelined, merged calls on up to ``max_inflight`` connections to one server."""

    def __init__(
        self,
        connection_class: type[AbstractConnection],
        settings: Mapping[str, Any],
        *,
        max_inflight: int = 2,
        timeout: float = 30.0,
    ) -> None:
        # A redis-py connection class and its keyword arguments (a pool's or a cluster node's).
        # Each round trip is bounded as a whole (below), not read by read.
        self._settings = {**settings, "socket_timeout": None}
        self._connection_class = connection_class
        self._max_inflight = max_inflight
        self._timeout = timeout
        self._idle: list[AbstractConnection] = []
        self._all: list[AbstractConnection] = []
        self._pending: list[_Entry] = []
        self._merging: dict[Hashable, _Entry] = {}
        self._inflight = 0
        self._flush_scheduled = False
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.round_trips = 0
        self.commands = 0
        self.calls = 0
        """Counters, for tests and benchmarks: round trips, commands sent, calls answered."""

    def _connection(self) -> AbstractConnection:
        if self._closed:
            raise _closed(in_flight=False)
        if self._idle:
            return self._idle.pop()
        conn: AbstractConnection = self._connection_class(**self._settings)
        self._all.append(conn)
        return conn

    async def _release(self, conn: AbstractConnection) -> None:
        if self._closed:  # closed while this round trip was on the wire (or connecting)
            await conn.disconnect(nowait=True)
        else:
            self._idle.append(conn)

    async def call(self, command: bytes) -> Any:
        """Send one encoded command and return its reply; an error reply is raised."""
        return await self._submit(None, None, command)

    async def call_merged(self, key: Hashable, encode: Encode, item: Any) -> Any:
        """One item of a mergeable call: ``encode`` turns the items of one ``key`` into one
        command whose reply is a list of one result per item; this item's result is returned
        (an error reply fails every item of that command)."""
        return await self._submit(key, encode, item)

    async def _submit(self, key: Hashable | None, encode: Encode | None, item: Any) -> Any:
        if self._inflight == 0 and not self._pending:
            # Nothing on the wire: go now, in this task.
            command = item if encode is None else encode([item])
            conn = self._connection()
            self._inflight += 1
            try:
                self.round_trips += 1
                self.commands += 1
                self.calls += 1
                async with asyncio.timeout(self._timeout):  # cheaper than anyio.fail_after
                    await conn.send_packed_command(command, check_health=False)
                    reply = await conn.read_response()
            except Exception as exc:
                if self._closed:
                    raise _closed(in_flight=True) from exc
                raise
            finally:
                self._inflight -= 1
                await self._release(conn)
                self._flush()
            if encode is None:
                return reply
            if not _one_per_item(reply, 1):
                raise _misshapen(1)
            return reply[0]
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        entry = self._merging.get(key) if key is not None else None
        if entry is None or len(entry.items) >= MAX_MERGED:
            entry = _Entry(encode)
            self._pending.append(entry)
            if key is not None:
                self._merging[key] = entry
        entry.items.append(item)
        entry.futures.append(future)
        if not self._flush_scheduled:
            # After every task that is ready now has run: calls made in the same turn of the
            # event loop share the round trip.
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        """Start a round trip of everything pending if one may start now."""
        self._flush_scheduled = False
        if self._closed or not self._pending or self._inflight >= self._max_inflight:
            return
        batch, self._pending = self._pending, []
        self._merging = {}
        self._inflight += 1
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[_Entry]) -> None:
        conn: AbstractConnection | None = None
        on_wire = False
        try:
            conn = self._connection()
            sent: list[_Entry] = []
            commands: list[bytes] = []
            for entry in batch:
                command = entry.command()
                if command is not None:
                    sent.append(entry)
                    commands.append(command)
            if not sent:
                return
            self.round_trips += 1
            self.commands += len(sent)
            on_wire = True
            async with asyncio.timeout(self._timeout):
                await conn.send_packed_command(b"".join(commands), check_health=False)
                for entry in sent:
                    try:
                        reply = await conn.read_response()
                    except ResponseError as exc:
                        reply = exc  # an error reply is read whole: the next one is intact
                    self.calls += len(entry.futures)
                    entry.answer(reply)
        except BaseException as exc:
            # The connection is gone (redis-py dropped it), timed out, or the pipe was closed:
            # every call not answered yet fails (answered ones are settled and stay so);
            # whether it ran is unknown.
            if conn is not None:
                await conn.disconnect(nowait=True)
            error: Exception
            if self._closed or not isinstance(exc, Exception):
                error = _closed(in_flight=on_wire)
            else:
                error = exc
            for entry in batch:
                entry.fail(error)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._inflight -= 1
            if conn is not None:
                await self._release(conn)
            self._flush()

    async def aclose(self) -> None:
        """Fail waiting calls with ClosedError and round trips in flight with ClosedInFlight
        (they may have run), drop connections."""
        self._closed = True
        for entry in self._pending:
            entry.fail(_closed(in_flight=False))
        self._pending = []
        self._merging = {}
        for conn in self._all:  # a round trip on one of these ends with an error now
            await conn.disconnect(nowait=True)
        with anyio.CancelScope(shield=True):
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._all.clear()
        self._idle.clear()
