"""Queue on libSQL: one row per live message, dead letters in their own table.

Times (visibility, deadlines) are the database's ``unixepoch('subsec')``, read once per
transaction, so workers on machines with skewed clocks agree.
"""

from __future__ import annotations

import time
import uuid
from typing import NoReturn

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
from world_turso._db import (
    Conn,
    Row,
    Tx,
    as_bytes,
    as_float,
    as_int,
    as_opt_str,
    as_str,
)
from world_turso._schema import Store, Tables

__all__ = ["TursoQueue", "enqueue_in"]

_WAIT_MIN, _WAIT_MAX = 0.005, 0.2


def enqueue_in(
    conn: Conn,
    t: Tables,
    now: float,
    queue: str,
    payload: bytes,
    *,
    delay: float,
    dedup_key: str | None,
    max_attempts: int,
) -> str:
    """Add a message inside the caller's write transaction; the id of a live duplicate wins."""
    if dedup_key is not None:
        row = conn.one(
            f"SELECT id FROM {t.messages} WHERE queue = ? AND dedup_key = ?", [queue, dedup_key]
        )
        if row is not None:
            return as_str(row[0])
    message_id = uuid.uuid4().hex
    conn.exec(
        f"INSERT INTO {t.messages} (queue, id, payload, visible_at, attempts, max_attempts,"
        " token, dedup_key) VALUES (?, ?, ?, ?, 0, ?, NULL, ?)",
        [queue, message_id, payload, now + delay, max_attempts, dedup_key],
    )
    return message_id


def _bury(conn: Conn, t: Tables, n: int, reason: str) -> None:
    """Move message row ``n`` to the dead letters."""
    conn.exec(
        f"INSERT INTO {t.dead} (queue, id, payload, attempts, max_attempts, dedup_key, reason)"
        f" SELECT queue, id, payload, attempts, max_attempts, dedup_key, ? FROM {t.messages}"
        " WHERE n = ?",
        [reason, n],
    )
    conn.exec(f"DELETE FROM {t.messages} WHERE n = ?", [n])


def _raise(error: Exception) -> NoReturn:
    raise error


def _lost(lease: Lease) -> LeaseLostError:
    return LeaseLostError(
        f"the lease on message {lease.message_id!r} of queue {lease.queue!r} is no longer "
        "current (claimed again, acked or dead-lettered); stop working on it"
    )


