"""LangGraph on a World: a checkpoint saver, ``durable_tool`` for calls that must not run twice,
and a long-term memory store (:class:`WorldStore`).

Make an existing graph durable::

    async with open_world() as world:
        saver = WorldCheckpointSaver(world)
        graph = builder.compile(checkpointer=saver)
        await graph.ainvoke(inputs, {"configurable": {"thread_id": "order-42"}})

After a crash, ``await graph.ainvoke(None, same_config)`` in any process resumes the thread
from its last checkpoint. What LangGraph's resume gives, and what it does not:

* A super-step whose checkpoint was saved never runs again; a task of an unfinished super-step
  whose writes were saved (``put_writes``) does not run again either.
* A task that was running, or had returned but whose writes were not saved yet, runs again
  from its start: a model call in it is paid again, an email in it is sent again.

:func:`durable_tool` closes that gap with the journal's rules, call by call, inside a task:
the outcome of each call is recorded in the World as soon as it returns, so a task that runs
again reads it back instead of calling again (``replay="safe"``: a model call is not paid
twice). A ``replay="never"`` call also records its intent before it starts: a task that runs
again after an interrupted call does not call again, and gets :class:`PossiblyRanError`
("may or may not have happened") once the call's deadline has passed, so the graph can check
before acting.

Storage (all in the World's log primitive, nothing backend-specific):

* one log per thread, checkpoint namespace and generation:
  ``langgraph/<len>:<thread_id>/<len>:<checkpoint_ns>/<generation>``, holding the checkpoint
  events (key ``c/<checkpoint_id>``: the serialized checkpoint, its metadata and parent).
  Checkpoints of a namespace are in append order, which is checkpoint id order for everything
  LangGraph writes (ids are time-ordered, and LangGraph saves a thread's checkpoints one
  after the other); "latest" and ``list``'s newest-first order are that order. Channel
  values are stored inline in their checkpoint event (one event, one read).
* one log per checkpoint for its pending writes:
  ``langgraph-writes/<len>:<thread_id>/<len>:<checkpoint_ns>/<checkpoint_id>``, keyed
  ``<task_id>/<idx>`` (the special writes of ``WRITES_IDX_MAP``, which a later write
  replaces, are unkeyed and the last one counts). A log of their own because LangGraph
  saves a checkpoint and the writes of the tasks after it concurrently (durability
  ``"async"``, the default): writes may be stored before their checkpoint.
* A checkpoint log counts once its status is ``ready``; readers use the highest ready
  generation.
  ``prune``, ``delete_for_runs`` and ``copy_thread`` write a new generation (marked ready by
  its last append, so a crash half-way leaves the old one in force) and then delete the old
  one. Do not run them on a thread while a graph writes to it: a write landing in the old
  generation meanwhile is deleted with it.
* ``durable_tool`` records: one log per thread, ``langgraph-steps/<len>:<thread_id>``;
  ``delete_thread`` deletes it too.

Reads are bounded: the latest checkpoint is found by reading back from the log's tail in
pages of :data:`PAGE` events, a given checkpoint by its key, its writes by reading its writes
log; ``list`` reads back page by page (one more read per checkpoint, for its writes) and
stops at ``limit``.

Sync and async: the ``a*`` methods run on the event loop the World was opened on. The sync
methods (``get_tuple``, ``list``, ``put`` ... , used by ``graph.invoke``/``graph.stream``)
are meant for other threads: each hands its work to that loop with
``anyio.from_thread.run`` (the loop's token is taken when the saver is made) and waits for it,
so a sync graph may run in a worker thread while the loop serves the World. Called on the
loop's own thread, they would wait for themselves: they raise ``RuntimeError`` instead (use
``ainvoke``/``astream``). A program with no event loop of its own uses
:meth:`WorldCheckpointSaver.blocking`, which opens the World on a loop in a thread of its own.
"""

from __future__ import annotations

import base64
import contextvars
import functools
import inspect
import json
import threading
import time
from collections import OrderedDict
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Sequence,
)
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, ParamSpec, TypeVar, cast

import anyio
import anyio.from_thread
import anyio.lowlevel
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.config import get_config
from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)
from pydantic_core import to_jsonable_python

from world_core._select import open_world
from world_core.errors import (
    DuplicateKeyError,
    InvalidArgumentError,
    NonDeterminismError,
    PossiblyRanError,
    ToolError,
    UnsupportedError,
)
from world_core.journal import CLOCK_MARGIN, DEFAULT_TOOL_TIMEOUT, POSSIBLY_RAN, digest_of
from world_core.spi import MAX_LIST_LIMIT, Event, NewEvent, World, validate_id

__all__ = [
    "PAGE",
    "READY",
    "WorldCheckpointSaver",
    "WorldStore",
    "durable_tool",
]

PAGE = 64
"""Events one read of a checkpoint log returns at most."""

READY = "ready"
"""The status of a checkpoint log generation in force."""

_PREFIX = "langgraph/"
_STEPS_PREFIX = "langgraph-steps/"
_WRITES_PREFIX = "langgraph-writes/"
_BUILDING = "building"
_BATCH_EVENTS = 256
_BATCH_BYTES = 4 * 1024 * 1024
_STRATEGIES = ("keep_latest", "delete")

T = TypeVar("T")
P = ParamSpec("P")


# --------------------------------------------------------------------------------------------
# Sync methods: the work runs on the World's event loop
# --------------------------------------------------------------------------------------------


class _Bridge:
    """Runs coroutines on the event loop current when it was made, from other threads."""

    def __init__(self, owner: str) -> None:
        self._owner = owner
        try:
            self._token = anyio.lowlevel.current_token()
        except RuntimeError as exc:
            raise RuntimeError(
                f"make the {owner} in async code, on the event loop the World was opened on "
                f"(its sync methods hand their work to that loop); code without an event loop "
                f"uses {owner}.blocking()"
            ) from exc
        self._thread = threading.get_ident()

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        if self._thread == threading.get_ident():
            raise RuntimeError(
                f"a sync method of {self._owner} was called on the event loop's own thread, "
                "where it would wait for itself: use the async API (graph.ainvoke / "
                "graph.astream, the a* methods) in async code, wrap an async function with "
                "durable_tool for an async node, or run the sync graph in a worker thread "
                "(anyio.to_thread.run_sync)"
            )
        return anyio.from_thread.run(_coroutine, fn, *args, token=self._token)


# --------------------------------------------------------------------------------------------
# Names of logs
# --------------------------------------------------------------------------------------------


def _thread_prefix(thread_id: str) -> str:
    # The length makes the prefix unambiguous: no other thread's logs start with it.
    return f"{_PREFIX}{len(thread_id)}:{thread_id}/"


def _ns_prefix(thread_id: str, checkpoint_ns: str) -> str:
    return f"{_thread_prefix(thread_id)}{len(checkpoint_ns)}:{checkpoint_ns}/"


