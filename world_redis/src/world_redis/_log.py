"""The Log on Redis: one Redis stream per log, entry id ``<seq>-0``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from world_core.errors import (
    BackendUnavailableError,
    ConflictError,
    DuplicateKeyError,
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
    validate_append,
    validate_id,
    validate_list,
    validate_read,
)
from world_redis import _scripts as S
from world_redis._conn import BLOCK_SECONDS, Arg, Connection, translate
from world_redis._keys import Keys
from world_redis._queue import micros, nonce, wait_on

__all__ = ["RedisLog"]

_logger = logging.getLogger("world_redis")

_WATCH_COUNT = 32  # events may be large: bound one reply
_SCAN_BATCH = 200


def _event(entry_id: bytes, fields: dict[bytes, bytes]) -> Event:
    key = fields.get(b"k")
    return Event(
        seq=int(entry_id.split(b"-", 1)[0]),
        data=fields[b"d"],
        key=key.decode("utf-8") if key is not None else None,
    )


class RedisLog(Log):
    def __init__(self, conn: Connection, keys: Keys) -> None:
        self._conn = conn
        self._keys = keys

    def _log_keys(self, log_id: str) -> list[str]:
        keys = list(self._keys.log(log_id))
        if not self._conn.cluster:
            keys += [self._keys.registry, self._keys.status_index]
        return keys

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
        if messages and self._conn.cluster:
            raise UnsupportedError(
                "this RedisWorld runs on Redis Cluster, where a log and a queue live in "
                "different slots: no outbox. Enqueue after the append, idempotently."
            )
        keys = self._log_keys(log_id)
        args: list[Arg] = [
            "" if expect_tail is None else expect_tail,
            status or "",
            log_id,
            len(events),
        ]
        for event in events:
            args += [event.key or "", event.data]
        if messages:
            args.append(len(messages))
        for message in messages:
            keys += self._keys.queue(message.queue)
            args += [
                message.payload,
                micros(message.delay),
                message.dedup_key or "",
                message.max_attempts,
                nonce(),
            ]
        with translate("log append", writes=True):
            script = S.APPEND_OUTBOX if messages else S.APPEND
            result: list[Any] = await self._conn.run(script, keys, args)
        tag = result[0]
        if tag == b"conflict":
            actual = int(result[1])
            raise ConflictError(
                f"log {log_id!r} has tail {actual}, not {expect_tail}: read it and decide again",
                expected=expect_tail if expect_tail is not None else -1,
                actual=actual,
            )
        if tag == b"dup":
            key = result[1].decode("utf-8")
            existing = Event(seq=int(result[2]), data=result[3], key=key)
            raise DuplicateKeyError(
                f"log {log_id!r} already holds key {key!r} at seq {existing.seq}; "
                "nothing of the batch was written: read the existing event instead",
                key=key,
                existing=existing,
            )
        tail = int(result[1])
        if not int(result[2]):
            await self._register(log_id)
        return tail

    async def _register(self, log_id: str) -> None:
        # Cluster only: the registry is another slot, written after the append committed.
        # The log stays unmarked until the registry write succeeded, so the next append to it
        # repairs a registry entry lost to a crash or a failure here. The append itself has
        # committed, so a failure here must not be reported as a failed append (a retry
        # without a key would append twice).
        try:
            with translate("log registry update"):
                await self._conn.command("ZADD", self._keys.registry, 0, log_id)
                x, _, m = self._keys.log(log_id)
                await self._conn.run(S.LOG_MARK_REGISTERED, [x, m], [])
        except BackendUnavailableError as exc:
            _logger.warning(
                "log %r committed but the list_logs registry was not updated (%s); "
                "the next append to it repairs that",
                log_id,
                exc,
            )

    async def read(self, log_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        validate_read(log_id, after=after, limit=limit)
        x = self._keys.log(log_id)[0]
        args: list[Arg] = ["XRANGE", x, f"{after + 1}-0", "+"]
        if limit is not None:
            args += ["COUNT", limit]
        with translate("log read"):
            entries = await self._conn.command(*args)
        return [_event(entry_id, fields) for entry_id, fields in entries]

    async def get(self, log_id: str, key: str) -> Event | None:
        validate_id(log_id, "log_id")
        validate_id(key, "event key")
        x, k, _ = self._keys.log(log_id)
        with translate("log get"):
            result = await self._conn.run(S.LOG_GET, [x, k], [key])
        if result is None:
            return None
        return Event(seq=int(result[0]), data=result[1], key=key)

    async def tail(self, log_id: str) -> int:
        validate_id(log_id, "log_id")
        with translate("log tail"):
            return int(await self._conn.command("XLEN", self._keys.log(log_id)[0]))

    async def info(self, log_id: str) -> LogInfo | None:
        validate_id(log_id, "log_id")
        x, _, m = self._keys.log(log_id)
        with translate("log info"):
            tail, status = await self._conn.run(S.LOG_INFO, [x, m], [])
        if not tail:
            return None
        return LogInfo(
            log_id=log_id,
            tail=int(tail),
            status=status.decode("utf-8") if status is not None else None,
        )

    def watch(self, log_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        # Checked here, not in the generator (its body runs only at the first step), so that
        # a bad call fails at once, where it was made.
        validate_read(log_id, after=after)
        self._conn.check_open()
        return self._watch(log_id, after)

    async def _watch(self, log_id: str, after: int) -> AsyncIterator[Event]:
        x = self._keys.log(log_id)[0]
        last = f"{after}-0".encode()
        block_ms = int(BLOCK_SECONDS * 1000)
        while True:
            reply = await wait_on(
                self._conn,
                "log watch",
                *("XREAD", "COUNT", _WATCH_COUNT, "BLOCK", block_ms, "STREAMS", x, last),
            )
            for entry_id, fields in _xread_entries(reply):
                last = entry_id
                yield _event(entry_id, fields)

    async def list_logs(
        self,
        *,
        prefix: str = "",
        status: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page[LogInfo]:
        after = validate_list(prefix=prefix, status=status, cursor=cursor, limit=limit)
        # Single node: status filter through the exact status index (member "status\0id").
        # Cluster: the registry, each entry checked against the log's own keys.
        use_status_index = status is not None and not self._conn.cluster
        head = (status.encode() + b"\x00") if use_status_index and status is not None else b""
        index = self._keys.status_index if use_status_index else self._keys.registry
        low = b"[" + head + prefix.encode()
        if after is not None and after.encode() >= prefix.encode():
            low = b"(" + head + after.encode()
        high = b"[" + head + prefix.encode() + b"\xff"  # 0xff never occurs in UTF-8
        found: list[LogInfo] = []
        while len(found) <= limit:
            want = max(limit + 1 - len(found), 1 if status is None else _SCAN_BATCH)
            with translate("list_logs"):
                members: list[bytes] = await self._conn.command(
                    "ZRANGE", index, low, high, "BYLEX", "LIMIT", 0, want
                )
                ids = [member[len(head) :].decode("utf-8") for member in members]
                infos = await self._details(ids)
            for info in infos:
                if info is not None and (status is None or info.status == status):
                    found.append(info)
            if len(members) < want:
                break
            low = b"(" + members[-1]
        items = found[:limit]
        if len(found) <= limit:
            return Page[LogInfo](items=items)
        last = items[-1].log_id
        return Page[LogInfo](
            items=items, next_cursor=list_cursor(last, prefix=prefix, status=status)
        )

    async def _details(self, ids: list[str]) -> list[LogInfo | None]:
        """Tail and status of each log, read from the log's own keys (the authority)."""
        if not ids:
            return []
        pipe = self._conn.main.pipeline(transaction=False)
        for log_id in ids:
            x, _, m = self._keys.log(log_id)
            pipe.xlen(x)
            pipe.hget(m, "st")
        replies: list[Any] = await pipe.execute()
        out: list[LogInfo | None] = []
        for i, log_id in enumerate(ids):
            tail, status = int(replies[2 * i]), replies[2 * i + 1]
            if not tail:
                out.append(None)  # deleted since it was listed
                continue
            out.append(
                LogInfo(
                    log_id=log_id,
                    tail=tail,
                    status=status.decode("utf-8") if status is not None else None,
                )
            )
        return out

    async def delete(self, log_id: str) -> None:
        validate_id(log_id, "log_id")
        indexed = not self._conn.cluster
        with translate("log delete", writes=True):
            await self._conn.run(S.LOG_DELETE, self._log_keys(log_id), [log_id, int(indexed)])
            if indexed:
                return
            # Cluster: drop the registry entry, then look again: an append that re-created the
            # log in between may have registered it before our ZREM, so put it back.
            await self._conn.command("ZREM", self._keys.registry, log_id)
            if await self._conn.command("EXISTS", self._keys.log(log_id)[0]):
                await self._conn.command("ZADD", self._keys.registry, 0, log_id)


def _xread_entries(reply: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """Entries of a one-stream XREAD reply (RESP2 list or RESP3 map), [] on timeout."""
    if not reply:
        return []
    if isinstance(reply, dict):
        streams = list(reply.values())
        return list(streams[0][0]) if streams else []
    return list(reply[0][1])
