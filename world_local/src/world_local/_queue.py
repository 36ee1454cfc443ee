"""Queue: one framed file per queue; one frame per state change (a transaction of ops).

Ops: ``put`` (a whole message, payload as blob), ``set`` (some fields of a message), ``del``
(an acked message). The file is rewritten (compacted) once it is mostly history.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, TypeVar

import anyio

from world_core.errors import LeaseLostError, NotFoundError
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
from world_local._files import Blob, FoldedFile, encode_frame
from world_local._space import POLL_MAX, POLL_MIN, Space, pause

__all__ = ["LocalQueue", "Message", "QueueFile", "new_message"]

R = TypeVar("R")

COMPACT_BYTES = 1 << 20
"""Compact a queue file once it is larger than this and more than half of it is history."""


@dataclass
class Message:
    id: str
    payload: bytes
    order: int  # enqueue order
    visible_at: float  # when ready or delayed: the time it becomes visible
    max_attempts: int
    dedup_key: str | None = None
    attempts: int = 0
    token: str | None = None  # set while leased
    deadline: float = 0.0  # lease deadline; visible again from then
    dead: str | None = None  # the reason, once dead-lettered
    dead_order: int = 0

    def visible_since(self, now: float) -> float | None:
        """When the message became visible, or None if it is not visible at ``now``."""
        if self.dead is not None:
            return None
        since = self.visible_at if self.token is None else self.deadline
        return since if since <= now else None


def new_message(payload: bytes, delay: float, dedup_key: str | None, max_attempts: int) -> Message:
    return Message(
        id=uuid.uuid4().hex,
        payload=payload,
        order=0,  # set when added
        visible_at=time.time() + delay,
        max_attempts=max_attempts,
        dedup_key=dedup_key,
    )


_FIELDS = {f.name for f in fields(Message)} - {"payload"}


def _put(message: Message, blob: int) -> dict[str, Any]:
    record = {k: v for k, v in asdict(message).items() if k != "payload"}
    return {"op": "put", "blob": blob, **record}


class QueueFile(FoldedFile):
    kind = "queues"

    def reset(self) -> None:
        self.messages: dict[str, Message] = {}
        self.keyed: dict[str, list[str]] = {}
        """dedup key -> the ids of the messages carrying it, in enqueue order: what :meth:`add`
        looks a key up in, instead of going through every message under the lock (a second
        id comes only once the first is dead-lettered, and goes when it is acked)"""
        self.next_order = 1
        self.size = 0  # payload bytes of the messages kept, to decide on compaction

    def apply(self, meta: dict[str, Any], blobs: list[Blob]) -> None:
        for op in meta["ops"]:
            kind = op.pop("op")
            if kind == "put":
                payload = blobs[op.pop("blob")][1]
                message = self.messages[op["id"]] = Message(payload=payload, **op)
                self.size += len(payload)
                if message.dedup_key is not None:
                    self.keyed.setdefault(message.dedup_key, []).append(message.id)
            elif kind == "set":
                message = self.messages[op.pop("id")]
                key = message.dedup_key
                for name, value in op.items():
                    if name in _FIELDS:
                        setattr(message, name, value)
                if message.dedup_key != key:  # no op written here does that; kept right if one did
                    self._index_keys()
            elif kind == "del":
                message = self.messages.pop(op["id"])
                self.size -= len(message.payload)
                if message.dedup_key is not None:
                    keyed = self.keyed[message.dedup_key]
                    keyed.remove(message.id)
                    if not keyed:
                        del self.keyed[message.dedup_key]
            self.next_order = max(
                self.next_order, op.get("order", 0) + 1, op.get("dead_order", 0) + 1
            )

    def _index_keys(self) -> None:
        self.keyed = {}
        for message in self.messages.values():
            if message.dedup_key is not None:
                self.keyed.setdefault(message.dedup_key, []).append(message.id)

    def _live_with(self, key: str) -> str | None:
        """The id of the last enqueued message carrying dedup key ``key`` that is not dead."""
        for ident in reversed(self.keyed.get(key, ())):
            if self.messages[ident].dead is None:
                return ident
        return None

    @property
    def held(self) -> int:
        return len(self.messages)

    def live(self, lease: Lease) -> Message:
        message = self.messages.get(lease.message_id)
        if message is None or message.dead is not None or message.token != lease.token:
            raise _lost(lease)
        return message

    def commit_ops(self, fd: int, ops: list[dict[str, Any]], blobs: Sequence[bytes] = ()) -> None:
        self.commit(fd, encode_frame({"ops": ops}, blobs), sync=False)
        if self.end > COMPACT_BYTES and self.end > 2 * (self.size + 256 * len(self.messages)):
            kept = list(self.messages.values())
            snapshot = [_put(m, i) for i, m in enumerate(kept)]
            self.replace([encode_frame({"ops": snapshot}, [m.payload for m in kept])])

    def add(self, fd: int, new: Sequence[Message]) -> list[str]:
        """Enqueue ``new`` in one frame and return their ids. A message whose id is already
        here (an outbox delivery finished twice) or whose dedup key a live message carries is
        not added; the id returned is then that message's."""
        ids: list[str] = []
        ops: list[dict[str, Any]] = []
        blobs: list[bytes] = []
        added: dict[str, str] = {}  # dedup key -> id, of the messages of this frame
        for message in new:
            key = message.dedup_key
            live = None if key is None else added.get(key) or self._live_with(key)
            if message.id in self.messages:
                ids.append(message.id)
            elif live is not None:
                ids.append(live)
            else:
                message.order = self.next_order + len(ops)
                ops.append(_put(message, len(blobs)))
                blobs.append(message.payload)
                ids.append(message.id)
                if key is not None:
                    added[key] = message.id
        if ops:
            self.commit_ops(fd, ops, blobs)
        return ids

    def visible(self, now: float) -> list[Message]:
        """Visible messages in hand-out order: by the time they became visible, then enqueue
        order."""
        found = [
            (since, m.order, m)
            for m in self.messages.values()
            if (since := m.visible_since(now)) is not None
        ]
        return [m for _, _, m in sorted(found, key=lambda item: item[:2])]

    def claim(self, fd: int, lease: float, limit: int) -> list[Lease]:
        now = time.time()
        ops: list[dict[str, Any]] = []
        leases: list[Lease] = []
        for message in self.visible(now):
            if len(leases) == limit:
                break
            if message.attempts >= message.max_attempts:
                ops.append(self.dead_op(message, f"not acked after {message.attempts} deliveries"))
                continue
            token, deadline = uuid.uuid4().hex, now + lease
            ops.append(
                {
                    "op": "set",
                    "id": message.id,
                    "attempts": message.attempts + 1,
                    "token": token,
                    "deadline": deadline,
                }
            )
            leases.append(
                Lease(
                    queue=self.ident,
                    message_id=message.id,
                    payload=message.payload,
                    attempt=message.attempts + 1,
                    max_attempts=message.max_attempts,
                    token=token,
                    deadline=deadline,
                )
            )
        if ops:
            self.commit_ops(fd, ops)
        return leases

    def dead_op(self, message: Message, reason: str) -> dict[str, Any]:
        op = {"op": "set", "id": message.id, "dead": reason, "dead_order": self.next_order}
        self.next_order += 1
        return op


