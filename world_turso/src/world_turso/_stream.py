"""Stream on libSQL: chunks keyed by (stream, index), a state row per stream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from functools import partial

from world_core.errors import ClosedError, ConflictError
from world_core.spi import (
    Chunk,
    Stream,
    StreamInfo,
    validate_id,
    validate_stream_read,
    validate_write,
)
from world_turso._db import Conn, Param, Tx, as_bytes, as_int
from world_turso._schema import Store

__all__ = ["TursoStream"]

_ROWS_PER_INSERT = 100
_READ_BATCH = 64  # chunks per query; a chunk may be up to the payload limit
_WAIT_MIN, _WAIT_MAX = 0.005, 0.2


class TursoStream(Stream):
    """``Stream`` on the namespace's ``streams`` and ``chunks`` tables; contract in
    ``world_core.spi``. Readers fetch at most 64 chunks per query."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._db = store.db
        self._t = store.tables

    def _state(self, conn: Conn, stream_id: str) -> tuple[int, bool]:
        row = conn.one(
            f"SELECT next_index, closed FROM {self._t.streams} WHERE stream_id = ?", [stream_id]
        )
        return (0, False) if row is None else (as_int(row[0]), bool(as_int(row[1])))

    async def write(
        self, stream_id: str, chunks: Sequence[bytes], *, expect_next: int | None = None
    ) -> int:
        if isinstance(chunks, Iterator):  # the validation would use it up
            chunks = list(chunks)
        validate_write(stream_id, chunks, expect_next=expect_next)
        batch = list(chunks)
        t = self._t

        def run(conn: Conn) -> int:
            next_index, closed = self._state(conn, stream_id)
            if closed:
                raise ClosedError(f"stream {stream_id!r} is closed; write to a new stream")
            if expect_next is not None and expect_next != next_index:
                raise ConflictError(
                    f"stream {stream_id!r} is at index {next_index}, not {expect_next}; "
                    "read it and decide again",
                    expected=expect_next,
                    actual=next_index,
                )
            for start in range(0, len(batch), _ROWS_PER_INSERT):
                part = batch[start : start + _ROWS_PER_INSERT]
                params: list[Param] = []
                for index, data in enumerate(part, start=next_index + start):
                    params += [stream_id, index, data]
                conn.exec(
                    f"INSERT INTO {t.chunks} (stream_id, idx, data) VALUES "
                    + ", ".join(["(?, ?, ?)"] * len(part)),
                    params,
                )
            new_next = next_index + len(batch)
            conn.exec(
                f"INSERT INTO {t.streams} (stream_id, next_index, closed) VALUES (?, ?, 0)"
                " ON CONFLICT (stream_id) DO UPDATE SET next_index = excluded.next_index",
                [stream_id, new_next],
            )
            return new_next

        return await self._store.write(run)

    async def close(self, stream_id: str) -> None:
        validate_id(stream_id, "stream_id")
        await self._store.write(
            lambda conn: conn.exec(
                f"INSERT INTO {self._t.streams} (stream_id, next_index, closed) VALUES (?, 0, 1)"
                " ON CONFLICT (stream_id) DO UPDATE SET closed = 1",
                [stream_id],
            )
        )

    async def info(self, stream_id: str) -> StreamInfo:
        validate_id(stream_id, "stream_id")
        next_index, closed = await self._store.use(
            lambda conn: self._state(conn, stream_id), lambda: (0, False), tx=Tx.NONE
        )
        return StreamInfo(stream_id=stream_id, next_index=next_index, closed=closed)

    def read(self, stream_id: str, *, start: int = 0) -> AsyncIterator[Chunk]:
        # Checked here, not in the generator (its body runs only at the first step), so that
        # a bad call fails at once, where it was made.
        start = validate_stream_read(stream_id, start=start)
        self._db.check_open()
        return self._read(stream_id, start)

    def _batch(self, conn: Conn, stream_id: str, start: int) -> tuple[list[Chunk], int, bool]:
        # One read transaction: the chunks and the closed flag come from the same snapshot,
        # so a reader never ends before a chunk written just before the close.
        rows = conn.rows(
            f"SELECT idx, data FROM {self._t.chunks} WHERE stream_id = ? AND idx >= ?"
            " ORDER BY idx LIMIT ?",
            [stream_id, start, _READ_BATCH],
        )
        next_index, closed = self._state(conn, stream_id)
        return [Chunk(index=as_int(r[0]), data=as_bytes(r[1])) for r in rows], next_index, closed

    async def _read(self, stream_id: str, start: int) -> AsyncIterator[Chunk]:
        db = self._db
        if start < 0:
            next_index, _ = await self._store.use(
                lambda conn: self._state(conn, stream_id), lambda: (0, False), tx=Tx.NONE
            )
            start = max(0, next_index + start)
        delay = _WAIT_MIN
        while True:
            since = db.snapshot()
            chunks, next_index, closed = await self._store.use(
                partial(self._batch, stream_id=stream_id, start=start),
                lambda: ([], 0, False),
                tx=Tx.READ,
            )
            for chunk in chunks:
                yield chunk
                start = chunk.index + 1
            if chunks:
                delay = _WAIT_MIN
                continue
            if closed and start >= next_index:
                return
            changed = await db.wait(since, delay)
            delay = _WAIT_MIN if changed else min(delay * 2, _WAIT_MAX)

    async def delete(self, stream_id: str) -> None:
        validate_id(stream_id, "stream_id")

        def run(conn: Conn) -> None:
            conn.exec(f"DELETE FROM {self._t.chunks} WHERE stream_id = ?", [stream_id])
            conn.exec(f"DELETE FROM {self._t.streams} WHERE stream_id = ?", [stream_id])

        await self._store.use(run, lambda: None, tx=Tx.WRITE)
