"""Continue-as-new: a session whose log grew past a limit goes on in a fresh log.

After a turn ends, the worker checks the size of the session's current log (events and bytes,
which every checkpoint carries). Past :attr:`HistoryLimits.warn_fraction` of a limit it logs a
warning; past the limit, and only when no turn of the session is open (none queued, none
waiting, so nothing is half done), it continues the session:

1. the agent's ``summarize(previous_summary, turns)`` hook, if it has one, writes a summary of
   the generation's finished turns (read once, whole);
2. a new log starts with a checkpoint that carries what the agent keeps: the summary, the last
   ``carry_turns`` turns, the session's state and the signals no wait has consumed, and
   names its predecessor (documents need nothing carried: their head logs name the log of
   each version, and a read follows the chain);
3. the old log gets a ``continued`` marker naming the new one, appended only if the old log
   did not move since it was read (``expect_tail``): a turn submitted meanwhile makes the
   attempt give up (the new log is deleted) and the next turn's end tries again.

Clients, workers and tools find a session's current log by following the markers from its
first one (``session/<id>``), which each process remembers, so it costs one keyed read when
nothing changed; a write that lands in a log just continued is written again to the next one
(:func:`~world_core.journal._session.append_session`). Each generation is a log of its own that
can be exported, archived or deleted; replay and traces follow the chain
(:func:`~world_core.journal._session.session_chain`).

Limits: signal ids deduplicate within a generation (a retry of a signal sent before the
continuation, arriving after it, counts again); history the agent did not carry is only in the
summary and in the old logs.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from world_core.errors import ConfigurationError, ConflictError, DuplicateKeyError
from world_core.journal._blobs import session_blobs
from world_core.journal._journal import PastTurn, canonical_json, past_turn
from world_core.journal._session import (
    CONTINUED_FROM_KEY,
    CONTINUED_KEY,
    SessionView,
    generation_log_id,
    read_session,
    session_chain,
)
from world_core.spi import NewEvent, World

__all__ = ["HistoryLimits", "Summarize", "maybe_continue"]

log = logging.getLogger("world.journal")

Summarize = Callable[[str | None, list[PastTurn]], str | Awaitable[str | None] | None]
"""``summarize(previous_summary, turns) -> summary``: the agent's summary of a generation's
finished turns (and of the summary before them), carried into the next generation."""


@dataclass(frozen=True)
class HistoryLimits:
    """When a session continues in a fresh log (Temporal warns at 10,240 events or 10 MB and
    fails at 51,200 or 50 MB; this continues at the warning sizes by default).

    Environment: ``WORKFLOW_HISTORY_MAX_EVENTS``, ``WORKFLOW_HISTORY_MAX_BYTES``.
    """

    max_events: int = 10_240
    max_bytes: int = 10 * 1024 * 1024
    warn_fraction: float = 0.8
    """A warning is logged once a log passes this fraction of a limit."""

    def __post_init__(self) -> None:
        for name in ("max_events", "max_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"HistoryLimits.{name} must be an int >= 1, got {value!r}")
        fraction = self.warn_fraction
        if not isinstance(fraction, int | float) or not math.isfinite(fraction):
            raise ConfigurationError(f"warn_fraction must be a number, got {fraction!r}")
        if not 0 < fraction <= 1:
            raise ConfigurationError(f"warn_fraction must be in (0, 1], got {fraction!r}")

    @classmethod
    def from_env(cls) -> HistoryLimits:
        """The defaults, or ``WORKFLOW_HISTORY_MAX_EVENTS`` / ``_MAX_BYTES`` when set."""
        values: dict[str, int] = {}
        for field, variable in (
            ("max_events", "WORKFLOW_HISTORY_MAX_EVENTS"),
            ("max_bytes", "WORKFLOW_HISTORY_MAX_BYTES"),
        ):
            raw = os.environ.get(variable, "").strip()
            if not raw:
                continue
            try:
                values[field] = int(raw)
            except ValueError:
                raise ConfigurationError(
                    f"{variable}={raw!r} is not a whole number; unset it or give a count"
                ) from None
            if values[field] < 1:
                raise ConfigurationError(f"{variable} must be >= 1, got {raw!r}")
        return cls(**values)


async def maybe_continue(
    world: World,
    session_id: str,
    *,
    limits: HistoryLimits,
    summarize: Summarize | None = None,
    carry_turns: int = 20,
) -> str | None:
    """Continue the session in a fresh log if its current one passed ``limits`` and no turn
    of it is open; the new log's id, or None (nothing to do, or not now)."""
    chain = await session_chain(world, session_id)
    log_id = chain[-1]
    view, _ = await read_session(world, log_id)
    events, size = view.tail, view.bytes
    if events < limits.max_events and size < limits.max_bytes:
        warn_events = limits.max_events * limits.warn_fraction
        if events >= warn_events or size >= limits.max_bytes * limits.warn_fraction:
            log.warning(
                "session %s: its log holds %d events, %d bytes; it continues in a new log at "
                "%d events or %d bytes",
                session_id,
                events,
                size,
                limits.max_events,
                limits.max_bytes,
            )
        return None
    if view.earliest_unfinished() is not None or view.open_waits:
        log.warning(
            "session %s passed its history limit (%d events, %d bytes) but a turn is open; "
            "it continues once none is",
            session_id,
            events,
            size,
        )
        return None
    summary = view.summary
    if summarize is not None:
        whole, _ = await read_session(world, log_id, full=True)
        made = summarize(summary, await _finished_turns(world, session_id, whole))
        summary = await made if inspect.isawaitable(made) else made
        if summary is not None and not isinstance(summary, str):
            raise ConfigurationError(
                f"the agent's summarize hook returned {type(summary).__name__}, not a str or None"
            )
    body = _carried(view, carry_turns, summary)
    body.update(continued_from=log_id, generation=len(chain), session=session_id)
    new_id = generation_log_id(session_id, len(chain), uuid.uuid4().hex[:12])
    await world.log.append(
        new_id, [NewEvent(key=CONTINUED_FROM_KEY, data=canonical_json(body))], expect_tail=0
    )
    marker = {"t": "continued", "to": new_id, "generation": len(chain), "events": events}
    try:
        await world.log.append(
            log_id,
            [NewEvent(key=CONTINUED_KEY, data=canonical_json(marker))],
            expect_tail=view.tail,
        )
    except (ConflictError, DuplicateKeyError):
        await world.log.delete(new_id)  # a write came first: the next turn's end tries again
        return None
    log.info(
        "session %s continued in %s (generation %d) after %d events, %d bytes",
        session_id,
        new_id,
        len(chain),
        events,
        size,
    )
    await session_chain(world, session_id)  # remember the new end of the chain
    return new_id


def _carried(view: SessionView, carry_turns: int, summary: str | None) -> dict[str, Any]:
    """The new log's first checkpoint: state, signals, the last ``carry_turns`` turns (their
    positions renumbered before the new log's first event), the summary."""
    order = view.in_order()
    kept = order[len(order) - carry_turns :] if carry_turns else []
    body = view.checkpoint(as_of=0)
    body["inputs"] = {
        turn: [index - len(kept), view.inputs[turn][1]] for index, turn in enumerate(kept)
    }
    body["replies"] = {
        turn: [index - len(kept), view.replies[turn][1]]
        for index, turn in enumerate(kept)
        if turn in view.replies
    }
    body["failures"] = {turn: view.failures[turn] for turn in kept if turn in view.failures}
    body.update(parks={}, kicks={}, open_waits=[], started=[], bytes=0, summary=summary)
    body["pruned"] = len(kept) < len(order) or view.pruned
    return body


async def _finished_turns(world: World, session_id: str, view: SessionView) -> list[PastTurn]:
    blobs = session_blobs(world, session_id)
    return [await past_turn(blobs, view, t) for t in view.in_order() if view.finished(t)]
