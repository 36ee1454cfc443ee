"""The backend contract: what a World backend implements.

A World is three primitives behind one object: a :class:`Log` (per-log append-only event
sequences), a :class:`Queue` (at-least-once delivery under leases) and a :class:`Stream`
(ordered byte chunks that readers can resume). Everything else in `world` (journal, worker,
documents, virtual filesystem, blobs) is written once on top of these, with no backend code.

Guarantees are written here, once; backends document only their quirks. The conformance
suite (``world-conformance``) is the executable form of these docstrings.

Rules shared by every method:

* Every method is async and is one round trip or one transaction of the store. A store
  without multi-document transactions (a standalone ``mongod``) may use a small fixed number
  of single-document writes instead, exactly one of which commits the change.
* Payloads (event data, message payloads, stream chunks) are opaque ``bytes``: empty, NUL
  bytes and any other content are stored and returned exactly. They are never converted:
  ``str``, ``bytearray`` and ``memoryview`` raise :class:`~world_core.errors.InvalidArgumentError`
  (encode text; copy a buffer with ``bytes(...)``), both when a :class:`NewEvent` or an
  :class:`OutboxMessage` is built and when ``enqueue`` or ``write`` is called.
* One call carries at most :data:`MAX_PAYLOAD_BYTES` of payload in total (an append batch
  with its outbox messages, one enqueue, one stream write); more raises
  :class:`~world_core.errors.PayloadTooLargeError` and writes nothing.
* Identifiers (log, queue, stream and message ids, event keys, dedup keys, worker names) are
  any non-empty ``str`` of at most :data:`MAX_ID_BYTES` UTF-8 bytes without NUL; ``/``,
  ``..``, quotes, ``$``, ``{}``, ``*``, ``:``, SQL and unicode are data, stored verbatim and
  never able to reach outside the World's namespace. Anything else raises
  :class:`~world_core.errors.InvalidIdentifierError` before any I/O. Backends call the
  ``validate_*`` functions of this module first, so every backend refuses the same inputs.
* Namespaces (``WORKFLOW_NAMESPACE``) match :data:`NAMESPACE_PATTERN`. Two Worlds opened with
  different namespaces on one server never see each other's logs, queues or streams.
* Backends translate driver exceptions into :mod:`world_core.errors` at one place; a
  transient fault surfaces as :class:`~world_core.errors.BackendUnavailableError`.
* A call refuses in this order: first what its arguments alone decide (the ``validate_*``
  functions of this module: InvalidIdentifierError, InvalidArgumentError,
  PayloadTooLargeError; then UnsupportedError for a capability the backend declares absent),
  then :class:`~world_core.errors.ClosedError` when the World was closed, then what depends
  on the store. So a call with arguments it refuses raises that refusal whether the World is
  open or closed (a bad call is a bug to fix at its line, whatever the World's state), and a
  valid call on a closed World raises ClosedError without touching the store.
* ``Log.watch`` and ``Stream.read`` return async iterators, and make those checks when
  called, before returning the iterator: a bad argument or a closed World raises at the line
  that made the call, not at the first step of the iterator (nor never, for an iterator
  nobody steps). An ``async def`` generator runs none of its body until its first step, so
  implement them as a plain ``def`` that validates, checks the World is open, then returns
  the async generator.
* Waiting (``Log.watch``, ``Queue.claim(wait=...)``, ``Stream.read``) is woken by the store's
  own notification where it has one, by bounded polling with backoff where it has not;
  never by a busy loop. ``Capabilities.native_wakeups`` says which.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import inspect
import math
import re
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from types import TracebackType
from typing import Any, Generic, Protocol, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from world_core.errors import (
    InvalidArgumentError,
    InvalidIdentifierError,
    PayloadTooLargeError,
)

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "MAX_ID_BYTES",
    "MAX_LIST_LIMIT",
    "MAX_PAYLOAD_BYTES",
    "MAX_QUEUE_SECONDS",
    "MAX_STATUS_BYTES",
    "NAMESPACE_PATTERN",
    "Capabilities",
    "Chunk",
    "DeadLetter",
    "Event",
    "Lease",
    "Log",
    "LogInfo",
    "NewEvent",
    "OutboxMessage",
    "Page",
    "Queue",
    "Stream",
    "StreamInfo",
    "World",
    "WorldFactory",
    "control_character",
    "list_cursor",
    "prefix_end",
    "validate_append",
    "validate_claim",
    "validate_dead_letters",
    "validate_duration",
    "validate_enqueue",
    "validate_id",
    "validate_lease",
    "validate_limit",
    "validate_list",
    "validate_namespace",
    "validate_queue_seconds",
    "validate_read",
    "validate_release",
    "validate_renew",
    "validate_stream_read",
    "validate_write",
]

MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
"""Most payload bytes one call may carry (a batch, a message, a stream write): 8 MiB."""

MAX_ID_BYTES = 512
"""Longest identifier or key, in UTF-8 bytes."""

MAX_QUEUE_SECONDS = 1_000_000_000
"""Longest ``delay`` or lease a queue takes, in seconds (about 31 years). Every backend's
time arithmetic holds it (PostgreSQL's interval, MongoDB's dates as Python reads them, Redis's
integer microseconds); a longer one is refused as bad input instead of failing deep in a
store as an overflow. The journal's longest deadline (a wait or a tool's timeout: ten years)
stays well below it."""

MAX_STATUS_BYTES = 64
"""Longest log status, in UTF-8 bytes."""

MAX_LIST_LIMIT = 1000
"""Largest page ``Log.list_logs`` and ``Queue.dead_letters`` return."""

DEFAULT_MAX_ATTEMPTS = 10
"""Deliveries a message gets before it is dead-lettered, unless ``enqueue`` says otherwise."""

NAMESPACE_PATTERN = re.compile(r"[a-z0-9][a-z0-9_]{0,47}")
"""Lower-case letters, digits and ``_``, at most 48 characters, not starting with ``_``."""


_UNSET: Any = object()
"""A keyword argument not passed (None is a value some fields take)."""
_object_setattr = object.__setattr__


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# What each field of a record built by callers takes, and the advice given when it gets
# something else: (what it must be, what to do). Identifier fields raise InvalidIdentifierError.
_FIELDS: dict[str, tuple[str, str]] = {
    "data": ("bytes", "encode text first (text.encode()); copy a buffer with bytes(...)"),
    "payload": ("bytes", "encode text first (text.encode()); copy a buffer with bytes(...)"),
    "key": ("a str or None", "pass the key as text, or None for an event without a key"),
    "queue": ("a str", "pass the queue's name as text"),
    "dedup_key": ("a str or None", "pass the key as text, or None for no deduplication"),
    "delay": ("a number of seconds", "pass an int or a float, 0 for none"),
    "max_attempts": ("an int", "pass the deliveries allowed before dead-lettering, e.g. 10"),
}
_ID_FIELDS = frozenset({"key", "queue", "dedup_key"})


class _Input(_Record):
    """A record callers build and pass in. Its fields are checked strictly when it is built,
    never coerced (``str`` is not turned into ``bytes``, ``"3"`` not into ``3``), and a wrong
    one raises InvalidArgumentError (InvalidIdentifierError for an identifier field) naming
    the field and what to pass, instead of pydantic's ValidationError."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    def __init__(self, /, **fields: Any) -> None:
        try:
            super().__init__(**fields)
        except ValidationError as exc:
            raise _refusal(type(self), exc) from exc


