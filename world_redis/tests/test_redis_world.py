"""RedisWorld on one server and on a three-master cluster: what is specific to Redis (key
encoding, scripts, wake-ups, registry, capabilities), plus the core contracts in brief until
the conformance suite runs them all."""

from __future__ import annotations

import secrets
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis

from world_core import (
    BackendUnavailableError,
    ClosedError,
    ConfigurationError,
    ConflictError,
    DuplicateKeyError,
    InvalidArgumentError,
    InvalidIdentifierError,
    LeaseLostError,
    NewEvent,
    NotFoundError,
    OutboxMessage,
    UnsupportedError,
    WorldError,
)
from world_redis import RedisWorld, connect
from world_redis import _scripts as S

pytestmark = pytest.mark.anyio


def new_namespace() -> str:
    return f"wrt_{secrets.token_hex(8)}"


WAIT = 20.0  # bound on any single wait; never an expectation

TRICKY_IDS = [
    "a",
    "a}",
    "{a",
    "{a}",
    "}{",
    "a:b",
    "a:b}:x",
    "world:default:log:{61}:x",
    "*?[]",
    "'; DROP TABLE x; --",
    "../..",
    "$where",
    "日本語 🙂",
    "x" * 512,
]


async def test_tricky_ids_are_data_and_never_collide(rworld: RedisWorld) -> None:
    for i, log_id in enumerate(TRICKY_IDS):
        assert await rworld.log.append(log_id, [NewEvent(data=str(i).encode(), key=log_id)]) == 1
    for i, log_id in enumerate(TRICKY_IDS):
        events = await rworld.log.read(log_id)
        assert [(e.seq, e.data, e.key) for e in events] == [(1, str(i).encode(), log_id)]
        await rworld.queue.enqueue(log_id, str(i).encode(), dedup_key=log_id)
        await rworld.stream.write(log_id, [str(i).encode()])
    for i, queue in enumerate(TRICKY_IDS):
        (lease,) = await rworld.queue.claim(queue, "w", lease=30)
        assert lease.payload == str(i).encode()
        await rworld.queue.ack(lease)
        assert (await rworld.stream.info(queue)).next_index == 1
    page = await rworld.log.list_logs(limit=1000)
    assert [info.log_id for info in page.items] == sorted(TRICKY_IDS)


async def test_identifier_too_long_is_refused_before_io(rworld: RedisWorld) -> None:
    with pytest.raises(InvalidIdentifierError):
        await rworld.log.append("x" * 513, [NewEvent(data=b"")])
    with pytest.raises(InvalidIdentifierError):
        await rworld.queue.enqueue("a\x00b", b"")
    assert (await rworld.log.list_logs()).items == []


async def test_append_cas_keys_status_in_one_script(rworld: RedisWorld) -> None:
    log = rworld.log
    assert await log.append("l", [NewEvent(data=b"\x00", key="k"), NewEvent(data=b"")]) == 2
    with pytest.raises(ConflictError) as conflict:
        await log.append("l", [NewEvent(data=b"x", key="k")], expect_tail=1)
    assert conflict.value.actual == 2
    with pytest.raises(DuplicateKeyError) as dup:
        await log.append("l", [NewEvent(data=b"new", key="n"), NewEvent(data=b"x", key="k")])
    assert dup.value.existing.seq == 1
    assert dup.value.existing.data == b"\x00"
    assert await log.get("l", "n") is None  # nothing of the refused batch was written
    assert await log.append("l", [NewEvent(data=b"y")], expect_tail=2, status="done") == 3
    info = await log.info("l")
    assert info is not None
    assert (info.tail, info.status) == (3, "done")
    assert [e.seq for e in await log.read("l", after=1, limit=1)] == [2]
    await log.delete("l")
    assert await log.info("l") is None
    assert await log.append("l", [NewEvent(data=b"again", key="k")]) == 1


