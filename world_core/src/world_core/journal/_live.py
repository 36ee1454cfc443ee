"""A turn's live events: the World stream a worker publishes a turn's progress on, and its reader.

Each turn has one stream (:func:`turn_events_stream`); each chunk is one event, JSON, and the
chunk's index is the event's ``position`` (0, 1, 2 ...). The publisher is an observer of the
worker's runs (:mod:`world_core.observe`); this module holds what both sides share: the event
type and :func:`read_turn_events`, which :meth:`Client.events <world_core.Client.events>`
returns.

Resuming: ``after=p`` yields the events after position ``p``, so a reader that saw ``p`` and
lost its connection misses nothing and sees nothing twice. Runs of the turn on other workers
(after a crash, a lost lease, a wait) append to the same stream: a ``resumed`` event, then the
steps read back from the journal as ``step_replayed``, then new work.

The stream is a best-effort live view; the journal is the truth. An event the publisher could
not write is logged and dropped (a ``gap`` event says how many, when it can). So that a reader
never waits for an end the stream will not show, the reader also watches the journal: when
the turn has a reply or a failure and the stream shows no end for a few seconds (or the stream
was closed without one), it yields the end from the journal (``source="journal"``) and stops.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Literal

import anyio
from pydantic import BaseModel, ConfigDict

from world_core.errors import InvalidArgumentError, NotFoundError
from world_core.journal._journal import check_turn_id, session_log_id
from world_core.spi import MAX_ID_BYTES, World

if TYPE_CHECKING:
    from world_core.journal._client import Client

__all__ = [
    "END_EVENTS",
    "EVENT_TYPES",
    "TurnEvent",
    "TurnEventType",
    "read_turn_events",
    "turn_events_stream",
]

TurnEventType = Literal[
    "started",
    "resumed",
    "step_started",
    "step_finished",
    "step_replayed",
    "text",
    "state",
    "run_ended",
    "reply",
    "failed",
    "gap",
]
# why: the members of a Literal type: typing has no public accessor
EVENT_TYPES: tuple[str, ...] = TurnEventType.__args__  # type: ignore[attr-defined]

END_EVENTS = frozenset({"reply", "failed"})
"""The events that end a turn's stream (the stream is closed after them)."""

CHECK_SECONDS = 3.0
"""How often an idle reader looks at the journal for an end the stream has not shown."""


