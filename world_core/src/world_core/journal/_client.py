"""Submitting turns and reading their outcome: what an app (a chat route, a script) calls."""

from __future__ import annotations

import hashlib
import json
import math
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

import anyio

from world_core.errors import (
    DuplicateKeyError,
    InvalidArgumentError,
    NotFoundError,
    TurnFailedError,
)
from world_core.journal._blobs import Blobs, session_blobs
from world_core.journal._journal import (
    DEFAULT_BLOB_THRESHOLD,
    DEFAULT_QUEUE,
    canonical_json,
    check_blob_threshold,
    check_new_turn_id,
    check_turn_id,
    decided_too_late,
    digest_of,
    load_value,
    session_log_id,
    stored_value,
)
from world_core.journal._live import TurnEvent, read_turn_events
from world_core.journal._session import (
    SessionView,
    append_session,
    current_log,
    read_session,
    session_chain,
    turn_log,
)
from world_core.journal._waits import (
    MAX_SIGNAL_PAYLOAD_BYTES,
    RESERVED_SIGNAL_PREFIXES,
    PendingApproval,
    approval_signal,
    check_signal_id,
    check_signal_name,
    check_signal_payload,
    verify_signal,
)
from world_core.spi import (
    MAX_ID_BYTES,
    Event,
    NewEvent,
    OutboxMessage,
    World,
    validate_id,
    validate_queue_seconds,
)

__all__ = [
    "DEFAULT_QUEUE",
    "SIGNAL_CHECK_DELAY",
    "WAIT_RECHECK",
    "Client",
    "TurnStatus",
    "resubmitted_turn_id",
    "turn_message",
    "turn_queue_key",
]


WAIT_RECHECK = 5.0
"""Seconds between :meth:`Client.wait`'s looks at the turn's input (one keyed read), which tell
it the turn was deleted under it (see there)."""

SIGNAL_CHECK_DELAY = 5.0
"""Seconds after which the check a signal's sender queues before sending it is handed to a
worker (``Client(signal_check=...)``; see :meth:`Client.signal`)."""

SIGNAL_CHECK = "signal-check"
"""The ``why`` of a queue message that is a signal's check, not a turn."""

TurnStatus = Literal["unknown", "queued", "running", "waiting", "done", "failed"]
"""``unknown``: never submitted; ``queued``: submitted, no step recorded yet (it may be waiting
for an earlier turn of its session: turns of a session run in submission order); ``running``:
steps recorded, no reply yet (running, or waiting for a retry); ``waiting``: suspended in a
wait (a timer, a signal, an approval: :meth:`Client.pending_approvals`); ``done``: replied;
``failed``: a failure is recorded (:meth:`Client.failure` says why)."""


def turn_message(session_id: str, turn_id: str) -> bytes:
    """The queue payload for a turn: ``{"session_id": ..., "turn_id": ...}``."""
    return canonical_json({"session_id": session_id, "turn_id": turn_id})


QueueKeyKind = Literal["turn", "kick", "signal", "wake"]
"""Why a message runs a turn (see :func:`turn_queue_key`)."""


def turn_queue_key(
    session_id: str, turn_id: str, kind: QueueKeyKind = "turn", n: int | None = None
) -> str:
    """The queue's deduplication key of a message that runs a turn: ``<tag>/<session>/<turn>``.

    The tag says why the message runs it: ``turn`` (its submission), ``kick-<n>`` (the
    ``n``-th hand-on to it after an earlier turn ended: see :mod:`~world_core.journal._order`),
    ``signal-<n>`` (a signal's wake-up of its wait at step ``n``), ``wake-<n>`` (the wake-up
    at the deadline of its wait at step ``n``). A session id may hold ``/``; a tag and a turn
    id (:func:`~world_core.journal._journal.check_turn_id`) never do. So the first ``/`` of a
    key ends its tag, the last one begins its turn, and the session is what lies between,
    whatever it holds; and a tag is written one way for each kind and ``n`` (decimal, no
    leading zeros). Two messages therefore share a key only if they run the same turn of the
    same session for the same reason: the queue keeps one of them (see
    :meth:`Queue.enqueue <world_core.spi.Queue.enqueue>`), and that is a duplicate dropped.
    (The key was ``<session>/<turn><suffix>`` before: turn ``t`` of session ``a`` had its
    first kick under ``a/t/kick-1``, which was also the submission's key of turn ``kick-1``
    of session ``a/t``, and one of the two never ran.)

    A key longer than :data:`~world_core.spi.MAX_ID_BYTES` is replaced by
    ``turn-sha256/<the hex sha-256 of that key>``: distinct keys give distinct digests (up to
    a collision of sha-256), and ``turn-sha256``, like ``signal-check-sha256`` (a signal's
    check: ``_check_key``), is no tag, so no key of the form above equals a digest key.

    Args:
        kind: the tag's kind; ``n`` (an int >= 0) goes with each kind but ``turn``.
    """
    tag: str
    if kind == "turn" and n is None:
        tag = kind
    elif kind in ("kick", "signal", "wake") and type(n) is int and n >= 0:
        tag = f"{kind}-{n}"
    else:
        raise InvalidArgumentError(f"no queue key of kind {kind!r} with n={n!r}")
    key = f"{tag}/{session_id}/{turn_id}"
    if len(key.encode("utf-8")) <= MAX_ID_BYTES:
        return key
    return "turn-sha256/" + hashlib.sha256(key.encode("utf-8")).hexdigest()


