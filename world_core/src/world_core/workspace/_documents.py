"""Documents: typed JSON (pydantic models) that belong to a session, versioned, kept in its log.

A to-do list, a plan, a form the agent fills in: state of the session that is not the
conversation. Tools edit documents through ``context.docs``, apps through :class:`Documents`,
and every edit is committed in the session log, so documents survive crashes and move with
the session.

Versions and conflicts (no lost update)
    Every document has a version: 0 before its first write, then 1, 2, 3 ... Version ``k`` of
    document ``name`` is the session-log event keyed ``doc/<name>/v/<k>``. Keys are unique in
    a log, so two edits made from the same version cannot both commit: the second is refused
    whole (a compare-and-set per document, not per session), and is never silently
    overwritten or overwriting.

    * A tool sees the latest committed version when it reads the document (not the turn's
      opening snapshot), and every later read in the same call sees that same version (plus
      the call's own edits). Its edits are claimed (``ToolContext.claim``) on the version it
      read and committed in the same atomic append as its outcome, only if the tool returned.
      A ``put`` without a read in the same call is a blind write: it is based on the version
      current when the outcome is written.
    * A conflict (another writer saved the next version first: the app, or another turn's
      tool) refuses the whole append. A ``safe`` tool is run again, reading the new version,
      up to ``MAX_CONFLICT_RUNS`` (3) runs; then its outcome is an error naming the document.
      A ``never`` tool is never run again: its outcome is recorded as an error saying it ran
      but its edits were not saved, and why, so the model reads the document again.
    * Apps: ``put(..., expected_version=v)`` saves only if the document is still at ``v``
      (else :class:`~world_core.errors.DocumentConflictError`, nothing written);
      ``update(..., fn)`` reads, applies ``fn`` and saves conditionally, retrying on conflict.
      ``put`` without ``expected_version`` overwrites whatever version is current.
      App writes append with ``expect_tail`` on the session log as well (they retry when the
      log moved meanwhile), so a session continued in a new log (continue-as-new) meanwhile
      is noticed; tool edits need only their key (a session is never continued while a turn
      is open), so they never wait for unrelated appends.
    * Why a key per version rather than ``expect_tail`` for tool edits: ``expect_tail`` on the
      session log would make every signal, input or app edit of any document landing while a
      tool runs a conflict of that tool (a re-run, or a ``never`` tool's edit refused), and
      would serialise a turn's commits with every other writer of the session. The key
      conflicts only with an edit of the same document from the same version.

Reads cost the same whatever the session's length
    Each document has a head log (``dochead/<sha-256 of the session id>/<name>``) whose event
    ``k`` is a copy of version ``k``'s record: a read is its tail, one read of at most
    ``MAX_DELTAS + 1`` events, and one keyed ``get`` of the next version in the session log
    (plus the blob of a large base). The head log is derived data: whoever finds it behind
    (a tool's edit is committed in the session log only; the head follows on the next read,
    app or tool) copies the missing versions over, so it is always repaired, never trusted
    blindly. A version written in a generation the session has since continued from is found
    too, at one keyed ``get`` per generation since the head log's last version. Head logs
    live under ``dochead/<digest>/`` (the session's ``session_digest``): ``delete_session``
    deletes them with the session (``dochead`` is one of its ``SESSION_LOG_KINDS``).
    ``tests/test_documents.py`` counts the World calls of a read at 10 and 10,000 events.

Large values and small edits
    A version is stored as a base (the whole value) or as a delta against the version before
    it (JSON-Patch-style operations: ``set``, ``remove``, ``splice`` of a list). A base larger
    than the blob threshold (64 KiB) goes to a content-addressed blob and the record keeps
    its digest. A new base is written when the deltas since the last one would pass
    ``MAX_DELTAS`` (16) or their bytes the value's own size (at least 4 KiB), or when the
    schema version changes: a read applies at most 16 deltas, and a small edit of a large
    document appends a few hundred bytes, not the document.

Schema versions
    A model declares ``schema_version: ClassVar[int]`` (1 when absent) and, from version 2,
    a pure ``migrate(value, from_version) -> value`` (a classmethod or staticmethod taking and
    returning JSON) that brings an older stored value to the current schema. Reads migrate;
    the next write stores the migrated value as a new base with the new schema version. A
    value stored with a newer schema than the model's is refused with
    :class:`~world_core.errors.DocumentSchemaError` naming the document and both versions,
    on reads and on writes (old code never overwrites newer data).

Watching
    ``async for version, value in docs.watch(session, name, Model, after_version=v)`` yields
    every version after ``v`` in order, then each new one as it commits (woken by the session
    log's own notification). Resume after a disconnect with the last version seen. It runs
    until the caller stops (break, or cancel it with a deadline such as
    ``anyio.move_on_after``) or, with ``idle_timeout``, until no new version came for that
    long.

Limits: a document name is at most 128 UTF-8 bytes without ``/``. Documents written by the
first form of this module (``state`` events named ``doc/<name>``) are not read.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import math
import random
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.from_thread
from pydantic import BaseModel, ValidationError

from world_core.errors import (
    ConflictError,
    DocumentConflictError,
    DocumentSchemaError,
    DuplicateKeyError,
    InvalidArgumentError,
)
from world_core.journal import (
    DEFAULT_BLOB_THRESHOLD,
    BlobRef,
    Blobs,
    ToolContext,
    canonical_json,
    session_blobs,
    session_chain,
    session_log_id,
)
from world_core.spi import NewEvent, World, validate_id

__all__ = [
    "MAX_DELTAS",
    "DocumentEdits",
    "Documents",
    "check_document_name",
    "document_key",
    "head_log_id",
    "schema_version",
]

M = TypeVar("M", bound=BaseModel)

MAX_DELTAS = 16
"""The most deltas a version is stored behind its base: a read applies at most this many."""

_MIN_DELTA_BUDGET = 4096  # deltas of a small document may add up to this before a new base
_PUT_ATTEMPTS = 50  # an app write retries while the session log moves under it
_UPDATE_ATTEMPTS = 10


class _Writing:
    """A lock with the task holding it and the count of tasks holding or waiting for it
    (dropped at zero)."""

    __slots__ = ("holder", "lock", "users")

    def __init__(self) -> None:
        self.lock = anyio.Lock()
        self.holder: int | None = None
        self.users = 0


_writing: weakref.WeakKeyDictionary[World, dict[str, _Writing]] = weakref.WeakKeyDictionary()
"""Per World, the sessions an app of this process is writing documents to right now."""


@contextlib.asynccontextmanager
async def session_writes(world: World, session_id: str) -> AsyncIterator[None]:
    """One app write at a time per session in this process.

    Every document write of a session appends to the session's one log, so two writers of a
    process gain nothing by racing: the loser only reads and tries again. Racing, eight
    writers adding to one document ten times each made an :meth:`Documents.update` give up
    after its tries now and then, however it backed off; queued here, a writer of this
    process never conflicts with another. Writers of other processes still race, and
    :meth:`Documents.update` retries them.

    A writer that reads, then saves what it made of the read (``Documents.update``, the
    workspace's ``write``), holds its turn across both. The task holding the turn may enter
    again (its ``put`` inside): it is not queued behind itself.
    """
    sessions = _writing.setdefault(world, {})
    writing = sessions.get(session_id)
    task = anyio.get_current_task().id
    if writing is not None and writing.holder == task:
        yield
        return
    if writing is None:
        writing = sessions[session_id] = _Writing()
    writing.users += 1
    try:
        async with writing.lock:
            writing.holder = task
            try:
                yield
            finally:
                writing.holder = None
    finally:
        writing.users -= 1
        if not writing.users:
            del sessions[session_id]


def check_document_name(name: str) -> str:
    """A document name: a valid identifier without ``/``, at most 128 UTF-8 bytes.

    Raises:
        InvalidArgumentError: anything else.
    """
    validate_id(name, "document name")
    if "/" in name or len(name.encode("utf-8")) > 128:
        raise InvalidArgumentError(
            f"document name {name!r} must not contain '/' and must be at most 128 bytes"
        )
    return name


def document_key(name: str, version: int) -> str:
    """The session-log key of version ``version`` of document ``name``."""
    return f"doc/{name}/v/{version}"


def head_log_id(session_id: str, name: str) -> str:
    """The head log of document ``name`` of ``session_id`` (its event ``k`` is version ``k``)."""
    digest = hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"dochead/{digest}/{name}"


def schema_version(model: type[BaseModel]) -> int:
    """The schema version ``model`` declares (``schema_version: ClassVar[int]``, 1 if none).

    Raises:
        InvalidArgumentError: it is not an int >= 1.
    """
    version = getattr(model, "schema_version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InvalidArgumentError(
            f"{model.__name__}.schema_version must be an int >= 1 (a ClassVar), got {version!r}"
        )
    return version


def _check_model(model: object) -> type[BaseModel]:
    if not isinstance(model, type) or not issubclass(model, BaseModel):
        raise InvalidArgumentError(f"model must be a pydantic model class, got {model!r:.80}")
    return model


def _dump(value: BaseModel) -> Any:
    if not isinstance(value, BaseModel):
        raise InvalidArgumentError(
            f"a document is a pydantic model instance, got {type(value).__name__}"
        )
    raw = value.model_dump(mode="json")
    try:
        canonical_json(raw)
    except ValueError as exc:  # NaN or infinity: JSON has no form for them
        raise InvalidArgumentError(
            f"a {type(value).__name__} document is not JSON: {exc}; nothing was written"
        ) from None
    return raw


def _check_version(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"{what} must be an int >= 0, got {value!r}")
    return value


# -- deltas ------------------------------------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    """JSON equality (``1`` and ``True``, ``1`` and ``1.0``, ``0.0`` and ``-0.0`` differ)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return bool(a.hex() == b.hex())  # == says -0.0 == 0.0, but their JSON differs
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def diff(old: Any, new: Any, path: tuple[str | int, ...] = ()) -> list[dict[str, Any]]:
    """Operations that turn JSON value ``old`` into ``new`` (see :func:`patch`)."""
    if isinstance(old, dict) and isinstance(new, dict):
        ops: list[dict[str, Any]] = [
            {"op": "remove", "path": [*path, key]} for key in old if key not in new
        ]
        for key, value in new.items():
            if key not in old:
                ops.append({"op": "set", "path": [*path, key], "value": value})
            elif not _same(old[key], value):
                ops.extend(diff(old[key], value, (*path, key)))
        return ops
    if isinstance(old, list) and isinstance(new, list):
        start, shortest = 0, min(len(old), len(new))
        while start < shortest and _same(old[start], new[start]):
            start += 1
        end = 0
        while end < shortest - start and _same(old[-1 - end], new[-1 - end]):
            end += 1
        removed, inserted = old[start : len(old) - end], new[start : len(new) - end]
        if not removed and not inserted:
            return []
        if (
            len(removed) == len(inserted) == 1
            and isinstance(removed[0], dict | list)
            and type(removed[0]) is type(inserted[0])
        ):
            return diff(removed[0], inserted[0], (*path, start))
        return [
            {"op": "splice", "path": list(path), "at": start, "remove": len(removed),
             "insert": inserted}
        ]  # fmt: skip
    if _same(old, new):
        return []
    return [{"op": "set", "path": list(path), "value": new}]


def patch(value: Any, ops: list[dict[str, Any]]) -> Any:
    """Apply :func:`diff` operations to ``value`` (changed in place where it can be); returns
    the new value. ``set`` replaces or adds the member at ``path`` (the whole value for an
    empty path), ``remove`` drops it, ``splice`` replaces ``remove`` items of the list at
    ``path`` from index ``at`` with ``insert``."""
    for op in ops:
        path = op["path"]
        kind = op["op"]
        if kind == "splice":
            target = value
            for step in path:
                target = target[step]
            at = int(op["at"])
            target[at : at + int(op["remove"])] = copy.deepcopy(op["insert"])
            continue
        if not path:
            value = copy.deepcopy(op["value"]) if kind == "set" else None
            continue
        parent = value
        for step in path[:-1]:
            parent = parent[step]
        if kind == "set":
            parent[path[-1]] = copy.deepcopy(op["value"])
        else:
            del parent[path[-1]]
    return value


# -- heads -------------------------------------------------------------------------------------


@dataclass
class _Head:
    """A document as read: its version and raw (stored-schema) value, and what a writer of
    the next version needs to choose between a delta and a new base."""

    name: str
    version: int = 0
    raw: Any = None
    schema: int = 0
    base: int = 0
    size: int = 0
    delta_bytes: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)


