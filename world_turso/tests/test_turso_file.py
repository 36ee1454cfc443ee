"""Local-file specifics: WAL and table layout, a write lock held by another connection, wake-ups
across connections, integers past 32 bits, namespaces that prefix each other, closing."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import libsql
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from world_core import (
    BackendUnavailableError,
    ClosedError,
    ConflictError,
    DuplicateKeyError,
    InvalidArgumentError,
    NewEvent,
)
from world_turso import TursoWorld, connect

pytestmark = pytest.mark.anyio

WAIT = 20.0
CHILD = Path(__file__).with_name("turso_child.py")


def _path(url: str) -> Path:
    return Path(url.removeprefix("file:"))


def _query(path: Path, sql: str) -> list[tuple[object, ...]]:
    """Rows of ``sql`` through a plain libsql connection (the same SQLite build as the World:
    a second SQLite library in one process would not share its locks)."""
    raw = libsql.connect(str(path), isolation_level=None)
    try:
        rows: list[tuple[object, ...]] = raw.execute(sql).fetchall()
        return rows
    finally:
        raw.close()


@asynccontextmanager
async def _locked(path: Path) -> AsyncIterator[None]:
    """Another process holds the file's write lock for the duration."""
    async with await anyio.open_process([sys.executable, str(CHILD), "lock", str(path)]) as holder:
        assert holder.stdout is not None
        assert holder.stdin is not None
        with anyio.fail_after(WAIT):
            line = await BufferedByteReceiveStream(holder.stdout).receive_until(b"\n", 1024)
        assert json.loads(line) == {"locked": True}
        try:
            yield
        finally:
            await holder.stdin.send(b"go\n")
            with anyio.fail_after(WAIT):
                assert await holder.wait() == 0


async def test_wal_and_prefixed_tables(turso: TursoWorld, db_url: str) -> None:
    await turso.log.append("x", [NewEvent(data=b"1")])
    await turso.aclose()
    ((mode,),) = _query(_path(db_url), "PRAGMA journal_mode")
    names = {row[0] for row in _query(_path(db_url), "SELECT name FROM sqlite_master")}
    assert mode == "wal"
    assert {"w_t_logs", "w_t_events", "w_t_messages", "w_t_dead", "w_t_streams"} <= names


async def test_lock_held_elsewhere_times_out_then_clears(
    monkeypatch: pytest.MonkeyPatch, db_url: str
) -> None:
    """Another process holds the write lock: an append waits (on the event loop, not in
    SQLite's busy handler), gives up after WORKFLOW_TURSO_BUSY_TIMEOUT without writing, and one
    started while the lock is held completes once it is released."""
    path = _path(db_url)
    monkeypatch.setenv("WORKFLOW_TURSO_BUSY_TIMEOUT", "0.3")
    async with await connect(url=db_url, namespace="t") as world:
        async with _locked(path):
            with anyio.fail_after(WAIT), pytest.raises(BackendUnavailableError, match="locked"):
                await world.log.append("x", [NewEvent(data=b"refused")])
        assert await world.log.read("x") == []

    monkeypatch.setenv("WORKFLOW_TURSO_BUSY_TIMEOUT", str(WAIT))
    async with await connect(url=db_url, namespace="t") as world:
        ticks = 0
        tails: list[int] = []

        async def append() -> None:
            tails.append(await world.log.append("x", [NewEvent(data=b"waited")]))

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg, _locked(path):
                tg.start_soon(append)
                while ticks < 20:  # the loop runs while the append waits for the lock
                    await anyio.sleep(0.005)
                    ticks += 1
                assert tails == []
        assert tails == [1]


async def test_wakeups_across_connections(db_url: str) -> None:
    """Two Worlds on one file are two connections: a waiter of one is woken by the other's
    commit through PRAGMA data_version polling."""
    async with (
        await connect(url=db_url, namespace="t") as first,
        await connect(url=db_url, namespace="t") as second,
    ):
        seen: list[bytes] = []

        async def watch() -> None:
            async for event in first.log.watch("w"):
                seen.append(event.data)
                if len(seen) == 2:
                    return

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                await second.log.append("w", [NewEvent(data=b"a")])
                await second.log.append("w", [NewEvent(data=b"b")])
        assert seen == [b"a", b"b"]

        async def enqueue_later() -> None:
            await anyio.sleep(0.05)
            await second.queue.enqueue("q", b"job")

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(enqueue_later)
                leases = await first.queue.claim("q", "w1", lease=30, wait=WAIT)
        assert [lease.payload for lease in leases] == [b"job"]

        async def read_all() -> list[bytes]:
            return [chunk.data async for chunk in first.stream.read("s")]

        got: list[list[bytes]] = []

        async def reader() -> None:
            got.append(await read_all())

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(reader)
                await second.stream.write("s", [b"x", b"y"])
                await second.stream.close("s")
        assert got == [[b"x", b"y"]]


async def test_integers_past_32_bits(turso: TursoWorld) -> None:
    """libsql binds ints through 32 bits (larger ones became doubles); they must round-trip."""
    big = 2**53 + 1
    with pytest.raises(ConflictError) as caught:
        await turso.log.append("x", [NewEvent(data=b"1")], expect_tail=big)
    assert caught.value.actual == 0
    assert caught.value.expected == big
    assert await turso.log.read("x", after=big) == []
    with pytest.raises(InvalidArgumentError):  # spi.validate_read: after is >= 0
        await turso.log.read("x", after=-big)
    with pytest.raises(ConflictError):
        await turso.stream.write("s", [b"1"], expect_next=big)
    await turso.queue.enqueue("q", b"m", max_attempts=big)
    (lease,) = await turso.queue.claim("q", "w", lease=30)
    assert lease.max_attempts == big


