"""ModelContract: a Hypothesis state machine drives the World and a trivially correct model.

Hypothesis runs synchronously in a worker thread; each rule hands its call to the test's
event loop (``anyio.from_thread``), where the World's connections live. Every example works
under a prefix of its own, so examples never see each other's logs, streams or queues.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, ClassVar, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    precondition,
    rule,
    run_state_machine_as_test,
)

from world_conformance._base import ContractBase
from world_conformance._support import drain, take
from world_core import (
    ClosedError,
    ConflictError,
    DuplicateKeyError,
    Event,
    InvalidArgumentError,
    Lease,
    LeaseLostError,
    LogInfo,
    NewEvent,
    StreamInfo,
    World,
)

__all__ = ["ModelContract", "world_state_machine"]

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)

LOGS = st.sampled_from(["a", "b", "c/d"])
STREAMS = st.sampled_from(["s", "t"])
QUEUES = st.sampled_from(["q", "r"])
KEYS = st.sampled_from(["k1", "k2", "k3"])
DATA = st.binary(max_size=6)


async def _await(call: Callable[[], Awaitable[T]]) -> T:
    return await call()


def world_state_machine(world: World) -> type[RuleBasedStateMachine]:
    """A state machine class comparing ``world`` with an in-memory model of Log, Stream and
    Queue (enqueue, claim with a long lease, ack, dedup keys). Run it from a worker thread of
    the event loop that owns ``world``."""
    examples = itertools.count()

    class WorldMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.prefix = f"x{next(examples)}/"
            self.logs: dict[str, list[Event]] = {}
            self.status: dict[str, str | None] = {}
            self.chunks: dict[str, list[bytes]] = {}
            self.closed: set[str] = set()
            self.ready: dict[str, list[str]] = {}
            self.payload: dict[str, bytes] = {}
            self.used: dict[str, set[str]] = {}
            self.live_key: dict[tuple[str, str], str] = {}
            self.key_of: dict[str, tuple[str, str]] = {}
            self.held: list[Lease] = []
            self.finished: list[Lease] = []

        # -- plumbing ---------------------------------------------------------------------

        def call(self, fn: Callable[[], Awaitable[T]]) -> T:
            return anyio.from_thread.run(_await, fn)

        def refused(self, fn: Callable[[], Awaitable[Any]], error: type[E]) -> E:
            try:
                result = self.call(fn)
            except error as exc:
                return exc
            raise AssertionError(f"expected {error.__name__}, the call returned {result!r}")

        # -- log --------------------------------------------------------------------------

        @rule(
            name=LOGS,
            batch=st.lists(st.tuples(DATA, st.none() | KEYS), min_size=1, max_size=3),
            expect=st.none() | st.integers(0, 6),
            status=st.none() | st.sampled_from(["s1", "s2"]),
        )
        def append(
            self,
            name: str,
            batch: list[tuple[bytes, str | None]],
            expect: int | None,
            status: str | None,
        ) -> None:
            log_id = self.prefix + name
            stored = self.logs.get(log_id, [])
            events = [NewEvent(data=data, key=key) for data, key in batch]
            append = partial(world.log.append, log_id, events, expect_tail=expect, status=status)
            keys = [key for _, key in batch if key is not None]
            if len(keys) != len(set(keys)):
                self.refused(append, InvalidArgumentError)
                return
            if expect is not None and expect != len(stored):
                assert self.refused(append, ConflictError).actual == len(stored)
                return
            existing = {event.key: event for event in stored if event.key is not None}
            if any(key in existing for key in keys):
                error = self.refused(append, DuplicateKeyError)
                assert error.key in keys
                assert error.existing == existing[error.key]
                return
            tail = self.call(append)
            new = [
                Event(seq=len(stored) + i + 1, data=data, key=key)
                for i, (data, key) in enumerate(batch)
            ]
            assert tail == len(stored) + len(batch)
            self.logs[log_id] = stored + new
            if status is not None:
                self.status[log_id] = status

        @rule(name=LOGS, after=st.integers(0, 8), limit=st.none() | st.integers(1, 4))
        def read(self, name: str, after: int, limit: int | None) -> None:
            log_id = self.prefix + name
            got = self.call(partial(world.log.read, log_id, after=after, limit=limit))
            expected = self.logs.get(log_id, [])[after:]
            assert got == (expected if limit is None else expected[:limit])

        @rule(name=LOGS, key=KEYS)
        def get(self, name: str, key: str) -> None:
            log_id = self.prefix + name
            expected = next((e for e in self.logs.get(log_id, []) if e.key == key), None)
            assert self.call(partial(world.log.get, log_id, key)) == expected

        @rule(name=LOGS)
        def info(self, name: str) -> None:
            log_id = self.prefix + name
            expected = None
            if log_id in self.logs:
                tail = len(self.logs[log_id])
                expected = LogInfo(log_id=log_id, tail=tail, status=self.status.get(log_id))
            assert self.call(partial(world.log.info, log_id)) == expected
            assert self.call(partial(world.log.tail, log_id)) == len(self.logs.get(log_id, []))

        @rule(limit=st.integers(1, 4))
        def list_logs(self, limit: int) -> None:
            listed: list[LogInfo] = []
            cursor: str | None = None
            for _ in range(20):
                page = self.call(
                    partial(world.log.list_logs, prefix=self.prefix, cursor=cursor, limit=limit)
                )
                assert len(page.items) <= limit
                listed.extend(page.items)
                cursor = page.next_cursor
                if cursor is None:
                    break
            assert cursor is None
            assert listed == [
                LogInfo(log_id=log_id, tail=len(events), status=self.status.get(log_id))
                for log_id, events in sorted(self.logs.items())
            ]

        @rule(name=LOGS)
        def delete(self, name: str) -> None:
            log_id = self.prefix + name
            self.call(partial(world.log.delete, log_id))
            self.logs.pop(log_id, None)
            self.status.pop(log_id, None)

        # -- stream -----------------------------------------------------------------------

        @rule(
            name=STREAMS,
            chunks=st.lists(DATA, min_size=1, max_size=3),
            expect=st.none() | st.integers(0, 5),
        )
        def write(self, name: str, chunks: list[bytes], expect: int | None) -> None:
            stream_id = self.prefix + name
            stored = self.chunks.setdefault(stream_id, [])
            write = partial(world.stream.write, stream_id, chunks, expect_next=expect)
            if stream_id in self.closed:
                self.refused(write, ClosedError)
            elif expect is not None and expect != len(stored):
                assert self.refused(write, ConflictError).actual == len(stored)
            else:
                assert self.call(write) == len(stored) + len(chunks)
                stored.extend(chunks)

        @rule(name=STREAMS)
        def close(self, name: str) -> None:
            stream_id = self.prefix + name
            self.call(partial(world.stream.close, stream_id))
            self.closed.add(stream_id)

        @rule(name=STREAMS, start=st.integers(-4, 6))
        def read_stream(self, name: str, start: int) -> None:
            stream_id = self.prefix + name
            stored = self.chunks.get(stream_id, [])
            info = self.call(partial(world.stream.info, stream_id))
            closed = stream_id in self.closed
            assert info == StreamInfo(stream_id=stream_id, next_index=len(stored), closed=closed)
            first = max(0, len(stored) + start) if start < 0 else start
            if closed:
                got = self.call(lambda: drain(world.stream.read(stream_id, start=start)))
            elif first < len(stored):
                count = len(stored) - first
                got = self.call(lambda: take(world.stream.read(stream_id, start=start), count))
            else:
                return  # an open stream with nothing to read would wait
            assert [(c.index, c.data) for c in got] == list(enumerate(stored))[first:]

        # -- queue ------------------------------------------------------------------------

        @rule(name=QUEUES, payload=DATA, dedup=st.none() | st.sampled_from(["d1", "d2"]))
        def enqueue(self, name: str, payload: bytes, dedup: str | None) -> None:
            queue = self.prefix + name
            message_id = self.call(partial(world.queue.enqueue, queue, payload, dedup_key=dedup))
            if dedup is not None and (queue, dedup) in self.live_key:
                assert message_id == self.live_key[(queue, dedup)]
                return
            assert message_id not in self.used.setdefault(queue, set()), "a message id was reused"
            self.used[queue].add(message_id)
            self.ready.setdefault(queue, []).append(message_id)
            self.payload[message_id] = payload
            if dedup is not None:
                self.live_key[(queue, dedup)] = message_id
                self.key_of[message_id] = (queue, dedup)

        @precondition(lambda self: bool(self.live_key))
        @rule(pick=st.integers(0, 50), payload=DATA)
        def enqueue_duplicate(self, pick: int, payload: bytes) -> None:
            (queue, key), message_id = sorted(self.live_key.items())[pick % len(self.live_key)]
            again = self.call(partial(world.queue.enqueue, queue, payload, dedup_key=key))
            assert again == message_id, "a live dedup key gave a new message"

        @rule(name=QUEUES, limit=st.integers(1, 3))
        def claim(self, name: str, limit: int) -> None:
            queue = self.prefix + name
            leases = self.call(
                partial(world.queue.claim, queue, "worker", lease=600.0, limit=limit)
            )
            ready = self.ready.setdefault(queue, [])
            assert [lease.message_id for lease in leases] == ready[:limit]
            for lease in leases:
                assert (lease.queue, lease.attempt) == (queue, 1)
                assert lease.payload == self.payload[lease.message_id]
            del ready[: len(leases)]
            self.held.extend(leases)

        @precondition(lambda self: bool(self.held))
        @rule(pick=st.integers(0, 50))
        def ack(self, pick: int) -> None:
            lease = self.held.pop(pick % len(self.held))
            self.call(partial(world.queue.ack, lease))
            key = self.key_of.pop(lease.message_id, None)
            if key is not None:
                del self.live_key[key]
            self.finished.append(lease)

        @precondition(lambda self: bool(self.finished))
        @rule(pick=st.integers(0, 50))
        def ack_again(self, pick: int) -> None:
            lease = self.finished[pick % len(self.finished)]
            self.refused(partial(world.queue.ack, lease), LeaseLostError)

    return WorldMachine


class ModelContract(ContractBase):
    """A Hypothesis state machine against an in-memory model of Log, Stream and Queue.

    ``model_settings`` is small on purpose (the suite runs against every World in CI); a
    backend author chasing a bug can raise it in their test class.
    """

    contract_area = "model"

    model_settings: ClassVar[settings] = settings(
        max_examples=12,
        stateful_step_count=25,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )

    async def test_model_state_machine(self, world: World) -> None:
        machine = world_state_machine(world)
        run = partial(run_state_machine_as_test, machine, settings=self.model_settings)
        await anyio.to_thread.run_sync(run)
