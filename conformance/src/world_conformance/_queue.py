"""QueueContract: the executable form of ``world_core.spi.Queue``.

Leases here are short (0.5 s) so that expiry tests stay quick; nothing asserts how fast
anything happens, only what is seen, with every wait bounded.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from world_conformance._base import ContractBase
from world_conformance._support import CLAIMABLE, WAIT, claim_one, eventually
from world_conformance._target import WorldTarget
from world_core import (
    DeadLetter,
    InvalidArgumentError,
    InvalidIdentifierError,
    Lease,
    LeaseLostError,
    NotFoundError,
    World,
)
from world_core.spi import DEFAULT_MAX_ATTEMPTS, MAX_LIST_LIMIT, MAX_QUEUE_SECONDS

__all__ = ["QueueContract"]

SHORT = 0.5
"""A lease meant to expire during the test."""

LONG = 120.0
"""A lease meant to outlive the test."""


async def _claim_one(
    world: World, queue: str, worker: str, lease: float = LONG, *, what: str = CLAIMABLE
) -> Lease:
    return await claim_one(world, queue, worker, lease=lease, what=what)


async def _reclaim(world: World, queue: str, worker: str, lease: float = LONG) -> Lease:
    """Claim until a message whose lease expired is handed out again."""

    async def probe() -> Lease | None:
        leases = await world.queue.claim(queue, worker, lease=lease)
        return leases[0] if leases else None

    return await eventually(probe, f"redelivery on {queue!r} after the lease expired")


async def _dead(world: World, queue: str, count: int = 1) -> list[DeadLetter]:
    async def probe() -> list[DeadLetter] | None:
        await world.queue.claim(queue, "reaper", lease=LONG)
        letters = await world.queue.dead_letters(queue)
        return letters if len(letters) >= count else None

    return await eventually(probe, f"{count} dead letter(s) on {queue!r}")


class QueueContract(ContractBase):
    """``Queue``: leases, fencing tokens, delays, dedup keys, dead letters, FIFO, waiting."""

    contract_area = "queue"

    async def test_queue_enqueue_claim_ack(self, world: World) -> None:
        queue = world.queue
        message_id = await queue.enqueue("q", b"hello")
        lease = await _claim_one(world, "q", "w1")
        assert (lease.queue, lease.message_id, lease.payload) == ("q", message_id, b"hello")
        assert (lease.attempt, lease.max_attempts) == (1, DEFAULT_MAX_ATTEMPTS)
        assert lease.token
        assert await queue.claim("q", "w2", lease=LONG) == [], "a leased message was handed out"
        await queue.ack(lease)
        assert await queue.claim("q", "w2", lease=LONG) == []
        assert await queue.claim("other", "w2", lease=LONG) == []
        assert await queue.dead_letters("q") == []

    async def test_queue_fifo_for_immediate_messages(self, world: World) -> None:
        ids = [await world.queue.enqueue("q", str(i).encode()) for i in range(6)]
        assert len(set(ids)) == 6
        first = await world.queue.claim("q", "w", lease=LONG, limit=3)
        assert [lease.message_id for lease in first] == ids[:3]
        rest = [await _claim_one(world, "q", "w") for _ in range(3)]
        assert [lease.message_id for lease in rest] == ids[3:]
        assert [lease.payload for lease in first + rest] == [str(i).encode() for i in range(6)]

    async def test_queue_lease_expiry_redelivers(self, world: World) -> None:
        await world.queue.enqueue("q", b"job")
        first = await _claim_one(world, "q", "w1", lease=SHORT)
        second = await _reclaim(world, "q", "w2")
        assert second.message_id == first.message_id
        assert second.payload == b"job"
        assert second.attempt == first.attempt + 1 == 2
        assert second.token != first.token
        assert second.deadline > first.deadline

    async def test_queue_stale_token_refused(self, world: World) -> None:
        await world.queue.enqueue("q", b"job")
        stale = await _claim_one(world, "q", "w1", lease=SHORT)
        current = await _reclaim(world, "q", "w2")
        with pytest.raises(LeaseLostError):
            await world.queue.ack(stale)
        with pytest.raises(LeaseLostError):
            await world.queue.renew(stale, LONG)
        with pytest.raises(LeaseLostError):
            await world.queue.release(stale)
        await world.queue.ack(current)
        for call in (world.queue.ack, world.queue.release):
            with pytest.raises(LeaseLostError):
                await call(current)
        with pytest.raises(LeaseLostError):
            await world.queue.renew(current, LONG)
        assert await world.queue.claim("q", "w3", lease=LONG) == []

    async def test_queue_renew_keeps_token(self, world: World) -> None:
        await world.queue.enqueue("q", b"job")
        lease = await _claim_one(world, "q", "w", lease=5.0)
        renewed = await world.queue.renew(lease, LONG)
        assert (renewed.message_id, renewed.token, renewed.attempt, renewed.payload) == (
            lease.message_id,
            lease.token,
            lease.attempt,
            lease.payload,
        )
        assert renewed.deadline > lease.deadline
        await world.queue.ack(lease)  # the token is the same, so either lease object works

    async def test_queue_renew_after_deadline_before_reclaim(self, world: World) -> None:
        """Succeeds after the deadline passed as long as nobody claimed the message since."""
        await world.queue.enqueue("q", b"job")
        lease = await _claim_one(world, "q", "w", lease=SHORT)
        await anyio.sleep(SHORT * 2)
        renewed = await world.queue.renew(lease, LONG)
        assert renewed.token == lease.token
        assert await world.queue.claim("q", "other", lease=LONG) == []
        await world.queue.ack(renewed)

    async def test_queue_ack_after_deadline_before_reclaim(self, world: World) -> None:
        await world.queue.enqueue("q", b"job")
        lease = await _claim_one(world, "q", "w", lease=SHORT)
        await anyio.sleep(SHORT * 2)
        await world.queue.ack(lease)
        await anyio.sleep(SHORT)
        assert await world.queue.claim("q", "other", lease=LONG) == []

    async def test_queue_release(self, world: World) -> None:
        await world.queue.enqueue("q", b"job")
        lease = await _claim_one(world, "q", "w")
        await world.queue.release(lease)
        again = await _claim_one(world, "q", "w")
        assert (again.message_id, again.attempt) == (lease.message_id, 2)
        with pytest.raises(LeaseLostError):
            await world.queue.ack(lease)
        await world.queue.release(again, delay=3600)
        assert await world.queue.claim("q", "w", lease=LONG) == []
        assert await world.queue.dead_letters("q") == []

    async def test_queue_released_message_goes_behind(self, world: World) -> None:
        """Order is by the time a message became visible: one released now comes after those
        that were already waiting, and before those enqueued later."""
        first = await world.queue.enqueue("q", b"1")
        second = await world.queue.enqueue("q", b"2")
        lease = await _claim_one(world, "q", "w")
        assert lease.message_id == first
        await anyio.sleep(0.01)  # distinct visibility times even on a millisecond clock
        await world.queue.release(lease)
        third = await world.queue.enqueue("q", b"3")
        order = [(await _claim_one(world, "q", "w")).message_id for _ in range(3)]
        assert order == [second, first, third]

    async def test_queue_release_with_short_delay_returns(self, world: World) -> None:
        await world.queue.enqueue("q", b"job")
        lease = await _claim_one(world, "q", "w")
        await world.queue.release(lease, delay=0.3)
        again = await _reclaim(world, "q", "w")
        assert (again.message_id, again.attempt) == (lease.message_id, 2)

    async def test_queue_delayed_messages(self, world: World) -> None:
        late = await world.queue.enqueue("q", b"late", delay=3600)
        assert await world.queue.claim("q", "w", lease=LONG) == []
        soon = await world.queue.enqueue("q", b"soon", delay=0.3)
        lease = await _reclaim(world, "q", "w")
        assert lease.message_id == soon != late
        assert await world.queue.claim("q", "w", lease=LONG) == []

    async def test_queue_dedup_keys(self, world: World) -> None:
        queue = world.queue
        first = await queue.enqueue("q", b"a", dedup_key="k")
        assert await queue.enqueue("q", b"b", dedup_key="k") == first
        other_queue = await queue.enqueue("q2", b"a", dedup_key="k")
        assert other_queue != first
        lease = await _claim_one(world, "q", "w")
        assert lease.payload == b"a"
        assert await queue.claim("q", "w", lease=LONG) == [], "a deduplicated enqueue added one"
        assert await queue.enqueue("q", b"c", dedup_key="k") == first, "leased is still live"
        await queue.ack(lease)
        fresh = await queue.enqueue("q", b"d", dedup_key="k")
        assert fresh != first
        assert (await _claim_one(world, "q", "w")).payload == b"d"
        delayed = await queue.enqueue("q", b"e", dedup_key="later", delay=3600)
        assert await queue.enqueue("q", b"f", dedup_key="later") == delayed, "delayed is live"

    async def test_queue_dedup_race_adds_one(self, world: World) -> None:
        ids: list[str] = []

        async def enqueue(index: int) -> None:
            ids.append(await world.queue.enqueue("q", str(index).encode(), dedup_key="once"))

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                for index in range(10):
                    group.start_soon(enqueue, index)
        assert len(set(ids)) == 1, f"one dedup key gave several ids: {set(ids)}"
        leases = await world.queue.claim("q", "w", lease=LONG, limit=20)
        assert [lease.message_id for lease in leases] == ids[:1]

    async def test_queue_concurrent_enqueues_keep_their_payloads(self, world: World) -> None:
        sent: dict[str, bytes] = {}

        async def enqueue(index: int) -> None:
            payload = f"message {index}".encode()
            sent[await world.queue.enqueue("q", payload)] = payload

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as group:
                for index in range(20):
                    group.start_soon(enqueue, index)
        assert len(sent) == 20, "two concurrent enqueues got one id"
        leases = await world.queue.claim("q", "w", lease=LONG, limit=50)
        assert {lease.message_id: lease.payload for lease in leases} == sent

    async def test_queue_concurrent_acks_of_one_lease_one_wins(self, world: World) -> None:
        await world.queue.enqueue("q", b"job")
        lease = await _claim_one(world, "q", "w")
        outcomes: list[str] = []

        async def ack() -> None:
            try:
                await world.queue.ack(lease)
                outcomes.append("acked")
            except LeaseLostError:
                outcomes.append("lost")

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as group:
                for _ in range(5):
                    group.start_soon(ack)
        assert sorted(outcomes) == ["acked"] + ["lost"] * 4, "one lease was acked twice"
        assert await world.queue.claim("q", "w", lease=LONG) == []

    async def test_queue_dead_letter_after_max_attempts_and_requeue(self, world: World) -> None:
        queue = world.queue
        message_id = await queue.enqueue("q", b"poison", max_attempts=2)
        first = await _claim_one(world, "q", "w")
        assert (first.attempt, first.max_attempts) == (1, 2)
        await queue.release(first)
        second = await _claim_one(world, "q", "w")
        assert second.attempt == 2
        await queue.release(second)
        assert await queue.claim("q", "w", lease=LONG) == []
        letters = await queue.dead_letters("q")
        assert [(d.message_id, d.payload, d.attempts, d.queue) for d in letters] == [
            (message_id, b"poison", 2, "q")
        ]
        assert letters[0].reason
        with pytest.raises(LeaseLostError):
            await queue.ack(second)
        waiting = await queue.enqueue("q", b"waiting")
        await anyio.sleep(0.01)  # distinct visibility times even on a millisecond clock
        await queue.requeue("q", message_id)
        assert await queue.dead_letters("q") == []
        assert (await _claim_one(world, "q", "w")).message_id == waiting, "requeued jumped ahead"
        again = await _claim_one(world, "q", "w")
        assert (again.message_id, again.attempt, again.payload) == (message_id, 1, b"poison")
        assert again.max_attempts == 2, "requeue keeps max_attempts"
        await queue.ack(again)
        with pytest.raises(NotFoundError):
            await queue.requeue("q", message_id)

    async def test_queue_dead_letter_after_expired_leases(self, world: World) -> None:
        queue = world.queue
        message_id = await queue.enqueue("q", b"poison", max_attempts=1, dedup_key="d")
        lease = await _claim_one(world, "q", "w", lease=SHORT)
        letters = await _dead(world, "q")
        assert [(d.message_id, d.attempts) for d in letters] == [(message_id, 1)]
        with pytest.raises(LeaseLostError):
            await queue.renew(lease, LONG)
        assert await queue.enqueue("q", b"new", dedup_key="d") != message_id, "dead is not live"

    async def test_queue_dead_letters_oldest_first_and_limited(self, world: World) -> None:
        ids = [await world.queue.enqueue("q", bytes([i]), max_attempts=1) for i in range(3)]
        for _ in ids:
            await world.queue.release(await _claim_one(world, "q", "w"))
        assert [d.message_id for d in await world.queue.dead_letters("q")] == ids
        assert [d.message_id for d in await world.queue.dead_letters("q", limit=2)] == ids[:2]
        for bad in (0, MAX_LIST_LIMIT + 1):
            with pytest.raises(InvalidArgumentError):
                await world.queue.dead_letters("q", limit=bad)
        with pytest.raises(NotFoundError):
            await world.queue.requeue("q", "no-such-message")
        with pytest.raises(NotFoundError):
            await world.queue.requeue("other", ids[0])

    async def test_queue_dead_letters_in_order_of_death(self, world: World) -> None:
        """Dead letters are listed by the time each message was dead-lettered, oldest first,
        not by enqueue time: the order an operator handles failures in. A death is the
        release after the last delivery, or the claim that finds the last lease expired; a
        requeued message that dies again counts from its new death."""
        early = await world.queue.enqueue("q", b"early", max_attempts=1)
        late = await world.queue.enqueue("q", b"late", max_attempts=1)
        first = await _claim_one(world, "q", "w")
        second = await _claim_one(world, "q", "w")
        assert (first.message_id, second.message_id) == (early, late)
        await world.queue.release(second)  # the later message dies first
        await world.queue.renew(first, SHORT)  # the earlier one dies once this lease expired
        letters = await _dead(world, "q", 2)
        order = [d.message_id for d in letters]
        assert order == [late, early], (
            "dead_letters lists messages in the order they died (the one released after its "
            "last delivery, then the one whose last lease expired later), not in enqueue "
            f"order: expected [late, early] = {[late, early]}, got {order}"
        )
        oldest = [d.message_id for d in await world.queue.dead_letters("q", limit=1)]
        assert oldest == [late], f"dead_letters(limit=1) returns the oldest death, got {oldest}"
        await world.queue.requeue("q", late)
        await anyio.sleep(0.01)  # distinct death times even on a millisecond clock
        await world.queue.release(await _claim_one(world, "q", "w"))
        order = [d.message_id for d in await world.queue.dead_letters("q")]
        assert order == [early, late], (
            "a requeued message that dies again is ordered by its new death, after the "
            f"letters already there: expected [early, late] = {[early, late]}, got {order}"
        )

    async def test_queue_lease_arguments_refused(self, world: World) -> None:
        """``renew``, ``ack`` and ``release`` take the Lease itself (a copy with an invalid id
        or token is refused as such); ``renew`` needs a duration > 0, ``release`` a delay
        >= 0. A refused call changes nothing: the lease stays current."""
        await world.queue.enqueue("q", b"x")
        lease = await _claim_one(world, "q", "w")
        not_a_lease: Any = lease.model_dump()
        with pytest.raises(InvalidArgumentError):
            await world.queue.renew(not_a_lease, LONG)
        with pytest.raises(InvalidArgumentError):
            await world.queue.ack(not_a_lease)
        with pytest.raises(InvalidArgumentError):
            await world.queue.release(not_a_lease)
        for field in ("queue", "message_id", "token"):
            broken = lease.model_copy(update={field: "a\x00"})
            with pytest.raises(InvalidIdentifierError):
                await world.queue.ack(broken)
            with pytest.raises(InvalidIdentifierError):
                await world.queue.renew(broken, LONG)
            with pytest.raises(InvalidIdentifierError):
                await world.queue.release(broken)
        for duration in (0, 0.0, -1.0, float("inf"), float("nan")):
            with pytest.raises(InvalidArgumentError):
                await world.queue.renew(lease, duration)
        for delay in (-1.0, float("inf")):
            with pytest.raises(InvalidArgumentError):
                await world.queue.release(lease, delay=delay)
        no_limit: Any = None
        with pytest.raises(InvalidArgumentError):
            await world.queue.dead_letters("q", limit=no_limit)
        renewed = await world.queue.renew(lease, LONG)
        assert (renewed.token, renewed.attempt) == (lease.token, 1)
        await world.queue.ack(lease)
        assert await world.queue.claim("q", "w", lease=LONG) == []

    async def test_queue_claim_wait_woken_by_enqueue(self, world: World) -> None:
        got: list[Lease] = []

        async def waiter() -> None:
            got.extend(await world.queue.claim("q", "w", lease=LONG, wait=WAIT))

        with anyio.fail_after(WAIT * 2):
            async with anyio.create_task_group() as group:
                group.start_soon(waiter)
                await anyio.sleep(0.2)
                message_id = await world.queue.enqueue("q", b"wake")
        assert [lease.message_id for lease in got] == [message_id]

    async def test_queue_claim_wait_returns_empty(self, world: World) -> None:
        with anyio.fail_after(WAIT):
            assert await world.queue.claim("q", "w", lease=LONG, wait=0.2) == []

    async def test_queue_concurrent_claimers_never_share(
        self, world: World, world_target: WorldTarget
    ) -> None:
        ids = {await world.queue.enqueue("q", str(i).encode()) for i in range(30)}
        claimed: list[str] = []

        async def worker(target: World, name: str) -> None:
            while True:
                leases = await target.queue.claim("q", name, lease=LONG, limit=2)
                if not leases:
                    return
                for lease in leases:
                    claimed.append(lease.message_id)
                    await target.queue.ack(lease)

        async with world_target.open() as second:
            with anyio.fail_after(60):
                async with anyio.create_task_group() as group:
                    for index in range(6):
                        group.start_soon(worker, world if index % 2 else second, f"w{index}")
        assert sorted(claimed) == sorted(ids), "a message was handed to two workers, or lost"

    async def test_queue_durations_past_the_longest_refused(self, world: World) -> None:
        """A delay or lease past MAX_QUEUE_SECONDS (about 31 years) is bad input: refused
        naming it, before anything is written, on every backend alike (not an overflow deep
        in the store, not silently shortened). The longest itself is taken."""
        await world.queue.enqueue("q", b"now")
        for seconds in (MAX_QUEUE_SECONDS + 1, 1e300):
            with pytest.raises(InvalidArgumentError, match="delay"):
                await world.queue.enqueue("q", b"late", delay=seconds)
            with pytest.raises(InvalidArgumentError, match="lease"):
                await world.queue.claim("q", "w", lease=seconds)
        lease = await _claim_one(world, "q", "w", lease=MAX_QUEUE_SECONDS)
        assert (lease.payload, lease.attempt) == (b"now", 1), "a refused call wrote something"
        for seconds in (MAX_QUEUE_SECONDS + 1, 1e300):
            with pytest.raises(InvalidArgumentError, match="duration"):
                await world.queue.renew(lease, seconds)
            with pytest.raises(InvalidArgumentError, match="delay"):
                await world.queue.release(lease, delay=seconds)
        renewed = await world.queue.renew(lease, MAX_QUEUE_SECONDS)
        assert (renewed.token, renewed.attempt) == (lease.token, 1)
        await world.queue.release(lease, delay=MAX_QUEUE_SECONDS)
        await world.queue.enqueue("q", b"far", delay=MAX_QUEUE_SECONDS)
        assert await world.queue.claim("q", "w", lease=LONG) == [], "a delayed message came early"

    async def test_queue_claim_arguments_refused(self, world: World) -> None:
        await world.queue.enqueue("q", b"x")
        for seconds, limit in ((0.0, 1), (-1.0, 1), (1.0, 0), (1.0, MAX_LIST_LIMIT + 1)):
            with pytest.raises(InvalidArgumentError):
                await world.queue.claim("q", "w", lease=seconds, limit=limit)
        with pytest.raises(InvalidArgumentError):
            await world.queue.claim("q", "w", lease=1.0, wait=-1.0)
        with pytest.raises(InvalidArgumentError):
            await world.queue.enqueue("q", b"x", delay=-1)
        with pytest.raises(InvalidArgumentError):
            await world.queue.enqueue("q", b"x", max_attempts=0)
        lease = await _claim_one(world, "q", "w")
        assert lease.attempt == 1, "a refused claim counted as a delivery"