async def test_list_logs_prefix_status_and_cursor(rworld: RedisWorld) -> None:
    log = rworld.log
    for name in ["a/1", "a/2", "a/3", "a/4", "b/1"]:
        await log.append(name, [NewEvent(data=b"")], status="odd" if name[-1] in "13" else None)
    await log.append("a/2", [NewEvent(data=b"")], status="even")
    await log.append("a/1", [NewEvent(data=b"")], status="odd")  # same status again
    first = await log.list_logs(prefix="a/", limit=3)
    assert [i.log_id for i in first.items] == ["a/1", "a/2", "a/3"]
    assert first.next_cursor is not None
    second = await log.list_logs(prefix="a/", limit=3, cursor=first.next_cursor)
    assert [i.log_id for i in second.items] == ["a/4"]
    assert second.next_cursor is None
    odd = await log.list_logs(status="odd")
    assert [(i.log_id, i.tail) for i in odd.items] == [("a/1", 2), ("a/3", 1), ("b/1", 1)]
    assert [i.log_id for i in (await log.list_logs(status="even")).items] == ["a/2"]
    await log.append("a/2", [NewEvent(data=b"")], status="odd")
    assert [i.log_id for i in (await log.list_logs(status="even")).items] == []
    await log.delete("a/1")
    assert [i.log_id for i in (await log.list_logs(status="odd", limit=1)).items] == ["a/2"]


async def test_noscript_after_script_flush_falls_back_to_eval(rworld: RedisWorld) -> None:
    await rworld.log.append("l", [NewEvent(data=b"1")])
    client: Any = rworld._conn.main
    if rworld.cluster:
        await client.execute_command("SCRIPT FLUSH", target_nodes="all")
    else:
        await client.execute_command("SCRIPT", "FLUSH")
    assert await rworld.log.append("l", [NewEvent(data=b"2")]) == 2
    await rworld.queue.enqueue("q", b"m")
    assert len(await rworld.queue.claim("q", "w", lease=5)) == 1


async def test_lease_fencing_expiry_and_dead_letters(rworld: RedisWorld) -> None:
    queue = rworld.queue
    message_id = await queue.enqueue("q", b"p", max_attempts=2)
    (first,) = await queue.claim("q", "w1", lease=0.05)
    assert (first.attempt, first.max_attempts) == (1, 2)

    with anyio.fail_after(WAIT):
        while not (second := await queue.claim("q", "w2", lease=30, wait=1)):
            pass
    assert second[0].attempt == 2
    assert second[0].token != first.token
    with pytest.raises(LeaseLostError):
        await queue.ack(first)
    with pytest.raises(LeaseLostError):
        await queue.renew(first, 10)
    await queue.release(second[0])  # second delivery of two: dead-lettered
    (dead,) = await queue.dead_letters("q")
    assert (dead.message_id, dead.attempts, dead.payload) == (message_id, 2, b"p")
    assert dead.reason
    with pytest.raises(LeaseLostError):
        await queue.release(second[0])
    await queue.requeue("q", message_id)
    with pytest.raises(NotFoundError):
        await queue.requeue("q", message_id)
    (again,) = await queue.claim("q", "w3", lease=30)
    assert (again.message_id, again.attempt) == (message_id, 1)
    assert await queue.dead_letters("q") == []


async def test_renew_after_deadline_until_claimed_again(rworld: RedisWorld) -> None:
    queue = rworld.queue
    await queue.enqueue("q", b"p")
    (lease,) = await queue.claim("q", "w", lease=0.01)
    await anyio.sleep(0.05)  # let the deadline pass; no assertion on time
    # Nobody claimed it since, so the token is still current: renew succeeds.
    renewed = await queue.renew(lease, 30)
    assert renewed.deadline > lease.deadline
    assert await queue.claim("q", "w2", lease=30) == []  # renewed, so not visible
    await queue.ack(renewed)


