"""MongoQueue: one document per message, every state change one conditional update.

Fields: ``_id`` message id (an ObjectId's hex, so ids from one process sort in enqueue
order), ``q`` queue, ``p`` payload, ``st`` "live" or "dead", ``att`` deliveries so far,
``max`` max_attempts, ``vis`` server time from which it may be claimed (for a leased message
the lease deadline), ``tok`` the current fencing token while leased, ``dk`` the dedup key
while live, ``dead_at`` and ``why`` once dead.

Every time comes from the server (``$$NOW`` inside update pipelines), so worker clocks never
matter. User values inside pipelines are wrapped in ``$literal``: a queue named "$x" is data,
never a field path.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import TYPE_CHECKING
from uuid import uuid4

from bson import ObjectId
from pymongo import IndexModel, ReturnDocument
from pymongo.errors import DuplicateKeyError

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
from world_mongo._errors import translate
from world_mongo._segments import Doc

if TYPE_CHECKING:
    from pymongo.asynchronous.collection import AsyncCollection

    from world_mongo._world import MongoWorld

__all__ = ["MongoQueue", "queue_indexes"]

_LIVE = "live"
_DEAD = "dead"
_REASON = "max_attempts reached"


def queue_indexes() -> list[IndexModel]:
    return [
        IndexModel([("q", 1), ("st", 1), ("vis", 1), ("_id", 1)], name="claim_order"),
        IndexModel([("q", 1), ("st", 1), ("dead_at", 1), ("_id", 1)], name="dead_order"),
        # Dedup keys are unique among live messages only: the field is removed when a
        # message dies or is acked (deleted), so the key is free again.
        IndexModel(
            [("q", 1), ("dk", 1)],
            unique=True,
            name="live_dedup",
            partialFilterExpression={"dk": {"$type": "string"}},
        ),
    ]


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def _now_plus(seconds: float) -> Doc:
    return {"$add": ["$$NOW", _ms(seconds)]}


def _lit(value: object) -> Doc:
    return {"$literal": value}


def _to_unix(value: datetime) -> float:
    return value.timestamp()


def _give_back(visible_in: float, reason: str) -> list[Doc]:
    """Pipeline: back to ready after ``visible_in`` s, or dead when attempts are used up."""
    return [
        {"$set": {"_dead": {"$gte": ["$att", "$max"]}}},
        {
            "$set": {
                "st": {"$cond": ["$_dead", _DEAD, _LIVE]},
                "vis": {"$cond": ["$_dead", "$vis", _now_plus(visible_in)]},
                "dead_at": {"$cond": ["$_dead", "$$NOW", "$$REMOVE"]},
                "why": {"$cond": ["$_dead", _lit(reason), "$$REMOVE"]},
                "dk": {"$cond": ["$_dead", "$$REMOVE", "$dk"]},
                "tok": "$$REMOVE",
            }
        },
        {"$unset": "_dead"},
    ]


class MongoQueue(Queue):
    def __init__(self, world: MongoWorld, coll: AsyncCollection[Doc]) -> None:
        self._world = world
        self._coll = coll

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
        world = self._world
        world.check_open()
        await world.make_storage()
        fields: Doc = {
            "q": _lit(queue),
            "p": _lit(payload),
            "st": _LIVE,
            "att": 0,
            "max": max_attempts,
            "vis": _now_plus(float(delay)),
        }
        if dedup_key is not None:
            fields["dk"] = _lit(dedup_key)
        with translate("enqueue a message"):
            while True:
                message_id = str(ObjectId())
                try:
                    # An upsert on a fresh id is an insert whose times come from $$NOW.
                    await self._coll.update_one(
                        {"_id": message_id}, [{"$set": fields}], upsert=True
                    )
                except DuplicateKeyError:
                    if dedup_key is None:
                        raise
                    live = await self._coll.find_one({"q": queue, "dk": dedup_key}, {"_id": 1})
                    if live is not None:
                        return str(live["_id"])
                    continue  # acked or dead since the insert failed: the key is free
                world.notifier.notify("queue", queue)
                return message_id

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
        world = self._world
        world.check_open()
        leases = await self._claim_now(queue, worker, lease, limit)
        if leases or wait <= 0:
            return leases
        deadline = time.monotonic() + float(wait)
        backoff = world.new_backoff()
        with world.notifier.subscribe("queue", queue) as sub:
            while True:
                leases = await self._claim_now(queue, worker, lease, limit)
                remaining = deadline - time.monotonic()
                if leases or remaining <= 0:
                    return leases
                await sub.wait(min(backoff.next(), remaining))
                world.check_open()

    async def _claim_now(self, queue: str, worker: str, lease: float, limit: int) -> list[Lease]:
        leases: list[Lease] = []
        with translate("claim messages"):
            while len(leases) < limit:
                token = uuid4().hex
                doc = await self._coll.find_one_and_update(
                    {"q": queue, "st": _LIVE, "$expr": {"$lte": ["$vis", "$$NOW"]}},
                    [
                        {"$set": {"_dead": {"$gte": ["$att", "$max"]}}},
                        {
                            "$set": {
                                "st": {"$cond": ["$_dead", _DEAD, _LIVE]},
                                "att": {"$cond": ["$_dead", "$att", {"$add": ["$att", 1]}]},
                                "vis": {"$cond": ["$_dead", "$vis", _now_plus(lease)]},
                                "tok": {"$cond": ["$_dead", "$$REMOVE", _lit(token)]},
                                "wk": {"$cond": ["$_dead", "$$REMOVE", _lit(worker)]},
                                "dead_at": {"$cond": ["$_dead", "$$NOW", "$$REMOVE"]},
                                "why": {"$cond": ["$_dead", _lit(_REASON), "$$REMOVE"]},
                                "dk": {"$cond": ["$_dead", "$$REMOVE", "$dk"]},
                            }
                        },
                        {"$unset": "_dead"},
                    ],
                    sort=[("vis", 1), ("_id", 1)],
                    return_document=ReturnDocument.AFTER,
                )
                if doc is None:
                    break
                if doc["st"] == _DEAD:
                    continue
                leases.append(self._lease(doc))
        return leases

    @staticmethod
    def _lease(doc: Doc) -> Lease:
        return Lease(
            queue=doc["q"],
            message_id=doc["_id"],
            payload=doc["p"],
            attempt=doc["att"],
            max_attempts=doc["max"],
            token=doc["tok"],
            deadline=_to_unix(doc["vis"]),
        )

    def _held(self, lease: Lease) -> Doc:
        self._world.check_open()
        return {"_id": lease.message_id, "q": lease.queue, "tok": lease.token, "st": _LIVE}

    @staticmethod
    def _lost(lease: Lease, what: str) -> LeaseLostError:
        return LeaseLostError(
            f"cannot {what} message {lease.message_id!r} of queue {lease.queue!r}: its lease "
            "is no longer current (claimed again, acked or dead-lettered); stop working on it"
        )

    async def renew(self, lease: Lease, duration: float) -> Lease:
        validate_renew(lease, duration)
        query = self._held(lease)
        with translate("renew a lease"):
            doc = await self._coll.find_one_and_update(
                query,
                [{"$set": {"vis": _now_plus(duration)}}],
                projection={"vis": 1},
                return_document=ReturnDocument.AFTER,
            )
        if doc is None:
            raise self._lost(lease, "renew")
        return lease.model_copy(update={"deadline": _to_unix(doc["vis"])})

    async def ack(self, lease: Lease) -> None:
        validate_lease(lease)
        query = self._held(lease)
        with translate("ack a message"):
            result = await self._coll.delete_one(query)
        if result.deleted_count != 1:
            raise self._lost(lease, "ack")

    async def release(self, lease: Lease, *, delay: float = 0.0) -> None:
        validate_release(lease, delay)
        query = self._held(lease)
        with translate("release a message"):
            doc = await self._coll.find_one_and_update(
                query,
                _give_back(float(delay), _REASON),
                projection={"st": 1},
                return_document=ReturnDocument.AFTER,
            )
        if doc is None:
            raise self._lost(lease, "release")
        self._world.notifier.notify("queue", lease.queue)

    async def dead_letters(self, queue: str, *, limit: int = 100) -> list[DeadLetter]:
        validate_dead_letters(queue, limit=limit)
        self._world.check_open()
        with translate("list dead letters"):
            docs = await self._coll.find(
                {"q": queue, "st": _DEAD},
                {"p": 1, "att": 1, "why": 1},
                sort=[("dead_at", 1), ("_id", 1)],
                limit=limit,
            ).to_list()
        return [
            DeadLetter(
                queue=queue,
                message_id=d["_id"],
                payload=d["p"],
                attempts=d["att"],
                reason=d.get("why", _REASON),
            )
            for d in docs
        ]

    async def requeue(self, queue: str, message_id: str) -> None:
        validate_id(queue, "queue")
        validate_id(message_id, "message_id")
        self._world.check_open()
        with translate("requeue a dead letter"):
            doc = await self._coll.find_one_and_update(
                {"_id": message_id, "q": queue, "st": _DEAD},
                [
                    {"$set": {"st": _LIVE, "att": 0, "vis": "$$NOW"}},
                    {"$unset": ["dead_at", "why"]},
                ],
                projection={"_id": 1},
            )
        if doc is None:
            raise NotFoundError(
                f"queue {queue!r} has no dead letter {message_id!r}: list them with dead_letters()"
            )
        self._world.notifier.notify("queue", queue)
