"""Enqueues and acks made at once share a statement (world_postgres/_merge.py): counted, not
timed, and checked to answer each call as it would alone."""

from __future__ import annotations

import contextlib
import itertools
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import anyio
import asyncpg
import pytest

from world_core import BackendUnavailableError, ClosedError, Lease, LeaseLostError
from world_core.spi import MAX_PAYLOAD_BYTES, NewEvent, OutboxMessage
from world_postgres import PostgresWorld, connect
from world_postgres._db import Database
from world_postgres._log import PostgresLog, _append_arguments, _log_tag
from world_postgres._queue import PostgresQueue

pytestmark = pytest.mark.anyio

WAIT = 30.0


@contextlib.contextmanager
def counting(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Counts ``Database.run`` calls by operation name: one per statement sent (a retry is
    inside its call)."""
    counts: dict[str, int] = {}
    original = Database.run

    async def run(
        self: Database, what: str, op: Callable[[Any, bool], Awaitable[Any]], **how: Any
    ) -> Any:
        counts[what] = counts.get(what, 0) + 1
        return await original(self, what, op, **how)

    monkeypatch.setattr(Database, "run", run)
    yield counts
    monkeypatch.setattr(Database, "run", original)


async def _leases(world: PostgresWorld, queue: str, count: int) -> list[Lease]:
    for n in range(count):
        await world.queue.enqueue(queue, str(n).encode())
    leases = await world.queue.claim(queue, "w", lease=120, limit=count)
    assert len(leases) == count
    return leases


async def test_acks_made_at_once_share_a_statement(
    pg_world: PostgresWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    leases = await _leases(pg_world, "q", 10)
    with counting(monkeypatch) as counts:
        async with anyio.create_task_group() as group:
            for lease in leases:
                group.start_soon(pg_world.queue.ack, lease)
    # The first alone, the nine that came while it was on the wire together.
    assert counts == {"ack": 2}
    assert await pg_world.queue.claim("q", "w", lease=120) == []
    for lease in leases:
        with pytest.raises(LeaseLostError):
            await pg_world.queue.ack(lease)


async def test_enqueues_made_at_once_share_a_statement_and_keep_their_order(
    pg_world: PostgresWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids: dict[int, str] = {}

    async def enqueue(n: int) -> None:
        ids[n] = await pg_world.queue.enqueue("q", str(n).encode())

    with counting(monkeypatch) as counts:
        async with anyio.create_task_group() as group:
            for n in range(20):
                group.start_soon(enqueue, n)
    assert counts == {"enqueue": 2}
    assert len(set(ids.values())) == 20
    leases = await pg_world.queue.claim("q", "w", lease=120, limit=50)
    assert {lease.message_id: lease.payload for lease in leases} == {
        i: str(n).encode() for n, i in ids.items()
    }
    # The first went alone, concurrently with the others: no order between it and them.
    # The merged ones are handed out in the order they were made.
    merged = [int(lease.payload) for lease in leases if lease.payload != b"0"]
    assert merged == list(range(1, 20))


async def test_merged_payloads_stay_within_what_one_call_may_carry(
    pg_world: PostgresWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = b"x" * (MAX_PAYLOAD_BYTES * 5 // 8)  # two of them would be more than one call's
    with counting(monkeypatch) as counts:
        async with anyio.create_task_group() as group:
            group.start_soon(pg_world.queue.enqueue, "q", b"alone")
            for _ in range(3):
                group.start_soon(pg_world.queue.enqueue, "q", big)
            for _ in range(3):
                group.start_soon(pg_world.queue.enqueue, "q", b"small")
    # The three big ones one a statement, the small ones with the last of them.
    assert counts == {"enqueue": 4}
    leases = await pg_world.queue.claim("q", "w", lease=120, limit=10)
    assert sorted(len(lease.payload) for lease in leases) == [5, 5, 5, 5] + [len(big)] * 3


async def test_merged_acks_of_one_lease_one_wins(
    pg_world: PostgresWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, lease = await _leases(pg_world, "q", 2)
    outcomes: list[str] = []

    async def ack(which: Lease) -> None:
        try:
            await pg_world.queue.ack(which)
            outcomes.append("acked")
        except LeaseLostError:
            outcomes.append("lost")

    with counting(monkeypatch) as counts:
        async with anyio.create_task_group() as group:
            group.start_soon(ack, first)  # alone; the three acks of one lease go together
            for _ in range(3):
                group.start_soon(ack, lease)
    assert counts == {"ack": 2}
    assert sorted(outcomes) == ["acked", "acked", "lost", "lost"]


async def test_merged_enqueues_of_one_dedup_key_add_one(
    pg_world: PostgresWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = await pg_world.queue.enqueue("q", b"held", dedup_key="held")
    ids: list[str] = []

    async def enqueue(payload: bytes, key: str | None) -> None:
        ids.append(await pg_world.queue.enqueue("q", payload, dedup_key=key))

    with counting(monkeypatch) as counts:
        async with anyio.create_task_group() as group:
            group.start_soon(enqueue, b"alone", None)
            for n in range(3):
                group.start_soon(enqueue, f"new {n}".encode(), "new")
            group.start_soon(enqueue, b"again", "held")
    assert counts == {"enqueue": 2}
    assert held in ids
    new = [i for i in ids[1:] if i != held]
    assert len(new) == 3, ids
    assert len(set(new)) == 1, ids
    leases = await pg_world.queue.claim("q", "w", lease=120, limit=10)
    assert sorted(lease.payload for lease in leases) == [b"alone", b"held", b"new 0"]


@contextlib.asynccontextmanager
async def _rows_locked(
    pg_url: str, world: PostgresWorld, leases: list[Lease]
) -> AsyncIterator[Callable[[int], Awaitable[None]]]:
    """The leases' rows locked by another connection until the block ends; yields a function
    that returns once ``n`` sessions wait for those locks (seen from a third connection: a
    transaction sees pg_stat_activity as it was at its first look)."""
    holder: Any = await asyncpg.connect(pg_url)
    observer: Any = await asyncpg.connect(pg_url)
    try:
        holder_pid = await holder.fetchval("SELECT pg_backend_pid()")
        transaction = holder.transaction()
        await transaction.start()
        await holder.execute(
            f'SELECT 1 FROM "world_{world.namespace}".messages WHERE id = ANY ($1::text[])'
            " FOR UPDATE",
            [lease.message_id for lease in leases],
        )

        async def waiting(n: int) -> None:
            with anyio.fail_after(WAIT):
                for _ in itertools.count():
                    blocked = await observer.fetchval(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE $1 = ANY (pg_blocking_pids(pid))",
                        holder_pid,
                    )
                    if blocked >= n:
                        return
                    await anyio.sleep(0.01)

        try:
            yield waiting
        finally:
            await transaction.rollback()
    finally:
        await holder.close()
        await observer.close()


async def test_a_merged_call_cancelled_before_its_statement_left_is_not_sent(
    pg_world: PostgresWorld, pg_url: str
) -> None:
    a, b, c = await _leases(pg_world, "q", 3)
    async with anyio.create_task_group() as group, _rows_locked(pg_url, pg_world, [a, b]) as wait:
        group.start_soon(pg_world.queue.ack, a)  # alone, held by the lock
        await wait(1)
        group.start_soon(pg_world.queue.ack, b)  # merged, held too: two statements in flight
        await wait(2)
        with anyio.CancelScope() as scope:
            scope.cancel()  # c's caller waits for a statement to end, and gives up
            await pg_world.queue.ack(c)
        assert scope.cancelled_caught
    await pg_world.queue.ack(c)  # c's lease is still current: nothing acked it


async def test_closing_the_world_fails_merged_calls(pg_url: str) -> None:
    world = await connect(url=pg_url, namespace=f"pgt_{secrets.token_hex(8)}")
    try:
        a, b, c = await _leases(world, "q", 3)
        errors: dict[str, type[BaseException]] = {}

        async def ack(lease: Lease) -> None:
            try:
                await world.queue.ack(lease)
            except (ClosedError, BackendUnavailableError) as exc:
                errors[lease.message_id] = type(exc)

        with anyio.fail_after(WAIT):
            async with (
                anyio.create_task_group() as group,
                _rows_locked(pg_url, world, [a, b]) as wait,
            ):
                group.start_soon(ack, a)
                await wait(1)
                group.start_soon(ack, b)
                await wait(2)
                group.start_soon(ack, c)  # waits: two statements are in flight
                await anyio.sleep(0.05)
                await world.aclose()
        # a and b were on the wire (held by the lock): whether they acked is unknown to the
        # caller; c had not left: nothing written (the SPI's World.aclose).
        assert errors == {
            a.message_id: BackendUnavailableError,
            b.message_id: BackendUnavailableError,
            c.message_id: ClosedError,
        }, errors
    finally:
        reopened = await connect(url=pg_url, namespace=world.namespace)
        await reopened.purge()
        await reopened.aclose()
        await world.aclose()


ROUNDS = 8
"""Rounds of :func:`_opposite_orders_behind_a_held_key`: each deadlocks in the callers' order
about half the time."""


async def _opposite_orders_behind_a_held_key(
    pg_world: PostgresWorld,
    pg_url: str,
    keys_of: Callable[[int], list[str]],
    insert: Callable[[str, Any, int, list[str]], Coroutine[Any, Any, None]],
) -> None:
    """ROUNDS rounds of: a transaction holds the second of ``keys_of(round)``; ``insert``
    ("first") takes the keys in that order and waits for it, then ("second") in the opposite
    order and waits too; the holder rolls back. Inserted in the callers' order, the one that
    gets the held key may then wait for the other's first key while the other waits for it:
    a deadlock, broken by PostgreSQL after deadlock_timeout with an error."""
    schema = f'"world_{pg_world.namespace}"'
    holder: Any = await asyncpg.connect(pg_url)
    first: Any = await asyncpg.connect(pg_url)
    second: Any = await asyncpg.connect(pg_url)
    observer: Any = await asyncpg.connect(pg_url)

    async def waiting(pid: int) -> None:
        with anyio.fail_after(WAIT):
            for _ in itertools.count():
                if await observer.fetchval("SELECT cardinality(pg_blocking_pids($1)) > 0", pid):
                    return
                await anyio.sleep(0.01)

    try:
        first_pid = await first.fetchval("SELECT pg_backend_pid()")
        second_pid = await second.fetchval("SELECT pg_backend_pid()")
        for round_ in range(ROUNDS):
            keys = keys_of(round_)
            transaction = holder.transaction()
            await transaction.start()
            await holder.execute(
                f"INSERT INTO {schema}.messages (id, queue, payload, visible_at, max_attempts,"
                " dedup_key) VALUES ($1, 'q', '', now(), 10, $2)",
                secrets.token_hex(16),
                keys[1],
            )
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as group:
                    group.start_soon(insert, "first", first, round_, keys)
                    await waiting(first_pid)
                    group.start_soon(insert, "second", second, round_, keys[::-1])
                    await waiting(second_pid)
                    await transaction.rollback()
    finally:
        for conn in (holder, first, second, observer):
            await conn.close()


async def test_merged_enqueues_of_dedup_keys_in_opposite_orders_do_not_deadlock(
    pg_world: PostgresWorld, pg_url: str
) -> None:
    """Two merged statements each inserting keys k1 and k2, in opposite orders, behind a
    held k2 (see _opposite_orders_behind_a_held_key). In key order, both take k1 first."""
    queue = pg_world.queue
    assert isinstance(queue, PostgresQueue)
    await queue.enqueue("q", b"makes the schema")
    found: dict[tuple[str, int], list[str | None]] = {}

    async def enqueue(name: str, conn: Any, round_: int, keys: list[str]) -> None:
        items = [(secrets.token_hex(16), "q", b"m", 0.0, 10, key) for key in keys]
        found[name, round_] = await queue._enqueue_batch(conn, False, items)

    await _opposite_orders_behind_a_held_key(
        pg_world, pg_url, lambda round_: [f"k1-{round_}", f"k2-{round_}"], enqueue
    )
    for round_ in range(ROUNDS):  # one message a key, whoever inserted it
        assert found["first", round_] == found["second", round_][::-1]


async def test_outbox_appends_of_dedup_keys_in_opposite_orders_do_not_deadlock(
    pg_world: PostgresWorld, pg_url: str
) -> None:
    """The same circle between two appends (to two logs) whose outbox messages hold dedup
    keys k1 and k2 in opposite orders: append() inserts them in key order too, and the
    messages keep the order they were given in, in seq (what a claim hands out first)."""
    log = pg_world.log
    assert isinstance(log, PostgresLog)
    await log.append("made", [NewEvent(data=b"makes the schema")])

    async def append(name: str, conn: Any, round_: int, keys: list[str]) -> None:
        log_id = f"{name}-{round_}"
        messages = [OutboxMessage(queue="q", payload=key.encode(), dedup_key=key) for key in keys]
        batch = str(uuid.uuid4())
        head, rest = _append_arguments(
            log_id, [NewEvent(data=b"e")], None, None, batch, _log_tag(log_id)[0], messages
        )
        row = await conn.fetchrow(log._append, *head, False, *rest)
        assert row["o_tail"] is not None

    # k2 sorts first, so that the array order and the key order differ for "first".
    await _opposite_orders_behind_a_held_key(
        pg_world, pg_url, lambda round_: [f"k2-{round_}", f"k1-{round_}"], append
    )
    held = await pg_world.queue.claim("q", "w", lease=60.0, limit=4 * ROUNDS)
    assert sorted(lease.payload.decode() for lease in held) == sorted(  # one message a key
        f"k{n}-{round_}" for n in (1, 2) for round_ in range(ROUNDS)
    )
    # Inserted in key order, the messages of one append are still handed out in the order
    # they were given (by seq).
    ordered = [OutboxMessage(queue="order", payload=key.encode(), dedup_key=key) for key in "zam"]
    await log.append("ordered", [NewEvent(data=b"e")], messages=ordered)
    leases = await pg_world.queue.claim("order", "w", lease=60.0, limit=3)
    assert [lease.payload for lease in leases] == [b"z", b"a", b"m"]
