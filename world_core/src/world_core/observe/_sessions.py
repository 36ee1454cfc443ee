"""Listing sessions: ``world sessions`` and the viewer's session list.

Sessions are enumerated with the SPI's log listing (``Log.list_logs(prefix="session/")``:
every session's first log), so no index of its own is kept. Each session costs a few reads:
the chain of its logs (one keyed read when it was never continued) and its current log's
view from the latest checkpoint (the last few events), whatever the session's length.

Two orders:

* ``updated`` (the default): newest first, by the time of each session's latest event. No
  index knows that time, so every page reads every session; it holds at most ``offset +
  limit`` summaries, not the namespace's (a fixed size heap), but costs reads in proportion
  to the sessions. Fine for a developer's store.
* ``id``: by session id, a page at a time from the log listing: a page reads its ``limit``
  sessions (more with a ``status`` filter, those it skips) and the cursor resumes the log
  listing, so a namespace of millions of sessions is listed (``world sessions --all``)
  holding one page, at a cost per page that does not grow with the namespace.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from world_core.errors import InvalidArgumentError
from world_core.journal import session_chain
from world_core.journal._session import read_session
from world_core.spi import World

__all__ = ["SESSION_ORDERS", "SESSION_STATUSES", "SessionPage", "SessionSummary", "list_sessions"]

SessionOrder = Literal["updated", "id"]

SESSION_ORDERS: tuple[str, ...] = ("updated", "id")
"""How a listing is ordered (see the module): newest first, or by session id."""

SessionStatus = Literal["queued", "running", "waiting", "done", "failed", "empty"]

SESSION_STATUSES: tuple[str, ...] = ("queued", "running", "waiting", "done", "failed", "empty")
"""A session's status: its first running, waiting or queued turn's, else its last turn's
(``done`` or ``failed``); ``empty`` without a turn."""

MAX_LIMIT = 1000
_PREFIX = "session/"


class SessionSummary(BaseModel):
    """One session in a listing."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    session: str
    status: SessionStatus
    turns: int = Field(description="turns its current log knows (a checkpoint keeps the last 100)")
    last_turn: str | None = Field(description="the turn submitted last")
    updated_at: float | None = Field(description="UNIX time of its latest event, if recorded")
    events: int = Field(description="events in its current log")
    logs: int = Field(description="its logs (more than 1 once continued)")
    parent: str | None = Field(
        default=None,
        description="for a child run (Journal.start_child): the turn that started it, "
        "'<session>/<turn>'; None for a session of its own",
    )


class SessionPage(BaseModel):
    """A page of sessions, newest first; ``next_cursor`` fetches the next (None: the end)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sessions: list[SessionSummary]
    next_cursor: str | None = None


async def _summary(world: World, log_id: str) -> SessionSummary:
    session = log_id[len(_PREFIX) :]
    chain = await session_chain(world, session)
    view, _ = await read_session(world, chain[-1])
    order = view.in_order()
    statuses: list[SessionStatus] = []
    waiting = {turn for turn, _ in view.open_waits}
    for turn in order:
        if turn in view.replies:
            statuses.append("done")
        elif turn in view.failures:
            statuses.append("failed")
        elif turn in waiting:
            statuses.append("waiting")
        elif turn in view.started:
            statuses.append("running")
        else:
            statuses.append("queued")
    status: SessionStatus = "empty"
    open_ones: tuple[SessionStatus, ...] = ("running", "waiting", "queued")
    for candidate in open_ones:
        if candidate in statuses:
            status = candidate
            break
    else:
        if statuses:
            status = statuses[-1]
    updated = None
    if view.tail:
        last = await world.log.read(chain[-1], after=view.tail - 1)
        for event in last:
            try:
                body = json.loads(event.data)
            except ValueError:
                continue
            at = body.get("at") if isinstance(body, dict) else None
            if isinstance(at, int | float) and not isinstance(at, bool):
                updated = float(at)
        if updated is None:  # a checkpoint or an older event: take the newest time known
            times = [
                float(body["at"])
                for _, body in [*view.inputs.values(), *view.replies.values()]
                if isinstance(body.get("at"), int | float)
            ]
            updated = float(max(times)) if times else None
    parent = None
    for _, body in view.inputs.values():
        started_by = body.get("parent")
        if isinstance(started_by, dict):
            parent = f"{started_by.get('session')}/{started_by.get('turn')}"
            break
    return SessionSummary(
        parent=parent,
        session=session,
        status=status,
        turns=len(order),
        last_turn=order[-1] if order else None,
        updated_at=updated,
        events=view.tail,
        logs=len(chain),
    )


def _cursor(position: int | str, status: str | None) -> str:
    """An offset (newest first) or the log listing's cursor (by id), with the filter."""
    key = "o" if isinstance(position, int) else "c"
    raw = json.dumps({key: position, "s": status}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _position(cursor: str, status: str | None, order: str) -> Any:
    key = "o" if order == "updated" else "c"
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode()))
        position = data[key]
        offset_ok = isinstance(position, int) and not isinstance(position, bool) and position >= 0
        if not (offset_ok if key == "o" else isinstance(position, str)):
            raise ValueError(cursor)
        if data.get("s") != status:
            raise ValueError(cursor)
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise InvalidArgumentError(
            f"cursor {cursor!r} is not a next_cursor of this listing (same order and status "
            "filter); start again without one"
        ) from None
    return position


