"""The session as the journal sees it, read in bounded time from its latest checkpoint.

A session log grows with every turn; what a turn needs of it does not: the turns not finished
yet (their order, parks, kicks, waits), the last few finished turns (history), the session's
state, and the signals no wait consumed yet. Each turn's end (its reply or failure) carries a
*checkpoint*: that view as of the log position where the ending turn's Journal read it
(``as_of``), with finished turns beyond the last :data:`HISTORY_WINDOW` dropped. A reader
finds the latest checkpoint near the tail (:data:`CHECKPOINT_SEARCH` events back, then
further), and applies the events after ``as_of`` to it: the cost is that of the turns since,
not of the session's length.

A reader that needs more than a checkpoint holds (older history, the steps of a turn that
ran before the checkpoint was taken, a finished turn's full past) reads the whole log
instead (:func:`read_session` with ``full=True``).
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from world_core.journal._waits import WAIT_KINDS
from world_core.spi import Event, NewEvent, OutboxMessage, World, validate_id

__all__ = [
    "CHECKPOINT_SEARCH",
    "CONTINUED_KEY",
    "CHECKPOINT_HISTORY_BYTES",
    "HISTORY_WINDOW",
    "SessionView",
    "append_session",
    "current_log",
    "decode_event",
    "generation_log_id",
    "read_session",
    "scan_session",
    "session_chain",
    "session_log_id",
    "turn_log",
]

HISTORY_WINDOW = 100
"""Finished turns a checkpoint keeps at most (message and reply or failure): the history a
turn can have without reading the whole log."""

CHECKPOINT_HISTORY_BYTES = 16 * 1024
"""The bytes of finished turns a checkpoint keeps at most (the newest first): each turn's end
writes one, so this bounds what the checkpoints add to the log per turn. Values above the blob
threshold are blob references there, so a long reply costs a few dozen bytes."""

CHECKPOINT_SEARCH = 8
"""Events read back from the tail to find the latest checkpoint (eight times more on each
further try, up to the whole log): the previous turn's end is usually among the last few."""


def decode_event(data: bytes) -> dict[str, Any] | None:
    """A journal event's JSON body, or None for an event that is not one (the session log may
    carry other events)."""
    try:
        body = json.loads(data)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