async def test_namespaces_that_prefix_each_other(db_url: str) -> None:
    async with (
        await connect(url=db_url, namespace="a") as short,
        await connect(url=db_url, namespace="a_b") as longer,
    ):
        await short.log.append("x", [NewEvent(data=b"short")])
        await longer.log.append("x", [NewEvent(data=b"longer")])
        await short.purge()
        assert await short.log.read("x") == []
        assert [e.data for e in await longer.log.read("x")] == [b"longer"]
        await longer.purge()


async def test_list_prefix_at_code_point_edges(turso: TursoWorld) -> None:
    ids = ["a\U0010ffff", "a\U0010ffffz", "b", "\ud7ffx", "\ue000", "\U0010ffff\U0010ffff"]
    for log_id in ids:
        await turso.log.append(log_id, [NewEvent(data=b".")])
    page = await turso.log.list_logs(prefix="a\U0010ffff")
    assert [info.log_id for info in page.items] == ["a\U0010ffff", "a\U0010ffffz"]
    page = await turso.log.list_logs(prefix="\ud7ff")
    assert [info.log_id for info in page.items] == ["\ud7ffx"]
    page = await turso.log.list_logs(prefix="\U0010ffff")
    assert [info.log_id for info in page.items] == ["\U0010ffff\U0010ffff"]
    page = await turso.log.list_logs()
    assert [info.log_id for info in page.items] == sorted(ids)


async def test_requeue_gives_the_dedup_key_back_only_when_free(turso: TursoWorld) -> None:
    queue = turso.queue
    first = await queue.enqueue("q", b"1", dedup_key="k", max_attempts=1)
    (lease,) = await queue.claim("q", "w", lease=30)
    await queue.release(lease)
    assert [d.message_id for d in await queue.dead_letters("q")] == [first]
    await queue.requeue("q", first)
    assert await queue.enqueue("q", b"again", dedup_key="k") == first

    (lease,) = await queue.claim("q", "w", lease=30)
    await queue.release(lease)  # attempts 1 of 1: dead again
    second = await queue.enqueue("q", b"2", dedup_key="k")
    assert second != first
    await queue.requeue("q", first)  # "k" is taken by second: first comes back without it
    assert await queue.enqueue("q", b"3", dedup_key="k") == second


async def test_closed_world_refuses_calls(db_url: str) -> None:
    world = await connect(url=db_url, namespace="t")
    await world.aclose()
    await world.aclose()
    with pytest.raises(ClosedError):
        await world.log.append("x", [NewEvent(data=b"late")])
    with pytest.raises(ClosedError):
        await world.queue.claim("q", "w", lease=1, wait=1)


async def test_close_wakes_a_waiter(db_url: str) -> None:
    world = await connect(url=db_url, namespace="t")
    failures: list[BaseException] = []

    async def watch() -> None:
        try:
            async for _ in world.log.watch("nothing"):
                pass
        except ClosedError as exc:
            failures.append(exc)

    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await anyio.sleep(0.05)
            await world.aclose()
    assert len(failures) == 1


async def test_iterators_are_not_used_up_by_validation(turso: TursoWorld) -> None:
    """The SPI takes sequences; an iterator passed anyway is stored whole, not as nothing."""
    # The type: ignore comments below pass iterators where the SPI types say Sequence: that
    # misuse is what this test is about.
    events = (NewEvent(data=bytes([i])) for i in range(3))
    assert await turso.log.append("g", events) == 3  # type: ignore[arg-type]
    assert [e.data for e in await turso.log.read("g")] == [b"\x00", b"\x01", b"\x02"]
    chunks = iter([b"a", b"b"])
    assert await turso.stream.write("s", chunks) == 2  # type: ignore[arg-type]


async def test_a_held_key_past_the_first_lookup_refuses_the_whole_batch(
    turso: TursoWorld,
) -> None:
    await turso.log.append("l", [NewEvent(key="k550", data=b"old")])
    batch = [NewEvent(key=f"k{i}", data=b"new") for i in range(600)]  # past 500 keys
    with pytest.raises(DuplicateKeyError) as refused:
        await turso.log.append("l", batch)
    assert refused.value.key == "k550"
    assert refused.value.existing is not None
    assert refused.value.existing.data == b"old"
    assert await turso.log.tail("l") == 1
    with pytest.raises(DuplicateKeyError) as first:
        await turso.log.append("l", [NewEvent(key="x", data=b""), NewEvent(key="k550", data=b"")])
    assert first.value.key == "k550"
    assert [e.key for e in await turso.log.read("l")] == ["k550"]


async def test_a_wrong_tail_is_reported_before_a_held_key(turso: TursoWorld) -> None:
    await turso.log.append("l", [NewEvent(key="a", data=b"1"), NewEvent(data=b"2")])
    with pytest.raises(ConflictError) as conflict:
        await turso.log.append("l", [NewEvent(key="a", data=b"3")], expect_tail=5)
    assert conflict.value.actual == 2
    with pytest.raises(DuplicateKeyError):
        await turso.log.append("l", [NewEvent(key="a", data=b"3")], expect_tail=2)
    assert await turso.log.tail("l") == 2