async def test_dedup_key_until_acked(rworld: RedisWorld) -> None:
    queue = rworld.queue
    first = await queue.enqueue("q", b"1", dedup_key="d")
    assert await queue.enqueue("q", b"2", dedup_key="d") == first
    await queue.enqueue("other", b"3", dedup_key="d")  # dedup keys are per queue
    assert [lease.payload for lease in await queue.claim("other", "w", lease=30)] == [b"3"]
    (lease,) = await queue.claim("q", "w", lease=30)
    assert await queue.enqueue("q", b"4", dedup_key="d") == first  # leased is still live
    await queue.ack(lease)
    assert await queue.enqueue("q", b"5", dedup_key="d") != first


async def test_claim_wait_is_woken_by_enqueue_from_another_connection(
    rworld: RedisWorld, any_url: str
) -> None:
    other = await connect(url=any_url, namespace=rworld.namespace)
    try:
        got: list[bytes] = []

        async def waiter() -> None:
            leases = await rworld.queue.claim("q", "w", lease=30, wait=WAIT)
            got.extend(lease.payload for lease in leases)

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter)
                await anyio.sleep(0.1)
                await other.queue.enqueue("q", b"wake")
        assert got == [b"wake"]
    finally:
        await other.aclose()


async def test_claims_waiting_on_one_queue_share_one_blocking_connection(
    rworld: RedisWorld,
) -> None:
    """150 claims of one World asleep on one queue (more than redis-py's default pool of
    100) take turns on one BLPOP instead of a connection each; 150 enqueues wake all of them,
    each with a message of its own."""
    got: list[bytes] = []

    async def waiter() -> None:
        leases = await rworld.queue.claim("q", "w", lease=30, wait=WAIT)
        got.extend(lease.payload for lease in leases)

    # why: private, the test counts the claims asleep on the queue
    sleepers = rworld.queue._sleepers  # type: ignore[attr-defined]
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            for _ in range(150):
                tg.start_soon(waiter)
            while sum(entry.count for entry in sleepers.values()) < 150:  # noqa: ASYNC110
                await anyio.sleep(0.01)
            if not rworld.cluster:
                blocking: Any = rworld._conn.blocking
                pool = blocking.connection_pool
                assert len(pool._in_use_connections) == 1
            for i in range(150):
                await rworld.queue.enqueue("q", str(i).encode())
    assert sorted(got) == sorted(str(i).encode() for i in range(150))
    assert sleepers == {}


async def test_delayed_message_becomes_visible(rworld: RedisWorld) -> None:
    await rworld.queue.enqueue("q", b"later", delay=0.2)
    await rworld.queue.enqueue("q", b"now")
    (now,) = await rworld.queue.claim("q", "w", lease=30, limit=10)
    assert now.payload == b"now"
    with anyio.fail_after(WAIT):
        (later,) = await rworld.queue.claim("q", "w", lease=30, wait=WAIT)
    assert later.payload == b"later"


async def test_watch_and_stream_read_wake_on_write(rworld: RedisWorld) -> None:
    seen: list[int] = []
    chunks: list[bytes] = []

    async def watcher() -> None:
        async for event in rworld.log.watch("l"):
            seen.append(event.seq)
            if event.seq == 3:
                return

    async def reader() -> None:
        async for chunk in rworld.stream.read("s", start=5):  # beyond the tail
            chunks.append(chunk.data)

    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(watcher)
            tg.start_soon(reader)
            await anyio.sleep(0.05)
            await rworld.log.append("l", [NewEvent(data=b"1")])
            await rworld.log.append("l", [NewEvent(data=b"2"), NewEvent(data=b"3")])
            await rworld.stream.write("s", [b"0", b"1"])
            await rworld.stream.close("s")  # the reader ends even though it never got a chunk
    assert seen == [1, 2, 3]
    assert chunks == []


