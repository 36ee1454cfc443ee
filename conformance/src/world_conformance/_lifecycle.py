"""LifecycleContract: what a World says about itself, and ``aclose``."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

import pytest

from world_conformance._base import ContractBase
from world_conformance._target import WorldTarget
from world_core import Capabilities, ClosedError, NewEvent, World, connect_world
from world_core.spi import MAX_PAYLOAD_BYTES

__all__ = ["LifecycleContract"]


class LifecycleContract(ContractBase):
    """Name, namespace, capabilities, redacted settings; ``aclose`` idempotent and final."""

    contract_area = "world"

    async def test_world_describes_itself(self, world: World, world_target: WorldTarget) -> None:
        assert world.namespace == world_target.namespace
        assert isinstance(world.name, str)
        assert world.name
        capabilities = world.capabilities
        assert isinstance(capabilities, Capabilities)
        assert 0 < capabilities.max_payload_bytes <= MAX_PAYLOAD_BYTES
        settings = world.settings()
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in settings.items())
        url = world_target.url or ""
        password = urlsplit(url).password if "://" in url else None
        if password:
            leaked = [k for k, v in settings.items() if unquote(password) in v or password in v]
            assert not leaked, f"settings() shows the password in {leaked}"

    async def test_world_aclose_idempotent_then_closed(self, world_target: WorldTarget) -> None:
        """``aclose`` twice is fine; afterwards every call raises ClosedError, writing nothing."""
        target = world_target.sibling()
        async with target.scratch() as keeper:
            closing = await connect_world(target.name, url=target.url, namespace=target.namespace)
            await closing.log.append("l", [NewEvent(data=b"a")])
            await closing.aclose()
            await closing.aclose()
            with pytest.raises(ClosedError):
                await closing.log.append("l", [NewEvent(data=b"b")])
            with pytest.raises(ClosedError):
                await closing.queue.enqueue("q", b"m")
            with pytest.raises(ClosedError):
                await closing.stream.write("s", [b"c"])
            assert await keeper.log.tail("l") == 1
            assert await keeper.queue.claim("q", "w", lease=60.0) == []
            assert (await keeper.stream.info("s")).next_index == 0

    async def test_world_two_connections_share_state(
        self, world: World, world_target: WorldTarget
    ) -> None:
        """Two ``connect`` calls with the same URL and namespace in one process are the same
        store: each sees what the other wrote (log, queue, stream), and closing one leaves the
        other usable."""
        async with world_target.open() as second:
            await world.log.append("shared", [NewEvent(data=b"one")])
            seen = await second.log.read("shared")
            assert [e.data for e in seen] == [b"one"], (
                "a second connection to the same URL and namespace must see the first's append"
            )
            message_id = await second.queue.enqueue("shared", b"job")
            leases = await world.queue.claim("shared", "w", lease=60.0)
            assert [lease.message_id for lease in leases] == [message_id], (
                "a message enqueued on one connection must be claimable on the other"
            )
            await second.queue.ack(leases[0])
            await world.stream.write("shared", [b"chunk"])
            assert (await second.stream.info("shared")).next_index == 1, (
                "a chunk written on one connection must be visible on the other"
            )
        assert await world.log.tail("shared") == 1, "closing the second connection closed this one"
