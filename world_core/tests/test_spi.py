"""The validation every backend runs first, the error tree, and the SPI records."""

# Every "type: ignore" in this file marks an argument of a deliberately wrong type or value:
# the refusal of it is what the test checks.

from __future__ import annotations

import inspect
import pickle
from typing import Any

import pydantic
import pytest

from world_core import errors
from world_core.spi import (
    MAX_ID_BYTES,
    MAX_LIST_LIMIT,
    MAX_PAYLOAD_BYTES,
    MAX_QUEUE_SECONDS,
    MAX_STATUS_BYTES,
    Event,
    Lease,
    NewEvent,
    OutboxMessage,
    list_cursor,
    prefix_end,
    validate_append,
    validate_claim,
    validate_dead_letters,
    validate_duration,
    validate_enqueue,
    validate_id,
    validate_lease,
    validate_list,
    validate_namespace,
    validate_queue_seconds,
    validate_read,
    validate_release,
    validate_renew,
    validate_stream_read,
    validate_write,
)

ODD_BUT_VALID = [
    "a/b",
    "..",
    "../../etc/passwd",
    "naïve ☃ 日本",
    'it\'s "quoted"',
    "$set",
    "{tag}",
    "*",
    "a:b",
    "'; DROP TABLE x; --",
    " ",
    "\n",
    "\\",
]


@pytest.mark.parametrize("value", ODD_BUT_VALID)
def test_odd_identifiers_are_data(value: str) -> None:
    assert validate_id(value) == value


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("", "empty"),
        ("a\x00b", "NUL"),
        ("\ud800", "UTF-8"),
        ("x" * (MAX_ID_BYTES + 1), "limit"),
        ("é" * (MAX_ID_BYTES // 2 + 1), "limit"),
        (b"bytes", "str"),
        (7, "str"),
    ],
)
def test_bad_identifiers_are_refused_with_a_reason(value: object, fragment: str) -> None:
    with pytest.raises(errors.InvalidIdentifierError, match=fragment):
        validate_id(value, "log_id")


def test_identifier_at_the_limit_is_accepted() -> None:
    assert validate_id("x" * MAX_ID_BYTES)


@pytest.mark.parametrize("value", ["default", "t1", "a_b", "0", "x" * 48])
def test_namespaces_accepted(value: str) -> None:
    assert validate_namespace(value) == value


@pytest.mark.parametrize("value", ["", "A", "_a", "a-b", "a.b", "a/b", "x" * 49, "ä", None])
def test_namespaces_refused_name_the_variable(value: object) -> None:
    with pytest.raises(errors.InvalidIdentifierError, match="WORKFLOW_NAMESPACE"):
        validate_namespace(value)


def _append(events: list[NewEvent], **kwargs: object) -> None:
    options: dict[str, object] = {"expect_tail": None, "status": None, "messages": ()}
    options.update(kwargs)
    validate_append("log", events, **options)  # type: ignore[arg-type]


def test_append_refuses_an_empty_batch() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="at least one"):
        _append([])


def test_append_refuses_a_key_twice_in_one_batch() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="twice"):
        _append([NewEvent(data=b"", key="k"), NewEvent(data=b"", key="k")])


def test_append_payload_limit_counts_events_and_outbox_messages() -> None:
    half = MAX_PAYLOAD_BYTES // 2
    _append([NewEvent(data=b"x" * half), NewEvent(data=b"x" * half)])
    with pytest.raises(errors.PayloadTooLargeError) as info:
        _append(
            [NewEvent(data=b"x" * half)],
            messages=[OutboxMessage(queue="q", payload=b"x" * (half + 1))],
        )
    assert info.value.size == MAX_PAYLOAD_BYTES + 1
    assert info.value.limit == MAX_PAYLOAD_BYTES
    assert "blob" in str(info.value)


@pytest.mark.parametrize("expect_tail", [-1, True, 1.0, "3"])
def test_append_refuses_bad_expect_tail(expect_tail: object) -> None:
    with pytest.raises(errors.InvalidArgumentError, match="expect_tail"):
        _append([NewEvent(data=b"")], expect_tail=expect_tail)


def test_append_status_limits() -> None:
    _append([NewEvent(data=b"")], status="s" * MAX_STATUS_BYTES)
    with pytest.raises(errors.InvalidIdentifierError, match="status"):
        _append([NewEvent(data=b"")], status="s" * (MAX_STATUS_BYTES + 1))
    with pytest.raises(errors.InvalidIdentifierError, match="status"):
        _append([NewEvent(data=b"")], status="")