async def test_stream_cas_close_and_negative_start(rworld: RedisWorld) -> None:
    stream = rworld.stream
    assert await stream.write("s", [b"a", b"", b"\x00"]) == 3
    with pytest.raises(ConflictError) as conflict:
        await stream.write("s", [b"x"], expect_next=2)
    assert conflict.value.actual == 3
    await stream.close("s")
    await stream.close("s")
    with pytest.raises(ClosedError):
        await stream.write("s", [b"x"], expect_next=3)
    with anyio.fail_after(WAIT):
        tail = [c async for c in stream.read("s", start=-2)]
    assert [(c.index, c.data) for c in tail] == [(1, b""), (2, b"\x00")]
    await stream.delete("s")
    info = await stream.info("s")
    assert (info.next_index, info.closed) == (0, False)


async def test_outbox_is_atomic_on_a_single_node_only(rworld: RedisWorld) -> None:
    message = OutboxMessage(queue="jobs", payload=b"go", dedup_key="once")
    if rworld.cluster:
        assert not rworld.capabilities.outbox
        with pytest.raises(UnsupportedError):
            await rworld.log.append("l", [NewEvent(data=b"x")], messages=[message])
        assert await rworld.log.info("l") is None
        return
    assert rworld.capabilities.outbox
    await rworld.log.append("l", [NewEvent(data=b"x", key="k")], messages=[message])
    # The batch is refused whole (duplicate key): the outbox message is not enqueued twice.
    with pytest.raises(DuplicateKeyError):
        await rworld.log.append(
            "l",
            [NewEvent(data=b"y", key="k")],
            messages=[OutboxMessage(queue="jobs", payload=b"2")],
        )
    leases = await rworld.queue.claim("jobs", "w", lease=30, limit=10)
    assert [lease.payload for lease in leases] == [b"go"]


async def test_namespaces_are_isolated_and_purge_is_scoped(
    rworld: RedisWorld, any_url: str
) -> None:
    other = await connect(url=any_url, namespace=new_namespace())
    try:
        await rworld.log.append("l", [NewEvent(data=b"mine")])
        await other.log.append("l", [NewEvent(data=b"theirs")])
        await other.queue.enqueue("q", b"theirs")
        assert await rworld.queue.claim("q", "w", lease=1) == []
        await rworld.purge()
        assert await rworld.log.info("l") is None
        assert [e.data for e in await other.log.read("l")] == [b"theirs"]
    finally:
        await other.purge()
        await other.aclose()


async def test_cluster_registry_is_repaired_by_the_next_append(cluster_url: str) -> None:
    rworld = await connect(url=cluster_url, namespace=new_namespace())
    try:
        await _registry_repair(rworld)
    finally:
        await rworld.purge()
        await rworld.aclose()


async def _registry_repair(rworld: RedisWorld) -> None:
    assert rworld.cluster
    # An append whose process died after the commit and before the registry write:
    keys = list(rworld._keys.log("lost"))
    reply = await rworld._conn.run(S.APPEND, keys, ["", "", "lost", 1, "", b"x"])
    assert reply[0] == b"ok"
    assert (await rworld.log.list_logs()).items == []
    await rworld.log.append("lost", [NewEvent(data=b"y")])
    assert [i.log_id for i in (await rworld.log.list_logs()).items] == ["lost"]
    # A deleted log's registry entry is never listed, even if its removal was lost.
    await rworld._conn.run(S.LOG_DELETE, keys, ["lost", 0])
    assert (await rworld.log.list_logs()).items == []


async def test_cluster_url_is_detected_from_a_plain_node_url(cluster_url: str) -> None:
    plain = cluster_url.replace("redis+cluster://", "redis://")
    world = await connect(url=plain, namespace=new_namespace())
    try:
        assert world.cluster
        assert not world.capabilities.outbox
    finally:
        await world.aclose()


