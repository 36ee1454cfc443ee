"""The Queue on Redis: sorted sets by visible-at and deadline, one script per transition."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import anyio

from world_core.errors import BackendUnavailableError, LeaseLostError, NotFoundError
from world_core.spi import (
    DEFAULT_MAX_ATTEMPTS,
    DeadLetter,
    Lease,
    Queue,
    validate_claim,
    validate_dead_letters,
    validate_enqueue,
    validate_id,
    validate_lease,
    validate_release,
    validate_renew,
)
from world_redis import _scripts as S
from world_redis._conn import BLOCK_SECONDS, Arg, Connection, translate
from world_redis._keys import Keys

__all__ = ["RedisQueue", "micros", "nonce", "wait_on"]

# About 31 years: longer delays and leases are "never" in practice, and stay exact integers
# in Lua's doubles and Redis' 64-bit replies.
_MAX_MICROS = 10**15


def micros(seconds: float) -> int:
    """Seconds (validated, finite, >= 0) as integer microseconds, capped at ~31 years."""
    return min(round(seconds * 1_000_000), _MAX_MICROS)


def nonce() -> str:
    """Random suffix of a message id: ids are unique across queues, not only within one."""
    return secrets.token_hex(6)


async def wait_on(conn: Connection, what: str, *args: Arg) -> Any:
    """One blocking wait (XREAD BLOCK, BLPOP). A wait cut short because the World was closed
    raises ClosedError, not the connection fault that closing its client caused."""
    try:
        with translate(what):
            return await conn.block(*args)
    except BackendUnavailableError:
        conn.check_open()
        raise


def _lost(lease: Lease, what: str) -> LeaseLostError:
    return LeaseLostError(
        f"{what}: the lease on message {lease.message_id!r} of queue {lease.queue!r} is no "
        "longer current (claimed again, acked or dead-lettered); stop working on it"
    )


@dataclass
class _Sleepers:
    """The claims of one World asleep on one queue's signal list."""

    turn: anyio.Lock = field(default_factory=anyio.Lock)
    count: int = 0