def test_append_checks_outbox_messages() -> None:
    with pytest.raises(errors.InvalidIdentifierError, match="queue"):
        _append([NewEvent(data=b"")], messages=[OutboxMessage(queue="q\x00", payload=b"")])
    with pytest.raises(errors.InvalidArgumentError, match="delay"):
        _append([NewEvent(data=b"")], messages=[OutboxMessage(queue="q", payload=b"", delay=-1)])
    with pytest.raises(errors.InvalidArgumentError, match="max_attempts"):
        _append(
            [NewEvent(data=b"")], messages=[OutboxMessage(queue="q", payload=b"", max_attempts=0)]
        )


def test_enqueue_validation() -> None:
    validate_enqueue("q", b"", delay=0, dedup_key=None, max_attempts=1)
    with pytest.raises(errors.InvalidArgumentError, match="bytes"):
        validate_enqueue("q", "text", delay=0, dedup_key=None, max_attempts=1)  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidArgumentError, match="delay"):
        validate_enqueue("q", b"", delay=float("nan"), dedup_key=None, max_attempts=1)
    with pytest.raises(errors.InvalidIdentifierError, match="dedup_key"):
        validate_enqueue("q", b"", delay=0, dedup_key="", max_attempts=1)
    with pytest.raises(errors.PayloadTooLargeError):
        validate_enqueue(
            "q", b"x" * (MAX_PAYLOAD_BYTES + 1), delay=0, dedup_key=None, max_attempts=1
        )


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"lease": 0, "limit": 1, "wait": 0}, "lease"),
        ({"lease": 1, "limit": 0, "wait": 0}, "limit"),
        ({"lease": 1, "limit": 100_000, "wait": 0}, "limit"),
        ({"lease": 1, "limit": 1, "wait": -0.1}, "wait"),
        ({"lease": float("inf"), "limit": 1, "wait": 0}, "lease"),
    ],
)
def test_claim_validation(kwargs: dict[str, float], fragment: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=fragment):
        validate_claim("q", "worker", **kwargs)  # type: ignore[arg-type]


def test_write_validation() -> None:
    validate_write("s", [b"", b"\x00"], expect_next=0)
    with pytest.raises(errors.InvalidArgumentError, match="at least one"):
        validate_write("s", [], expect_next=None)
    with pytest.raises(errors.InvalidArgumentError, match="bytes"):
        validate_write("s", [bytearray(b"x")], expect_next=None)  # type: ignore[list-item]
    with pytest.raises(errors.InvalidArgumentError, match="expect_next"):
        validate_write("s", [b""], expect_next=-1)
    with pytest.raises(errors.PayloadTooLargeError):
        validate_write("s", [b"x" * MAX_PAYLOAD_BYTES, b"x"], expect_next=None)


def test_duration_accepts_ints_and_floats_only() -> None:
    assert validate_duration(2, "delay") == 2.0
    with pytest.raises(errors.InvalidArgumentError):
        validate_duration(True, "delay")
    with pytest.raises(errors.InvalidArgumentError):
        validate_duration("1", "delay")


def test_queue_durations_are_bounded_by_the_longest_a_store_holds() -> None:
    lease = Lease(
        queue="q", message_id="m", payload=b"", attempt=1, max_attempts=1, token="t", deadline=0.0
    )
    assert validate_queue_seconds(MAX_QUEUE_SECONDS, "delay") == MAX_QUEUE_SECONDS
    for seconds in (MAX_QUEUE_SECONDS + 1, 1e300):
        with pytest.raises(errors.InvalidArgumentError, match=r"delay.*31 years"):
            validate_enqueue("q", b"x", delay=seconds, dedup_key=None, max_attempts=1)
        with pytest.raises(errors.InvalidArgumentError, match="lease"):
            validate_claim("q", "w", lease=seconds, limit=1, wait=0)
        with pytest.raises(errors.InvalidArgumentError, match="duration"):
            validate_renew(lease, seconds)
        with pytest.raises(errors.InvalidArgumentError, match="delay"):
            validate_release(lease, seconds)
    validate_claim("q", "w", lease=1, limit=1, wait=1e300)  # a wait is the caller's own time


