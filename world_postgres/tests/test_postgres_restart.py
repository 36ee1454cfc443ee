"""A real PostgreSQL restart (pg_ctl restart -m fast on a throwaway cluster) in the middle of
work: nothing acknowledged is lost, errors are BackendUnavailableError or retried away, and
the LISTEN connection comes back by itself."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from typing import Protocol

import anyio
import anyio.to_thread
import pytest

import world_postgres._wait
from world_core import BackendUnavailableError, NewEvent
from world_postgres import connect

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]


def fresh_namespace() -> str:
    return f"pgt_{secrets.token_hex(8)}"


async def until(check: Callable[[], bool], what: str, within: float = 30.0) -> None:
    """Wait, bounded, until ``check()`` holds; fail naming ``what`` otherwise."""
    pause = 0.005
    with anyio.move_on_after(within):
        for _ in range(1_000_000):
            if check():
                return
            await anyio.sleep(pause)
            pause = min(pause * 1.5, 0.1)
    raise AssertionError(f"{what}: not within {within} s")


BOUND = 90.0


class Restartable(Protocol):
    """The ``cluster`` fixture: a throwaway server this module may restart."""

    url: str

    def restart(self) -> None: ...


AFTER = 20


async def test_listener_reconnects_after_restart(
    cluster: Restartable, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(world_postgres._wait, "_POLL_LISTENING", 3600.0)
    namespace = fresh_namespace()
    world = await connect(url=cluster.url, namespace=namespace)
    seen: list[bytes] = []
    try:
        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as tg:

                async def watcher() -> None:
                    async for event in world.log.watch("w"):
                        seen.append(event.data)
                        if len(seen) == 2:
                            return

                tg.start_soon(watcher)
                await until(
                    lambda: world._listener.listening and world._listener.sleeping > 0,
                    "the watcher asleep on a listening connection",
                )
                await world.log.append("w", [NewEvent(data=b"before")])
                await until(lambda: len(seen) == 1, "the first event")

                await anyio.to_thread.run_sync(cluster.restart)
                await until(
                    lambda: world.listener_reconnects >= 1 and world._listener.listening,
                    "the listener back after the restart",
                )

                # A waiter that starts now, with the safety poll off, proves notifications
                # flow over the new connection.
                got: list[bytes] = []

                async def claimer() -> None:
                    leases = await world.queue.claim("q", "w", lease=30, wait=3600)
                    got.extend(lease.payload for lease in leases)

                sleeping = world._listener.sleeping
                tg.start_soon(claimer)
                await until(lambda: world._listener.sleeping > sleeping, "the claimer asleep")
                writer = await connect(url=cluster.url, namespace=namespace)
                try:
                    await writer.queue.enqueue("q", b"after restart")
                    await writer.log.append("w", [NewEvent(data=b"after")])
                finally:
                    await writer.aclose()
        assert seen == [b"before", b"after"]
        assert got == [b"after restart"]
    finally:
        await world.purge()
        await world.aclose()


async def test_restart_during_appends_and_claims_loses_nothing(
    cluster: Restartable, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="world_postgres")
    namespace = fresh_namespace()
    world = await connect(url=cluster.url, namespace=namespace)
    appended: dict[int, bytes] = {}  # seq -> data, for every append that returned
    unknown: list[bytes] = []  # appends that raised BackendUnavailableError
    enqueued: set[str] = set()
    acked: set[str] = set()
    errors: list[BaseException] = []
    restarted = anyio.Event()
    producing_done = anyio.Event()

    # Appenders and the producer never pause, so the restart cuts calls in flight; they go
    # on for AFTER more calls once it is over.
    async def appender(name: str) -> None:
        n = after = 0
        while after < AFTER:
            data = f"{name}-{n}".encode()
            try:
                tail = await world.log.append("journal", [NewEvent(data=data, key=data.decode())])
                appended[tail] = data
            except BackendUnavailableError as exc:
                errors.append(exc)
                unknown.append(data)
            n += 1
            after += restarted.is_set()

    async def producer() -> None:
        n = after = 0
        while after < AFTER:
            try:
                enqueued.add(await world.queue.enqueue("jobs", f"job-{n}".encode()))
            except BackendUnavailableError as exc:
                errors.append(exc)
            n += 1
            after += restarted.is_set()
        producing_done.set()

    async def worker(name: str) -> None:
        deadline = time.monotonic() + BOUND
        while time.monotonic() < deadline:
            try:
                leases = await world.queue.claim("jobs", name, lease=2.0, limit=3, wait=0.5)
                for lease in leases:
                    await world.queue.ack(lease)
                    acked.add(lease.message_id)
            except BackendUnavailableError as exc:
                errors.append(exc)
            except Exception as exc:  # a LeaseLostError here would be a lost ack
                errors.append(exc)
                raise
            if producing_done.is_set() and enqueued <= acked:
                return

    async def restarter() -> None:
        await until(lambda: len(appended) >= 10 and len(enqueued) >= 10, "work under way")
        await anyio.to_thread.run_sync(cluster.restart)
        restarted.set()

    try:
        with anyio.fail_after(BOUND + 30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(restarter)
                tg.start_soon(appender, "a")
                tg.start_soon(appender, "b")
                tg.start_soon(producer)
                tg.start_soon(worker, "w1")
                tg.start_soon(worker, "w2")
        assert all(isinstance(e, BackendUnavailableError) for e in errors), errors
        # The restart did cut calls: they were retried (or surfaced as errors above).
        assert errors or any("retrying" in r.getMessage() for r in caplog.records)
        events = await world.log.read("journal")
        # Dense, every acknowledged append at the seq it was acknowledged with, and each
        # append stored at most once (keys are unique per log).
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        stored = {e.seq: e.data for e in events}
        for seq, data in appended.items():
            assert stored[seq] == data
        assert len({e.data for e in events}) == len(events)
        assert set(stored.values()) <= set(appended.values()) | set(unknown)
        # Every acknowledged enqueue was delivered and acked.
        assert enqueued <= acked
    finally:
        await world.purge()
        await world.aclose()
