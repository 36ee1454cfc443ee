"""The durable step journal: every model call and tool call of a turn, recorded in the session log.

One log per session (``session/<session_id>``). A turn's calls are numbered steps 0, 1, 2 ...
in the order the agent code makes them. Events (JSON) and their keys, unique in the log:

====================================  =======================================================
``turn/<t>/input``                    the user's message (written by :class:`~world_core.Client`)
``turn/<t>/step/<n>/intent``          a ``never`` tool is about to run (identity, deadline, key)
``turn/<t>/step/<n>/unstarted``       that intent's call was refused before its effect started
                                      (``context.check()``, lease lost): run the step again;
                                      the next intent is ``.../intent/<g>`` (``"gen": g``), its
                                      ``unstarted`` record ``.../unstarted/<g>``
``turn/<t>/step/<n>/outcome``         the step's result (or a blob reference), with its identity
``turn/<t>/step/<n>/state/<name>``    a value the step's tool staged (``context.stage``)
``turn/<t>/reply``                    the final reply; the turn is finished
``turn/<t>/failure``                  why the turn could not finish; the turn is over
``turn/<t>/park/<n>``, ``/kick/<n>``  turn order: a message handed on, a message sent on
                                      (see :mod:`world_core.journal._order`)
====================================  =======================================================

The turns of a session run one at a time, in submission order (the order of their inputs in
the log); a turn takes no step while an earlier one has neither reply nor failure
(:class:`~world_core.errors.TurnNotReadyError`), and sees every earlier one in its history.

The rules, for step ``n``:

* Outcome recorded: return it, call nothing.
* Intent recorded, no outcome (the call was interrupted): a model call and a ``safe`` tool run
  again. A ``never`` tool does not run again. While the deadline recorded with its intent
  (plus a margin of :data:`CLOCK_MARGIN` seconds for clock error) has not passed, the call may
  still be running in a worker that is paused or cut off, so nobody answers for it:
  :class:`~world_core.errors.CallInFlightError` tells the worker to re-queue the turn until
  then. After it, the outcome becomes :data:`POSSIBLY_RAN`, telling the model the call may or
  may not have happened and to check the current state first.
* Intent recorded, then ``unstarted`` for it: the call was refused before its effect (its
  tool's ``context.check()`` found the lease lost; the refusal is not an outcome, the attempt
  stopped, see :meth:`Journal._void_intent`). The call runs again under a new intent, with
  the same idempotency key.
* Nothing recorded: a ``never`` tool's intent is appended (and committed) before the tool
  runs, in an append of its own that nothing of the tool's can join; then the call runs,
  shielded from cancellation (a lost lease or SIGTERM does not cut it off half-way) and
  bounded by the tool's ``timeout``; then its outcome is appended at once. Model calls and
  ``safe`` tools write no intent: an interrupted one has nothing recorded and, by the rule
  above, runs again anyway.
* Deadlines: every tool call has one (its tool's ``timeout``). An async tool still running at
  its deadline is cancelled; a sync tool is abandoned in its thread and reported in the log.
  The outcome is then a timeout error (``safe``) or :data:`POSSIBLY_RAN` (``never``). Deadlines
  are on the store's clock as the worker estimates it from its lease (``clock``).
* Idempotency keys: step ``n``'s key is ``<session>/<turn>/step-<n>`` (at most 255 bytes; see
  :func:`~world_core.journal._tools.idempotency_key`). A ``never`` call whose latest earlier
  call of the same tool with the same arguments in this turn was interrupted (may have
  happened) or failed (a timeout or dropped connection may come after the request arrived)
  reuses that call's key, so an API that honours keys sees one request however often the
  model retries blindly. The key is recorded with the intent. Limits: only within one turn,
  only for identical arguments (canonical JSON of what the model sent), and only an API that
  honours keys can drop the repeat; after a call that returned a result, an identical call is
  a new request and gets its own key.
* Deferred outcomes: a ``safe`` tool's outcome, and the values of ``now()``, ``uuid()`` and
  ``random()`` (steps too), are not appended on their own: they ride with the next append
  (the next model call's outcome, a ``never`` intent, the reply; or on their own past 1 MiB).
  A crash before that loses them, and the replay runs the ``safe`` tool again or draws a fresh
  value, which is what ``safe`` allows, and nothing durable can have used them: appends keep
  step order, so any later outcome is in the same atomic batch or after it.
* Round trips per step: model call 1; ``never`` tool 2 (intent, outcome); ``safe`` tool and
  ``now``/``uuid``/``random`` 0 of their own (``defer_safe=False``: 1 per ``safe`` tool).
* Writes that must not be lost are shielded from cancellation and retried on transient faults
  (:class:`~world_core.errors.BackendUnavailableError`) for up to :data:`WRITE_RETRY_SECONDS`:
  every journal event is keyed, so a retry of a write that did land is recognised by its
  identical stored event and counts as done.
* Every recorded step carries its kind, name and a sha-256 of its canonical input: for a tool,
  the arguments exactly as the model sent them (before defaults are filled); for a model call,
  the whole request, with a digest per message field so a mismatch names the message and
  field that changed. Replay compares them at each position; any difference raises
  :class:`~world_core.errors.NonDeterminismError` with both sides, before anything runs or is
  written. So does code that goes on past a recorded reply, or stops before the recorded steps
  end.
* Single ownership: keys are unique in the log, so of two workers on one step, the second
  intent (``never``) or the second outcome (any step) is refused with
  :class:`~world_core.errors.DuplicateKeyError`; the loser stops, having run no ``never`` tool.
  After any failed append the Journal refuses further steps (its view may be stale): open a
  new one.
* Staged state: a tool's staged values (``context.stage``) become ``state`` events in the
  same atomic append as its outcome (or the same deferred batch), and only if the tool
  returned: an interrupted or failing call changes nothing.
* Claims: a tool's claimed events (``context.claim``, on which the documents' versions
  build) join its outcome's append under keys of their own, so the append commits only if
  every claimed key is still free. A call whose claim was taken meanwhile commits nothing it
  staged: a ``safe`` call runs again with a fresh context (up to ``MAX_CONFLICT_RUNS``), then
  records the conflict as its error; a ``never`` call is not run again and records an error
  saying it ran but its changes were not saved. A call with claims is never deferred.
* Unusable paid replies: a model reply the client cannot parse
  (:class:`~world_core.errors.ModelReplyError`) is recorded as the step's outcome and raised;
  a redelivered turn raises it again from the journal and never pays for it twice.
* Values whose canonical JSON exceeds ``blob_threshold`` bytes (results, replies, inputs,
  staged values) go to a content-addressed blob written before the event that names it; the
  event keeps digest and size. Text JSON cannot carry as UTF-8 (a lone surrogate such as
  ``"\\ud83d"``) is stored escaped, losslessly.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import hashlib
import json
import logging
import math
import random as _random
import time
import uuid as _uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn, TypeVar, cast

import anyio
import anyio.lowlevel
import pydantic
from anyio.abc import AsyncBackend
from pydantic_core import to_jsonable_python

from world_core.errors import (
    BackendUnavailableError,
    CallInFlightError,
    ConflictError,
    DuplicateKeyError,
    InvalidArgumentError,
    LeaseLostError,
    ModelReplyError,
    NonDeterminismError,
    NotFoundError,
    PossiblyRanError,
    ToolError,
    TurnNotReadyError,
    WorldError,
)
from world_core.journal._blobs import BlobRef, Blobs, session_blobs
from world_core.journal._crash import CrashPoint
from world_core.journal._model import ModelClient, ModelReply, ModelRequest, ToolCall
from world_core.journal._observer import StepInfo, TurnObserver, notify
from world_core.journal._session import (
    SessionView,
    append_session,
    current_log,
    decode_event,
    read_session,
    scan_session,
    session_log_id,
    turn_log,
)
from world_core.journal._tools import (
    DEFAULT_TOOL_TIMEOUT,
    MAX_CONFLICT_RUNS,
    MAX_STATE_NAME_BYTES,
    Replay,
    Tool,
    ToolContext,
    _check_replay,
    _check_timeout,
    check_state_name,
    idempotency_key,
)
from world_core.journal._waits import (
    MAX_WAIT_SECONDS,
    WAIT_KINDS,
    ChildResult,
    Signal,
    TurnSuspended,
    approval_signal,
    check_seconds,
    check_signal_name,
    child_signal,
)
from world_core.spi import MAX_ID_BYTES, Event, NewEvent, World, control_character, validate_id

__all__ = [
    "CLOCK_MARGIN",
    "DEFAULT_BLOB_THRESHOLD",
    "DEFAULT_QUEUE",
    "MAX_BLOB_THRESHOLD",
    "MAX_TURN_ID_BYTES",
    "POSSIBLY_RAN",
    "WRITE_RETRY_SECONDS",
    "Journal",
    "PastTurn",
    "canonical_json",
    "check_blob_threshold",
    "check_new_turn_id",
    "check_turn_id",
    "decided_too_late",
    "digest_of",
    "load_value",
    "read_state",
    "scan_session",
    "session_log_id",
    "stored_value",
    "write_state",
]

log = logging.getLogger("world.journal")

T = TypeVar("T")

DEFAULT_BLOB_THRESHOLD = 64 * 1024
"""Values larger than this (canonical JSON bytes) are stored as blobs."""

POSSIBLY_RAN = (
    "This call was interrupted before its result was saved, so it may or may not have "
    "happened. Check the current state before you try it again."
)
"""The tool result a model gets for an interrupted (or timed-out) ``never`` tool."""

CLOCK_MARGIN = 1.0
"""Seconds added to a recorded deadline before another worker may answer for the call: covers
the error of each worker's estimate of the store's clock (a claim's round trip)."""

DEFAULT_QUEUE = "turns"
"""The queue turns are sent to and workers claim from."""

WRITE_RETRY_SECONDS = 30.0
"""How long a journal write is retried on transient faults before the turn gives up."""

_FENCED_TRIES = 5
"""Tries of an append made only if the log's tail is as read: an "unstarted" record (each
over events of other turns only), an approval's time-out (each after a new look)."""

CHILD_TURN = "run"
"""The turn id of a child run in its own session."""

MAX_TURN_ID_BYTES = 256
"""The longest turn id: every key of the turn (``turn/<t>/step/<n>/state/<name>``) then fits."""

_PREVIEW_CHARS = 300
_PENDING_FLUSH_BYTES = 1024 * 1024  # deferred outcomes are written once they reach this
_STEP_BYTES = 2 * 1024 * 1024  # staged values above this in all go to blobs, however small each
_ERROR_CHARS = 2000
_CHECKPOINT_BYTES = 512 * 1024  # a larger checkpoint is not written inline (see _checkpoint)
_APPROVAL_ARGUMENTS_BYTES = 16 * 1024  # larger arguments are shown to approvers as a preview
_NO_ARGUMENTS: type[pydantic.BaseModel] = pydantic.create_model(
    "step_arguments", __config__=pydantic.ConfigDict(extra="forbid")
)  # a Journal.step's tool takes none: its body is a closure
assert 5 + MAX_TURN_ID_BYTES + 6 + 10 + 7 + MAX_STATE_NAME_BYTES <= MAX_ID_BYTES


def canonical_json(value: object) -> bytes:
    """Sorted keys, no spaces, UTF-8: the bytes digests and blobs are computed over.

    Text that UTF-8 cannot carry (lone surrogates, valid in JSON as ``\\ud83d``) is written
    with JSON escapes instead, losslessly: parsing gives back the same string.
    """
    text = _encode(value)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _CANONICAL_ASCII.encode(value).encode("ascii")


# Made once: json.dumps with these settings would build an encoder on every call (several a step).
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
_CANONICAL_ASCII = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
)
_C_ENCODER = getattr(json.encoder, "c_make_encoder", None)


_ENCODERS: list[Callable[[object, int], Any]] = []
"""Idle C encoders for :func:`_encode`: each is taken by one encode at a time (any thread),
then put back (building one took 0.3 to 0.5 us, against 5 to 7 us to encode an event of a
step: four encodes a ``never`` step)."""