@dataclass
class SessionView:
    """What the session log says about its turns, as of ``tail``."""

    tail: int = 0
    inputs: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    """turn -> (seq of its input, the input event's body)"""
    replies: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    failures: dict[str, dict[str, Any]] = field(default_factory=dict)
    parks: dict[str, list[str]] = field(default_factory=dict)
    """turn -> ids of the queue messages handed on while an earlier turn ran, in order"""
    kicks: dict[str, int] = field(default_factory=dict)
    """turn -> messages sent to run it once the turns before it had ended"""
    state: dict[str, dict[str, Any]] = field(default_factory=dict)
    signals: list[dict[str, Any]] = field(default_factory=list)
    """the bodies of the signals no wait consumed yet, in log order"""
    open_waits: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    """(turn, step) -> the intent of a wait that has no outcome yet"""
    started: set[str] = field(default_factory=set)
    """unfinished turns with at least one step recorded"""
    pruned: bool = False
    """True when finished turns before the kept ones were dropped (a checkpoint's view)"""
    checkpoint_started: frozenset[str] = frozenset()
    """the turns the checkpoint this view grew from lists as started: their first steps are
    before it, so a Journal of one of them reads the whole log"""
    checkpointed: bool = False
    """True when the view grew from a checkpoint (not from the whole log)"""
    bytes: int = 0
    """bytes of event data in this generation of the session log"""
    summary: str | None = None
    """the summary of earlier generations (continue-as-new), if the agent wrote one"""

    def finished(self, turn_id: str) -> bool:
        return turn_id in self.replies or turn_id in self.failures

    def in_order(self) -> list[str]:
        """The submitted turns it knows, in submission order (the order of their inputs)."""
        return [turn for turn, _ in sorted(self.inputs.items(), key=lambda item: item[1][0])]

    def signal_for(self, name: str, turn_id: str, *, addressed: bool) -> dict[str, Any] | None:
        """The first signal ``name`` no wait consumed yet that a wait of ``turn_id`` takes:
        one addressed to that turn, or (unless the wait takes only those: ``addressed``) to
        the session."""
        for body in self.signals:
            if body.get("name") != name:
                continue
            target = body.get("turn")
            if target == turn_id or (target is None and not addressed):
                return body
        return None

    def earliest_unfinished(self, before: str | None = None) -> str | None:
        """The first submitted turn without a reply or failure (only among those submitted
        before ``before``, when given): the one turn of the session that may run now."""
        for turn in self.in_order():
            if turn == before:
                return None
            if not self.finished(turn):
                return turn
        return None

    def apply(self, event: Event) -> None:
        """Take one more event of the log into the view."""
        body = decode_event(event.data)
        self.tail = max(self.tail, event.seq)
        self.bytes += len(event.data)
        if body is None:
            return
        what, turn_of = body.get("t"), str(body.get("turn"))
        if what == "state":
            self.state[str(body.get("name"))] = body
        elif what == "doc":  # written before state events existed
            self.state[f"doc/{body.get('name')}"] = body
        elif what == "input":
            self.inputs[turn_of] = (event.seq, body)
        elif what == "reply":
            self.replies[turn_of] = (event.seq, body)
            self._ended(turn_of)
        elif what == "failure":
            self.failures[turn_of] = body
            self._ended(turn_of)
        elif what == "park":
            self.parks.setdefault(turn_of, []).append(str(body.get("message")))
        elif what == "kick":
            self.kicks[turn_of] = self.kicks.get(turn_of, 0) + 1
        elif what == "signal":
            self.signals.append(body)
        elif what in ("intent", "outcome"):
            if not self.finished(turn_of):
                self.started.add(turn_of)
            if body.get("kind") not in WAIT_KINDS:
                return
            step = int(body["step"])
            if what == "intent":
                self.open_waits[turn_of, step] = body
                return
            self.open_waits.pop((turn_of, step), None)
            consumed = body.get("result", {}).get("signal")
            if isinstance(consumed, dict):
                gone = str(consumed.get("signal_id"))
                self.signals = [s for s in self.signals if str(s.get("id")) != gone]

    def _ended(self, turn: str) -> None:
        self.started.discard(turn)
        for key in [key for key in self.open_waits if key[0] == turn]:
            del self.open_waits[key]

    def checkpoint(self, as_of: int) -> dict[str, Any]:
        """This view as a checkpoint body (as of log position ``as_of``): finished turns
        beyond the last :data:`HISTORY_WINDOW` dropped."""
        order = self.in_order()
        finished = [turn for turn in order if self.finished(turn)]
        kept = finished[-HISTORY_WINDOW:]
        budget = CHECKPOINT_HISTORY_BYTES
        for index in range(len(kept) - 1, -1, -1):  # newest first, within the byte budget
            budget -= self._size(kept[index])
            if budget < 0:
                kept = kept[index + 1 :]
                break
        keep = set(kept) | {t for t in order if not self.finished(t)}
        return {
            "t": "checkpoint",
            "as_of": as_of,
            "inputs": {t: list(self.inputs[t]) for t in order if t in keep},
            "replies": {t: list(v) for t, v in self.replies.items() if t in keep},
            "failures": {t: v for t, v in self.failures.items() if t in keep},
            "parks": {t: v for t, v in self.parks.items() if not self.finished(t)},
            "kicks": {t: v for t, v in self.kicks.items() if not self.finished(t)},
            "state": self.state,
            "signals": self.signals,
            "open_waits": [[t, n, intent] for (t, n), intent in self.open_waits.items()],
            "started": sorted(self.started),
            "pruned": self.pruned or len(kept) < len(finished),
            "bytes": self.bytes,
            "summary": self.summary,
        }

    def _size(self, turn: str) -> int:
        """The bytes a finished turn's input and reply (or failure) add to a checkpoint."""
        parts: list[Any] = [self.inputs[turn][1]]
        parts.append(self.replies[turn][1] if turn in self.replies else self.failures.get(turn))
        return sum(len(json.dumps(part, separators=(",", ":"))) for part in parts)

    @classmethod
    def from_checkpoint(cls, body: dict[str, Any]) -> SessionView:
        started = {str(t) for t in body.get("started", [])}
        return cls(
            tail=int(body["as_of"]),
            inputs={t: (int(v[0]), v[1]) for t, v in body.get("inputs", {}).items()},
            replies={t: (int(v[0]), v[1]) for t, v in body.get("replies", {}).items()},
            failures=dict(body.get("failures", {})),
            parks={t: list(v) for t, v in body.get("parks", {}).items()},
            kicks={t: int(v) for t, v in body.get("kicks", {}).items()},
            state=dict(body.get("state", {})),
            signals=list(body.get("signals", [])),
            open_waits={(str(t), int(n)): intent for t, n, intent in body.get("open_waits", [])},
            started=set(started),
            pruned=bool(body.get("pruned")),
            checkpoint_started=frozenset(started),
            checkpointed=True,
            bytes=int(body.get("bytes") or 0),
            summary=None if body.get("summary") is None else str(body["summary"]),
        )


def scan_session(events: list[Event], base: SessionView | None = None) -> SessionView:
    """The view ``events`` give, applied to ``base`` (a checkpoint's view) or from nothing."""
    view = base if base is not None else SessionView()
    for event in events:
        view.apply(event)
    return view