def resubmitted_turn_id(turn_id: str) -> str:
    """The id :meth:`Client.resubmit` gives the new turn of ``turn_id`` by default:
    ``resubmit-`` and the first 32 hex digits of a sha-256 of ``turn_id``. The same for every
    resubmission of a turn, and another for each turn, the new one included."""
    check_turn_id(turn_id)
    seed = b"resubmit\x00" + turn_id.encode("utf-8")
    return "resubmit-" + hashlib.sha256(seed).hexdigest()[:32]


class Client:
    """Submit turns, wait for and read their replies or failures. Nothing here runs the turn:
    a :class:`~world_core.Worker` does, so a caller that goes away (a closed tab) stops nothing.
    """

    def __init__(
        self,
        world: World,
        *,
        queue: str = DEFAULT_QUEUE,
        blob_threshold: int = DEFAULT_BLOB_THRESHOLD,
        signal_check: float = SIGNAL_CHECK_DELAY,
    ) -> None:
        """``signal_check``: seconds after which a worker checks that a signal sent through
        this client woke the turns waiting for it (see :meth:`signal`)."""
        self._world = world
        self._queue = validate_id(queue, "queue")
        self._blob_threshold = check_blob_threshold(blob_threshold)
        if validate_queue_seconds(signal_check, "signal_check") <= 0:
            raise InvalidArgumentError(
                f"signal_check must be > 0 seconds, got {signal_check!r}: the check is meant "
                "to come after the sender's own wake-ups"
            )
        self._signal_check = float(signal_check)

    async def submit(
        self,
        session_id: str,
        message: str,
        *,
        turn_id: str | None = None,
        parent: dict[str, str] | None = None,
    ) -> str:
        """Record the user's message as a new turn and queue it; returns the turn id.

        Turns of one session run one at a time, in the order they were submitted; each sees
        every earlier one (message and reply, or failure) in its conversation.

        Idempotent per ``turn_id``: submitting the same turn again (say, after a timeout whose
        outcome is unknown) queues it only if it has no reply or failure yet, and never twice
        at once. Where the World has an outbox the input and the message are one atomic write.
        A message above the blob threshold is stored as a blob first.

        A failed turn is over: to try its message again, :meth:`resubmit` it (a new turn).

        ``parent`` is set by :meth:`Journal.start_child <world_core.Journal.start_child>`: the
        turn that waits for this one's reply or failure (``session``, ``turn``, ``queue``).

        Raises:
            InvalidArgumentError: ``turn_id`` was already used with a different message, a
                message that is not a str, or bad ids, a ``turn_id`` holding a control
                character among them (nothing is written).
        """
        session_log_id(session_id)
        turn = check_new_turn_id(turn_id if turn_id is not None else uuid.uuid4().hex)
        if not isinstance(message, str):
            raise InvalidArgumentError(f"message must be a str, got {type(message).__name__}")
        digest = hashlib.sha256(canonical_json(message)).hexdigest()
        stored = await stored_value(self._blobs(session_id), message, self._blob_threshold)
        body: dict[str, Any] = {"t": "input", "turn": turn, "digest": digest}
        body["at"] = round(time.time(), 3)  # when it was submitted (this process's clock)
        body.update({"message": message} if "value" in stored else stored)
        if parent is not None:
            body["parent"] = parent
        event = NewEvent(key=f"turn/{turn}/input", data=canonical_json(body))
        dedup = turn_queue_key(session_id, turn)
        payload = turn_message(session_id, turn)
        outbox = self._world.capabilities.outbox
        messages = [OutboxMessage(queue=self._queue, payload=payload, dedup_key=dedup)]
        try:
            chain = await session_chain(self._world, session_id)
            # Continued: the turn may have been submitted to an earlier generation. The
            # current one is not looked at: the append refuses a turn it holds (the same
            # DuplicateKeyError), and the chain was just read (turn_log would read it again).
            for earlier in reversed(chain[:-1]):
                found = await self._world.log.get(earlier, f"turn/{turn}/input")
                if found is not None:
                    raise DuplicateKeyError(
                        f"turn {turn!r} exists", key=found.key or "", existing=found
                    )
            await append_session(
                self._world, session_id, [event], messages=messages if outbox else (), chain=chain
            )
        except DuplicateKeyError as exc:
            existing = json.loads(exc.existing.data)
            same = existing.get("digest") == digest or existing.get("message") == message
            if not same:
                raise InvalidArgumentError(
                    f"turn {turn!r} of session {session_id!r} was submitted with another "
                    "message; use a new turn_id"
                ) from None
            if await self.status(session_id, turn) != "queued":
                return turn  # a worker has had it: its message was queued
            home = await turn_log(self._world, session_id, turn)
            if await self._world.log.get(home, f"turn/{turn}/park/1") is not None:
                return turn  # a worker took its message and handed it on: it was queued
            outbox = False  # unknown whether it was queued: queue it (deduplicated)
        if not outbox:
            await self._world.queue.enqueue(self._queue, payload, dedup_key=dedup)
        return turn

    async def resubmit(
        self, session_id: str, turn_id: str, *, new_turn_id: str | None = None
    ) -> str:
        """Submit a finished or failed turn's message again, as a new turn; its id.

        Idempotent, like :meth:`submit`: the new turn's id is ``new_turn_id``, by default
        :func:`resubmitted_turn_id` of ``turn_id`` (a digest of it), so resubmitting the same
        turn again (a retry after a timeout, a double click) returns the same new turn and
        queues it only if it has not run: the turn runs, and its model is paid, once. To try
        again after the new turn failed too, resubmit the new turn (its own digest names a
        newer one), or pass another ``new_turn_id``.

        The new turn is a plain turn of the session: a child run's turn (see
        :meth:`Journal.start_child <world_core.Journal.start_child>`) resubmitted tells its
        parent nothing when it ends, since the parent was told the first run's end and
        :meth:`Journal.wait_child <world_core.Journal.wait_child>` reads the child's turn
        ``run`` only.

        Raises:
            NotFoundError: the turn was never submitted.
            InvalidArgumentError: the turn has not ended (queued, running, waiting), bad ids,
                or ``new_turn_id`` was already used with another message (nothing is
                written).
        """
        new = check_new_turn_id(
            resubmitted_turn_id(turn_id) if new_turn_id is None else new_turn_id
        )
        if new == turn_id:
            raise InvalidArgumentError(
                f"new_turn_id {new!r} is the resubmitted turn's own id; give the new turn "
                "another id (or leave new_turn_id out)"
            )
        status = await self.status(session_id, turn_id)
        if status not in ("done", "failed", "unknown"):
            raise InvalidArgumentError(
                f"turn {turn_id!r} of session {session_id!r} is {status}, not finished: "
                "resubmit only a turn that replied or failed"
            )
        home = await turn_log(self._world, session_id, turn_id)
        event = await self._world.log.get(home, f"turn/{turn_id}/input")
        if event is None:
            raise NotFoundError(f"turn {turn_id!r} of session {session_id!r} was never submitted")
        body = json.loads(event.data)
        message = (
            body["message"]
            if "message" in body
            else await load_value(self._blobs(session_id), body)
        )
        return await self.submit(session_id, str(message), turn_id=new)

    async def status(self, session_id: str, turn_id: str) -> TurnStatus:
        """Where the turn is: see :data:`TurnStatus` (a few keyed reads, no log scan)."""
        session_log_id(session_id)
        check_turn_id(turn_id)
        log_id = await turn_log(self._world, session_id, turn_id)
        get = self._world.log.get
        if await get(log_id, f"turn/{turn_id}/reply") is not None:
            return "done"
        if await get(log_id, f"turn/{turn_id}/failure") is not None:
            return "failed"
        if await get(log_id, f"turn/{turn_id}/input") is None:
            return "unknown"
        for what in ("step/0/outcome", "step/0/intent"):
            if await get(log_id, f"turn/{turn_id}/{what}") is not None:
                session, _ = await read_session(self._world, log_id)
                waiting = any(turn == turn_id for turn, _ in session.open_waits)
                return "waiting" if waiting else "running"
        return "queued"

    async def reply(self, session_id: str, turn_id: str) -> str | None:
        """The turn's reply, or None while it runs, if it failed, or was never submitted."""
        session_log_id(session_id)
        log_id = await turn_log(self._world, session_id, check_turn_id(turn_id))
        event = await self._world.log.get(log_id, f"turn/{turn_id}/reply")
        return None if event is None else await self._reply_of(session_id, event)

    async def failure(self, session_id: str, turn_id: str) -> TurnFailedError | None:
        """Why the turn failed (the error :meth:`wait` raises), or None if it has not."""
        session_log_id(session_id)
        log_id = await turn_log(self._world, session_id, check_turn_id(turn_id))
        event = await self._world.log.get(log_id, f"turn/{turn_id}/failure")
        return None if event is None else _failure_of(session_id, turn_id, event)

    async def wait(
        self,
        session_id: str,
        turn_id: str,
        *,
        timeout: float | None = 600.0,  # noqa: ASYNC109  (a default deadline for every wait)
    ) -> str:
        """Wait for the turn's reply (woken by ``Log.watch``) and return it.

        A caller that stops waiting stops nothing: the turn goes on.

        Every :data:`WAIT_RECHECK` seconds the wait also looks at the turn's input (one keyed
        read): a turn whose input is gone was deleted under it (``delete_session`` with
        ``force``), and a worker that was still running it writes its end into a new log of
        that id, which the watch of the old one would never show. The wait then returns that
        reply (or raises that failure) if there is one, else raises ``NotFoundError``: no
        record of the turn is left for its end to be told in. So does a turn never submitted,
        once it is still missing a recheck after the wait began. Even with ``timeout=None``
        the wait therefore ends.

        Args:
            timeout: seconds to wait at most; None waits as long as it takes; 0 looks once
                without waiting (the reply, the failure, or ``TimeoutError``).

        Raises:
            TurnFailedError: the turn recorded a failure (error class, message, attempts, the
                step it stopped at); resubmit it with :meth:`resubmit` if that makes sense.
            NotFoundError: the turn was deleted while it was waited for (its session deleted
                with ``force``) and left no end, or was never submitted: submit its message
                again as a new turn if it is still wanted.
            TimeoutError: no reply or failure within ``timeout``.
        """
        session_log_id(session_id)
        check_turn_id(turn_id)
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout < 0
        ):
            raise InvalidArgumentError(f"timeout must be None or seconds >= 0, got {timeout!r}")
        if timeout == 0:  # a look, not a wait (under a deadline of 0 even the look was cut)
            found = await self._ended(session_id, turn_id)
            if found is not None:
                return found
            raise TimeoutError(f"turn {turn_id!r} of session {session_id!r} has not ended yet")
        with anyio.fail_after(timeout):
            log_id = await turn_log(self._world, session_id, turn_id)
            after = await self._world.log.tail(log_id)
            first = await self._world.log.get(log_id, f"turn/{turn_id}/input")
            found = await self._ended(session_id, turn_id)
            if found is not None:
                return found
            while True:
                with anyio.move_on_after(WAIT_RECHECK):
                    events = self._world.log.watch(log_id, after=after)
                    try:
                        async for event in events:
                            after = event.seq
                            if event.key == f"turn/{turn_id}/reply":
                                return await self._reply_of(session_id, event)
                            if event.key == f"turn/{turn_id}/failure":
                                raise _failure_of(session_id, turn_id, event)
                    finally:
                        close = getattr(events, "aclose", None)
                        if close is not None:
                            with anyio.CancelScope(shield=True):  # a watch every recheck
                                await close()
                now = await self._world.log.get(log_id, f"turn/{turn_id}/input")
                if now is not None and (first is None or now.seq == first.seq):
                    first = now
                    continue
                # Gone (or submitted again after a deletion): its end, if written, is in the
                # log as it is now, where the watch's position means nothing.
                found = await self._ended(session_id, turn_id)
                if found is not None:
                    return found
                if now is not None:
                    first, after = now, now.seq
                    continue
                what = "was never submitted" if first is None else "was deleted while waited for"
                raise NotFoundError(
                    f"turn {turn_id!r} of session {session_id!r} {what} (delete_session with "
                    "force=True deletes a turn under its worker) and has no reply or failure to "
                    "tell; submit its message again as a new turn if it is still wanted"
                )
        raise AssertionError("unreachable: watch never ends by itself")

    async def _ended(self, session_id: str, turn_id: str) -> str | None:
        """The turn's reply, None while it has none; raises its failure if it failed."""
        found = await self.reply(session_id, turn_id)
        if found is not None:
            return found
        failed = await self.failure(session_id, turn_id)
        if failed is not None:
            raise failed
        return None

    def events(
        self,
        session_id: str,
        turn_id: str,
        *,
        after: int | None = None,
        timeout: float = 300.0,
    ) -> AsyncIterator[TurnEvent]:
        """Follow the turn's live events (see :class:`~world_core.TurnEvent`): each step
        starting and finishing, the model's text as it streams, tool results, committed
        state, runs resumed on other workers, and the reply or failure, which ends it.

        Resumable: pass the ``position`` of the last event seen as ``after`` and nothing is
        missed or seen twice, across reconnects and across a worker's crash (the next
        worker's events continue the same stream after a ``resumed`` event; steps it reads
        back from the journal come as ``step_replayed``). The events are a best-effort live
        view; the journal is the truth (:meth:`wait`, :meth:`status`): see
        :mod:`world_core.journal._live`.

        Args:
            after: the position of the last event seen; None (or -1) starts at the first.
            timeout: seconds to wait for the next event before ``TimeoutError``.

        Raises:
            InvalidIdentifierError, InvalidArgumentError: bad ids, ``after`` or ``timeout``
                (raised by this call, before anything is read).
            TimeoutError: by the iterator, when nothing came for ``timeout`` seconds and the
                turn has not ended.
            NotFoundError: by the iterator, when nothing came and the turn was never
                submitted (within a few seconds).
        """
        return read_turn_events(
            self, self._world, session_id, turn_id, after=after, timeout=timeout
        )

    async def signal(
        self,
        session_id: str,
        name: str,
        payload: Any = None,
        *,
        sender: str,
        signal_id: str | None = None,
        turn_id: str | None = None,
    ) -> str:
        """Send the signal ``name`` with a JSON ``payload`` to the session (or to one of its
        turns); returns its id. A turn waiting for it is woken; otherwise it waits in the
        session for the first :meth:`Journal.wait_for_signal <world_core.Journal.wait_for_signal>`
        for its name (addressed to a turn: for that turn's).

        Idempotent per ``signal_id``: sending it again counts once (a double-tapped button);
        the same id with another name, payload or turn is refused.

        A look at the session and three writes: a *check* queued with a delay
        (``Client(signal_check=5)`` seconds) on the queue of the turns waiting for the signal
        (which their waits record; this client's queue when none waits yet), the signal's
        append, the waiting turns' wake-ups. A sender that
        dies between the append and the wake-ups (a killed process) leaves the signal in the
        log and no wake-up; the check, handed to a worker when its delay is over, queues the
        wake-ups again if the signal is still unconsumed (one read of the session), and does
        nothing if it was consumed or never appended (the sender died before). So a signal
        wakes its turn within the check's delay whatever happened to its sender, at the cost
        of one delayed message a signal; a turn waiting costs nothing while it waits.

        Args:
            payload: JSON data, received by the waiting turn as sent (None, bool, int, finite
                float, str, lists and dicts with str keys of them; a tuple arrives as a list).
                What JSON would carry only converted (a set, bytes, a pydantic model, a date)
                is refused: convert it first (see
                :func:`~world_core.journal._waits.check_signal_payload`).
            sender: who sends it (a user id, ``webhook:stripe``): recorded with the signal.
            signal_id: the deduplication id; a new one when None.

        Raises:
            InvalidArgumentError: a bad name, sender, id or payload (not JSON data, or above
                :data:`~world_core.journal._waits.MAX_SIGNAL_PAYLOAD_BYTES`), a name or id of
                the journal's own signals (``approval/...``: use :meth:`approve`; ``child/...``),
                the id was used for another signal, or ``turn_id`` names a turn that is over
                (it has a reply or a failure: nothing would receive the signal). Nothing is
                written.
        """
        for what, value in (("name", name), ("signal_id", signal_id)):
            if isinstance(value, str) and value.startswith(RESERVED_SIGNAL_PREFIXES):
                raise InvalidArgumentError(
                    f"signal {what} {value!r} is reserved for the journal's own signals "
                    "(decisions on approvals: use approve() or reject(); ends of child runs)"
                )
        if turn_id is not None:
            session_log_id(session_id)
            check_turn_id(turn_id)
            log_id = await current_log(self._world, session_id)
            session, _ = await read_session(self._world, log_id)
            resent = signal_id is not None and await self._world.log.get(
                log_id, f"signal/{check_signal_id(signal_id)}"
            )
            # A resend of a signal the turn received before it ended counts once, as ever.
            if session.finished(turn_id) and not resent:
                end = "reply" if turn_id in session.replies else "recorded failure"
                raise InvalidArgumentError(
                    f"turn {turn_id!r} of session {session_id!r} is over (it has a {end}): a "
                    "signal addressed to it would never be received; send it to the session "
                    "(no turn) for the next wait of its name"
                )
        return await self._send(
            session_id, name, payload, sender=sender, signal_id=signal_id, turn_id=turn_id
        )

    async def _send(
        self,
        session_id: str,
        name: str,
        payload: Any,
        *,
        sender: str,
        signal_id: str | None,
        turn_id: str | None,
        sent_at: float | None = None,
    ) -> str:
        """:meth:`signal` without the check of reserved names (the journal's own signals).

        ``sent_at``: the time recorded as the signal's sending (this process's clock); None
        reads the clock. A decision on an approval passes the reading its deadline check
        made (see :meth:`_decide`)."""
        session_log_id(session_id)
        check_signal_name(name)
        _check_sender(sender)
        if turn_id is not None:
            check_turn_id(turn_id)
        signal = check_signal_id(signal_id if signal_id is not None else uuid.uuid4().hex)
        check_signal_payload(name, payload)
        try:
            size = len(canonical_json(payload))
        except (ValueError, RecursionError) as exc:  # nested deeper than JSON can be written
            raise InvalidArgumentError(f"signal {name!r}: payload is not JSON: {exc}") from None
        if size > MAX_SIGNAL_PAYLOAD_BYTES:
            raise InvalidArgumentError(
                f"signal {name!r}: payload is {size} bytes of JSON, more than "
                f"{MAX_SIGNAL_PAYLOAD_BYTES}; send a reference to it (a document, a URL)"
            )
        digest = digest_of({"name": name, "payload": payload, "turn": turn_id})
        # The check goes where the waiting turns' workers are (their waits record their
        # queue); with no turn waiting yet, to this client's queue: a wait written after this
        # look is found by the look after the append, or finds the signal itself.
        session, _ = await read_session(self._world, await current_log(self._world, session_id))
        check = canonical_json({"session_id": session_id, "signal": signal, "why": SIGNAL_CHECK})
        for queue in sorted(_waiting_queues(session, name, turn_id) or {self._queue}):
            await self._world.queue.enqueue(
                queue, check, delay=self._signal_check, dedup_key=_check_key(session_id, signal)
            )
        body = {
            "t": "signal",
            "id": signal,
            "name": name,
            "payload": payload,
            "sender": sender,
            "turn": turn_id,
            "digest": digest,
            # the sender's clock: approvals decided too late are void
            "sent_at": time.time() if sent_at is None else sent_at,
        }
        try:
            await append_session(
                self._world,
                session_id,
                [NewEvent(key=f"signal/{signal}", data=canonical_json(body))],
            )
        except DuplicateKeyError as exc:
            existing = json.loads(exc.existing.data)
            if existing.get("digest") != digest:
                raise InvalidArgumentError(
                    f"signal id {signal!r} of session {session_id!r} was already used for "
                    f"{existing.get('name')!r} from {existing.get('sender')!r} with another "
                    "payload; a signal id is sent once (use a new id for a new signal)"
                ) from None
        await self._wake_waiting(session_id, name, turn_id)
        return signal

    async def signal_from_webhook(
        self,
        session_id: str,
        body: bytes,
        signature: str,
        *,
        key: str | bytes | None = None,
    ) -> str:
        """Send a signal that arrived signed (a webhook): ``body`` is the raw request body, a
        JSON object ``{"session", "name", "payload", "id", "sender", "turn"}`` (``payload``,
        ``turn`` optional; ``session`` must be ``session_id``, so a captured body cannot be
        replayed to another session; ``id`` makes retries count once), ``signature`` its
        ``sha256=<hex>`` HMAC under ``key`` (default: ``WORKFLOW_SIGNAL_KEY``). Returns the
        signal id.

        Raises:
            InvalidArgumentError: the signature does not match (nothing is written), or the
                body is not such an object.
            ConfigurationError: no key (see :func:`~world_core.journal._waits.signal_key`).
        """
        verify_signal(body, signature, key=key)
        try:
            message = json.loads(body)
        except ValueError as exc:
            raise InvalidArgumentError(f"the signed body is not JSON: {exc}") from None
        if not isinstance(message, dict) or not {"session", "name", "id", "sender"} <= set(message):
            raise InvalidArgumentError(
                'the signed body must be a JSON object with "session", "name", "id" and '
                '"sender" (and optionally "payload", "turn")'
            )
        if message["session"] != session_id:
            raise InvalidArgumentError(
                f"the signed body is for session {message['session']!r}, not {session_id!r}: "
                "refused (a signature binds the session it was made for)"
            )
        return await self.signal(
            session_id,
            message["name"],
            message.get("payload"),
            sender=message["sender"],
            signal_id=message["id"],
            turn_id=message.get("turn"),
        )

    async def _wake_waiting(self, session_id: str, name: str, turn_id: str | None) -> None:
        """Queue a wake-up for the turns waiting for signal ``name``, if any. Read after the
        signal's append: a wait written before it is seen here; one written after it finds
        the signal itself."""
        session, _ = await read_session(self._world, await current_log(self._world, session_id))
        await _queue_wake_ups(self._world, self._queue, session_id, session, name, turn_id)

    async def pending_approvals(self, session_id: str) -> list[PendingApproval]:
        """Tool calls of the session waiting for a decision (:meth:`approve`, :meth:`reject`),
        with the tool's arguments, oldest first (one read of the session log)."""
        session, _ = await read_session(self._world, await current_log(self._world, session_id))
        decided = {str(body.get("id")) for body in session.signals}  # sent, not consumed yet
        found: list[PendingApproval] = []
        now = time.time()
        for (turn, step), intent in session.open_waits.items():
            if intent.get("kind") != "approval" or approval_signal(turn, step)[1] in decided:
                continue
            if decided_too_late(now, float(intent.get("deadline") or 0.0)):
                continue  # timed out: the call will not run (the turn learns it when it wakes)
            found.append(
                PendingApproval(
                    session_id=session_id,
                    turn_id=turn,
                    step=step,
                    tool=str(intent.get("tool")),
                    arguments=intent.get("arguments"),
                    deadline=float(intent.get("deadline") or 0.0),
                )
            )
        return found

    async def approve(
        self, session_id: str, turn_id: str, step: int, *, by: str, reason: str | None = None
    ) -> None:
        """Approve the tool call waiting at ``step`` of the turn: it runs.

        A decision is approve or reject, and final. Approving again is idempotent whoever
        sends it and whatever its ``reason``: the first decision stands as it was recorded
        (its sender and reason), and a waiting turn is woken again if it is still waiting.
        Approving what was rejected (or the reverse) is refused.

        Raises:
            NotFoundError: no approval waits at that step.
            InvalidArgumentError: it was decided otherwise already.
        """
        await self._decide(session_id, turn_id, step, approved=True, by=by, reason=reason)

    async def reject(
        self, session_id: str, turn_id: str, step: int, *, by: str, reason: str | None = None
    ) -> None:
        """Reject the tool call waiting at ``step`` of the turn: it does not run, and the model
        is told who rejected it and why. See :meth:`approve`."""
        await self._decide(session_id, turn_id, step, approved=False, by=by, reason=reason)

    async def _decide(
        self,
        session_id: str,
        turn_id: str,
        step: int,
        *,
        approved: bool,
        by: str,
        reason: str | None,
    ) -> None:
        check_turn_id(turn_id)
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InvalidArgumentError(f"step must be an int >= 0, got {step!r}")
        if reason is not None and not isinstance(reason, str):
            raise InvalidArgumentError(f"reason must be a str, got {type(reason).__name__}")
        _check_sender(by)  # before a repeated decision is let through as the first one
        name, signal_id = approval_signal(turn_id, step)
        session_log_id(session_id)
        log_id = await turn_log(self._world, session_id, turn_id)
        get = self._world.log.get
        intent = await get(log_id, f"turn/{turn_id}/step/{step}/intent")
        body = _decode(intent)
        if intent is None or body.get("kind") != "approval":
            raise NotFoundError(
                f"no approval waits at step {step} of turn {turn_id!r} of session "
                f"{session_id!r}; list them with pending_approvals (world approvals)"
            )
        # A decision recorded already: a repeat of it counts once (a double tap), also when
        # it lands after the turn went on past the approval (its deadline, its end).
        decided = _decode(await get(log_id, f"signal/{signal_id}"))
        if decided:
            _check_same_decision(decided, approved, turn_id, step)
        for end in ("reply", "failure"):
            if await get(log_id, f"turn/{turn_id}/{end}") is not None:
                if decided:
                    await self._check_not_over(log_id, turn_id, step, signal_id)
                    return
                raise InvalidArgumentError(
                    f"turn {turn_id!r} of session {session_id!r} is over (it has a {end}); a "
                    "decision on its approval would change nothing"
                )
        await self._check_not_over(log_id, turn_id, step, signal_id)
        # One reading of the clock decides, and is recorded as the decision's sent_at, which
        # the worker compares with the same deadline (_late): a decision this check lets
        # through always counts, one it refuses is never written. (With a second reading for
        # sent_at, a decision let through just before the cutoff was recorded as sent after it:
        # the caller was told "approved", and the worker voided it.)
        now = time.time()
        if not decided and decided_too_late(now, float(body.get("deadline") or 0.0)):
            raise InvalidArgumentError(
                f"the approval at step {step} of turn {turn_id!r} timed out: nobody decided in "
                "time, so the call does not run; a decision now would change nothing"
            )
        payload = {"approved": approved, "reason": reason}
        try:
            await self._send(
                session_id,
                name,
                payload,
                sender=by,
                signal_id=signal_id,
                turn_id=turn_id,
                sent_at=now,
            )
        except InvalidArgumentError:
            existing = _decode(await get(log_id, f"signal/{signal_id}"))
            if not existing:
                raise
        else:
            existing = {}
        if existing:
            _check_same_decision(existing, approved, turn_id, step)
            sent = existing.get("payload")
            # The same decision with another reason (or sender): the first one stands. Sent
            # again as recorded, so that it counts once and still wakes a turn whose first
            # wake-up was lost.
            await self._send(
                session_id,
                name,
                sent,
                sender=str(existing.get("sender")),
                signal_id=signal_id,
                turn_id=turn_id,
                sent_at=now,  # not recorded: the first decision's append stands
            )
        # The wait may have ended by its timeout just before the decision landed: say so.
        await self._check_not_over(log_id, turn_id, step, signal_id)

    async def _check_not_over(self, log_id: str, turn_id: str, step: int, signal_id: str) -> None:
        """Refuse when the approval's wait ended without this decision (its timeout)."""
        ended = _decode(await self._world.log.get(log_id, f"turn/{turn_id}/step/{step}/outcome"))
        if ended:
            consumed = ended.get("result", {}).get("signal") or {}
            if consumed.get("signal_id") != signal_id:
                raise InvalidArgumentError(
                    f"the approval at step {step} of turn {turn_id!r} is over (nobody decided "
                    "in time: the call did not run); a decision now would change nothing"
                )

    def _blobs(self, session_id: str) -> Blobs:
        return session_blobs(self._world, session_id)

    async def _reply_of(self, session_id: str, event: Event) -> str:
        body = json.loads(event.data)
        if "reply" in body:
            return str(body["reply"])
        return str(await load_value(self._blobs(session_id), body))