def _refusal(model: type[BaseModel], exc: ValidationError) -> InvalidArgumentError:
    first = exc.errors()[0]
    field = str(first["loc"][0]) if first["loc"] else ""
    name = model.__name__
    if first["type"] == "extra_forbidden":
        return InvalidArgumentError(
            f"{name} has no field {field!r}; its fields are {', '.join(model.model_fields)}"
        )
    must, advice = _FIELDS.get(field, ("valid", first["msg"]))
    error = InvalidIdentifierError if field in _ID_FIELDS else InvalidArgumentError
    if first["type"] == "missing":
        return error(f"{name} needs {field}: pass {must}")
    got = type(first["input"]).__name__
    return error(f"{name}.{field} must be {must}, got {got}: {advice}")


# --------------------------------------------------------------------------------------------
# Records that cross the SPI
# --------------------------------------------------------------------------------------------


class NewEvent(_Input):
    """An event to append. ``key``, when given, is unique within its log.

    ``data`` must be ``bytes`` (a subclass too) and ``key`` a ``str`` or None: nothing is
    converted, so ``str``, ``bytearray`` and ``memoryview`` data or a non-``str`` key raise
    InvalidArgumentError (InvalidIdentifierError for the key) when the event is built. The
    key's content (non-empty, no NUL, length) is checked by ``Log.append``.
    """

    data: bytes
    key: str | None = None

    def __init__(self, /, *, data: bytes = _UNSET, key: str | None = _UNSET, **extra: Any) -> None:
        # Every append builds its events, and pydantic's validation of these two fields made
        # that cost about 12 us of CPU in the PostgreSQL benchmark's loop (against the same
        # event prebuilt), a third of what the append adds to its INSERT; this costs about 8
        # (4 us against 6.5 timed alone after a round trip). Fields that are exactly
        # ``bytes`` and ``str`` or None, the only inputs this path takes, are what strict
        # validation would store as they are, so they are stored as model_construct() does;
        # anything else (a subclass of either, a wrong type, an unknown field, a subclass of
        # NewEvent) is validated by pydantic.
        if type(data) is bytes and not extra and type(self) is NewEvent:
            if key is _UNSET:
                _object_setattr(self, "__dict__", {"data": data, "key": None})
                _object_setattr(self, "__pydantic_fields_set__", {"data"})
            elif key is None or type(key) is str:
                _object_setattr(self, "__dict__", {"data": data, "key": key})
                _object_setattr(self, "__pydantic_fields_set__", {"data", "key"})
            else:
                super().__init__(data=data, key=key)
                return
            _object_setattr(self, "__pydantic_extra__", None)
            _object_setattr(self, "__pydantic_private__", None)
            return
        fields = {"data": data, "key": key} | extra
        super().__init__(**{name: value for name, value in fields.items() if value is not _UNSET})


# The constructor's signature as pydantic gives it for the fields (data required, key None by
# default), not the sentinel defaults of the fast __init__ above: help() and IDEs show it.
NewEvent.__signature__ = inspect.Signature(
    [
        inspect.Parameter("data", inspect.Parameter.KEYWORD_ONLY, annotation=bytes),
        inspect.Parameter(
            "key", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=str | None
        ),
    ],
    return_annotation=None,
)


class Event(_Record):
    """A stored event: ``seq`` is its dense position in the log, starting at 1."""

    seq: int
    data: bytes
    key: str | None = None


class LogInfo(_Record):
    """One log's summary: its tail (the last ``seq``; 0 for none) and status."""

    log_id: str
    tail: int
    status: str | None = None


T = TypeVar("T")


class Page(_Record, Generic[T]):
    """One page of a listing; pass ``next_cursor`` back to get the next, ``None`` at the end."""

    items: list[T]
    next_cursor: str | None = None


