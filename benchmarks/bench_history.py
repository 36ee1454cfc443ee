"""What a worker pays per turn as its session grows: the baseline for bounded history (a script).

    uv run python benchmarks/bench_history.py [--world local,postgres,redis]
        [--turns 10,1000,10000] [--repeat N] [--requests own|full] [--history N] [--quick]
        [--json] [--out FILE] [--profile]

For each World (opened with ``world_core.open_world`` in a fresh namespace, purged after) and
each session length K (the number of earlier, finished turns in the session), one session is
built and then, on a newly submitted turn (``Client.submit``: its input, nothing else yet):

* open: ``Journal.open(world, session, new_turn)``, what a worker does first for every turn
  it claims; p50 and p99 over ``--repeat`` calls (after one warm-up call; with fewer than 100
  calls p99 is the slowest).
* hand_on: ``world_core.journal.hand_on(world, session, queue, after=<the last earlier
  turn>)``, what a worker does after every turn it ends: it reads the log to find the next
  turn (here the new turn, which has its own message: nothing is sent or written).
* status: ``Client.status`` of that turn once it is running (its step 0 outcome appended, no
  reply): four keyed reads, then a read of the session to tell running from waiting.
* msgs: how many messages the default ``Agent.conversation(journal)`` would send to the model
  on that turn (no system prompt: 2K + 1; 2 min(K, N) + 1 with ``--history N``).
* KiB: bytes read from the log by one call of each (the sum of ``len(event.data)`` over the
  events ``Log.read`` and ``Log.get`` returned), counted through a pass-through Log
  (``world_conformance.wrappers.PassThroughLog``) in a call of its own, outside the timings.
  No blobs are read: every message is far below the blob threshold. The JSON also has the
  events read and the Log calls made (``read``, ``get`` and ``tail``).

The ratio rows divide the value at the longest session by the value at the shortest (10,000
and 10 turns with the defaults). Target (issue 12, section 5): within 1.5x, that is, a turn
costs the same at turn 10 and turn 10,000. Before bounded history (bdbc28b) every one of these
read the whole session log and grew linearly with it (the baseline in 1925ce8). Since 92b8e90
they read from the session's latest checkpoint: ``--history N`` passes ``history=N`` to
``Journal.open`` and ``history_turns=N`` to the ``Agent``, which is the bounded mode for N up
to the turns a checkpoint keeps (at most 100; since f420e8d at most 32 KiB of them, 39 turns
here); without it (``history=None``, the default Agent) a turn asks for all of its history,
so ``Journal.open`` of a session with more finished turns than that reads the whole log by
design (msgs then grows with the session; with ``--history N`` it stops at 2N + 1).

How a session of K turns is built, fast and checked: all but the last two turns are appended
straight to the session log in batches, four events per turn with the keys and JSON bodies
the journal writes for a plain chat turn (``Client.submit``, ``Journal.model``,
``Journal.finish``): ``turn/<t>/input`` (the user's 300-character message and its digest),
``turn/<t>/step/0/outcome`` (the model call: kind, name, request digest, preview,
per-message ``parts`` digests, and the 300-character reply as its result),
``turn/<t>/reply`` and ``turn/<t>/checkpoint``. The checkpoint is made as
``Journal._checkpoint`` makes it: the builder keeps a ``SessionView`` (world_core's), grown as
a reader grows it (from the previous turn's checkpoint, then the events after its
``as_of``), takes the turn's input into it, and calls ``.checkpoint(as_of=<the log position
of that input>)``, the tail where the turn's Journal was opened, with ``"turn"`` added. Turn
ids are 32 hex digits, like the ``uuid4().hex`` ids ``Client.submit`` makes. The last two
turns are real: ``Client.submit``, ``Journal.open``, ``Agent.run_turn`` with a
``ScriptedModel``, ``hand_on``. Checks, byte for byte (the run stops on a difference): before
measuring, a session of a few built turns must be the log a few real turns write, event for
event; and in every measured session the two real turns must have written exactly what the
builder would have (their checkpoints then hold the latest turns of a long built session).
Sessions are run without a ``Worker``, so none is continued in a fresh log (continue-as-new,
``HistoryLimits``: a worker continues a session at 10 MiB or 10,240 events, a few hundred
turns of this kind): each measures one log of K turns, as a session of that length was before
continue-as-new or is with limits raised that far.

``--requests`` says which model request each earlier turn recorded:

* ``own`` (the default): the turn's own user message only (an agent whose conversation is
  just that message). Every outcome is then about 1 KiB, and the session log grows linearly:
  1.7 KiB per turn plus its checkpoint, which holds the input and reply (0.8 KiB) of as many
  of the latest finished turns as the journal keeps: 100 at 92b8e90 (a 90 KiB checkpoint,
  880 MiB at 10,000 turns), at most 32 KiB of them since f420e8d (39 turns, 36 KiB, a
  360 MiB log at 10,000 turns).
* ``full``: the request the default ``Agent`` makes, the whole conversation so far (the last
  ``--history`` turns of it, when given). The outcome of the k-th turn then carries ``parts``
  digests of its 2k + 1 messages (about 87 bytes more per earlier turn): the session log
  grows with the square of its turns, by 45 MB at 1,000 turns and 4.4 GB at 10,000, so
  this mode refuses logs above 256 MiB. It shows what a default agent's session costs.

The JSON has, at the longest session of each World, a split of ``Journal.open`` into the time
spent inside ``Log`` calls (the backend's query and building ``Event`` objects) and the rest
(decoding each event's JSON, scanning the session, building its history). ``--profile`` adds
a cProfile of five ``Journal.open`` calls there (top functions by own time, to stderr).

Timings on a shared machine are noisy: compare rows of one run. Bounded: a few minutes with
``--history 20``; the default mode reads the whole log at 10,000 turns in each of its 30-odd
``Journal.open`` calls (ten minutes or more); seconds with ``--quick`` (10 and 100 turns).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import json
import math
import os
import pstats
import re
import secrets
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

import world_core
from world_conformance.wrappers import PassThroughLog, PassThroughWorld
from world_core import Event, NewEvent, World, open_world
from world_core.journal import (
    Agent,
    Client,
    Journal,
    Message,
    ModelReply,
    ModelRequest,
    ScriptedModel,
    canonical_json,
    digest_of,
    hand_on,
    session_log_id,
)
from world_core.journal._session import SessionView
from world_core.spi import Log

PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379/0"
WORLDS = ("local", "postgres", "redis")
QUEUE = "bench"
MESSAGE_CHARS = 300
PREVIEW_CHARS = 300  # the journal's preview length (world_core.journal._journal)
CHECKPOINT_BYTES = 512 * 1024  # larger checkpoints are a marker (world_core.journal._journal)
REAL_TURNS = 2  # the last turns of each session, run for real
CHECK_TURNS = 4
BATCH_BYTES = 2 * 1024 * 1024  # per append while building, well under MAX_PAYLOAD_BYTES
BATCH_EVENTS = 3000
FULL_LIMIT_BYTES = 256 * 1024 * 1024
PART_BYTES = 87  # what one earlier turn adds to a full request's recorded parts
PROBE_TURNS = 150  # built to estimate a log's size: past the history a checkpoint keeps

_WORDS = (
    "the order shipped on monday but the tracking page still shows it as pending and the "
    "customer asks whether the refund for the damaged item was already issued or if they "
    "should send the parcel back first; please check the account and answer politely "
)


@dataclass
class Settings:
    turns: list[int]
    repeat: int
    full: bool
    history: int | None
    profile: bool

    def open_kwargs(self) -> dict[str, Any]:
        """Extra arguments of ``Journal.open`` (none unless ``--history``)."""
        return {} if self.history is None else {"history": self.history}

    def agent(self, model: ScriptedModel, *, conversation: bool = False) -> Agent:
        """The agent of the real turns (``conversation``: the default agent, for msgs)."""
        kwargs: dict[str, Any] = {}
        if self.history is not None:
            kwargs["history_turns"] = self.history
        if self.full or conversation:
            return Agent(model=model, **kwargs)
        return _OwnMessageAgent(model=model, **kwargs)


def turn_id(i: int) -> str:
    """The id of the i-th turn: 32 hex digits, as ``Client.submit`` makes them."""
    return uuid.UUID(int=i + 1).hex


def user_text(i: int) -> str:
    return (f"turn {i:06d}: " + _WORDS * 2)[:MESSAGE_CHARS]


def reply_text(i: int) -> str:
    return (f"reply {i:06d}: " + _WORDS[::-1] * 2)[:MESSAGE_CHARS]


def _index_of(request: ModelRequest) -> int:
    """The turn a request is for, from its last (user) message: what the model replies to."""
    content = str(request.messages[-1].get("content"))
    return int(content.split(":", 1)[0].removeprefix("turn "))


def scripted_model() -> ScriptedModel:
    return ScriptedModel(lambda request: ModelReply(content=reply_text(_index_of(request))))


class _OwnMessageAgent(Agent):
    """An agent that sends the model the turn's own message only (``--requests own``)."""

    def conversation(self, journal: Journal) -> list[Message]:
        return [{"role": "user", "content": journal.user_message}]