def _check_sender(sender: object) -> None:
    """Refuse a signal's sender (or a decision's ``by``) that names nobody."""
    if not isinstance(sender, str) or not sender.strip() or len(sender) > 200:
        raise InvalidArgumentError(
            f"sender must name who sends the signal (a non-empty str of at most 200 "
            f"characters), got {sender!r:.80}"
        )


def _decode(event: Event | None) -> dict[str, Any]:
    """An event's JSON object body; empty for none (or one that is not an object)."""
    if event is None:
        return {}
    body = json.loads(event.data)
    return body if isinstance(body, dict) else {}


def _failure_of(session_id: str, turn_id: str, event: Event) -> TurnFailedError:
    body = json.loads(event.data)
    error_type, error = str(body.get("error_type")), str(body.get("error"))
    attempts, step = int(body.get("attempts") or 0), body.get("step")
    where = "before its first step" if step is None else f"at step {step}"
    return TurnFailedError(
        f"turn {turn_id!r} of session {session_id!r} failed {where} after {attempts} "
        f"attempt(s): {error_type}: {error}",
        session_id=session_id,
        turn_id=turn_id,
        error_type=error_type,
        error=error,
        attempts=attempts,
        step=step if isinstance(step, int) else None,
    )


def _check_key(session_id: str, signal_id: str) -> str:
    """The queue's deduplication key of a signal's check: ``signal-check-sha256/<hex>``, the
    sha-256 of the JSON list ``[session, signal]`` (one list per pair, whatever either holds).
    Checks share a queue with turns' messages, whose keys never begin so (see
    :func:`turn_queue_key`): a check and a turn's message never share a key. (With the turn
    keys ``<session>/<turn><suffix>`` of before, the turn named by this digest in a session
    named ``signal-check-sha256`` had this key too.)"""
    both = canonical_json([session_id, signal_id])
    return f"{SIGNAL_CHECK}-sha256/" + hashlib.sha256(both).hexdigest()