def _log_id(thread_id: str, checkpoint_ns: str, generation: int) -> str:
    log_id = f"{_ns_prefix(thread_id, checkpoint_ns)}{generation:08d}"
    return validate_id(log_id, "checkpoint log id (from thread_id and checkpoint_ns)")


def _writes_prefix(thread_id: str, checkpoint_ns: str | None = None) -> str:
    prefix = f"{_WRITES_PREFIX}{len(thread_id)}:{thread_id}/"
    return prefix if checkpoint_ns is None else f"{prefix}{len(checkpoint_ns)}:{checkpoint_ns}/"


def _writes_log(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> str:
    log_id = f"{_writes_prefix(thread_id, checkpoint_ns)}{checkpoint_id}"
    return validate_id(log_id, "writes log id (from thread_id, checkpoint_ns, checkpoint_id)")


def _steps_log(thread_id: str) -> str:
    return validate_id(f"{_STEPS_PREFIX}{len(thread_id)}:{thread_id}", "durable steps log id")


@dataclass(frozen=True)
class _Log:
    """One generation of a (thread, namespace)'s checkpoint log."""

    thread_id: str
    checkpoint_ns: str
    generation: int
    log_id: str
    tail: int
    status: str | None


def _parse(log_id: str, tail: int, status: str | None) -> _Log | None:
    rest = log_id.removeprefix(_PREFIX)
    try:
        size, _, rest = rest.partition(":")
        thread_id, rest = rest[: int(size)], rest[int(size) :]
        size, _, rest = rest.removeprefix("/").partition(":")
        checkpoint_ns, rest = rest[: int(size)], rest[int(size) :]
        generation = int(rest.removeprefix("/"))
    except ValueError:
        return None
    return _Log(thread_id, checkpoint_ns, generation, log_id, tail, status)


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


def _configurable(config: RunnableConfig | None, what: str = "config") -> dict[str, Any]:
    if not isinstance(config, dict) or not isinstance(config.get("configurable"), dict):
        raise InvalidArgumentError(
            f"{what} must be a dict with a 'configurable' dict: "
            "pass {'configurable': {'thread_id': ...}}"
        )
    configurable: dict[str, Any] = config["configurable"]
    return configurable


def _thread_id(config: RunnableConfig, what: str = "config") -> str:
    thread_id = _configurable(config, what).get("thread_id")
    if thread_id is None:
        raise InvalidArgumentError(
            f"{what}['configurable']['thread_id'] is required: pass "
            "{'configurable': {'thread_id': '<your thread>'}}"
        )
    return validate_id(str(thread_id), "thread_id")


def _config(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
        }
    }


# --------------------------------------------------------------------------------------------
# Events
# --------------------------------------------------------------------------------------------


def _typed(value: tuple[str, bytes]) -> list[str]:
    return [value[0], base64.b64encode(value[1]).decode("ascii")]


def _untyped(value: list[str]) -> tuple[str, bytes]:
    return value[0], base64.b64decode(value[1])


def _body(event: Event) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(event.data)
    return body