class OutboxMessage(_Input):
    """A message enqueued in the same atomic write as a log append (``Capabilities.outbox``).

    Its fields take what ``Queue.enqueue`` takes, checked as strictly when it is built:
    ``payload`` ``bytes``, ``queue`` a ``str``, ``dedup_key`` a ``str`` or None, ``delay`` an
    ``int`` or ``float``, ``max_attempts`` an ``int`` (never a ``bool``); anything else raises
    InvalidArgumentError (InvalidIdentifierError for ``queue`` and ``dedup_key``). Values
    (a negative delay, an empty queue name) are checked by ``Log.append``.
    """

    queue: str
    payload: bytes
    delay: float = 0.0
    dedup_key: str | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS


class Lease(_Record):
    """A claimed message. Pass the whole lease back to ``renew``, ``ack`` or ``release``.

    ``attempt`` is 1 on the first delivery and grows by one on every later delivery.
    ``token`` is a fencing token unique to this claim. ``deadline`` is UNIX time in seconds on
    the store's clock; once it passes, the message may be handed to another worker.
    """

    queue: str
    message_id: str
    payload: bytes
    attempt: int
    max_attempts: int
    token: str
    deadline: float


class DeadLetter(_Record):
    """A message that used up its attempts; kept until requeued."""

    queue: str
    message_id: str
    payload: bytes
    attempts: int
    reason: str


class Chunk(_Record):
    """One stream chunk: ``index`` is dense from 0."""

    index: int
    data: bytes


class StreamInfo(_Record):
    """A stream's state. A stream never written nor closed reads as ``next_index=0``, open."""

    stream_id: str
    next_index: int
    closed: bool


class Capabilities(_Record):
    """What a backend offers beyond the required contract. Declared, never inferred.

    The conformance suite skips the tests of a feature declared absent and checks that using
    it raises :class:`~world_core.errors.UnsupportedError`.

    ``native_wakeups`` is about writes made elsewhere. True promises that a waiter
    (``Log.watch``, ``Queue.claim(wait=...)``, ``Stream.read``) is woken by a write made
    through another connection to the store, from another process or machine, by a
    notification the store delivers: it sees the write about as soon as it commits, however
    long it has been idle, and any polling is only a safety net. False means such writes are
    found by bounded polling, up to the backend's longest polling interval later (its README
    says how long). Either way every waiter is woken by every write, from anywhere; and writes
    made in the waiter's own process (through the same World object or another one) may wake
    it directly, which does not make the flag true: a World that only wakes its own process's
    waiters and polls for the rest declares False. The conformance suite lets waiters idle
    for seconds, then has another process write, and for True requires each waiter to see its
    write within a bound (``WORLD_CONFORMANCE_WAKE``, 1 s) well below a polling interval.
    """

    outbox: bool = Field(
        default=False,
        description="Log.append(messages=...) enqueues in the same atomic write as the append.",
    )
    shared: bool = Field(
        default=True,
        description="Several processes (and, for servers, machines) may open one World at once.",
    )
    native_wakeups: bool = Field(
        default=False,
        description=(
            "Waiters are woken by the store's notification of a write made in another process, "
            "not by polling (see the class docstring)."
        ),
    )
    max_payload_bytes: int = Field(
        default=MAX_PAYLOAD_BYTES,
        description="Most payload bytes one call may carry.",
    )


# --------------------------------------------------------------------------------------------
# Validation shared by every backend: call these first, before any I/O.
# --------------------------------------------------------------------------------------------


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def control_character(text: str) -> str | None:
    """The first control character of ``text``, or None: C0 (``\\x00``-``\\x1f``), DEL, C1
    (``\\x80``-``\\x9f``) and the line and paragraph separators U+2028 and U+2029, which end
    a line in many readers. What names meant for people (paths, turn ids) must not hold."""
    found = _CONTROL.search(text)
    return None if found is None else found.group()


def validate_id(value: object, what: str = "identifier") -> str:
    """Return ``value`` if it is a valid identifier, else raise InvalidIdentifierError.

    Raises:
        InvalidIdentifierError: not a ``str``, empty, longer than MAX_ID_BYTES in UTF-8,
            containing NUL, or not encodable as UTF-8 (lone surrogates).
    """
    # ASCII text, the common case, is its own UTF-8 (no surrogates, one byte a character), so
    # it is checked without being encoded: no bytes object made and dropped for each log id
    # and key of every call. Timed alone on a 19-character id: 5.7 -> 4.4 us with the caches
    # evicted before each call (what code run right after a round trip meets; an empty call
    # took 1.9), 108 -> 79 ns warm. A subclass of str takes the full path.
    if (
        type(value) is str
        and value.isascii()
        and 0 < len(value) <= MAX_ID_BYTES
        and "\x00" not in value
    ):
        return value
    if not isinstance(value, str):
        raise InvalidIdentifierError(f"{what} must be a str, got {type(value).__name__}")
    if not value:
        raise InvalidIdentifierError(f"{what} must not be empty")
    if "\x00" in value:
        raise InvalidIdentifierError(f"{what} {value!r} contains NUL; remove it or encode it")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidIdentifierError(
            f"{what} {value!r} is not valid UTF-8 (lone surrogate); pass real text"
        ) from exc
    if size > MAX_ID_BYTES:
        raise InvalidIdentifierError(
            f"{what} is {size} UTF-8 bytes; the limit is {MAX_ID_BYTES}: hash long names"
        )
    return value


def validate_namespace(value: object) -> str:
    """Return ``value`` if it matches NAMESPACE_PATTERN, else raise InvalidIdentifierError."""
    if not isinstance(value, str) or not NAMESPACE_PATTERN.fullmatch(value):
        raise InvalidIdentifierError(
            f"namespace {value!r} is invalid: use 1 to 48 lower-case letters, digits and '_', "
            "starting with a letter or digit (set WORKFLOW_NAMESPACE accordingly)"
        )
    return value