def _encode(value: object) -> str:
    """``_CANONICAL.encode(value)``: the same C encoder, without the Python layers
    ``JSONEncoder.encode`` adds on every call (a third of a small value's cost). An encoder
    whose encode failed is dropped, not put back: its markers (what detects a cycle) may
    still hold the containers it was in; one that succeeded has removed all of its own."""
    if _C_ENCODER is None:  # an interpreter without the json accelerator
        return _CANONICAL.encode(value)
    try:
        encoder = _ENCODERS.pop()
    except IndexError:
        encoder = _C_ENCODER(
            {},
            _CANONICAL.default,
            json.encoder.encode_basestring,
            None,
            ":",
            ",",
            True,
            False,
            False,
        )
    chunks = encoder(value, 0)
    _ENCODERS.append(encoder)
    return "".join(chunks)


def digest_of(value: object) -> str:
    """sha-256 (hex) of ``value``'s canonical JSON."""
    return hashlib.sha256(canonical_json(value)).hexdigest()


def check_turn_id(turn_id: str) -> str:
    """A turn id: a valid identifier without ``/``, at most :data:`MAX_TURN_ID_BYTES` bytes.

    A new turn's id is held to more (:func:`check_new_turn_id`); this is what every turn
    already stored is read by, so turns submitted before that rule stay readable.

    Raises:
        InvalidArgumentError: anything else (so every key of the turn fits before any call).
    """
    validate_id(turn_id, "turn_id")
    if "/" in turn_id or len(turn_id.encode()) > MAX_TURN_ID_BYTES:
        raise InvalidArgumentError(
            f"turn_id {turn_id[:80]!r} must not contain '/' and must be at most "
            f"{MAX_TURN_ID_BYTES} UTF-8 bytes, so every key of the turn fits; use a shorter id"
        )
    return turn_id


def check_new_turn_id(turn_id: str) -> str:
    """The id of a turn being submitted: :func:`check_turn_id`, and no control character
    (C0, DEL, C1, and the line and paragraph separators U+2028 and U+2029: a newline in an
    id would break the lines of a trace and the keys' readability).

    Raises:
        InvalidArgumentError: anything else.
    """
    check_turn_id(turn_id)
    control = control_character(turn_id)
    if control is not None:
        raise InvalidArgumentError(
            f"turn_id {turn_id[:80]!r} contains the control character "
            f"U+{ord(control):04X}; a turn id is printable text (letters, digits, "
            "'-', '_', '.' ...)"
        )
    return turn_id


def _preview(value: object) -> str:
    return _shown(canonical_json(value))


def _shown(encoded: bytes) -> str:
    """The preview of a value whose canonical JSON is ``encoded``."""
    text = encoded.decode("utf-8", "replace")
    return text if len(text) <= _PREVIEW_CHARS else text[:_PREVIEW_CHARS] + "..."


MAX_BLOB_THRESHOLD = 1024 * 1024
"""The highest ``blob_threshold`` accepted: several values inline must still fit one append."""


def check_blob_threshold(threshold: object, what: str = "blob_threshold") -> int:
    """``threshold`` if it is an int from 0 to :data:`MAX_BLOB_THRESHOLD`.

    Raises:
        InvalidArgumentError: anything else, naming ``what``.
    """
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, int)
        or not 0 <= threshold <= MAX_BLOB_THRESHOLD
    ):
        raise InvalidArgumentError(
            f"{what} must be an int from 0 to {MAX_BLOB_THRESHOLD} bytes, got {threshold!r}"
        )
    return threshold


async def stored_value(blobs: Blobs, value: Any, threshold: int) -> dict[str, Any]:
    """``{"value": value}``, or ``{"blob": ref}`` after storing it when its canonical JSON
    exceeds ``threshold`` bytes: how the journal writes replies, inputs and state."""
    encoded = canonical_json(value)
    if len(encoded) <= threshold:
        return {"value": value}
    ref = await blobs.put(encoded)
    return {"blob": ref.model_dump()}


async def load_value(blobs: Blobs, body: dict[str, Any]) -> Any:
    """The value a :func:`stored_value` body holds (reading its blob if it has one)."""
    if "blob" in body:
        return json.loads(await blobs.get(BlobRef.model_validate(body["blob"])))
    return body.get("value")


def _state_event(name: str, stored: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"t": "state", "name": name, **stored, **extra}


async def write_state(
    world: World, session_id: str, name: str, value: Any, *, threshold: int = DEFAULT_BLOB_THRESHOLD
) -> None:
    """Set the session's state ``name`` from outside a turn (one append; a blob first when
    large). Tools running later see it through ``context.state``."""
    session_log_id(session_id)
    check_state_name(name)
    check_blob_threshold(threshold, "threshold")
    try:
        jsonable = to_jsonable_python(value)
        canonical_json(jsonable)
    except Exception as exc:
        raise InvalidArgumentError(f"state {name!r}: value is not JSON: {exc}") from None
    stored = await stored_value(session_blobs(world, session_id), jsonable, threshold)
    data = canonical_json(_state_event(name, stored))
    await append_session(world, session_id, [NewEvent(data=data)])


async def read_state(world: World, session_id: str, name: str) -> Any:
    """The session's latest state ``name`` (read from the session's latest checkpoint and
    the events after it), or None."""
    check_state_name(name)
    session_log_id(session_id)
    session, _ = await read_session(world, await current_log(world, session_id))
    latest = session.state.get(name)
    return None if latest is None else await load_value(session_blobs(world, session_id), latest)


_decode = decode_event


def _request_parts(payload: dict[str, Any]) -> dict[str, Any]:
    """Short digests of each message's fields and each tool: what a mismatch report compares."""
    messages: list[dict[str, str]] = []
    for message in payload["messages"]:
        entry = {"role": str(message.get("role"))}
        for key, value in message.items():
            if key != "role":
                entry[key] = digest_of(value)[:12]
        messages.append(entry)
    tools: dict[str, str] = {}
    for index, schema in enumerate(payload["tools"]):
        name = str(schema.get("function", {}).get("name", f"#{index}"))
        tools[name] = digest_of(schema)[:12]
    return {"messages": messages, "tools": tools}


def _request_difference(
    recorded: dict[str, Any], attempted: dict[str, Any], payload: dict[str, Any]
) -> list[str]:
    """A few lines saying where two model requests differ (which message, which field)."""
    lines: list[str] = []
    old, new = recorded.get("messages", []), attempted["messages"]
    for index in range(max(len(old), len(new))):
        if index >= len(old):
            lines.append(
                f"message {index} ({new[index]['role']}) is new: "
                f"{_preview(payload['messages'][index])[:120]}"
            )
            break
        if index >= len(new):
            lines.append(f"message {index} ({old[index].get('role')}) is no longer sent")
            break
        if old[index] != new[index]:
            fields = sorted(
                k for k in {*old[index], *new[index]} if old[index].get(k) != new[index].get(k)
            )
            for name in fields[:3]:
                now = payload["messages"][index].get(name)
                lines.append(
                    f"message {index} ({new[index]['role']}) field {name!r} differs; "
                    f"now: {_preview(now)[:120]}"
                )
            break
    old_tools, new_tools = recorded.get("tools", {}), attempted["tools"]
    for name in sorted({*old_tools, *new_tools}):
        if name not in new_tools:
            lines.append(f"tool {name!r} is no longer offered")
        elif name not in old_tools:
            lines.append(f"tool {name!r} is offered now but was not")
        elif old_tools[name] != new_tools[name]:
            lines.append(f"tool {name!r} has another schema or description now")
    if len(old) != len(new):
        lines.append(f"{len(old)} messages were sent then, {len(new)} now")
    return lines[:6]


@dataclass
class _Step:
    intent: dict[str, Any] | None = None
    """The latest intent (of generation ``intent["gen"]``, 0 when absent)."""
    outcome: dict[str, Any] | None = None
    unstarted: int = 0
    """How many of the step's intents are known not started: one more than the latest
    generation an ``unstarted`` event names (see :meth:`Journal._void_intent`)."""

    @property
    def void(self) -> bool:
        """The latest intent has no outcome and its call was not started: run it again."""
        if self.intent is None or self.outcome is not None:
            return False
        return int(self.intent.get("gen", 0)) < self.unstarted

    @property
    def identity(self) -> dict[str, Any]:
        source = self.outcome if self.outcome is not None else self.intent
        assert source is not None
        return {k: source.get(k) for k in ("kind", "name", "digest", "preview")}


@dataclass(frozen=True)
class PastTurn:
    """A turn of the session submitted before the current one, as the current one sees it:
    its message and its reply, or the failure that ended it (exactly one of the two)."""

    turn_id: str
    message: str
    reply: str | None = None
    failure: dict[str, Any] | None = None
    """``error_type``, ``error``, ``attempts``, ``step``: see :attr:`Journal.failure`."""

    @property
    def answer(self) -> str:
        """What the assistant said: the reply, or a note that the turn failed and why (what
        :meth:`Agent.conversation <world_core.Agent.conversation>` shows the model)."""
        if self.reply is not None:
            return self.reply
        failure = self.failure or {}
        return (
            f"(This turn did not finish: {failure.get('error_type')}: "
            f"{str(failure.get('error'))[:500]})"
        )


@dataclass
class _Turn:
    steps: dict[int, _Step] = field(default_factory=dict)
    user_message: str | None = None
    reply: str | None = None
    failure: dict[str, Any] | None = None
    past: list[PastTurn] = field(default_factory=list)
    waiting_for: str | None = None
    parent: dict[str, str] | None = None
    tail: int = 0
    parked: list[str] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)


