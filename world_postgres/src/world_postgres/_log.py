"""Log: events rows, dense seq settled by the primary key, watch through LISTEN/NOTIFY."""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import AsyncIterator, Sequence

import asyncpg

from world_core.errors import (
    BackendUnavailableError,
    ConflictError,
    DuplicateKeyError,
)
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
from world_postgres._db import Conn, Database, tag, tag_key
from world_postgres._notify import Listener
from world_postgres._wait import Waiter

__all__ = ["PostgresLog"]

_WATCH_BATCH = 256
# Appenders racing for the same seq retry at once; this bounds a pathological pile-up.
_MAX_SEQ_RACES = 10_000

# What the single-event INSERTs below return: the seq, where the event lies (its ctid, which
# the next append of this World names), and wake()'s work.
_RETURNING = """
    RETURNING seq, ctid, CASE
        WHEN pg_try_advisory_lock(@kr@, $6) THEN pg_advisory_unlock(@kr@, $6)
        ELSE pg_notify(@channel@, $7::text) IS NOT NULL
    END
"""

# One event appended to an existing log without a status or outbox messages, the common case,
# in one statement instead of a call of append() (whose statements cost about as much as the
# INSERT itself). It keeps append()'s guarantees: seq is the tail plus one, settled by
# events_pkey; the KEY SHARE lock on the tail event orders it against delete_log (schema
# version 3), since an advisory lock taken inside the statement would come after its snapshot:
# a delete that reaches the locked event waits for this append's commit and deletes again
# until a pass finds nothing, and an append whose tail event a delete removed meanwhile skips
# it (and every other event of the log, removed as well) and finds no row; wake() is inline,
# its writer lock taken before the check for waiters (the FROM item comes before RETURNING);
# batch lets a retry find the event. No row comes back when the log has no event (its first
# append, or deleted meanwhile) or expect_tail ($5) differs: then append() decides, with
# nothing written. The tail event, found by the probe that finds the tail, is locked instead
# of the log's row (schema version 2), which took one more index lookup per append.
_APPEND_ONE = (
    """
    INSERT INTO @s@.events (log_id, seq, key, data, batch)
    SELECT $1, g.seq + 1, $3::text, $2::bytea, $4::uuid
    FROM (
        SELECT e.seq, pg_advisory_xact_lock_shared(@kw@, $6::integer) AS writer
        FROM @s@.events e WHERE e.log_id = $1
        ORDER BY e.seq DESC LIMIT 1 FOR KEY SHARE OF e
    ) AS g
    WHERE $5::bigint IS NULL OR $5 = g.seq
    """
    + _RETURNING
)

# _APPEND_ONE with the tail event named instead of probed for: the event this World appended
# last to the log ($5, the seq it got, or expect_tail when that is the same), fetched by its
# ctid ($8, where the INSERT put it), which skips the index descent and costs about a quarter
# less server time (7 of 26 us over a plain INSERT, measured per statement with
# log_statement_stats). The same event is locked the same way, so delete_log is ordered as for
# _APPEND_ONE. That the event is the tail is settled by events_pkey: seqs are dense, so when
# $5 + 1 does not exist, $5 is the tail; when it does (another appender came in between), the
# INSERT fails with a unique violation and append() probes instead. No row comes back when the
# event is gone (a delete_log) or the ctid no longer holds it (moved by VACUUM FULL or CLUSTER,
# or its slot reused): the seq and log checks refuse any other event, and the probe follows.
# A World names an event only while it has seen nobody else append to the log (_appended), so
# a log with several writers is probed, after one refused statement each time a writer that
# was appending alone meets another.
_APPEND_AFTER = (
    """
    INSERT INTO @s@.events (log_id, seq, key, data, batch)
    SELECT $1, g.seq + 1, $3::text, $2::bytea, $4::uuid
    FROM (
        SELECT e.seq, pg_advisory_xact_lock_shared(@kw@, $6::integer) AS writer
        FROM @s@.events e WHERE e.ctid = $8::tid AND e.log_id = $1 AND e.seq = $5::bigint
        FOR KEY SHARE OF e
    ) AS g
    """
    + _RETURNING
)

# How many logs a World keeps the last appended event of (their _APPEND_AFTER hints); past
# that, the log appended to least recently is forgotten (its next append probes).
_TAILS = 4096
# Batch ids drawn from the system's random source at once (see PostgresLog._draw_batches).
_BATCHES = 256


