"""Turn order: the turns of one session run one at a time, in submission order.

Each turn gets its own queue message when it is submitted, so different sessions never wait
for each other. A worker that claims a turn while an earlier turn of its session has not
ended does not hold the message, nor wait: it *parks* the turn (a ``park`` event in the session
log, appended only if the log is still as the worker read it) and acks the message. Whoever
ends a turn (records its reply or failure) then *hands on*: it reads the log and, if the
session's next unfinished turn was parked more often than it was sent on, appends a ``kick``
event and sends it a new message (in the same atomic write where the World has an outbox). So:

* the one turn of a session that may run is its earliest unfinished one; it cannot be
  overtaken, since nothing is submitted before it later;
* a park and the end of the turn it waits for are ordered by the log: either the park came
  first and the hand-on sees it, or the park is refused (the log moved) and the worker reads
  again and finds the turn free to run;
* a crash between any two of these writes is repaired by redelivery: a message whose turn has
  a park naming it is acked without running; a turn's end is handed on again each time its
  message comes back, and a kick already in the log is sent again under its own
  deduplication key (a no-op while that message lives; its message is acked only once the
  turn it runs has ended);
* without an outbox a submission is two writes too (the input, then its message), and a
  client that died between them left a turn that no message runs, ahead of every later turn
  of its session: the worker that parks a turn behind one that has not started, nor been
  parked or kicked, sends that one its submission message again (:func:`send_unsent`, under
  the submission's deduplication key: a no-op while its message lives), so it runs and ends.

Event keys (``<t>`` a turn id, ``<n>`` counting from 1):

=======================  ================================================================
``turn/<t>/park/<n>``    the ``n``-th message of turn ``t`` was handed on (``message``,
                         ``behind``: the earlier turn it waited for)
``turn/<t>/kick/<n>``    the ``n``-th message sent to run turn ``t`` after a turn ended
                         (``after``)
=======================  ================================================================

A turn queued behind a failed one runs: a failure ends a turn as a reply does, and the later
turn's conversation shows the failed turn's message with a note of why it failed
(:attr:`PastTurn.answer <world_core.journal._journal.PastTurn.answer>`). To stop a session
instead, do not submit more turns to it (or fail them in the agent).
"""

from __future__ import annotations

import json
from typing import Any

from world_core.errors import ConflictError, DuplicateKeyError, WorldError
from world_core.journal._client import Client, turn_message, turn_queue_key
from world_core.journal._journal import canonical_json, session_log_id
from world_core.journal._session import current_log, read_session, turn_log
from world_core.journal._waits import child_signal
from world_core.spi import NewEvent, OutboxMessage, World

__all__ = ["HAND_ON_TRIES", "SessionBusyError", "hand_on", "notify_parent", "send_unsent"]

_INLINE_REPLY_CHARS = 64 * 1024
"""A child's reply longer than this is not copied into the parent's signal: the parent reads
it from the child's log."""

HAND_ON_TRIES = 50
"""Times :func:`hand_on` reads the log again when another write slipped in before its own."""


class SessionBusyError(WorldError):
    """Other writes kept slipping in before a turn-order write (a park, a hand-on): transient."""


async def hand_on(world: World, session_id: str, queue: str, *, after: str) -> str | None:
    """After turn ``after`` of the session ended: make sure the session's next turn runs.

    Returns the turn sent a message, or None when none needed one (no unfinished turn, or the
    next one still has a live message of its own). Idempotent: calling it again (a redelivered
    message) sends nothing twice.

    Raises:
        SessionBusyError: the session log changed under each of :data:`HAND_ON_TRIES`
            attempts (call it again later).
        BackendUnavailableError: as any write.
    """
    session_log_id(session_id)
    for _ in range(HAND_ON_TRIES):
        log_id = await current_log(world, session_id)
        session, _ = await read_session(world, log_id)
        turn = session.earliest_unfinished()
        if turn is None:
            return None
        parks, kicks = len(session.parks.get(turn, [])), session.kicks.get(turn, 0)
        if parks <= kicks:
            if kicks and turn not in session.started:
                # The latest kick may have been logged by a worker that died before sending
                # it (no outbox): send it again (the turn has not started: no step of it is
                # recorded); its dedup key makes that a no-op if it was sent.
                await _send(world, queue, session_id, turn, kicks)
            return None
        n = kicks + 1
        body = {"t": "kick", "turn": turn, "n": n, "after": after}
        event = NewEvent(key=f"turn/{turn}/kick/{n}", data=canonical_json(body))
        outbox = world.capabilities.outbox
        message = OutboxMessage(
            queue=queue,
            payload=turn_message(session_id, turn),
            dedup_key=turn_queue_key(session_id, turn, "kick", n),
        )
        try:
            await world.log.append(
                log_id, [event], expect_tail=session.tail, messages=[message] if outbox else ()
            )
        except (ConflictError, DuplicateKeyError):
            continue  # a park, a submission or another hand-on came first: read again
        if not outbox:
            await _send(world, queue, session_id, turn, n)
        return turn
    raise SessionBusyError(
        f"session {session_id!r}: the log changed under each of {HAND_ON_TRIES} attempts to "
        "hand on to its next turn; try again later"
    )


async def send_unsent(world: World, session_id: str, queue: str, turn: str) -> bool:
    """Send turn ``turn`` its submission message again if it may never have been sent: the
    World has no outbox, and the turn has not ended, started, been parked nor kicked (so no
    message of it was ever taken). Under the submission's deduplication key, so a no-op
    while that message lives; a message too many is harmless (a turn that ended hands on
    again, one that may not run yet is parked). True if it sent."""
    if world.capabilities.outbox:
        return False  # the input and its message were one write
    session, _ = await read_session(world, await current_log(world, session_id))
    if (
        turn not in session.inputs
        or session.finished(turn)
        or turn in session.started
        or session.parks.get(turn)
        or session.kicks.get(turn)
    ):
        return False
    await world.queue.enqueue(
        queue, turn_message(session_id, turn), dedup_key=turn_queue_key(session_id, turn)
    )
    return True


async def _send(world: World, queue: str, session_id: str, turn: str, n: int) -> None:
    await world.queue.enqueue(
        queue,
        turn_message(session_id, turn),
        dedup_key=turn_queue_key(session_id, turn, "kick", n),
    )


async def notify_parent(world: World, session_id: str, turn_id: str) -> bool:
    """After a turn ended: if it is a child run, signal its parent turn with the reply or the
    failure (idempotent: the signal id is the child's). Returns True if it had a parent."""
    session_log_id(session_id)
    event = await world.log.get(await turn_log(world, session_id, turn_id), f"turn/{turn_id}/input")
    parent = None if event is None else json.loads(event.data).get("parent")
    if not isinstance(parent, dict):
        return False
    client = Client(world, queue=str(parent.get("queue")))
    payload: dict[str, Any]
    reply = await client.reply(session_id, turn_id)
    if reply is not None:
        inline = len(reply) <= _INLINE_REPLY_CHARS
        payload = {"reply": reply} if inline else {"reply": None, "reply_in_child": True}
    else:
        failed = await client.failure(session_id, turn_id)
        if failed is None:
            return True  # not ended: nothing to say yet
        payload = {
            "failure": {
                "error_type": failed.error_type,
                "error": failed.error,
                "attempts": failed.attempts,
                "step": failed.step,
            }
        }
    await client._send(  # the journal's own signal: its name is reserved
        str(parent["session"]),
        child_signal(session_id),
        payload,
        sender=f"child:{session_id}",
        signal_id=f"child/{session_id}/{turn_id}",
        turn_id=str(parent["turn"]),
    )
    return True
