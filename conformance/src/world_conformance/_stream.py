"""StreamContract: the executable form of ``world_core.spi.Stream``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from world_conformance._base import ContractBase
from world_conformance._support import drain, refusal_at_call, take, within
from world_conformance._target import WorldTarget
from world_core import (
    Chunk,
    ClosedError,
    ConflictError,
    InvalidArgumentError,
    InvalidIdentifierError,
    StreamInfo,
    World,
)
from world_core.spi import MAX_ID_BYTES

__all__ = ["StreamContract"]


def _chunks(*data: bytes) -> list[Chunk]:
    return [Chunk(index=index, data=item) for index, item in enumerate(data)]


class StreamContract(ContractBase):
    """``Stream``: dense chunks, compare-and-set, close, following readers, resuming."""

    contract_area = "stream"

    async def test_stream_write_info_read(self, world: World) -> None:
        stream = world.stream
        assert await stream.info("s") == StreamInfo(stream_id="s", next_index=0, closed=False)
        assert await stream.write("s", [b"a"]) == 1
        assert await stream.write("s", [b"b", b"c"]) == 3
        assert await stream.info("s") == StreamInfo(stream_id="s", next_index=3, closed=False)
        await stream.close("s")
        assert await stream.info("s") == StreamInfo(stream_id="s", next_index=3, closed=True)
        assert await drain(stream.read("s")) == _chunks(b"a", b"b", b"c")
        assert await drain(stream.read("s", start=2)) == [Chunk(index=2, data=b"c")]
        assert await drain(stream.read("s", start=3)) == []
        assert await drain(stream.read("s", start=10)) == []

    async def test_stream_long(self, world: World) -> None:
        total = 1200
        for start in range(0, total, 200):
            await world.stream.write("long", [b"%d" % i for i in range(start, start + 200)])
        assert await take(world.stream.read("long", start=-total), total) == [
            Chunk(index=i, data=b"%d" % i) for i in range(total)
        ]
        await world.stream.close("long")
        chunks = await drain(world.stream.read("long", start=700))
        assert [c.index for c in chunks] == list(range(700, total))

    async def test_stream_empty_write_refused(self, world: World) -> None:
        with pytest.raises(InvalidArgumentError):
            await world.stream.write("s", [])
        assert await world.stream.info("s") == StreamInfo(stream_id="s", next_index=0, closed=False)

    async def test_stream_read_start_refused(self, world: World) -> None:
        """``start`` is any int (negative counts back); anything else fails at once."""
        await world.stream.write("s", [b"a"])
        await world.stream.close("s")
        bad_starts: tuple[Any, ...] = ("0", 1.0, True, None)
        for bad in bad_starts:
            with anyio.fail_after(5), pytest.raises(InvalidArgumentError):
                await anext(world.stream.read("s", start=bad))
        assert await drain(world.stream.read("s", start=-5)) == _chunks(b"a")

    async def test_stream_read_refuses_when_called(self, world: World) -> None:
        """``read`` checks its arguments when called, before it returns the iterator: a bad
        stream id or ``start`` raises at the line that made the call, not at the first step."""
        await world.stream.write("s", [b"a"])
        bad_starts: tuple[Any, ...] = ("0", 1.0, True, None)
        cases: list[tuple[str, Any, Any, type[Exception]]] = [
            (f"read({bad_id!r:.24})", bad_id, 0, InvalidIdentifierError)
            for bad_id in ("", "a\x00", "x" * (MAX_ID_BYTES + 1))
        ]
        cases += [(f"read('s', start={s!r})", "s", s, InvalidArgumentError) for s in bad_starts]
        failures: list[str] = []
        for what, stream_id, start, error in cases:

            def call(stream_id: Any = stream_id, start: Any = start) -> AsyncIterator[Chunk]:
                return world.stream.read(stream_id, start=start)

            failure = await refusal_at_call(call, error, what)
            if failure is not None:
                failures.append(failure)
        assert not failures, "Stream.read checks its arguments when called:\n" + "\n".join(failures)
        assert await world.stream.info("s") == StreamInfo(stream_id="s", next_index=1, closed=False)

    async def test_stream_compare_and_set(self, world: World) -> None:
        stream = world.stream
        assert await stream.write("s", [b"a"], expect_next=0) == 1
        with pytest.raises(ConflictError) as caught:
            await stream.write("s", [b"x"], expect_next=0)
        assert (caught.value.expected, caught.value.actual) == (0, 1)
        with pytest.raises(ConflictError) as caught:
            await stream.write("s", [b"x"], expect_next=7)
        assert caught.value.actual == 1
        assert await stream.write("s", [b"b"], expect_next=1) == 2
        assert (await stream.info("s")).next_index == 2

    async def test_stream_close_semantics(self, world: World) -> None:
        stream = world.stream
        await stream.write("s", [b"a"])
        await stream.close("s")
        await stream.close("s")  # closing twice is fine
        with pytest.raises(ClosedError):
            await stream.write("s", [b"b"])
        with pytest.raises(ClosedError):
            await stream.write("s", [b"b"], expect_next=0)  # closed is checked first
        assert await stream.info("s") == StreamInfo(stream_id="s", next_index=1, closed=True)
        await stream.close("never-written")
        assert await stream.info("never-written") == StreamInfo(
            stream_id="never-written", next_index=0, closed=True
        )
        assert await drain(stream.read("never-written")) == []
        with pytest.raises(ClosedError):
            await stream.write("never-written", [b"x"])

    async def test_stream_reader_before_writer(self, world: World) -> None:
        """A reader started before the stream exists gets every chunk, then ends on close."""
        got: list[Chunk] = []

        async def reader() -> None:
            got.extend(await drain(world.stream.read("s")))

        with within("a reader started before the writer follows it to the close"):
            async with anyio.create_task_group() as group:
                group.start_soon(reader)
                await anyio.sleep(0.1)
                await world.stream.write("s", [b"a"])
                await anyio.sleep(0.05)
                await world.stream.write("s", [b"b", b""])
                await anyio.sleep(0.05)
                await world.stream.close("s")
        assert got == _chunks(b"a", b"b", b"")

    async def test_stream_waiting_reader_ends_on_close(self, world: World) -> None:
        await world.stream.write("s", [b"a"])
        got: list[Chunk] = []

        async def reader() -> None:
            got.extend(await drain(world.stream.read("s", start=1)))

        with within("a reader waiting at the tail ends when the stream is closed"):
            async with anyio.create_task_group() as group:
                group.start_soon(reader)
                await anyio.sleep(0.2)
                await world.stream.close("s")
        assert got == []

    async def test_stream_reconnect_misses_nothing(self, world: World) -> None:
        stream = world.stream
        await stream.write("s", [b"0", b"1", b"2", b"3"])
        first = await take(stream.read("s"), 2)
        assert first == _chunks(b"0", b"1")
        await stream.write("s", [b"4"])
        resumed: list[Chunk] = []

        async def reader() -> None:
            resumed.extend(await drain(stream.read("s", start=first[-1].index + 1)))

        with within("a reader resumed from an index misses nothing and ends on close"):
            async with anyio.create_task_group() as group:
                group.start_soon(reader)
                await anyio.sleep(0.1)
                await stream.write("s", [b"5"])
                await stream.close("s")
        assert resumed == _chunks(b"0", b"1", b"2", b"3", b"4", b"5")[2:]

    async def test_stream_negative_start(self, world: World) -> None:
        stream = world.stream
        await stream.write("s", [b"0", b"1", b"2", b"3", b"4"])
        assert await take(stream.read("s", start=-1), 1) == [Chunk(index=4, data=b"4")]
        await stream.close("s")
        assert [c.index for c in await drain(stream.read("s", start=-2))] == [3, 4]
        assert [c.index for c in await drain(stream.read("s", start=-5))] == [0, 1, 2, 3, 4]
        assert [c.index for c in await drain(stream.read("s", start=-99))] == [0, 1, 2, 3, 4]
        await stream.close("empty")
        assert await drain(stream.read("empty", start=-1)) == []

    async def test_stream_negative_start_before_exists(self, world: World) -> None:
        got: list[Chunk] = []

        async def reader() -> None:
            got.extend(await drain(world.stream.read("s", start=-3)))

        with within("read(start=-3) before the stream exists waits, then follows"):
            async with anyio.create_task_group() as group:
                group.start_soon(reader)
                await anyio.sleep(0.1)
                await world.stream.write("s", [b"a", b"b"])
                await world.stream.close("s")
        assert got == _chunks(b"a", b"b")

    async def test_stream_start_beyond_end_waits(self, world: World) -> None:
        """A reader starting past the end yields nothing until its start index is written."""
        await world.stream.write("s", [b"0", b"1"])
        got: list[Chunk] = []

        async def reader() -> None:
            got.extend(await drain(world.stream.read("s", start=4)))

        with within("read(start=) beyond the end waits for that chunk, then follows"):
            async with anyio.create_task_group() as group:
                group.start_soon(reader)
                await anyio.sleep(0.1)
                await world.stream.write("s", [b"2", b"3"])
                await world.stream.write("s", [b"4", b"5"])
                await world.stream.close("s")
        assert got == [Chunk(index=4, data=b"4"), Chunk(index=5, data=b"5")]

    async def test_stream_close_races_writers(self, world: World) -> None:
        """Writers keep writing while the stream is closed: no write that starts after
        ``close`` returned succeeds, and every write that succeeded is in the stream."""
        acknowledged: list[int] = []
        late: list[int] = []
        closed = anyio.Event()

        async def writer(name: int) -> None:
            for item in range(10_000):
                started_after_close = closed.is_set()
                try:
                    next_index = await world.stream.write("s", [f"{name}:{item}".encode()])
                except ClosedError:
                    return
                acknowledged.append(next_index)
                if started_after_close:
                    late.append(next_index)

        with within("writers racing a close all finish (written or ClosedError)"):
            async with anyio.create_task_group() as group:
                for name in range(4):
                    group.start_soon(writer, name)
                await anyio.sleep(0.1)
                await world.stream.close("s")
                closed.set()
        assert not late, f"writes started after close() returned succeeded: {late}"
        info = await world.stream.info("s")
        assert info.closed
        chunks = await drain(world.stream.read("s"))
        assert [c.index for c in chunks] == list(range(info.next_index))
        assert sorted(acknowledged) == list(range(1, info.next_index + 1))

    async def test_stream_concurrent_writers_expect_next(
        self, world: World, world_target: WorldTarget
    ) -> None:
        """Writers racing with compare-and-set: every chunk lands exactly once, densely, and a
        reader following them live sees exactly the final stream."""
        writers, each = 6, 5

        async def writer(target: World, name: int) -> None:
            for item in range(each):
                expect = (await target.stream.info("s")).next_index
                for _ in range(500):
                    chunk = f"{name}:{item}".encode()
                    try:
                        await target.stream.write("s", [chunk], expect_next=expect)
                        break
                    except ConflictError as exc:
                        if exc.actual <= expect:
                            raise AssertionError(f"actual {exc.actual} <= {expect}") from exc
                        expect = exc.actual
                else:
                    raise AssertionError("500 conflicts in a row")

        followed: list[Chunk] = []

        async def follower() -> None:
            followed.extend(await drain(world.stream.read("s"), bound=90))

        async with world_target.open() as second, anyio.create_task_group() as outer:
            outer.start_soon(follower)
            with within("concurrent writers with expect_next and a follower finish"):
                async with anyio.create_task_group() as group:
                    for name in range(writers):
                        group.start_soon(writer, world if name % 2 else second, name)
            await world.stream.close("s")
        chunks = await drain(world.stream.read("s"))
        assert followed == chunks, "a reader following the writers saw something else"
        assert [c.index for c in chunks] == list(range(writers * each))
        expected = {f"{n}:{i}".encode() for n in range(writers) for i in range(each)}
        assert {c.data for c in chunks} == expected
        for name in range(writers):
            mine = [c.data for c in chunks if c.data.startswith(f"{name}:".encode())]
            assert mine == [f"{name}:{i}".encode() for i in range(each)]

    async def test_stream_delete(self, world: World) -> None:
        stream = world.stream
        await stream.write("s", [b"a", b"b"])
        await stream.close("s")
        await stream.write("keep", [b"k"])
        await stream.delete("s")
        assert await stream.info("s") == StreamInfo(stream_id="s", next_index=0, closed=False)
        assert await stream.write("s", [b"new"]) == 1
        await stream.close("s")
        assert await drain(stream.read("s")) == [Chunk(index=0, data=b"new")]
        await stream.delete("never-existed")
        assert (await stream.info("keep")).next_index == 1
