"""MongoLog: logs on Segments, with event keys and an indexed status on the head."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from world_core.errors import (
    ConflictError,
    DuplicateKeyError,
    PayloadTooLargeError,
    UnsupportedError,
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
from world_mongo._errors import BSON_LIMIT, translate
from world_mongo._segments import Doc, Segments

if TYPE_CHECKING:
    from world_mongo._world import MongoWorld

__all__ = ["MongoLog"]

# Room left in a 16 MiB document for field names, positions and the head's own fields.
_DOC_SLACK = 64 * 1024
_PER_EVENT_OVERHEAD = 32


def _event(seq: int, item: Doc) -> Event:
    return Event(seq=seq, data=item["d"], key=item.get("k"))


class MongoLog(Log):
    def __init__(self, world: MongoWorld, segments: Segments) -> None:
        self._world = world
        self._seg = segments

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
        if messages:
            raise UnsupportedError(
                "world_mongo has no outbox: a standalone mongod cannot write a log batch and "
                "queue messages atomically. Enqueue after the append, idempotently (dedup_key)."
            )
        items: list[Doc] = []
        keys: list[str] = []
        size = 0
        for event in events:
            item: Doc = {"d": event.data}
            size += len(event.data) + _PER_EVENT_OVERHEAD
            if event.key is not None:
                item["k"] = event.key
                keys.append(event.key)
                size += 2 * len(event.key.encode("utf-8"))
            items.append(item)
        if size > BSON_LIMIT - _DOC_SLACK:
            raise PayloadTooLargeError(
                f"append of {len(items)} events needs about {size} bytes in one MongoDB "
                f"document; the limit is {BSON_LIMIT - _DOC_SLACK}: split the batch",
                size=size,
                limit=BSON_LIMIT - _DOC_SLACK,
            )
        world = self._world
        world.check_open()
        await world.make_storage()
        set_fields = {"status": status} if status is not None else None
        with translate("append to a log"):
            # Start from the head this process committed last, when it has one: the commit
            # below names its generation and count, so a stale one only costs a re-read.
            head = self._seg.known_head(log_id)
            loaded = head is None or (expect_tail is not None and head["n"] != expect_tail)
            if loaded:
                head = await self._seg.load_head(log_id, items=True)
            while True:
                if loaded:
                    tail = head["n"] if head is not None else 0
                    if expect_tail is not None and tail != expect_tail:
                        raise ConflictError(
                            f"log {log_id!r} has tail {tail}, not {expect_tail}: read the new "
                            "events and decide again",
                            expected=expect_tail,
                            actual=tail,
                        )
                if head is not None:
                    await self._seg.flush(log_id, head)
                    clash = await self._existing_key(head, keys) if keys else None
                    if clash is not None:
                        if loaded:
                            key, existing = clash
                            raise DuplicateKeyError(
                                f"log {log_id!r} already holds key {key!r} (seq "
                                f"{existing.seq}); nothing of the batch was written: use the "
                                "stored event",
                                key=key,
                                existing=existing,
                            )
                        # Found from a remembered head: confirm against the real one.
                        head, loaded = await self._seg.load_head(log_id, items=True), True
                        continue
                new_tail = await self._seg.try_commit(
                    log_id,
                    head,
                    items,
                    size=size,
                    keys=keys,
                    set_fields=set_fields,
                    new_fields={"status": status},
                )
                if new_tail is not None:
                    world.notifier.notify("log", log_id)
                    return new_tail
                if loaded:
                    # Another writer committed first: short jitter, so that a crowd of
                    # writers does not retry in lock step.
                    await anyio.sleep(random.random() * 0.002)
                head, loaded = await self._seg.load_head(log_id, items=True), True

    async def _existing_key(self, head: Doc, keys: list[str]) -> tuple[str, Event] | None:
        """The first key of the batch already stored below the head's count, with its event.

        Only batches the head covers: a clash beyond it belongs to a commit made after our
        read, and our own commit will fail and re-read (so expect_tail's ConflictError keeps
        its priority over the key check).
        """
        seg = await self._seg.segs.find_one(
            {"g": head["g"], "keys": {"$in": keys}, "f": {"$lt": head["n"]}},
            {"f": 1, "items": 1},
        )
        if seg is None:
            return None
        stored = {item.get("k"): (seg["f"] + i + 1, item) for i, item in enumerate(seg["items"])}
        for key in keys:
            if key in stored:
                seq, item = stored[key]
                return key, _event(seq, item)
        return None

    async def read(self, log_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        validate_read(log_id, after=after, limit=limit)
        self._world.check_open()
        with translate("read a log"):
            head = await self._seg.load_head(log_id, items=True)
            if head is None:
                return []
            found = await self._seg.read(log_id, head, after, limit)
        return [_event(pos + 1, item) for pos, item in found]

    async def get(self, log_id: str, key: str) -> Event | None:
        validate_id(log_id, "log_id")
        validate_id(key, "event key")
        self._world.check_open()
        with translate("get a log event"):
            head = await self._seg.load_head(log_id, items=True)
            if head is None:
                return None
            last = head.get("last") or {}
            if key in (last.get("keys") or ()):
                for i, item in enumerate(last["items"]):
                    if item.get("k") == key:
                        return _event(last["f"] + i + 1, item)
            seg = await self._seg.segs.find_one(
                {"g": head["g"], "keys": key, "f": {"$lt": last.get("f", head["n"])}},
                {"f": 1, "items": 1},
            )
        if seg is None:
            return None
        for i, item in enumerate(seg["items"]):
            if item.get("k") == key:
                return _event(seg["f"] + i + 1, item)
        return None

    async def tail(self, log_id: str) -> int:
        validate_id(log_id, "log_id")
        self._world.check_open()
        with translate("read a log's tail"):
            head = await self._seg.heads.find_one({"_id": log_id}, {"n": 1})
        return int(head["n"]) if head is not None else 0

    async def info(self, log_id: str) -> LogInfo | None:
        validate_id(log_id, "log_id")
        self._world.check_open()
        with translate("read a log's info"):
            head = await self._seg.heads.find_one({"_id": log_id}, {"n": 1, "status": 1})
        if head is None:
            return None
        return LogInfo(log_id=log_id, tail=head["n"], status=head.get("status"))

    def watch(self, log_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        # Checked here, not in the generator (its body runs only at the first step), so that
        # a bad call fails at once, where it was made.
        validate_read(log_id, after=after)
        self._world.check_open()
        return self._watch(log_id, after)

    async def _watch(self, log_id: str, after: int) -> AsyncIterator[Event]:
        world = self._world
        backoff = world.new_backoff()
        position = after
        with world.notifier.subscribe("log", log_id) as sub:
            while True:
                world.check_open()
                with translate("watch a log"):
                    head = await self._seg.heads.find_one({"_id": log_id}, {"n": 1})
                    found: list[tuple[int, Any]] = []
                    if head is not None and head["n"] > position:
                        full = await self._seg.load_head(log_id, items=True)
                        if full is not None:
                            found = await self._seg.read(log_id, full, position, 1000)
                if found:
                    backoff.reset()
                    for pos, item in found:
                        position = pos + 1
                        yield _event(position, item)
                    continue
                await sub.wait(backoff.next())

    async def list_logs(
        self,
        *,
        prefix: str = "",
        status: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page[LogInfo]:
        after = validate_list(prefix=prefix, status=status, cursor=cursor, limit=limit)
        self._world.check_open()
        bounds: Doc = {}
        if prefix:
            bounds["$gte"] = prefix
            upper = prefix_end(prefix)
            if upper is not None:
                bounds["$lt"] = upper
        if after is not None and ("$gte" not in bounds or after >= bounds["$gte"]):
            bounds.pop("$gte", None)
            bounds["$gt"] = after
        query: Doc = {"_id": bounds} if bounds else {}
        if status is not None:
            query["status"] = status
        with translate("list logs"):
            docs = await self._seg.heads.find(
                query, {"n": 1, "status": 1}, sort=[("_id", 1)], limit=limit + 1
            ).to_list()
        items = [LogInfo(log_id=d["_id"], tail=d["n"], status=d.get("status")) for d in docs]
        if len(items) <= limit:
            return Page(items=items)
        items = items[:limit]
        last = items[-1].log_id
        return Page(items=items, next_cursor=list_cursor(last, prefix=prefix, status=status))

    async def delete(self, log_id: str) -> None:
        validate_id(log_id, "log_id")
        self._world.check_open()
        with translate("delete a log"):
            await self._seg.delete(log_id)
        self._world.notifier.notify("log", log_id)