class RedisQueue(Queue):
    def __init__(self, conn: Connection, keys: Keys) -> None:
        self._conn = conn
        self._keys = keys
        self._sleepers: dict[str, _Sleepers] = {}

    async def _sleep(self, signal: str, seconds: float) -> None:
        """Sleep on ``signal`` until a wake-up token, or ``seconds``.

        The claims of this World waiting on one queue take turns: one BLPOP at a time, on one
        connection, the others wait for their turn (first come, first served). A token wakes
        the claim whose BLPOP took it, which hands the turn on at once and claims. Without
        this, every waiting claim held a connection of its own: a process of 150 worker loops
        on one queue ran out of redis-py's 100 and half its claims failed. A claim whose
        ``seconds`` end while it waits for its turn returns to look at the queue itself.
        """
        sleepers = self._sleepers.get(signal)
        if sleepers is None:
            sleepers = self._sleepers[signal] = _Sleepers()
        sleepers.count += 1
        try:
            end = anyio.current_time() + seconds
            turn = False
            with anyio.move_on_after(seconds):
                await sleepers.turn.acquire()  # cancelled: not acquired (anyio's guarantee)
                turn = True
            if not turn:
                return
            try:
                left = end - anyio.current_time()
                if left > 0:
                    await wait_on(self._conn, "claim wait", "BLPOP", signal, max(left, 0.001))
            finally:
                sleepers.turn.release()
        finally:
            sleepers.count -= 1
            if sleepers.count == 0:
                del self._sleepers[signal]

    async def enqueue(
        self,
        queue: str,
        payload: bytes,
        *,
        delay: float = 0.0,
        dedup_key: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> str:
        validate_enqueue(
            queue, payload, delay=delay, dedup_key=dedup_key, max_attempts=max_attempts
        )
        with translate("enqueue", writes=True):
            message_id = await self._conn.run_merged(
                S.ENQUEUE,
                self._keys.queue(queue),
                (payload, micros(delay), dedup_key or "", max_attempts, nonce()),
            )
        return bytes(message_id).decode()

    async def _claim_once(
        self, queue: str, lease: float, limit: int
    ) -> tuple[list[Lease], float | None]:
        with translate("claim"):
            reply: list[Any] = await self._conn.run(
                S.CLAIM, self._keys.queue(queue), [micros(lease), limit]
            )
        deadline = int(reply[0]) / 1_000_000
        # The server's reply is trusted: no validation pass per lease.
        leases = [
            Lease.model_construct(
                queue=queue,
                message_id=reply[i].decode(),
                payload=reply[i + 1],
                attempt=int(reply[i + 2]),
                max_attempts=int(reply[i + 3]),
                token=reply[i + 4].decode(),
                deadline=deadline,
            )
            for i in range(2, len(reply), 5)
        ]
        wait_us = int(reply[1])
        return leases, (wait_us / 1_000_000 if wait_us >= 0 else None)

    async def claim(
        self,
        queue: str,
        worker: str,
        *,
        lease: float,
        limit: int = 1,
        wait: float = 0.0,
    ) -> list[Lease]:
        validate_claim(queue, worker, lease=lease, limit=limit, wait=wait)
        leases, next_due = await self._claim_once(queue, lease, limit)
        if leases or wait <= 0:
            return leases
        give_up = time.monotonic() + wait
        signal = self._keys.queue_signal(queue)
        while True:
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                return []
            # Sleep on the queue's signal list until an enqueue/release/requeue pushes a token,
            # or until the next delayed message or lease deadline is due.
            timeout = min(remaining, BLOCK_SECONDS)
            if next_due is not None:
                timeout = min(timeout, next_due)
            if timeout > 0:
                await self._sleep(signal, timeout)
            leases, next_due = await self._claim_once(queue, lease, limit)
            if leases:
                return leases

    async def renew(self, lease: Lease, duration: float) -> Lease:
        validate_renew(lease, duration)
        with translate("renew", writes=True):
            deadline = int(
                await self._conn.run(
                    S.RENEW,
                    self._keys.queue(lease.queue),
                    [lease.message_id, lease.token, micros(duration)],
                )
            )
        if deadline < 0:
            raise _lost(lease, "renew")
        return lease.model_copy(update={"deadline": deadline / 1_000_000})

    async def ack(self, lease: Lease) -> None:
        validate_lease(lease)
        with translate("ack", writes=True):
            done = await self._conn.run_merged(
                S.ACK, self._keys.queue(lease.queue), (lease.message_id, lease.token)
            )
        if not int(done):
            raise _lost(lease, "ack")

    async def release(self, lease: Lease, *, delay: float = 0.0) -> None:
        validate_release(lease, delay)
        with translate("release", writes=True):
            done = await self._conn.run(
                S.RELEASE,
                self._keys.queue(lease.queue),
                [lease.message_id, lease.token, micros(delay)],
            )
        if not int(done):
            raise _lost(lease, "release")

    async def dead_letters(self, queue: str, *, limit: int = 100) -> list[DeadLetter]:
        validate_dead_letters(queue, limit=limit)
        with translate("dead_letters"):
            reply: list[Any] = await self._conn.run(
                S.DEAD_LETTERS, self._keys.queue(queue), [limit]
            )
        return [
            DeadLetter(
                queue=queue,
                message_id=reply[i].decode(),
                payload=reply[i + 1],
                attempts=int(reply[i + 2]),
                reason=reply[i + 3].decode("utf-8"),
            )
            for i in range(0, len(reply), 4)
        ]

    async def requeue(self, queue: str, message_id: str) -> None:
        validate_id(queue, "queue")
        validate_id(message_id, "message_id")
        with translate("requeue", writes=True):
            done = await self._conn.run(S.REQUEUE, self._keys.queue(queue), [message_id])
        if not int(done):
            raise NotFoundError(
                f"queue {queue!r} has no dead letter {message_id!r}: list them with dead_letters()"
            )