class TurnEvent(BaseModel):
    """One event of a turn's live stream.

    Attributes:
        position: the event's index in the stream (pass it as ``after`` to resume).
        type: ``started`` / ``resumed`` (a run begins: fresh, or taken over after a crash, a
            lost lease, a retry or a wait; ``step`` is where its new work starts),
            ``step_started``, ``step_finished``, ``step_replayed`` (read back from the journal:
            nothing ran), ``text`` (a piece of the model's reply as it streams), ``state`` (a
            value a tool committed: a document, a file tree), ``run_ended`` (this run stopped;
            ``status`` says why, a later run goes on), ``reply`` and ``failed`` (the turn's
            end: the stream ends), ``gap`` (``dropped`` events could not be published).
        at: when it was published (UNIX time, the publisher's clock).
        worker, attempt: the worker running the turn and its delivery of the turn (1 first).
        step, kind, name: the step (``model``, ``tool``, ``timer`` ...) for step events.
        replay, key, call_id, model: a tool's label, its idempotency key, the model's id for
            the call; the model's name.
        arguments: a tool call's arguments (``step_started``), cut to a preview when long.
        output, error, interrupted: a finished step's result (``interrupted``: a call that
            may or may not have happened); ``output`` is cut to a preview when long.
        recorded: the step's outcome is durable (False: it rides with the next write).
        text: the streamed text (``text``; ``retry`` counts the model client's retries: text
            of an earlier retry was abandoned) or the reply (``reply``).
        state_name, value: the committed value (``state``), None when too long to carry.
        status, error: why a run ended (``run_ended``); the failure (``failed``).
        wake: a ``resumed`` run was woken from a wait.
        dropped: events lost before a ``gap``.
        truncated: ``output``, ``arguments`` or ``value`` was cut.
        source: ``stream``, or ``journal`` for an end read from the journal (see the module).
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    position: int
    type: TurnEventType
    at: float = 0.0
    worker: str | None = None
    attempt: int | None = None
    step: int | None = None
    kind: str | None = None
    name: str | None = None
    replay: str | None = None
    key: str | None = None
    call_id: str | None = None
    model: str | None = None
    arguments: Any = None
    output: Any = None
    error: str | None = None
    interrupted: bool = False
    recorded: bool | None = None
    text: str | None = None
    retry: int | None = None
    state_name: str | None = None
    value: Any = None
    status: str | None = None
    wake: bool | None = None
    dropped: int | None = None
    truncated: bool = False
    source: Literal["stream", "journal"] = "stream"

    def encode(self) -> bytes:
        """The chunk this event is stored as (JSON without ``position``: that is the index)."""
        data = self.model_dump(mode="json", exclude={"position"}, exclude_defaults=True)
        data["type"] = self.type
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode(
            "utf-8", "surrogatepass"
        )

    @classmethod
    def decode(cls, position: int, data: bytes) -> TurnEvent:
        """The event stored as ``data`` at ``position``; a chunk that is not an event (written
        by a newer or foreign publisher) becomes a ``gap`` of one."""
        try:
            body = json.loads(data.decode("utf-8", "surrogatepass"))
            if isinstance(body, dict):
                return cls.model_validate({**body, "position": position})
        except ValueError:
            pass
        return cls(position=position, type="gap", dropped=1)


def turn_events_stream(session_id: str, turn_id: str) -> str:
    """The id of the stream a turn's live events are published on:
    ``turn-events/<session>/<turn>``, or a digest of it when that is too long for an id."""
    session_log_id(session_id)
    check_turn_id(turn_id)
    stream_id = f"turn-events/{session_id}/{turn_id}"
    if len(stream_id.encode("utf-8")) <= MAX_ID_BYTES:
        return stream_id
    digest = hashlib.sha256(f"{session_id}\x00{turn_id}".encode()).hexdigest()
    return f"turn-events-sha256/{digest}"


def read_turn_events(
    client: Client,
    world: World,
    session_id: str,
    turn_id: str,
    *,
    after: int | None = None,
    timeout: float = 300.0,
) -> AsyncIterator[TurnEvent]:
    """Follow a turn's events: those stored after ``after``, then new ones as they come,
    until the turn's end (a ``reply`` or ``failed`` event, the last one yielded).

    Args:
        after: the position of the last event seen (None: from the first).
        timeout: seconds to wait for the next event; past them, ``TimeoutError``.

    Raises:
        InvalidIdentifierError, InvalidArgumentError: bad ids, ``after`` or ``timeout``;
            raised by the call, before anything is read.
        TimeoutError: by the iterator, when no event came for ``timeout`` seconds and the
            turn has not ended.
        NotFoundError: by the iterator, when no event came and the turn was never submitted
            (found at the first look at the journal, within :data:`CHECK_SECONDS`).
    """
    stream_id = turn_events_stream(session_id, turn_id)
    if after is not None and (isinstance(after, bool) or not isinstance(after, int) or after < -1):
        raise InvalidArgumentError(
            f"after must be None or the position of an event seen (an int >= -1), got {after!r}"
        )
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise InvalidArgumentError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    start = 0 if after is None else after + 1
    return _follow(client, world, session_id, turn_id, stream_id, start, idle=float(timeout))


async def _follow(
    client: Client,
    world: World,
    session_id: str,
    turn_id: str,
    stream_id: str,
    start: int,
    *,
    idle: float,
) -> AsyncIterator[TurnEvent]:
    position = start
    idle_since = anyio.current_time()
    ended_seen = 0  # idle checks in a row that found the turn ended in the journal
    while True:
        reader = world.stream.read(stream_id, start=position)
        try:
            while True:
                wait = min(CHECK_SECONDS, max(0.0, idle_since + idle - anyio.current_time()))
                chunk = None
                with anyio.move_on_after(wait):
                    chunk = await anext(reader, _CLOSED)
                if chunk is None:
                    break  # idle: look at the journal (below), then read again
                if chunk is _CLOSED:
                    # Closed without its end event (a publisher whose writes failed): the
                    # journal knows how the turn ended.
                    end = await _journal_end(client, session_id, turn_id, position)
                    if end is not None:
                        yield end
                    return
                assert not isinstance(chunk, _Closed)
                event = TurnEvent.decode(chunk.index, chunk.data)
                position = chunk.index + 1
                idle_since = anyio.current_time()
                ended_seen = 0
                yield event
                if event.type in END_EVENTS:
                    return
        finally:
            close = getattr(reader, "aclose", None)
            if close is not None:
                await close()
        end = await _journal_end(client, session_id, turn_id, position)
        if end is not None:
            ended_seen += 1
            if ended_seen >= 2:  # the publisher had a check's time to show the end
                yield end
                return
        elif anyio.current_time() >= idle_since + idle:
            raise TimeoutError(
                f"no event of turn {turn_id!r} of session {session_id!r} for {idle:g} s "
                f"(after position {position - 1}) and the turn has not ended; follow it again "
                f"with after={position - 1}"
            )


class _Closed:
    pass


_CLOSED: Any = _Closed()


async def _journal_end(
    client: Client, session_id: str, turn_id: str, position: int
) -> TurnEvent | None:
    """The turn's end as the journal holds it, or None while it has none."""
    status = await client.status(session_id, turn_id)
    if status == "unknown":
        raise NotFoundError(
            f"turn {turn_id!r} of session {session_id!r} was never submitted; follow the turn "
            "id Client.submit returned"
        )
    if status == "done":
        reply = await client.reply(session_id, turn_id)
        return TurnEvent(position=position, type="reply", text=reply, source="journal")
    if status == "failed":
        failure = await client.failure(session_id, turn_id)
        error = None if failure is None else str(failure)
        return TurnEvent(position=position, type="failed", error=error, source="journal")
    return None