async def test_settings_and_errors_never_show_the_password(
    monkeypatch: pytest.MonkeyPatch, durable_server: Any
) -> None:
    single_url = durable_server.url
    setup: Any = Redis.from_url(single_url)
    try:
        await setup.execute_command(
            "ACL", "SETUSER", "alice", "on", ">hunter2", "~*", "&*", "+@all"
        )
    finally:
        await setup.aclose()
    monkeypatch.delenv("WORKFLOW_REDIS_URL", raising=False)
    with pytest.raises(ConfigurationError, match="WORKFLOW_REDIS_URL"):
        await connect()
    with pytest.raises(ConfigurationError) as bad:
        await connect(url="http://user:hunter2@host/0")
    assert "hunter2" not in str(bad.value)
    with pytest.raises(InvalidIdentifierError):
        await connect(url=single_url, namespace="Bad-Namespace")
    with pytest.raises(WorldError) as denied:
        await connect(url=single_url.replace("redis://", "redis://alice:wrong@"))
    assert "wrong" not in str(denied.value)
    world = await connect(url=single_url.replace("redis://", "redis://alice:hunter2@"))
    try:
        assert world.settings()["url"].count("hunter2") == 0
        assert "hunter2" not in repr(world)
    finally:
        await world.aclose()
    with pytest.raises(ClosedError):
        await world.log.tail("l")


async def test_bad_arguments_write_nothing(rworld: RedisWorld) -> None:
    with pytest.raises(InvalidArgumentError):
        await rworld.log.read("l", after=-1)
    with pytest.raises(InvalidArgumentError):
        await rworld.queue.claim("q", "w", lease=0)
    with pytest.raises(InvalidArgumentError):
        await rworld.log.list_logs(cursor="a\x00b")
    keys = await rworld._conn.command("KEYS", rworld._keys.pattern) if not rworld.cluster else []
    assert keys == []


async def _writes_cut_by_close(world: RedisWorld, run: int) -> tuple[set[str], list[str]]:
    """8 tasks writing (half enqueue with a dedup key, half write a chunk to a stream of their
    own) until ``world`` is closed: the writes that raised ClosedError, and any error other
    than BackendUnavailableError (an outcome unknown: either way is right)."""
    closed: set[str] = set()
    others: list[str] = []

    async def writer(task: int) -> None:
        for n in range(100_000):
            key = f"{run}-{task}-{n}"
            try:
                if task % 2:
                    await world.stream.write(f"s-{run}-{task}", [key.encode()])
                else:
                    await world.queue.enqueue(f"q-{run}", key.encode(), dedup_key=key)
            except ClosedError:
                closed.add(key)
                return
            except BackendUnavailableError:
                return
            except WorldError as exc:
                others.append(f"{key}: {type(exc).__name__}: {exc}")
                return

    async with anyio.create_task_group() as group:
        for task in range(8):
            group.start_soon(writer, task)
        await anyio.sleep(0.05 + 0.05 * run)
        await world.aclose()
    return closed, others


async def test_writes_cut_off_by_aclose_never_raise_closed_error_yet_take_effect(
    rworld: RedisWorld, any_url: str
) -> None:
    """Enqueues and stream writes on the wire when their World closes: each returns, raises
    ClosedError (it wrote nothing) or BackendUnavailableError (the outcome unknown); one that
    took effect never raised ClosedError (the SPI's ``World.aclose``). Appends have their own
    contract (test_world_aclose_during_appends_tells_no_lie)."""
    for run in range(3):  # the close lands at a different moment each time
        closing = await connect(url=any_url, namespace=rworld.namespace)
        await closing.log.tail("warm")  # connected before the writers start
        with anyio.fail_after(WAIT):
            closed, others = await _writes_cut_by_close(closing, run)
        written: set[str] = set()
        for task in range(1, 8, 2):
            chunks = (await rworld.stream.info(f"s-{run}-{task}")).next_index
            written |= {f"{run}-{task}-{n}" for n in range(chunks)}
        with anyio.fail_after(WAIT):
            while leases := await rworld.queue.claim(f"q-{run}", "t", lease=60.0, limit=100):
                written |= {lease.payload.decode() for lease in leases}
        assert not others, f"writes cut off by aclose raised: {others[:5]}"
        lies = sorted(closed & written)
        assert not lies, f"raised ClosedError yet written (run {run}): {lies}"