def _json(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


class _Writes:
    """The writes of one checkpoint, in the order LangGraph applies them."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, int], tuple[int, dict[str, Any]]] = {}

    def add(self, seq: int, body: dict[str, Any]) -> None:
        key = (str(body["task"]), int(body["idx"]))
        held = self._by_key.get(key)
        # A regular write is stored once (the first); a special one is replaced (the last).
        if held is None or (key[1] < 0 and seq > held[0]) or (key[1] >= 0 and seq < held[0]):
            self._by_key[key] = (seq, body)

    def bodies(self) -> list[dict[str, Any]]:
        return sorted(
            (body for _, body in self._by_key.values()),
            key=lambda b: writes_sort_key(str(b.get("path", "")), str(b["task"]), int(b["idx"])),
        )


# --------------------------------------------------------------------------------------------
# The saver
# --------------------------------------------------------------------------------------------


class WorldCheckpointSaver(BaseCheckpointSaver[int]):
    """A LangGraph checkpoint saver storing threads in a World's logs (any backend).

    Implements every method of ``BaseCheckpointSaver``, sync and async: ``get_tuple``,
    ``list``, ``put``, ``put_writes`` and the optional ``delete_thread``, ``copy_thread``,
    ``prune`` and ``delete_for_runs``. How it stores a thread, and how the sync methods reach
    the World from other threads, is in the module docstring.

    Args:
        world: an open World; the saver neither opens nor closes it.
        serde: how checkpoints, metadata and writes are serialized (LangGraph's
            ``JsonPlusSerializer`` by default).

    Raises:
        InvalidArgumentError: ``world`` is not a World.
        RuntimeError: made outside an event loop (use :meth:`blocking` there).
    """

    def __init__(self, world: World, *, serde: SerializerProtocol | None = None) -> None:
        if not isinstance(world, World):
            raise InvalidArgumentError(
                f"world must be an open World (open_world()), got {type(world).__name__}"
            )
        super().__init__(serde=serde)
        self.world = world
        self._bridge = _Bridge(type(self).__name__)

    @classmethod
    @contextmanager
    def blocking(
        cls,
        world: str | None = None,
        *,
        url: str | None = None,
        namespace: str | None = None,
        serde: SerializerProtocol | None = None,
    ) -> Iterator[WorldCheckpointSaver]:
        """A saver for a program with no event loop (``graph.invoke`` from plain code).

        Opens the World (as :func:`world_core.open_world` does, with the same arguments) on an
        event loop in a thread of its own, which every method of the saver then uses; closes
        both on exit::

            with WorldCheckpointSaver.blocking() as saver:
                graph = builder.compile(checkpointer=saver)
                graph.invoke(inputs, {"configurable": {"thread_id": "t1"}})

        Raises:
            ConfigurationError: the World cannot be opened as configured.
        """
        with anyio.from_thread.start_blocking_portal() as portal:
            opened = portal.wrap_async_context_manager(
                open_world(world, url=url, namespace=namespace)
            )
            with opened as the_world:
                # Made on the portal's loop: it takes that loop's token, as in async code.
                yield portal.call(_make_saver, cls, the_world, serde)

    def _sync(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return self._bridge.run(fn, *args)

    # -- finding logs ------------------------------------------------------------------------

    async def _logs(self, prefix: str) -> list[_Log]:
        """Every generation of the logs under ``prefix``, in id order."""
        found: list[_Log] = []
        cursor: str | None = None
        while True:
            page = await self.world.log.list_logs(
                prefix=prefix, cursor=cursor, limit=MAX_LIST_LIMIT
            )
            for info in page.items:
                parsed = _parse(info.log_id, info.tail, info.status)
                if parsed is not None:
                    found.append(parsed)
            cursor = page.next_cursor
            if cursor is None:
                return found

    @staticmethod
    def _current(logs: list[_Log]) -> dict[tuple[str, str], _Log]:
        """The generation in force per (thread, namespace): the highest ready one."""
        current: dict[tuple[str, str], _Log] = {}
        for log in logs:
            key = (log.thread_id, log.checkpoint_ns)
            if log.status == READY and (
                key not in current or log.generation > current[key].generation
            ):
                current[key] = log
        return current

    async def _current_log(self, thread_id: str, checkpoint_ns: str) -> _Log | None:
        logs = await self._logs(_ns_prefix(thread_id, checkpoint_ns))
        return self._current(logs).get((thread_id, checkpoint_ns))

    async def _append(self, thread_id: str, checkpoint_ns: str, events: list[NewEvent]) -> None:
        logs = await self._logs(_ns_prefix(thread_id, checkpoint_ns))
        log = self._current(logs).get((thread_id, checkpoint_ns))
        if log is None:
            # The first write: a generation of its own, above any a crashed copy left behind.
            log_id = _log_id(thread_id, checkpoint_ns, _next_generation(logs))
            await self.world.log.append(log_id, events, status=READY)
        else:
            await self.world.log.append(log.log_id, events)

    # -- reading -----------------------------------------------------------------------------

    async def _back(self, log_id: str, end: int) -> AsyncIterator[Event]:
        """Events of the log from ``end`` back to the first, read a page at a time."""
        while end > 0:
            start = max(0, end - PAGE)
            events = await self.world.log.read(log_id, after=start, limit=end - start)
            for event in reversed(events):
                yield event
            end = start

    async def _forward(self, log_id: str, after: int) -> AsyncIterator[Event]:
        while True:
            events = await self.world.log.read(log_id, after=after, limit=PAGE)
            for event in events:
                yield event
            if len(events) < PAGE:
                return
            after = events[-1].seq

    def _tuple(
        self, log: _Log, body: dict[str, Any], writes: list[dict[str, Any]]
    ) -> CheckpointTuple:
        checkpoint: Checkpoint = self.serde.loads_typed(_untyped(body["checkpoint"]))
        metadata: CheckpointMetadata = self.serde.loads_typed(_untyped(body["metadata"]))
        parent = body.get("parent")
        return CheckpointTuple(
            config=_config(log.thread_id, log.checkpoint_ns, str(body["id"])),
            checkpoint=checkpoint,
            metadata=metadata,
            parent_config=(
                _config(log.thread_id, log.checkpoint_ns, str(parent)) if parent else None
            ),
            pending_writes=[
                (str(w["task"]), str(w["channel"]), self.serde.loads_typed(_untyped(w["value"])))
                for w in writes
            ],
        )

    async def _writes(self, log: _Log, checkpoint_id: str) -> list[dict[str, Any]]:
        """The checkpoint's pending writes, from its writes log."""
        writes = _Writes()
        log_id = _writes_log(log.thread_id, log.checkpoint_ns, checkpoint_id)
        async for event in self._forward(log_id, 0):
            writes.add(event.seq, _body(event))
        return writes.bodies()

    async def _newest_first(self, log: _Log, before: str | None) -> AsyncIterator[CheckpointTuple]:
        """The log's checkpoints, newest first, with their writes; only those before the
        checkpoint ``before`` when given."""
        end = log.tail
        if before is not None:
            found = await self.world.log.get(log.log_id, f"c/{before}")
            if found is not None:
                end = found.seq - 1
        async for event in self._back(log.log_id, end):
            body = _body(event)
            checkpoint_id = str(body["id"])
            if before is not None and checkpoint_id >= before:
                continue
            yield self._tuple(log, body, await self._writes(log, checkpoint_id))

    async def _one(self, log: _Log, checkpoint_id: str) -> CheckpointTuple | None:
        event = await self.world.log.get(log.log_id, f"c/{checkpoint_id}")
        if event is None:
            return None
        return self._tuple(log, _body(event), await self._writes(log, checkpoint_id))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (``checkpoint_id``), else the thread's latest in
        ``checkpoint_ns`` (default ``""``), with its pending writes; None when there is none.

        Raises:
            InvalidArgumentError: no ``thread_id`` in ``config['configurable']``.
        """
        thread_id = _thread_id(config)
        checkpoint_ns = str(_configurable(config).get("checkpoint_ns") or "")
        log = await self._current_log(thread_id, checkpoint_ns)
        if log is None:
            return None
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id:
            return await self._one(log, str(checkpoint_id))
        async for found in self._newest_first(log, None):
            return found
        return None

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints newest first (by checkpoint id within each namespace).

        Args:
            config: a thread (``thread_id``), narrowed to one namespace when it has
                ``checkpoint_ns`` and to one checkpoint when it has ``checkpoint_id``; None
                lists every thread of the World's namespace.
            filter: metadata every result must hold (``{"source": "input", "step": 2}``).
            before: only checkpoints whose id is lower than this config's ``checkpoint_id``.
            limit: at most this many results.

        Raises:
            InvalidArgumentError: a config without ``thread_id``; a ``limit`` below 0.
        """
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise InvalidArgumentError(f"limit must be None or an int >= 0, got {limit!r}")
        if limit is not None and limit < 0:
            raise InvalidArgumentError(f"limit must be None or an int >= 0, got {limit!r}")
        before_id = get_checkpoint_id(before) if before is not None else None
        only_id: str | None = None
        if config is None:
            prefix = _PREFIX
        else:
            thread_id = _thread_id(config)
            configurable = _configurable(config)
            only_id = get_checkpoint_id(config)
            if configurable.get("checkpoint_ns") is not None:
                prefix = _ns_prefix(thread_id, str(configurable["checkpoint_ns"]))
            else:
                prefix = _thread_prefix(thread_id)
        if limit == 0:
            return
        left = limit
        for log in self._current(await self._logs(prefix)).values():
            if only_id is not None:
                found = await self._one(log, str(only_id))
                candidates: AsyncIterator[CheckpointTuple] = _aiter([found] if found else [])
            else:
                candidates = self._newest_first(log, str(before_id) if before_id else None)
            async for found_tuple in candidates:
                if before_id and found_tuple.checkpoint["id"] >= before_id:
                    continue
                if filter and not all(found_tuple.metadata.get(k) == v for k, v in filter.items()):
                    continue
                yield found_tuple
                if left is not None:
                    left -= 1
                    if left == 0:
                        return

    # -- writing -----------------------------------------------------------------------------

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint (one append); its parent is ``config``'s ``checkpoint_id``.

        Returns:
            The stored checkpoint's config (thread, namespace, id).

        Raises:
            InvalidArgumentError: no ``thread_id``.
            PayloadTooLargeError: the serialized checkpoint exceeds the World's payload limit.
        """
        thread_id = _thread_id(config)
        configurable = _configurable(config)
        checkpoint_ns = str(configurable.get("checkpoint_ns") or "")
        checkpoint_id = str(checkpoint["id"])
        body = {
            "t": "c",
            "id": checkpoint_id,
            "parent": configurable.get("checkpoint_id"),
            "checkpoint": _typed(self.serde.dumps_typed(checkpoint)),
            "metadata": _typed(self.serde.dumps_typed(get_checkpoint_metadata(config, metadata))),
        }
        event = NewEvent(data=_json(body), key=validate_id(f"c/{checkpoint_id}", "checkpoint"))
        try:
            await self._append(thread_id, checkpoint_ns, [event])
        except DuplicateKeyError as exc:
            if exc.existing is None or exc.existing.data != event.data:
                raise InvalidArgumentError(
                    f"checkpoint {checkpoint_id} of thread {thread_id!r} is already stored "
                    "with other content: a checkpoint id is written once"
                ) from exc
        return _config(thread_id, checkpoint_ns, checkpoint_id)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes for the checkpoint ``config`` names (one append).

        A regular write stored again (same task, same index) is kept as first stored; a
        special one (``ERROR``, ``INTERRUPT``, ...) replaces the earlier one.

        Raises:
            InvalidArgumentError: no ``thread_id`` or ``checkpoint_id`` in ``config``.
        """
        thread_id = _thread_id(config)
        configurable = _configurable(config)
        checkpoint_ns = str(configurable.get("checkpoint_ns") or "")
        checkpoint_id = get_checkpoint_id(config)
        if not checkpoint_id:
            raise InvalidArgumentError(
                "put_writes needs config['configurable']['checkpoint_id']: the checkpoint the "
                "writes belong to"
            )
        events: list[NewEvent] = []
        for index, (channel, value) in enumerate(writes):
            idx = WRITES_IDX_MAP.get(channel, index)
            body = {
                "task": task_id,
                "idx": idx,
                "channel": channel,
                "path": task_path,
                "value": _typed(self.serde.dumps_typed(value)),
            }
            key = None if idx < 0 else validate_id(f"{task_id}/{idx}", "write key (task_id)")
            events.append(NewEvent(data=_json(body), key=key))
        if not events:
            return
        # A log per checkpoint: LangGraph saves a checkpoint and the writes of the tasks that
        # follow it concurrently (durability "async"), so writes may be stored first.
        log_id = _writes_log(thread_id, checkpoint_ns, str(checkpoint_id))
        try:
            await self.world.log.append(log_id, events)
        except DuplicateKeyError:
            # Stored before (a retry): keep what is stored, add only what is not.
            missing = [
                e
                for e in events
                if e.key is None or await self.world.log.get(log_id, e.key) is None
            ]
            if missing:
                await self.world.log.append(log_id, missing)

    # -- deleting, copying, pruning ---------------------------------------------------------

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint and write of the thread, in every namespace, and the
        records of its ``durable_tool`` calls. A missing thread is a no-op."""
        thread = validate_id(str(thread_id), "thread_id")
        for log in await self._logs(_thread_prefix(thread)):
            await self.world.log.delete(log.log_id)
        for log_id in await self._writes_logs(_writes_prefix(thread)):
            await self.world.log.delete(log_id)
        await self.world.log.delete(_steps_log(thread))

    async def _writes_logs(self, prefix: str) -> list[str]:
        found: list[str] = []
        cursor: str | None = None
        while True:
            page = await self.world.log.list_logs(
                prefix=prefix, cursor=cursor, limit=MAX_LIST_LIMIT
            )
            found.extend(info.log_id for info in page.items)
            cursor = page.next_cursor
            if cursor is None:
                return found

    async def _drop_writes(self, thread_id: str, checkpoint_ns: str, keep: set[str]) -> None:
        """Delete the writes logs of the namespace's checkpoints not in ``keep``."""
        prefix = _writes_prefix(thread_id, checkpoint_ns)
        for log_id in await self._writes_logs(prefix):
            if log_id[len(prefix) :] not in keep:
                await self.world.log.delete(log_id)

    async def _rewrite(self, log: _Log, keep: Callable[[list[Event]], list[Event]]) -> None:
        """Replace the log by a new generation holding the events ``keep`` returns."""
        events = [e async for e in self._forward(log.log_id, 0)]
        kept = keep(events)
        if len(kept) == len(events):
            return
        generation: int | None = None
        if kept:
            logs = await self._logs(_ns_prefix(log.thread_id, log.checkpoint_ns))
            generation = _next_generation(logs)
            await self._write_generation(
                _log_id(log.thread_id, log.checkpoint_ns, generation), kept
            )
        await self._drop(log.thread_id, log.checkpoint_ns, keep=generation)
        # The writes of the checkpoints dropped last: a crash before leaves them unreachable.
        await self._drop_writes(
            log.thread_id, log.checkpoint_ns, {str(_body(e)["id"]) for e in kept}
        )

    async def _write_generation(self, log_id: str, events: list[Event]) -> None:
        """Append ``events`` to a fresh log, marked ready by its last append only."""
        await self.world.log.delete(log_id)  # a copy a crash left half-written
        batches: list[list[NewEvent]] = [[]]
        size = 0
        for event in events:
            if batches[-1] and (
                len(batches[-1]) >= _BATCH_EVENTS or size + len(event.data) > _BATCH_BYTES
            ):
                batches.append([])
                size = 0
            batches[-1].append(NewEvent(data=event.data, key=event.key))
            size += len(event.data)
        for index, batch in enumerate(batches):
            last = index == len(batches) - 1
            await self.world.log.append(log_id, batch, status=READY if last else _BUILDING)

    async def _drop(self, thread_id: str, checkpoint_ns: str, *, keep: int | None) -> None:
        """Delete every generation but ``keep`` (all of them when None)."""
        for log in await self._logs(_ns_prefix(thread_id, checkpoint_ns)):
            if log.generation != keep:
                await self.world.log.delete(log.log_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune the threads' checkpoints: ``"keep_latest"`` keeps the latest checkpoint of
        each namespace and its writes, ``"delete"`` removes every checkpoint.

        Each namespace is rewritten as a new generation, then the old one is deleted (see
        the module docstring: not while a graph writes to the thread). ``keep_latest`` keeps
        no ancestors: do not use it on threads of a graph with ``DeltaChannel`` channels
        (beta), whose values are rebuilt from their ancestors' writes.

        Raises:
            InvalidArgumentError: an unknown ``strategy``.
        """
        if strategy not in _STRATEGIES:
            raise InvalidArgumentError(
                f"strategy must be one of {', '.join(map(repr, _STRATEGIES))}, got {strategy!r}"
            )
        for thread_id in thread_ids:
            thread = validate_id(str(thread_id), "thread_id")
            current = self._current(await self._logs(_thread_prefix(thread)))
            for log in current.values():
                if strategy == "delete":
                    await self._drop(log.thread_id, log.checkpoint_ns, keep=None)
                    await self._drop_writes(log.thread_id, log.checkpoint_ns, set())
                else:
                    await self._rewrite(log, _keep_latest)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints whose metadata ``run_id`` is one of ``run_ids``, and their
        writes, in every thread. Reads every thread of the World's namespace."""
        wanted = {str(r) for r in run_ids}
        if not wanted:
            return
        for log in self._current(await self._logs(_PREFIX)).values():

            def keep(events: list[Event]) -> list[Event]:
                dropped: set[str] = set()
                for event in events:
                    body = _body(event)
                    if body["t"] == "c":
                        metadata = self.serde.loads_typed(_untyped(body["metadata"]))
                        if str(metadata.get("run_id")) in wanted:
                            dropped.add(str(body["id"]))
                return [e for e in events if str(_body(e)["id"]) not in dropped]

            await self._rewrite(log, keep)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of one thread, in every namespace, to another,
        which must have none. A source with nothing copies nothing.

        Raises:
            InvalidArgumentError: the target thread has checkpoints already.
        """
        source = validate_id(str(source_thread_id), "source_thread_id")
        target = validate_id(str(target_thread_id), "target_thread_id")
        if self._current(await self._logs(_thread_prefix(target))):
            raise InvalidArgumentError(
                f"copy_thread copies into a thread without checkpoints, and {target!r} has "
                "some: delete_thread it first, or choose another target"
            )
        for log in self._current(await self._logs(_thread_prefix(source))).values():
            events = [e async for e in self._forward(log.log_id, 0)]
            if not events:
                continue
            # The writes first, each log replaced whole (a crashed copy may have left part of
            # it); the checkpoints last, in force once their last batch is written.
            for event in events:
                checkpoint_id = str(_body(event)["id"])
                source_log = _writes_log(source, log.checkpoint_ns, checkpoint_id)
                writes = [w async for w in self._forward(source_log, 0)]
                target_log = _writes_log(target, log.checkpoint_ns, checkpoint_id)
                await self.world.log.delete(target_log)
                if writes:
                    await self._write_generation(target_log, writes)
            left = await self._logs(_ns_prefix(target, log.checkpoint_ns))
            generation = _next_generation(left)
            await self._write_generation(_log_id(target, log.checkpoint_ns, generation), events)

    # -- the sync API: the same work, on the World's event loop ------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Sync :meth:`aget_tuple` (from a thread other than the World's event loop)."""
        return self._sync(self.aget_tuple, config)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Sync :meth:`alist`: the results are gathered on the World's loop, then yielded."""

        async def gather() -> list[CheckpointTuple]:
            return [t async for t in self.alist(config, filter=filter, before=before, limit=limit)]

        yield from self._sync(gather)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Sync :meth:`aput`."""
        return self._sync(self.aput, config, checkpoint, metadata, new_versions)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Sync :meth:`aput_writes`."""
        self._sync(self.aput_writes, config, writes, task_id, task_path)

    def delete_thread(self, thread_id: str) -> None:
        """Sync :meth:`adelete_thread`."""
        self._sync(self.adelete_thread, thread_id)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Sync :meth:`adelete_for_runs`."""
        self._sync(self.adelete_for_runs, run_ids)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Sync :meth:`acopy_thread`."""
        self._sync(self.acopy_thread, source_thread_id, target_thread_id)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Sync :meth:`aprune`."""
        self._sync(functools.partial(self.aprune, strategy=strategy), thread_ids)


async def _make_saver(
    cls: type[WorldCheckpointSaver], world: World, serde: SerializerProtocol | None
) -> WorldCheckpointSaver:
    return cls(world, serde=serde)


async def _coroutine(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    return await fn(*args)


async def _aiter(items: list[T]) -> AsyncIterator[T]:
    for item in items:
        yield item


def _next_generation(logs: list[_Log]) -> int:
    return max((log.generation for log in logs), default=-1) + 1


def _keep_latest(events: list[Event]) -> list[Event]:
    return events[-1:]


# --------------------------------------------------------------------------------------------
# durable_tool: the journal's rules for calls inside a LangGraph task
# --------------------------------------------------------------------------------------------

Replay = Literal["safe", "never"]

_RUNS_KEPT = 4096
_runs: OrderedDict[int, tuple[object, dict[str, int]]] = OrderedDict()
_runs_lock = threading.Lock()
_calls: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar(
    "world_langgraph_calls", default=None
)


def _counters(configurable: dict[str, Any]) -> dict[str, int]:
    """How often each call was made so far in this run of the task. A run of a task (each
    attempt, each resume) has a runtime object of its own, shared by the threads and
    coroutines the task fans out to (a ToolNode's parallel calls)."""
    runtime = configurable.get("__pregel_runtime")
    if runtime is None:
        counts = _calls.get()
        if counts is None:
            counts = {}
            _calls.set(counts)
        return counts
    with _runs_lock:
        entry = _runs.get(id(runtime))
        if entry is None or entry[0] is not runtime:  # (the id of a runtime gone, reused)
            entry = (runtime, {})
            _runs[id(runtime)] = entry
            if len(_runs) > _RUNS_KEPT:
                _runs.popitem(last=False)
        else:
            _runs.move_to_end(id(runtime))
        return entry[1]


@dataclass(frozen=True)
class _Call:
    thread_id: str
    key: str  # <task's checkpoint_ns>/<name>/...: the call's place, the same in every run


def _place(name: str, identity: str, key: str | None) -> _Call:
    """Where this call is: its thread, its task, and which call of the task it is."""
    try:
        config = get_config()
    except RuntimeError as exc:
        raise RuntimeError(
            f"durable_tool {name!r} was called outside a LangGraph node: call it from a "
            "node (or a tool a node runs) of a graph compiled with a checkpointer"
        ) from exc
    thread_id = _thread_id(config, "the node's config")
    configurable = _configurable(config)
    task = str(configurable.get("checkpoint_ns") or "")
    if key is not None:
        place = f"{task}/{name}/key/{key}"
    else:
        # The call's arguments and how many identical calls came before it in this run of
        # the task: the same in every run, whatever order concurrent calls start in.
        counts = _counters(configurable)
        with _runs_lock:
            n = counts.get(identity, 0)
            counts[identity] = n + 1
        place = f"{task}/{name}/{identity[:32]}/{n}"
    return _Call(thread_id, validate_id(place, "durable call key"))


class _Steps:
    """The records of durable calls in a World (intent, outcome), keyed by their place."""

    def __init__(self, world: World, serde: SerializerProtocol) -> None:
        self.world = world
        self.serde = serde

    async def recorded(self, call: _Call) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        log_id = _steps_log(call.thread_id)
        outcome = await self.world.log.get(log_id, f"{call.key}/outcome")
        if outcome is not None:
            return None, _body(outcome)
        intent = await self.world.log.get(log_id, f"{call.key}/intent")
        return (_body(intent) if intent is not None else None), None

    async def write(self, call: _Call, what: str, body: dict[str, Any]) -> dict[str, Any]:
        """Append the record and return ``body`` itself; when another run wrote it first,
        theirs is returned (another object)."""
        log_id = _steps_log(call.thread_id)
        event = NewEvent(data=_json(body), key=f"{call.key}/{what}")
        with anyio.CancelScope(shield=True):  # a record that must not be lost
            try:
                await self.world.log.append(log_id, [event])
            except DuplicateKeyError as exc:
                if exc.existing is not None:
                    return _body(exc.existing)
                raise
        return body


_OUTCOME_POLL = 0.5
"""Seconds between looks for the outcome of a ``never`` call another run of the task runs."""


def _identity(
    name: str, replay: Replay, args: tuple[Any, ...], kwargs: dict[str, Any], keyed: bool
) -> str:
    """The digest of the call: its tool and its arguments as JSON data (pydantic models,
    LangChain messages, dataclasses included)."""
    try:
        data = to_jsonable_python({"args": list(args), "kwargs": kwargs})
        return digest_of({"name": name, "replay": replay, **data})
    except (TypeError, ValueError) as exc:
        if keyed:
            return digest_of({"name": name, "replay": replay})
        raise InvalidArgumentError(
            f"durable_tool {name!r}: its arguments are not JSON data ({exc}), so a run of the "
            "task again could not tell this call from another: pass key= to name its place"
        ) from exc


def durable_tool(
    fn: Callable[P, T],
    *,
    replay: Replay,
    saver: WorldCheckpointSaver,
    timeout: float = DEFAULT_TOOL_TIMEOUT,
    name: str | None = None,
    key: Callable[P, str] | None = None,
) -> Callable[P, T]:
    """Wrap ``fn`` (sync or async) so each call of it inside a LangGraph task is a journal
    step in ``saver``'s World.

    A call's place is its thread, its task (the task's ``checkpoint_ns``, which LangGraph
    derives from the checkpoint the super-step started from, so a task that runs again after
    a crash has the same one), the tool's name, its arguments and how many identical calls
    came before it in this run of the task. So a run of the task again (a resume, a
    ``RetryPolicy`` attempt) finds each call's records whatever order concurrent calls start
    in (a ``ToolNode`` runs a reply's tool calls in parallel). A call whose arguments differ
    from the run before (code changed, or an input that is not durable itself) is a new
    call: keep what feeds a ``never`` call's arguments durable (checkpointed state, other
    ``durable_tool`` results), or name places with ``key``. The rules, as the journal's:

    * Outcome recorded: return it (or raise the recorded error) without calling ``fn``.
    * ``replay="safe"``: call, then record the outcome at once. A task that runs again after
      a crash reads it back: a finished model call wrapped this way is not paid twice. An
      interrupted call has nothing recorded and runs again.
    * With ``key``: a record found at the call's place for other arguments (the code or
      the task's input changed) raises :class:`~world_core.NonDeterminismError` instead of
      answering for it.
    * ``replay="never"``: record the intent (with its deadline, ``timeout`` seconds on), then
      call, then record the outcome. Found an intent without an outcome (the call was
      interrupted, or another run of the task makes it: two processes resuming one thread),
      or lost the race to write it, do not call: wait until its deadline has passed (plus
      :data:`~world_core.journal.CLOCK_MARGIN`; it may still be running elsewhere), record that it
      may or may not have happened, and raise :class:`~world_core.PossiblyRanError` (its
      message is :data:`~world_core.POSSIBLY_RAN`, for the model); an outcome the other run
      records meanwhile is the answer instead. At most one run of ``fn`` per place, whatever
      crashes. Deadlines are on the local clock: the machines resuming
      a thread must agree on the time within ``CLOCK_MARGIN`` (1 s), as NTP keeps them.

    An exception from a ``never`` call is its recorded outcome (the call happened), and so is
    a result, of any call, that the saver's serializer cannot store: it is
    raised as :class:`~world_core.ToolError` now and on every later run of the task, a
    ``RetryPolicy``'s next attempt included (to try again, make it another call: another
    task, or another ``key``). An async ``never`` call still running at its deadline is
    cancelled and counts as cut off (:class:`~world_core.PossiblyRanError`); a sync one cannot
    be stopped, so give its client a shorter timeout. An exception from a ``safe`` call
    (a model provider's outage) records nothing and propagates: a retry calls again.
    Results are stored with the saver's serializer (LangChain messages, pydantic models and
    JSON values round-trip).

    Args:
        fn: the function; the wrapper has its signature.
        replay: ``"safe"`` or ``"never"``, required.
        saver: the graph's saver; its World keeps the records (per thread;
            ``delete_thread`` deletes them).
        timeout: seconds a ``never`` call may take: an async ``fn`` is cancelled then, and a
            takeover waits that long before answering for an interrupted call.
        name: the step's name (``fn.__name__`` by default): part of the place, so renaming a
            tool is a new place.
        key: names a call's place within its task (``key(*args, **kwargs)``, say a
            ``tool_call_id`` argument) instead of its arguments.

    Raises:
        InvalidArgumentError: a missing or unknown ``replay``, a ``timeout`` that is not a
            positive number, ``saver`` not a WorldCheckpointSaver.
    """
    if replay not in ("safe", "never"):
        raise InvalidArgumentError(f"replay must be 'safe' or 'never', got {replay!r}")
    if not isinstance(saver, WorldCheckpointSaver):
        raise InvalidArgumentError(
            f"saver must be the graph's WorldCheckpointSaver, got {type(saver).__name__}"
        )
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise InvalidArgumentError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    if timeout == float("inf"):
        raise InvalidArgumentError("timeout must be finite: a never call needs a deadline")
    step_name = name or getattr(fn, "__name__", None) or "tool"
    validate_id(step_name, "name")
    steps = _Steps(saver.world, saver.serde)

    async def before(call: _Call, identity: str) -> dict[str, Any] | None:
        """The recorded outcome to answer with, or None: run the call (its intent, for a
        ``never`` call, is durable by then)."""
        intent, outcome = await steps.recorded(call)
        found = outcome if outcome is not None else intent
        if found is not None:
            check(call, identity, found)
        if outcome is not None:
            return outcome
        if intent is not None:
            return await answer_for(call, identity, intent)
        if replay == "never":
            mine = {"deadline": time.time() + float(timeout), "id": identity}
            written = await steps.write(call, "intent", mine)
            if written is not mine:
                # Another run of the task (a second resume of the thread) wrote the intent
                # between our read and our write: it runs the call, this one must not.
                check(call, identity, written)
                return await answer_for(call, identity, written)
        return None

    def check(call: _Call, identity: str, found: dict[str, Any]) -> None:
        if found.get("id", identity) != identity:
            raise NonDeterminismError(
                f"{step_name} at {call.key!r} of thread {call.thread_id!r} is not the call "
                "recorded there (other arguments under the same key=): the task's code or "
                "input changed since the super-step was cut off; give each call a key of its "
                "own, or keep what feeds its arguments durable",
                position=call.key,
                recorded=found.get("id"),
                attempted=identity,
            )

    async def answer_for(call: _Call, identity: str, intent: dict[str, Any]) -> dict[str, Any]:
        """The outcome of a call whose intent another run wrote: never run it again. Answer
        only once it cannot still be running, with its own outcome if it records one by then
        (looked for every :data:`_OUTCOME_POLL` seconds: the other run may be alive)."""
        end = float(intent["deadline"]) + CLOCK_MARGIN
        while (wait := end - time.time()) > 0:
            await anyio.sleep(min(wait, _OUTCOME_POLL))
            _, outcome = await steps.recorded(call)
            if outcome is not None:
                return outcome
        return await steps.write(call, "outcome", {"interrupted": True, "id": identity})

    async def after(call: _Call, body: dict[str, Any]) -> dict[str, Any]:
        return await steps.write(call, "outcome", body)

    def record(value: Any = None, error: Exception | None = None) -> dict[str, Any]:
        if error is not None:
            return {"error": f"{type(error).__name__}: {error}"}
        try:
            return {"value": _typed(saver.serde.dumps_typed(value))}
        except Exception as exc:
            # The call happened and its result cannot be stored: record that it failed, as the
            # journal does for a result JSON cannot hold (raising here left a never call's
            # intent without outcome, answered "may have happened" after its deadline).
            return {"error": f"{step_name} returned a value the saver cannot store: {exc}"}

    def answer(call: _Call, outcome: dict[str, Any]) -> Any:
        if outcome.get("interrupted"):
            raise PossiblyRanError(
                f"{step_name} may or may not have happened: {POSSIBLY_RAN}",
                tool=step_name,
                step=-1,
                error=POSSIBLY_RAN,
                idempotency_key=f"{call.thread_id}/{call.key}",
            )
        if "error" in outcome:
            raise ToolError(
                f"{step_name} failed: {outcome['error']}",
                tool=step_name,
                step=-1,
                error=str(outcome["error"]),
            )
        return saver.serde.loads_typed(_untyped(outcome["value"]))

    if inspect.iscoroutinefunction(fn):
        run_async = cast(Callable[..., Awaitable[Any]], fn)

        @functools.wraps(fn)
        async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            identity = _identity(step_name, replay, args, kwargs, key is not None)
            call = _place(step_name, identity, key(*args, **kwargs) if key else None)
            outcome = await before(call, identity)
            if outcome is None:
                try:
                    if replay == "never":
                        # Shielded: a cancelled task must not cut an effect off half-way.
                        with anyio.CancelScope(shield=True), anyio.fail_after(timeout):
                            value = await run_async(*args, **kwargs)
                    else:
                        value = await run_async(*args, **kwargs)
                except TimeoutError:
                    if replay == "safe":
                        raise
                    body = {"interrupted": True}  # cut off at its deadline: may have happened
                except Exception as exc:
                    if replay == "safe":
                        raise  # nothing recorded: it runs again, as an interrupted one would
                    body = record(error=exc)
                else:
                    body = record(value)
                outcome = await after(call, {**body, "id": identity})
            return answer(call, outcome)

        return cast(Callable[P, T], async_wrapper)

    @functools.wraps(fn)
    def sync_wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        identity = _identity(step_name, replay, args, kwargs, key is not None)
        call = _place(step_name, identity, key(*args, **kwargs) if key else None)
        # The call runs here, in the caller's thread; the records go through the World's loop.
        outcome = saver._sync(before, call, identity)
        if outcome is None:
            try:
                value = fn(*args, **kwargs)
            except Exception as exc:
                if replay == "safe":
                    raise  # nothing recorded: it runs again, as an interrupted one would
                body = record(error=exc)
            else:
                body = record(value)
            outcome = saver._sync(after, call, {**body, "id": identity})
        return cast(T, answer(call, outcome))

    return cast(Callable[P, T], sync_wrapper)


# --------------------------------------------------------------------------------------------
# WorldStore: LangGraph's long-term memory store on a World
# --------------------------------------------------------------------------------------------

_STORE_PREFIX = "langgraph-store/"


def _escape(label: str) -> str:
    return label.replace("%", "%25").replace("/", "%2F")


def _unescape(label: str) -> str:
    return label.replace("%2F", "/").replace("%25", "%")


def _store_labels(labels: Sequence[str]) -> str:
    # Each label ended by "/" (escaped inside it): a namespace prefix is a string prefix, and
    # ids sort as the labels do (but for labels holding "%" or "/").
    return "".join(f"{_escape(label)}/" for label in labels)


def _item_log(namespace: tuple[str, ...], key: str) -> str:
    log_id = f"{_STORE_PREFIX}{_store_labels(namespace)}{_escape(key)}"
    return validate_id(log_id, "store item log id (from namespace and key)")


def _parse_item(log_id: str) -> tuple[tuple[str, ...], str] | None:
    parts = [_unescape(part) for part in log_id.removeprefix(_STORE_PREFIX).split("/")]
    if len(parts) < 2:
        return None
    return tuple(parts[:-1]), parts[-1]


def _check_namespace(namespace: object, what: str = "namespace") -> tuple[str, ...]:
    if not isinstance(namespace, tuple) or not all(isinstance(x, str) for x in namespace):
        raise InvalidArgumentError(f"{what} must be a tuple of str, got {namespace!r}")
    return namespace


def _matches(value: Any, wanted: Any) -> bool:
    """``filter`` semantics: equality, nested dicts and lists compared element by element,
    and the operators ``$eq``, ``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte``."""
    if isinstance(wanted, dict):
        if any(str(k).startswith("$") for k in wanted):
            return all(_operator(value, str(op), arg) for op, arg in wanted.items())
        return isinstance(value, dict) and all(_matches(value.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list | tuple):
        return (
            isinstance(value, list | tuple)
            and len(value) == len(wanted)
            and all(_matches(v, w) for v, w in zip(value, wanted, strict=True))
        )
    return bool(value == wanted)


def _operator(value: Any, op: str, arg: Any) -> bool:
    if op == "$eq":
        return bool(value == arg)
    if op == "$ne":
        return bool(value != arg)
    if op not in ("$gt", "$gte", "$lt", "$lte"):
        raise InvalidArgumentError(
            f"unknown filter operator {op!r}: use $eq, $ne, $gt, $gte, $lt or $lte"
        )
    try:
        left, right = float(value), float(arg)
    except (TypeError, ValueError):
        return False
    return {"$gt": left > right, "$gte": left >= right, "$lt": left < right, "$lte": left <= right}[
        op
    ]


def _namespace_matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    if condition.match_type == "prefix":
        pairs = zip(namespace, path, strict=False)
    elif condition.match_type == "suffix":
        pairs = zip(reversed(namespace), reversed(path), strict=False)
    else:
        raise InvalidArgumentError(
            f"match_type must be 'prefix' or 'suffix', got {condition.match_type!r}"
        )
    return all(p == "*" or n == p for n, p in pairs)


class WorldStore(BaseStore):
    """LangGraph's long-term memory store (``BaseStore``) in a World's logs, any backend.

    Each item is a log of its own, ``langgraph-store/<label>/.../<key>`` (``%`` and ``/``
    escaped in labels and keys as ``%25`` and ``%2F``): a put
    appends the new value (with when the item was created and updated), a delete deletes
    the log, a get reads its last event. A namespace prefix is a prefix of log ids, so
    ``search`` and ``list_namespaces`` list logs page by page instead of scanning everything.
    Values are JSON objects.

    Not supported: a vector index (``search``'s ``query`` is ignored, as LangGraph's stores
    do without an index, and results come in namespace and key order, with ``score`` None) and
    TTLs (``supports_ttl`` is False: LangGraph's ``put`` refuses a ``ttl``). An item updated
    often keeps its earlier values in its log until it is deleted.

    Sync methods (``batch``, ``get``, ``put`` ...) run on the World's event loop, as the
    saver's do (see the module docstring); the store is made in async code.

    Args:
        world: an open World; the store neither opens nor closes it.

    Raises:
        InvalidArgumentError: ``world`` is not a World.
        RuntimeError: made outside an event loop.
    """

    supports_ttl = False

    def __init__(self, world: World) -> None:
        if not isinstance(world, World):
            raise InvalidArgumentError(
                f"world must be an open World (open_world()), got {type(world).__name__}"
            )
        self.world = world
        self._bridge = _Bridge(type(self).__name__)

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Sync :meth:`abatch` (from a thread other than the World's event loop)."""
        return self._bridge.run(self.abatch, list(ops))

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Run the operations in order; one result per operation.

        Raises:
            InvalidArgumentError: an unknown operation, a bad namespace or key, a value that is
                not a JSON object, an unknown filter operator.
            UnsupportedError: a put with a ``ttl``.
        """
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                results.append(await self._get(_check_namespace(op.namespace), op.key))
            elif isinstance(op, PutOp):
                await self._put(op)
                results.append(None)
            elif isinstance(op, SearchOp):
                results.append(await self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(await self._namespaces(op))
            else:
                raise InvalidArgumentError(
                    f"unknown store operation {type(op).__name__}: pass GetOp, PutOp, SearchOp "
                    "or ListNamespacesOp"
                )
        return results

    async def _last(self, log_id: str, tail: int | None = None) -> dict[str, Any] | None:
        if tail is None:
            tail = await self.world.log.tail(log_id)
        if tail == 0:
            return None
        events = await self.world.log.read(log_id, after=tail - 1, limit=1)
        return _body(events[0]) if events else None

    @staticmethod
    def _item(namespace: tuple[str, ...], key: str, body: dict[str, Any]) -> Item:
        return Item(
            value=body["value"],
            key=key,
            namespace=namespace,
            created_at=datetime.fromisoformat(body["created"]),
            updated_at=datetime.fromisoformat(body["updated"]),
        )

    async def _get(self, namespace: tuple[str, ...], key: str) -> Item | None:
        body = await self._last(_item_log(namespace, key))
        return None if body is None else self._item(namespace, key, body)

    async def _put(self, op: PutOp) -> None:
        namespace = _check_namespace(op.namespace)
        if not namespace:
            raise InvalidArgumentError("namespace must not be empty: pass ('users', ...)")
        if not isinstance(op.key, str):
            raise InvalidArgumentError(f"key must be a str, got {type(op.key).__name__}")
        log_id = _item_log(namespace, op.key)
        if op.value is None:
            await self.world.log.delete(log_id)
            return
        if op.ttl is not None:
            raise UnsupportedError(
                "WorldStore keeps items until they are deleted (no TTL): put with ttl=None"
            )
        if not isinstance(op.value, dict):
            raise InvalidArgumentError(
                f"a store value must be a dict (a JSON object), got {type(op.value).__name__}"
            )
        try:
            value = json.loads(json.dumps(op.value, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                f"the value for key {op.key!r} is not JSON: {exc}; store JSON values only"
            ) from exc
        now = datetime.now(UTC).isoformat()
        first = await self.world.log.read(log_id, limit=1)
        created = _body(first[0])["created"] if first else now
        body = {"value": value, "created": created, "updated": now}
        await self.world.log.append(log_id, [NewEvent(data=_json(body))])

    async def _items(
        self, prefix: tuple[str, ...]
    ) -> AsyncIterator[tuple[tuple[str, ...], str, int]]:
        cursor: str | None = None
        while True:
            page = await self.world.log.list_logs(
                prefix=_STORE_PREFIX + _store_labels(prefix), cursor=cursor, limit=MAX_LIST_LIMIT
            )
            for info in page.items:
                parsed = _parse_item(info.log_id)
                if parsed is not None and info.tail > 0:
                    yield parsed[0], parsed[1], info.tail
            cursor = page.next_cursor
            if cursor is None:
                return

    async def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = _check_namespace(op.namespace_prefix, "namespace_prefix")
        if op.limit < 0 or op.offset < 0:
            raise InvalidArgumentError(
                f"limit and offset must be >= 0, got limit={op.limit} offset={op.offset}"
            )
        found: list[SearchItem] = []
        skipped = 0
        async for namespace, key, tail in self._items(prefix):
            if len(found) >= op.limit:
                break
            body = await self._last(_item_log(namespace, key), tail)
            if body is None:
                continue
            if op.filter and not all(
                _matches(body["value"].get(k), v) for k, v in op.filter.items()
            ):
                continue
            if skipped < op.offset:
                skipped += 1
                continue
            item = self._item(namespace, key, body)
            found.append(
                SearchItem(
                    namespace=namespace,
                    key=key,
                    value=item.value,
                    created_at=item.created_at,
                    updated_at=item.updated_at,
                )
            )
        return found

    async def _namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        conditions = tuple(op.match_conditions or ())
        literal: list[str] = []
        for condition in conditions:  # list only under the literal start of a prefix match
            if condition.match_type == "prefix":
                for label in condition.path:
                    if label == "*":
                        break
                    literal.append(label)
                break
        seen: set[tuple[str, ...]] = set()
        async for namespace, _, _ in self._items(tuple(literal)):
            if all(_namespace_matches(c, namespace) for c in conditions):
                seen.add(namespace[: op.max_depth] if op.max_depth is not None else namespace)
        return sorted(seen)[op.offset : op.offset + op.limit]
