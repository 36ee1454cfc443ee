"""StorageContract: a World creates its storage when something is first stored, never before.

Opening a World, asking it about itself (``world info``), and every call that stores nothing
(reads, waits that end empty, claims of an empty queue, calls on a lease or dead letter that
does not exist, deletes of what does not exist, ``purge``) answer as for an empty namespace
and create no storage: no folder, file, schema, table, key or collection. A mistyped namespace
or URL leaves no trace. The first call that stores something (``Log.append``,
``Queue.enqueue``, ``Stream.write`` or ``Stream.close``) creates what the namespace needs, also
when several Worlds, in this process or in others, do so at the same moment, and a reader
already waiting on the namespace sees what was written.

Whether storage was created is seen through the backend: a backend's test class overrides
the ``world_storage`` fixture with a :data:`StorageProbe`. Without one, the checks that need
it are skipped (saying so) and the others still run.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import pytest

from world_conformance._base import ContractBase
from world_conformance._process import _spawn
from world_conformance._support import WAIT, aclose, take, within
from world_conformance._target import WorldTarget
from world_core import (
    Chunk,
    LeaseLostError,
    NewEvent,
    NotFoundError,
    StreamInfo,
    World,
)
from world_core.spi import Lease

__all__ = ["StorageContract", "StorageProbe"]

StorageProbe = Callable[[str], Awaitable[object]]
"""What the World under test holds for a namespace (the argument), read from the store itself
(folders, files, schemas, tables, keys, collections), as a value compared by equality: empty
(falsy) when the namespace has no storage at all. It is called outside any World."""

QUIET = 0.3
"""Seconds a waiting call is given on an empty namespace before it is stopped."""


def _no_lease() -> Lease:
    """A lease this World never issued: its message does not exist."""
    return Lease(
        queue="q",
        message_id=uuid.uuid4().hex,
        payload=b"",
        attempt=1,
        max_attempts=1,
        token=uuid.uuid4().hex,
        deadline=0.0,
    )


async def _nothing_comes(iterator: AsyncIterator[object], what: str) -> None:
    """Wait QUIET seconds on ``iterator``: it must yield nothing, then close."""
    try:
        with anyio.move_on_after(QUIET):
            item = await anext(iterator)
            raise AssertionError(f"{what} on a namespace where nothing was stored: {item!r}")
    finally:
        with anyio.CancelScope(shield=True), anyio.fail_after(WAIT):
            await aclose(iterator)


async def _look_everywhere(world: World) -> None:
    """Every call that stores nothing, each answering as on an empty namespace."""
    assert world.name
    assert world.namespace
    world.capabilities.model_dump()
    dict(world.settings())
    log, queue, stream = world.log, world.queue, world.stream
    assert await log.read("l") == []
    assert await log.read("l", after=3, limit=2) == []
    assert await log.get("l", "k") is None
    assert await log.tail("l") == 0
    assert await log.info("l") is None
    page = await log.list_logs()
    assert (page.items, page.next_cursor) == ([], None)
    page = await log.list_logs(prefix="l", status="running", limit=1)
    assert (page.items, page.next_cursor) == ([], None)
    await _nothing_comes(log.watch("l"), "Log.watch yielded an event")
    assert await queue.claim("q", "w", lease=60.0) == []
    assert await queue.claim("q", "w", lease=60.0, limit=5, wait=QUIET) == []
    assert await queue.dead_letters("q") == []
    with pytest.raises(NotFoundError):
        await queue.requeue("q", uuid.uuid4().hex)
    lease = _no_lease()
    with pytest.raises(LeaseLostError):
        await queue.renew(lease, 60.0)
    with pytest.raises(LeaseLostError):
        await queue.release(lease)
    with pytest.raises(LeaseLostError):
        await queue.ack(lease)
    assert await stream.info("s") == StreamInfo(stream_id="s", next_index=0, closed=False)
    await _nothing_comes(stream.read("s"), "Stream.read yielded a chunk")
    await _nothing_comes(stream.read("s", start=-1), "Stream.read(start=-1) yielded a chunk")
    await log.delete("l")
    await stream.delete("s")
    await world.purge()


class StorageContract(ContractBase):
    """Storage is made by the first write: opening and reading a namespace create nothing."""

    contract_area = "storage"

    @pytest.fixture
    def world_storage(self) -> StorageProbe | None:
        """The backend's :data:`StorageProbe`; override it in the backend's test class.
        None (this default) skips the checks that look at the store itself."""
        return None

    @pytest.fixture
    def storage_probe(self, world_storage: StorageProbe | None) -> StorageProbe:
        if world_storage is None:
            pytest.skip(
                "the test class provides no world_storage probe (override the fixture with "
                "a function telling what the store holds for a namespace)"
            )
        return world_storage

    async def test_storage_untouched_namespace_reads_as_empty(
        self, world_target: WorldTarget
    ) -> None:
        """A namespace nothing was ever stored in answers every call that stores nothing as
        an empty one: no error, no waiting beyond what was asked, and the first write then
        works as on any namespace."""
        target = world_target.sibling()
        async with target.open() as world:
            await _look_everywhere(world)
        async with target.scratch() as world:
            await _look_everywhere(world)  # twice: the first look must not have changed it
            assert await world.log.append("l", [NewEvent(data=b"first", key="k")]) == 1
            assert [e.data for e in await world.log.read("l")] == [b"first"]

    async def test_storage_opening_and_reading_create_nothing(
        self, world_target: WorldTarget, storage_probe: StorageProbe
    ) -> None:
        """Opening a World on a fresh namespace, describing it and every call that stores
        nothing leave the store as it was; the first append then creates the storage (the
        probe sees it, so it is not blind)."""
        target = world_target.sibling()
        assert not await storage_probe(target.namespace), "a fresh namespace already has storage"
        async with target.open() as world:
            assert not await storage_probe(target.namespace), "opening a World created storage"
            await _look_everywhere(world)
        stored = await storage_probe(target.namespace)
        assert not stored, f"calls that store nothing created storage: {stored!r}"
        async with target.scratch() as world:
            await world.log.append("l", [NewEvent(data=b"first")])
            assert await storage_probe(target.namespace), "the probe does not see the storage"

    async def test_storage_world_info_creates_nothing(
        self, world_target: WorldTarget, storage_probe: StorageProbe
    ) -> None:
        """``world info`` on a mistyped namespace, run as a user runs it (a real process),
        describes the World and leaves no trace in the store."""
        target = world_target.sibling()
        argv = [sys.executable, "-m", "world_core._cli", "info", "--json"]
        argv += ["--world", target.name, "--namespace", target.namespace]
        if target.url is not None:
            argv += ["--url", target.url]
        done = await anyio.run_process(argv, check=False)
        assert done.returncode == 0, done.stderr.decode(errors="replace")
        assert json.loads(done.stdout)["namespace"] == target.namespace
        stored = await storage_probe(target.namespace)
        assert not stored, f"world info created storage: {stored!r}"

    @pytest.mark.parametrize("first", ["append", "enqueue", "write", "close"])
    async def test_storage_each_first_write_creates_it(
        self, world_target: WorldTarget, world_storage: StorageProbe | None, first: str
    ) -> None:
        """Each call that stores something works as the first call on a fresh namespace (it
        creates the storage itself), and what it stored reads back from another World."""
        target = world_target.sibling()
        async with target.scratch() as world:
            if first == "append":
                assert await world.log.append("x", [NewEvent(data=b"e")]) == 1
            elif first == "enqueue":
                await world.queue.enqueue("x", b"m")
            elif first == "write":
                assert await world.stream.write("x", [b"c"]) == 1
            else:
                await world.stream.close("x")
            if world_storage is not None:
                assert await world_storage(target.namespace), f"{first} created no storage"
            async with target.open() as other:
                if first == "append":
                    assert [e.data for e in await other.log.read("x")] == [b"e"]
                elif first == "enqueue":
                    leases = await other.queue.claim("x", "w", lease=60.0)
                    assert [lease.payload for lease in leases] == [b"m"]
                else:
                    info = await other.stream.info("x")
                    expected = (1, False) if first == "write" else (0, True)
                    assert (info.next_index, info.closed) == expected

    async def test_storage_first_writes_race(self, world_target: WorldTarget) -> None:
        """Two Worlds (two connections) make their first append, enqueue and stream write to
        a fresh namespace at the same moment: every call succeeds and nothing is lost, and
        waiters of a third World, started before the namespace had storage, see it all."""
        target = world_target.sibling()
        async with target.scratch() as watcher, target.open() as one, target.open() as two:
            go = anyio.Event()
            tails: list[int] = []
            ids: list[str] = []
            seen: dict[str, object] = {}

            async def writer(world: World, tag: bytes) -> None:
                await go.wait()
                async with anyio.create_task_group() as group:

                    async def append() -> None:
                        tails.append(await world.log.append("race", [NewEvent(data=tag)]))

                    async def enqueue() -> None:
                        ids.append(await world.queue.enqueue("race", tag))

                    async def write() -> None:
                        await world.stream.write("race", [tag])

                    for call in (append, enqueue, write):
                        group.start_soon(call)

            async def watch() -> None:
                events = await take(watcher.log.watch("race"), 2, what="watch before storage")
                seen["watch"] = sorted(e.data for e in events)

            async def claim() -> None:
                got: list[Lease] = []
                while len(got) < 2:
                    got += await watcher.queue.claim("race", "w", lease=60.0, limit=2, wait=WAIT)
                seen["claim"] = sorted(lease.payload for lease in got)

            async def read() -> None:
                chunks = await take(watcher.stream.read("race"), 2, what="read before storage")
                seen["read"] = [chunk.index for chunk in chunks]
                seen["chunks"] = sorted(chunk.data for chunk in chunks)

            with within("first writes of two Worlds at once, three waiters"):
                async with anyio.create_task_group() as group:
                    for waiter in (watch, claim, read):
                        group.start_soon(waiter)
                    group.start_soon(writer, one, b"one")
                    group.start_soon(writer, two, b"two")
                    await anyio.sleep(QUIET)  # the waiters are waiting
                    go.set()
            assert sorted(tails) == [1, 2]
            assert len(set(ids)) == 2
            both = [b"one", b"two"]
            assert seen == {"watch": both, "claim": both, "read": [0, 1], "chunks": both}
            assert [c.index for c in await _chunks(watcher, "race")] == [0, 1]

    @pytest.mark.world_process
    async def test_storage_first_writes_of_processes_race(
        self, world: World, world_target: WorldTarget
    ) -> None:
        """Processes that open a fresh namespace together and write to it at once (the first
        writes of all of them) all succeed: appends and stream writes, nothing lost."""
        batches = 4
        commands = [
            world_target.child_command(
                "append", "race", "--batches", str(batches), "--size", "2", "--tag", "a0"
            ),
            world_target.child_command(
                "append", "race", "--batches", str(batches), "--size", "2", "--tag", "a1"
            ),
            world_target.child_command(
                "write", "race", "--batches", str(batches), "--size", "2", "--tag", "w0"
            ),
        ]
        with within("three processes writing first to a fresh namespace at once"):
            async with _spawn(commands) as children:
                for child in children:
                    await child.go()
                async with anyio.create_task_group() as group:
                    for child in children:
                        group.start_soon(child.rest)
        events = await world.log.read("race")
        assert [e.seq for e in events] == list(range(1, 2 * 2 * batches + 1))
        assert sorted(e.data for e in events) == sorted(
            f"{tag}:{b}:{i}".encode()
            for tag in ("a0", "a1")
            for b in range(batches)
            for i in (0, 1)
        )
        chunks = await _chunks(world, "race")
        assert [c.data for c in chunks] == [
            f"w0:{b}:{i}".encode() for b in range(batches) for i in (0, 1)
        ]


async def _chunks(world: World, stream_id: str) -> list[Chunk]:
    """The chunks written so far (the stream stays open)."""
    count = (await world.stream.info(stream_id)).next_index
    return await take(world.stream.read(stream_id), count, what="written chunks")