async def _load_base(blobs: Blobs, record: dict[str, Any]) -> Any:
    if "blob" in record:
        return json.loads(await blobs.get(BlobRef.model_validate(record["blob"])))
    return copy.deepcopy(record.get("value"))


async def _assemble(blobs: Blobs, name: str, records: list[dict[str, Any]]) -> _Head:
    """The head given the records from its base to its version, in order."""
    if not records:
        return _Head(name)
    last = records[-1]
    base = int(last["base"])
    chain = [r for r in records if int(r["version"]) >= base]
    if not chain or int(chain[0]["version"]) != base:
        raise AssertionError(f"document {name!r}: base {base} missing from its head records")
    raw = await _load_base(blobs, chain[0])
    for record in chain[1:]:
        raw = patch(raw, record["patch"])
    return _Head(
        name,
        version=int(last["version"]),
        raw=raw,
        schema=int(last["schema"]),
        base=base,
        size=int(last["size"]),
        delta_bytes=int(last.get("delta_bytes", 0)),
        records=chain,
    )


async def _find_next(
    world: World, logs: list[str], name: str, version: int
) -> tuple[str, dict[str, Any]] | None:
    for log_id in logs:
        event = await world.log.get(log_id, document_key(name, version))
        if event is not None:
            return log_id, json.loads(event.data)
    return None


