"""The live event stream: an observer of each run that publishes the turn's progress.

:class:`LiveEvents` turns what a worker's run does (steps starting, finishing, replayed; the
model's text as it streams; committed state; how the run ended) into
:class:`~world_core.TurnEvent` chunks on the turn's World stream, which
:meth:`Client.events <world_core.Client.events>` follows. Every worker publishes it by default
(it is registered with :func:`~world_core.journal.add_default_observer` when this package is
imported, and ``import world_core`` imports it).

The decision, made once: **the events are a best-effort live view; the journal is the truth.**
Callbacks only queue an event in memory (bounded: past :data:`MAX_QUEUED` events, new ones are
dropped and a ``gap`` event counts them); a background task writes the queue in batches, at
most one write per :data:`FLUSH_INTERVAL`. A
write that fails is logged and dropped, never retried into the turn's time, and never fails
or slows the turn; a slow stream only delays the view. The trace (``world trace``) is rebuilt
from the journal, not from these events. Text deltas queued together are merged into one event.

Content: tool arguments, results and committed values are in the events (a chat app shows
them), each cut to a preview of :data:`PREVIEW_CHARS` characters (``truncated`` says so).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import anyio

from world_core.errors import ClosedError
from world_core.journal import (
    RunEnd,
    StepInfo,
    TurnEvent,
    TurnObserver,
    TurnRun,
    turn_events_stream,
)
from world_core.spi import World

__all__ = ["FLUSH_INTERVAL", "MAX_QUEUED", "PREVIEW_CHARS", "LiveEvents", "live_events"]

log = logging.getLogger("world.observe")

MAX_QUEUED = 10_000
"""Events a run may have waiting to be written; more are dropped (and counted in a ``gap``)."""

PREVIEW_CHARS = 4000
"""Characters of a tool's arguments or result, or a committed value, carried in an event."""

FLUSH_INTERVAL = 0.05
"""Seconds a run's publisher gathers events before a write (at most one write per interval)."""

_BATCH_BYTES = 1024 * 1024  # one stream write carries at most this much (the SPI allows 8 MiB)


def live_events(world: World, run: TurnRun) -> LiveEvents:
    """The observer factory the workers use by default (see :class:`LiveEvents`)."""
    return LiveEvents(world, run)