@functools.lru_cache(maxsize=4096)
def _log_tag(log_id: str) -> tuple[str, int]:
    """A log's wake tag and its advisory-lock key, kept for the logs appended to recently."""
    log_tag = tag("l", log_id)
    return log_tag, tag_key(log_tag)


class PostgresLog(Log):
    def __init__(self, db: Database, listener: Listener) -> None:
        self._db = db
        self._listener = listener
        sql = db.sql
        self._append_one = sql(_APPEND_ONE)
        self._append_after = sql(_APPEND_AFTER)
        # Per log: the seq and ctid of the event this World appended last, and whether it may
        # be taken for the tail (nobody else was seen appending since): _APPEND_AFTER's hint;
        # with the log's wake tag and its lock key (_log_tag), which the next append sends.
        self._tails: dict[str, tuple[int, tuple[int, int], bool, str, int]] = {}
        self._batches: list[str] = []  # batch ids not used yet, see _draw_batches
        self._append = sql(
            "SELECT o_tail, o_actual, o_dup_seq, o_dup_key, o_dup_data FROM @s@.append("
            "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)"
        )
        self._read = sql(
            "SELECT seq, key, data FROM @s@.events WHERE log_id = $1 AND seq > $2"
            " ORDER BY seq LIMIT $3"
        )
        self._get = sql("SELECT seq, key, data FROM @s@.events WHERE log_id = $1 AND key = $2")
        self._tail = sql("SELECT coalesce(max(seq), 0) FROM @s@.events WHERE log_id = $1")
        self._info = sql(
            "SELECT l.status, (SELECT coalesce(max(e.seq), 0) FROM @s@.events e"
            " WHERE e.log_id = l.log_id) FROM @s@.logs l WHERE l.log_id = $1"
        )
        self._list = sql(
            "SELECT l.log_id, l.status, (SELECT coalesce(max(e.seq), 0) FROM @s@.events e"
            " WHERE e.log_id = l.log_id) FROM @s@.logs l"
            " WHERE l.log_id >= $1 AND ($2::text IS NULL OR l.log_id < $2)"
            " AND ($3::text IS NULL OR l.status = $3) AND ($4::text IS NULL OR l.log_id > $4)"
            " ORDER BY l.log_id LIMIT $5"
        )
        self._delete = sql("SELECT @s@.delete_log($1)")

    async def append(
        self,
        log_id: str,
        events: Sequence[NewEvent],
        *,
        expect_tail: int | None = None,
        status: str | None = None,
        messages: Sequence[OutboxMessage] = (),
    ) -> int:
        validate_append(log_id, events, expect_tail=expect_tail, status=status, messages=messages)
        batches = self._batches
        batch = batches.pop() if batches else self._draw_batches()
        # The arguments of _APPEND_AFTER and _APPEND_ONE, for a single event.
        after: tuple[object, ...] | None = None
        one: tuple[object, ...] | None = None
        previous: int | None = None  # the seq of this World's last append to the log
        retried = False
        if len(events) == 1 and status is None and not messages:
            event = events[0]
            # Taken out while this append runs: a concurrent one of this World probes.
            tail = self._tails.pop(log_id, None)
            if tail is not None:
                previous, _, _, log_tag, log_key = tail
            else:
                log_tag, log_key = _log_tag(log_id)
            one = (log_id, event.data, event.key, batch, expect_tail, log_key, log_tag)
            if tail is not None and tail[2] and (expect_tail is None or expect_tail == previous):
                after = (log_id, event.data, event.key, batch, previous, log_key, log_tag, tail[1])
            rows, retried = await self._db.first_try(
                self._append_after if after is not None else self._append_one,
                after if after is not None else one,
            )
            if rows:
                return self._appended(
                    log_id, rows[0], previous, log_tag, log_key, named=after is not None
                )
            # Then, under run, the probe (after the named statement, or a probe that failed or
            # found no idle connection), or append() at once after a probe that found no row
            # (no tail, or expect_tail differs).
            if after is None and rows is not None:
                one = None
        else:
            log_tag, log_key = _log_tag(log_id)
        # append()'s arguments before and after p_retry, built only when it is called.
        head: tuple[object, ...] = ()
        rest: tuple[object, ...] = ()

        async def op(conn: Conn, retried: bool) -> int:
            nonlocal head, rest
            for _ in range(_MAX_SEQ_RACES):
                try:
                    # A retry goes through append(), which first looks for the batch.
                    if one is not None and not retried:
                        rows = await conn.fetch(self._append_one, *one)
                        if rows:
                            return self._appended(
                                log_id, rows[0], previous, log_tag, log_key, named=False
                            )
                    if not head:
                        head, rest = _append_arguments(
                            log_id, events, expect_tail, status, batch, log_tag, messages
                        )
                    row = await conn.fetchrow(self._append, *head, retried, *rest)
                except asyncpg.UniqueViolationError as exc:
                    if exc.constraint_name == "events_pkey":
                        continue  # another appender took this seq first: count again
                    if exc.constraint_name == "events_key":
                        keys = [event.key for event in events]
                        existing = await self._first_existing(conn, log_id, keys)
                        if existing is not None:
                            raise self._duplicate(log_id, existing) from exc
                        continue  # a delete_log removed it meanwhile: the log starts again
                    raise
                if row["o_tail"] is not None:
                    return int(row["o_tail"])
                if row["o_actual"] is not None:
                    actual = int(row["o_actual"])
                    raise ConflictError(
                        f"log {log_id!r} has tail {actual}, not the expected {expect_tail}; "
                        "read the new events and decide again",
                        expected=expect_tail if expect_tail is not None else -1,
                        actual=actual,
                    )
                existing = Event(
                    seq=row["o_dup_seq"], key=row["o_dup_key"], data=bytes(row["o_dup_data"])
                )
                raise self._duplicate(log_id, existing)
            raise BackendUnavailableError(
                f"append to log {log_id!r} lost the race for a seq {_MAX_SEQ_RACES} times; "
                "nothing was written, retry later"
            )

        return await self._db.run("append", op, retried=retried)

    def _appended(
        self,
        log_id: str,
        row: asyncpg.Record,
        previous: int | None,
        log_tag: str,
        log_key: int,
        *,
        named: bool,
    ) -> int:
        """Keep the event just appended (``row``: seq, ctid) as the log's hint, with the log's
        ``_log_tag`` (``log_tag``, ``log_key``), unless another append of this World kept a
        later one meanwhile; returns its seq. The hint is trusted (named next time) after a
        named append, or when nobody else appended since this World's ``previous`` one (or
        there was none to compare with)."""
        seq = int(row[0])
        trusted = named or previous is None or previous == seq - 1
        tails = self._tails
        kept = tails.get(log_id)
        if kept is None:
            if len(tails) >= _TAILS:
                del tails[next(iter(tails))]  # appended to least recently: kept in that order
            tails[log_id] = (seq, row[1], trusted, log_tag, log_key)
        elif kept[0] < seq:
            tails[log_id] = (seq, row[1], trusted, log_tag, log_key)
        return seq

    def _draw_batches(self) -> str:
        """A batch id, and the next ``_BATCHES - 1`` in ``self._batches``.

        An append carries a batch id, random text for its ``uuid`` column (asyncpg encodes
        text in C, whereas a uuid.UUID and the .bytes it is encoded from cost about 15 us of
        CPU an append), so that a retry after a fault in doubt can tell whether the earlier
        try committed. Each is 128 bits from the system's random source, as when each append
        drew its own; drawing them 256 at a time saves the system call of every append (about
        3 us of CPU right after a round trip, when the caches are cold: os.urandom(16).hex()
        timed alone with the caches evicted before each call, against taking one from a
        list). The ids belong to this World: none is used twice.
        """
        text = os.urandom(16 * _BATCHES).hex()
        self._batches = [text[start : start + 32] for start in range(32, len(text), 32)]
        return text[:32]

    @staticmethod
    def _duplicate(log_id: str, existing: Event) -> DuplicateKeyError:
        return DuplicateKeyError(
            f"event key {existing.key!r} already exists in log {log_id!r} at seq "
            f"{existing.seq}; nothing of the batch was written (read .existing to reuse it)",
            key=existing.key or "",
            existing=existing,
        )

    async def _first_existing(
        self, conn: Conn, log_id: str, keys: list[str | None]
    ) -> Event | None:
        rows = await conn.fetch(
            self._db.sql(
                "SELECT seq, key, data FROM @s@.events WHERE log_id = $1 AND key = ANY ($2)"
                " ORDER BY seq LIMIT 1"
            ),
            log_id,
            [key for key in keys if key is not None],
        )
        return _event(rows[0]) if rows else None

    async def read(self, log_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        validate_read(log_id, after=after, limit=limit)

        async def op(conn: Conn, retried: bool) -> list[Event]:
            rows = await conn.fetch(self._read, log_id, after, limit)
            return [_event(row) for row in rows]

        return await self._db.run("read", op, absent=list)

    async def get(self, log_id: str, key: str) -> Event | None:
        validate_id(log_id, "log_id")
        validate_id(key, "key")

        async def op(conn: Conn, retried: bool) -> Event | None:
            row = await conn.fetchrow(self._get, log_id, key)
            return None if row is None else _event(row)

        return await self._db.run("get", op, absent=lambda: None)

    async def tail(self, log_id: str) -> int:
        validate_id(log_id, "log_id")

        async def op(conn: Conn, retried: bool) -> int:
            return int(await conn.fetchval(self._tail, log_id))

        return await self._db.run("tail", op, absent=lambda: 0)

    async def info(self, log_id: str) -> LogInfo | None:
        validate_id(log_id, "log_id")

        async def op(conn: Conn, retried: bool) -> LogInfo | None:
            row = await conn.fetchrow(self._info, log_id)
            if row is None:
                return None
            return LogInfo(log_id=log_id, tail=int(row[1]), status=row[0])

        return await self._db.run("info", op, absent=lambda: None)

    def watch(self, log_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        # Checked here, not in the generator (its body runs only at the first step), so that
        # a bad call fails at once, where it was made.
        validate_read(log_id, after=after)
        self._db.check_open("watch")
        return self._watch(log_id, after)

    async def _watch(self, log_id: str, after: int) -> AsyncIterator[Event]:
        wake_tag = tag("l", log_id)
        with self._listener.subscribe(wake_tag) as sub:
            waiter = Waiter(self._listener, wake_tag, sub)
            await waiter.start()
            position = after
            while True:
                waiter.arm()
                pos = position

                async def op(conn: Conn, retried: bool, pos: int = pos) -> list[Event]:
                    rows = await conn.fetch(self._read, log_id, pos, _WATCH_BATCH)
                    return [_event(row) for row in rows]

                batch: list[Event] = await self._db.run("watch", op, absent=list)
                for item in batch:
                    position = item.seq
                    yield item
                if len(batch) < _WATCH_BATCH:
                    await waiter.sleep()

    async def list_logs(
        self,
        *,
        prefix: str = "",
        status: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page[LogInfo]:
        after = validate_list(prefix=prefix, status=status, cursor=cursor, limit=limit)
        end = prefix_end(prefix)

        async def op(conn: Conn, retried: bool) -> Page[LogInfo]:
            rows = await conn.fetch(self._list, prefix, end, status, after, limit + 1)
            items = [LogInfo(log_id=r[0], status=r[1], tail=int(r[2])) for r in rows[:limit]]
            if len(rows) <= limit:
                return Page(items=items)
            last = items[-1].log_id
            return Page(items=items, next_cursor=list_cursor(last, prefix=prefix, status=status))

        return await self._db.run("list_logs", op, absent=lambda: Page(items=[]))

    async def delete(self, log_id: str) -> None:
        validate_id(log_id, "log_id")
        self._tails.pop(log_id, None)

        async def op(conn: Conn, retried: bool) -> None:
            await conn.execute(self._delete, log_id)

        await self._db.run("delete", op, absent=lambda: None)


def _append_arguments(
    log_id: str,
    events: Sequence[NewEvent],
    expect_tail: int | None,
    status: str | None,
    batch: str,
    log_tag: str,
    messages: Sequence[OutboxMessage],
) -> tuple[tuple[object, ...], tuple[object, ...]]:
    """The arguments of the append() function, those before p_retry and those after it."""
    keys = [event.key for event in events]
    head = (
        log_id,
        [event.data for event in events],
        keys if any(key is not None for key in keys) else None,
        expect_tail,
        status,
        batch,
    )
    if not messages:
        return head, (log_tag, None, None, None, None, None, None, None)
    rest = (
        log_tag,
        [uuid.uuid4().hex for _ in messages],
        [m.queue for m in messages],
        [m.payload for m in messages],
        [float(m.delay) for m in messages],
        [m.dedup_key for m in messages],
        [m.max_attempts for m in messages],
        [tag("q", m.queue) for m in messages],
    )
    return head, rest


def _event(row: asyncpg.Record) -> Event:
    return Event(seq=int(row[0]), key=row[1], data=bytes(row[2]))
