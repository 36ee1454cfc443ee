"""Submitting turns and reading replies: what an app (a chat route, a script) calls."""

from __future__ import annotations

import json
import uuid

from world_core.errors import DuplicateKeyError, InvalidArgumentError
from world_core.journal._journal import canonical_json, check_turn_id, session_log_id
from world_core.spi import NewEvent, OutboxMessage, World, validate_id

__all__ = ["DEFAULT_QUEUE", "Client", "turn_message"]

DEFAULT_QUEUE = "turns"
"""The queue turns are sent to and workers claim from."""


def turn_message(session_id: str, turn_id: str) -> bytes:
    """The queue payload for a turn: ``{"session_id": ..., "turn_id": ...}``."""
    return canonical_json({"session_id": session_id, "turn_id": turn_id})


class Client:
    """Submit turns, wait for and read replies. Nothing here runs the turn: a
    :class:`~world_core.Worker` does, so a caller that goes away (a closed tab) stops nothing.
    """

    def __init__(self, world: World, *, queue: str = DEFAULT_QUEUE) -> None:
        self._world = world
        self._queue = validate_id(queue, "queue")

    async def submit(self, session_id: str, message: str, *, turn_id: str | None = None) -> str:
        """Record the user's message as a new turn and queue it; returns the turn id.

        Idempotent per ``turn_id``: submitting the same turn again (say, after a timeout whose
        outcome is unknown) queues it only if it has no reply yet, and never twice at once
        (the message's dedup key is ``<session>/<turn>``). Where the World has an outbox the
        input and the message are one atomic write.

        Raises:
            InvalidArgumentError: ``turn_id`` was already used with a different message, or
                bad ids (nothing is written).
        """
        log_id = session_log_id(session_id)
        turn = check_turn_id(turn_id if turn_id is not None else uuid.uuid4().hex)
        if not isinstance(message, str):
            raise InvalidArgumentError(f"message must be a str, got {type(message).__name__}")
        event = NewEvent(
            key=f"turn/{turn}/input",
            data=canonical_json({"t": "input", "turn": turn, "message": message}),
        )
        dedup = f"{session_id}/{turn}"
        payload = turn_message(session_id, turn)
        outbox = self._world.capabilities.outbox
        messages = [OutboxMessage(queue=self._queue, payload=payload, dedup_key=dedup)]
        try:
            await self._world.log.append(log_id, [event], messages=messages if outbox else ())
        except DuplicateKeyError as exc:
            if json.loads(exc.existing.data).get("message") != message:
                raise InvalidArgumentError(
                    f"turn {turn!r} of session {session_id!r} was submitted with another "
                    "message; use a new turn_id"
                ) from None
            if await self.reply(session_id, turn) is not None:
                return turn
            outbox = False  # unknown whether it was queued: queue it (deduplicated)
        if not outbox:
            await self._world.queue.enqueue(self._queue, payload, dedup_key=dedup)
        return turn

    async def reply(self, session_id: str, turn_id: str) -> str | None:
        """The turn's reply, or None while it runs (or if it was never submitted)."""
        event = await self._world.log.get(session_log_id(session_id), f"turn/{turn_id}/reply")
        if event is None:
            return None
        reply: str = json.loads(event.data)["reply"]
        return reply

    async def wait(self, session_id: str, turn_id: str) -> str:
        """Wait for the turn's reply (woken by ``Log.watch``). Bound it with
        ``anyio.fail_after``; a caller that stops waiting stops nothing: the turn goes on."""
        log_id = session_log_id(session_id)
        key = f"turn/{turn_id}/reply"
        tail = await self._world.log.tail(log_id)
        found = await self.reply(session_id, turn_id)
        if found is not None:
            return found
        async for event in self._world.log.watch(log_id, after=tail):
            if event.key == key:
                reply: str = json.loads(event.data)["reply"]
                return reply
        raise AssertionError("unreachable: watch never ends by itself")