class TursoQueue(Queue):
    """``Queue`` on the namespace's ``messages`` and ``dead`` tables; contract in
    ``world_core.spi``.

    Quirks: a claim first checks, without the write lock, whether anything is due; ``requeue``
    gives a dead letter its dedup key back only if no live message holds that key.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._db = store.db
        self._t = store.tables

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
        seconds = float(delay)
        t = self._t
        return await self._store.write(
            lambda conn: enqueue_in(
                conn,
                t,
                conn.now(),
                queue,
                payload,
                delay=seconds,
                dedup_key=dedup_key,
                max_attempts=max_attempts,
            )
        )

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
        db = self._db
        deadline = time.monotonic() + float(wait)
        delay = _WAIT_MIN
        while True:
            since = db.snapshot()
            due = await self._store.use(
                lambda conn: self._due_in(conn, queue), lambda: None, tx=Tx.NONE
            )
            if due is not None and due <= 0:
                leases: list[Lease] = await self._store.use(
                    lambda conn: self._claim(conn, queue, float(lease), limit),
                    list,
                    tx=Tx.WRITE,
                    notify=False,
                )
                if leases:
                    return leases
                continue  # what was due got dead-lettered; look again
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            # A delayed message or an expired lease becomes visible without any commit.
            nap = min(delay, left) if due is None else min(delay, left, due)
            changed = await db.wait(since, nap)
            delay = _WAIT_MIN if changed else min(delay * 2, _WAIT_MAX)

    def _due_in(self, conn: Conn, queue: str) -> float | None:
        """Seconds until the queue's next message is visible (<= 0: now); None when empty."""
        row = conn.one(
            f"SELECT min(visible_at) - unixepoch('subsec') FROM {self._t.messages} WHERE queue = ?",
            [queue],
        )
        return None if row is None or row[0] is None else as_float(row[0])

    def _claim(self, conn: Conn, queue: str, lease: float, limit: int) -> list[Lease]:
        t = self._t
        now = conn.now()
        leases: list[Lease] = []
        while len(leases) < limit:
            rows = conn.rows(
                f"SELECT n, id, payload, attempts, max_attempts, token FROM {t.messages}"
                " WHERE queue = ? AND visible_at <= ? ORDER BY visible_at, n LIMIT ?",
                [queue, now, limit - len(leases)],
            )
            if not rows:
                break
            for row in rows:
                n, attempts, max_attempts = as_int(row[0]), as_int(row[3]), as_int(row[4])
                if attempts >= max_attempts:
                    how = "its last lease expired" if row[5] is not None else "it was released"
                    _bury(
                        conn,
                        t,
                        n,
                        f"delivered {attempts} times (max_attempts {max_attempts}) and {how}",
                    )
                    continue
                token = uuid.uuid4().hex
                conn.exec(
                    f"UPDATE {t.messages} SET attempts = attempts + 1, token = ?,"
                    " visible_at = ? WHERE n = ?",
                    [token, now + lease, n],
                )
                leases.append(
                    Lease(
                        queue=queue,
                        message_id=as_str(row[1]),
                        payload=as_bytes(row[2]),
                        attempt=attempts + 1,
                        max_attempts=max_attempts,
                        token=token,
                        deadline=now + lease,
                    )
                )
        return leases

    async def renew(self, lease: Lease, duration: float) -> Lease:
        seconds = validate_renew(lease, duration)
        t = self._t

        def run(conn: Conn) -> float:
            deadline = conn.now() + seconds
            rows = conn.rows(
                f"UPDATE {t.messages} SET visible_at = ? WHERE queue = ? AND id = ? AND token = ?"
                " RETURNING n",
                [deadline, lease.queue, lease.message_id, lease.token],
            )
            if not rows:
                raise _lost(lease)
            return deadline

        deadline = await self._store.use(
            run, lambda: _raise(_lost(lease)), tx=Tx.WRITE, notify=False
        )
        return lease.model_copy(update={"deadline": deadline})

    async def ack(self, lease: Lease) -> None:
        validate_lease(lease)
        t = self._t

        def run(conn: Conn) -> None:
            rows = conn.rows(
                f"DELETE FROM {t.messages} WHERE queue = ? AND id = ? AND token = ? RETURNING n",
                [lease.queue, lease.message_id, lease.token],
            )
            if not rows:
                raise _lost(lease)

        await self._store.use(run, lambda: _raise(_lost(lease)), tx=Tx.WRITE, notify=False)

    async def release(self, lease: Lease, *, delay: float = 0.0) -> None:
        seconds = validate_release(lease, delay)
        t = self._t

        def run(conn: Conn) -> None:
            row = conn.one(
                f"SELECT n, attempts, max_attempts FROM {t.messages}"
                " WHERE queue = ? AND id = ? AND token = ?",
                [lease.queue, lease.message_id, lease.token],
            )
            if row is None:
                raise _lost(lease)
            n, attempts, max_attempts = as_int(row[0]), as_int(row[1]), as_int(row[2])
            if attempts >= max_attempts:
                _bury(
                    conn,
                    t,
                    n,
                    f"released after {attempts} deliveries (max_attempts {max_attempts})",
                )
                return
            conn.exec(
                f"UPDATE {t.messages} SET token = NULL, visible_at = ? WHERE n = ?",
                [conn.now() + seconds, n],
            )

        await self._store.use(run, lambda: _raise(_lost(lease)), tx=Tx.WRITE)

    async def dead_letters(self, queue: str, *, limit: int = 100) -> list[DeadLetter]:
        validate_dead_letters(queue, limit=limit)
        rows: list[Row] = await self._store.use(
            lambda conn: conn.rows(
                f"SELECT id, payload, attempts, reason FROM {self._t.dead} WHERE queue = ?"
                " ORDER BY n LIMIT ?",
                [queue, limit],
            ),
            list,
            tx=Tx.NONE,
        )
        return [
            DeadLetter(
                queue=queue,
                message_id=as_str(row[0]),
                payload=as_bytes(row[1]),
                attempts=as_int(row[2]),
                reason=as_str(row[3]),
            )
            for row in rows
        ]

    async def requeue(self, queue: str, message_id: str) -> None:
        validate_id(queue, "queue")
        validate_id(message_id, "message_id")
        t = self._t
        missing = NotFoundError(
            f"queue {queue!r} has no dead letter {message_id!r}; list them with dead_letters()"
        )

        def run(conn: Conn) -> None:
            row = conn.one(
                f"SELECT n, payload, max_attempts, dedup_key FROM {t.dead}"
                " WHERE queue = ? AND id = ?",
                [queue, message_id],
            )
            if row is None:
                raise missing
            dedup_key = as_opt_str(row[3])
            if dedup_key is not None and conn.one(
                f"SELECT 1 FROM {t.messages} WHERE queue = ? AND dedup_key = ?", [queue, dedup_key]
            ):
                dedup_key = None  # a live message took the key meanwhile; it keeps it
            conn.exec(f"DELETE FROM {t.dead} WHERE n = ?", [as_int(row[0])])
            conn.exec(
                f"INSERT INTO {t.messages} (queue, id, payload, visible_at, attempts,"
                " max_attempts, token, dedup_key) VALUES (?, ?, ?, ?, 0, ?, NULL, ?)",
                [queue, message_id, as_bytes(row[1]), conn.now(), as_int(row[2]), dedup_key],
            )

        await self._store.use(run, lambda: _raise(missing), tx=Tx.WRITE)
