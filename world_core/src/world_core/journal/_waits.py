"""Waiting inside a turn: durable timers, signals and approvals (the types and names).

A wait is a step. Its intent records the time it ends (``deadline``, on the store's clock, once:
never recomputed on replay) and, for a signal, the name it waits for. Its outcome records how
it ended: the timer fired, a signal was consumed (which one, from whom), or the wait timed out.
Between the two the turn is *suspended*: :class:`TurnSuspended` leaves the agent code, and the
worker acks the turn's message after queueing a wake-up for the deadline, so nothing (no
worker, connection or memory) is held while it waits. A signal sent meanwhile queues a wake-up
of its own, and, in case its sender dies before that, a delayed check that queues the wake-up
again if the signal is still unconsumed (see :meth:`Client.signal
<world_core.Client.signal>`). A wake-up for a wait another
message already resumed is stale and is dropped; the outcome's ``by`` (the message that wrote
it) tells them apart.

Signals are events of the session log keyed ``signal/<signal_id>``: the id deduplicates (a
double-tapped Approve counts once, and the same id with another payload is refused), and each
carries its sender. A signal names the turn it is for, or none: then the first wait for its
name in the session consumes it, whenever that wait comes. Each signal is consumed once.

A child run is a turn of a session of its own (its own log) that a turn starts
(:meth:`Journal.start_child <world_core.Journal.start_child>`) and waits for
(``wait_child``): the child's input names its parent; whoever ends the child (its reply or
failure) signals the parent turn ``child/<child session>``, so the parent waits like for any
signal, holding no worker.

An approval is a signal raced against a timer: before a tool declared
``approval="required"`` runs, the turn waits for the signal ``approval/<step>`` addressed to
it (:meth:`Client.approve <world_core.Client.approve>` / ``reject``, ``world approve``); the
tool runs on approval, and the model is told it did not on a rejection or when nobody decided
before ``approval_timeout``. The client and the worker agree on every decision: the client's
one clock reading that found it in time is recorded as its ``sent_at``, which the worker
compares with the same deadline (``decided_too_late``), and the worker appends a time-out only
if the session log has not moved since it looked for a decision (else it looks again).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
from dataclasses import dataclass
from typing import Any

from world_core.errors import ConfigurationError, InvalidArgumentError
from world_core.spi import validate_id

__all__ = [
    "MAX_SIGNAL_NAME_BYTES",
    "MAX_SIGNAL_PAYLOAD_BYTES",
    "MAX_WAIT_SECONDS",
    "RESERVED_SIGNAL_PREFIXES",
    "PendingApproval",
    "Signal",
    "TurnSuspended",
    "SIGNAL_KEY_VARIABLE",
    "ChildResult",
    "approval_signal",
    "child_signal",
    "check_seconds",
    "check_signal_name",
    "check_signal_id",
    "check_signal_payload",
    "sign_signal",
    "signal_key",
    "verify_signal",
]

MAX_SIGNAL_NAME_BYTES = 200
"""The longest signal name, in UTF-8 bytes."""

MAX_SIGNAL_PAYLOAD_BYTES = 64 * 1024
"""The largest signal payload (canonical JSON): a wait's outcome copies it. Send a reference
(a document, a URL) to anything larger."""

RESERVED_SIGNAL_PREFIXES = ("approval/", "child/")
"""Signal names and ids the journal's own signals use: decisions on approvals (sent only by
``Client.approve``/``reject``) and child runs' ends. ``Client.signal`` refuses them."""

WAIT_KINDS = ("timer", "signal", "approval", "child")
"""Step kinds that suspend a turn until their deadline (or a signal)."""


@dataclass(frozen=True)
class Signal:
    """A signal a wait consumed: its id, name, JSON payload, sender, and the turn it was
    addressed to (None: the session)."""

    signal_id: str
    name: str
    payload: Any
    sender: str
    turn_id: str | None = None
    sent_at: float | None = None
    """UNIX time on the sender's clock."""

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Signal:
        turn = body.get("turn")
        sent = body.get("sent_at")
        return cls(
            signal_id=str(body.get("id")),
            name=str(body.get("name")),
            payload=body.get("payload"),
            sender=str(body.get("sender")),
            turn_id=None if turn is None else str(turn),
            sent_at=float(sent) if isinstance(sent, int | float) else None,
        )


@dataclass(frozen=True)
class ChildResult:
    """How a child run ended (:meth:`Journal.wait_child <world_core.Journal.wait_child>`): its
    reply, or the failure that ended it (``error_type``, ``error``, ``attempts``, ``step``)."""

    session_id: str
    turn_id: str
    reply: str | None = None
    failure: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.reply is not None


