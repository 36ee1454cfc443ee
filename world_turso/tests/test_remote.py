"""A remote libSQL server (sqld or Turso) and an embedded replica of it.

These run only where ``WORLD_TEST_TURSO_URL`` is a ``libsql://``, ``https://`` or ``http://``
URL (with ``WORKFLOW_TURSO_AUTH_TOKEN`` when the server wants one). No libSQL server can be
installed on the development machines, so they are skipped there; the conformance suite
also runs against that URL when it is set.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from world_core import ConflictError, DuplicateKeyError, LeaseLostError, NewEvent, OutboxMessage
from world_turso import TursoWorld, connect

REMOTE = os.environ.get("WORLD_TEST_TURSO_URL", "")
IS_REMOTE = REMOTE.split("://", 1)[0].lower() in ("libsql", "https", "http") and "://" in REMOTE

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        not IS_REMOTE,
        reason="WORLD_TEST_TURSO_URL is not a libsql://, https:// or http:// URL "
        "(no libSQL server can be installed on this machine)",
    ),
]

WAIT = 60.0


def _namespace() -> str:
    return f"rt_{secrets.token_hex(6)}"


@pytest.fixture
async def remote() -> AsyncIterator[TursoWorld]:
    world = await connect(url=REMOTE, namespace=_namespace())
    try:
        yield world
    finally:
        await world.purge()
        await world.aclose()


async def test_remote_log_queue_stream(remote: TursoWorld) -> None:
    assert remote.settings()["mode"] == "remote"
    token = os.environ.get("WORKFLOW_TURSO_AUTH_TOKEN", "")
    if token:
        assert token not in repr(remote)
        assert token not in repr(remote.settings())
    log = remote.log
    assert await log.append("l", [NewEvent(data=b"\x00a", key="k1"), NewEvent(data=b"")]) == 2
    with pytest.raises(ConflictError) as conflict:
        await log.append("l", [NewEvent(data=b"x")], expect_tail=1)
    assert conflict.value.actual == 2
    with pytest.raises(DuplicateKeyError) as duplicate:
        await log.append("l", [NewEvent(data=b"y"), NewEvent(data=b"z", key="k1")])
    assert duplicate.value.existing.seq == 1
    assert [(e.seq, e.data) for e in await log.read("l")] == [(1, b"\x00a"), (2, b"")]

    await log.append(
        "l", [NewEvent(data=b"3")], messages=[OutboxMessage(queue="q", payload=b"from outbox")]
    )
    (lease,) = await remote.queue.claim("q", "w", lease=30)
    assert lease.payload == b"from outbox"
    renewed = await remote.queue.renew(lease, 60)
    assert renewed.deadline >= lease.deadline
    await remote.queue.ack(renewed)
    with pytest.raises(LeaseLostError):
        await remote.queue.ack(renewed)

    assert await remote.stream.write("s", [b"a", b"b"]) == 2
    await remote.stream.close("s")
    with anyio.fail_after(WAIT):
        chunks = [chunk.data async for chunk in remote.stream.read("s")]
    assert chunks == [b"a", b"b"]


async def test_remote_second_world_wakes_a_watcher(remote: TursoWorld) -> None:
    async with await connect(url=REMOTE, namespace=remote.namespace) as other:
        seen: list[bytes] = []

        async def watch() -> None:
            async for event in remote.log.watch("w"):
                seen.append(event.data)
                return

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                await other.log.append("w", [NewEvent(data=b"hello")])
        assert seen == [b"hello"]


async def test_embedded_replica(
    remote: TursoWorld, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Writes through a replica reach the server; the server's writes reach the replica."""
    monkeypatch.setenv("WORKFLOW_TURSO_REPLICA_PATH", str(tmp_path / "replica.db"))
    async with await connect(url=REMOTE, namespace=remote.namespace) as replica:
        assert replica.settings()["mode"] == "replica"
        await replica.log.append("r", [NewEvent(data=b"via replica")])
        assert [e.data for e in await remote.log.read("r")] == [b"via replica"]
        await remote.log.append("r", [NewEvent(data=b"via server")])
        seen: list[bytes] = []
        with anyio.fail_after(WAIT):
            async for event in replica.log.watch("r"):
                seen.append(event.data)
                if len(seen) == 2:
                    break
        assert seen == [b"via replica", b"via server"]