def test_error_tree_has_the_documented_builtin_bases() -> None:
    assert issubclass(errors.NotFoundError, LookupError)
    assert issubclass(errors.ConfigurationError, ValueError)
    assert issubclass(errors.InvalidIdentifierError, errors.InvalidArgumentError)
    assert issubclass(errors.PayloadTooLargeError, ValueError)
    assert issubclass(errors.UnsupportedError, NotImplementedError)
    assert issubclass(errors.BackendUnavailableError, ConnectionError)
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.WorldError)
    for name in errors.__all__:
        assert name in (errors.__doc__ or ""), f"{name} missing from the tree in the docstring"


def test_errors_carry_what_the_caller_needs() -> None:
    existing = Event(seq=3, data=b"x", key="k")
    duplicate = errors.DuplicateKeyError("dup", key="k", existing=existing)
    assert duplicate.existing == existing
    conflict = errors.ConflictError("cas", expected=1, actual=4)
    assert (conflict.expected, conflict.actual) == (1, 4)


def test_records_are_frozen_and_strict() -> None:
    event = Event(seq=1, data=b"x")
    with pytest.raises(pydantic.ValidationError):
        event.seq = 2  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        Event(seq=1, data=b"x", extra=1)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"data": "text"}, errors.InvalidArgumentError, r"NewEvent\.data must be bytes, got str"),
        ({"data": bytearray(b"x")}, errors.InvalidArgumentError, "got bytearray.*bytes"),
        ({"data": memoryview(b"x")}, errors.InvalidArgumentError, "got memoryview.*bytes"),
        ({"data": None}, errors.InvalidArgumentError, r"data must be bytes, got NoneType"),
        ({"data": 7}, errors.InvalidArgumentError, r"data must be bytes, got int"),
        (
            {"data": b"", "key": 123},
            errors.InvalidIdentifierError,
            r"NewEvent\.key must be a str or None, got int",
        ),
        ({"data": b"", "key": b"k"}, errors.InvalidIdentifierError, "key .* got bytes"),
        ({}, errors.InvalidArgumentError, r"NewEvent needs data: pass bytes"),
        ({"data": b"", "seq": 1}, errors.InvalidArgumentError, "no field 'seq'.*data, key"),
    ],
)
def test_new_event_refuses_wrong_types_without_coercion(
    fields: dict[str, object], error: type[errors.InvalidArgumentError], message: str
) -> None:
    with pytest.raises(error, match=message) as info:
        NewEvent(**fields)  # type: ignore[arg-type]
    if error is errors.InvalidArgumentError:
        assert not isinstance(info.value, errors.InvalidIdentifierError)


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"payload": "text"}, errors.InvalidArgumentError, r"OutboxMessage\.payload must be bytes"),
        ({"payload": bytearray()}, errors.InvalidArgumentError, "payload .* got bytearray"),
        ({"queue": 1}, errors.InvalidIdentifierError, r"OutboxMessage\.queue must be a str,"),
        ({"dedup_key": 1}, errors.InvalidIdentifierError, "dedup_key must be a str or None"),
        ({"delay": "1"}, errors.InvalidArgumentError, "delay must be a number of seconds"),
        ({"delay": True}, errors.InvalidArgumentError, "delay .* got bool"),
        ({"max_attempts": 3.0}, errors.InvalidArgumentError, "max_attempts must be an int"),
        ({"max_attempts": True}, errors.InvalidArgumentError, "max_attempts .* got bool"),
        ({"max_attempts": "3"}, errors.InvalidArgumentError, "max_attempts .* got str"),
    ],
)
def test_outbox_message_refuses_wrong_types_without_coercion(
    fields: dict[str, object], error: type[errors.InvalidArgumentError], message: str
) -> None:
    valid: dict[str, object] = {"queue": "q", "payload": b""}
    with pytest.raises(error, match=message):
        OutboxMessage(**(valid | fields))  # type: ignore[arg-type]


def test_inbound_records_take_exactly_what_they_say() -> None:
    """bytes (a subclass too) for data, str or None for keys; an int delay is a number of
    seconds. The stored values are the ones passed, not conversions of them."""

    class Tagged(bytes):
        pass

    assert NewEvent(data=b"\x00").data == b"\x00"
    assert NewEvent(data=Tagged(b"x"), key="k") == NewEvent(data=b"x", key="k")
    assert NewEvent(data=b"", key=None).key is None
    message = OutboxMessage(queue="q", payload=b"p", delay=2, dedup_key=None, max_attempts=1)
    assert message.delay == 2.0
    assert isinstance(message.delay, float)


