"""Exported histories: a session's log and the blobs it names, as one self-contained document.

``world export SESSION...`` writes it; ``world replay-check FILE...`` reads it (see
:mod:`world_core.journal._replay`). The format, ``world-history/1``::

    {
      "format": "world-history/1",
      "sessions": [
        {
          "session_id": "s1",
          "status": null,
          "events": [
            {"seq": 1, "key": "turn/t1/input", "encoding": "json", "data": {"t": "input", ...}},
            {"seq": 2, "key": null, "encoding": "utf-8", "data": "not JSON, but text"},
            {"seq": 3, "key": "raw", "encoding": "base64", "data": "AAEC"}
          ],
          "blobs": {"<sha-256 hex>": "<base64 of the blob's bytes>"}
        }
      ]
    }

* ``events``: every event of the session log ``session/<session_id>`` in ``seq`` order, with
  its key. ``data`` holds the event's bytes exactly, in the encoding ``encoding`` names:
  ``json`` (the bytes are the canonical JSON of ``data``: sorted keys, no spaces, UTF-8;
  what the journal writes, so most events read and diff as JSON), ``utf-8`` (other text) or
  ``base64`` (anything else). An event is written as ``json`` only when encoding ``data``
  again gives back its exact bytes.
* ``blobs``: every blob an event names (a ``"blob": {"digest", "size"}`` entry, the way the
  journal keeps values above its blob threshold), so the document needs no World to be read.
  Each is checked against its digest when the document is read.
* ``log_id`` (only for a log the session was continued in, see
  :mod:`world_core.journal._continue`): that log's id; the session's first log has none.
  ``world export`` writes every log of a continued session, oldest first.
* ``status``: the log's status (:meth:`Log.info <world_core.spi.Log.info>`), usually null.

Readers refuse another ``format`` (a later version changes the name). Importing a document
(:func:`write_history`) appends the events in order with their keys into an empty session log,
after storing the blobs; ``seq`` numbers are then the World's own (the same, for a log exported
whole).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from world_core.errors import InvalidArgumentError, NotFoundError
from world_core.journal._blobs import BlobRef, session_blobs
from world_core.journal._journal import canonical_json, session_log_id
from world_core.journal._session import session_chain
from world_core.spi import Event, NewEvent, World, validate_id

__all__ = [
    "HISTORY_FORMAT",
    "SessionHistory",
    "dump_history",
    "history_document",
    "load_history_file",
    "parse_history",
    "read_history",
    "write_history",
]

HISTORY_FORMAT = "world-history/1"
"""The ``format`` of the documents this module writes and reads."""

_DIGEST = re.compile(r"[0-9a-f]{64}")
_BATCH_EVENTS = 200
_BATCH_BYTES = 4 * 1024 * 1024  # per append, well under MAX_PAYLOAD_BYTES


@dataclass(frozen=True)
class SessionHistory:
    """One session's log as it was read (or exported): its events, the blobs they name, the
    log's status, and where it came from (a file name, or the World) for reports."""

    session_id: str
    events: tuple[Event, ...]
    blobs: Mapping[str, bytes] = field(default_factory=dict)
    status: str | None = None
    source: str = ""
    log_id: str | None = None
    """The log, when it is not the session's first (a generation it was continued in)."""