def child_signal(child_session: str) -> str:
    """The name of the signal a child run's end sends its parent turn."""
    return f"child/{child_session}"


@dataclass(frozen=True)
class PendingApproval:
    """A tool call waiting for a person's decision (:meth:`Client.pending_approvals
    <world_core.Client.pending_approvals>`)."""

    session_id: str
    turn_id: str
    step: int
    tool: str
    arguments: Any
    deadline: float
    """UNIX time (store clock) after which the call is refused unless decided."""


class TurnSuspended(BaseException):
    """The turn waits (a timer, a signal, an approval) and leaves the agent code here.

    Not an error, and a BaseException so that no ``except Exception`` in agent code swallows
    it: let it through. A :class:`~world_core.Worker` queues a wake-up for ``wake_at`` (store
    clock) and frees itself; a later message resumes the turn from the journal.
    """

    def __init__(self, message: str, *, step: int, wake_at: float, signal: str | None) -> None:
        super().__init__(message)
        self.step = step
        self.wake_at = wake_at
        self.signal = signal


MAX_WAIT_SECONDS = 10 * 366 * 86400
"""The longest wait (ten years): a deadline every backend's queue can hold."""


def check_seconds(value: object, what: str, *, most: float = MAX_WAIT_SECONDS) -> float:
    """``value`` as seconds: a finite number from 0 to ``most`` (ten years by default).

    Raises:
        InvalidArgumentError: anything else, naming ``what``.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= most
    ):
        raise InvalidArgumentError(
            f"{what} must be a number of seconds from 0 to {most:g} (ten years), got {value!r}"
        )
    return float(value)


def check_signal_name(name: object) -> str:
    """A signal name: a non-empty str of at most :data:`MAX_SIGNAL_NAME_BYTES` UTF-8 bytes,
    without control characters.

    Raises:
        InvalidArgumentError: anything else.
    """
    if (
        not isinstance(name, str)
        or not name
        or len(name.encode("utf-8", "surrogatepass")) > MAX_SIGNAL_NAME_BYTES
        or any(ord(c) < 32 or ord(c) == 127 for c in name)
    ):
        raise InvalidArgumentError(
            f"a signal name is a non-empty str of at most {MAX_SIGNAL_NAME_BYTES} bytes without "
            f"control characters, got {name!r:.80}"
        )
    return name


def check_signal_payload(name: str, payload: object) -> None:
    """Refuse a signal payload that is not JSON data as the waiting turn will receive it:
    None, bool, int, float (finite), str, and lists, tuples and dicts with str keys of them.

    A value JSON would only carry converted is refused rather than converted: a set (its
    order changes between processes, so a resend with the same id could be refused as
    another payload), bytes, a dict with keys that are not str, a pydantic model, a date.
    The caller converts it first and the waiter gets exactly what was sent. A container that
    holds itself (a circular reference) is refused too, and so is a payload of more values
    than :data:`MAX_SIGNAL_PAYLOAD_BYTES` (too large whatever they are), so the walk ends
    early on any input.

    Raises:
        InvalidArgumentError: naming the value's type and where it is in the payload.
    """
    # Depth first, without recursion (a deep payload is refused by its size, not a crash
    # here). Each entry is a value and where it is, as (parent's where, its key or index), the
    # text made only for the message. A container is on the path from the payload down to the
    # entries after its exit marker (value None): one met again on its own path is a cycle,
    # which JSON cannot write (a container met twice elsewhere is not: it is written twice).
    Where = tuple[Any, ...]  # () for the payload itself, else (parent's Where, key or index)
    pending: list[tuple[object, Where, int | None]] = [(payload, (), None)]
    path: set[int] = set()
    values = 0
    while pending:
        value, where, leaving = pending.pop()
        if leaving is not None:
            path.discard(leaving)
            continue
        values += 1
        if values > MAX_SIGNAL_PAYLOAD_BYTES:  # each value is at least one byte of its JSON
            raise InvalidArgumentError(
                f"signal {name!r}: payload holds more than {MAX_SIGNAL_PAYLOAD_BYTES} values, "
                f"so more than {MAX_SIGNAL_PAYLOAD_BYTES} bytes of JSON; send a reference to it "
                "(a document, a URL)"
            )
        if value is None or isinstance(value, bool | int | str):
            continue
        if isinstance(value, float):
            if math.isfinite(value):
                continue
            problem = f"{value!r} (JSON has no NaN or infinity)"
        elif isinstance(value, list | tuple | dict):
            if id(value) in path:
                problem = "a container that holds itself (a circular reference: JSON has none)"
            else:
                bad_keys = (
                    [k for k in value if not isinstance(k, str)] if isinstance(value, dict) else []
                )
                if bad_keys:
                    problem = f"a dict key {bad_keys[0]!r} that is not a str"
                else:
                    path.add(id(value))
                    pending.append((None, where, id(value)))
                    items = value.items() if isinstance(value, dict) else enumerate(value)
                    pending.extend((item, (where, key), None) for key, item in items)
                    continue
        else:
            problem = f"a {type(value).__name__}"
        raise InvalidArgumentError(
            f"signal {name!r}: payload is not JSON data as the waiting turn would receive it: "
            f"{_where(where)} holds {problem}; send None, bool, int, finite float, str, lists "
            "and dicts with str keys, converted first (a sorted list for a set, base64 or hex "
            "text for bytes, model_dump(mode='json') for a pydantic model)"
        )


def _where(where: tuple[Any, ...]) -> str:
    """``payload['items'][1]`` for ``(((), 'items'), 1)``."""
    keys: list[object] = []
    while where:
        where, key = where
        keys.append(key)
    return "payload" + "".join(f"[{key!r}]" for key in reversed(keys))


def check_signal_id(signal_id: object) -> str:
    """A signal id: a valid identifier (see :func:`world_core.spi.validate_id`) of at most
    300 bytes, so its key ``signal/<id>`` fits."""
    if not isinstance(signal_id, str):
        raise InvalidArgumentError(f"signal_id must be a str, got {type(signal_id).__name__}")
    validate_id(signal_id, "signal_id")
    if len(signal_id.encode("utf-8")) > 300:
        raise InvalidArgumentError(f"signal_id {signal_id[:60]!r}... is longer than 300 bytes")
    return signal_id


def approval_signal(turn_id: str, step: int) -> tuple[str, str]:
    """The (signal name, signal id) of the decision on the approval at ``step`` of the turn."""
    return f"approval/{step}", f"approval/{turn_id}/{step}"


SIGNAL_KEY_VARIABLE = "WORKFLOW_SIGNAL_KEY"
"""The environment variable holding the shared secret of signed (webhook) signals."""

_MIN_KEY_BYTES = 16


def signal_key(key: str | bytes | None = None) -> bytes:
    """The key that signs signals: ``key``, or :data:`SIGNAL_KEY_VARIABLE` from the environment.

    Raises:
        ConfigurationError: no key, or one shorter than 16 bytes (the key is never shown).
    """
    if key is None:
        key = os.environ.get(SIGNAL_KEY_VARIABLE, "")
        where = SIGNAL_KEY_VARIABLE
    else:
        where = "key="
    raw = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    if len(raw) < _MIN_KEY_BYTES:
        missing = "is not set" if not raw else f"is shorter than {_MIN_KEY_BYTES} bytes"
        raise ConfigurationError(
            f"the key of signed signals ({where}) {missing}: set {SIGNAL_KEY_VARIABLE} to a "
            f"shared secret of at least {_MIN_KEY_BYTES} random bytes (the sender signs with it)"
        )
    return raw


def sign_signal(body: bytes, *, key: str | bytes | None = None) -> str:
    """The signature of a signal's raw request body: ``sha256=<hex HMAC-SHA256>``, as a webhook
    sender computes it (the header value :meth:`Client.signal_from_webhook
    <world_core.Client.signal_from_webhook>` checks)."""
    if not isinstance(body, bytes):
        raise InvalidArgumentError(f"body must be bytes, got {type(body).__name__}")
    return "sha256=" + hmac.new(signal_key(key), body, hashlib.sha256).hexdigest()


def verify_signal(body: bytes, signature: str, *, key: str | bytes | None = None) -> None:
    """Check ``signature`` against ``body`` in constant time.

    Raises:
        InvalidArgumentError: it does not match (nothing about the key or the expected value
            is said).
        ConfigurationError: no usable key.
    """
    expected = sign_signal(body, key=key)
    given = signature if isinstance(signature, str) else ""
    if not hmac.compare_digest(expected.encode(), given.strip().encode()):
        raise InvalidArgumentError(
            "the signal's signature does not match its body: refused (sign the exact bytes "
            f"sent with HMAC-SHA256 under {SIGNAL_KEY_VARIABLE}, as 'sha256=<hex>')"
        )
