"""Deleting a session: everything that belongs to it, and nothing else.

What a session owns, all found from its id (nothing is kept to be found that way):

* its logs: ``session/<id>`` and its continuations (``sessiongen/<digest>/...``, the ones
  a continuation attempt left behind too);
* the live-event stream of each of its turns (:func:`turn_events_stream`);
* its blobs and their index (see :mod:`world_core.journal._blobs`: a session's blobs are
  its own, so deleting them takes nothing another session reads; blobs written before
  sessions owned theirs are shared and kept);
* the logs other layers keep per session under ``<kind>/<digest>/`` for each kind in
  :data:`SESSION_LOG_KINDS` (the documents' head logs, ``dochead/<digest>/<name>``).

``<digest>`` is the first 32 hex digits of the sha-256 of the session id. Queue messages
are not the session's: a finished turn's message was acked, and the dead letters of its
turns stay for an operator (requeuing one after the deletion records its failure, "no
input", in a new session of that id). Child sessions a turn started are sessions of their
own.

Order, so a crash half-way is finished by calling again: the streams first (their turn ids
are read from the logs), then the blobs (the index goes after them), then the other logs,
the first log last: until it is gone the session is still listed, so an operator sees the
deletion is not finished, and calling again deletes what is left. Every delete is a no-op on
what is gone, so calling again is always safe.
"""

from __future__ import annotations

import hashlib

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
    """Delete the session and everything it owns (see the module); a session that does not
    exist (or is already deleted) is a no-op.

    A session with a turn not finished (queued, running or waiting) is refused: its worker
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
    root = session_log_id(session_id)
    digest = session_digest(session_id)
    chain = await session_chain(world, session_id)
    if not force:
        view, _ = await read_session(world, chain[-1])
        open_turn = view.earliest_unfinished()
        if open_turn is not None:
            raise TurnNotReadyError(
                f"turn {open_turn!r} of session {session_id!r} is not finished: wait for it "
                "(Client.wait) and delete the session then, or pass force=True to delete it "
                "under a worker that may write again",
                waiting_for=open_turn,
            )
    owned = [log_id for kind in SESSION_LOG_KINDS for log_id in await _logs(world, kind, digest)]
    turns: set[str] = set()
    for log_id in [root, *(log_id for log_id in owned if log_id.startswith("sessiongen/"))]:
        for event in await world.log.read(log_id):
            key = event.key or ""
            if key.startswith("turn/") and key.endswith("/input"):
                turns.add(key[len("turn/") : -len("/input")])
    for turn in sorted(turns):
        await world.stream.delete(turn_events_stream(session_id, turn))
    await session_blobs(world, session_id).delete_all()
    for log_id in owned:  # in any order: a chain cut short ends at an empty log
        await world.log.delete(log_id)
    await world.log.delete(root)
    _chains.get(world, {}).pop(session_id, None)


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
