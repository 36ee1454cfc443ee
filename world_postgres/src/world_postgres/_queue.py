"""Queue: message rows claimed with FOR UPDATE SKIP LOCKED, fenced by a per-claim token."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

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
from world_postgres._db import Conn, Database, tag
from world_postgres._merge import Merged
from world_postgres._notify import Listener
from world_postgres._wait import Waiter

__all__ = ["PostgresQueue"]

# While visible messages exist but other claimers hold them all, look again this often.
_BUSY_RETRY_SECONDS = 0.02


_Enqueue = tuple[str, str, bytes, float, int, str | None]
"""An enqueue's message id, queue, payload, delay, max_attempts and dedup key."""


def _token(lease: Lease) -> uuid.UUID | None:
    try:
        return uuid.UUID(lease.token)
    except ValueError:
        return None  # not a token this backend issued: never current


class PostgresQueue(Queue):
    def __init__(self, db: Database, listener: Listener) -> None:
        self._db = db
        self._listener = listener
        sql = db.sql
        # Enqueues made at once (many producing tasks) are one statement: see _merge.py.
        self._enqueue = sql("SELECT @s@.enqueue($1, $2, $3, $4, $5, $6, $7)")
        self._enqueue_many = sql("SELECT @s@.enqueue_batch($1, $2, $3, $4, $5, $6, $7)")
        self._enqueues: Merged[_Enqueue, str | None] = Merged(
            db, "enqueue", self._enqueue_one, self._enqueue_batch, weight=lambda item: len(item[2])
        )
        # Exhausted messages among the picked ones are dead-lettered and come back flagged, so
        # the caller claims again for the rest instead of this scanning the whole queue. When
        # it picks nothing, one row says in how many seconds the soonest message is visible
        # (a waiting claim's timer; saves a second round trip on every empty look).
        #
        # The LIMIT is written into the text (one statement per count, see _claim_sql): as a
        # parameter, a generic plan must guess it (a tenth of the queue's rows), so once the
        # table has statistics PostgreSQL finds every generic plan dearer than a custom one and
        # plans the statement again at each claim (measured 0.25 ms a claim of 10, about a
        # seventh of a claim and its acks, at 2,000 queued messages, analyzed). The UPDATE
        # finds its rows by their ids as an array as well as by the join: with statistics
        # taken while the queue was empty, the planner drove the join by a scan of the whole
        # primary key (8 ms instead of 0.4 for a claim of 10 among 3,000 messages).
        self._claim_template = sql(
            """
            WITH pick AS (
                SELECT m.id, m.visible_at AS v, m.seq AS s,
                       m.attempts >= m.max_attempts AS exhausted
                FROM @s@.messages m
                WHERE m.queue = $1 AND m.dead_at IS NULL AND m.visible_at <= now()
                ORDER BY m.visible_at, m.seq
                LIMIT @limit@
                FOR UPDATE SKIP LOCKED
            ), done AS (
                UPDATE @s@.messages m
                SET attempts = CASE WHEN p.exhausted THEN m.attempts ELSE m.attempts + 1 END,
                    token = CASE WHEN p.exhausted THEN NULL ELSE gen_random_uuid() END,
                    last_token = m.token,
                    visible_at = CASE WHEN p.exhausted THEN m.visible_at
                                      ELSE now() + $3::float8 * interval '1 second' END,
                    worker = CASE WHEN p.exhausted THEN m.worker ELSE $2 END,
                    dead_at = CASE WHEN p.exhausted THEN clock_timestamp() END,
                    reason = CASE WHEN p.exhausted THEN
                        'delivered ' || m.attempts || ' times (max_attempts '
                        || m.max_attempts || ') and the last lease expired' END
                FROM pick p
                WHERE m.id = ANY (ARRAY(SELECT id FROM pick)) AND m.id = p.id
                RETURNING m.id, m.payload, m.attempts, m.max_attempts, m.token,
                          extract(epoch FROM m.visible_at)::float8 AS deadline,
                          p.exhausted, p.v, p.s
            )
            SELECT id, payload, attempts, max_attempts, token, deadline, exhausted,
                   NULL::float8 AS soonest, v, s
            FROM done
            UNION ALL
            SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, soonest, NULL, NULL
            FROM (SELECT extract(epoch FROM min(visible_at) - now())::float8 AS soonest
                  FROM @s@.messages WHERE queue = $1 AND dead_at IS NULL) AS next
            WHERE NOT EXISTS (SELECT 1 FROM done)
            ORDER BY v, s
            """
        )
        self._claims: dict[int, str] = {}
        self._renew = sql(
            "UPDATE @s@.messages SET visible_at = now() + $4::float8 * interval '1 second'"
            " WHERE id = $1 AND queue = $2 AND token = $3"
            " RETURNING extract(epoch FROM visible_at)::float8"
        )
        self._ack = sql("DELETE FROM @s@.messages WHERE id = $1 AND queue = $2 AND token = $3")
        self._exists = sql("SELECT 1 FROM @s@.messages WHERE id = $1 AND queue = $2")
        # Acks made at once (a worker finishing a claimed batch) are one statement: see
        # _merge.py. The id array leads the plan to the primary key, whatever the batch size.
        self._ack_many = sql(
            """
            DELETE FROM @s@.messages m
            WHERE m.id = ANY ($1::text[]) AND (m.id, m.queue, m.token) IN (
                SELECT * FROM unnest($1::text[], $2::text[], $3::uuid[]))
            RETURNING m.id, m.token::text
            """
        )
        self._existing = sql(
            """
            SELECT u.id FROM unnest($1::text[], $2::text[]) AS u (id, queue)
            WHERE EXISTS (SELECT 1 FROM @s@.messages m WHERE m.id = u.id AND m.queue = u.queue)
            """
        )
        self._acks: Merged[tuple[str, str, str], bool] = Merged(
            db, "ack", self._ack_one, self._ack_batch, absent=lambda: False
        )
        # The last token is kept so that a retried release can tell it already happened.
        self._release = sql(
            """
            WITH r AS (
                UPDATE @s@.messages
                SET token = NULL, last_token = token,
                    visible_at = CASE WHEN attempts >= max_attempts THEN visible_at
                                      ELSE now() + $4::float8 * interval '1 second' END,
                    dead_at = CASE WHEN attempts >= max_attempts THEN clock_timestamp() END,
                    reason = CASE WHEN attempts >= max_attempts THEN
                        'delivered ' || attempts || ' times (max_attempts ' || max_attempts
                        || ') and the last delivery was released' END
                WHERE id = $1 AND queue = $2 AND token = $3
                RETURNING dead_at IS NULL AND $4::float8 = 0 AS wake
            )
            SELECT wake, (SELECT @s@.wake($5) FROM r WHERE wake) FROM r
            """
        )
        self._released = sql(
            "SELECT 1 FROM @s@.messages WHERE id = $1 AND queue = $2 AND token IS NULL"
            " AND last_token = $3"
        )
        self._dead = sql(
            "SELECT id, payload, attempts, reason FROM @s@.messages"
            " WHERE queue = $1 AND dead_at IS NOT NULL ORDER BY dead_at, seq LIMIT $2"
        )
        # A live message holding the same dedup key keeps it; the requeued one then has none.
        self._requeue = sql(
            """
            WITH r AS (
                UPDATE @s@.messages m
                SET dead_at = NULL, reason = NULL, attempts = 0, visible_at = now(),
                    token = NULL, last_token = NULL, worker = NULL,
                    dedup_key = CASE WHEN EXISTS (
                        SELECT 1 FROM @s@.messages o WHERE o.queue = m.queue
                        AND o.dedup_key = m.dedup_key AND o.dead_at IS NULL) THEN NULL
                        ELSE m.dedup_key END
                WHERE m.id = $2 AND m.queue = $1 AND m.dead_at IS NOT NULL
                RETURNING 1
            )
            SELECT count(*), (SELECT @s@.wake($3) FROM r LIMIT 1) FROM r
            """
        )
        self._live = sql(
            "SELECT 1 FROM @s@.messages WHERE id = $2 AND queue = $1 AND dead_at IS NULL"
        )

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
        # The id is chosen here, so a retried enqueue adds nothing twice.
        item = (uuid.uuid4().hex, queue, payload, float(delay), max_attempts, dedup_key)
        while True:
            # None: the live message holding the dedup key was acked in between; add ours.
            found = await self._enqueues.call(item)
            if found is not None:
                return found

    async def _enqueue_one(self, conn: Conn, retried: bool, item: _Enqueue) -> str | None:
        found: str | None = await conn.fetchval(self._enqueue, *item, tag("q", item[1]))
        return found

    async def _enqueue_batch(
        self, conn: Conn, retried: bool, items: Sequence[_Enqueue]
    ) -> list[str | None]:
        found: list[str | None] = await conn.fetchval(
            self._enqueue_many,
            [item[0] for item in items],
            [item[1] for item in items],
            [item[2] for item in items],
            [item[3] for item in items],
            [item[4] for item in items],
            [item[5] for item in items],
            [tag("q", item[1]) for item in items],
        )
        return found

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
        if wait <= 0:
            return (await self._claim_now(queue, worker, lease, limit))[0]
        deadline = time.monotonic() + wait
        wake_tag = tag("q", queue)
        # One claimer of this process is woken per notification (see Listener): it sleeps
        # only after a look that found nothing, so each message has a look after it.
        with self._listener.subscribe(wake_tag, one=True) as sub:
            waiter = Waiter(self._listener, wake_tag, sub)
            await waiter.start()
            while True:
                waiter.arm()
                leases, soonest = await self._claim_now(queue, worker, lease, limit)
                left = deadline - time.monotonic()
                if leases or left <= 0:
                    return leases
                if soonest is not None:
                    left = min(left, max(soonest, _BUSY_RETRY_SECONDS))
                await waiter.sleep(left)

    async def _claim_now(
        self, queue: str, worker: str, lease: float, limit: int
    ) -> tuple[list[Lease], float | None]:
        """The leases claimed, and when nothing was left to claim, in how many seconds the
        soonest message (None: no message) is visible: at most 0 when all visible ones were
        locked by other claimers."""
        leases: list[Lease] = []
        while True:
            want = limit - len(leases)

            # A retried claim may have leased messages whose reply was lost: their leases run
            # out and they are delivered again (at least once).
            async def op(
                conn: Conn, retried: bool, want: int = want
            ) -> tuple[list[Lease], int, float | None]:
                rows = await conn.fetch(self._claim_sql(want), queue, worker, float(lease))
                # The server's rows are trusted: no validation pass per lease.
                got = [
                    Lease.model_construct(
                        queue=queue,
                        message_id=r[0],
                        payload=bytes(r[1]),
                        attempt=int(r[2]),
                        max_attempts=int(r[3]),
                        token=str(r[4]),
                        deadline=float(r[5]),
                    )
                    for r in rows
                    if r[0] is not None and not r[6]
                ]
                picked = [r for r in rows if r[0] is not None]
                soonest = next((r[7] for r in rows if r[0] is None), None)
                return got, len(picked) - len(got), None if soonest is None else float(soonest)

            got, dead, soonest = await self._db.run("claim", op, absent=lambda: ([], 0, None))
            leases.extend(got)
            if not dead or len(leases) >= limit:
                return leases, soonest

    async def aclose(self) -> None:
        """Wait for merged enqueues and acks in flight (after the pool closed)."""
        await self._enqueues.aclose()
        await self._acks.aclose()

    def _claim_sql(self, count: int) -> str:
        """The claim statement for ``count`` messages (at most MAX_LIST_LIMIT, validated: an
        int is the one value other than the namespace's that is written into SQL)."""
        text = self._claims.get(count)
        if text is None:
            text = self._claims[count] = self._claim_template.replace("@limit@", str(int(count)))
        return text

    async def renew(self, lease: Lease, duration: float) -> Lease:
        validate_renew(lease, duration)
        token = _token(lease)

        async def op(conn: Conn, retried: bool) -> float | None:
            if token is None:
                return None
            value = await conn.fetchval(
                self._renew, lease.message_id, lease.queue, token, float(duration)
            )
            return None if value is None else float(value)

        deadline = await self._db.run("renew", op, absent=lambda: None, stores=True)
        if deadline is None:
            raise self._lost(lease, "renew")
        return lease.model_copy(update={"deadline": deadline})

    async def ack(self, lease: Lease) -> None:
        validate_lease(lease)
        token = _token(lease)
        if token is None:
            self._db.check_open("ack")
            raise self._lost(lease, "ack")
        if not await self._acks.call((lease.message_id, lease.queue, str(token))):
            raise self._lost(lease, "ack")

    async def _ack_one(self, conn: Conn, retried: bool, item: tuple[str, str, str]) -> bool:
        message_id, queue, token = item
        status = await conn.execute(self._ack, message_id, queue, token)
        if status != "DELETE 0":
            return True
        # A retry whose first try committed finds the message gone.
        return retried and await conn.fetchval(self._exists, message_id, queue) is None

    async def _ack_batch(
        self, conn: Conn, retried: bool, items: Sequence[tuple[str, str, str]]
    ) -> list[bool]:
        """Whether each (message id, queue, token) was acked; of two acks of one lease in a
        batch, the first is."""
        ids = [item[0] for item in items]
        queues = [item[1] for item in items]
        rows = await conn.fetch(self._ack_many, ids, queues, [item[2] for item in items])
        deleted = {(row[0], row[1]) for row in rows}
        acked: list[bool] = []
        for message_id, _, token in items:
            acked.append((message_id, token) in deleted)
            deleted.discard((message_id, token))
        if retried and not all(acked):
            # A retry whose first try committed finds the message gone.
            left = [i for i, ok in enumerate(acked) if not ok]
            rows = await conn.fetch(
                self._existing, [ids[i] for i in left], [queues[i] for i in left]
            )
            existing = {row[0] for row in rows}
            for i in left:
                acked[i] = ids[i] not in existing
        return acked

    async def release(self, lease: Lease, *, delay: float = 0.0) -> None:
        delay = validate_release(lease, delay)
        token = _token(lease)
        queue_tag = tag("q", lease.queue)

        async def op(conn: Conn, retried: bool) -> bool:
            if token is None:
                return False
            row = await conn.fetchrow(
                self._release, lease.message_id, lease.queue, token, delay, queue_tag
            )
            if row is not None:
                return True
            return retried and (
                await conn.fetchval(self._released, lease.message_id, lease.queue, token)
                is not None
            )

        if not await self._db.run("release", op, absent=lambda: False, stores=True):
            raise self._lost(lease, "release")

    @staticmethod
    def _lost(lease: Lease, what: str) -> LeaseLostError:
        return LeaseLostError(
            f"{what}: the lease on message {lease.message_id!r} of queue {lease.queue!r} is no "
            "longer current (claimed again, acked, released or dead-lettered); stop working on it"
        )

    async def dead_letters(self, queue: str, *, limit: int = 100) -> list[DeadLetter]:
        validate_dead_letters(queue, limit=limit)

        async def op(conn: Conn, retried: bool) -> list[DeadLetter]:
            rows = await conn.fetch(self._dead, queue, limit)
            return [
                DeadLetter(
                    queue=queue,
                    message_id=r[0],
                    payload=bytes(r[1]),
                    attempts=int(r[2]),
                    reason=r[3] or "",
                )
                for r in rows
            ]

        return await self._db.run("dead_letters", op, absent=list)

    async def requeue(self, queue: str, message_id: str) -> None:
        validate_id(queue, "queue")
        validate_id(message_id, "message_id")
        queue_tag = tag("q", queue)

        async def op(conn: Conn, retried: bool) -> bool:
            count = await conn.fetchval(self._requeue, queue, message_id, queue_tag)
            if count:
                return True
            return retried and await conn.fetchval(self._live, queue, message_id) is not None

        if not await self._db.run("requeue", op, absent=lambda: False, stores=True):
            raise NotFoundError(
                f"no dead letter {message_id!r} in queue {queue!r}; list them with dead_letters()"
            )