@pytest.mark.parametrize(
    "fields", [{"data": b"x"}, {"data": b"x", "key": None}, {"data": b"", "key": "k"}]
)
def test_new_event_built_without_pydantic_is_the_validated_model(fields: dict[str, Any]) -> None:
    """NewEvent stores exact bytes and str itself (pydantic's validation costs the append path
    about 12 us): what it makes is what validation makes, state and fields set included, so
    equality, hashing, copies, pickling and model_dump(exclude_unset=True) are pydantic's."""
    built = NewEvent(**fields)
    validated = NewEvent.model_validate(fields)
    assert built.__getstate__() == validated.__getstate__()
    assert built == validated
    assert hash(built) == hash(validated)
    assert repr(built) == repr(validated)
    assert built.model_dump(exclude_unset=True) == fields
    assert pickle.loads(pickle.dumps(built)) == built
    assert built.model_copy(update={"key": "other"}).key == "other"
    with pytest.raises(pydantic.ValidationError):
        built.data = b"y"  # type: ignore[misc]


def test_new_event_signature_is_its_fields() -> None:
    """The fast __init__'s sentinel defaults do not show: data is required, key is None."""
    old = "(*, data: bytes, key: str | None = None) -> None"
    assert str(inspect.signature(NewEvent)) == old
    assert inspect.signature(NewEvent).parameters["data"].default is inspect.Parameter.empty


LEASE = Lease(
    queue="q", message_id="m", payload=b"", attempt=1, max_attempts=3, token="t", deadline=1.0
)


def test_read_after_is_an_int_from_zero() -> None:
    assert validate_read("l", after=0) == 0
    assert validate_read("l", after=7, limit=2) == 7
    for bad in (-1, True, 1.0, "1", None):
        with pytest.raises(errors.InvalidArgumentError, match="after"):
            validate_read("l", after=bad)  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidArgumentError, match="limit"):
        validate_read("l", after=0, limit=0)
    with pytest.raises(errors.InvalidIdentifierError, match="log_id"):
        validate_read("", after=0)


def test_list_accepts_an_empty_prefix_and_checks_the_rest() -> None:
    assert validate_list(prefix="", status=None, cursor=None, limit=1) is None
    longest = "é" * (MAX_ID_BYTES // 2)
    cursor = list_cursor(longest + "z", prefix=longest, status="s")
    assert validate_list(prefix=longest, status="s", cursor=cursor, limit=MAX_LIST_LIMIT) == (
        longest + "z"
    )
    with pytest.raises(errors.InvalidArgumentError, match="prefix must be a str"):
        validate_list(prefix=b"a", status=None, cursor=None, limit=1)  # type: ignore[arg-type]
    for prefix in ("a\x00", "x" * (MAX_ID_BYTES + 1), "\ud800"):
        with pytest.raises(errors.InvalidIdentifierError, match="prefix"):
            validate_list(prefix=prefix, status=None, cursor=None, limit=1)
    with pytest.raises(errors.InvalidIdentifierError, match="status"):
        validate_list(prefix="", status="s" * (MAX_STATUS_BYTES + 1), cursor=None, limit=1)
    with pytest.raises(errors.InvalidArgumentError, match="cursor"):
        validate_list(prefix="", status=None, cursor=1, limit=1)  # type: ignore[arg-type]
    for limit in (None, 0, True, MAX_LIST_LIMIT + 1):
        with pytest.raises(errors.InvalidArgumentError, match="limit"):
            validate_list(prefix="", status=None, cursor=None, limit=limit)  # type: ignore[arg-type]


def test_list_cursor_names_the_last_log_of_its_listing() -> None:
    """validate_list returns the log id a cursor was made from, for the same prefix and status
    (whatever the limit); the same id under another prefix or status is refused."""
    for last, prefix, status in (
        ("a", "", None),
        ("run/é😀\U0010ffff", "run/", "done"),
        ("x" * MAX_ID_BYTES, "x", "s" * MAX_STATUS_BYTES),
        ("'; --", "'", None),
    ):
        cursor = list_cursor(last, prefix=prefix, status=status)
        assert cursor.isascii()
        for limit in (1, MAX_LIST_LIMIT):
            assert validate_list(prefix=prefix, status=status, cursor=cursor, limit=limit) == last
    cursor = list_cursor("run/2", prefix="run/", status="done")
    for prefix, status in (("", "done"), ("run", "done"), ("run/2", "done"), ("run/", None)):
        with pytest.raises(errors.InvalidArgumentError, match="same prefix and status"):
            validate_list(prefix=prefix, status=status, cursor=cursor, limit=1)
    with pytest.raises(errors.InvalidArgumentError, match="cursor"):
        validate_list(prefix="run/", status="Done", cursor=cursor, limit=1)


@pytest.mark.parametrize(
    "forged",
    ["", "c", "run/2", b"run/2".hex(), "null", "=", "====", "a\x00b", "é", "YQ", "YQ=="],
)
def test_list_refuses_a_cursor_it_did_not_make(forged: str) -> None:
    """A log id, its hex (the cursors of earlier versions) or any other made-up text is not a
    cursor."""
    with pytest.raises(errors.InvalidArgumentError, match="next_cursor"):
        validate_list(prefix="", status=None, cursor=forged, limit=1)


def test_list_refuses_every_garbled_cursor() -> None:
    """Any character changed, cut off or added is noticed, the unused low bits of the last
    base64 character included."""
    cursor = list_cursor("run/2", prefix="", status=None)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_+/="
    garbled = {cursor[:i] + c + cursor[i + 1 :] for i in range(len(cursor)) for c in alphabet}
    garbled |= {cursor[:-1], cursor[1:], cursor + "A", "A" + cursor, cursor + "=", cursor + " "}
    garbled.discard(cursor)
    for bad in sorted(garbled):
        with pytest.raises(errors.InvalidArgumentError, match="next_cursor"):
            validate_list(prefix="", status=None, cursor=bad, limit=1)


def test_stream_read_start_is_any_int() -> None:
    assert validate_stream_read("s", start=-3) == -3
    for bad in (True, 1.0, "0", None):
        with pytest.raises(errors.InvalidArgumentError, match="start"):
            validate_stream_read("s", start=bad)  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidIdentifierError, match="stream_id"):
        validate_stream_read("a\x00", start=0)