async def _head_records(
    world: World, session_id: str, name: str, *, after: int | None = None
) -> list[dict[str, Any]]:
    """The head log's records from the latest version's base (or from version ``after + 1``
    when given) to the latest version, after copying over the versions the session log has
    and the head log lacks."""
    head_log = head_log_id(session_id, name)
    tail = await world.log.tail(head_log)
    start = max(0, tail - MAX_DELTAS - 1) if after is None else min(after, tail)
    records = (
        [json.loads(e.data) for e in await world.log.read(head_log, after=start)] if tail else []
    )
    chain = await session_chain(world, session_id)
    logs = list(chain)
    if records and records[-1].get("log") in logs:
        logs = logs[logs.index(records[-1]["log"]) :]
    version = int(records[-1]["version"]) if records else tail  # the read may pass tail
    while (found := await _find_next(world, logs, name, version + 1)) is not None:
        log_id, record = found
        record["log"] = log_id
        with contextlib.suppress(ConflictError):  # another reader copied it first: the same
            await world.log.append(
                head_log, [NewEvent(data=canonical_json(record))], expect_tail=version
            )
        records.append(record)
        version += 1
        logs = logs[logs.index(log_id) :]
    if records and after is None:
        base = int(records[-1]["base"])
        if int(records[0]["version"]) > base:  # a long repair: read from the base
            records = [json.loads(e.data) for e in await world.log.read(head_log, after=base - 1)]
    return records


