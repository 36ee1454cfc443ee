"""The connection pool's slots, without a server: ``take`` never suspends, never exceeds the
size, never overtakes a caller waiting in ``acquire``, and a waiter that gives up (timeout,
cancellation) loses no slot, even one handed to it as it gave up."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from world_postgres._db import _Pool

pytestmark = pytest.mark.anyio


class FakeConn:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    def is_closed(self) -> bool:
        return self.closed

    def is_in_transaction(self) -> bool:
        return False

    def terminate(self) -> None:
        self.closed = True


class Connector:
    def __init__(self) -> None:
        self.made: list[FakeConn] = []

    async def __call__(self) -> FakeConn:
        conn = FakeConn(f"c{len(self.made)}")
        self.made.append(conn)
        return conn


async def settle() -> None:
    """Let every ready task run until it waits again."""
    for _ in range(5):
        await asyncio.sleep(0)


def full_pool() -> tuple[_Pool, FakeConn]:
    """A pool of one connection, in use."""
    pool = _Pool(Connector(), 1)
    held = FakeConn("held")
    pool.keep(held)
    assert pool.take() is held
    return pool, held


async def two_waiters(pool: _Pool) -> tuple[asyncio.Task[Any], asyncio.Task[Any]]:
    """Two callers waiting in ``acquire``, the first one first."""
    first = asyncio.create_task(pool.acquire(5.0))
    await settle()
    second = asyncio.create_task(pool.acquire(5.0))
    await settle()
    return first, second


async def test_take_hands_out_idle_connections_within_the_size() -> None:
    pool = _Pool(Connector(), 1)
    first = FakeConn("first")
    pool.keep(first)
    assert pool.take() is first
    assert pool.take() is None  # the one slot is in use
    pool.release(first, reuse=True)
    assert pool.take() is first


async def test_take_skips_closed_idle_connections() -> None:
    pool = _Pool(Connector(), 2)
    dead, alive = FakeConn("dead"), FakeConn("alive")
    pool.keep(alive)
    pool.keep(dead)
    dead.closed = True
    assert pool.take() is alive
    assert pool.take() is None  # nothing idle: acquire connects


async def test_acquire_connects_up_to_the_size_then_waits() -> None:
    connector = Connector()
    pool = _Pool(connector, 2)
    one = await pool.acquire(1.0)
    two = await pool.acquire(1.0)
    assert len(connector.made) == 2
    with pytest.raises(TimeoutError):
        await pool.acquire(0.01)
    pool.release(one, reuse=True)
    assert await pool.acquire(1.0) is one
    pool.release(two, reuse=False)  # dropped: its slot is free, the connection is not reused
    three = await pool.acquire(1.0)
    assert three is connector.made[2]


async def test_waiters_are_served_in_order_and_take_does_not_overtake() -> None:
    pool, held = full_pool()
    first, second = await two_waiters(pool)
    pool.release(held, reuse=True)
    # The slot went to the first waiter, which has not run yet: the idle connection is not free.
    assert pool.take() is None
    got = await first
    assert got is held
    assert not second.done()
    pool.release(got, reuse=True)
    assert await second is held


async def test_a_timed_out_waiter_loses_no_slot() -> None:
    pool, held = full_pool()
    with pytest.raises(TimeoutError):
        await pool.acquire(0.01)
    pool.release(held, reuse=True)
    assert pool.take() is held


async def test_a_cancelled_waiter_passes_on_the_slot_it_was_handed() -> None:
    pool, held = full_pool()
    first, second = await two_waiters(pool)
    pool.release(held, reuse=True)  # hands the slot to the first waiter ...
    first.cancel()  # ... which is cancelled before it runs
    await settle()
    assert first.cancelled()
    async with asyncio.timeout(1.0):
        assert await second is held
