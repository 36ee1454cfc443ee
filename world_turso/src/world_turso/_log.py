"""Log on libSQL: events keyed by (log, seq), a tail row per log, settled under the write lock."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from functools import partial

from world_core.errors import ConflictError, DuplicateKeyError
from world_core.spi import (
    Event,
    Log,
    LogInfo,
    NewEvent,
    OutboxMessage,
    Page,
    list_cursor,
    prefix_end,
    validate_append,
    validate_id,
    validate_list,
    validate_read,
)
from world_turso._db import (
    Conn,
    Param,
    Row,
    Tx,
    as_bytes,
    as_int,
    as_opt_str,
    as_str,
)
from world_turso._queue import enqueue_in
from world_turso._schema import Store

__all__ = ["TursoLog"]

_ROWS_PER_INSERT = 100  # 400 parameters a statement, well under SQLite's limit
_KEYS_PER_LOOKUP = 500
_WATCH_BATCH = 256
_WAIT_MIN, _WAIT_MAX = 0.005, 0.2


def _event(row: Row) -> Event:
    return Event(seq=as_int(row[0]), key=as_opt_str(row[1]), data=as_bytes(row[2]))


class TursoLog(Log):
    """``Log`` on the namespace's ``logs`` and ``events`` tables; contract in ``world_core.spi``.

    Quirk: ``watch`` polls other connections' commits (5 ms doubling to 200 ms) and is woken
    at once by this World's own appends.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._db = store.db
        self._t = store.tables

    async def append(
        self,
        log_id: str,
        events: Sequence[NewEvent],
        *,
        expect_tail: int | None = None,
        status: str | None = None,
        messages: Sequence[OutboxMessage] = (),
    ) -> int:
        # An iterator is listed first: the validation would use it up.
        if isinstance(events, Iterator):
            events = list(events)
        if isinstance(messages, Iterator):
            messages = list(messages)
        validate_append(log_id, events, expect_tail=expect_tail, status=status, messages=messages)
        write = partial(self._write, log_id, list(events), expect_tail, status, list(messages))
        return await self._store.write(write)

    def _write(
        self,
        log_id: str,
        batch: list[NewEvent],
        expect_tail: int | None,
        status: str | None,
        outbox: list[OutboxMessage],
        conn: Conn,
    ) -> int:
        """The statements of :meth:`append` (arguments validated), inside its write
        transaction: the new tail."""
        t = self._t
        # One statement moves the tail and says where it was (a conflict rolls it back). The
        # status is assigned only when given: assigning it at all rewrites its index entry,
        # one more page in the WAL to fsync (3.5 pages a commit instead of 2.5).
        set_status = "" if status is None else ", status = excluded.status"
        row = conn.one(
            f"INSERT INTO {t.logs} (log_id, tail, status) VALUES (?, ?, ?) "
            f"ON CONFLICT (log_id) DO UPDATE SET tail = {t.logs}.tail + excluded.tail{set_status}"
            " RETURNING tail",
            [log_id, len(batch), status],
        )
        assert row is not None, "an upsert with RETURNING returns its row"
        new_tail = as_int(row[0])
        tail = new_tail - len(batch)
        if expect_tail is not None and expect_tail != tail:
            raise ConflictError(
                f"log {log_id!r} has tail {tail}, not {expect_tail}; read it and decide again",
                expected=expect_tail,
                actual=tail,
            )
        keys = [event.key for event in batch if event.key is not None]
        found: dict[str, Event] = {}
        for start in range(0, len(keys), _KEYS_PER_LOOKUP):
            chunk = keys[start : start + _KEYS_PER_LOOKUP]
            marks = ", ".join("?" * len(chunk))
            for hit in conn.rows(
                f"SELECT seq, key, data FROM {t.events} WHERE log_id = ? AND key IN ({marks})",
                [log_id, *chunk],
            ):
                existing = _event(hit)
                found[as_str(hit[1])] = existing
        for key in keys:
            if key in found:
                raise DuplicateKeyError(
                    f"log {log_id!r} already holds key {key!r} (seq {found[key].seq}); "
                    "nothing of the batch was written",
                    key=key,
                    existing=found[key],
                )
        for start in range(0, len(batch), _ROWS_PER_INSERT):
            part = batch[start : start + _ROWS_PER_INSERT]
            params: list[Param] = []
            for offset, event in enumerate(part, start=tail + 1 + start):
                params += [log_id, offset, event.key, event.data]
            conn.exec(
                f"INSERT INTO {t.events} (log_id, seq, key, data) VALUES "
                + ", ".join(["(?, ?, ?, ?)"] * len(part)),
                params,
            )
        if outbox:
            now = conn.now()
            for message in outbox:
                enqueue_in(
                    conn,
                    t,
                    now,
                    message.queue,
                    message.payload,
                    delay=message.delay,
                    dedup_key=message.dedup_key,
                    max_attempts=message.max_attempts,
                )
        return new_tail

    async def read(self, log_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        validate_read(log_id, after=after, limit=limit)
        return await self._store.use(
            lambda conn: self._read(conn, log_id, after, -1 if limit is None else limit),
            list,
            tx=Tx.NONE,
        )

    def _read(self, conn: Conn, log_id: str, after: int, limit: int) -> list[Event]:
        rows = conn.rows(
            f"SELECT seq, key, data FROM {self._t.events} WHERE log_id = ? AND seq > ?"
            " ORDER BY seq LIMIT ?",
            [log_id, after, limit],
        )
        return [_event(row) for row in rows]

    async def get(self, log_id: str, key: str) -> Event | None:
        validate_id(log_id, "log_id")
        validate_id(key, "event key")

        def run(conn: Conn) -> Event | None:
            row = conn.one(
                f"SELECT seq, key, data FROM {self._t.events} WHERE log_id = ? AND key = ?",
                [log_id, key],
            )
            return None if row is None else _event(row)

        return await self._store.use(run, lambda: None, tx=Tx.NONE)

    async def tail(self, log_id: str) -> int:
        info = await self.info(log_id)
        return 0 if info is None else info.tail

    async def info(self, log_id: str) -> LogInfo | None:
        validate_id(log_id, "log_id")

        def run(conn: Conn) -> LogInfo | None:
            row = conn.one(f"SELECT tail, status FROM {self._t.logs} WHERE log_id = ?", [log_id])
            if row is None:
                return None
            return LogInfo(log_id=log_id, tail=as_int(row[0]), status=as_opt_str(row[1]))

        return await self._store.use(run, lambda: None, tx=Tx.NONE)

    def watch(self, log_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        # Checked here, not in the generator (its body runs only at the first step), so that
        # a bad call fails at once, where it was made.
        after = validate_read(log_id, after=after)
        self._db.check_open()
        return self._watch(log_id, after)

    async def _watch(self, log_id: str, after: int) -> AsyncIterator[Event]:
        db = self._db
        delay = _WAIT_MIN
        while True:
            since = db.snapshot()
            events: list[Event] = await self._store.use(
                partial(self._read, log_id=log_id, after=after, limit=_WATCH_BATCH),
                list,
                tx=Tx.NONE,
            )
            for event in events:
                yield event
                after = event.seq
            if events:
                delay = _WAIT_MIN
                continue
            changed = await db.wait(since, delay)
            delay = _WAIT_MIN if changed else min(delay * 2, _WAIT_MAX)

    async def list_logs(
        self,
        *,
        prefix: str = "",
        status: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page[LogInfo]:
        start = validate_list(prefix=prefix, status=status, cursor=cursor, limit=limit)
        where = ["1"]
        params: list[Param] = []
        if prefix:
            where.append("log_id >= ?")
            params.append(prefix)
            upper = prefix_end(prefix)
            if upper is not None:
                where.append("log_id < ?")
                params.append(upper)
        if start is not None:
            where.append("log_id > ?")
            params.append(start)
        if status is not None:
            where.append("status = ?")
            params.append(status)
        sql = (
            f"SELECT log_id, tail, status FROM {self._t.logs} WHERE {' AND '.join(where)}"
            " ORDER BY log_id LIMIT ?"
        )
        rows: list[Row] = await self._store.use(
            lambda conn: conn.rows(sql, [*params, limit + 1]), list, tx=Tx.NONE
        )
        items = [
            LogInfo(log_id=as_str(row[0]), tail=as_int(row[1]), status=as_opt_str(row[2]))
            for row in rows[:limit]
        ]
        more = len(rows) > limit
        last = items[-1].log_id if more else None
        return Page[LogInfo](
            items=items,
            next_cursor=None if last is None else list_cursor(last, prefix=prefix, status=status),
        )

    async def delete(self, log_id: str) -> None:
        validate_id(log_id, "log_id")

        def run(conn: Conn) -> None:
            conn.exec(f"DELETE FROM {self._t.events} WHERE log_id = ?", [log_id])
            conn.exec(f"DELETE FROM {self._t.logs} WHERE log_id = ?", [log_id])

        await self._store.use(run, lambda: None, tx=Tx.WRITE)
