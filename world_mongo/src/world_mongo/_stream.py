"""MongoStream: streams on Segments; the head also carries ``closed``."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

import anyio
from bson import ObjectId
from pymongo.errors import DuplicateKeyError

from world_core.errors import ClosedError, ConflictError, PayloadTooLargeError
from world_core.spi import (
    Chunk,
    Stream,
    StreamInfo,
    validate_id,
    validate_stream_read,
    validate_write,
)
from world_mongo._errors import BSON_LIMIT, translate
from world_mongo._segments import Segments

if TYPE_CHECKING:
    from world_mongo._world import MongoWorld

__all__ = ["MongoStream"]

_DOC_SLACK = 64 * 1024
_PER_CHUNK_OVERHEAD = 16


class MongoStream(Stream):
    def __init__(self, world: MongoWorld, segments: Segments) -> None:
        self._world = world
        self._seg = segments

    async def write(
        self, stream_id: str, chunks: Sequence[bytes], *, expect_next: int | None = None
    ) -> int:
        validate_write(stream_id, chunks, expect_next=expect_next)
        size = sum(len(c) + _PER_CHUNK_OVERHEAD for c in chunks)
        if size > BSON_LIMIT - _DOC_SLACK:
            raise PayloadTooLargeError(
                f"write of {len(chunks)} chunks needs about {size} bytes in one MongoDB "
                f"document; the limit is {BSON_LIMIT - _DOC_SLACK}: write fewer chunks per call",
                size=size,
                limit=BSON_LIMIT - _DOC_SLACK,
            )
        world = self._world
        world.check_open()
        await world.make_storage()
        items = list(chunks)
        with translate("write to a stream"):
            # As in Log.append: a remembered head saves the read; the commit's filter (count,
            # generation, closed: false) catches a stale one.
            head = self._seg.known_head(stream_id)
            loaded = head is None or (expect_next is not None and head["n"] != expect_next)
            if loaded:
                head = await self._seg.load_head(stream_id, items=True)
            while True:
                if loaded:
                    if head is not None and head.get("closed"):
                        raise ClosedError(
                            f"stream {stream_id!r} is closed: write to a new stream instead"
                        )
                    next_index = head["n"] if head is not None else 0
                    if expect_next is not None and next_index != expect_next:
                        raise ConflictError(
                            f"stream {stream_id!r} has next index {next_index}, not "
                            f"{expect_next}: read it and decide again",
                            expected=expect_next,
                            actual=next_index,
                        )
                if head is not None:
                    await self._seg.flush(stream_id, head)
                done = await self._seg.try_commit(
                    stream_id,
                    head,
                    items,
                    size=size,
                    match_fields={"closed": False},
                    new_fields={"closed": False},
                )
                if done is not None:
                    world.notifier.notify("stream", stream_id)
                    return done
                if loaded:
                    await anyio.sleep(random.random() * 0.002)
                head, loaded = await self._seg.load_head(stream_id, items=True), True

    async def close(self, stream_id: str) -> None:
        validate_id(stream_id, "stream_id")
        world = self._world
        world.check_open()
        await world.make_storage()
        self._seg.forget(stream_id)
        with translate("close a stream"):
            while True:
                result = await self._seg.heads.update_one(
                    {"_id": stream_id}, {"$set": {"closed": True}}
                )
                if result.matched_count:
                    break
                try:
                    await self._seg.heads.insert_one(
                        {"_id": stream_id, "g": ObjectId(), "n": 0, "closed": True}
                    )
                    break
                except DuplicateKeyError:
                    continue  # created meanwhile: close that one
        world.notifier.notify("stream", stream_id)

    async def info(self, stream_id: str) -> StreamInfo:
        validate_id(stream_id, "stream_id")
        self._world.check_open()
        with translate("read a stream's info"):
            head = await self._seg.heads.find_one({"_id": stream_id}, {"n": 1, "closed": 1})
        if head is None:
            return StreamInfo(stream_id=stream_id, next_index=0, closed=False)
        return StreamInfo(
            stream_id=stream_id, next_index=head["n"], closed=bool(head.get("closed"))
        )

    def read(self, stream_id: str, *, start: int = 0) -> AsyncIterator[Chunk]:
        # Checked here, not in the generator (its body runs only at the first step), so that
        # a bad call fails at once, where it was made.
        validate_stream_read(stream_id, start=start)
        self._world.check_open()
        return self._follow(stream_id, start)

    async def _follow(self, stream_id: str, start: int) -> AsyncIterator[Chunk]:
        world = self._world
        backoff = world.new_backoff()
        with world.notifier.subscribe("stream", stream_id) as sub:
            position = start
            if position < 0:
                position = max(0, (await self.info(stream_id)).next_index + position)
            while True:
                world.check_open()
                with translate("read a stream"):
                    head = await self._seg.heads.find_one({"_id": stream_id}, {"n": 1, "closed": 1})
                    found = []
                    if head is not None and head["n"] > position:
                        full = await self._seg.load_head(stream_id, items=True)
                        if full is not None:
                            found = await self._seg.read(stream_id, full, position, 1000)
                if found:
                    backoff.reset()
                    for pos, data in found:
                        position = pos + 1
                        yield Chunk(index=pos, data=data)
                    continue
                if head is not None and head.get("closed") and head["n"] <= position:
                    return
                await sub.wait(backoff.next())

    async def delete(self, stream_id: str) -> None:
        validate_id(stream_id, "stream_id")
        self._world.check_open()
        with translate("delete a stream"):
            await self._seg.delete(stream_id)
        self._world.notifier.notify("stream", stream_id)
