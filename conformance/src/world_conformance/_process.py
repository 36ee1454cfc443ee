"""ProcessContract: several OS processes on one World, and a writer killed with SIGKILL.

Children are ``python -m world_conformance._child`` opening the same World by name, URL and
namespace, so these tests work for any backend whose ``Capabilities.shared`` is true.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import tempfile
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import IO, Any

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from world_conformance._base import ContractBase
from world_conformance._support import WAIT, eventually, take, within
from world_conformance._target import WorldTarget
from world_core import Chunk, Event, NewEvent, World

__all__ = ["ProcessContract"]

LONG_LEASE = 120.0

IDLE = 3.0
"""Seconds the waiters of the wake-up contract wait before another process writes: long
enough for a waiter that polls to have backed off to its longest interval."""

NATIVE_WAKE = float(os.environ.get("WORLD_CONFORMANCE_WAKE", "") or 1.0)
"""Seconds within which a waiter of a World with ``Capabilities.native_wakeups`` must see a
write another process made (after idling IDLE seconds): a bound, not an expectation (a store's
notification takes milliseconds), well below the polling intervals of the Worlds that poll.
``WORLD_CONFORMANCE_WAKE`` changes it."""


class _Child:
    """One child process: JSON lines out, a go-line in, stderr kept for the failure message."""

    def __init__(self, process: Process, stderr: IO[bytes]) -> None:
        self.process = process
        self.stderr = stderr
        assert process.stdout is not None
        self._out = BufferedByteReceiveStream(process.stdout)

    def errors(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-4000:]

    async def line(self) -> dict[str, Any] | None:
        """The next JSON line, or None at end of output."""
        try:
            raw = await self._out.receive_until(b"\n", 1 << 20)
        except (anyio.IncompleteRead, anyio.EndOfStream, anyio.ClosedResourceError):
            return None
        value = json.loads(raw)
        assert isinstance(value, dict)
        return value

    async def ready(self) -> None:
        with anyio.fail_after(WAIT * 2):
            first = await self.line()
        assert first == {"ready": True}, f"child did not start: {first!r}\n{self.errors()}"

    async def go(self) -> None:
        await self.send("go")

    async def send(self, line: str) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(line.encode() + b"\n")

    async def rest(self) -> list[dict[str, Any]]:
        """Every remaining line, then the exit status, which must be 0."""
        lines: list[dict[str, Any]] = []
        with anyio.fail_after(WAIT * 3):
            while (item := await self.line()) is not None:
                lines.append(item)
            code = await self.process.wait()
        assert code == 0, f"child exited with {code}:\n{self.errors()}"
        return lines


@asynccontextmanager
async def _spawn(commands: list[list[str]]) -> AsyncIterator[list[_Child]]:
    """Start children, wait until each has opened the World; kill leftovers on the way out."""
    children: list[_Child] = []
    async with AsyncExitStack() as stack:
        for argv in commands:
            stderr = stack.enter_context(tempfile.TemporaryFile())  # noqa: SIM115 (it is one)
            process = await anyio.open_process(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr
            )
            stack.push_async_callback(_reap, process)
            children.append(_Child(process, stderr))
        for child in children:
            await child.ready()
        yield children


async def _reap(process: Process) -> None:
    with anyio.CancelScope(shield=True):
        if process.returncode is None:
            process.kill()
        with anyio.move_on_after(WAIT):
            await process.wait()
        await process.aclose()


def _parse(event: Event | Chunk) -> tuple[str, int, int]:
    """(tag, batch, index) of what a child wrote; (its data, -1, -1) for anything else."""
    text = event.data.rstrip(b"\x00").decode(errors="replace")
    match text.split(":"):
        case [tag, batch, index] if batch.isdigit() and index.isdigit():
            return tag, int(batch), int(index)
        case _:
            return text[:40], -1, -1


async def _kill_at_random(child: _Child, acks: int) -> list[dict[str, Any]]:
    """Let the child run until it reported ``acks`` lines, kill it at a random instant soon
    after, and return every line it printed (those are acknowledged operations).

    The kill does not end what the child had already sent: a store may finish an operation in
    flight at the kill (a server executing the statement it received) at any later instant,
    before or after the reads that follow. Contracts count on that operation being whole or
    absent, never on when it resolves."""
    await child.go()
    lines: list[dict[str, Any]] = []
    with anyio.fail_after(WAIT * 3):
        while len(lines) < acks:
            line = await child.line()
            assert line is not None, f"child died:\n{child.errors()}"
            lines.append(line)
    await anyio.sleep(random.uniform(0.0, 0.05))
    child.process.kill()
    with anyio.fail_after(WAIT):
        await child.process.wait()
        while (line := await child.line()) is not None:
            lines.append(line)
    return lines


def _whole_batches(
    events: list[Event], size_of: dict[str, int], *, singles: frozenset[bytes] = frozenset()
) -> dict[tuple[str, int], int]:
    """Check a log written by batch appenders (and single events whose data is in
    ``singles``): dense from 1; each batch whole and on consecutive positions; batches in
    order per tag, from 0. Returns the tail (seq of the last event) of each batch."""
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), "positions not dense"
    tails: dict[tuple[str, int], int] = {}
    position = 0
    last: dict[str, int] = {}
    while position < len(events):
        if events[position].data in singles:
            position += 1
            continue
        tag, batch, index = _parse(events[position])
        assert index == 0, f"seq {events[position].seq} starts inside a batch: {tag}:{batch}"
        size = size_of[tag]
        run = [_parse(e) for e in events[position : position + size]]
        assert run == [(tag, batch, i) for i in range(size)], f"batch {tag}:{batch} is torn"
        assert batch == last.get(tag, -1) + 1, f"{tag} batches out of order at {batch}"
        last[tag] = batch
        tails[(tag, batch)] = events[position + size - 1].seq
        position += size
    return tails


def _check_killed_appenders(
    tails: dict[tuple[str, int], int],
    acknowledged: dict[tuple[str, int], int],
    in_flight: dict[str, int],
) -> None:
    """What a log holds of appenders killed at random instants, read at any time after the
    kills: every acknowledged batch at the tail its append returned; of each appender's batch
    in flight at its kill (``in_flight[tag]``, sent, never acknowledged), all or nothing, as
    the store resolves it, perhaps only later; nothing after it (the appender never sent
    more). ``tails`` is what :func:`_whole_batches` returned for the read."""
    for key, tail in acknowledged.items():
        assert tails.get(key) == tail, f"acknowledged batch {key} lost or moved"
    for tag, unsure in in_flight.items():
        stored = len([key for key in tails if key[0] == tag])
        assert stored in (unsure, unsure + 1), (
            f"appender {tag} was killed after {unsure} acknowledged batches: the log holds "
            f"those and the batch in flight at the kill, whole or not at all, so {unsure} or "
            f"{unsure + 1} batches of {tag}, not {stored}"
        )


def _check_whole_writes(chunks: list[Chunk], size: int, tag: str) -> None:
    """Chunks indexed densely from 0, written by whole writes of ``size`` chunks in order."""
    assert [c.index for c in chunks] == list(range(len(chunks))), "indexes not dense"
    found = [_parse(c) for c in chunks]
    expected = [(tag, b, i) for b in range(len(chunks) // size) for i in range(size)]
    pairs = zip(found, expected, strict=False)
    at = next((i for i, (got, want) in enumerate(pairs) if got != want), len(expected))
    assert found == expected, (
        f"a write was torn or reordered: of {len(chunks)} chunks, written {size} at a time, "
        f"chunk {at} holds {found[at]}"
    )


class ProcessContract(ContractBase):
    """Concurrency and crashes across real OS processes (``Capabilities.shared``)."""

    contract_area = "process"

    @pytest.fixture
    def shared_world(self, world: World) -> World:
        if not world.capabilities.shared:
            pytest.skip("Capabilities.shared is false: one process at a time")
        return world

    @pytest.mark.world_process
    async def test_process_concurrent_appenders_dense(
        self, shared_world: World, world_target: WorldTarget
    ) -> None:
        sizes = {"p0": 1, "p1": 2, "p2": 3}
        batches = 12
        commands = [
            world_target.child_command(
                "append", "multi", "--batches", str(batches), "--size", str(size), "--tag", tag
            )
            for tag, size in sizes.items()
        ]
        results: dict[str, list[dict[str, Any]]] = {}
        async with _spawn(commands) as children:
            for child in children:
                await child.go()

            async def collect(tag: str, child: _Child) -> None:
                results[tag] = await child.rest()

            async with anyio.create_task_group() as group:
                for tag, child in zip(sizes, children, strict=True):
                    group.start_soon(collect, tag, child)
        events = await shared_world.log.read("multi")
        assert len(events) == batches * sum(sizes.values())
        _whole_batches(events, sizes)
        by_data = {_parse(e): e.seq for e in events}
        for tag, lines in results.items():
            assert [line["batch"] for line in lines] == list(range(batches))
            for line in lines:
                assert by_data[(tag, line["batch"], sizes[tag] - 1)] == line["tail"]

    @pytest.mark.world_process
    async def test_process_killed_writer_leaves_whole_batches(
        self, shared_world: World, world_target: WorldTarget
    ) -> None:
        """SIGKILL lands at a random instant of a stream of appends; twice. The log holds
        whole batches only, densely: every acknowledged batch where its append said, and of
        the batch in flight at each kill all or nothing; and it takes appends again.

        The batch in flight may land at any instant after the kill, also between the reads
        here and around the append after them (a server finishing the killed process's
        statement late): each check holds whenever it lands."""
        size, pad = 16, 4096
        sizes: dict[str, int] = {}
        acknowledged: dict[tuple[str, int], int] = {}
        in_flight: dict[str, int] = {}
        for round_ in range(2):
            tag = f"k{round_}"
            sizes[tag] = size
            argv = world_target.child_command(
                "append", "crash", "--batches", "1000000", "--size", str(size),
                "--tag", tag, "--pad", str(pad),
            )  # fmt: skip
            async with _spawn([argv]) as (child,):
                lines = await _kill_at_random(child, 3)
            assert [line["batch"] for line in lines] == list(range(len(lines))), lines
            in_flight[tag] = len(lines)
            for line in lines:
                acknowledged[(tag, line["batch"])] = line["tail"]
        log = shared_world.log
        events = await log.read("crash")
        _check_killed_appenders(_whole_batches(events, sizes), acknowledged, in_flight)
        tail = await log.append("crash", [NewEvent(data=b"after")])
        later = await log.read("crash")
        assert later[: len(events)] == events, "stored events changed after the kills"
        assert [e.seq for e in later if e.data == b"after"] == [tail], (
            f"the append after the kills returned tail {tail}: its event belongs there, once"
        )
        assert tail > len(events), f"the append after the kills returned {tail}, not a new tail"
        everything = _whole_batches(later, sizes, singles=frozenset({b"after"}))
        _check_killed_appenders(everything, acknowledged, in_flight)

    @pytest.mark.world_process
    async def test_process_claimers_never_share(
        self, shared_world: World, world_target: WorldTarget
    ) -> None:
        ids = {await shared_world.queue.enqueue("jobs", str(i).encode()) for i in range(24)}
        commands = [
            world_target.child_command("claim", "jobs", "--worker", f"w{i}", "--limit", "2")
            for i in range(2)
        ]
        claimed: list[str] = []
        async with _spawn(commands) as children:
            for child in children:
                await child.go()

            async def collect(child: _Child) -> None:
                claimed.extend(line["id"] for line in await child.rest())

            async with anyio.create_task_group() as group:
                for child in children:
                    group.start_soon(collect, child)
        assert sorted(claimed) == sorted(ids), "a message went to two processes, or was lost"
        assert await shared_world.queue.claim("jobs", "w", lease=60.0) == []

    @pytest.mark.world_process
    async def test_process_killed_worker_loses_no_message(
        self, shared_world: World, world_target: WorldTarget
    ) -> None:
        """A worker claiming and acking is killed at a random instant. Acked messages never
        come back; every other one is delivered again (the one in flight after its lease
        expired, with attempt 2; the rest untouched, attempt 1)."""
        queue = shared_world.queue
        ids = {await queue.enqueue("work", str(i).encode()) for i in range(40)}
        argv = world_target.child_command("work", "work", "--worker", "doomed", "--lease", "1.0")
        async with _spawn([argv]) as (child,):
            lines = await _kill_at_random(child, 6)
        claimed = {line["claimed"] for line in lines if "claimed" in line}
        acked = {line["acked"] for line in lines if "acked" in line}
        in_doubt = claimed - acked  # killed between the claim and the report of its ack
        assert acked <= claimed <= ids
        assert len(in_doubt) <= 1
        back: dict[str, int] = {}

        async def probe() -> bool | None:
            for lease in await queue.claim("work", "survivor", lease=LONG_LEASE, limit=50):
                assert lease.message_id not in back, "delivered twice to live leases"
                back[lease.message_id] = lease.attempt
            return True if ids - acked - in_doubt <= back.keys() else None

        await eventually(probe, "every unacknowledged message delivered again")
        with anyio.move_on_after(5.0):  # the one in doubt returns after its 1 s lease, if unacked
            while in_doubt - back.keys():
                await probe()
                await anyio.sleep(0.1)
        assert not back.keys() & acked, "an acknowledged message was delivered again"
        assert sorted(back.values()).count(2) <= 1
        assert set(back.values()) <= {1, 2}
        for message_id in in_doubt & back.keys():
            assert back[message_id] == 2
        assert await queue.dead_letters("work") == []

    @pytest.mark.world_process
    async def test_process_killed_stream_writer_leaves_whole_writes(
        self, shared_world: World, world_target: WorldTarget
    ) -> None:
        """SIGKILL lands at a random instant of a stream of writes. The stream holds whole
        writes only, densely: every acknowledged write where it said, and of the write in
        flight at the kill all or nothing; and it takes writes again.

        The write in flight may land at any instant after the kill, also between the reads
        here and around the write after them (a server finishing the killed process's
        statement late): each check holds whenever it lands."""
        size, pad = 8, 8192
        argv = world_target.child_command(
            "write", "out", "--batches", "1000000", "--size", str(size),
            "--tag", "w", "--pad", str(pad),
        )  # fmt: skip
        async with _spawn([argv]) as (child,):
            lines = await _kill_at_random(child, 3)
        acked = len(lines)
        assert [(line["batch"], line["next"]) for line in lines] == [
            (b, (b + 1) * size) for b in range(acked)
        ], f"acknowledged writes not where they said: {lines}"
        whole = (acked * size, (acked + 1) * size)  # without, with the write in flight

        def holds(next_index: int) -> str:
            return (
                f"the writer was killed after {acked} acknowledged writes of {size} chunks: "
                "the stream holds those and the write in flight at the kill, whole or not at "
                f"all, so its next index is {whole[0]} or {whole[1]}, not {next_index}"
            )

        stream = shared_world.stream
        info = await stream.info("out")
        assert info.next_index in whole, holds(info.next_index)
        chunks = await take(stream.read("out"), info.next_index)
        _check_whole_writes(chunks, size, "w")
        after = await stream.write("out", [b"after"])
        assert after - 1 in whole, holds(after - 1)
        assert after - 1 >= info.next_index, f"the write after the kill returned {after}"
        later = await take(stream.read("out"), after)
        assert later[: info.next_index] == chunks, "stored chunks changed after the kill"
        assert later[-1:] == [Chunk(index=after - 1, data=b"after")], (
            f"the write after the kill returned next index {after}: its chunk belongs at "
            f"{after - 1}, found {later[-1:]}"
        )
        _check_whole_writes(later[:-1], size, "w")

    @pytest.mark.world_process
    async def test_process_watch_sees_other_process(
        self, shared_world: World, world_target: WorldTarget
    ) -> None:
        """A watcher here is woken by appends another process makes."""
        argv = world_target.child_command(
            "append", "seen", "--batches", "6", "--size", "1", "--tag", "x"
        )
        watched: list[Event] = []
        async with _spawn([argv]) as (child,):

            async def watcher() -> None:
                watched.extend(await take(shared_world.log.watch("seen"), 6, bound=60))

            async with anyio.create_task_group() as group:
                group.start_soon(watcher)
                await anyio.sleep(0.1)
                await child.go()
                await child.rest()
        assert watched == await shared_world.log.read("seen")
        assert [_parse(e) for e in watched] == [("x", b, 0) for b in range(6)]

    @pytest.mark.world_process
    async def test_process_waiters_woken_by_other_process(
        self, shared_world: World, world_target: WorldTarget
    ) -> None:
        """A watch, a ``claim(wait=...)`` and a stream reader here, idle for a while, are each
        woken by a write another process makes. Where ``Capabilities.native_wakeups`` is
        true, the store's notification wakes them: each sees its write within NATIVE_WAKE
        seconds, however long it idled; otherwise bounded polling finds it, within WAIT."""
        native = shared_world.capabilities.native_wakeups
        bound = IDLE + WAIT
        names = {"append": "Log.watch", "enqueue": "Queue.claim(wait=...)", "write": "Stream.read"}
        woken_at: dict[str, float] = {}
        woken = {word: anyio.Event() for word in names}

        def woke(word: str) -> None:
            woken_at[word] = anyio.current_time()
            woken[word].set()

        async def watcher() -> None:
            what = "Log.watch waiting here is woken by an append of another process"
            events = await take(shared_world.log.watch("wake"), 1, bound=bound, what=what)
            woke("append")
            assert [e.data for e in events] == [b"append"]

        async def claimer() -> None:
            leases = await shared_world.queue.claim("wake", "w", lease=LONG_LEASE, wait=bound)
            woke("enqueue")
            assert [lease.payload for lease in leases] == [b"enqueue"], (
                "Queue.claim(wait=...) waiting here is woken by an enqueue of another process: "
                f"it returned {leases} after {bound} s"
            )

        async def reader() -> None:
            what = "Stream.read waiting here is woken by a write of another process"
            chunks = await take(shared_world.stream.read("wake"), 1, bound=bound, what=what)
            woke("write")
            assert chunks == [Chunk(index=0, data=b"write")]

        latency: dict[str, float] = {}
        argv = world_target.child_command("poke", "wake")
        async with _spawn([argv]) as (child,):
            await child.go()
            with within("three waiters woken by writes of another process", bound * 3):
                async with anyio.create_task_group() as group:
                    for waiter in (watcher, claimer, reader):
                        group.start_soon(waiter)
                    await anyio.sleep(IDLE)
                    for word, name in names.items():
                        sent = anyio.current_time()
                        await child.send(word)
                        with anyio.fail_after(bound):
                            done = await child.line()
                        assert done == {"done": word}, f"child: {done!r}\n{child.errors()}"
                        with anyio.fail_after(bound):
                            await woken[word].wait()
                        latency[name] = woken_at[word] - sent
            await child.send("end")
            await child.rest()
        slow = {name: seconds for name, seconds in latency.items() if seconds > NATIVE_WAKE}
        assert not (native and slow), (
            f"Capabilities.native_wakeups is true, so a waiter idle for {IDLE:g} s is woken by "
            "the store's notification of another process's write, not by polling; these woke "
            f"later than {NATIVE_WAKE:g} s after the other process was told to write: "
            + ", ".join(f"{name} after {seconds:.2f} s" for name, seconds in slow.items())
        )