async def read_session(
    world: World, log_id: str, *, full: bool = False
) -> tuple[SessionView, list[Event]]:
    """The session as of the log's tail, and the events read after the checkpoint it grew
    from (all events with ``full`` or when there is no checkpoint). Checkpoints stored as
    blobs are not read here: such a view is read whole (``full``)."""
    if full:
        events = await world.log.read(log_id)
        return _scan_generation(events), events
    tail = await world.log.tail(log_id)
    window = CHECKPOINT_SEARCH
    while True:
        after = max(0, tail - window)
        events = await world.log.read(log_id, after=after)
        for index in range(len(events) - 1, -1, -1):
            body = decode_event(events[index].data)
            if body is None or body.get("t") != "checkpoint":
                continue
            if "as_of" not in body or "inputs" not in body:
                break  # a checkpoint too large to be inline: read the whole log
            as_of = int(body["as_of"])
            if as_of < after:
                later = await world.log.read(log_id, after=as_of)
            else:
                later = [event for event in events if event.seq > as_of]
            return scan_session(later, SessionView.from_checkpoint(body)), later
        else:
            if after > 0:
                window *= 8
                continue
            return _scan_generation(events), events
        events = await world.log.read(log_id)
        return _scan_generation(events), events


def _scan_generation(events: list[Event]) -> SessionView:
    """The view of a whole log: from its first event when that is the checkpoint a
    continuation starts from (what the earlier generations carried over), else from nothing."""
    if events and events[0].key == CONTINUED_FROM_KEY:
        body = decode_event(events[0].data)
        if body is not None and "inputs" in body:
            base = SessionView.from_checkpoint(body)
            base.checkpointed = False  # a whole log: every step of its turns is here
            base.checkpoint_started = frozenset()
            return scan_session(events, base)
    return scan_session(events)


# -- generations (continue-as-new) ---------------------------------------------------------------

CONTINUED_KEY = "session/continued"
"""The key of the last event of a session log that was continued in a new one (``to``)."""

CONTINUED_FROM_KEY = "session/continued-from"
"""The key of the first event of a continuation: the checkpoint it starts from."""

_chains: weakref.WeakKeyDictionary[World, dict[str, list[str]]] = weakref.WeakKeyDictionary()
"""Per World, the chains of continued sessions seen last (a one-log chain is not kept: it is
known without looking; keeping every session's made a worker grow by its sessions)."""

CHAINS_KEPT = 4096
"""Continued sessions whose chain a process remembers per World; the oldest is dropped."""


def session_log_id(session_id: str) -> str:
    """The log of a session's first generation (and its id for listing): ``session/<id>``."""
    validate_id(session_id, "session_id")
    log_id = f"session/{session_id}"
    return validate_id(log_id, "session log id (session/<session_id>)")


def generation_log_id(session_id: str, generation: int, token: str) -> str:
    """The log of a continuation: fixed length whatever the session id (its first event
    names the session), unique per attempt (``token``)."""
    if generation == 0:
        return session_log_id(session_id)
    digest = hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"sessiongen/{digest}/{generation}-{token}"


async def session_chain(world: World, session_id: str) -> list[str]:
    """The logs of the session's generations, oldest first; the last is the current one.
    Follows the ``continued`` markers from where this process last saw the chain end (one
    keyed read when nothing changed)."""
    known = _chains.setdefault(world, {})
    chain = list(known.get(session_id) or [session_log_id(session_id)])
    while True:
        marker = await world.log.get(chain[-1], CONTINUED_KEY)
        if marker is None:
            break
        body = decode_event(marker.data) or {}
        chain.append(str(body["to"]))
    if len(chain) > 1:
        known.pop(session_id, None)  # to the end: the oldest seen is dropped first
        known[session_id] = chain
        if len(known) > CHAINS_KEPT:
            del known[next(iter(known))]
    return chain


async def current_log(world: World, session_id: str) -> str:
    """The log of the session's current generation."""
    return (await session_chain(world, session_id))[-1]


async def turn_log(world: World, session_id: str, turn_id: str) -> str:
    """The log holding turn ``turn_id``: the newest generation with its input (a turn lives
    in one generation; an input that landed in a generation already continued was written
    again to the next), else the current one."""
    chain = await session_chain(world, session_id)
    if len(chain) == 1:
        return chain[0]
    for log_id in reversed(chain):
        if await world.log.get(log_id, f"turn/{turn_id}/input") is not None:
            return log_id
    return chain[-1]


async def append_session(
    world: World,
    session_id: str,
    events: Sequence[NewEvent],
    *,
    messages: Sequence[OutboxMessage] = (),
    chain: Sequence[str] | None = None,
) -> str:
    """Append ``events`` (atomically, with ``messages`` where the World has an outbox) to the
    session's current generation (the end of ``chain``, when the caller just read it); returns
    that log. When the generation was continued just before the append landed (the marker is
    before it), the events are written again to the next one."""
    known = chain[-1] if chain else None
    while True:
        log_id = known if known is not None else await current_log(world, session_id)
        known = None
        tail = await world.log.append(log_id, events, messages=messages)
        marker = await world.log.get(log_id, CONTINUED_KEY)
        if marker is None or marker.seq > tail:
            # Not continued, or continued after these events: the continuation read them
            # (its marker is appended only on the tail it read) and carried them over.
            return log_id
