"""Deleting a session: everything that belongs to it, and nothing else.

What a session owns, all found from its id (nothing is kept to be found that way):

* its logs: ``session/<id>`` and its continuations (``sessiongen/<digest>/...``, the ones
  a continuation attempt left behind too);
* the live-event stream of each of its turns (:func:`turn_events_stream`);
* its blobs and their index (see :mod:`world_core.journal._blobs`: a session's blobs are
  its own, so deleting them takes nothing another session reads; blobs written before
  sessions owned theirs are shared and kept);
* the logs other layers keep per session under ``<kind>/<digest>/`` for each kind in
  :data:`SESSION_LOG_KINDS` (the documents' head logs, ``dochead/<digest>/<name>``);
* the child sessions its turns started (``Journal.start_child``: sub-agent runs, sessions
  no one else names), found from the outcomes of those steps, and theirs in turn.

``<digest>`` is the first 32 hex digits of the sha-256 of the session id. Queue messages
are not the session's: a finished turn's message was acked, and the dead letters of its
turns stay for an operator (they hold the session and turn ids only, no content; the queue
has no way to delete one; requeuing one after the deletion records its failure, "no input",
in a new session of that id). A child whose start was cut short by a crash before its step
was recorded, in a turn that was then deleted with ``force`` instead of run again, is not
found: it is left as a session of its own.

Order, so a crash half-way is finished by calling again: nothing is deleted before every
session of the tree was checked for unfinished turns; the children first (the parent's logs
say which they are), then the streams (their turn ids are read from the logs), then the
blobs (the index goes after them), then the other logs, the first log last: until it is gone
the session is still listed, so an operator sees the deletion is not finished, and calling
again deletes what is left. Every delete is a no-op on what is gone, so calling again is
always safe.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from world_core.errors import TurnNotReadyError
from world_core.journal._blobs import session_blobs
from world_core.journal._live import turn_events_stream
from world_core.journal._session import (
    _chains,
    read_session,
    session_chain,
    session_log_id,
)
from world_core.spi import MAX_LIST_LIMIT, World

__all__ = ["SESSION_LOG_KINDS", "delete_session", "session_digest"]

SESSION_LOG_KINDS: tuple[str, ...] = ("sessiongen", "dochead")
"""The kinds of log a session owns beside its first one, each under ``<kind>/<digest>/``:
its continuations and its documents' head logs. A layer that keeps logs of its own per
session names them so and adds its kind here."""


def session_digest(session_id: str) -> str:
    """The first 32 hex digits of the sha-256 of the session id: the part of the ids of
    what a session owns beside its first log that names it."""
    session_log_id(session_id)
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


async def delete_session(world: World, session_id: str, *, force: bool = False) -> None:
    """Delete the session and everything it owns (see the module), the child sessions its
    turns started included; a session that does not exist (or is already deleted) is a no-op.
    The dead letters of its turns are kept (they hold no content).

    A session (or child session) with a turn not finished (queued, running or waiting) is
    refused, before anything is deleted: its worker
    would write again after the deletion and bring part of it back. ``force`` deletes it
    anyway (an abandoned turn); a worker still running one of its turns may then recreate
    its log. Writers that start during the deletion (a submit, an app's document edit) are
    not stopped: what they write is a new session of the same id. A process that saw the
    session continued remembers its chain (see ``session_chain``): this process forgets it
    here; before reusing a deleted session's id, restart the others that ran its turns.

    Raises:
        TurnNotReadyError: a turn of the session is not finished (``waiting_for``); wait for
            it (``Client.wait``), or pass ``force=True``.
        InvalidIdentifierError: a bad session id.
    """
    # Each session after its parent (a stack, not recursion: sub-agents may nest deeply).
    tree: list[_Owned] = []
    seen = {session_id}
    pending = [session_id]
    while pending:
        owned, children = await _gather(world, pending.pop(), force, session_id)
        tree.append(owned)
        for child in children:
            if child not in seen:
                seen.add(child)
                pending.append(child)
    for owned in reversed(tree):  # children before their parent
        for turn in sorted(owned.turns):
            await world.stream.delete(turn_events_stream(owned.session_id, turn))
        await session_blobs(world, owned.session_id).delete_all()
        for log_id in owned.logs:  # in any order: a chain cut short ends at an empty log
            await world.log.delete(log_id)
        await world.log.delete(session_log_id(owned.session_id))
        _chains.get(world, {}).pop(owned.session_id, None)


@dataclass
class _Owned:
    """What one session of the tree owns beside its first log."""

    session_id: str
    logs: list[str]
    turns: set[str]


async def _gather(world: World, session_id: str, force: bool, top: str) -> tuple[_Owned, list[str]]:
    """What ``session_id`` owns, and the child sessions its turns started; refuse a session
    of the tree (of ``top``) with an unfinished turn unless ``force``."""
    root = session_log_id(session_id)
    chain = await session_chain(world, session_id)
    if not force:
        view, _ = await read_session(world, chain[-1])
        open_turn = view.earliest_unfinished()
        if open_turn is not None:
            whose = "" if session_id == top else f" (a child session of {top!r})"
            raise TurnNotReadyError(
                f"turn {open_turn!r} of session {session_id!r}{whose} is not finished: wait "
                "for it (Client.wait) and delete the session then, or pass force=True to "
                "delete it under a worker that may write again",
                waiting_for=open_turn,
            )
    digest = session_digest(session_id)
    owned = _Owned(
        session_id,
        [log_id for kind in SESSION_LOG_KINDS for log_id in await _logs(world, kind, digest)],
        set(),
    )
    children: list[str] = []
    for log_id in [root, *(log_id for log_id in owned.logs if log_id.startswith("sessiongen/"))]:
        for event in await world.log.read(log_id):
            key = event.key or ""
            if key.startswith("turn/") and key.endswith("/input"):
                owned.turns.add(key[len("turn/") : -len("/input")])
            elif key.startswith("turn/") and key.endswith("/outcome"):
                child = _spawned(event.data)
                if child is not None:
                    children.append(child)
    return owned, children


def _spawned(data: bytes) -> str | None:
    """The child session a step's outcome says it started (``Journal.start_child``)."""
    body = json.loads(data)
    if body.get("kind") != "spawn":
        return None
    result = body.get("result")
    child = result.get("output") if isinstance(result, dict) else None
    return child if isinstance(child, str) else None


async def _logs(world: World, kind: str, digest: str) -> list[str]:
    found: list[str] = []
    cursor: str | None = None
    while True:
        page = await world.log.list_logs(
            prefix=f"{kind}/{digest}/", cursor=cursor, limit=MAX_LIST_LIMIT
        )
        found.extend(info.log_id for info in page.items)
        cursor = page.next_cursor
        if cursor is None:
            return found
