"""Pipelining and merging of script calls (``world_redis._pipe``), on one server and on a
cluster (one pipe per primary).

These tests count commands through the pipe's own counters; they depend on asyncio's
scheduling order (tasks started together run in one turn of the event loop), never on timing.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from world_core import BackendUnavailableError, ClosedError, LeaseLostError
from world_redis import RedisWorld, connect
from world_redis._pipe import MAX_MERGED, Pipe, encode_command
from world_redis._scripts import Script

pytestmark = pytest.mark.anyio

WAIT = 20.0  # bound on any single wait; never an expectation


def _pipe(world: RedisWorld, queue: str = "q") -> Pipe:
    """The pipe that carries the script calls of ``queue`` (on a cluster: its node's)."""
    return world._conn._pipe_for(world._keys.queue(queue))


def _command(*words: str) -> bytes:
    return encode_command(b"", 0, list(words))


async def _warm(world: RedisWorld) -> None:
    """Load the queue scripts on the node of queue "q" (a fresh server answers NOSCRIPT once);
    leaves the queue empty."""
    await world.queue.enqueue("q", b"")
    (lease,) = await world.queue.claim("q", "w", lease=60)
    await world.queue.ack(lease)


async def test_concurrent_enqueues_and_acks_are_merged(rworld: RedisWorld) -> None:
    pipe, queue = _pipe(rworld), rworld.queue
    await _warm(rworld)
    payloads = [f"message {i}".encode() for i in range(40)]
    commands = pipe.commands
    with anyio.fail_after(WAIT):
        ids = await asyncio.gather(*(queue.enqueue("q", p) for p in payloads))
    # The first call goes alone; the other 39, made in the same turn, become one script call.
    assert pipe.commands - commands == 2
    assert len(set(ids)) == 40
    leases = await queue.claim("q", "w", lease=60, limit=100)
    assert {lease.message_id: lease.payload for lease in leases} == dict(
        zip(ids, payloads, strict=True)
    )
    commands = pipe.commands
    with anyio.fail_after(WAIT):
        await asyncio.gather(*(queue.ack(lease) for lease in leases))
    assert pipe.commands - commands == 2
    assert await queue.claim("q", "w", lease=60) == []


async def test_two_acks_of_one_lease_in_one_script_call(rworld: RedisWorld) -> None:
    pipe, queue = _pipe(rworld), rworld.queue
    await _warm(rworld)
    await queue.enqueue("q", b"job")
    (lease,) = await queue.claim("q", "w", lease=60)
    commands = pipe.commands
    with anyio.fail_after(WAIT):
        outcomes = await asyncio.gather(
            pipe.call(_command("PING")),  # goes alone: the two acks wait and merge
            queue.ack(lease),
            queue.ack(lease),
            return_exceptions=True,
        )
    assert pipe.commands - commands == 2, "the two acks did not share one script call"
    acks = outcomes[1:]
    assert acks.count(None) == 1, acks
    assert sum(isinstance(o, LeaseLostError) for o in acks) == 1, acks


async def test_one_dedup_key_twice_in_one_script_call(rworld: RedisWorld) -> None:
    pipe, queue = _pipe(rworld), rworld.queue
    await _warm(rworld)
    commands = pipe.commands
    with anyio.fail_after(WAIT):
        _, first, second, plain = await asyncio.gather(
            pipe.call(_command("PING")),
            queue.enqueue("q", b"first", dedup_key="k"),
            queue.enqueue("q", b"second", dedup_key="k"),
            queue.enqueue("q", b"plain"),
        )
    assert pipe.commands - commands == 2
    assert first == second != plain
    leases = await queue.claim("q", "w", lease=60, limit=10)
    assert [(lease.message_id, lease.payload) for lease in leases] == [
        (first, b"first"),
        (plain, b"plain"),
    ]


async def test_an_error_reply_fails_only_its_own_command(rworld: RedisWorld) -> None:
    pipe, queue = _pipe(rworld), rworld.queue
    with anyio.fail_after(WAIT):
        outcomes = await asyncio.gather(
            pipe.call(_command("PING")),
            pipe.call(_command("NO-SUCH-COMMAND")),
            queue.enqueue("q", b"a"),
            pipe.call(_command("ECHO", "after")),
            return_exceptions=True,
        )
    pong, error, message_id, echo = outcomes
    assert pong in (b"PONG", "PONG")
    assert isinstance(error, ResponseError)
    assert isinstance(message_id, str)
    assert echo == b"after"
    assert [lease.message_id for lease in await queue.claim("q", "w", lease=60)] == [message_id]


async def test_a_call_cancelled_before_it_was_sent_is_never_sent(rworld: RedisWorld) -> None:
    queue = rworld.queue
    first = asyncio.ensure_future(queue.enqueue("q", b"alone"))
    kept = asyncio.ensure_future(queue.enqueue("q", b"kept"))
    dropped = asyncio.ensure_future(queue.enqueue("q", b"dropped"))
    await asyncio.sleep(0)  # all three have run up to their wait; nothing pending was sent
    dropped.cancel()
    with anyio.fail_after(WAIT):
        await asyncio.gather(first, kept)
        with pytest.raises(asyncio.CancelledError):
            await dropped
    leases = await queue.claim("q", "w", lease=60, limit=10)
    assert sorted(lease.payload for lease in leases) == [b"alone", b"kept"]


async def test_dropped_connections_fail_their_calls_then_reconnect(rworld: RedisWorld) -> None:
    pipe, queue = _pipe(rworld), rworld.queue
    with anyio.fail_after(WAIT):
        ids = await asyncio.gather(
            pipe.call(_command("CLIENT", "ID")), pipe.call(_command("CLIENT", "ID"))
        )
    assert len(set(ids)) == 2, "a lone call and a batch use two connections"
    settings = pipe._settings
    admin: Any = Redis(host=settings["host"], port=settings["port"])
    try:
        for client_id in ids:
            await admin.execute_command("CLIENT", "KILL", "ID", client_id)
    finally:
        await admin.aclose()
    with anyio.fail_after(WAIT):
        outcomes = await asyncio.gather(
            *(queue.enqueue("q", b"%d" % i) for i in range(3)), return_exceptions=True
        )
    # A call sent on a dead connection fails; one that redis-py sees is dead reconnects first.
    assert any(isinstance(o, BackendUnavailableError) for o in outcomes), outcomes
    sent = [o for o in outcomes if isinstance(o, str)]
    assert all(isinstance(o, str | BackendUnavailableError) for o in outcomes), outcomes
    with anyio.fail_after(WAIT):
        again = await asyncio.gather(*(queue.enqueue("q", b"again") for _ in range(3)))
    leases = await queue.claim("q", "w", lease=60, limit=10)
    # Killed before anything was sent: a failed enqueue left nothing behind.
    assert sorted(lease.message_id for lease in leases) == sorted(sent + again)


async def test_close_fails_waiting_calls_with_closed_error(
    rworld: RedisWorld, any_url: str
) -> None:
    closing = await connect(url=any_url, namespace=rworld.namespace)  # rworld purges
    queue = closing.queue
    calls = [asyncio.ensure_future(queue.enqueue("q", b"%d" % i)) for i in range(4)]
    await asyncio.sleep(0)  # one call is on the wire, three wait
    await closing.aclose()
    with anyio.fail_after(WAIT):
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
    for outcome in outcomes:
        assert isinstance(outcome, str | ClosedError | BackendUnavailableError), outcome
    assert any(isinstance(o, ClosedError) for o in outcomes), outcomes
    with pytest.raises(ClosedError):
        await queue.enqueue("q", b"late")


async def test_many_calls_after_script_flush_share_one_load(rworld: RedisWorld) -> None:
    pipe, queue = _pipe(rworld), rworld.queue
    await _warm(rworld)
    await pipe.call(_command("SCRIPT", "FLUSH"))
    commands = pipe.commands
    with anyio.fail_after(WAIT):
        ids = await asyncio.gather(*(queue.enqueue("q", b"%d" % i) for i in range(10)))
    # The first alone and the other nine merged (both NOSCRIPT), one SCRIPT LOAD shared by all
    # ten, then the ten again as one merged call.
    assert pipe.commands - commands == 4
    assert len(set(ids)) == 10
    leases = await queue.claim("q", "w", lease=60, limit=20)
    assert sorted(lease.message_id for lease in leases) == sorted(ids)


async def test_a_script_flushed_between_its_load_and_the_retry_still_runs_each_call_once(
    rworld: RedisWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOSCRIPT, one shared SCRIPT LOAD, and the script is gone again before the calls are
    sent again (as when the server restarts in between): every call still runs, once."""
    pipe, queue = _pipe(rworld), rworld.queue
    await _warm(rworld)
    await pipe.call(_command("SCRIPT", "FLUSH"))
    load = rworld._conn._load
    flushed = False

    async def load_then_flush(loaded_on: Pipe, script: Script) -> None:
        nonlocal flushed
        await load(loaded_on, script)
        if not flushed:  # the first caller back from the load: its retry finds no script
            flushed = True
            await loaded_on.call(_command("SCRIPT", "FLUSH"))

    monkeypatch.setattr(rworld._conn, "_load", load_then_flush)
    with anyio.fail_after(WAIT):
        ids = await asyncio.gather(*(queue.enqueue("q", b"%d" % i) for i in range(10)))
    assert flushed
    assert len(set(ids)) == 10
    leases = await queue.claim("q", "w", lease=60, limit=20)
    assert sorted(lease.message_id for lease in leases) == sorted(ids)


async def test_a_merged_enqueue_leaves_one_wake_up_token_per_message(rworld: RedisWorld) -> None:
    # claim(wait=) blocks in BLPOP on the signal list; each token wakes one waiter, so a merged
    # enqueue of n messages must push n tokens (capped at 64), not one.
    pipe, queue = _pipe(rworld), rworld.queue
    await _warm(rworld)
    signal = rworld._keys.queue_signal("q")
    await pipe.call(_command("DEL", signal))
    commands = pipe.commands
    with anyio.fail_after(WAIT):
        await asyncio.gather(*(queue.enqueue("q", b"%d" % i) for i in range(6)))
    # At least one call merged several enqueues (typically one alone, then five merged; how
    # they split depends on when the pipe's writer runs, which load can shift: 4 seen in CI).
    assert 2 <= pipe.commands - commands < 6
    assert await pipe.call(_command("LLEN", signal)) == 6
    with anyio.fail_after(WAIT):
        await asyncio.gather(*(queue.enqueue("q", b"more") for _ in range(100)))
    assert await pipe.call(_command("LLEN", signal)) == 64


async def test_a_burst_is_split_into_bounded_script_calls(rworld: RedisWorld) -> None:
    pipe, queue = _pipe(rworld), rworld.queue
    await _warm(rworld)
    count = 2 * MAX_MERGED + 11
    commands = pipe.commands
    with anyio.fail_after(WAIT):
        ids = await asyncio.gather(*(queue.enqueue("q", b"%d" % i) for i in range(count)))
    assert pipe.commands - commands == 1 + 3  # one alone, then 256 + 256 + 10
    assert len(set(ids)) == count


async def test_cluster_redirection_is_followed(cluster_url: str) -> None:
    world = await connect(url=cluster_url, namespace=f"wrp_{secrets.token_hex(8)}")
    try:
        queue = world.queue
        first = await queue.enqueue("q", b"1")
        client = world._conn.main
        assert isinstance(client, RedisCluster)
        slot = client.keyslot(world._keys.queue("q")[0])
        right = client.nodes_manager.slots_cache[slot][0]
        wrong = next(node for node in client.get_primaries() if node.name != right.name)
        # A stale slot map, as after a resharding: the call reaches a node that answers MOVED.
        client.nodes_manager.slots_cache[slot] = [wrong]
        with anyio.fail_after(WAIT):
            second, third = await asyncio.gather(queue.enqueue("q", b"2"), queue.enqueue("q", b"3"))
        assert client.nodes_manager.slots_cache[slot][0].name == right.name, "map not updated"
        leases = await queue.claim("q", "w", lease=60, limit=10)
        ids = [lease.message_id for lease in leases]
        # second and third were enqueued concurrently: either may come first after the retry.
        assert ids[0] == first
        assert sorted(ids[1:]) == sorted([second, third])
    finally:
        await world.purge()
        await world.aclose()
