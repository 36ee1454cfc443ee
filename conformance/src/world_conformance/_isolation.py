"""IsolationContract: identifiers are data, and namespaces never see each other."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from world_conformance._base import ContractBase
from world_conformance._support import drain
from world_conformance._target import WorldTarget
from world_core import (
    InvalidIdentifierError,
    NewEvent,
    OutboxMessage,
    StreamInfo,
    World,
)
from world_core.spi import MAX_STATUS_BYTES

__all__ = ["BAD_IDENTIFIERS", "IsolationContract", "ODD_IDENTIFIERS"]

ODD_IDENTIFIERS: tuple[str, ...] = (
    "a/b",
    "..",
    ".",
    "../../x",
    "../../../../../../etc/passwd",
    "/absolute",
    "~",
    "ünïcødé 日本語 😀",
    "quote'\"`",
    "$where",
    "$",
    "{}",
    '{"$gt": ""}',
    "*",
    "a:b:c",
    ":",
    "'; DROP TABLE events; --",
    "%",
    "_",
    "\\",
    " spaces around ",
    "tab\tnew\nline",
    "CON",
    "é",
    "e\u0301",
    "Case",
    "case",
    "x" * 512,
    "é" * 256,
)
"""Identifiers every backend stores verbatim: paths, operators, SQL, patterns, unicode that
differs only by normalization or case, and the longest allowed (512 UTF-8 bytes)."""

BAD_IDENTIFIERS: tuple[str, ...] = ("", "a\x00b", "x" * 513, "é" * 257, "\ud800")
"""Identifiers every backend refuses with InvalidIdentifierError before any I/O."""


async def _assert_empty(world: World, ids: tuple[str, ...]) -> None:
    assert (await world.log.list_logs()).items == [], "logs of another namespace are visible"
    for identifier in ids:
        assert await world.log.tail(identifier) == 0
        assert await world.queue.claim(identifier, "probe", lease=60.0) == []
        assert await world.queue.dead_letters(identifier) == []
        assert await world.stream.info(identifier) == StreamInfo(
            stream_id=identifier, next_index=0, closed=False
        )


def _calls(world: World, bad: str) -> list[tuple[str, Callable[[], Awaitable[object]]]]:
    """Every method taking an identifier, called with ``bad`` in one place."""
    return [
        ("log.append", lambda: world.log.append(bad, [NewEvent(data=b"x")])),
        ("event key", lambda: world.log.append("l", [NewEvent(data=b"x", key=bad)])),
        ("status", lambda: world.log.append("l", [NewEvent(data=b"")], status=bad)),
        (
            "outbox queue",
            lambda: world.log.append(
                "l", [NewEvent(data=b"x")], messages=[OutboxMessage(queue=bad, payload=b"")]
            ),
        ),
        ("log.read", lambda: world.log.read(bad)),
        ("log.get id", lambda: world.log.get(bad, "k")),
        ("log.get key", lambda: world.log.get("l", bad)),
        ("log.tail", lambda: world.log.tail(bad)),
        ("log.info", lambda: world.log.info(bad)),
        ("log.watch", lambda: anext(world.log.watch(bad))),
        ("log.delete", lambda: world.log.delete(bad)),
        ("queue.enqueue", lambda: world.queue.enqueue(bad, b"x")),
        ("dedup_key", lambda: world.queue.enqueue("q", b"x", dedup_key=bad)),
        ("queue.claim", lambda: world.queue.claim(bad, "w", lease=1.0)),
        ("worker", lambda: world.queue.claim("q", bad, lease=1.0)),
        ("dead_letters", lambda: world.queue.dead_letters(bad)),
        ("requeue queue", lambda: world.queue.requeue(bad, "m")),
        ("requeue id", lambda: world.queue.requeue("q", bad)),
        ("stream.write", lambda: world.stream.write(bad, [b"x"])),
        ("stream.close", lambda: world.stream.close(bad)),
        ("stream.info", lambda: world.stream.info(bad)),
        ("stream.read", lambda: anext(world.stream.read(bad))),
        ("stream.delete", lambda: world.stream.delete(bad)),
    ]


class IsolationContract(ContractBase):
    """Identifiers stored verbatim, refused identifiers, namespaces, ``purge``."""

    contract_area = "isolation"

    async def test_isolation_odd_log_ids_verbatim(
        self, world: World, world_target: WorldTarget
    ) -> None:
        failures: list[str] = []
        for identifier in ODD_IDENTIFIERS:
            await world.log.append(identifier, [NewEvent(data=identifier.encode(), key=identifier)])
        for identifier in ODD_IDENTIFIERS:
            events = await world.log.read(identifier)
            if [(e.seq, e.data, e.key) for e in events] != [(1, identifier.encode(), identifier)]:
                failures.append(f"read {identifier!r}: {events!r}")
            stored = await world.log.get(identifier, identifier)
            if stored is None or stored.data != identifier.encode():
                failures.append(f"get {identifier!r}: {stored!r}")
            info = await world.log.info(identifier)
            if info is None or info.log_id != identifier:
                failures.append(f"info {identifier!r}: {info!r}")
            page = await world.log.list_logs(prefix=identifier, limit=100)
            listed = [i.log_id for i in page.items]
            if identifier not in listed or any(not i.startswith(identifier) for i in listed):
                failures.append(f"list_logs(prefix={identifier!r}): {listed!r}")
        listed_all = [i.log_id for i in (await world.log.list_logs(limit=100)).items]
        if listed_all != sorted(ODD_IDENTIFIERS):
            failures.append(f"list_logs(): {listed_all!r}")
        assert not failures, "\n".join(failures)
        async with world_target.sibling().scratch() as other:
            await _assert_empty(other, ODD_IDENTIFIERS)

    async def test_isolation_odd_queue_ids_verbatim(
        self, world: World, world_target: WorldTarget
    ) -> None:
        failures: list[str] = []
        for identifier in ODD_IDENTIFIERS:
            message_id = await world.queue.enqueue(
                identifier, identifier.encode(), dedup_key=identifier
            )
            again = await world.queue.enqueue(identifier, b"dup", dedup_key=identifier)
            leases = await world.queue.claim(identifier, identifier, lease=60.0)
            got = [(lease.queue, lease.message_id, lease.payload) for lease in leases]
            if again != message_id or got != [(identifier, message_id, identifier.encode())]:
                failures.append(f"queue {identifier!r}: {again!r} {got!r}")
        assert not failures, "\n".join(failures)
        async with world_target.sibling().scratch() as other:
            await _assert_empty(other, ODD_IDENTIFIERS)

    async def test_isolation_odd_stream_ids_verbatim(
        self, world: World, world_target: WorldTarget
    ) -> None:
        failures: list[str] = []
        for identifier in ODD_IDENTIFIERS:
            await world.stream.write(identifier, [identifier.encode()])
        for identifier in ODD_IDENTIFIERS[::2]:
            await world.stream.close(identifier)
        for index, identifier in enumerate(ODD_IDENTIFIERS):
            info = await world.stream.info(identifier)
            closed = index % 2 == 0
            if info != StreamInfo(stream_id=identifier, next_index=1, closed=closed):
                failures.append(f"info {identifier!r}: {info!r}")
            if closed:
                chunks = await drain(world.stream.read(identifier))
                if [c.data for c in chunks] != [identifier.encode()]:
                    failures.append(f"read {identifier!r}: {chunks!r}")
        assert not failures, "\n".join(failures)
        async with world_target.sibling().scratch() as other:
            await _assert_empty(other, ODD_IDENTIFIERS)

    async def test_isolation_bad_identifiers_refused(self, world: World) -> None:
        """NUL, empty, too long and unencodable identifiers raise InvalidIdentifierError from
        every method that takes one, and nothing is written."""
        failures: list[str] = []
        for bad in BAD_IDENTIFIERS:
            calls = _calls(world, bad)
            for what, call in calls:
                try:
                    with anyio.fail_after(5):
                        await call()
                except InvalidIdentifierError:
                    continue
                except TimeoutError:
                    failures.append(f"{what}({bad!r}) waited instead of refusing")
                except Exception as exc:
                    failures.append(f"{what}({bad!r}) raised {type(exc).__name__}: {exc}")
                else:
                    failures.append(f"{what}({bad!r}) was accepted")
        assert not failures, "\n".join(failures)
        with pytest.raises(InvalidIdentifierError):
            await world.log.append("l", [NewEvent(data=b"")], status="s" * (MAX_STATUS_BYTES + 1))
        assert (await world.log.list_logs()).items == []
        assert await world.log.info("l") is None
        assert await world.queue.claim("q", "w", lease=60.0) == []
        assert await world.stream.info("l") == StreamInfo(stream_id="l", next_index=0, closed=False)

    async def test_isolation_namespaces_do_not_see_each_other(
        self, world: World, world_target: WorldTarget
    ) -> None:
        async with world_target.sibling().scratch() as other:
            for target, tag in ((world, b"mine"), (other, b"theirs")):
                await target.log.append("shared", [NewEvent(data=tag, key="k")], status="s")
                await target.queue.enqueue("shared", tag, dedup_key="d")
                await target.stream.write("shared", [tag])
            for target, tag in ((world, b"mine"), (other, b"theirs")):
                assert [e.data for e in await target.log.read("shared")] == [tag]
                stored = await target.log.get("shared", "k")
                assert stored is not None
                assert stored.data == tag
                assert [i.log_id for i in (await target.log.list_logs()).items] == ["shared"]
                leases = await target.queue.claim("shared", "w", lease=60.0, limit=10)
                assert [lease.payload for lease in leases] == [tag]
                assert (await target.stream.info("shared")).next_index == 1

    async def test_isolation_purge_only_its_namespace(
        self, world: World, world_target: WorldTarget
    ) -> None:
        ids = ("a", "b/c")
        async with world_target.sibling().scratch() as other:
            for target in (world, other):
                for identifier in ids:
                    await target.log.append(identifier, [NewEvent(data=b"x", key="k")])
                    await target.queue.enqueue(identifier, b"m", dedup_key="d")
                    await target.queue.enqueue(identifier, b"delayed", delay=3600)
                    await target.queue.enqueue(identifier, b"dead", max_attempts=1)
                    await target.stream.write(identifier, [b"s"])
                    await target.stream.close(identifier)
                for identifier in ids:
                    for lease in await target.queue.claim(identifier, "w", lease=60.0, limit=10):
                        if lease.payload == b"dead":
                            await target.queue.release(lease)
                    assert len(await target.queue.dead_letters(identifier)) == 1
            await world.purge()
            await _assert_empty(world, ids)
            for identifier in ids:
                assert await world.log.append(identifier, [NewEvent(data=b"y", key="k")]) == 1
                assert await world.queue.enqueue(identifier, b"m2", dedup_key="d")
                assert await other.log.tail(identifier) == 1
                assert len(await other.queue.dead_letters(identifier)) == 1
                assert await other.stream.info(identifier) == StreamInfo(
                    stream_id=identifier, next_index=1, closed=True
                )
            assert [i.log_id for i in (await other.log.list_logs()).items] == sorted(ids)