def _blob_refs(value: Any, top: bool = True) -> Iterable[tuple[BlobRef, bool]]:
    """The blob references in an event body: ``(ref, required)``. A ``blob`` entry at the top
    of the body is the journal's own (required); one nested deeper is included if present (a
    tool result may quote a journal event)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if (
                key == "blob"
                and isinstance(item, dict)
                and isinstance(item.get("digest"), str)
                and _DIGEST.fullmatch(item["digest"])
                and type(item.get("size")) is int
            ):
                yield BlobRef(digest=item["digest"], size=item["size"]), top
            else:
                yield from _blob_refs(item, False)
    elif isinstance(value, list):
        for item in value:
            yield from _blob_refs(item, False)


def _body(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


async def read_histories(world: World, session_id: str) -> list[SessionHistory]:
    """Every log of session ``session_id``, oldest first: its first and each it was continued
    in (see :mod:`world_core.journal._continue`), with the blobs they name."""
    chain = await session_chain(world, session_id)
    return [
        await read_history(world, session_id, log_id=None if index == 0 else log_id)
        for index, log_id in enumerate(chain)
    ]


async def read_history(
    world: World, session_id: str, *, log_id: str | None = None
) -> SessionHistory:
    """Read session ``session_id``'s log (its first, or ``log_id``: one it was continued in)
    and every blob it names from ``world``.

    Raises:
        NotFoundError: the session has no events, or an event names a blob the World does not
            hold (complete and intact).
        InvalidIdentifierError: a bad session id.
    """
    session_log_id(session_id)
    source_log = log_id if log_id is not None else session_log_id(session_id)
    events = await world.log.read(source_log)
    if not events:
        raise NotFoundError(
            f"session {session_id!r} has no events in namespace {world.namespace!r} of the "
            f"{world.name!r} World"
        )
    info = await world.log.info(source_log)
    store = session_blobs(world, session_id)
    blobs: dict[str, bytes] = {}
    for event in events:
        for ref, required in _blob_refs(_body(event.data)):
            if ref.digest in blobs:
                continue
            try:
                blobs[ref.digest] = await store.get(ref)
            except NotFoundError as exc:
                if required:
                    raise NotFoundError(
                        f"session {session_id!r}: event {event.seq} ({event.key}) names blob "
                        f"{ref.digest}, which the World does not hold: {exc}"
                    ) from exc
    return SessionHistory(
        session_id=session_id,
        events=tuple(events),
        blobs=blobs,
        status=info.status if info is not None else None,
        source=f"{world.name} World, namespace {world.namespace}",
        log_id=log_id,
    )


def _encode(data: bytes) -> tuple[str, Any]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64", base64.b64encode(data).decode("ascii")
    try:
        value = json.loads(text)
        if canonical_json(value) == data:
            return "json", value
    except ValueError:  # not JSON, or JSON canonical_json refuses (NaN): kept as text
        pass
    return "utf-8", text


def _decode(encoding: object, data: object, where: str) -> bytes:
    if encoding == "json":
        try:
            return canonical_json(data)
        except ValueError as exc:
            raise InvalidArgumentError(f"{where}: data is not canonical JSON: {exc}") from None
    if encoding == "utf-8" and isinstance(data, str):
        try:
            return data.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgumentError(f"{where}: data is not valid UTF-8 text") from None
    if encoding == "base64" and isinstance(data, str):
        try:
            return base64.b64decode(data, validate=True)
        except binascii.Error as exc:
            raise InvalidArgumentError(f"{where}: data is not base64: {exc}") from None
    raise InvalidArgumentError(
        f"{where}: encoding must be 'json', 'utf-8' or 'base64' (with a str for the last two), "
        f"got {encoding!r}"
    )


def history_document(histories: Iterable[SessionHistory]) -> dict[str, Any]:
    """The ``world-history/1`` document of ``histories`` (see the module docstring)."""
    sessions: list[dict[str, Any]] = []
    for history in histories:
        events: list[dict[str, Any]] = []
        for event in history.events:
            encoding, data = _encode(event.data)
            events.append({"seq": event.seq, "key": event.key, "encoding": encoding, "data": data})
        blobs = {
            digest: base64.b64encode(history.blobs[digest]).decode("ascii")
            for digest in sorted(history.blobs)
        }
        entry: dict[str, Any] = {
            "session_id": history.session_id,
            "status": history.status,
            "events": events,
            "blobs": blobs,
        }
        if history.log_id is not None:
            entry["log_id"] = history.log_id
        sessions.append(entry)
    return {"format": HISTORY_FORMAT, "sessions": sessions}


def dump_history(histories: Iterable[SessionHistory]) -> str:
    """The document of ``histories`` as JSON text (indented; non-ASCII text as is, unless the
    document holds text UTF-8 cannot carry, then escaped throughout)."""
    document = history_document(histories)
    text = json.dumps(document, indent=1, ensure_ascii=False, allow_nan=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate in some JSON string: escape everything
        text = json.dumps(document, indent=1, ensure_ascii=True, allow_nan=False)
    return text + "\n"


def _field(mapping: Mapping[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    if name not in mapping:
        raise InvalidArgumentError(f"{where}: {name!r} is missing")
    value = mapping[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InvalidArgumentError(f"{where}: {name!r} has the wrong type ({type(value).__name__})")
    return value


def parse_history(document: object, source: str = "document") -> list[SessionHistory]:
    """The sessions of a ``world-history/1`` document (parsed JSON), checked: the format,
    every event (strictly increasing ``seq``, its encoding), every blob against its digest,
    and that every blob an event names is there.

    Raises:
        InvalidArgumentError: anything else, naming ``source`` and the place in it.
    """
    if not isinstance(document, dict):
        raise InvalidArgumentError(f"{source}: not a world history (a JSON object is expected)")
    found = document.get("format")
    if found != HISTORY_FORMAT:
        raise InvalidArgumentError(
            f"{source}: format {found!r} is not {HISTORY_FORMAT!r}; export it again with "
            "'world export' of this version"
        )
    sessions = _field(document, "sessions", list, source)
    histories: list[SessionHistory] = []
    for index, session in enumerate(sessions):
        where = f"{source}: sessions[{index}]"
        if not isinstance(session, dict):
            raise InvalidArgumentError(f"{where}: not an object")
        session_id = _field(session, "session_id", str, where)
        validate_id(session_id, f"{where}: session_id")
        session_log_id(session_id)
        where = f"{source}: session {session_id!r}"
        log_id = session.get("log_id")
        if log_id is not None:
            validate_id(log_id, f"{where}: log_id")
        status = session.get("status")
        if status is not None and not isinstance(status, str):
            raise InvalidArgumentError(f"{where}: 'status' must be a str or null")
        blobs: dict[str, bytes] = {}
        for digest, encoded in _field(session, "blobs", dict, where).items():
            if not _DIGEST.fullmatch(digest) or not isinstance(encoded, str):
                raise InvalidArgumentError(f"{where}: blob {digest!r:.80} is not digest: base64")
            data = _decode("base64", encoded, f"{where}: blob {digest}")
            if hashlib.sha256(data).hexdigest() != digest:
                raise InvalidArgumentError(
                    f"{where}: blob {digest} does not match its digest (the file was altered)"
                )
            blobs[digest] = data
        events: list[Event] = []
        for position, item in enumerate(_field(session, "events", list, where)):
            at = f"{where}: events[{position}]"
            if not isinstance(item, dict):
                raise InvalidArgumentError(f"{at}: not an object")
            seq = _field(item, "seq", int, at)
            if seq < 1 or (events and seq <= events[-1].seq):
                raise InvalidArgumentError(f"{at}: seq {seq} does not follow the one before")
            key = item.get("key")
            if key is not None:
                validate_id(key, f"{at}: key")
            data = _decode(item.get("encoding"), item.get("data"), at)
            for ref, required in _blob_refs(_body(data)):
                if required and ref.digest not in blobs:
                    raise InvalidArgumentError(
                        f"{at} (seq {seq}) names blob {ref.digest}, which is not in the file"
                    )
            events.append(Event(seq=seq, key=key, data=data))
        if not events:
            raise InvalidArgumentError(f"{where}: no events")
        histories.append(
            SessionHistory(
                session_id=session_id,
                events=tuple(events),
                blobs=blobs,
                status=status,
                source=source,
                log_id=log_id,
            )
        )
    return histories


def load_history_file(path: str | Path) -> list[SessionHistory]:
    """The sessions of the ``world-history/1`` file at ``path`` (see :func:`parse_history`).

    Raises:
        InvalidArgumentError: the file cannot be read, is not JSON, or not a valid history.
    """
    shown = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"{shown}: cannot be read: {exc}") from None
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise InvalidArgumentError(f"{shown}: not JSON: {exc}") from None
    return parse_history(document, shown)


async def write_history(world: World, history: SessionHistory) -> None:
    """Import ``history`` into ``world``: store its blobs, then append its events in order,
    with their keys (and the log's status), into the session's log, which must be empty.

    Raises:
        InvalidArgumentError: the session's log in ``world`` is not empty.
    """
    log_id = history.log_id if history.log_id is not None else session_log_id(history.session_id)
    tail = await world.log.tail(log_id)
    if tail:
        raise InvalidArgumentError(
            f"session {history.session_id!r} already has {tail} events in namespace "
            f"{world.namespace!r}: import a history into an empty session only"
        )
    store = session_blobs(world, history.session_id)
    for digest in sorted(history.blobs):
        await store.put(history.blobs[digest])
    batches: list[list[NewEvent]] = [[]]
    size = 0
    limit = min(_BATCH_BYTES, world.capabilities.max_payload_bytes)
    for event in history.events:
        batch = batches[-1]
        if batch and (len(batch) >= _BATCH_EVENTS or size + len(event.data) > limit):
            batches.append([])
            size = 0
        batches[-1].append(NewEvent(data=event.data, key=event.key))
        size += len(event.data)
    for index, batch in enumerate(batches):
        if not batch:
            continue
        last = index == len(batches) - 1
        tail = await world.log.append(
            log_id, batch, expect_tail=tail, status=history.status if last else None
        )