async def check_signal(world: World, queue: str, session_id: str, signal_id: str) -> list[str]:
    """The check :meth:`Client.signal` queued before sending ``signal_id``: if the signal is in
    the session's log and no wait consumed it yet, queue the wake-ups of the turns waiting for
    it again (deduplicated with its sender's, if those are still queued; one a wait already
    resumed is dropped as stale). Returns the turns woken (none if the signal was consumed,
    or never appended: its sender died before)."""
    session, _ = await read_session(world, await current_log(world, session_id))
    for body in session.signals:
        if body.get("id") == signal_id:
            name, turn = str(body.get("name")), body.get("turn")
            return await _queue_wake_ups(
                world, queue, session_id, session, name, None if turn is None else str(turn)
            )
    return []


def _waits_for(
    session: SessionView, name: str, turn_id: str | None
) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """(turn, step, intent) of each open wait of ``session`` for signal ``name`` (only
    ``turn_id``'s, for a signal addressed to it)."""
    for (turn, step), intent in session.open_waits.items():
        if intent.get("signal") == name and (turn_id is None or turn == turn_id):
            yield turn, step, intent


def _waiting_queues(session: SessionView, name: str, turn_id: str | None) -> set[str]:
    """The queues recorded by the waits of ``session`` for signal ``name``."""
    return {
        str(intent["queue"])
        for _, _, intent in _waits_for(session, name, turn_id)
        if intent.get("queue")
    }


