"""PayloadContract: opaque bytes of any content up to the limit, nothing written above it."""

from __future__ import annotations

import pytest

from world_conformance._base import ContractBase
from world_conformance._support import drain
from world_core import NewEvent, OutboxMessage, PayloadTooLargeError, StreamInfo, World

__all__ = ["PAYLOADS", "PayloadContract"]

_MIB = 1024 * 1024

PAYLOADS: dict[str, bytes] = {
    "empty": b"",
    "nul": b"\x00",
    "binary": b"\x00a\x00" + bytes(range(256)) + b"\xff\xfe\x00\x00\r\n\x1a",
    "5MiB": bytes(range(256)) * (5 * _MIB // 256),
}
"""Payloads every backend round-trips exactly (the 5 MiB one only where the limit allows)."""


class PayloadContract(ContractBase):
    """Event data, message payloads and stream chunks round-trip exactly; over-limit calls are
    refused whole."""

    contract_area = "payload"

    @pytest.mark.parametrize("kind", list(PAYLOADS))
    async def test_payload_round_trips(self, world: World, kind: str) -> None:
        payload = PAYLOADS[kind]
        if len(payload) > world.capabilities.max_payload_bytes:
            pytest.skip(f"max_payload_bytes={world.capabilities.max_payload_bytes} < {kind}")
        assert await world.log.append("l", [NewEvent(data=payload, key="k")]) == 1
        events = await world.log.read("l")
        assert len(events) == 1
        assert events[0].data == payload
        stored = await world.log.get("l", "k")
        assert stored is not None
        assert stored.data == payload
        await world.queue.enqueue("q", payload)
        leases = await world.queue.claim("q", "w", lease=60.0)
        assert [lease.payload for lease in leases] == [payload]
        await world.stream.write("s", [payload])
        await world.stream.close("s")
        assert [c.data for c in await drain(world.stream.read("s"))] == [payload]

    async def test_payload_exactly_at_limit(self, world: World) -> None:
        """A call carrying exactly ``max_payload_bytes`` is accepted whole."""
        limit = world.capabilities.max_payload_bytes
        half, rest = limit // 2, limit - limit // 2
        events = [NewEvent(data=b"\x01" * half), NewEvent(data=b"\x02" * rest)]
        assert await world.log.append("l", events) == 2
        assert [len(e.data) for e in await world.log.read("l")] == [half, rest]
        await world.queue.enqueue("q", b"\x03" * limit)
        leases = await world.queue.claim("q", "w", lease=60.0)
        assert [len(lease.payload) for lease in leases] == [limit]
        assert await world.stream.write("s", [b"\x04" * half, b"\x05" * rest]) == 2

    async def test_payload_over_limit_writes_nothing(self, world: World) -> None:
        limit = world.capabilities.max_payload_bytes
        half = b"\x01" * (limit // 2 + 1)
        too_big = b"\x02" * (limit + 1)
        for call in (
            lambda: world.log.append("l", [NewEvent(data=too_big)]),
            lambda: world.log.append("l", [NewEvent(data=half), NewEvent(data=half)]),
            lambda: world.log.append(
                "l", [NewEvent(data=half)], messages=[OutboxMessage(queue="q", payload=half)]
            ),
            lambda: world.queue.enqueue("q", too_big),
            lambda: world.stream.write("s", [too_big]),
            lambda: world.stream.write("s", [half, half]),
        ):
            with pytest.raises(PayloadTooLargeError) as caught:
                await call()
            assert caught.value.limit == limit
            assert caught.value.size > limit
        assert await world.log.info("l") is None
        assert await world.queue.claim("q", "w", lease=60.0) == []
        assert await world.stream.info("s") == StreamInfo(stream_id="s", next_index=0, closed=False)