async def _read_head(world: World, blobs: Blobs, session_id: str, name: str) -> _Head:
    return await _assemble(blobs, name, await _head_records(world, session_id, name))


def _schema_error(message: str, head: _Head, current: int) -> DocumentSchemaError:
    return DocumentSchemaError(message, document=head.name, stored=head.schema, current=current)


def _to_model(model: type[M], head: _Head, session_id: str) -> M | None:
    if head.version == 0:
        return None
    current = schema_version(model)
    raw = head.raw
    if head.schema > current:
        raise _schema_error(
            f"document {head.name!r} of session {session_id!r} (version {head.version}) is "
            f"stored with schema version {head.schema}, newer than {model.__name__}'s "
            f"schema_version {current}: read it with the newer code (deploy it first)",
            head,
            current,
        )
    if head.schema < current:
        migrate = getattr(model, "migrate", None)
        if migrate is None:
            raise _schema_error(
                f"document {head.name!r} of session {session_id!r} is stored with schema "
                f"version {head.schema}, {model.__name__} is at {current} and has no "
                "migrate(value, from_version): add one",
                head,
                current,
            )
        try:
            raw = migrate(copy.deepcopy(raw), head.schema)
        except Exception as exc:
            raise _schema_error(
                f"document {head.name!r} of session {session_id!r}: {model.__name__}.migrate"
                f"(value, from_version={head.schema}) raised {type(exc).__name__}: {exc}",
                head,
                current,
            ) from exc
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        if head.schema < current:
            why = f"{model.__name__}.migrate(value, from_version={head.schema}) returned"
            fix = "fix migrate"
        else:
            why = "it holds"
            fix = (
                f"if {model.__name__} changed, raise its schema_version (now {current}) and "
                "give it a migrate(value, from_version) that converts the stored value"
            )
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the value"
        raise _schema_error(
            f"document {head.name!r} of session {session_id!r} (version {head.version}, "
            f"schema version {head.schema}) does not fit {model.__name__}: {why} a value "
            f"with {exc.error_count()} error(s), first at {where}: {first['msg']}; {fix}",
            head,
            current,
        ) from exc