def validate_duration(value: object, what: str) -> float:
    """Return ``value`` as a float if it is a finite number >= 0 seconds."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{what} must be a number of seconds, got {value!r}")
    result = float(value)
    if not math.isfinite(result) or result < 0:
        raise InvalidArgumentError(f"{what} must be a finite number of seconds >= 0, got {value}")
    return result


def validate_queue_seconds(value: object, what: str) -> float:
    """Return ``value`` as a float if it is a number of seconds from 0 to MAX_QUEUE_SECONDS: a
    queue's delay or lease, which the store adds to its clock."""
    seconds = validate_duration(value, what)
    if seconds > MAX_QUEUE_SECONDS:
        raise InvalidArgumentError(
            f"{what} must be at most {MAX_QUEUE_SECONDS} seconds (about 31 years), got {value!r}"
        )
    return seconds


def validate_limit(value: object, what: str = "limit", maximum: int | None = None) -> None:
    """Check an optional positive page size."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{what} must be a positive int or None, got {value!r}")
    if maximum is not None and value > maximum:
        raise InvalidArgumentError(f"{what} must be at most {maximum}, got {value}")


def _check_size(total: int, limit: int, what: str) -> None:
    if total > limit:
        raise PayloadTooLargeError(
            f"{what} carries {total} payload bytes; one call may carry at most {limit}. "
            "Split it into several calls, or store the bytes as a blob and keep its digest.",
            size=total,
            limit=limit,
        )


def _check_max_attempts(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"max_attempts must be an int >= 1, got {value!r}")


def _check_status(status: object) -> None:
    if len(validate_id(status, "status").encode("utf-8")) > MAX_STATUS_BYTES:
        raise InvalidIdentifierError(f"status is longer than {MAX_STATUS_BYTES} UTF-8 bytes")


def _check_page_limit(value: object, what: str = "limit") -> None:
    if value is None:  # a page always has a size; validate_limit alone lets None mean "all"
        raise InvalidArgumentError(f"{what} must be an int from 1 to {MAX_LIST_LIMIT}, got None")
    validate_limit(value, what, MAX_LIST_LIMIT)


def validate_append(
    log_id: str,
    events: Sequence[NewEvent],
    *,
    expect_tail: int | None,
    status: str | None,
    messages: Sequence[OutboxMessage],
    limit: int = MAX_PAYLOAD_BYTES,
) -> None:
    """Everything ``Log.append`` refuses before any I/O.

    Raises:
        InvalidIdentifierError: a bad log id, key, status or outbox queue/dedup key.
        InvalidArgumentError: an empty batch, a key twice in one batch, a negative expect_tail.
        PayloadTooLargeError: events and messages together carry more than ``limit`` bytes.
    """
    validate_id(log_id, "log_id")
    if not events:
        raise InvalidArgumentError("append needs at least one event")
    # The keys seen so far, for a batch of several events: one event, the common case, makes
    # no set. That and the size check made inline below: 10.5 to 11.4 -> 8.7 to 9.0 us for one
    # keyed event timed alone with the caches evicted before each call (what code run right
    # after a round trip meets), 3 runs each; 595 -> 406 ns warm.
    seen: set[str] | None = set() if len(events) > 1 else None
    total = 0
    for event in events:
        if not isinstance(event, NewEvent):
            raise InvalidArgumentError(f"append takes NewEvent items, got {type(event).__name__}")
        total += len(event.data)
        if event.key is not None:
            validate_id(event.key, "event key")
            if seen is not None:
                if event.key in seen:
                    raise InvalidArgumentError(
                        f"event key {event.key!r} appears twice in one batch"
                    )
                seen.add(event.key)
    if expect_tail is not None and (
        isinstance(expect_tail, bool) or not isinstance(expect_tail, int) or expect_tail < 0
    ):
        raise InvalidArgumentError(f"expect_tail must be an int >= 0 or None, got {expect_tail!r}")
    if status is not None:
        _check_status(status)
    for message in messages:
        validate_id(message.queue, "queue")
        if message.dedup_key is not None:
            validate_id(message.dedup_key, "dedup_key")
        validate_queue_seconds(message.delay, "delay")
        _check_max_attempts(message.max_attempts)
        total += len(message.payload)
    if total > limit:
        _check_size(total, limit, "append")


def validate_enqueue(
    queue: str,
    payload: bytes,
    *,
    delay: float,
    dedup_key: str | None,
    max_attempts: int,
    limit: int = MAX_PAYLOAD_BYTES,
) -> None:
    """Everything ``Queue.enqueue`` refuses before any I/O."""
    validate_id(queue, "queue")
    if not isinstance(payload, bytes):
        raise InvalidArgumentError(f"payload must be bytes, got {type(payload).__name__}")
    validate_queue_seconds(delay, "delay")
    if dedup_key is not None:
        validate_id(dedup_key, "dedup_key")
    _check_max_attempts(max_attempts)
    _check_size(len(payload), limit, "enqueue")


def validate_claim(queue: str, worker: str, *, lease: float, limit: int, wait: float) -> None:
    """Everything ``Queue.claim`` refuses before any I/O."""
    validate_id(queue, "queue")
    validate_id(worker, "worker")
    if validate_queue_seconds(lease, "lease") <= 0:
        raise InvalidArgumentError("lease must be > 0 seconds")
    validate_limit(limit, "limit", MAX_LIST_LIMIT)
    validate_duration(wait, "wait")


def validate_write(
    stream_id: str,
    chunks: Sequence[bytes],
    *,
    expect_next: int | None,
    limit: int = MAX_PAYLOAD_BYTES,
) -> None:
    """Everything ``Stream.write`` refuses before any I/O."""
    validate_id(stream_id, "stream_id")
    if not chunks:
        raise InvalidArgumentError("write needs at least one chunk")
    total = 0
    for chunk in chunks:
        if not isinstance(chunk, bytes):
            raise InvalidArgumentError(f"chunks must be bytes, got {type(chunk).__name__}")
        total += len(chunk)
    if expect_next is not None and (
        isinstance(expect_next, bool) or not isinstance(expect_next, int) or expect_next < 0
    ):
        raise InvalidArgumentError(f"expect_next must be an int >= 0 or None, got {expect_next!r}")
    _check_size(total, limit, "write")


def validate_read(log_id: str, *, after: int, limit: int | None = None) -> int:
    """Everything ``Log.read`` and ``Log.watch`` (which has no ``limit``) refuse before any I/O.

    Returns ``after``.

    Raises:
        InvalidIdentifierError: a bad log id (see :func:`validate_id`).
        InvalidArgumentError: ``after`` not an ``int`` (``bool`` is refused) or below 0;
            ``limit`` not None nor an ``int`` >= 1 (no upper bound: a read is a window).
    """
    validate_id(log_id, "log_id")
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise InvalidArgumentError(
            f"after must be an int >= 0 (0 for the start, else the last seq seen), got {after!r}"
        )
    validate_limit(limit)
    return after


def validate_list(*, prefix: str, status: str | None, cursor: str | None, limit: int) -> str | None:
    """Everything ``Log.list_logs`` refuses before any I/O.

    ``prefix`` may be ``""`` (every log); otherwise it follows the identifier rules but for
    emptiness. ``cursor`` must be one :func:`list_cursor` made for this ``prefix`` and
    ``status`` (any ``limit``).

    Returns:
        The id of the last log of the previous page, from ``cursor`` (the page lists the ids
        after it); None when ``cursor`` is None (the first page).

    Raises:
        InvalidArgumentError: ``prefix`` not a ``str``; ``cursor`` neither None nor a ``str``,
            or not made by :func:`list_cursor` for this ``prefix`` and ``status`` (made up,
            garbled, or from another listing); ``limit`` not an ``int`` from 1 to
            MAX_LIST_LIMIT (None and ``bool`` are refused).
        InvalidIdentifierError: ``prefix`` containing NUL, longer than MAX_ID_BYTES in UTF-8
            or not encodable as UTF-8; ``status`` not a valid identifier or longer than
            MAX_STATUS_BYTES (the same rule as ``Log.append(status=...)``).
    """
    if not isinstance(prefix, str):
        raise InvalidArgumentError(
            f"prefix must be a str ('' for every log), got {type(prefix).__name__}"
        )
    if prefix:
        validate_id(prefix, "prefix")
    if status is not None:
        _check_status(status)
    if cursor is not None and not isinstance(cursor, str):
        raise InvalidArgumentError(
            f"cursor must be None or the str next_cursor of a previous page, got {cursor!r}"
        )
    _check_page_limit(limit)
    return None if cursor is None else _read_cursor(cursor, prefix, status)


_CURSOR_DIGEST_BYTES = 8


def _cursor_digest(last_id: str, prefix: str, status: str | None) -> bytes:
    # NUL never occurs in an id, prefix or status, so the joined text names one triple; an
    # empty status is refused, so "" stands for None. Not keyed: a cursor is not a secret (it
    # grants nothing the caller could not list anyway), the digest only tells a cursor made
    # for this listing from a made-up, garbled or borrowed one. A new format gets a new person.
    text = "\x00".join((prefix, status or "", last_id)).encode("utf-8")
    return hashlib.blake2b(text, digest_size=_CURSOR_DIGEST_BYTES, person=b"world.list.1").digest()


def list_cursor(last_id: str, *, prefix: str, status: str | None) -> str:
    """The ``next_cursor`` of a ``list_logs`` page whose last log is ``last_id``, listed with
    ``prefix`` and ``status``. :func:`validate_list` gives ``last_id`` back for the same
    ``prefix`` and ``status`` and refuses it for any other.

    The cursor is URL-safe ASCII (unpadded base64url of a digest of the three and the id).
    """
    raw = _cursor_digest(last_id, prefix, status) + last_id.encode("utf-8")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _read_cursor(cursor: str, prefix: str, status: str | None) -> str:
    refused = InvalidArgumentError(
        "cursor is not a next_cursor that list_logs returned for this listing: pass a page's "
        "next_cursor back unchanged, with the same prefix and status (the limit may change), "
        "or None to start from the first page"
    )
    try:
        raw = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True)
        last_id = raw[_CURSOR_DIGEST_BYTES:].decode("utf-8")
    except ValueError as exc:  # binascii.Error and UnicodeError are ValueErrors
        raise refused from exc
    canonical = base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
    digest = _cursor_digest(last_id, prefix, status)
    if (
        not last_id
        or cursor != canonical
        or not hmac.compare_digest(raw[:_CURSOR_DIGEST_BYTES], digest)
    ):
        raise refused
    return last_id


def validate_stream_read(stream_id: str, *, start: int) -> int:
    """Everything ``Stream.read`` refuses before any I/O. Returns ``start``.

    Raises:
        InvalidIdentifierError: a bad stream id (see :func:`validate_id`).
        InvalidArgumentError: ``start`` not an ``int`` (``bool`` is refused). Any ``int`` is
            accepted: a negative one counts back from the next index.
    """
    validate_id(stream_id, "stream_id")
    if isinstance(start, bool) or not isinstance(start, int):
        raise InvalidArgumentError(
            f"start must be an int chunk index (negative counts back from the end), got {start!r}"
        )
    return start


def validate_lease(lease: Lease) -> Lease:
    """Everything ``Queue.ack`` refuses before any I/O (and the lease part of ``renew`` and
    ``release``). Returns ``lease``.

    Raises:
        InvalidArgumentError: ``lease`` not a :class:`Lease` instance.
        InvalidIdentifierError: its ``queue``, ``message_id`` or ``token`` not a valid
            identifier (see :func:`validate_id`).
    """
    if not isinstance(lease, Lease):
        raise InvalidArgumentError(
            f"pass the Lease that claim returned, got {type(lease).__name__}"
        )
    validate_id(lease.queue, "queue")
    validate_id(lease.message_id, "message_id")
    validate_id(lease.token, "lease token")
    return lease


def validate_renew(lease: Lease, duration: float) -> float:
    """Everything ``Queue.renew`` refuses before any I/O. Returns ``duration`` as a float.

    Raises:
        InvalidArgumentError, InvalidIdentifierError: a bad lease (see :func:`validate_lease`).
        InvalidArgumentError: ``duration`` not a number of seconds > 0 and at most
            MAX_QUEUE_SECONDS.
    """
    validate_lease(lease)
    seconds = validate_queue_seconds(duration, "duration")
    if seconds <= 0:
        raise InvalidArgumentError(
            f"duration must be > 0 seconds, got {duration!r}; to give the message up, release it"
        )
    return seconds


def validate_release(lease: Lease, delay: float) -> float:
    """Everything ``Queue.release`` refuses before any I/O. Returns ``delay`` as a float.

    Raises:
        InvalidArgumentError, InvalidIdentifierError: a bad lease (see :func:`validate_lease`).
        InvalidArgumentError: ``delay`` not a number of seconds from 0 to MAX_QUEUE_SECONDS.
    """
    validate_lease(lease)
    return validate_queue_seconds(delay, "delay")


def validate_dead_letters(queue: str, *, limit: int) -> None:
    """Everything ``Queue.dead_letters`` refuses before any I/O.

    Raises:
        InvalidIdentifierError: a bad queue (see :func:`validate_id`).
        InvalidArgumentError: ``limit`` not an ``int`` from 1 to MAX_LIST_LIMIT (None and
            ``bool`` are refused).
    """
    validate_id(queue, "queue")
    _check_page_limit(limit)


def prefix_end(prefix: str) -> str | None:
    """The smallest string greater than every string starting with ``prefix``, or None when
    there is none (``""``, or only U+10FFFF characters).

    ``list_logs`` selects ``prefix <= id < prefix_end(prefix)`` in code-point order, so the
    prefix stays literal text. Surrogates are skipped: they never occur in a valid id.
    """
    chars = list(prefix)
    while chars:
        code = ord(chars[-1]) + 1
        if code == 0xD800:
            code = 0xE000
        if code <= 0x10FFFF:
            chars[-1] = chr(code)
            return "".join(chars)
        chars.pop()
    return None


# --------------------------------------------------------------------------------------------
# The three primitives
# --------------------------------------------------------------------------------------------


class Log(ABC):
    """Per-log append-only event sequences.

    A log exists from its first append until ``delete``. Positions (``seq``) are dense and
    start at 1; they are settled when the append commits, by the store's own uniqueness
    check, so any number of concurrent appenders in any number of processes never produce a
    hole or a duplicate, and a reader never sees ``seq`` n+1 before n. A batch occupies
    consecutive positions (``tail+1`` .. ``tail+len(events)``), never interleaved with another.
    """

    @abstractmethod
    async def append(
        self,
        log_id: str,
        events: Sequence[NewEvent],
        *,
        expect_tail: int | None = None,
        status: str | None = None,
        messages: Sequence[OutboxMessage] = (),
    ) -> int:
        """Append a batch atomically: every event of it is stored, or none.

        Args:
            log_id: the log; created by its first append.
            events: at least one event. Keys, where given, must be unique within the log.
            expect_tail: compare-and-set. When given, the batch is written only if the log's
                tail (0 for a missing log) equals it.
            status: when given, set as the log's status in the same atomic write; ``None``
                keeps the current status. A refused append changes no status.
            messages: outbox messages enqueued in the same atomic write (only where
                ``Capabilities.outbox``; otherwise a non-empty value raises UnsupportedError).

        Returns:
            The new tail: the ``seq`` of the batch's last event.

        Raises:
            ConflictError: ``expect_tail`` differs from the tail (``.actual``). This check comes
                before the key check.
            DuplicateKeyError: a key of the batch is already in the log; ``.existing`` is the
                stored event (when several keys collide, any one of them). Nothing of the
                batch is written, nor its status or outbox messages.
            UnsupportedError: ``messages`` given and the backend has no outbox (after the
                checks of :func:`validate_append`, which come first).
            InvalidIdentifierError, InvalidArgumentError, PayloadTooLargeError: see
                :func:`validate_append`.
        """

    @abstractmethod
    async def read(self, log_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        """Events with ``seq > after`` in order, at most ``limit`` (all when None).

        A missing log reads as empty. A ``limit`` below 1 raises InvalidArgumentError.
        """

    @abstractmethod
    async def get(self, log_id: str, key: str) -> Event | None:
        """The event stored under ``key`` in the log, or None."""

    @abstractmethod
    async def tail(self, log_id: str) -> int:
        """The last ``seq`` of the log; 0 for an empty or missing log."""

    @abstractmethod
    async def info(self, log_id: str) -> LogInfo | None:
        """The log's tail and status, or None when the log does not exist."""

    @abstractmethod
    def watch(self, log_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        """Yield events with ``seq > after`` in order, then each new one as it commits.

        Never ends by itself: stop by breaking out or cancelling. Each event is yielded once,
        none is skipped. A watcher may start before the log exists. New events are noticed
        through the store's notification where it has one, bounded polling otherwise.

        Raises:
            InvalidIdentifierError, InvalidArgumentError: see :func:`validate_read`; raised by
                the call itself, before the iterator is returned (a plain ``def`` returning an
                async generator, not an ``async def`` generator).
            ClosedError: by the call, when the World is closed; by the iterator, at its next
                step, once the World closes (also while it waits).
        """

    @abstractmethod
    async def list_logs(
        self,
        *,
        prefix: str = "",
        status: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page[LogInfo]:
        """Logs whose id starts with ``prefix`` (and whose status equals ``status``), ordered by
        id in code-point order, ``limit`` (at most MAX_LIST_LIMIT) per page.

        ``prefix`` is literal text: ``%``, ``_``, ``*``, ``[`` ... match only themselves.
        A page holds at most ``limit`` items; following ``next_cursor`` until it is None
        yields every matching log exactly once, in order.

        ``cursor`` is None for the first page, else the ``next_cursor`` of the previous page,
        unchanged, passed with the same ``prefix`` and ``status`` (``limit`` may change). It is
        opaque (backends make it with :func:`list_cursor`) and marks a position in id order,
        not a log: it stays valid when that log is deleted. It is not a secret.

        Raises:
            InvalidArgumentError: ``cursor`` is not a ``next_cursor`` of this listing: made up,
                garbled, a log id, or issued for another ``prefix`` or ``status`` (it is refused
                rather than read as a position in another listing).
            InvalidIdentifierError, InvalidArgumentError: the other arguments, see
                :func:`validate_list`.
        """

    @abstractmethod
    async def delete(self, log_id: str) -> None:
        """Delete the log, its keys and status. A missing log is a no-op; a later append
        starts again at ``seq`` 1."""


class Queue(ABC):
    """At-least-once delivery with leases.

    A message is *ready* (visible), *delayed* (visible from a later time), *leased* (handed to
    one worker until its deadline) or *dead* (attempts used up). Leased messages whose
    deadline passed are visible again. Deadlines come from the store's clock, so clock skew
    between workers is harmless. Ready messages are handed out in order of the time they
    became visible, then enqueue order (a released or expired message counts from when it
    became visible again); one ``claim`` returns its leases in that order. A delay or lease
    is at most MAX_QUEUE_SECONDS (about 31 years): a longer one is refused, not overflowed.
    """

    @abstractmethod
    async def enqueue(
        self,
        queue: str,
        payload: bytes,
        *,
        delay: float = 0.0,
        dedup_key: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> str:
        """Add a message, visible after ``delay`` seconds.

        Args:
            dedup_key: when a *live* message (ready, delayed or leased, not yet acked nor
                dead) of this queue carries the same key, nothing is added and that message's
                id is returned.
            max_attempts: deliveries before the message is dead-lettered.

        Returns:
            The message id: never used before in this queue (so after an ack, the same
            ``dedup_key`` yields a new id).
        """

    @abstractmethod
    async def claim(
        self,
        queue: str,
        worker: str,
        *,
        lease: float,
        limit: int = 1,
        wait: float = 0.0,
    ) -> list[Lease]:
        """Lease up to ``limit`` visible messages to ``worker`` for ``lease`` seconds.

        Waits up to ``wait`` seconds for a first message when none is visible, woken by the
        store's notification of an enqueue (or bounded polling); returns ``[]`` when none came.
        Each delivery increments the message's attempt. A visible message that has already had
        ``max_attempts`` deliveries is moved to the dead letters instead of being handed out.
        """

    @abstractmethod
    async def renew(self, lease: Lease, duration: float) -> Lease:
        """Extend the lease to ``duration`` seconds from now (store clock).

        Succeeds while the token is current, even if the deadline passed, as long as nobody
        claimed the message since. The returned lease has the same ``token``, ``message_id``
        and ``attempt``; only ``deadline`` moves, so the old lease object stays usable.

        Raises:
            LeaseLostError: the message was claimed again, acked, or dead-lettered.
        """

    @abstractmethod
    async def ack(self, lease: Lease) -> None:
        """Finish the message: it is removed and its dedup key freed. Like ``renew`` (and
        ``release``), it succeeds after the deadline passed as long as nobody claimed since.
        Acks of one lease racing each other (one process or several) end with exactly one
        success; the others raise LeaseLostError.

        Raises:
            LeaseLostError: the token is not current (claimed again, acked, dead-lettered).
        """

    @abstractmethod
    async def release(self, lease: Lease, *, delay: float = 0.0) -> None:
        """Give the message back, visible again after ``delay`` seconds. Its attempt count is
        kept; if it has had ``max_attempts`` deliveries it goes to the dead letters instead.

        Raises:
            LeaseLostError: the token is not current.
        """

    @abstractmethod
    async def dead_letters(self, queue: str, *, limit: int = 100) -> list[DeadLetter]:
        """Dead-lettered messages of the queue, at most ``limit`` (at most MAX_LIST_LIMIT),
        in order of death, oldest first: by the time each was dead-lettered, not the time it
        was enqueued, which is the order an operator handles failures in. A message dies at
        the ``release`` after its last delivery, or at the ``claim`` that finds its last lease
        expired; a requeued message that dies again counts from its new death. A dead message
        is no longer live: its dedup key is free. ``attempts`` is the number of deliveries it
        had; ``reason`` is a non-empty explanation."""

    @abstractmethod
    async def requeue(self, queue: str, message_id: str) -> None:
        """Move a dead letter back to ready with its attempts reset to 0, its id and
        ``max_attempts`` kept; it is ordered as visible from the time of the requeue.

        Raises:
            NotFoundError: no dead letter with that id in the queue.
        """


class Stream(ABC):
    """Ordered byte chunks, indexed densely from 0, that readers can follow and resume."""

    @abstractmethod
    async def write(
        self, stream_id: str, chunks: Sequence[bytes], *, expect_next: int | None = None
    ) -> int:
        """Append chunks atomically.

        Args:
            expect_next: compare-and-set: write only if the stream's next index equals it.

        Returns:
            The stream's next index after the write.

        Raises:
            ClosedError: the stream is closed (checked before ``expect_next``).
            ConflictError: ``expect_next`` differs (``.actual`` is the next index).
        """

    @abstractmethod
    async def close(self, stream_id: str) -> None:
        """Close the stream: readers finish after its last chunk. Idempotent; closing a stream
        never written creates it closed and empty."""

    @abstractmethod
    async def info(self, stream_id: str) -> StreamInfo:
        """The stream's next index and whether it is closed."""

    @abstractmethod
    def read(self, stream_id: str, *, start: int = 0) -> AsyncIterator[Chunk]:
        """Yield chunks from index ``start`` in order, then new ones as they are written, and
        end after the last chunk once the stream is closed.

        A negative ``start`` counts back from the next index when the read begins (-1 is the
        last chunk), clamped at 0. A reader may start before the stream exists. A reader that
        lost its connection resumes with ``start`` = last index seen + 1 and misses nothing.

        Raises:
            InvalidIdentifierError, InvalidArgumentError: see :func:`validate_stream_read`;
                raised by the call itself, before the iterator is returned (a plain ``def``
                returning an async generator, not an ``async def`` generator).
            ClosedError: by the call, when the World is closed; by the iterator, at its next
                step, once the World closes (also while it waits).
        """

    @abstractmethod
    async def delete(self, stream_id: str) -> None:
        """Delete the stream and its chunks; a missing stream is a no-op. Afterwards the
        stream reads as never written (``next_index=0``, open)."""


class World(ABC):
    """One backend's log, queue and stream in one namespace.

    Open with :func:`world_core.open_world` (``async with open_world() as world``); a World
    holds connections until ``aclose``.

    Two Worlds opened with the same URL and namespace are the same store, also within one
    process (an in-memory backend included): each sees everything the other writes, and
    closing one leaves the other open. Across processes this holds where
    ``Capabilities.shared``.

    Storage is created by the first write, never by opening. A namespace's storage (folders,
    files, schemas, tables, collections, indexes, keys) is made by the first call that stores
    something: ``Log.append``, ``Queue.enqueue``, ``Stream.write`` or ``Stream.close``. Opening
    a World, ``capabilities``, ``settings`` (so ``world info``) and every other call on a
    namespace without storage answer as for an empty namespace (reads empty, waits that end
    empty, ``LeaseLostError``, ``NotFoundError``, deletes and ``purge`` no-ops) and create
    nothing, so a mistyped namespace or URL leaves no trace. Any number of Worlds, in any
    number of processes, may make their first write to a namespace at the same moment: every
    one succeeds; a reader running meanwhile sees either no storage (an empty namespace) or
    what was committed, and a waiter started before the storage existed is woken by the first
    write like any other. Once made, storage costs a call nothing more (a cached flag, or the
    store's own error on the rare call that finds it missing). Opening may still look (and
    refuse a setting the first write could not use) and may bring existing storage of an
    older layout up to date. ``StorageContract`` of ``world-conformance`` checks this, through
    a probe of the store each backend's tests provide.
    """

    name: str
    """The entry-point name of the backend (``local``, ``postgres`` ...)."""
    namespace: str
    log: Log
    queue: Queue
    stream: Stream

    @property
    @abstractmethod
    def capabilities(self) -> Capabilities:
        """What this backend offers beyond the required contract."""

    @abstractmethod
    def settings(self) -> Mapping[str, str]:
        """The settings in effect, for ``world info``: credentials must be redacted."""

    @abstractmethod
    async def purge(self) -> None:
        """Delete every log, message (ready, delayed, leased, dead) and stream of this
        namespace, and nothing else."""

    @abstractmethod
    async def aclose(self) -> None:
        """Release connections and background tasks. Idempotent.

        Afterwards every method of ``log``, ``queue`` and ``stream``, and ``purge``, raises
        ClosedError and writes nothing, once its arguments passed their checks (a call with
        arguments it refuses raises that refusal, as on an open World: see the module
        docstring); ``watch`` and ``read`` raise it when called. Waits in progress (a
        ``watch`` or ``read`` iterator, a ``claim(wait=...)``) end with ClosedError, not a
        transient fault to retry. A write in progress when the World closes returns (it took
        effect), raises ClosedError (it wrote nothing) or raises BackendUnavailableError
        (what it sent may have taken effect: the outcome is unknown); never ClosedError for a
        write that took effect. ``name``, ``namespace``, ``capabilities`` and ``settings()``
        still answer."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class WorldFactory(Protocol):
    """What a ``workflow.worlds`` entry point refers to.

    ``url`` (a connection URL or, for local files, a folder) and ``namespace`` override the
    backend's environment settings; ``None`` means read the environment. ``namespace`` has
    been validated by the caller. A missing required setting raises ConfigurationError naming
    the variable to set. Opening creates no storage (see :class:`World`): the namespace's
    storage is made by its first write.
    """

    def __call__(
        self, *, url: str | None = None, namespace: str = "default"
    ) -> Awaitable[World]: ...