# -- building sessions -----------------------------------------------------------------------


STAMP = 1_700_000_000.125
"""The time the builder records (``at``, ``started``): real events carry the clock's, which
:func:`same_events` does not compare."""
_TIMES = re.compile(rb'"(at|started)":[0-9.e+-]+')
_BYTES = re.compile(rb'"bytes":[0-9]+')


def _event(turn: str, what: str, body: dict[str, Any], step: int | None = None) -> NewEvent:
    """A journal event as ``Journal._event`` makes it (the time it was made in ``at``; an
    outcome's ``started`` too)."""
    key = f"turn/{turn}/{what}" if step is None else f"turn/{turn}/step/{step}/{what}"
    data: dict[str, Any] = {"t": what, "turn": turn, **body}
    if step is not None:
        data["step"] = step
        if what == "outcome":
            data["started"] = STAMP
    data["at"] = STAMP
    return NewEvent(key=key, data=canonical_json(data))


def input_event(i: int) -> NewEvent:
    """``Client.submit``'s event for turn i (a message below the blob threshold)."""
    message = user_text(i)
    digest = hashlib.sha256(canonical_json(message)).hexdigest()
    body = {"t": "input", "turn": turn_id(i), "digest": digest, "message": message, "at": STAMP}
    return NewEvent(key=f"turn/{turn_id(i)}/input", data=canonical_json(body))