def _check_writable(head: _Head, schema: int, model: str, session_id: str) -> None:
    """Refuse to write over a version stored with a newer schema (old code, new data)."""
    if head.schema > schema:
        raise _schema_error(
            f"document {head.name!r} of session {session_id!r} (version {head.version}) is "
            f"stored with schema version {head.schema}, newer than {model}'s schema_version "
            f"{schema}: this code must not overwrite it (deploy the newer code); nothing was "
            "written",
            head,
            schema,
        )


async def _record(
    blobs: Blobs, head: _Head, raw: Any, schema: int, by: str, threshold: int
) -> dict[str, Any]:
    """Version ``head.version + 1`` holding ``raw``: a delta against ``head`` when that is
    small, else a new base (as a blob when larger than ``threshold``)."""
    version = head.version + 1
    encoded = canonical_json(raw)
    size = len(encoded)
    record: dict[str, Any] = {
        "t": "document",
        "name": head.name,
        "version": version,
        "schema": schema,
        "size": size,
        "by": by,
    }
    if head.version > 0 and head.schema == schema and version - head.base <= MAX_DELTAS:
        ops = diff(head.raw, raw)
        delta = len(canonical_json(ops))
        budget = max(size, _MIN_DELTA_BUDGET)
        if delta <= threshold and 2 * delta < max(size, 64) and head.delta_bytes + delta <= budget:
            record.update(base=head.base, delta_bytes=head.delta_bytes + delta, patch=ops)
            return record
    record.update(base=version, delta_bytes=0)
    if size > threshold:
        record["blob"] = (await blobs.put(encoded)).model_dump()
    else:
        record["value"] = raw
    return record


# -- tools -------------------------------------------------------------------------------------