async def _queue_wake_ups(
    world: World,
    queue: str,
    session_id: str,
    session: SessionView,
    name: str,
    turn_id: str | None,
) -> list[str]:
    """Queue a wake-up for each turn of ``session`` waiting for signal ``name`` (only
    ``turn_id``'s, for a signal addressed to it), on the queue of the turn's workers
    (``queue`` if its wait does not say); returns those turns."""
    woken: list[str] = []
    for turn, step, intent in _waits_for(session, name, turn_id):
        wake = {"session_id": session_id, "turn_id": turn, "wake": step, "why": "signal"}
        await world.queue.enqueue(
            str(intent.get("queue") or queue),  # the waiting turn's workers' queue
            canonical_json(wake),
            dedup_key=turn_queue_key(session_id, turn, "signal", step),
        )
        woken.append(turn)
    return woken


def _check_same_decision(existing: dict[str, Any], approved: bool, turn_id: str, step: int) -> None:
    """Refuse a decision other than the one recorded (``existing``, the approval's signal)."""
    sent = existing.get("payload")
    decided = isinstance(sent, dict) and sent.get("approved") is True
    if decided != approved:
        was = "approved" if decided else "rejected"
        raise InvalidArgumentError(
            f"the call at step {step} of turn {turn_id!r} was already {was} by "
            f"{existing.get('sender')!r}; a decision is final"
        )