def reply_event(i: int) -> NewEvent:
    """``Journal.finish``'s event for turn i: one step taken, the reply inline."""
    return _event(turn_id(i), "reply", {"steps": 1, "reply": reply_text(i)})


def _part(message: Message) -> dict[str, str]:
    """A message's entry in a recorded request's ``parts``: its role, a digest per field."""
    part = {"role": str(message["role"])}
    part.update({k: digest_of(v)[:12] for k, v in message.items() if k != "role"})
    return part


class SessionBuilder:
    """The events of a session's turns, in order. With ``full`` it keeps the conversation so
    far (its last ``window`` turns, when given) to record each model request as the default
    ``Agent`` makes it; else each request is the turn's own message."""

    def __init__(self, *, full: bool, window: int | None = None) -> None:
        self.full = full
        self.window = window
        self._head = hashlib.sha256(b'{"messages":[')  # the whole conversation, when no window
        self._turns: list[tuple[bytes, list[dict[str, str]]]] = []  # per turn: JSON, parts
        self.seq = 0  # the session log's tail once the turns built so far are appended
        self._view = SessionView()  # the session as a Journal opened now would read it
        self._last_checkpoint: dict[str, Any] = {}

    def _take(self, event: NewEvent) -> None:
        """Event ``event`` is the log's next one: the view takes it as a reader would."""
        self.seq += 1
        self._view.apply(Event(seq=self.seq, key=event.key, data=event.data))

    def checkpoint_event(self, i: int) -> NewEvent:
        """``Journal._checkpoint`` of turn i, its Journal opened right after its input was
        appended: the session view as of that position (``as_of``, the Journal's tail)."""
        body = self._view.checkpoint(as_of=self._view.tail)
        body["turn"] = turn_id(i)
        data = canonical_json(body)
        if len(data) > CHECKPOINT_BYTES:
            raise SystemExit(f"a checkpoint of {len(data)} bytes would not be written inline")
        self._last_checkpoint = body
        return NewEvent(key=f"turn/{turn_id(i)}/checkpoint", data=data)

    def _request(self) -> tuple[Any, int, list[dict[str, str]]]:
        """A hash over the request's canonical JSON so far, its message count, its parts."""
        if not self.full:
            return hashlib.sha256(b'{"messages":['), 0, []
        if self.window is None:
            parts = [part for _, pair in self._turns for part in pair]
            return self._head.copy(), len(parts), parts
        kept = self._turns[max(0, len(self._turns) - self.window) :] if self.window else []
        parts = [part for _, pair in kept for part in pair]
        head = hashlib.sha256(b'{"messages":[' + b",".join(encoded for encoded, _ in kept))
        return head, len(parts), parts

    def model_outcome(self, i: int) -> NewEvent:
        """``Journal.model``'s outcome for turn i's one model call, answered with its reply."""
        last: Message = {"role": "user", "content": user_text(i)}
        head, count, parts = self._request()
        head.update((b"," if count else b"") + canonical_json(last) + b'],"tools":[]}')
        preview = canonical_json({"messages": count + 1, "tools": [], "last_message": last})
        text = preview.decode("utf-8")
        if len(text) > PREVIEW_CHARS:
            text = text[:PREVIEW_CHARS] + "..."
        body = {
            "kind": "model",
            "name": "model",
            "digest": head.hexdigest(),
            "preview": text,
            "parts": {"messages": [*parts, _part(last)], "tools": {}},
            "result": {"output": {"content": reply_text(i), "tool_calls": []}},
        }
        return _event(turn_id(i), "outcome", body, 0)

    def turn(self, i: int) -> list[NewEvent]:
        """Turn i, submitted after the turns before it ended: input, model outcome, reply and
        the checkpoint that rides with the reply."""
        submitted = input_event(i)
        self._take(submitted)  # a worker opens the turn's Journal once its input is in the log
        checkpoint = self.checkpoint_event(i)
        events = [submitted, self.model_outcome(i), reply_event(i), checkpoint]
        # The next turn's Journal reads this checkpoint, then the events after its as_of.
        self._view = SessionView.from_checkpoint(self._last_checkpoint)
        for event in events[1:]:
            self._take(event)
        if self.full:
            pair: list[Message] = [
                {"role": "user", "content": user_text(i)},
                {"role": "assistant", "content": reply_text(i)},
            ]
            encoded = b",".join(canonical_json(message) for message in pair)
            self._head.update(encoded if not self._turns else b"," + encoded)
            self._turns.append((encoded, [_part(message) for message in pair]))
        return events


