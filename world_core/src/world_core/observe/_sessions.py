"""Listing sessions, newest first: ``world sessions`` and the viewer's session list.

Sessions are enumerated with the SPI's log listing (``Log.list_logs(prefix="session/")``:
every session's first log), so no index of its own is kept. Each session costs a few reads:
the chain of its logs (one keyed read when it was never continued) and its current log's
view from the latest checkpoint (the last few events), whatever the session's length. The
listing is sorted by the time of each session's latest event, so every page reads every
session: fine for a developer's store, not meant for millions of sessions.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from world_core.errors import InvalidArgumentError
from world_core.journal import session_chain
from world_core.journal._session import read_session
from world_core.spi import World

__all__ = ["SESSION_STATUSES", "SessionPage", "SessionSummary", "list_sessions"]

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
    return SessionSummary(
        session=session,
        status=status,
        turns=len(order),
        last_turn=order[-1] if order else None,
        updated_at=updated,
        events=view.tail,
        logs=len(chain),
    )


def _cursor(offset: int, status: str | None) -> str:
    raw = json.dumps({"o": offset, "s": status}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _offset(cursor: str, status: str | None) -> int:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode()))
        offset = data["o"]
        if not isinstance(offset, int) or offset < 0 or data.get("s") != status:
            raise ValueError(cursor)
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise InvalidArgumentError(
            f"cursor {cursor!r} is not a next_cursor of this listing (with the same status "
            "filter); start again without one"
        ) from None
    return offset


async def list_sessions(
    world: World,
    *,
    status: str | None = None,
    limit: int = 20,
    cursor: str | None = None,
    page: int | None = None,
) -> SessionPage:
    """The World's sessions (in its namespace), newest first (latest event; sessions without
    recorded times last, by id).

    Args:
        status: only sessions with this status (see :data:`SESSION_STATUSES`).
        limit: sessions per page, 1 to 1000.
        cursor: the ``next_cursor`` of the previous page (with the same ``status``).
        page: instead of ``cursor``, the page number, from 1.

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
    offset = _offset(cursor, status) if cursor is not None else ((page or 1) - 1) * limit
    log_ids: list[str] = []
    next_page: str | None = None
    while True:
        listing = await world.log.list_logs(prefix=_PREFIX, cursor=next_page, limit=500)
        log_ids.extend(info.log_id for info in listing.items if info.tail > 0)
        next_page = listing.next_cursor
        if next_page is None:
            break
    summaries = [await _summary(world, log_id) for log_id in log_ids]
    if status is not None:
        summaries = [s for s in summaries if s.status == status]
    summaries.sort(key=lambda s: s.session)
    summaries.sort(key=lambda s: -(s.updated_at or 0.0))
    chosen = summaries[offset : offset + limit]
    more = offset + limit < len(summaries)
    return SessionPage(
        sessions=chosen, next_cursor=_cursor(offset + limit, status) if more else None
    )