class LiveEvents(TurnObserver):
    """Publishes one run's events on the turn's stream (see the module docstring).

    Args:
        world: where the stream is.
        run: the run observed.
    """

    def __init__(self, world: World, run: TurnRun) -> None:
        self._world = world
        self._run = run
        self._stream = turn_events_stream(run.session_id, run.turn_id)
        self._queue: list[dict[str, Any]] = []
        self._dropped = 0
        self._wake = anyio.Event()
        self._lock = anyio.Lock()
        self._ended = False
        self._closed = False

    def __repr__(self) -> str:
        return f"LiveEvents({self._stream!r})"

    # -- callbacks (synchronous: queue only) -------------------------------------------------

    def _put(self, type_: str, **fields: Any) -> None:
        if self._closed:
            return
        if len(self._queue) >= MAX_QUEUED and type_ not in ("reply", "failed", "run_ended"):
            self._dropped += 1
            return
        if self._dropped and type_ != "gap":
            dropped, self._dropped = self._dropped, 0
            self._queue.append(self._body("gap", dropped=dropped))
        self._queue.append(self._body(type_, **fields))
        self._wake.set()

    def _body(self, type_: str, **fields: Any) -> dict[str, Any]:
        body = {"type": type_, "at": round(time.time(), 3), "worker": self._run.worker}
        body["attempt"] = self._run.attempt
        body.update({k: v for k, v in fields.items() if v is not None})
        return body

    def run_started(self, run: TurnRun) -> None:
        self._put("resumed" if run.resumed else "started", step=run.step, wake=run.wake or None)

    def step_started(self, step: StepInfo) -> None:
        arguments, cut = _preview(step.input) if step.kind == "tool" else (None, False)
        self._put(
            "step_started",
            **_step_fields(step),
            arguments=arguments,
            truncated=cut or None,
        )

    def step_replayed(self, step: StepInfo) -> None:
        self._put("step_replayed", **_step_fields(step))

    def step_finished(
        self, step: StepInfo, result: Mapping[str, Any], state: Mapping[str, Any], recorded: bool
    ) -> None:
        output, cut = _preview(result.get("output"))
        error = result.get("error")
        self._put(
            "step_finished",
            **_step_fields(step),
            output=output,
            error=None if error is None else str(error)[:PREVIEW_CHARS],
            interrupted=True if result.get("interrupted") else None,
            recorded=recorded,
            truncated=cut or None,
        )
        for name, value in state.items():
            shown, cut = _preview(value)
            self._put("state", step=step.step, state_name=name, value=shown, truncated=cut or None)

    def model_text(self, step: int, delta: str, retry: int) -> None:
        if not delta:
            return
        last = self._queue[-1] if self._queue else None
        if (
            last is not None
            and last["type"] == "text"
            and last.get("step") == step
            and last.get("retry") == retry
        ):
            last["text"] += delta  # not written yet: merge
            return
        self._put("text", step=step, text=delta, retry=retry)

    def run_ended(self, end: RunEnd) -> None:
        if end.status == "done":
            self._put("reply", text=end.reply, status=end.status)
        elif end.status == "failed":
            self._put("failed", error=end.error, status=end.status)
        else:
            self._put("run_ended", status=end.status, error=end.error)
        self._ended = end.status in ("done", "failed")

    # -- the writer ----------------------------------------------------------------------

    async def serve(self) -> None:
        while True:
            await self._wake.wait()
            # Let a burst (a model streaming tokens) gather: one write per interval at most.
            await anyio.sleep(FLUSH_INTERVAL)
            self._wake = anyio.Event()
            await self._flush()

    async def aclose(self) -> None:
        await self._flush()
        self._closed = True
        if self._ended:
            try:
                await self._world.stream.close(self._stream)
            except Exception as exc:
                log.warning("closing the events of %s failed: %s; dropped", self._stream, exc)

    async def _flush(self) -> None:
        async with self._lock:
            while self._queue:
                batch: list[bytes] = []
                size = 0
                while self._queue and (not batch or size < _BATCH_BYTES):
                    chunk = _chunk(self._queue.pop(0))
                    batch.append(chunk)
                    size += len(chunk)
                try:
                    await self._world.stream.write(self._stream, batch)
                except ClosedError:
                    # The turn's end was published (by a run that finished it): the events
                    # of a run still going (a paused worker's) have nowhere to go.
                    log.info("events of %s after its end: dropped", self._stream)
                except Exception as exc:
                    log.warning(
                        "publishing %d events on %s failed: %s; dropped (the journal is the "
                        "truth; the live view misses them)",
                        len(batch),
                        self._stream,
                        exc,
                    )


def _step_fields(step: StepInfo) -> dict[str, Any]:
    return {
        "step": step.step,
        "kind": step.kind,
        "name": step.name,
        "replay": step.replay,
        "key": step.key,
        "call_id": step.call_id,
        "model": step.model,
    }


def _preview(value: Any) -> tuple[Any, bool]:
    """``value`` itself when its JSON is short, else the start of its JSON text; and whether
    it was cut."""
    if value is None:
        return None, False
    try:
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) <= PREVIEW_CHARS:
        return value, False
    return text[:PREVIEW_CHARS], True


def _chunk(body: dict[str, Any]) -> bytes:
    event = TurnEvent.model_validate({**body, "position": 0})
    data = event.encode()
    if len(data) > _BATCH_BYTES:  # one huge text piece: keep its start
        text = (event.text or "")[: _BATCH_BYTES // 8]
        data = event.model_copy(update={"text": text, "truncated": True}).encode()
    return data