def estimated_log_bytes(turns: int, settings: Settings) -> int:
    """Roughly the size of a built session log (for the ``full`` limit): what the builder
    writes for its first turns (checkpoints grow until they hold all the history the journal
    keeps), the last of them again for each later turn, plus the full requests' parts."""
    probe = SessionBuilder(full=False)
    sizes = [sum(len(e.data) for e in probe.turn(i)) for i in range(min(turns, PROBE_TURNS))]
    size = sum(sizes) + sizes[-1] * (turns - len(sizes))
    if settings.full:
        window = turns if settings.history is None else min(turns, settings.history)
        size += PART_BYTES * (window * turns - window * window // 2)
    return size


async def append_built(
    world: World, session: str, turns: int, settings: Settings
) -> SessionBuilder:
    """Append turns 0 .. ``turns - 1`` as the builder makes them, in batches, to the session's
    empty log (the checkpoints name log positions: the builder counts them from 1)."""
    log_id = session_log_id(session)
    _expect(await world.log.tail(log_id) == 0, f"session {session} is not empty")
    builder = SessionBuilder(full=settings.full, window=settings.history)
    batch: list[NewEvent] = []
    size = 0

    async def flush(expected: int) -> None:
        tail = await world.log.append(log_id, batch)
        _expect(tail == expected, f"tail {tail} after a batch, the builder counted {expected}")

    for i in range(turns):
        events = builder.turn(i)
        grow = sum(len(event.data) for event in events)
        if batch and (size + grow > BATCH_BYTES or len(batch) + len(events) > BATCH_EVENTS):
            await flush(builder.seq - len(events))
            batch, size = [], 0
        batch.extend(events)
        size += grow
    if batch:
        await flush(builder.seq)
    return builder


async def real_turn(world: World, session: str, i: int, settings: Settings) -> None:
    """Turn i as an app and a worker run it: submit, open, run the agent, hand on."""
    client = Client(world, queue=QUEUE)
    await client.submit(session, user_text(i), turn_id=turn_id(i))
    journal = await Journal.open(world, session, turn_id(i), **settings.open_kwargs())
    await settings.agent(scripted_model()).run_turn(journal)
    await hand_on(world, session, QUEUE, after=turn_id(i))


async def build(world: World, session: str, turns: int, settings: Settings) -> float:
    """A session of ``turns`` finished turns, the last :data:`REAL_TURNS` real; seconds. The
    real turns must have written what the builder would have (checked after the timing)."""
    started = time.perf_counter()
    fast = max(0, turns - REAL_TURNS)
    builder = await append_built(world, session, fast, settings)
    for i in range(fast, turns):
        await real_turn(world, session, i, settings)
    seconds = time.perf_counter() - started
    after = builder.seq
    expected = [event for i in range(fast, turns) for event in builder.turn(i)]
    found = await world.log.read(session_log_id(session), after=after)
    same_events(world.name, f"{turns - fast} real turns after {fast} built", expected, found)
    return seconds


async def check_builder(world: World, settings: Settings) -> None:
    """The builder's session of :data:`CHECK_TURNS` turns must be a real session of the same
    turns, event for event: the same keys and bytes in the same order."""
    tag = secrets.token_hex(3)
    real, built = f"check-real-{tag}", f"check-built-{tag}"
    for i in range(CHECK_TURNS):
        await real_turn(world, real, i, settings)
    await append_built(world, built, CHECK_TURNS, settings)
    ours = await world.log.read(session_log_id(built))
    theirs = await world.log.read(session_log_id(real))
    same_events(world.name, f"{CHECK_TURNS} real turns", ours, theirs)


def same_events(
    world: str, what: str, built: Sequence[NewEvent | Event], real: Sequence[Event]
) -> None:
    """Stop unless ``real`` holds the events ``built`` does, key and bytes, in order; times
    (``at``, ``started``) aside, and so a checkpoint's ``bytes``, which counts them as printed."""
    for mine, theirs in zip(built, real, strict=False):
        if (mine.key, _timeless(mine.data)) != (theirs.key, _timeless(theirs.data)):
            raise SystemExit(
                f"the session builder differs from {what} on {world}:\n"
                f"  built: {(mine.key, mine.data)!r:.600}\n"
                f"  real:  {(theirs.key, theirs.data)!r:.600}"
            )
    if len(built) != len(real):
        kinds = sorted({str(e.key).rsplit("/", 1)[-1] for e in real[len(built) :]})
        raise SystemExit(
            f"the session builder wrote {len(built)} events for {what} on {world}, the real "
            f"turns {len(real)}" + (f" (real turns also write {', '.join(kinds)})" if kinds else "")
        )


def _timeless(data: bytes) -> bytes:
    return _BYTES.sub(b'"bytes":0', _TIMES.sub(rb'"\1":0', data))


# -- measuring -------------------------------------------------------------------------------


class CountingLog(PassThroughLog):
    """Counts the events and bytes that reads return, the calls of ``read``, ``get`` and
    ``tail``, and the time spent in them."""

    def __init__(self, inner: Log) -> None:
        super().__init__(inner)
        self.reset()

    def reset(self) -> None:
        self.bytes = self.events = self.calls = 0
        self.seconds = 0.0

    def _count(self, events: list[Event], started: float) -> None:
        self.seconds += time.perf_counter() - started
        self.calls += 1
        self.events += len(events)
        self.bytes += sum(len(event.data) for event in events)

    async def read(self, log_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        started = time.perf_counter()
        events = await super().read(log_id, after=after, limit=limit)
        self._count(events, started)
        return events

    async def get(self, log_id: str, key: str) -> Event | None:
        started = time.perf_counter()
        event = await super().get(log_id, key)
        self._count([] if event is None else [event], started)
        return event

    async def tail(self, log_id: str) -> int:
        started = time.perf_counter()
        tail = await super().tail(log_id)
        self._count([], started)
        return tail


def _expect(condition: bool, what: str) -> None:
    if not condition:
        raise RuntimeError(f"unexpected: {what}")


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


async def _timed(call: Callable[[], Awaitable[Any]], repeat: int) -> dict[str, float]:
    await call()  # warm up (connections, caches)
    samples: list[float] = []
    for _ in range(repeat):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    return {"p50": round(statistics.median(samples), 3), "p99": round(_p99(samples), 3)}


async def _counted(counting: CountingLog, call: Callable[[], Awaitable[Any]]) -> dict[str, int]:
    counting.reset()
    await call()
    return {"bytes": counting.bytes, "events": counting.events, "calls": counting.calls}


async def measure(world: World, turns: int, settings: Settings) -> dict[str, Any]:
    """Build a session of ``turns`` finished turns, submit one more, measure it."""
    session = f"history-{turns}-{secrets.token_hex(3)}"
    build_s = await build(world, session, turns, settings)
    client = Client(world, queue=QUEUE)
    new, previous = turn_id(turns), turn_id(turns - 1)
    await client.submit(session, user_text(turns), turn_id=new)
    info = await world.log.info(session_log_id(session))
    counting = CountingLog(world.log)
    counted = PassThroughWorld(world, log=counting)

    async def open_turn(target: World = world) -> Journal:
        return await Journal.open(target, session, new, **settings.open_kwargs())

    async def hand_on_turn(target: World = world) -> None:
        handed = await hand_on(target, session, QUEUE, after=previous)
        _expect(handed is None, f"hand_on sent turn {handed!r} a message")

    journal = await open_turn()
    _expect(journal.waiting_for is None, "the new turn waits for an earlier one")
    messages = len(settings.agent(scripted_model(), conversation=True).conversation(journal))
    seen = turns if settings.history is None else min(turns, settings.history)
    _expect(messages == 2 * seen + 1, f"{messages} messages for {turns} earlier turns")
    row: dict[str, Any] = {
        "world": world.name,
        "turns": turns,
        "log_events": info.tail if info else 0,
        "build_s": round(build_s, 2),
        "messages": messages,
    }
    row["open_ms"] = await _timed(open_turn, settings.repeat)
    row["hand_on_ms"] = await _timed(hand_on_turn, settings.repeat)
    read = {
        "open": await _counted(counting, lambda: open_turn(counted)),
        "hand_on": await _counted(counting, lambda: hand_on_turn(counted)),
    }
    if turns == max(settings.turns):
        row["open_split_ms"] = await _open_split(counting, lambda: open_turn(counted), settings)
        if settings.profile:
            await _profile(world, turns, open_turn)
    # The turn starts: its first step (a model call) is recorded, no reply yet.
    outcome = SessionBuilder(full=False).model_outcome(turns)
    await world.log.append(session_log_id(session), [outcome])

    async def status(target: World = world) -> None:
        found = await Client(target, queue=QUEUE).status(session, new)
        _expect(found == "running", f"status {found!r}, not running")

    row["status_ms"] = await _timed(status, settings.repeat)
    read["status"] = await _counted(counting, lambda: status(counted))
    row["read"] = read
    row["log_bytes"] = await _log_bytes(world, session)
    return row


async def _log_bytes(world: World, session: str) -> int:
    return sum(len(event.data) for event in await world.log.read(session_log_id(session)))


async def _open_split(
    counting: CountingLog, open_turn: Callable[[], Awaitable[Any]], settings: Settings
) -> dict[str, float]:
    """Medians of ``Journal.open`` as a whole and of the time spent inside its Log calls."""
    wholes: list[float] = []
    logs: list[float] = []
    for _ in range(max(3, settings.repeat // 2)):
        counting.reset()
        started = time.perf_counter()
        await open_turn()
        wholes.append(time.perf_counter() - started)
        logs.append(counting.seconds)
    whole, log = statistics.median(wholes) * 1000, statistics.median(logs) * 1000
    return {"open": round(whole, 2), "in_log_calls": round(log, 2), "rest": round(whole - log, 2)}


async def _profile(world: World, turns: int, open_turn: Callable[[], Awaitable[Any]]) -> None:
    """cProfile of five ``Journal.open`` calls, top functions by own time, to stderr."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(5):
        await open_turn()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(14)
    print(f"\n--- cProfile: 5 x Journal.open, {world.name}, {turns} turns ---", file=sys.stderr)
    print(out.getvalue(), file=sys.stderr)


async def run_world(name: str, url: str, settings: Settings) -> list[dict[str, Any]]:
    namespace = f"bench_hist_{secrets.token_hex(4)}"
    rows: list[dict[str, Any]] = []
    async with open_world(name, url=url, namespace=namespace) as world:
        try:
            await check_builder(world, settings)
            for turns in settings.turns:
                print(f"  {name}: {turns} turns ...", file=sys.stderr, flush=True)
                rows.append(await measure(world, turns, settings))
        finally:
            await world.purge()
    return rows


# -- report ----------------------------------------------------------------------------------

_METRICS: tuple[tuple[str, Callable[[dict[str, Any]], float]], ...] = (
    ("open p50", lambda r: r["open_ms"]["p50"]),
    ("open p99", lambda r: r["open_ms"]["p99"]),
    ("hand_on p50", lambda r: r["hand_on_ms"]["p50"]),
    ("hand_on p99", lambda r: r["hand_on_ms"]["p99"]),
    ("status p50", lambda r: r["status_ms"]["p50"]),
    ("status p99", lambda r: r["status_ms"]["p99"]),
    ("msgs", lambda r: r["messages"]),
    ("KiB open", lambda r: r["read"]["open"]["bytes"] / 1024),
    ("KiB hand_on", lambda r: r["read"]["hand_on"]["bytes"] / 1024),
    ("KiB status", lambda r: r["read"]["status"]["bytes"] / 1024),
)


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per world: each metric at the longest session over the shortest."""
    found: list[dict[str, Any]] = []
    for world in dict.fromkeys(row["world"] for row in rows):
        mine = sorted((r for r in rows if r["world"] == world), key=lambda r: r["turns"])
        if len(mine) < 2:
            continue
        low, high = mine[0], mine[-1]
        values = {
            label: round(get(high) / get(low), 1) if get(low) else None for label, get in _METRICS
        }
        found.append(
            {"world": world, "of": f"{high['turns']}/{low['turns']}", "target": 1.5, **values}
        )
    return found


def _cell(value: float | None, width: int) -> str:
    if value is None:
        return f"{'-':>{width}}"
    if value == int(value) and value >= 10:
        return f"{int(value):>{width}}"
    if value >= 100:
        return f"{value:>{width}.0f}"
    if value >= 10:
        return f"{value:>{width}.1f}"
    return f"{value:>{width}.2f}"


def print_table(report: dict[str, Any]) -> None:
    settings = report["settings"]
    history = settings["history"]
    print(
        f"\nper-turn cost vs earlier turns in the session; ms over {settings['repeat']} calls; "
        f"requests recorded: {settings['requests']}"
        + ("" if history is None else f"; Journal.open(history={history})")
    )
    widths = [max(9, len(label) + 1) for label, _ in _METRICS]
    print(
        f"{'world':<10}{'turns':>11}"
        + "".join(f"{label:>{w}}" for (label, _), w in zip(_METRICS, widths, strict=True))
    )
    by_world: dict[str, list[dict[str, Any]]] = {}
    for row in report["rows"]:
        by_world.setdefault(row["world"], []).append(row)
    ratio_of = {item["world"]: item for item in report["ratios"]}
    for world, rows in by_world.items():
        for row in rows:
            cells = "".join(
                _cell(float(get(row)), w) for (_, get), w in zip(_METRICS, widths, strict=True)
            )
            print(f"{world:<10}{row['turns']:>11}{cells}")
        item = ratio_of.get(world)
        if item is not None:
            cells = "".join(
                f"{item[label]:>{w - 1}.1f}x" if item[label] is not None else _cell(None, w)
                for (label, _), w in zip(_METRICS, widths, strict=True)
            )
            print(f"{world:<10}{'x ' + item['of']:>11}{cells}")
    print("target (issue 12, section 5): each ratio within 1.5x")
    for row in report["rows"]:
        split = row.get("open_split_ms")
        if split:
            print(
                f"Journal.open, {row['world']}, {row['turns']} turns (log "
                f"{row['log_bytes'] / 1024 / 1024:.1f} MiB, {row['log_events']} events): "
                f"{split['open']} ms = in Log calls {split['in_log_calls']} + the rest "
                f"{split['rest']} (JSON decode, session scan, history)"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", default="local,postgres,redis", help="a list of worlds")
    parser.add_argument("--turns", default=None, help="earlier turns per session, a list")
    parser.add_argument("--repeat", type=int, default=20, help="calls per measurement")
    parser.add_argument("--requests", choices=("own", "full"), default="own")
    parser.add_argument(
        "--history", type=int, default=None, help="Journal.open(history=N), Agent(history_turns=N)"
    )
    parser.add_argument("--quick", action="store_true", help="10 and 100 turns")
    parser.add_argument("--json", action="store_true", help="print JSON after the table")
    parser.add_argument("--out", help="write the JSON report to this file")
    parser.add_argument("--profile", action="store_true", help="cProfile Journal.open")
    parser.add_argument(
        "--postgres-url", default=os.environ.get("WORLD_BENCH_POSTGRES_URL", PG_URL)
    )
    parser.add_argument("--redis-url", default=os.environ.get("WORLD_BENCH_REDIS_URL", REDIS_URL))
    args = parser.parse_args()
    names = args.world.split(",")
    if any(name not in WORLDS for name in names):
        parser.error(f"--world is a list of {', '.join(WORLDS)}")
    default_turns = "10,100" if args.quick else "10,1000,10000"
    turns = sorted({int(n) for n in (args.turns or default_turns).split(",")})
    if turns[0] < 1 or args.repeat < 1 or (args.history is not None and args.history < 0):
        parser.error("--turns and --repeat must be >= 1, --history >= 0")
    settings = Settings(
        turns=turns,
        repeat=args.repeat,
        full=args.requests == "full",
        history=args.history,
        profile=args.profile,
    )
    if settings.full and estimated_log_bytes(turns[-1], settings) > FULL_LIMIT_BYTES:
        size = estimated_log_bytes(turns[-1], settings) / 1024**3
        parser.error(
            f"--requests full at {turns[-1]} turns writes a session log of about {size:.1f} GB "
            "(it grows with the square of the turns); use fewer turns or --history"
        )
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    for name in names:
        folder = Path(tempfile.mkdtemp(prefix="bench-history-"))
        try:
            url = {"local": str(folder / "world"), "postgres": args.postgres_url}.get(
                name, args.redis_url
            )
            rows.extend(anyio.run(run_world, name, url, settings))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    report = {
        "settings": {
            "worlds": names,
            "turns": turns,
            "repeat": args.repeat,
            "requests": args.requests,
            "history": args.history,
            "message_chars": MESSAGE_CHARS,
            "real_turns_per_session": REAL_TURNS,
            "builder_check": (
                f"a session of {CHECK_TURNS} built turns is the log of {CHECK_TURNS} real ones, "
                f"and the last {REAL_TURNS} (real) turns of each session are what the builder "
                "would have written, byte for byte"
            ),
            "world_core": str(Path(world_core.__file__).parent),
        },
        "rows": rows,
        "ratios": ratios(rows),
        "wall_s": round(time.monotonic() - started, 1),
    }
    print_table(report)
    print(f"wall time: {report['wall_s']} s")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print(f"JSON report: {args.out}")
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