class LocalQueue(Queue):
    """``finish_outbox`` finishes outbox appends that crashed processes left (see _outbox); a
    claim calls it first, so such messages reach their queue at the latest then."""

    def __init__(self, space: Space, finish_outbox: Callable[[], list[str]]) -> None:
        self._space = space
        self._finish_outbox = finish_outbox

    async def _write(
        self, queue: str, work: Callable[[QueueFile, int], R], *, create: bool = True
    ) -> R | None:
        """Run ``work`` under the queue's lock; None without running it when the queue file is
        missing and not ``create`` (``create`` makes the namespace's folders first if needed)."""
        file = self._space.file(QueueFile, queue)

        def locked(fd: int | None) -> R | None:
            return None if fd is None else work(file, fd)

        result = await self._space.run(lambda: file.writing(locked, create=create), creates=create)
        self._space.changed(QueueFile.kind, queue)
        return result

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
        # The message is made under the lock, so enqueue order and visible time agree.
        ids = await self._write(
            queue,
            lambda file, fd: file.add(fd, [new_message(payload, delay, dedup_key, max_attempts)]),
        )
        assert ids is not None
        return ids[0]

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
        file = self._space.file(QueueFile, queue)
        give_up = anyio.current_time() + wait
        leases = await self._attempt(file, lease, limit)
        if leases or wait <= 0:
            return leases
        # One waiting claim per queue and process polls the file; the others wait their turn
        # (in order) and return [] if it does not come before their deadline: N idle workers
        # in a process cost one poll, not N (and then N claim attempts at every enqueue).
        poller = self._space.poller(QueueFile.kind, queue)
        polling = False
        with anyio.move_on_after(give_up - anyio.current_time()):
            await poller.acquire()
            polling = True
        if not polling:
            return []
        try:
            return await self._poll(file, queue, lease, limit, give_up)
        finally:
            self._space.poller_done(QueueFile.kind, queue, poller)

    async def _poll(
        self, file: QueueFile, queue: str, lease: float, limit: int, give_up: float
    ) -> list[Lease]:
        """Look now, then again when this process changes the queue or after a pause (POLL_MIN
        doubling to POLL_MAX), until leases come or ``give_up``."""
        delay = POLL_MIN
        while True:
            with self._space.wake_up(QueueFile.kind, queue) as changed:
                leases = await self._attempt(file, lease, limit)
                if leases:
                    return leases
                left = give_up - anyio.current_time()
                if left <= 0:
                    return []
                await pause(changed, min(delay, left))
            delay = min(delay * 2, POLL_MAX)

    async def _attempt(self, file: QueueFile, lease: float, limit: int) -> list[Lease]:
        """One look, in one trip to a worker thread: finish crashed outbox appends, then claim
        if anything is visible. The look takes no lock, so idle polling never contends with
        writers; only a claim that may get something takes it."""

        def work() -> tuple[list[str], list[Lease]]:
            queues = self._finish_outbox()
            if not file.reading(lambda _: bool(file.visible(time.time()))):
                return queues, []
            leases = file.writing(
                lambda fd: [] if fd is None else file.claim(fd, lease, limit), create=False
            )
            return queues, leases

        queues, leases = await self._space.run(work)
        for name in queues:
            self._space.changed(QueueFile.kind, name)
        if leases:
            self._space.changed(QueueFile.kind, file.ident)
        return leases

    async def renew(self, lease: Lease, duration: float) -> Lease:
        validate_renew(lease, duration)

        def work(file: QueueFile, fd: int) -> Lease:
            message = file.live(lease)
            deadline = time.time() + duration
            file.commit_ops(fd, [{"op": "set", "id": message.id, "deadline": deadline}])
            return lease.model_copy(update={"deadline": deadline})

        renewed = await self._write(lease.queue, work, create=False)
        if renewed is None:
            raise _lost(lease)
        return renewed

    async def ack(self, lease: Lease) -> None:
        validate_lease(lease)

        def work(file: QueueFile, fd: int) -> bool:
            message = file.live(lease)
            file.commit_ops(fd, [{"op": "del", "id": message.id}])
            return True

        if not await self._write(lease.queue, work, create=False):
            raise _lost(lease)

    async def release(self, lease: Lease, *, delay: float = 0.0) -> None:
        validate_release(lease, delay)

        def work(file: QueueFile, fd: int) -> bool:
            message = file.live(lease)
            if message.attempts >= message.max_attempts:
                reason = f"released after its last delivery ({message.attempts})"
                op = file.dead_op(message, reason)
            else:
                op = {
                    "op": "set",
                    "id": message.id,
                    "token": None,
                    "visible_at": time.time() + delay,
                }
            file.commit_ops(fd, [op])
            return True

        if not await self._write(lease.queue, work, create=False):
            raise _lost(lease)

    async def dead_letters(self, queue: str, *, limit: int = 100) -> list[DeadLetter]:
        validate_dead_letters(queue, limit=limit)
        file = self._space.file(QueueFile, queue)

        def work(_: int | None) -> list[DeadLetter]:
            dead = sorted(
                (m for m in file.messages.values() if m.dead is not None),
                key=lambda m: m.dead_order,
            )
            return [
                DeadLetter(
                    queue=queue,
                    message_id=m.id,
                    payload=m.payload,
                    attempts=m.attempts,
                    reason=m.dead or "",
                )
                for m in dead[:limit]
            ]

        return await self._space.run(lambda: file.reading(work))

    async def requeue(self, queue: str, message_id: str) -> None:
        validate_id(queue, "queue")
        validate_id(message_id, "message_id")

        def work(file: QueueFile, fd: int) -> bool:
            message = file.messages.get(message_id)
            if message is None or message.dead is None:
                return False
            op = {
                "op": "set",
                "id": message_id,
                "dead": None,
                "attempts": 0,
                "token": None,
                "visible_at": time.time(),
            }
            file.commit_ops(fd, [op])
            return True

        if not await self._write(queue, work, create=False):
            raise NotFoundError(
                f"queue {queue!r} has no dead letter {message_id!r}; list them with dead_letters"
            )


def _lost(lease: Lease) -> LeaseLostError:
    return LeaseLostError(
        f"the lease on message {lease.message_id!r} of queue {lease.queue!r} is no longer "
        "current (claimed again, acked or dead-lettered); stop working on it"
    )