def _newest_first(summary: SessionSummary) -> tuple[float, str]:
    return (-(summary.updated_at or 0.0), summary.session)


async def list_sessions(
    world: World,
    *,
    status: str | None = None,
    limit: int = 20,
    cursor: str | None = None,
    page: int | None = None,
    order: SessionOrder = "updated",
) -> SessionPage:
    """The World's sessions (in its namespace), newest first (latest event; sessions without
    recorded times last, by id), or by id (see the module for what each costs).

    Args:
        status: only sessions with this status (see :data:`SESSION_STATUSES`).
        limit: sessions per page, 1 to 1000.
        cursor: the ``next_cursor`` of the previous page (same ``status`` and ``order``).
        page: instead of ``cursor``, the page number, from 1 (newest first only).
        order: ``updated`` (newest first) or ``id`` (pages without reading the others).

    Returns:
        A :class:`SessionPage`.

    Raises:
        InvalidArgumentError: an unknown status, a bad limit, page or cursor (nothing is read).
    """
    if status is not None and status not in SESSION_STATUSES:
        raise InvalidArgumentError(
            f"status must be one of {', '.join(SESSION_STATUSES)}, got {status!r}"
        )
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidArgumentError(f"limit must be an int from 1 to {MAX_LIMIT}, got {limit!r}")
    if page is not None and cursor is not None:
        raise InvalidArgumentError("give a page or a cursor, not both")
    if page is not None and (isinstance(page, bool) or not isinstance(page, int) or page < 1):
        raise InvalidArgumentError(f"page must be an int >= 1, got {page!r}")
    if order not in SESSION_ORDERS:
        raise InvalidArgumentError(
            f"order must be one of {', '.join(SESSION_ORDERS)}, got {order!r}"
        )
    if order == "id":
        if page is not None:
            raise InvalidArgumentError("page numbers are for order='updated': follow next_cursor")
        start = _position(cursor, status, order) if cursor is not None else None
        return await _by_id(world, status, limit, start)
    offset = _position(cursor, status, order) if cursor is not None else ((page or 1) - 1) * limit
    keep = offset + limit
    kept: list[SessionSummary] = []  # the newest ``keep`` so far (cut back at twice that)
    matching = 0
    next_page: str | None = None
    while True:
        listing = await world.log.list_logs(prefix=_PREFIX, cursor=next_page, limit=500)
        for info in listing.items:
            if info.tail == 0:
                continue
            summary = await _summary(world, info.log_id)
            if status is not None and summary.status != status:
                continue
            matching += 1
            kept.append(summary)
            if len(kept) >= 2 * keep:
                kept = sorted(kept, key=_newest_first)[:keep]
        next_page = listing.next_cursor
        if next_page is None:
            break
    chosen = sorted(kept, key=_newest_first)[offset:keep]
    more = keep < matching
    return SessionPage(sessions=chosen, next_cursor=_cursor(keep, status) if more else None)


async def _by_id(world: World, status: str | None, limit: int, start: str | None) -> SessionPage:
    """A page by session id: log listing pages of at most the sessions still wanted, each
    read whole, so the listing's own cursor is where the next page starts."""
    chosen: list[SessionSummary] = []
    position = start
    while len(chosen) < limit:
        listing = await world.log.list_logs(
            prefix=_PREFIX, cursor=position, limit=limit - len(chosen)
        )
        for info in listing.items:
            if info.tail == 0:
                continue
            summary = await _summary(world, info.log_id)
            if status is None or summary.status == status:
                chosen.append(summary)
        position = listing.next_cursor
        if position is None:
            break
    more = position is not None
    return SessionPage(
        sessions=chosen, next_cursor=_cursor(position, status) if more and position else None
    )