class DocumentEdits:
    """A tool's view of the session's documents (``context.docs``).

    The first read of a document in a call reads its latest committed version; later reads
    in the call see that version plus the call's own edits (repeatable reads). Edits are
    staged and committed with the call's outcome, conditional on the version read: see the
    module docstring for what a conflict does to ``safe`` and ``never`` tools.
    """

    def __init__(self, context: ToolContext) -> None:
        self._context = context
        self._read: dict[str, _Head] = {}
        self._edits: dict[str, tuple[Any, int, str]] = {}
        self._hooked = False

    async def read(self, name: str, model: type[M]) -> M | None:
        """The document as ``model`` (the latest committed version, or this call's own
        edit), or None if it was never written. Use this in async tools.

        Raises:
            InvalidArgumentError: a bad name or model.
            DocumentSchemaError: it is stored with a schema ``model`` cannot read.
        """
        check_document_name(name)
        _check_model(model)
        if name in self._edits:
            return model.model_validate(copy.deepcopy(self._edits[name][0]))
        head = await self._head(name)
        return _to_model(model, head, self._context.session_id)

    async def version(self, name: str) -> int:
        """The version this call read (reading it now if it has not yet): 0 if none."""
        check_document_name(name)
        return (await self._head(name)).version

    def get(self, name: str, model: type[M]) -> M | None:
        """:meth:`read` for sync tools (they run in a worker thread).

        Raises:
            InvalidArgumentError: called in the event loop (an async tool) for a document
                this call has not read yet: use ``await context.docs.read(...)``.
        """
        check_document_name(name)
        _check_model(model)
        try:
            anyio.get_current_task()
        except RuntimeError:  # not in an event loop: a sync tool's worker thread
            return anyio.from_thread.run(self.read, name, model)
        if name in self._edits or name in self._read:
            head = self._read.get(name)
            if name in self._edits:
                return model.model_validate(copy.deepcopy(self._edits[name][0]))
            assert head is not None
            return _to_model(model, head, self._context.session_id)
        raise InvalidArgumentError(
            f"context.docs.get({name!r}) reads the store and cannot run in the event loop: in "
            "an async tool use `await context.docs.read(name, Model)`"
        )

    def put(self, name: str, value: BaseModel) -> None:
        """Stage a new value; committed with this call's outcome, conditional on the version
        this call read (a blind write when it read none).

        Raises:
            InvalidArgumentError: a bad name, or a value that is not a pydantic model or holds
                what JSON cannot (NaN, infinity).
            DocumentSchemaError: the version this call read has a newer schema than
                ``value``'s model.
        """
        check_document_name(name)
        raw = _dump(value)
        schema = schema_version(type(value))
        head = self._read.get(name)
        if head is not None:
            _check_writable(head, schema, type(value).__name__, self._context.session_id)
        self._edits[name] = (raw, schema, type(value).__name__)
        if not self._hooked:
            self._hooked = True
            self._context.before_commit(self._claim)

    async def _head(self, name: str) -> _Head:
        head = self._read.get(name)
        if head is None:
            context = self._context
            head = await _read_head(context.world, context.blobs, context.session_id, name)
            self._read[name] = head
        return head

    async def _claim(self) -> None:
        context = self._context
        by = f"turn/{context.turn_id}/step/{context.step}"
        for name, (raw, schema, model) in self._edits.items():
            head = await self._head(name)
            _check_writable(head, schema, model, context.session_id)
            record = await _record(context.blobs, head, raw, schema, by, DEFAULT_BLOB_THRESHOLD)
            context.claim(
                document_key(name, head.version + 1),
                record,
                conflict=(
                    f"document {name!r} changed after this call read version {head.version} "
                    f"(another edit saved version {head.version + 1} first)"
                ),
            )


ToolContext.extend("docs", DocumentEdits)


# -- apps --------------------------------------------------------------------------------------


