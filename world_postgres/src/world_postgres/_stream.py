"""Stream: chunk rows ordered by the stream row's lock, readers woken by LISTEN/NOTIFY."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence

from world_core.errors import ClosedError, ConflictError
from world_core.spi import (
    Chunk,
    Stream,
    StreamInfo,
    validate_id,
    validate_stream_read,
    validate_write,
)
from world_postgres._db import Conn, Database, tag
from world_postgres._notify import Listener
from world_postgres._wait import Waiter

__all__ = ["PostgresStream"]

_READ_CHUNKS = 256
_READ_BYTES = 8 * 1024 * 1024


class PostgresStream(Stream):
    def __init__(self, db: Database, listener: Listener) -> None:
        self._db = db
        self._listener = listener
        sql = db.sql
        self._write = sql(
            "SELECT o_next, o_closed, o_actual FROM @s@.write($1, $2, $3, $4, $5, $6)"
        )
        self._close = sql(
            "WITH c AS (INSERT INTO @s@.streams AS s (stream_id, closed) VALUES ($1, true)"
            " ON CONFLICT (stream_id) DO UPDATE SET closed = true RETURNING 1)"
            " SELECT @s@.wake($2) FROM c"
        )
        self._info = sql("SELECT next_index, closed FROM @s@.streams WHERE stream_id = $1")
        # One statement, one snapshot: the chunks and the state agree. At least one chunk per
        # page, then up to a total of _READ_BYTES.
        self._read = sql(
            """
            SELECT coalesce(s.next_index, 0), coalesce(s.closed, false), ARRAY(
                SELECT k.data FROM (
                    SELECT c.idx, c.data,
                           sum(octet_length(c.data)) OVER (ORDER BY c.idx) AS upto
                    FROM @s@.chunks c
                    WHERE c.stream_id = $1 AND c.idx >= $2
                    ORDER BY c.idx LIMIT $3
                ) k
                WHERE k.upto - octet_length(k.data) < $4 OR k.idx = $2
                ORDER BY k.idx)
            FROM (SELECT 1) AS one LEFT JOIN @s@.streams s ON s.stream_id = $1
            """
        )
        self._delete = sql("SELECT @s@.delete_stream($1)")

    async def write(
        self, stream_id: str, chunks: Sequence[bytes], *, expect_next: int | None = None
    ) -> int:
        validate_write(stream_id, chunks, expect_next=expect_next)
        data = list(chunks)
        batch = uuid.uuid4()
        stream_tag = tag("s", stream_id)

        async def op(conn: Conn, retried: bool) -> tuple[int | None, bool, int | None]:
            row = await conn.fetchrow(
                self._write, stream_id, data, expect_next, batch, retried, stream_tag
            )
            return row[0], bool(row[1]), row[2]

        next_index, closed, actual = await self._db.run("write", op)
        if next_index is not None:
            return int(next_index)
        if closed:
            raise ClosedError(f"stream {stream_id!r} is closed; write to a new stream")
        assert actual is not None
        raise ConflictError(
            f"stream {stream_id!r} has next index {actual}, not the expected {expect_next}; "
            "read it and decide again",
            expected=expect_next if expect_next is not None else -1,
            actual=int(actual),
        )

    async def close(self, stream_id: str) -> None:
        validate_id(stream_id, "stream_id")
        stream_tag = tag("s", stream_id)

        async def op(conn: Conn, retried: bool) -> None:
            await conn.execute(self._close, stream_id, stream_tag)

        await self._db.run("close", op)

    async def info(self, stream_id: str) -> StreamInfo:
        validate_id(stream_id, "stream_id")

        async def op(conn: Conn, retried: bool) -> StreamInfo:
            row = await conn.fetchrow(self._info, stream_id)
            if row is None:
                return StreamInfo(stream_id=stream_id, next_index=0, closed=False)
            return StreamInfo(stream_id=stream_id, next_index=int(row[0]), closed=bool(row[1]))

        return await self._db.run(
            "info", op, absent=lambda: StreamInfo(stream_id=stream_id, next_index=0, closed=False)
        )

    def read(self, stream_id: str, *, start: int = 0) -> AsyncIterator[Chunk]:
        # Checked here, not in the generator (its body runs only at the first step), so that
        # a bad call fails at once, where it was made.
        validate_stream_read(stream_id, start=start)
        self._db.check_open("read")
        return self._follow(stream_id, start)

    async def _follow(self, stream_id: str, start: int) -> AsyncIterator[Chunk]:
        wake_tag = tag("s", stream_id)
        with self._listener.subscribe(wake_tag) as sub:
            waiter = Waiter(self._listener, wake_tag, sub)
            await waiter.start()
            position = start
            if position < 0:
                position = max(0, (await self.info(stream_id)).next_index + position)
            while True:
                waiter.arm()
                pos = position

                async def op(
                    conn: Conn, retried: bool, pos: int = pos
                ) -> tuple[int, bool, list[bytes]]:
                    row = await conn.fetchrow(self._read, stream_id, pos, _READ_CHUNKS, _READ_BYTES)
                    return int(row[0]), bool(row[1]), [bytes(d) for d in row[2]]

                next_index, closed, page = await self._db.run(
                    "read", op, absent=lambda: (0, False, [])
                )
                for data in page:
                    yield Chunk(index=position, data=data)
                    position += 1
                if page and position < next_index:
                    continue
                if closed and position >= next_index:
                    return
                await waiter.sleep()

    async def delete(self, stream_id: str) -> None:
        validate_id(stream_id, "stream_id")

        async def op(conn: Conn, retried: bool) -> None:
            await conn.execute(self._delete, stream_id)

        await self._db.run("delete", op, absent=lambda: None)
