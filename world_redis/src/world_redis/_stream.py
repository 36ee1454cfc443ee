"""The Stream on Redis: one Redis stream per stream, chunk index i at entry id ``<i+1>-0``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from world_core.errors import ClosedError, ConflictError
from world_core.spi import (
    Chunk,
    Stream,
    StreamInfo,
    validate_id,
    validate_stream_read,
    validate_write,
)
from world_redis import _scripts as S
from world_redis._conn import BLOCK_SECONDS, Connection, translate
from world_redis._keys import Keys
from world_redis._log import _xread_entries
from world_redis._queue import wait_on

__all__ = ["RedisStream"]

_READ_COUNT = 64  # chunks may be large: bound one reply


class RedisStream(Stream):
    def __init__(self, conn: Connection, keys: Keys) -> None:
        self._conn = conn
        self._keys = keys

    async def write(
        self, stream_id: str, chunks: Sequence[bytes], *, expect_next: int | None = None
    ) -> int:
        validate_write(stream_id, chunks, expect_next=expect_next)
        with translate("stream write", writes=True):
            reply: list[Any] = await self._conn.run(
                S.STREAM_WRITE,
                self._keys.stream(stream_id),
                ["" if expect_next is None else expect_next, *chunks],
            )
        if reply[0] == b"closed":
            raise ClosedError(f"stream {stream_id!r} is closed; write to a new stream instead")
        if reply[0] == b"conflict":
            actual = int(reply[1])
            raise ConflictError(
                f"stream {stream_id!r} has next index {actual}, not {expect_next}: "
                "read it and decide again",
                expected=expect_next if expect_next is not None else -1,
                actual=actual,
            )
        return int(reply[1])

    async def close(self, stream_id: str) -> None:
        validate_id(stream_id, "stream_id")
        with translate("stream close", writes=True):
            await self._conn.run(S.STREAM_CLOSE, self._keys.stream(stream_id), [])

    async def info(self, stream_id: str) -> StreamInfo:
        validate_id(stream_id, "stream_id")
        with translate("stream info"):
            n, closed = await self._conn.command("HMGET", self._keys.stream(stream_id)[1], "n", "c")
        return StreamInfo(
            stream_id=stream_id, next_index=int(n) if n is not None else 0, closed=bool(closed)
        )

    def read(self, stream_id: str, *, start: int = 0) -> AsyncIterator[Chunk]:
        # Checked here, not in the generator (its body runs only at the first step), so that
        # a bad call fails at once, where it was made.
        validate_stream_read(stream_id, start=start)
        self._conn.check_open()
        return self._follow(stream_id, start)

    async def _follow(self, stream_id: str, start: int) -> AsyncIterator[Chunk]:
        state = await self.info(stream_id)
        if start < 0:
            start = max(0, state.next_index + start)
        if state.closed and start >= state.next_index:
            return
        x = self._keys.stream(stream_id)[0]
        # Read after min(start, next): a start beyond the tail still sees the close marker,
        # which sits right after the last chunk.
        last = f"{min(start, state.next_index)}-0".encode()
        block_ms = int(BLOCK_SECONDS * 1000)
        while True:
            reply = await wait_on(
                self._conn,
                "stream read",
                *("XREAD", "COUNT", _READ_COUNT, "BLOCK", block_ms, "STREAMS", x, last),
            )
            for entry_id, fields in _xread_entries(reply):
                if b"c" in fields:
                    return
                last = entry_id
                index = int(entry_id.split(b"-", 1)[0]) - 1
                if index >= start:
                    yield Chunk(index=index, data=fields[b"d"])

    async def delete(self, stream_id: str) -> None:
        validate_id(stream_id, "stream_id")
        with translate("stream delete", writes=True):
            await self._conn.command("DEL", *self._keys.stream(stream_id))