class Documents:
    """Read, edit and watch a session's documents from outside a turn (an app, a chat route).

    Args:
        world: the World the sessions live in.
        blob_threshold: values whose canonical JSON is larger are stored as blobs.
    """

    def __init__(self, world: World, *, blob_threshold: int = DEFAULT_BLOB_THRESHOLD) -> None:
        if isinstance(blob_threshold, bool) or not isinstance(blob_threshold, int):
            raise InvalidArgumentError(f"blob_threshold must be an int, got {blob_threshold!r}")
        if not 0 <= blob_threshold <= 1024 * 1024:
            raise InvalidArgumentError(
                f"blob_threshold must be from 0 to 1048576 bytes, got {blob_threshold!r}"
            )
        self._world = world
        self._threshold = blob_threshold

    def _blobs(self, session_id: str) -> Blobs:
        return session_blobs(self._world, session_id)

    async def get(self, session_id: str, name: str, model: type[M]) -> M | None:
        """The document's latest value as ``model``, or None if it was never written.

        Raises:
            InvalidArgumentError: a bad session id, name or model.
            DocumentSchemaError: stored with a schema ``model`` cannot read.
        """
        return (await self.read(session_id, name, model))[1]

    async def read(self, session_id: str, name: str, model: type[M]) -> tuple[int, M | None]:
        """The document's latest version and value (``(0, None)`` if never written): pass
        the version to :meth:`put` as ``expected_version``.

        Raises:
            InvalidArgumentError: a bad session id, name or model.
            DocumentSchemaError: stored with a schema ``model`` cannot read.
        """
        session_log_id(session_id)
        check_document_name(name)
        _check_model(model)
        head = await _read_head(self._world, self._blobs(session_id), session_id, name)
        return head.version, _to_model(model, head, session_id)

    async def version(self, session_id: str, name: str) -> int:
        """The document's latest version (0 if never written)."""
        session_log_id(session_id)
        check_document_name(name)
        records = await _head_records(self._world, session_id, name)
        return int(records[-1]["version"]) if records else 0

    async def put(
        self,
        session_id: str,
        name: str,
        value: BaseModel,
        *,
        expected_version: int | None = None,
    ) -> int:
        """Save a new version; returns its number. Tools that run later see it.

        Args:
            expected_version: save only if the document is still at this version (0: only
                if it was never written); None overwrites whatever version is current.

        Raises:
            InvalidArgumentError: a bad session id, name, value or version (nothing written).
            DocumentConflictError: the document is not at ``expected_version`` (nothing
                written): read it again and decide again.
            DocumentSchemaError: the stored version has a newer schema than ``value``'s
                model (nothing written).
        """
        session_log_id(session_id)
        check_document_name(name)
        raw = _dump(value)
        schema = schema_version(type(value))
        if expected_version is not None:
            _check_version(expected_version, "expected_version")
        async with session_writes(self._world, session_id):
            return await self._put(session_id, name, value, raw, schema, expected_version)

    async def _put(
        self,
        session_id: str,
        name: str,
        value: BaseModel,
        raw: Any,
        schema: int,
        expected_version: int | None,
    ) -> int:
        """:meth:`put` once its arguments are checked, with the session's writes held."""
        world = self._world
        head = _Head(name)
        for attempt in range(_PUT_ATTEMPTS):
            if attempt:  # the session log moved under the last try: back off a little
                await anyio.sleep(random.uniform(0, min(0.2, 0.002 * 2**attempt)))
            log_id = (await session_chain(world, session_id))[-1]
            tail = await world.log.tail(log_id)
            head = await _read_head(world, self._blobs(session_id), session_id, name)
            if expected_version is not None and head.version != expected_version:
                raise self._conflict(session_id, name, expected_version, head.version)
            _check_writable(head, schema, type(value).__name__, session_id)
            record = await _record(
                self._blobs(session_id), head, raw, schema, "app", self._threshold
            )
            event = NewEvent(key=document_key(name, head.version + 1), data=canonical_json(record))
            try:
                await world.log.append(log_id, [event], expect_tail=tail)
            except (ConflictError, DuplicateKeyError):
                continue  # the session moved since we read it: read again
            record["log"] = log_id
            with contextlib.suppress(ConflictError):  # a reader copied it over already
                await world.log.append(
                    head_log_id(session_id, name),
                    [NewEvent(data=canonical_json(record))],
                    expect_tail=head.version,
                )
            return head.version + 1
        raise self._conflict(
            session_id, name, head.version if expected_version is None else expected_version,
            head.version, busy=True,
        )  # fmt: skip

    async def update(
        self,
        session_id: str,
        name: str,
        model: type[M],
        fn: Callable[[M | None], M],
        *,
        attempts: int = _UPDATE_ATTEMPTS,
    ) -> tuple[int, M]:
        """Read the document, compute ``fn(value)`` (value is None if never written) and save
        it if the document did not change meanwhile; on a conflict, read and apply ``fn``
        again (so ``fn`` must depend only on its argument), after a random pause that grows
        with each try (writers that conflicted together would conflict again). Returns the
        saved version and value.

        Raises:
            DocumentConflictError: it still conflicted after ``attempts`` tries.
            InvalidArgumentError: bad arguments, or ``fn`` returned something that is not a
                ``model``.
        """
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise InvalidArgumentError(f"attempts must be an int >= 1, got {attempts!r}")
        last: DocumentConflictError | None = None
        for attempt in range(attempts):
            if attempt:
                # Writers that conflicted read again at once and conflict again together:
                # a random pause, growing with each try, spreads them out.
                await anyio.sleep(random.uniform(0, min(0.5, 0.005 * 2**attempt)))
            async with session_writes(self._world, session_id):
                version, value = await self.read(session_id, name, model)
                new = fn(value)
                if not isinstance(new, model):
                    raise InvalidArgumentError(
                        f"update of {name!r}: fn must return a {model.__name__}, got "
                        f"{type(new).__name__}"
                    )
                try:
                    saved = await self._put(
                        session_id, name, new, _dump(new), schema_version(type(new)), version
                    )
                except DocumentConflictError as exc:
                    last = exc
                    continue
            return saved, new
        assert last is not None
        raise last

    async def watch(
        self,
        session_id: str,
        name: str,
        model: type[M],
        *,
        after_version: int = 0,
        idle_timeout: float | None = None,
    ) -> AsyncGenerator[tuple[int, M | None]]:
        """Yield ``(version, value)`` for every version after ``after_version``, in order,
        then each new one as it commits.

        Resume after a disconnect by passing the last version seen. Stop by leaving the loop
        or cancelling (a deadline: ``with anyio.move_on_after(s): async for ...``); wrap it in
        ``contextlib.aclosing`` to close it at once. With ``idle_timeout`` (seconds), the
        iteration ends when no new version came for that long.

        Raises:
            InvalidArgumentError: bad arguments (before anything is read).
            DocumentSchemaError: a version is stored with a schema ``model`` cannot read.
        """
        session_log_id(session_id)
        check_document_name(name)
        _check_model(model)
        seen = _check_version(after_version, "after_version")
        if idle_timeout is not None and (
            isinstance(idle_timeout, bool)
            or not isinstance(idle_timeout, int | float)
            or not idle_timeout > 0
        ):
            raise InvalidArgumentError(f"idle_timeout must be seconds > 0, got {idle_timeout!r}")
        world = self._world
        prefix = f"doc/{name}/v/"
        while True:
            log_id = (await session_chain(world, session_id))[-1]
            tail = await world.log.tail(log_id)
            records = await _head_records(world, session_id, name, after=seen)
            newer = [r for r in records if int(r["version"]) > seen]
            if newer:
                async for version, head in self._versions(session_id, name, seen, records):
                    seen = version
                    yield version, _to_model(model, head, session_id)
                continue
            changed = False
            with anyio.move_on_after(math.inf if idle_timeout is None else idle_timeout):
                events = world.log.watch(log_id, after=tail)
                try:
                    async for event in events:
                        key = event.key or ""
                        if key.startswith(prefix) or key.startswith("session/"):
                            changed = True  # a new version, or the session continued
                            break
                finally:
                    close = getattr(events, "aclose", None)
                    if close is not None:
                        await close()
            if not changed:
                return

    async def _versions(
        self, session_id: str, name: str, seen: int, records: list[dict[str, Any]]
    ) -> AsyncIterator[tuple[int, _Head]]:
        """Each version after ``seen`` among ``records`` (the head log from ``seen + 1``)."""
        records = [r for r in records if int(r["version"]) > seen]
        base = int(records[0]["base"])
        if base <= seen:
            head_log = head_log_id(session_id, name)
            older = await self._world.log.read(head_log, after=base - 1, limit=seen - base + 1)
            records = [json.loads(e.data) for e in older] + records
        raw: Any = None
        for record in records:
            version = int(record["version"])
            if int(record["base"]) == version:
                raw = await _load_base(self._blobs(session_id), record)
            else:
                raw = patch(raw, record["patch"])
            if version > seen:
                yield (
                    version,
                    _Head(
                        name, version=version, raw=copy.deepcopy(raw), schema=int(record["schema"])
                    ),
                )

    def _conflict(
        self, session_id: str, name: str, expected: int, actual: int, *, busy: bool = False
    ) -> DocumentConflictError:
        why = (
            f"the session log kept moving for {_PUT_ATTEMPTS} attempts; try again"
            if busy
            else f"it is at version {actual}, not {expected}: read it again and decide again"
        )
        return DocumentConflictError(
            f"document {name!r} of session {session_id!r} was not saved: {why}",
            document=name,
            expected=expected,
            actual=actual,
        )