class Journal:
    """The journal of one turn. Open with :meth:`open`; drive it with :meth:`model`,
    :meth:`call`, :meth:`tool`, :meth:`now`, :meth:`uuid`, :meth:`random`; end with
    :meth:`finish` (or :meth:`fail`). Not safe for concurrent use: steps are numbered in call
    order.

    Counters for observers: ``model_calls`` (model requests this instance sent),
    ``tool_runs`` (tool bodies it ran), ``replayed`` (steps it read back instead).
    """

    def __init__(
        self,
        world: World,
        session_id: str,
        turn_id: str,
        turn: _Turn,
        *,
        crash: CrashPoint | None,
        observer: TurnObserver | None = None,
        blob_threshold: int,
        defer_safe: bool = True,
        clock: Callable[[], float] = time.time,
        lease_held: Callable[[], bool] | None = None,
        owner: str | None = None,
        queue: str = DEFAULT_QUEUE,
        log_id: str | None = None,
        run: Mapping[str, str | float] | None = None,
    ) -> None:
        self._world = world
        self._view: SessionView | None = None
        self._owner = owner
        self._run = dict(run) if run is not None else None
        self._started: dict[int, float] = {}  # step -> when this Journal began it (its clock)
        self.queue = validate_id(queue, "queue")
        self.session_id = session_id
        self.turn_id = turn_id
        self._log_id = log_id if log_id is not None else session_log_id(session_id)
        """The log of the session's generation holding this turn."""
        self._turn = turn
        self._crash = crash
        self._blob_threshold = blob_threshold
        self._blobs = session_blobs(world, session_id)
        self._next = 0
        self._pending: list[NewEvent] = []
        self._pending_bytes = 0
        self._defer_safe = defer_safe
        self._clock = clock
        self._lease_held = lease_held
        self._broken: BaseException | None = None
        self._raised: tuple[BaseException, int] | None = None  # a recorded error, its step
        self.model_calls = 0
        self.tool_runs = 0
        self.replayed = 0
        self._appended_events = 0
        self._appended_bytes = 0
        self._suspended_at: int | None = None  # the wait this Journal left the turn in
        self._in_tool: str | None = None  # the tool whose call runs now
        self._observer = observer
        self._pending_steps: list[int] = []  # steps whose outcomes are in _pending
        self._step_extra: dict[str, Any] = {}  # what model() and tool() add to the next StepInfo
        self._taking: StepInfo | None = None  # the step _take runs now, as observers see it
        self._calls: dict[tuple[str, str], list[int]] | None = None  # see _latest_call
        self._shielding = False  # within _shielded (this Journal is used by one task)
        self._anyio: type[AsyncBackend] | None = None  # see _backend
        self._tail = turn.tail  # the log's tail after this Journal's last write: _void_intent
        self.lease_refusal: LeaseLostError | None = None
        """Set when a tool's :meth:`ToolContext.check` refused because the lease was lost: the
        attempt is over (not the turn); a worker then stops without acking or failing it."""

    @classmethod
    async def open(
        cls,
        world: World,
        session_id: str,
        turn_id: str,
        *,
        crash: CrashPoint | None = None,
        observer: TurnObserver | None = None,
        blob_threshold: int = DEFAULT_BLOB_THRESHOLD,
        defer_safe: bool = True,
        clock: Callable[[], float] | None = None,
        lease_held: Callable[[], bool] | None = None,
        owner: str | None = None,
        queue: str = DEFAULT_QUEUE,
        history: int | None = None,
        run: Mapping[str, str | float] | None = None,
    ) -> Journal:
        """Load the session log (one read, plus the blobs it names) and return the journal of
        ``turn_id``.

        Args:
            crash: die at this point (see :mod:`world_core.journal._crash`); None in production.
            observer: told of each step as it starts, finishes or is replayed, and of the
                model's text as it streams (see :mod:`world_core.journal._observer`); its
                errors are logged and dropped. A model client with ``stream`` is streamed.
            blob_threshold: values above this many bytes go to blobs.
            defer_safe: let ``safe`` tool outcomes ride with the next append (the default);
                False writes each at once, one append per ``safe`` step.
            clock: UNIX time on the store's clock (a worker derives it from its lease); the
                local clock by default. Deadlines are recorded and compared on it.
            lease_held: tells tools whether the turn's lease is still held (a worker passes
                it); always True by default.
            owner: who runs the turn (a worker passes its queue message's id): recorded with
                each wait's outcome, so a wake-up for a wait someone else resumed is known
                as stale (:attr:`resumed_by`).
            queue: the queue the turn's messages are on (its worker's): child runs are
                queued there unless told otherwise, and their ends wake this turn there.
            run: who runs this attempt of the turn, recorded with every event this Journal
                writes (``"run"``; a worker passes ``worker``, ``message``, ``attempt``, ``lease``),
                so a trace can tell which run wrote what. Every event also carries ``at``
                (``clock()`` when it was made) and each outcome ``started`` (when this Journal
                began the step). Readers must accept events without them (older histories).
            history: how many earlier turns :attr:`history` must hold at least (None: all).
                Up to :data:`~world_core.journal._session.HISTORY_WINDOW`, the turn is read
                from the session's latest checkpoint, whatever the session's length; more
                reads the whole log.

        Raises:
            InvalidIdentifierError, InvalidArgumentError: bad ids (nothing is read).
        """
        session_log_id(session_id)
        check_turn_id(turn_id)
        check_blob_threshold(blob_threshold)
        if history is not None and (isinstance(history, bool) or not isinstance(history, int)):
            raise InvalidArgumentError(f"history must be None or an int >= 0, got {history!r}")
        if history is not None and history < 0:
            raise InvalidArgumentError(f"history must be None or an int >= 0, got {history!r}")
        log_id = await turn_log(world, session_id, turn_id)
        view, events = await _open_view(world, log_id, turn_id, history)
        turn = await _load(view, events, turn_id, session_blobs(world, session_id))
        journal = cls(
            world,
            session_id,
            turn_id,
            turn,
            crash=crash,
            observer=observer,
            blob_threshold=blob_threshold,
            defer_safe=defer_safe,
            clock=clock if clock is not None else time.time,
            lease_held=lease_held,
            owner=owner,
            queue=queue,
            log_id=log_id,
            run=run,
        )
        journal._view = view
        if history is not None and len(turn.past) > history:
            turn.past = turn.past[len(turn.past) - history :]
        return journal

    # -- what the turn is about ----------------------------------------------------------------

    @property
    def user_message(self) -> str:
        """The message submitted for this turn.

        Raises:
            NotFoundError: the turn was never submitted (no ``turn/<t>/input`` event).
        """
        if self._turn.user_message is None:
            raise NotFoundError(
                f"turn {self.turn_id!r} of session {self.session_id!r} has no input; "
                "submit it with Client.submit"
            )
        return self._turn.user_message

    @property
    def submitted(self) -> bool:
        """The turn's input is in its log: False for a turn never submitted, or deleted
        (``delete_session`` with ``force``) since its message was queued."""
        return self._turn.user_message is not None

    @property
    def history(self) -> list[tuple[str, str]]:
        """(message, answer) of every turn of the session submitted before this one, oldest
        first; a failed turn's answer is a note saying why it failed (:attr:`PastTurn.answer`).
        Turns run in submission order, so when this turn runs they have all ended and replay
        sees the same."""
        return [(past.message, past.answer) for past in self._turn.past]

    @property
    def past_turns(self) -> list[PastTurn]:
        """The turns :attr:`history` is made of, with their ids, replies and failures."""
        return list(self._turn.past)

    @property
    def waiting_for(self) -> str | None:
        """The earliest turn submitted before this one that has neither a reply nor a failure
        yet, or None. While there is one, this turn takes no step
        (:class:`~world_core.errors.TurnNotReadyError`)."""
        return None if self.finished else self._turn.waiting_for

    @property
    def resumed_by(self) -> str | None:
        """Who wrote the outcome of this turn's latest wait (the ``owner`` that resumed it), or
        None when no wait of it has ended, or the turn is suspended in a wait now. In between,
        the turn belongs to that owner: any other message for it is a stale wake-up."""
        if self.open_wait is not None:
            return None
        waits = [
            n
            for n, step in self._turn.steps.items()
            if step.outcome is not None and step.outcome.get("kind") in WAIT_KINDS
        ]
        if not waits:
            return None
        by = (self._turn.steps[max(waits)].outcome or {}).get("by")
        return None if by is None else str(by)

    @property
    def open_wait(self) -> int | None:
        """The step of the wait this turn is suspended in (its latest step: a wait with an
        intent and no outcome), or None."""
        if not self._turn.steps:
            return None
        last = max(self._turn.steps)
        step = self._turn.steps[last]
        intent = step.intent
        if step.outcome is None and intent is not None and intent.get("kind") in WAIT_KINDS:
            return last
        return None

    def near_limit(self, limits: Any) -> bool:
        """Whether the session's log, as this Journal read it plus what it appended, is near
        (``limits.warn_fraction`` of) a continue-as-new limit: only then is it worth reading
        again to decide (see :mod:`world_core.journal._continue`)."""
        if self._view is None:
            return True
        fraction = float(limits.warn_fraction) * 0.9
        events = self._view.tail + self._appended_events
        size = self._view.bytes + self._appended_bytes
        return bool(events >= limits.max_events * fraction or size >= limits.max_bytes * fraction)

    @property
    def summary(self) -> str | None:
        """The summary of the session's earlier generations (continue-as-new) the agent
        wrote, or None."""
        return None if self._view is None else self._view.summary

    @property
    def parent(self) -> dict[str, str] | None:
        """For a child run: the turn that started it (``session``, ``turn``, ``queue``)."""
        return None if self._turn.parent is None else dict(self._turn.parent)

    @property
    def parked_messages(self) -> list[str]:
        """Ids of this turn's queue messages handed on by :meth:`park`."""
        return list(self._turn.parked)

    @property
    def recorded_reply(self) -> str | None:
        """The reply recorded for this turn (by this run or an earlier one), or None."""
        return self._turn.reply

    @property
    def failure(self) -> dict[str, Any] | None:
        """The failure recorded for this turn (``error_type``, ``error``, ``attempts``,
        ``step``), or None."""
        return None if self._turn.failure is None else dict(self._turn.failure)

    @property
    def finished(self) -> bool:
        """True once the turn has a recorded reply or a recorded failure."""
        return self._turn.reply is not None or self._turn.failure is not None

    @property
    def position(self) -> int:
        """The number of the next step."""
        return self._next

    @property
    def recorded_steps(self) -> int:
        """How many steps, counted from 0, have their outcome in the journal: a run reads
        these back (replays them) before it runs anything."""
        n = 0
        while n in self._turn.steps and self._turn.steps[n].outcome is not None:
            n += 1
        return n

    @property
    def idempotency_prefix(self) -> str:
        return f"{self.session_id}/{self.turn_id}"

    def idempotency_key(self, step: int) -> str:
        """The default idempotency key of ``step`` (at most 255 bytes)."""
        return idempotency_key(self.session_id, self.turn_id, step)

    # -- steps -----------------------------------------------------------------------------------

    async def model(self, client: ModelClient, request: ModelRequest) -> ModelReply:
        """One model call as a step (no intent; one append when it runs).

        Raises:
            ModelReplyError: the server answered with something unusable; recorded, so a
                replay raises it again without a second (paid) call.
        """
        payload = request.model_dump(mode="json")
        preview = {
            "messages": len(payload["messages"]),
            "tools": [t.get("function", {}).get("name") for t in payload["tools"]],
            "last_message": payload["messages"][-1] if payload["messages"] else None,
        }
        parts = _request_parts(payload)
        observer = self._observer
        stream = getattr(client, "stream", None) if observer is not None else None
        model_name = getattr(client, "model", None)
        self._step_extra = {"model": model_name if isinstance(model_name, str) else None}
        self._step_extra["input"] = payload

        async def run(step: int) -> dict[str, Any]:
            self.model_calls += 1

            def on_text(delta: str, retry: int = 0) -> None:
                notify(observer, "model_text", step, delta, retry)

            try:
                if callable(stream):  # streamed to the observer, recorded as one reply
                    reply = cast(ModelReply, await stream(request, on_text))
                else:
                    reply = await client.complete(request)
            except ModelReplyError as exc:  # paid for: record it, never ask again
                return {"error": _describe(exc), "raw": exc.raw[:_ERROR_CHARS]}
            output = reply.model_dump(mode="json")
            if output.get("usage") is None:
                output.pop("usage", None)  # recorded only when the server reported it
            return {"output": output}

        try:
            result = await self._step(
                "model", "model", digest_of(payload), preview, "safe", run, parts=(parts, payload)
            )
        finally:
            self._step_extra = {}  # taken by the step, unless it was refused before
        if "error" in result:
            self._unusable(result)
        return ModelReply.model_validate(result["output"])

    def _unusable(self, result: dict[str, Any]) -> NoReturn:
        """Raise the recorded unusable reply of the model step just taken."""
        unusable = ModelReplyError(
            f"turn {self.turn_id!r} step {self._next - 1}: {result['error']} (recorded; "
            "the request is not sent again)",
            raw=str(result.get("raw", "")),
        )
        self._raised = (unusable, self._next - 1)
        raise unusable

    async def call(self, tool: Tool, arguments: dict[str, Any]) -> Any:
        """Run ``tool`` with ``arguments`` as a step; returns its JSON result.

        Raises:
            InvalidArgumentError: arguments do not match the tool's schema (no step is taken).
            ToolError: the tool raised or timed out; that is the recorded outcome.
            PossiblyRanError: a ``never`` call was interrupted and may have happened.
        """
        raw = to_jsonable_python(arguments)
        args = tool.parse(arguments)
        step = self._next
        result = await self._tool_step(tool, raw, args)
        failed: ToolError | None = None
        if result.get("interrupted"):
            failed = PossiblyRanError(
                f"{tool.name} (step {step}) may or may not have happened: {POSSIBLY_RAN}",
                tool=tool.name,
                step=step,
                error=POSSIBLY_RAN,
                idempotency_key=str(result.get("key", self.idempotency_key(step))),
            )
        elif "error" in result:
            failed = ToolError(
                f"{tool.name} (step {step}) failed: {result['error']}",
                tool=tool.name,
                step=step,
                error=str(result["error"]),
            )
        if failed is not None:
            self._raised = (failed, step)
            raise failed
        return result["output"]

    async def tool(self, tool: Tool, call: ToolCall) -> str:
        """Run a tool call the model made; returns the text for the ``tool`` message.

        Arguments that are not JSON or do not match the schema take no step: the model gets
        the error text (deterministic, since the call came from a journaled reply).
        """
        try:
            arguments = json.loads(call.arguments or "{}")
            if not isinstance(arguments, dict):
                raise ValueError("arguments must be a JSON object")
            if not _finite(arguments):  # Python reads NaN, Infinity, 1e999; JSON cannot hold them
                raise ValueError("arguments must hold finite numbers (no NaN, Infinity, 1e999)")
            args = tool.parse(arguments)
        except (ValueError, InvalidArgumentError) as exc:
            return f"Error: {exc}"
        self._step_extra = {"call_id": call.id}
        try:
            result = await self._tool_step(tool, arguments, args)
        finally:
            self._step_extra = {}  # taken by the call's step, or left by a refused approval
        if "error" in result:
            return f"Error: {result['error']}"
        output = result["output"]
        return output if isinstance(output, str) else canonical_json(output).decode("utf-8")

    async def step(
        self,
        kind: Literal["model", "tool"],
        name: str,
        fn: Callable[[ToolContext | None], Awaitable[Any]],
        *,
        input: object = None,
        replay: Replay = "safe",
        timeout: float = DEFAULT_TOOL_TIMEOUT,  # noqa: ASYNC109 - recorded as the deadline
    ) -> Any:
        """Run ``fn`` as one named step under the journal's rules; returns its JSON result.

        The general hook for layers that drive their own calls (adapters of agent
        frameworks): the step is identified by ``kind``, ``name`` and the digest of
        ``input`` (canonical JSON: leave out what changes between runs, such as timestamps),
        and replay compares them like any step's.

        * ``kind="model"``: a paid call, like :meth:`model`: no intent; its outcome is
          appended at once, so a finished call is never made twice. ``fn(None)`` runs;
          an exception it raises is not recorded (the step runs again when retried), except
          :class:`~world_core.errors.ModelReplyError`: the server answered (paid) with
          something unusable, so it is the recorded outcome and a replay raises it again
          without calling. ``replay`` and ``timeout`` do not apply.
        * ``kind="tool"``: a call with a replay label, like :meth:`call`: ``never`` writes its
          intent (with the deadline ``timeout`` seconds away) before ``fn`` runs, shielded,
          and an interrupted call is never run again; ``safe`` runs again. ``fn(context)``
          gets the call's :class:`~world_core.ToolContext` (idempotency key, ``check()``).
          Anything it raises is the recorded outcome.

        Returns:
            ``fn``'s return value in its JSON form (as a replay returns it).

        Raises:
            InvalidArgumentError: a bad ``kind``, ``name``, ``replay`` or ``timeout``, or an
                ``input`` JSON cannot hold (nothing is recorded).
            ToolError: the tool step raised or timed out (recorded; a replay raises it too).
            ModelReplyError: the model step's unusable reply (recorded; a replay raises it
                too).
            PossiblyRanError: a ``never`` step was interrupted and may have happened.
            NonDeterminismError: the journal holds another step at this position.
        """
        if kind not in ("model", "tool"):
            raise InvalidArgumentError(f"kind must be 'model' or 'tool', got {kind!r}")
        if not isinstance(name, str) or not name or len(name) > _PREVIEW_CHARS:
            raise InvalidArgumentError(
                f"name must be a non-empty str of at most {_PREVIEW_CHARS} characters, "
                f"got {name!r:.80}"
            )
        if not callable(fn):
            raise InvalidArgumentError(f"fn must be an async callable, got {fn!r:.80}")
        try:
            input = to_jsonable_python(input)  # what is digested is what is recorded
            digest = digest_of(input)
        except Exception as exc:
            raise InvalidArgumentError(f"step {name!r}: input is not JSON: {exc}") from None
        if kind == "model":

            async def run(step: int) -> dict[str, Any]:
                self.model_calls += 1
                try:
                    return {"output": to_jsonable_python(await fn(None))}
                except ModelReplyError as exc:  # paid for: record it, never ask again
                    return {"error": _describe(exc), "raw": exc.raw[:_ERROR_CHARS]}

            result = await self._step("model", name, digest, input, "safe", run)
            if "error" in result:
                self._unusable(result)
            return result["output"]
        label = _check_replay(replay, name)
        seconds = _check_timeout(timeout, name)

        async def body(context: ToolContext) -> Any:
            return await fn(context)

        unit = Tool(
            name=name,
            description="",
            replay=label,
            fn=body,
            arguments=_NO_ARGUMENTS,
            context_parameter="context",
            timeout=seconds,
        )

        n = self._next
        result = await self._step("tool", name, digest, input, label, None, tool_run=(unit, {}))
        if result.get("interrupted"):
            failed: ToolError = PossiblyRanError(
                f"{name} (step {n}) may or may not have happened: {POSSIBLY_RAN}",
                tool=name,
                step=n,
                error=POSSIBLY_RAN,
                idempotency_key=str(result.get("key", self.idempotency_key(n))),
            )
        elif "error" in result:
            failed = ToolError(
                f"{name} (step {n}) failed: {result['error']}",
                tool=name,
                step=n,
                error=str(result["error"]),
            )
        else:
            return result["output"]
        self._raised = (failed, n)
        raise failed

    async def _tool_step(
        self, tool: Tool, raw: dict[str, Any], args: dict[str, Any]
    ) -> dict[str, Any]:
        if tool.approval == "required":
            refused = await self._approval(tool.name, raw, tool.approval_timeout)
            if refused is not None:
                return refused

        encoded = canonical_json(raw)  # once, for the digest and the preview
        digest = hashlib.sha256(encoded).hexdigest()
        return await self._step(
            "tool",
            tool.name,
            digest,
            raw,
            tool.replay,
            None,
            tool_run=(tool, args),
            shown=_shown(encoded),
        )

    async def approval(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        timeout: float,  # noqa: ASYNC109
    ) -> str | None:
        """Wait for a person's decision on a call of tool ``name`` with ``arguments``, as a step
        of its own: the general hook for adapters whose framework decides itself which calls
        need approval (the OpenAI Agents SDK's ``needs_approval``). Take the call's own step
        (:meth:`step`, kind ``tool``, the same ``name`` and ``arguments`` as its ``input``)
        right after an approval, as :meth:`call` does for an ``approval="required"`` tool: a
        model's retry of an approved call that was interrupted or failed is then covered by
        the decision already given.

        The turn suspends (:class:`TurnSuspended`) until :meth:`Client.approve
        <world_core.Client.approve>` / ``reject`` (``world approve``) decides or ``timeout``
        seconds pass; it is listed by :meth:`Client.pending_approvals
        <world_core.Client.pending_approvals>` meanwhile. A replay returns the recorded
        decision.

        Returns:
            None when approved; else why the call must not run (who rejected it and why, or
            that nobody decided in time), for the model.

        Raises:
            InvalidArgumentError: a bad ``name`` or ``timeout``, or ``arguments`` that are not
                a JSON object (nothing is recorded).
        """
        if not isinstance(name, str) or not name or len(name) > _PREVIEW_CHARS:
            raise InvalidArgumentError(
                f"name must be a non-empty str of at most {_PREVIEW_CHARS} characters, "
                f"got {name!r:.80}"
            )
        seconds = check_seconds(timeout, "timeout")
        if seconds <= 0:
            raise InvalidArgumentError(
                f"timeout must be > 0 seconds (how long a person has to decide), got {timeout!r}"
            )
        try:
            raw = to_jsonable_python(arguments)
            canonical_json(raw)
        except Exception as exc:
            raise InvalidArgumentError(
                f"approval of {name!r}: arguments are not JSON: {exc}"
            ) from None
        if not isinstance(raw, dict):
            raise InvalidArgumentError(
                f"approval of {name!r}: arguments must be a JSON object, "
                f"got {type(arguments).__name__}"
            )
        refused = await self._approval(name, raw, seconds)
        return None if refused is None else str(refused["error"])

    async def _approval(
        self, name: str, raw: dict[str, Any], seconds: float
    ) -> dict[str, Any] | None:
        """Wait for the decision on a call of tool ``name`` (a step of its own, before the
        call's); None when approved, else the result the call gets instead of running."""
        signal, _ = approval_signal(self.turn_id, self._next)
        encoded = canonical_json(raw)
        arguments = raw if len(encoded) <= _APPROVAL_ARGUMENTS_BYTES else _preview(raw)
        spec = {"tool": name, "arguments": arguments, "timeout": seconds}
        earlier = self._approved_before(name, digest_of(raw))
        if earlier is not None:
            # The model retries a call that was approved and then interrupted or failed (it
            # may not have happened): the decision covers the retry, as its key does.
            await self._settle_step("approval", name, spec, {"approved_before": earlier})
            return None
        result = await self._wait(
            "approval",
            name,
            spec,
            lambda: self._clock() + seconds,
            signal=signal,
            signal_turn=self.turn_id,
        )
        if "approved_before" in result:
            return None
        found = result.get("signal")
        if not isinstance(found, dict):
            return {
                "error": f"nobody approved this call of {name} within {seconds:g} s, so it "
                "did not run"
            }
        payload = found.get("payload")
        decision: dict[str, Any] = payload if isinstance(payload, dict) else {}
        if decision.get("approved") is True:
            return None
        reason = decision.get("reason")
        because = f": {reason}" if reason else ""
        return {
            "error": f"{found.get('sender')} rejected this call of {name}, so it did not "
            f"run{because}"
        }

    def now(self) -> float:
        """UNIX time, journaled: replay returns the recorded value."""
        return float(self._value("now", time.time))

    def uuid(self) -> str:
        """A random UUID (hex string), journaled."""
        return str(self._value("uuid", lambda: str(_uuid.uuid4())))

    def random(self) -> float:
        """A float in [0, 1), journaled."""
        return float(self._value("random", _random.random))

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` durably: the fire time is recorded once (store clock), the turn is
        unloaded meanwhile (:class:`TurnSuspended` leaves the agent code; a worker queues a
        wake-up) and resumes on any worker at that time; a time that passed while no worker
        ran fires at once. On replay the recorded fire time is used, never recomputed."""
        wait = check_seconds(seconds, "seconds")
        await self._wait("timer", "sleep", {"seconds": wait}, lambda: self._clock() + wait)

    async def sleep_until(self, when: float) -> None:
        """Wait until UNIX time ``when`` (store clock), durably: see :meth:`sleep`."""
        at = check_seconds(when, "when", most=time.time() + MAX_WAIT_SECONDS)
        await self._wait("timer", "sleep_until", {"until": at}, lambda: at)

    async def wait_for_signal(self, name: str, *, timeout: float) -> Signal | None:  # noqa: ASYNC109
        """Wait for the signal ``name`` addressed to this turn or its session; the signal, or
        None when ``timeout`` seconds passed first. Each signal is consumed once: by the first
        wait for its name (signals sent before the wait are waiting for it). The turn holds
        no worker while it waits (see :meth:`sleep`)."""
        check_signal_name(name)
        seconds = check_seconds(timeout, "timeout")
        result = await self._wait(
            "signal",
            name,
            {"name": name, "timeout": seconds},
            lambda: self._clock() + seconds,
            signal=name,
        )
        found = result.get("signal")
        return None if not isinstance(found, dict) else Signal(**found)

    async def start_child(self, message: str, *, queue: str | None = None) -> str:
        """Start a child run: a turn of a session of its own (its own log) with ``message``,
        queued on ``queue`` (default: this turn's); returns the child's session id, for
        :meth:`wait_child`. A step: replay returns the same id and starts nothing; a crash
        while starting it starts it once (the submission is idempotent)."""
        if not isinstance(message, str):
            raise InvalidArgumentError(f"message must be a str, got {type(message).__name__}")
        target = validate_id(queue if queue is not None else self.queue, "queue")
        spec = {"message": message, "queue": target}

        async def run(step: int) -> dict[str, Any]:
            from world_core.journal._client import Client  # the layer above the journal

            seed = f"{self.session_id}\x00{self.turn_id}\x00{step}".encode("utf-8", "surrogatepass")
            child = "child-" + hashlib.sha256(seed).hexdigest()[:40]
            parent = {"session": self.session_id, "turn": self.turn_id, "queue": self.queue}
            await self._retrying(
                lambda: Client(self._world, queue=target).submit(
                    child, message, turn_id=CHILD_TURN, parent=parent
                )
            )
            return {"output": child}

        result = await self._step("spawn", "child", digest_of(spec), spec, "safe", run)
        return str(result["output"])

    async def wait_child(self, child: str, *, timeout: float) -> ChildResult | None:  # noqa: ASYNC109
        """Wait for the child run ``child`` (from :meth:`start_child`) to end; its reply or
        failure, or None when ``timeout`` seconds passed first. The turn holds no worker
        while it waits; the child's end wakes it. A wait for a child whose end an earlier
        wait of this turn received returns that end at once."""
        validate_id(child, "child")
        seconds = check_seconds(timeout, "timeout")
        result = await self._wait(
            "child",
            child,
            {"child": child, "timeout": seconds},
            lambda: self._clock() + seconds,
            signal=child_signal(child),
            signal_turn=self.turn_id,
        )
        found = result.get("signal")
        if not isinstance(found, dict):
            return None
        sent = found.get("payload")
        payload: dict[str, Any] = sent if isinstance(sent, dict) else {}
        reply = payload.get("reply")
        if payload.get("reply_in_child"):  # too long for the signal: read it from the child
            from world_core.journal._client import Client

            reply = await Client(self._world).reply(child, CHILD_TURN)
        failure = payload.get("failure")
        return ChildResult(
            session_id=child,
            turn_id=CHILD_TURN,
            reply=None if reply is None else str(reply),
            failure=failure if isinstance(failure, dict) else None,
        )

    def patched(self, name: str) -> bool:
        """Whether this run takes the new branch of a code change named ``name``.

        A run that reaches this point live records a marker and gets True. A replay gets
        True where its history holds the marker, and False where the history was written
        without it (by the code before the change): keep the old branch until no open history
        needs it. Removing the branch (the call) while a history holds its marker makes the
        replay raise :class:`~world_core.errors.NonDeterminismError` naming the marker.
        """
        check_signal_name(name)
        self._check_usable()
        self._check_order()
        n = self._next
        step = self._turn.steps.get(n)
        if step is not None:
            identity = step.identity
            if identity["kind"] != "patch":
                return False  # written before the change: the old branch
            if identity["name"] != name:
                raise self._mismatch(n, identity, {"kind": "patch", "name": name})
            self._next += 1
            self.replayed += 1
            return True
        if self._turn.reply is not None:
            return False  # the recorded run ended here without the marker
        self._next += 1
        body = {"kind": "patch", "name": name, "digest": digest_of(None), "preview": "null"}
        self._pending.append(self._event("outcome", {**body, "result": {"output": True}}, n))
        return True

    async def finish(self, reply: str) -> str:
        """Record the turn's reply (with any deferred steps) and return it.

        On replay of a finished turn, nothing is written: the recorded reply is returned.

        Raises:
            NonDeterminismError: the journal holds steps this run did not reach, or another
                reply.
            InvalidArgumentError: ``reply`` is not a str.
        """
        self._check_usable()
        self._check_order()
        self._check_not_suspended_or_in_tool()
        if not isinstance(reply, str):
            raise InvalidArgumentError(f"a reply is a str, got {type(reply).__name__}")
        beyond = sorted(n for n in self._turn.steps if n >= self._next)
        if beyond:
            raise self._mismatch(beyond[0], self._turn.steps[beyond[0]].identity, "end of turn")
        if self._turn.reply is not None:
            if self._turn.reply != reply:
                raise NonDeterminismError(
                    f"turn {self.turn_id!r} recorded the reply {self._turn.reply[:200]!r} but "
                    f"this run produced {reply[:200]!r}; replay must be deterministic",
                    position=f"turn {self.turn_id} reply",
                    recorded=self._turn.reply,
                    attempted=reply,
                )
            return reply
        stored = await self._retrying(
            lambda: stored_value(self._blobs, reply, self._blob_threshold)
        )
        body = {"steps": self._next, **({"reply": reply} if "value" in stored else stored)}
        await self._append([self._event("reply", body), *self._checkpoint()])
        self._turn.reply = reply
        return reply

    async def fail(
        self, error: BaseException | str, *, attempts: int = 1, step: int | None = None
    ) -> bool:
        """Record that the turn cannot finish: the error's class and message, the attempts it
        had and the step it stopped at (``step``, else where this Journal's run got to).
        Clients waiting on the turn are told.

        Works on a Journal that stopped after a failed append. Writes nothing when the turn
        already has a reply or a failure. Returns True if this call recorded it.
        """
        if self._turn.reply is not None or self._turn.failure is not None:
            return False
        if isinstance(error, BaseException):
            error_type, message = type(error).__name__, str(error)
        else:
            error_type, message = "Error", error
        record = {
            "error_type": error_type,
            "error": message[:_ERROR_CHARS],
            "attempts": attempts,
            "step": self._next if self._turn.steps or self._next else None,
        }
        if self._raised is not None and self._raised[0] is error:
            record["step"] = self._raised[1]  # the step whose recorded outcome is this error
        if step is not None:
            record["step"] = step
        try:
            await self._write([self._event("failure", record), *self._checkpoint()])
        except DuplicateKeyError as exc:
            existing = _decode(exc.existing.data) or {}
            if existing.get("t") != "failure":
                raise
            self._turn.failure = {k: existing.get(k) for k in record}
            return False
        self._turn.failure = record
        return True

    async def park(self, message_id: str) -> bool:
        """Record that the queue message ``message_id``, which was to run this turn, is handed
        on because an earlier turn (:attr:`waiting_for`) has not finished. Whoever ends that
        turn then sends this one a new message (:func:`~world_core.journal._order.hand_on`).

        The event is appended only if the session log is still as this Journal read it
        (``expect_tail``), so it cannot slip in after the earlier turn ended unseen. Returns
        False when the log changed meanwhile: open a new Journal and decide again.
        """
        waiting_for = self.waiting_for
        if waiting_for is None:
            raise InvalidArgumentError(
                f"turn {self.turn_id!r} waits for no earlier turn: run it instead of parking it"
            )
        validate_id(message_id, "message_id")
        n = len(self._turn.parked) + 1
        body = {"t": "park", "turn": self.turn_id, "message": message_id, "behind": waiting_for}
        event = NewEvent(key=f"turn/{self.turn_id}/park/{n}", data=canonical_json(body))
        try:
            self._tail = await self._world.log.append(
                self._log_id, [event], expect_tail=self._turn.tail
            )
        except (ConflictError, DuplicateKeyError):
            return False
        self._turn.parked.append(message_id)
        return True

    # -- machinery -------------------------------------------------------------------------------

    def _checkpoint(self) -> list[NewEvent]:
        """The session's checkpoint as this Journal read it (see _session), to ride with the
        turn's end; a marker when it would be too large to carry inline (readers then read
        the whole log)."""
        if self._view is None:
            return []
        body = self._view.checkpoint(as_of=self._turn.tail)
        body["turn"] = self.turn_id
        data = canonical_json(body)
        if len(data) > _CHECKPOINT_BYTES:
            data = canonical_json({"t": "checkpoint", "turn": self.turn_id, "too_large": True})
        return [NewEvent(key=f"turn/{self.turn_id}/checkpoint", data=data)]

    def _event(
        self, what: str, body: dict[str, Any], step: int | None = None, *, gen: int = 0
    ) -> NewEvent:
        key = (
            f"turn/{self.turn_id}/{what}"
            if step is None
            else (f"turn/{self.turn_id}/step/{step}/{what}")
        )
        if gen:
            key += f"/{gen}"  # a step's later intents, after ones that were not started
        data: dict[str, Any] = {"t": what, "turn": self.turn_id, **body}
        if step is not None:
            data["step"] = step
            if what == "outcome" and step in self._started:
                data["started"] = self._started[step]
        data["at"] = round(self._clock(), 3)
        if self._run is not None:
            data["run"] = self._run
        return NewEvent(key=key, data=canonical_json(data))

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise WorldError(
                f"this Journal stopped after {type(self._broken).__name__}: {self._broken}; "
                "open a new one to continue the turn"
            ) from self._broken

    def _check_not_suspended_or_in_tool(self) -> None:
        if self._suspended_at is not None:
            raise InvalidArgumentError(
                f"turn {self.turn_id!r} was suspended at step {self._suspended_at} (a wait "
                "raised TurnSuspended) but the agent code went on: let TurnSuspended propagate "
                "(do not catch BaseException around journal calls); the worker resumes the "
                "turn when the wait ends"
            )
        if self._in_tool is not None:
            raise InvalidArgumentError(
                f"a journal step was taken inside the call of tool {self._in_tool!r} (turn "
                f"{self.turn_id!r}): tools cannot sleep, wait, call the model or other tools "
                "through the journal; do it in the agent code, between tool calls"
            )

    def _check_order(self) -> None:
        waiting_for = self.waiting_for
        if waiting_for is not None:
            raise TurnNotReadyError(
                f"turn {self.turn_id!r} of session {self.session_id!r} cannot run before turn "
                f"{waiting_for!r}, submitted earlier, has finished; a Worker runs them in order",
                waiting_for=waiting_for,
            )

    async def _append(self, events: list[NewEvent]) -> None:
        batch = [*self._pending, *events]
        if not batch:
            return
        try:
            await self._write(batch)
        except BaseException as exc:
            self._broken = exc
            raise
        self._flushed()

    async def _append_at(self, event: NewEvent, tail: int, *, last: bool) -> bool:
        """Append ``event`` (after the deferred outcomes) only if the log's tail is still
        ``tail``. False when it is not: nothing was written, and the caller decides again on
        what it reads now; on the ``last`` try the ``ConflictError`` is raised instead (the
        worker runs the turn again later). A transient fault is not retried here (a try that
        landed would look like another writer's): it fails the run, and the next run reads
        whether the write landed."""
        batch = [*self._pending, event]
        try:
            written = await self._shielded(
                lambda: self._world.log.append(self._log_id, batch, expect_tail=tail)
            )
        except ConflictError as exc:
            if not last:
                return False
            self._broken = exc
            raise
        except BaseException as exc:
            self._broken = exc
            raise
        self._wrote(batch, written)
        self._flushed()
        return True

    def _flushed(self) -> None:
        """The deferred outcomes were appended (with the batch just written)."""
        self._pending.clear()
        if self._pending_steps:
            recorded, self._pending_steps = self._pending_steps, []
            notify(self._observer, "steps_recorded", recorded)
        self._pending_bytes = 0

    async def _write(self, batch: list[NewEvent]) -> None:
        """Append ``batch``, shielded from cancellation, retrying transient faults.

        The first try is made here, in place (a step writes twice: no closure, no retry loop
        around a write that succeeds); after a transient fault, :meth:`_write_again` is
        retried with backoff."""
        if not self._shielding:
            await self._shielded(lambda: self._write(batch))
            return
        try:
            tail = await self._world.log.append(self._log_id, batch)
        except BackendUnavailableError as exc:
            await self._retrying(lambda: self._write_again(batch), failed=exc)
            return
        self._wrote(batch, tail)

    async def _write_again(self, batch: list[NewEvent]) -> None:
        """A later try of :meth:`_write`'s append, after a transient fault. Every event here is
        keyed: when it finds a key taken by an identical event, the earlier try landed (the
        batch is atomic), so it counts as done."""
        try:
            tail = await self._world.log.append(self._log_id, batch)
        except DuplicateKeyError as exc:
            mine = {event.key: event.data for event in batch}
            if mine.get(exc.key) != exc.existing.data:
                raise
            # A batch is consecutive: its last event is as far from the found one.
            keys = [event.key for event in batch]
            self._tail = exc.existing.seq + len(batch) - 1 - keys.index(exc.key)
            return
        self._wrote(batch, tail)

    def _wrote(self, batch: list[NewEvent], tail: int) -> None:
        self._tail = tail
        self._appended_events += len(batch)
        for event in batch:
            self._appended_bytes += len(event.data)

    async def _retrying(
        self,
        operation: Callable[[], Awaitable[T]],
        *,
        failed: BackendUnavailableError | None = None,
    ) -> T:
        """Run ``operation`` shielded from cancellation, retrying BackendUnavailableError with
        backoff for up to WRITE_RETRY_SECONDS (journal writes and blob puts are idempotent).
        ``failed``: the fault of a first try made by the caller (the backoff starts at once)."""
        if not self._shielding:
            return await self._shielded(lambda: self._retrying(operation, failed=failed))
        delay = 0.1
        give_up: float | None = None  # counted from the first fault (no clock read before)
        while True:
            if failed is None:
                try:
                    return await operation()
                except BackendUnavailableError as exc:
                    failed = exc
            now = anyio.current_time()
            if give_up is None:
                give_up = now + WRITE_RETRY_SECONDS
            if now + delay > give_up:
                raise failed
            log.warning(
                "turn %s/%s: journal write failed (%s); retrying in %.1f s",
                self.session_id,
                self.turn_id,
                failed,
                delay,
            )
            failed = None
            await anyio.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _backend(self) -> type[AsyncBackend]:
        """anyio's backend for the async library this Journal runs under, looked up once:
        each public anyio call (``CancelScope``, ``move_on_after``, ``current_time``, a
        checkpoint) looks it up again through sniffio, about 1.2 us of CPU a time and four a
        ``never`` step. The scopes, clock and checkpoint are the backend's own, those calls'
        very implementation: only the lookup is saved. The backend is one per library
        (asyncio, trio), not per event loop, and a Journal is not carried from one library
        to the other (its World's connections belong to the first)."""
        backend = self._anyio
        if backend is None:
            backend = self._anyio = anyio.lowlevel.current_token().backend_class
        return backend

    async def _shielded(self, operation: Callable[[], Awaitable[T]]) -> T:
        """``operation()`` shielded from cancellation. Inside, journal writes open no cancel
        scope of their own: a shield in a shield changes nothing and costs a scope each (a
        never step took five; now two and its tool's deadline)."""
        if self._shielding:
            return await operation()
        with self._backend().create_cancel_scope(shield=True):
            self._shielding = True
            try:
                return await operation()
            finally:
                self._shielding = False
        raise AssertionError("unreachable: nothing cancels this scope, so it swallows nothing")

    def _mismatch(
        self, step: int, recorded: object, attempted: object, detail: list[str] | None = None
    ) -> NonDeterminismError:
        if isinstance(recorded, dict) and recorded.get("kind") == "patch":
            marker = recorded.get("name")
            return NonDeterminismError(
                f"turn {self.turn_id!r} step {step}: the history took the new branch of "
                f"patched({marker!r}) here, but the code no longer asks patched({marker!r}) "
                f"(it does {attempted!r}). Keep the patched() branch until no open history "
                "holds its marker.",
                position=f"turn {self.turn_id} step {step}",
                recorded=recorded,
                attempted=attempted,
            )
        where = "".join(f"\n  {line}" for line in detail or [])
        what = f"the journal holds {recorded!r} but the code now does {attempted!r}."
        if detail and isinstance(recorded, dict) and isinstance(attempted, dict):
            # The lines below say what changed; two previews that look alike would not.
            what = (
                f"the journal holds a {recorded.get('kind')} request "
                f"{str(recorded.get('digest'))[:12]} but the code now makes "
                f"{str(attempted.get('digest'))[:12]}:"
            )
        return NonDeterminismError(
            f"turn {self.turn_id!r} step {step}: {what}{where}\nThe code or its inputs changed "
            "since the turn ran; deploy the version that wrote it, or start a new turn.",
            position=f"turn {self.turn_id} step {step}",
            recorded=recorded,
            attempted=attempted,
        )

    def _claim_position(
        self,
        kind: str,
        name: str,
        digest: str,
        preview: object,
        parts: tuple[dict[str, Any], dict[str, Any]] | None = None,
    ) -> int:
        """Take the next step number; check a recorded step there matches."""
        if (
            self._broken is not None
            or self._turn.waiting_for is not None
            or self._suspended_at is not None
            or self._in_tool is not None
        ):  # only then can a check below refuse (asked here first: every step asks)
            self._check_usable()
            self._check_order()
            self._check_not_suspended_or_in_tool()
        n = self._next
        step = self._turn.steps.get(n)
        if step is not None:
            recorded = step.identity
            if (recorded["kind"], recorded["name"], recorded["digest"]) != (kind, name, digest):
                detail: list[str] = []
                source = step.outcome if step.outcome is not None else step.intent or {}
                if parts is not None and kind == recorded["kind"] == "model":
                    old_parts = source.get("parts")
                    if isinstance(old_parts, dict):
                        detail = _request_difference(old_parts, parts[0], parts[1])
                raise self._mismatch(n, recorded, _attempted(kind, name, digest, preview), detail)
        elif self._turn.reply is not None:
            attempted = _attempted(kind, name, digest, preview)
            raise self._mismatch(n, "end of turn (reply recorded)", attempted)
        self._next += 1
        self._started[n] = round(self._clock(), 3)
        return n

    def _value(self, kind: str, make: Callable[[], Any]) -> Any:
        n = self._claim_position(kind, kind, digest_of(None), None)
        step = self._turn.steps.get(n)
        if step is not None and step.outcome is not None:
            self.replayed += 1
            notify(self._observer, "step_replayed", StepInfo(n, kind, kind))
            return step.outcome["result"]["output"]
        value = make()
        body = {"kind": kind, "name": kind, "digest": digest_of(None), "preview": "null"}
        self._pending.append(self._event("outcome", {**body, "result": {"output": value}}, n))
        if self._observer is not None:
            self._pending_steps.append(n)
            info = StepInfo(n, kind, kind)
            notify(self._observer, "step_started", info)
            notify(self._observer, "step_finished", info, {"output": value}, {}, False)
        return value

    async def _step(
        self,
        kind: str,
        name: str,
        digest: str,
        preview: object,
        replay: Replay,
        run: Callable[[int], Awaitable[dict[str, Any]]] | None,
        *,
        parts: tuple[dict[str, Any], dict[str, Any]] | None = None,
        tool_run: tuple[Tool, dict[str, Any]] | None = None,
        shown: str | None = None,
    ) -> dict[str, Any]:
        """Step ``preview`` (its preview text ``shown`` when the caller has it already)."""
        # Every journal write is shielded, so a model client or tool that never awaits would
        # give a cancelled turn (a lost lease, the grace after SIGTERM) no point to stop at:
        # each step is one.
        await self._backend().checkpoint_if_cancelled()
        n = self._claim_position(kind, name, digest, preview, parts)
        if shown is None:
            shown = _preview(preview)
        try:
            return await self._take(
                n, kind, name, digest, preview, shown, replay, run, parts, tool_run
            )
        except BaseException:
            # The step raised (a model client's error, a cancelled tool, a blob write) and
            # recorded no outcome: code that calls again is at step n again. Going on at n + 1
            # would leave a hole that a replay fills with a second call (a model billed twice,
            # then a divergence). A never intent written here makes the retry an interrupted
            # call, as the rules say. After a failed append the Journal is unusable anyway.
            self._next = n
            raise

    async def _wait(
        self,
        kind: str,
        name: str,
        spec: dict[str, Any],
        deadline_of: Callable[[], float],
        *,
        signal: str | None = None,
        signal_turn: str | None = None,
    ) -> dict[str, Any]:
        """A wait as step n: intent (deadline) before, outcome (fired, a signal, timed out)
        after, written at once: the first writer of the outcome owns the turn from there."""
        await self._backend().checkpoint_if_cancelled()
        digest = _wait_digest(spec)
        n = self._claim_position(kind, name, digest, spec)
        try:
            step = self._turn.steps.get(n)
            info = StepInfo(n, kind, name)
            if step is not None and step.outcome is not None:
                self.replayed += 1
                notify(self._observer, "step_replayed", info)
                result: dict[str, Any] = step.outcome["result"]
                return result
            notify(self._observer, "step_started", info)
            identity = {"kind": kind, "name": name, "digest": digest, "preview": _preview(spec)}
            if step is None or step.intent is None:
                deadline = deadline_of()
                intent = {**identity, "deadline": deadline, "signal": signal, **spec}
                intent["queue"] = self.queue  # where a signal's wake-up goes
                if signal_turn is not None:
                    intent["for_turn"] = signal_turn
                await self._append([self._event("intent", intent, n)])
                self._record(n, intent=intent)
            else:
                deadline = float(step.intent["deadline"])
            crash = self._crash
            if crash is not None and crash.step == n and crash.when == "before_run":
                crash.hit()
            tries = 0
            while True:
                tries += 1
                # An approval times out only if no decision came since its look for one: the
                # time-out is appended only if the log's tail is still the one read before
                # the look. (Appended unconditionally, a decision that landed between the look
                # and the append was told by Client.approve that it counted, since no outcome
                # was there yet when it checked, and the call did not run.)
                seen = await self._world.log.tail(self._log_id) if kind == "approval" else None
                outcome: dict[str, Any] | None = None
                if signal is not None:
                    found = await self._find_signal(signal, signal_turn)
                    if found is not None and not (kind == "approval" and _late(found, deadline)):
                        outcome = {"signal": found}
                if outcome is None and kind == "child":
                    outcome = self._child_ended(name, n)
                if outcome is None:
                    if self._clock() < deadline:
                        # Deferred outcomes of steps run again on the way here would be lost
                        # with this Journal: keep them (the next run reads instead of reruns).
                        await self._append([])
                        self._suspended_at = n
                        raise TurnSuspended(
                            f"turn {self.turn_id!r} step {n}: {kind} {name!r} waits until "
                            f"{deadline:.3f}",
                            step=n,
                            wake_at=deadline,
                            signal=signal,
                        )
                    outcome = {"fired": True} if kind == "timer" else {"timed_out": True}
                if crash is not None and crash.step == n and crash.when == "after_run":
                    crash.hit()
                body = {**identity, "result": outcome, "by": self._owner}
                event = self._event("outcome", body, n)
                if seen is None or "signal" in outcome:
                    await self._append([event])
                elif not await self._append_at(event, seen, last=tries >= _FENCED_TRIES):
                    continue  # the log moved since the look (a decision, maybe): look again
                break
            self._record(n, outcome=body)
            notify(self._observer, "step_finished", info, outcome, {}, True)
            return outcome
        except BaseException:
            self._next = n
            raise

    def _child_ended(self, child: str, before: int) -> dict[str, Any] | None:
        """The end of child run ``child`` as an earlier wait of this turn received it, or
        None. A child's end is signalled once, and the first wait for it consumes the signal:
        a later wait for the same child (a second look, a loop over the children again)
        gets the same end instead of waiting out its timeout for a signal that will not come.
        Read from this turn's own steps, so a replay finds it the same."""
        for m in range(before - 1, -1, -1):
            step = self._turn.steps.get(m)
            outcome = step.outcome if step is not None else None
            if outcome is not None and outcome.get("kind") == "child":
                result = outcome.get("result") or {}
                if outcome.get("name") == child and "signal" in result:
                    return {"signal": result["signal"]}
        return None

    def _approved_before(self, name: str, digest: str) -> int | None:
        """The approval step that covers a retry of ``name`` with these arguments: the latest
        earlier call of the same tool with the same arguments did not return a result (it was
        interrupted or failed) and the step before it approved it."""
        m = self._latest_call(name, digest, self._next)
        if m is None:
            return None
        outcome = self._turn.steps[m].outcome
        result = (outcome or {}).get("result", {})
        if outcome is not None and (
            "blob" in outcome or not ("error" in result or result.get("interrupted"))
        ):
            return None  # it returned: a repeat is a new request, to be approved anew
        before = self._turn.steps.get(m - 1)
        decided = (before.outcome or {}) if before is not None else {}
        if decided.get("kind") != "approval":
            return None
        granted = decided.get("result", {})
        signal = granted.get("signal") or {}
        payload = signal.get("payload") if isinstance(signal, dict) else None
        if "approved_before" in granted or (
            isinstance(payload, dict) and payload.get("approved") is True
        ):
            return m - 1
        return None

    def _latest_call(self, name: str, digest: str, before: int) -> int | None:
        """The latest step before ``before`` that called tool ``name`` with arguments of
        sha-256 ``digest``, or None. From an index of the turn's tool steps (built on first
        use, then kept by :meth:`_record`): a scan of every step made each step cost more
        the longer the turn, quadratic in all."""
        if self._calls is None:
            self._calls = {}
            for m in sorted(self._turn.steps):
                self._index_call(m)
        found = self._calls.get((name, digest), [])
        i = bisect.bisect_left(found, before)
        return found[i - 1] if i else None

    def _index_call(self, n: int) -> None:
        assert self._calls is not None
        step = self._turn.steps[n]
        source = step.outcome if step.outcome is not None else step.intent
        assert source is not None
        if source.get("kind") == "tool":
            call = (str(source.get("name")), str(source.get("digest")))
            bisect.insort(self._calls.setdefault(call, []), n)

    async def _settle_step(
        self, kind: str, name: str, spec: dict[str, Any], result: dict[str, Any]
    ) -> dict[str, Any]:
        """A step whose outcome is known without running anything: recorded at once."""
        digest = _wait_digest(spec)
        n = self._claim_position(kind, name, digest, spec)
        step = self._turn.steps.get(n)
        if step is not None and step.outcome is not None:
            self.replayed += 1
            recorded: dict[str, Any] = step.outcome["result"]
            return recorded
        identity = {"kind": kind, "name": name, "digest": digest, "preview": _preview(spec)}
        body = {**identity, "result": result, "by": self._owner}
        try:
            await self._append([self._event("outcome", body, n)])
        except BaseException:
            self._next = n
            raise
        self._record(n, outcome=body)
        return result

    async def _find_signal(self, name: str, turn: str | None) -> dict[str, Any] | None:
        """The first signal ``name`` in the log, addressed to this turn (or, unless ``turn``
        is given, to the session), that no wait consumed yet."""
        session, _ = await read_session(self._world, self._log_id)
        body = session.signal_for(name, self.turn_id, addressed=turn is not None)
        return None if body is None else dataclasses.asdict(Signal.from_body(body))

    def _reused_key(self, n: int, name: str, digest: str) -> str:
        """Step ``n``'s idempotency key: the key of the latest earlier call of the same tool
        with the same arguments, unless that call succeeded (then this is a new request and
        gets its own key). An interrupted call may have happened; a failed one may have
        reached the API before it failed (a timeout, a dropped connection): a retry with the
        same key is what idempotency keys exist for."""
        m = self._latest_call(name, digest, n)
        if m is None:
            return self.idempotency_key(n)
        step = self._turn.steps[m]
        outcome = step.outcome or {}
        result = outcome.get("result", {})
        if "blob" in outcome or not ("error" in result or result.get("interrupted")):
            return self.idempotency_key(n)  # it returned a result: a repeat is a new request
        intent = step.intent or {}
        return str(result.get("key") or intent.get("key") or self.idempotency_key(m))

    async def _take(
        self,
        n: int,
        kind: str,
        name: str,
        digest: str,
        preview: object,
        shown: str,
        replay: Replay,
        run: Callable[[int], Awaitable[dict[str, Any]]] | None,
        parts: tuple[dict[str, Any], dict[str, Any]] | None,
        tool_run: tuple[Tool, dict[str, Any]] | None,
    ) -> dict[str, Any]:
        identity = {"kind": kind, "name": name, "digest": digest, "preview": shown}
        observer = self._observer
        extra: dict[str, Any] = {}  # for a StepInfo: only observers see one
        if observer is not None:
            extra = {"input": preview if kind == "tool" else None, **self._step_extra}
        if self._step_extra:
            self._step_extra = {}
        step = self._turn.steps.get(n)
        if step is not None and step.outcome is not None:
            self.replayed += 1
            if observer is not None:
                notify(observer, "step_replayed", StepInfo(n, kind, name, **extra))
            return await self._result(step.outcome)
        deadline = math.inf
        if step is not None and step.intent is not None and not step.void and replay == "never":
            intent = step.intent
            key = str(intent.get("key") or self.idempotency_key(n))
            recorded = intent.get("deadline")
            if isinstance(recorded, int | float):
                wait = float(recorded) + CLOCK_MARGIN - self._clock()
                if wait > 0:
                    raise CallInFlightError(
                        f"turn {self.turn_id!r} step {n}: {name} may still be running in "
                        f"another worker (its deadline is {wait:.1f} s away); resume the turn "
                        "after that",
                        step=n,
                        retry_after=wait,
                    )
            result = {"output": POSSIBLY_RAN, "interrupted": True, "key": key}
            body = {**identity, "result": result}
            await self._append([self._event("outcome", body, n)])
            self._record(n, outcome=body)
            if observer is not None:
                answered = StepInfo(n, kind, name, replay=replay, key=key, **extra)
                notify(observer, "step_started", answered)
                notify(observer, "step_finished", answered, result, {}, True)
            return result
        tool = tool_run[0] if tool_run is not None else None
        if tool is not None:
            deadline = self._clock() + tool.timeout
        intent_body: dict[str, Any] | None = None
        gen = 0
        if replay == "never" and (step is None or step.void):
            if step is not None and step.intent is not None:  # its earlier intent: not started
                gen = step.unstarted
                key = str(step.intent.get("key") or self.idempotency_key(n))
            else:
                key = self._reused_key(n, name, digest)
            intent_body = {
                **identity,
                "replay": replay,
                "key": key,
                "timeout": tool.timeout if tool is not None else None,
                "deadline": deadline if math.isfinite(deadline) else None,
            }
            if gen:
                intent_body["gen"] = gen
        else:
            key = self.idempotency_key(n)
        # Only observers see a StepInfo: none is made for a turn nobody observes.
        info: StepInfo | None = None
        if observer is None:
            pass
        elif tool_run is not None:
            info = StepInfo(n, kind, name, replay=replay, key=key, **extra)
        else:
            info = StepInfo(n, kind, name, **extra)
        crash = self._crash

        # A never call runs shielded (a lost lease or SIGTERM must not cut it off half-way;
        # its own deadline bounds it, and others wait for that deadline anyway), and so is
        # every outcome's recording: once a call returned, its result must reach the log.
        # The intent's append joins the call's shield (a write is shielded anyway, and no
        # await comes between it and the call).
        async def call() -> dict[str, Any]:
            if intent_body is not None:
                await self._append([self._event("intent", intent_body, n, gen=gen)])
                self._record(n, intent=intent_body)
            self._taking = info
            if observer is not None:
                notify(observer, "step_started", info)
            if crash is not None and crash.step == n and crash.when == "before_run":
                crash.hit()
            context: ToolContext | None = None
            if tool_run is not None:
                context = self._tool_context(n, key, deadline)
                self._in_tool = name
                try:
                    self.tool_runs += 1
                    result = await _run_tool(tool_run[0], tool_run[1], context, self._backend())
                except LeaseLostError as exc:
                    if exc is context.refusal:
                        await self._refused(n, exc, gen if intent_body is not None else None)
                    raise
                finally:
                    self._in_tool = None
                if result.get("timed_out") and replay == "never":
                    result = {
                        "output": POSSIBLY_RAN,
                        "interrupted": True,
                        "timed_out": True,
                        "key": key,
                    }
            else:
                assert run is not None
                result = await run(n)
            if crash is not None and crash.step == n and crash.when == "after_run":
                crash.hit()

            if context is not None and (context.claims or context.before_commit_hooks):
                # Its hooks and the outcome's append, or a safe call run again on a conflict,
                # under one shield. Without hooks or claims, every await of _keep is a write
                # that shields itself (_retrying), and no cancellation can land between
                # them: one more scope around them would only cost each safe step a scope.
                # Nor can a conflict happen without claims: _keep is called directly.

                def keep() -> Awaitable[dict[str, Any]]:
                    return self._keep_claiming(
                        n, kind, identity, replay, result, context, parts, tool_run
                    )

                return await self._shielded(keep)
            return await self._keep(n, kind, identity, replay, result, context, parts)

        if replay == "never" and tool_run is not None:
            return await self._shielded(call)
        return await call()

    async def _refused(self, n: int, refusal: LeaseLostError, gen: int | None) -> None:
        """Step ``n``'s tool refused because the lease was lost (``ToolContext.check``): not
        its outcome. This Journal stops (its worker no longer owns the turn), and the intent
        of generation ``gen`` this attempt wrote (None: it wrote none, a ``safe`` call) is
        recorded as not started, if that can still be done safely."""
        self.lease_refusal = refusal
        self._broken = refusal
        if gen is not None:
            await self._shielded(lambda: self._void_intent(n, gen))

    async def _void_intent(self, n: int, gen: int) -> bool:
        """Append ``turn/<t>/step/<n>/unstarted`` (``/<gen>`` after the first intent; ``"gen":
        gen``): the call of step ``n``'s intent of generation ``gen`` did not start, so the
        turn's next attempt runs it again (writing the intent of generation ``gen + 1``)
        instead of waiting for its deadline and answering "may or may not have happened".

        Fenced, because this worker's lease is gone and another worker may be taking the turn
        over: the append expects the log's tail this Journal last wrote. Where the log grew
        meanwhile, the events after that tail are read; if any belongs to this turn (another
        worker's outcome, intent, failure, park), nothing is written and the intent stays as
        it is (the usual rule then answers for it after its deadline). Other turns' events (a
        new turn's input, a signal) are stepped over. Appended before another worker's write
        to the turn, the record is harmless: that worker read the log before it and answers
        for the step as the rules say, or after it and runs the step again; either way its
        write for step ``n`` goes after it. True if the record was written."""
        event = self._event("unstarted", {"gen": gen}, n, gen=gen)
        own = f"turn/{self.turn_id}/"
        tail = self._tail
        try:
            for _ in range(_FENCED_TRIES):
                try:
                    self._tail = await self._world.log.append(
                        self._log_id, [event], expect_tail=tail
                    )
                    return True
                except ConflictError:
                    newer = await self._world.log.read(self._log_id, after=tail)
                    if any((e.key or "").startswith(own) for e in newer):
                        return False  # someone else wrote to the turn: it is theirs now
                    tail = newer[-1].seq if newer else tail
        except WorldError as exc:  # unreachable store, a taken key: the intent stays as it is
            log.warning(
                "turn %s/%s step %d: recording that the call was not started failed: %s",
                self.session_id,
                self.turn_id,
                n,
                exc,
            )
        return False

    def _tool_context(self, n: int, key: str, deadline: float) -> ToolContext:
        return ToolContext(
            self.session_id,
            self.turn_id,
            n,
            idempotency_key=key,
            deadline=deadline,
            clock=self._clock,
            lease_held=self._lease_held,
            state=self._turn.state,
            blobs=self._blobs,
            world=self._world,
        )

    async def _keep_claiming(
        self,
        n: int,
        kind: str,
        identity: dict[str, Any],
        replay: Replay,
        result: dict[str, Any],
        context: ToolContext | None,
        parts: tuple[dict[str, Any], dict[str, Any]] | None,
        tool_run: tuple[Tool, dict[str, Any]] | None,
    ) -> dict[str, Any]:
        """:meth:`_keep`, and when the call's claims conflict (``ToolContext.claim``): a
        ``safe`` call runs again with a fresh context, up to MAX_CONFLICT_RUNS runs, then its
        outcome is the conflict; a ``never`` call's outcome is the conflict at once (it ran:
        the error says so, and nothing it staged is written)."""
        runs = 1
        while True:
            try:
                return await self._keep(n, kind, identity, replay, result, context, parts)
            except _ClaimConflict as conflict:
                name = identity["name"]
                if replay == "safe" and tool_run is not None and runs < MAX_CONFLICT_RUNS:
                    runs += 1
                    assert context is not None
                    context = self._tool_context(n, context.idempotency_key, context.deadline)
                    self._in_tool = name
                    try:
                        self.tool_runs += 1
                        result = await _run_tool(tool_run[0], tool_run[1], context, self._backend())
                    except LeaseLostError as exc:
                        if exc is context.refusal:  # a safe call: no intent to void
                            await self._refused(n, exc, None)
                        raise
                    finally:
                        self._in_tool = None
                    continue
                if replay == "safe":
                    result = {
                        "error": f"{name}: {conflict.message} (tried {runs} times; the data "
                        "kept changing under it, nothing it changed was saved)",
                        "conflict": conflict.message,
                    }
                else:
                    result = {
                        "error": f"{name} ran and returned {_preview(result.get('output'))}, "
                        f"but what it changed was not saved: {conflict.message}. Its effects "
                        "outside the session happened; read the current data before you try "
                        "it again",
                        "conflict": conflict.message,
                        "output": result.get("output"),
                    }
                return await self._keep(n, kind, identity, replay, result, None, parts)

    def _tell_finished(
        self,
        n: int,
        identity: dict[str, Any],
        result: dict[str, Any],
        state: dict[str, Any],
        recorded: bool,
    ) -> None:
        """Tell the observer step ``n`` finished (its outcome kept, or deferred)."""
        if self._observer is None:
            return
        info = self._taking
        if info is None or info.step != n:
            info = StepInfo(n, str(identity["kind"]), str(identity["name"]))
        if not recorded:
            self._pending_steps.append(n)
        notify(self._observer, "step_finished", info, result, dict(state), recorded)

    async def _keep(
        self,
        n: int,
        kind: str,
        identity: dict[str, Any],
        replay: Replay,
        result: dict[str, Any],
        context: ToolContext | None,
        parts: tuple[dict[str, Any], dict[str, Any]] | None,
    ) -> dict[str, Any]:
        """Record step ``n``'s outcome (with the state its tool staged); the JSON result."""
        commit = context is not None and "error" not in result and not result.get("interrupted")
        try:
            encoded = canonical_json(result)
        except ValueError as exc:  # NaN or infinity: the call happened, record that it failed
            if kind != "tool":
                raise
            result, commit = {"error": f"result is not JSON: {exc}"}, False
            encoded = canonical_json(result)
        staged: dict[str, Any] = {}
        claims: dict[str, tuple[dict[str, Any], str]] = {}
        if commit and context is not None:
            for hook in context.before_commit_hooks:
                await self._retrying(hook)
            staged = context.staged
            claims = context.claims
        body: dict[str, Any] = dict(identity)
        if parts is not None:
            body["parts"] = parts[0]
        if len(encoded) > self._blob_threshold:
            ref = await self._retrying(lambda: self._blobs.put(encoded))
            body["blob"] = ref.model_dump()
        else:
            body["result"] = result
        events = [self._event("outcome", body, n)]
        # Values small enough alone can be too many for one append (8 MiB, with the deferred
        # batch it may join): then every one goes to a blob, and the outcome still fits.
        threshold = self._blob_threshold
        if staged and sum(len(canonical_json(value)) for value in staged.values()) > _STEP_BYTES:
            threshold = 0
        for state_name, value in staged.items():

            async def store(value: Any = value) -> dict[str, Any]:
                return await stored_value(self._blobs, value, threshold)

            stored = await self._retrying(store)
            events.append(self._event(f"state/{state_name}", _state_event(state_name, stored), n))
        for claim_key, (claim_body, _) in claims.items():
            events.append(NewEvent(key=claim_key, data=canonical_json(claim_body)))
        deferred = kind == "tool" and replay == "safe" and self._defer_safe and not claims
        if deferred:
            # Rides with the next append: lost only to a crash before it, and then the tool
            # simply runs again, which its label allows. Every later outcome (a model call's)
            # is in the same or a later batch, so nothing durable ever depends on it alone.
            self._pending.extend(events)
            self._pending_bytes += sum(len(event.data) for event in events)
            if self._pending_bytes > _PENDING_FLUSH_BYTES:
                await self._append([])
        else:
            try:
                await self._append(events)
            except DuplicateKeyError as exc:
                if exc.key not in claims:
                    raise
                self._broken = None  # refused whole: nothing was written, the view holds
                raise _ClaimConflict(claims[exc.key][1]) from None
        self._turn.state.update(staged)
        self._record(n, outcome=body)
        if commit and context is not None:
            for after in context.after_commit_hooks:
                after()
        # Return what replay will return: the JSON form, not the Python objects.
        decoded = _json_form(result, encoded)
        if self._observer is not None:
            self._tell_finished(n, identity, decoded, staged, not deferred)
        return decoded

    def _record(
        self, n: int, *, intent: dict[str, Any] | None = None, outcome: dict[str, Any] | None = None
    ) -> None:
        step = self._turn.steps.get(n)
        new = step is None
        if step is None:
            step = self._turn.steps[n] = _Step()
        if intent is not None:
            step.intent = intent
        if outcome is not None:
            step.outcome = outcome
        if new and self._calls is not None:
            self._index_call(n)

    async def _result(self, outcome: dict[str, Any]) -> dict[str, Any]:
        if "blob" in outcome:
            data = await self._blobs.get(BlobRef.model_validate(outcome["blob"]))
            loaded: dict[str, Any] = json.loads(data)
            return loaded
        result: dict[str, Any] = outcome["result"]
        return result


def _attempted(kind: str, name: str, digest: str, preview: object) -> dict[str, Any]:
    """A step's identity as a mismatch report shows what the code does now."""
    return {"kind": kind, "name": name, "digest": digest, "preview": _preview(preview)}


class _ClaimConflict(Exception):
    """A call's claimed key was taken by another writer (its batch was refused whole)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


_WAIT_SETTINGS = frozenset({"timeout", "seconds", "until"})
"""Parts of a wait that do not identify it: its duration is recorded once (as the deadline),
so a deploy that changes a timeout leaves the turns already waiting as they are."""


def _wait_digest(spec: dict[str, Any]) -> str:
    return digest_of({k: v for k, v in spec.items() if k not in _WAIT_SETTINGS})


def decided_too_late(at: float, deadline: float) -> bool:
    """Whether a decision on an approval made at ``at`` (its sender's clock) comes after the
    approval's ``deadline`` (the store's), with the clock margin: too late to count. The one
    rule for both sides: ``Client.approve`` refuses such a decision, and records the time it
    checked as the decision's ``sent_at``, which the turn's worker checks again (the same
    numbers on every worker, on every replay)."""
    return at > deadline + CLOCK_MARGIN


def _late(found: dict[str, Any], deadline: float) -> bool:
    """Whether a decision was sent after the approval's deadline: see
    :func:`decided_too_late` (a decision recorded with no ``sent_at`` counts)."""
    sent = found.get("sent_at")
    return isinstance(sent, int | float) and decided_too_late(float(sent), deadline)


_SCALARS = (str, int, float, bool, type(None))


def _json_form(result: dict[str, Any], encoded: bytes) -> dict[str, Any]:
    """``result`` as its canonical JSON ``encoded`` reads back (sorted keys, JSON types only).

    The usual result, ``{"output": <a str, number, bool or None>}``, reads back as itself, so
    it is copied instead of parsed (a str reads back as the same text, a float as the same
    float: JSON writes its shortest exact form); anything else is parsed."""
    if len(result) == 1 and "output" in result and type(result["output"]) in _SCALARS:
        return {"output": result["output"]}
    loaded: dict[str, Any] = json.loads(encoded)
    return loaded


def _finite(value: object) -> bool:
    """True if ``value`` (parsed JSON) has a canonical JSON form: no NaN or infinity in it."""
    try:
        canonical_json(value)
    except ValueError:
        return False
    return True


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:_ERROR_CHARS]


def _cancelling(exc: BaseException) -> bool:
    """True when ``exc`` is this task being cancelled (by a cancel scope), not a
    ``CancelledError`` that some awaited thing raised on its own."""
    if not isinstance(exc, anyio.get_cancelled_exc_class()):
        return False
    try:
        task = asyncio.current_task()
    except RuntimeError:
        return True
    return task is None or task.cancelling() > 0


async def _run_tool(
    tool: Tool, args: dict[str, Any], context: ToolContext, backend: type[AsyncBackend]
) -> dict[str, Any]:
    """Run one tool call within its deadline; its return value, error or timeout as a result.

    Anything the tool raises is its outcome, ``SystemExit``, ``KeyboardInterrupt`` and other
    BaseExceptions included (argparse raises the first): a tool cannot take the worker down. A
    cancellation of the call (its deadline, or the turn's) is not caught; a ``CancelledError``
    the tool raises on its own (say, from a future something else cancelled) is its outcome."""
    value: Any = None
    returned = False
    # anyio.move_on_after(delay), on the backend the caller looked up once (Journal._backend).
    deadline = backend.current_time() + max(0.0, context.time_left())
    with backend.create_cancel_scope(deadline=deadline) as scope:
        try:
            value = await tool.call(args, context)
            returned = True
        except BaseException as exc:
            if _cancelling(exc):
                raise
            refusal = context.refused_by(exc)
            if refusal is not None:
                raise refusal from None  # the lease was lost: not the call's outcome
            return {"error": _describe(exc)}
    if not returned and scope.cancelled_caught:
        if not tool.is_async:
            log.warning(
                "tool %s (step %d of %s/%s) outlived its timeout of %.1f s and was abandoned "
                "in its thread, still running",
                tool.name,
                context.step,
                context.session_id,
                context.turn_id,
                tool.timeout,
            )
        return {
            "error": f"TimeoutError: {tool.name} did not finish within its timeout of "
            f"{tool.timeout:g} s",
            "timed_out": True,
        }
    try:
        return {"output": to_jsonable_python(value)}
    except Exception as exc:
        return {"error": f"tool returned a value that is not JSON: {exc}"}


async def _load(session: SessionView, events: list[Event], turn_id: str, blobs: Blobs) -> _Turn:
    """Turn ``turn_id`` from the session's view and the events read (every step of the turn
    is among them: see :func:`_open_view`)."""
    turn = _Turn(tail=session.tail, parked=list(session.parks.get(turn_id, [])))
    for event in events:
        body = _decode(event.data)
        if body is None or str(body.get("turn")) != turn_id:
            continue
        what = body.get("t")
        if what == "intent":
            turn.steps.setdefault(int(body["step"]), _Step()).intent = body
        elif what == "unstarted":
            step = turn.steps.setdefault(int(body["step"]), _Step())
            step.unstarted = max(step.unstarted, int(body.get("gen", 0)) + 1)
        elif what == "outcome":
            turn.steps.setdefault(int(body["step"]), _Step()).outcome = body
    if turn_id in session.failures:
        body = session.failures[turn_id]
        turn.failure = _failure_record(body)
    for name, body in session.state.items():
        turn.state[name] = await load_value(blobs, body)
    if turn_id in session.inputs:
        turn.user_message = await _text(blobs, session.inputs[turn_id][1], "message")
        parent = session.inputs[turn_id][1].get("parent")
        turn.parent = parent if isinstance(parent, dict) else None
        turn.waiting_for = session.earliest_unfinished(before=turn_id)
        for other in session.in_order():
            if other == turn_id:
                break
            if session.finished(other):
                turn.past.append(await past_turn(blobs, session, other))
    if turn_id in session.replies:
        turn.reply = await _text(blobs, session.replies[turn_id][1], "reply")
    return turn


def _failure_record(body: dict[str, Any]) -> dict[str, Any]:
    """What a failure event records: ``error_type``, ``error``, ``attempts``, ``step``."""
    return {k: body.get(k) for k in ("error_type", "error", "attempts", "step")}


async def past_turn(blobs: Blobs, session: SessionView, turn_id: str) -> PastTurn:
    """Finished turn ``turn_id`` of the view: its message, and its reply or failure."""
    message = await _text(blobs, session.inputs[turn_id][1], "message")
    if turn_id in session.replies:
        return PastTurn(
            turn_id, message, reply=await _text(blobs, session.replies[turn_id][1], "reply")
        )
    return PastTurn(turn_id, message, failure=_failure_record(session.failures[turn_id]))


async def _open_view(
    world: World, log_id: str, turn_id: str, history: int | None
) -> tuple[SessionView, list[Event]]:
    """The session view and events a Journal of ``turn_id`` needs: from the latest checkpoint
    when that holds all of it (the turn is not finished, none of its steps is before the
    checkpoint, and the history asked for is kept), else from the whole log."""
    view, events = await read_session(world, log_id)
    if not view.checkpointed:
        return view, events
    enough = (
        turn_id in view.inputs
        and not view.finished(turn_id)
        and turn_id not in view.checkpoint_started
    )
    if enough and view.pruned:
        before = [t for t in view.in_order() if t != turn_id and view.finished(t)]
        kept = len([t for t in before if view.inputs[t][0] < view.inputs[turn_id][0]])
        enough = history is not None and history <= kept
    if enough:
        return view, events
    return await read_session(world, log_id, full=True)


async def _text(blobs: Blobs, body: dict[str, Any], name: str) -> str:
    """An input's message or a reply: inline under ``name``, or in the blob the body names."""
    if name in body:
        return str(body[name])
    return str(cast(Any, await load_value(blobs, body)))
