"""LifecycleContract: what a World says about itself, and ``aclose``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

import anyio
import anyio.lowlevel

from world_conformance._base import ContractBase
from world_conformance._support import WAIT, aclose, claim_one, refusal_at_call
from world_conformance._target import WorldTarget
from world_core import (
    BackendUnavailableError,
    Capabilities,
    ClosedError,
    InvalidArgumentError,
    InvalidIdentifierError,
    Lease,
    NewEvent,
    OutboxMessage,
    PayloadTooLargeError,
    StreamInfo,
    UnsupportedError,
    World,
    connect_world,
)
from world_core.spi import MAX_PAYLOAD_BYTES

__all__ = ["LifecycleContract"]

LONG = 120.0
"""A lease meant to outlive the test."""

Call = Callable[[], Awaitable[object]]
IteratorCall = Callable[[], AsyncIterator[object]]


async def _appends_cut_by_close(
    world: World, log_id: str, after: float
) -> tuple[set[str], set[str], list[str]]:
    """8 tasks appending one keyed event at a time to ``log_id`` until ``world`` is closed,
    ``after`` seconds in: the keys whose append returned, those that raised ClosedError, and
    any other error than BackendUnavailableError (an outcome unknown: either way is right)."""
    returned: set[str] = set()
    closed: set[str] = set()
    others: list[str] = []

    async def appender(task: int) -> None:
        for n in range(2_000):  # bounded: a World whose appends never wait ends it too
            await anyio.lowlevel.checkpoint()  # the closing task's turn, whatever the World
            key = f"{task}-{n}"
            try:
                await world.log.append(log_id, [NewEvent(data=b"x", key=key)])
            except ClosedError:
                closed.add(key)
                return
            except BackendUnavailableError:
                return
            except Exception as exc:
                others.append(f"{key}: {type(exc).__name__}: {exc}")
                return
            returned.add(key)

    async with anyio.create_task_group() as group:
        for task in range(8):
            group.start_soon(appender, task)
        await anyio.sleep(after)
        await world.aclose()
    return returned, closed, others


def _calls(world: World, lease: Lease, dead: str) -> list[tuple[str, Call]]:
    """Every awaitable method of the World, with arguments it accepts."""
    log, queue, stream = world.log, world.queue, world.stream
    return [
        ("log.append", lambda: log.append("l", [NewEvent(data=b"b")])),
        ("log.read", lambda: log.read("l")),
        ("log.get", lambda: log.get("l", "k")),
        ("log.tail", lambda: log.tail("l")),
        ("log.info", lambda: log.info("l")),
        ("log.list_logs", lambda: log.list_logs()),
        ("log.delete", lambda: log.delete("l")),
        ("queue.enqueue", lambda: queue.enqueue("q", b"x")),
        ("queue.claim", lambda: queue.claim("q", "w", lease=LONG)),
        ("queue.claim(wait=1)", lambda: queue.claim("q", "w", lease=LONG, wait=1.0)),
        ("queue.renew", lambda: queue.renew(lease, LONG)),
        ("queue.ack", lambda: queue.ack(lease)),
        ("queue.release", lambda: queue.release(lease)),
        ("queue.dead_letters", lambda: queue.dead_letters("dead")),
        ("queue.requeue", lambda: queue.requeue("dead", dead)),
        ("stream.write", lambda: stream.write("s", [b"d"])),
        ("stream.close", lambda: stream.close("s")),
        ("stream.info", lambda: stream.info("s")),
        ("stream.delete", lambda: stream.delete("s")),
        ("purge", world.purge),
    ]


def _iterator_calls(world: World) -> list[tuple[str, IteratorCall]]:
    return [
        ("log.watch", lambda: world.log.watch("l")),
        ("stream.read", lambda: world.stream.read("s")),
    ]


def _bad_calls(
    world: World, capabilities: Capabilities
) -> dict[type[Exception], list[tuple[str, Call]]]:
    """Calls every World refuses for their arguments alone, by the error they raise."""
    log, queue, stream = world.log, world.queue, world.stream
    lease = Lease(
        queue="q", message_id="m", payload=b"", attempt=1, max_attempts=1, token="t", deadline=0.0
    )
    not_a_lease: Any = lease.model_dump()
    text: Any = "text"
    over = b"x" * (capabilities.max_payload_bytes + 1)
    calls: dict[type[Exception], list[tuple[str, Call]]] = {
        InvalidIdentifierError: [
            ("log.append('')", lambda: log.append("", [NewEvent(data=b"")])),
            ("log.read('')", lambda: log.read("")),
            ("log.get('l', '')", lambda: log.get("l", "")),
            ("log.tail('')", lambda: log.tail("")),
            ("log.info('')", lambda: log.info("")),
            ("log.list_logs(prefix='a\\x00')", lambda: log.list_logs(prefix="a\x00")),
            ("log.delete('')", lambda: log.delete("")),
            ("queue.enqueue('')", lambda: queue.enqueue("", b"")),
            ("queue.claim('q', '')", lambda: queue.claim("q", "", lease=LONG)),
            ("queue.dead_letters('')", lambda: queue.dead_letters("")),
            ("queue.requeue('q', '')", lambda: queue.requeue("q", "")),
            ("stream.write('')", lambda: stream.write("", [b""])),
            ("stream.close('')", lambda: stream.close("")),
            ("stream.info('')", lambda: stream.info("")),
            ("stream.delete('')", lambda: stream.delete("")),
        ],
        InvalidArgumentError: [
            ("log.append('l', [])", lambda: log.append("l", [])),
            ("log.read('l', after=-1)", lambda: log.read("l", after=-1)),
            ("log.list_logs(limit=0)", lambda: log.list_logs(limit=0)),
            ("queue.enqueue('q', str)", lambda: queue.enqueue("q", text)),
            ("queue.claim(lease=0)", lambda: queue.claim("q", "w", lease=0)),
            ("queue.renew(lease, 0)", lambda: queue.renew(lease, 0)),
            ("queue.ack(a dict)", lambda: queue.ack(not_a_lease)),
            ("queue.release(delay=-1)", lambda: queue.release(lease, delay=-1)),
            ("queue.dead_letters(limit=0)", lambda: queue.dead_letters("q", limit=0)),
            ("stream.write('s', [])", lambda: stream.write("s", [])),
        ],
        PayloadTooLargeError: [
            ("queue.enqueue(one byte too many)", lambda: queue.enqueue("q", over)),
            ("stream.write(one byte too many)", lambda: stream.write("s", [over])),
        ],
    }
    if not capabilities.outbox:
        message = OutboxMessage(queue="q", payload=b"")
        calls[UnsupportedError] = [
            (
                "log.append(messages=...) without an outbox",
                lambda: log.append("l", [NewEvent(data=b"")], messages=[message]),
            )
        ]
    return calls


def _bad_iterator_calls(world: World) -> list[tuple[str, IteratorCall, type[Exception]]]:
    bad_after: Any = -1
    bad_start: Any = "0"
    return [
        ("log.watch('')", lambda: world.log.watch(""), InvalidIdentifierError),
        (
            "log.watch(after=-1)",
            lambda: world.log.watch("l", after=bad_after),
            InvalidArgumentError,
        ),
        ("stream.read('')", lambda: world.stream.read(""), InvalidIdentifierError),
        (
            "stream.read(start='0')",
            lambda: world.stream.read("s", start=bad_start),
            InvalidArgumentError,
        ),
    ]


async def _failures(calls: list[tuple[str, Call]], error: type[Exception]) -> list[str]:
    """What each call did other than raising ``error`` (within a bound)."""
    failures: list[str] = []
    for what, call in calls:
        try:
            with anyio.fail_after(10):
                await call()
        except error:
            continue
        except TimeoutError:
            failures.append(f"{what} waited instead of raising {error.__name__}")
        except Exception as exc:
            failures.append(
                f"{what} raised {type(exc).__name__} instead of {error.__name__}: {exc}"
            )
        else:
            failures.append(f"{what} was carried out instead of raising {error.__name__}")
    return failures


class LifecycleContract(ContractBase):
    """Name, namespace, capabilities, redacted settings; ``aclose`` idempotent and final."""

    contract_area = "world"

    async def test_world_describes_itself(self, world: World, world_target: WorldTarget) -> None:
        assert world.namespace == world_target.namespace
        assert isinstance(world.name, str)
        assert world.name
        capabilities = world.capabilities
        assert isinstance(capabilities, Capabilities)
        assert 0 < capabilities.max_payload_bytes <= MAX_PAYLOAD_BYTES
        settings = world.settings()
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in settings.items())
        url = world_target.url or ""
        password = urlsplit(url).password if "://" in url else None
        if password:
            leaked = [k for k, v in settings.items() if unquote(password) in v or password in v]
            assert not leaked, f"settings() shows the password in {leaked}"

    async def test_world_aclose_idempotent_then_closed(self, world_target: WorldTarget) -> None:
        """``aclose`` twice is fine; afterwards every method of ``log``, ``queue`` and
        ``stream``, and ``purge``, raises ClosedError and writes nothing (``watch`` and
        ``read`` when called, before returning an iterator), while ``name``, ``namespace``,
        ``capabilities`` and ``settings()`` still answer."""
        target = world_target.sibling()
        async with target.scratch() as keeper:
            closing = await connect_world(target.name, url=target.url, namespace=target.namespace)
            await closing.log.append("l", [NewEvent(data=b"a", key="k")])
            await closing.queue.enqueue("q", b"m")
            lease = await claim_one(closing, "q", "w", lease=LONG)
            dead = await closing.queue.enqueue("dead", b"d", max_attempts=1)
            await closing.queue.release(await claim_one(closing, "dead", "w", lease=LONG))
            await closing.stream.write("s", [b"c"])
            await closing.aclose()
            await closing.aclose()
            failures = await _failures(_calls(closing, lease, dead), ClosedError)
            for what, call in _iterator_calls(closing):
                failure = await refusal_at_call(call, ClosedError, what)
                if failure is not None:
                    failures.append(failure)
            assert not failures, "after aclose() every call raises ClosedError:\n" + "\n".join(
                failures
            )
            assert closing.namespace == target.namespace
            assert closing.name
            assert isinstance(closing.capabilities, Capabilities)
            assert isinstance(closing.settings(), Mapping)
            assert [e.data for e in await keeper.log.read("l")] == [b"a"], "a closed World wrote"
            assert await keeper.queue.claim("q", "w", lease=LONG) == [], "a closed World released"
            await keeper.queue.renew(lease, LONG)  # still current: not acked nor released
            await keeper.queue.ack(lease)
            assert [d.message_id for d in await keeper.queue.dead_letters("dead")] == [dead]
            assert await keeper.stream.info("s") == StreamInfo(
                stream_id="s", next_index=1, closed=False
            ), "a closed World wrote to, closed or deleted a stream"

    async def test_world_closed_checks_arguments_first(self, world_target: WorldTarget) -> None:
        """A call on a closed World checks its arguments first: what the arguments alone
        decide (InvalidIdentifierError, InvalidArgumentError, PayloadTooLargeError, and
        UnsupportedError for a capability declared absent) is raised as on an open World,
        ClosedError only for a call the World would otherwise have carried out."""
        target = world_target.sibling()
        async with target.scratch():
            closing = await connect_world(target.name, url=target.url, namespace=target.namespace)
            capabilities = closing.capabilities
            await closing.aclose()
            failures: list[str] = []
            for error, calls in _bad_calls(closing, capabilities).items():
                failures += await _failures(calls, error)
            for what, bad_call, iterator_error in _bad_iterator_calls(closing):
                failure = await refusal_at_call(bad_call, iterator_error, what)
                if failure is not None:
                    failures.append(failure)
            assert not failures, (
                "a call with arguments it refuses raises that refusal, also on a closed World "
                "(arguments first, then ClosedError):\n" + "\n".join(failures)
            )

    async def test_world_aclose_ends_waits(self, world_target: WorldTarget) -> None:
        """Waits in progress when the World closes (a watch and a stream reader at the tail,
        a ``claim(wait=...)``) end with ClosedError, neither hanging nor raising a transient
        fault a caller would retry; an iterator made before ``aclose`` and first stepped
        after it raises ClosedError too."""
        target = world_target.sibling()
        async with target.scratch():
            closing = await connect_world(target.name, url=target.url, namespace=target.namespace)
            await closing.log.append("l", [NewEvent(data=b"a")])
            await closing.stream.write("s", [b"a"])
            iterators: dict[str, AsyncIterator[object]] = {
                "Log.watch waiting at the tail": closing.log.watch("l", after=1),
                "Stream.read waiting at the tail": closing.stream.read("s", start=1),
                "Log.watch made before aclose": closing.log.watch("l"),
                "Stream.read made before aclose": closing.stream.read("s"),
            }
            outcomes: dict[str, str] = {}

            async def wait(what: str, step: Call) -> None:
                try:
                    with anyio.fail_after(WAIT):
                        outcomes[what] = f"returned {await step()!r}"
                except ClosedError:
                    pass
                except TimeoutError:
                    outcomes[what] = f"was still waiting {WAIT:g} s after aclose"
                except Exception as exc:
                    outcomes[what] = f"raised {type(exc).__name__}: {exc}"

            try:
                async with anyio.create_task_group() as group:
                    for what in list(iterators)[:2]:
                        group.start_soon(wait, what, iterators[what].__anext__)
                    group.start_soon(
                        wait,
                        "Queue.claim(wait=...)",
                        lambda: closing.queue.claim("q", "w", lease=LONG, wait=WAIT * 2),
                    )
                    await anyio.sleep(0.2)
                    await closing.aclose()
                for what in list(iterators)[2:]:
                    await wait(what, iterators[what].__anext__)
            finally:
                for iterator in iterators.values():
                    with anyio.CancelScope(shield=True), anyio.move_on_after(WAIT):
                        await aclose(iterator)
            failures = [f"{what} {outcome}" for what, outcome in outcomes.items()]
            assert not failures, (
                "a wait in progress when the World closes ends with ClosedError:\n"
                + "\n".join(failures)
            )

    async def test_world_aclose_during_appends_tells_no_lie(
        self, world_target: WorldTarget
    ) -> None:
        """Appends in progress when the World closes: each returns (its event is in the log),
        raises ClosedError (it wrote nothing) or raises BackendUnavailableError (whether it
        took effect is unknown). An append whose event is in the log never raised
        ClosedError, and every one that returned is there."""
        target = world_target.sibling()
        async with target.scratch() as keeper:
            for attempt in range(3):  # the close lands at a different moment each time
                closing = await connect_world(
                    target.name, url=target.url, namespace=target.namespace
                )
                log_id = f"closing-{attempt}"
                await closing.log.append(log_id, [NewEvent(data=b"first", key="first")])
                with anyio.fail_after(WAIT):
                    returned, closed, others = await _appends_cut_by_close(
                        closing, log_id, 0.05 + 0.05 * attempt
                    )
                written = {str(e.key) for e in await keeper.log.read(log_id)} - {"first"}
                assert not others, f"appends cut off by aclose raised: {others[:5]}"
                assert returned <= written, f"returned but not written: {returned - written}"
                lies = sorted(closed & written)
                assert not lies, f"raised ClosedError yet written (attempt {attempt}): {lies}"

    async def test_world_two_connections_share_state(
        self, world: World, world_target: WorldTarget
    ) -> None:
        """Two ``connect`` calls with the same URL and namespace in one process are the same
        store: each sees what the other wrote (log, queue, stream), and closing one leaves the
        other usable."""
        async with world_target.open() as second:
            await world.log.append("shared", [NewEvent(data=b"one")])
            seen = await second.log.read("shared")
            assert [e.data for e in seen] == [b"one"], (
                "a second connection to the same URL and namespace must see the first's append"
            )
            message_id = await second.queue.enqueue("shared", b"job")
            leases = await world.queue.claim("shared", "w", lease=60.0)
            assert [lease.message_id for lease in leases] == [message_id], (
                "a message enqueued on one connection must be claimable on the other"
            )
            await second.queue.ack(leases[0])
            await world.stream.write("shared", [b"chunk"])
            assert (await second.stream.info("shared")).next_index == 1, (
                "a chunk written on one connection must be visible on the other"
            )
        assert await world.log.tail("shared") == 1, "closing the second connection closed this one"
