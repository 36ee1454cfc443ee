"""OutboxContract: ``Log.append(messages=...)``, gated by ``Capabilities.outbox``."""

from __future__ import annotations

import pytest

from world_conformance._base import ContractBase
from world_core import (
    ConflictError,
    DuplicateKeyError,
    NewEvent,
    OutboxMessage,
    UnsupportedError,
    World,
)

__all__ = ["OutboxContract"]


def _require_outbox(world: World) -> None:
    if not world.capabilities.outbox:
        pytest.skip("Capabilities.outbox is false (test_outbox_absent_refused covers it)")


class OutboxContract(ContractBase):
    """Messages enqueued in the same atomic write as an append, or refused where absent."""

    contract_area = "outbox"

    async def test_outbox_absent_refused(self, world: World) -> None:
        if world.capabilities.outbox:
            pytest.skip("Capabilities.outbox is true (the other outbox tests cover it)")
        with pytest.raises(UnsupportedError):
            await world.log.append(
                "l", [NewEvent(data=b"e")], messages=[OutboxMessage(queue="q", payload=b"m")]
            )
        assert await world.log.info("l") is None
        assert await world.queue.claim("q", "w", lease=60.0) == []

    async def test_outbox_message_and_events_together(self, world: World) -> None:
        _require_outbox(world)
        tail = await world.log.append(
            "l",
            [NewEvent(data=b"e1"), NewEvent(data=b"e2")],
            status="queued",
            messages=[
                OutboxMessage(queue="q", payload=b"m1"),
                OutboxMessage(queue="q", payload=b"m2", max_attempts=3),
                OutboxMessage(queue="later", payload=b"m3", delay=3600),
            ],
        )
        assert tail == 2
        assert [e.data for e in await world.log.read("l")] == [b"e1", b"e2"]
        leases = await world.queue.claim("q", "w", lease=60.0, limit=10)
        assert [(lease.payload, lease.max_attempts) for lease in leases] == [
            (b"m1", 10),
            (b"m2", 3),
        ]
        assert await world.queue.claim("later", "w", lease=60.0) == []

    async def test_outbox_dedup_key_honoured(self, world: World) -> None:
        _require_outbox(world)
        first = await world.queue.enqueue("q", b"first", dedup_key="d")
        await world.log.append(
            "l",
            [NewEvent(data=b"e")],
            messages=[OutboxMessage(queue="q", payload=b"second", dedup_key="d")],
        )
        leases = await world.queue.claim("q", "w", lease=60.0, limit=10)
        assert [(lease.message_id, lease.payload) for lease in leases] == [(first, b"first")]
        assert await world.log.tail("l") == 1

    async def test_outbox_refused_append_enqueues_nothing(self, world: World) -> None:
        _require_outbox(world)
        await world.log.append("l", [NewEvent(data=b"e", key="k")])
        message = [OutboxMessage(queue="q", payload=b"m")]
        with pytest.raises(ConflictError):
            await world.log.append("l", [NewEvent(data=b"x")], expect_tail=0, messages=message)
        with pytest.raises(DuplicateKeyError):
            await world.log.append("l", [NewEvent(data=b"x", key="k")], messages=message)
        assert await world.queue.claim("q", "w", lease=60.0) == []
        assert await world.log.tail("l") == 1