def test_lease_must_be_a_lease_with_valid_ids() -> None:
    assert validate_lease(LEASE) is LEASE
    with pytest.raises(errors.InvalidArgumentError, match="Lease that claim returned"):
        validate_lease(LEASE.model_dump())  # type: ignore[arg-type]
    for field, fragment in (("queue", "queue"), ("message_id", "message_id"), ("token", "token")):
        with pytest.raises(errors.InvalidIdentifierError, match=fragment):
            validate_lease(LEASE.model_copy(update={field: ""}))


def test_renew_needs_a_positive_duration_release_a_non_negative_delay() -> None:
    assert validate_renew(LEASE, 2) == 2.0
    assert validate_release(LEASE, 0) == 0.0
    for duration in (0, -1, float("inf"), True):
        with pytest.raises(errors.InvalidArgumentError, match="duration"):
            validate_renew(LEASE, duration)
    for delay in (-0.1, float("nan")):
        with pytest.raises(errors.InvalidArgumentError, match="delay"):
            validate_release(LEASE, delay)
    with pytest.raises(errors.InvalidArgumentError, match="Lease"):
        validate_renew(None, 1)  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidArgumentError, match="Lease"):
        validate_release(None, 0)  # type: ignore[arg-type]


def test_dead_letters_limit_is_required_and_bounded() -> None:
    validate_dead_letters("q", limit=MAX_LIST_LIMIT)
    for limit in (None, 0, MAX_LIST_LIMIT + 1):
        with pytest.raises(errors.InvalidArgumentError, match="limit"):
            validate_dead_letters("q", limit=limit)  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidIdentifierError, match="queue"):
        validate_dead_letters("", limit=1)


def test_prefix_end_bounds_exactly_the_strings_with_the_prefix() -> None:
    assert prefix_end("") is None
    assert prefix_end("ab") == "ac"
    assert prefix_end("a\U0010ffff") == "b"
    assert prefix_end("\U0010ffff") is None
    assert prefix_end("a\ud7ff") == "a\ue000"
    end = prefix_end("a%")
    assert end is not None
    assert all("a%" <= s < end for s in ("a%", "a%\U0010ffff", "a%z"))
    assert not any("a%" <= s < end for s in ("a&", "a", "b"))
