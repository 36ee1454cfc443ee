"""world_mongo specifics the conformance suite cannot see: settings, indexes, isolation,
the head/segment design under concurrency, polling bounds."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import subprocess
import sys
import textwrap
from typing import Any

import anyio
import pytest
from bson import ObjectId
from pymongo import AsyncMongoClient, MongoClient, monitoring

from world_core import ConfigurationError, NewEvent
from world_core.errors import ClosedError, DuplicateKeyError, PayloadTooLargeError, UnsupportedError
from world_core.spi import OutboxMessage
from world_mongo import MongoWorld, connect
from world_mongo._wakeup import Backoff, Notifier, follow_change_stream

pytestmark = pytest.mark.anyio


def fresh_namespace() -> str:
    return f"wm_{secrets.token_hex(8)}"


EXPECTED_INDEXES = {
    "log_heads": {"_id_", "status_id"},
    "log_segments": {"_id_", "gen_first", "gen_end", "owner_gen", "gen_keys"},
    "stream_segments": {"_id_", "gen_first", "gen_end", "owner_gen"},
    "queue": {"_id_", "claim_order", "dead_order", "live_dedup"},
}


# ------------------------------------------------------------------------------ settings


async def test_missing_url_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORKFLOW_MONGO_URL", raising=False)
    with pytest.raises(ConfigurationError, match="WORKFLOW_MONGO_URL"):
        await connect()


async def test_unusable_url_is_a_configuration_error_without_the_password() -> None:
    with pytest.raises(ConfigurationError) as caught:
        await connect(url="mongodb://user:s3cret@/no-host-here")
    assert "s3cret" not in str(caught.value)
    assert "url=" in str(caught.value)  # the source of the URL: the argument (world --url)


async def test_settings_and_repr_redact_credentials() -> None:
    url = "mongodb://alice:s3cret@127.0.0.1:1/appdb?authSource=admin"
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url, connect=False)
    world = MongoWorld(client, url=url, database="appdb", namespace="tenant_1", replica_set=False)
    try:
        settings = dict(world.settings())
        assert "s3cret" not in repr(settings)
        assert "s3cret" not in repr(world)
        assert settings["WORKFLOW_NAMESPACE"] == "tenant_1"
        assert settings["database"] == "appdb"
        assert settings["collection_prefix"] == "world.tenant_1."
        assert "alice" in settings["WORKFLOW_MONGO_URL"]
    finally:
        await world.aclose()


async def test_refused_credentials_are_a_configuration_error_without_the_password(
    mongo_url: str,
) -> None:
    host = mongo_url.split("://", 1)[1].split("/", 1)[0]
    with pytest.raises(ConfigurationError) as caught:
        await connect(url=f"mongodb://bob:s3cret@{host}/?serverSelectionTimeoutMS=5000")
    assert "s3cret" not in str(caught.value)


async def test_database_comes_from_the_url(mongo_url: str) -> None:
    base = mongo_url.rstrip("/")
    world = await connect(url=f"{base}/world_mongo_tests", namespace=fresh_namespace())
    try:
        assert world.settings()["database"] == "world_mongo_tests"
        await world.log.append("l", [NewEvent(data=b"x")])
        assert await world.log.tail("l") == 1
        await world.purge()
    finally:
        await world.aclose()


async def test_standalone_declares_polling_and_no_outbox(
    mongo_world: MongoWorld, mongo_url: str
) -> None:
    with MongoClient[dict[str, Any]](mongo_url, serverSelectionTimeoutMS=10_000) as client:
        hello = client.admin.command("hello")
    replica = bool(hello.get("setName")) or hello.get("msg") == "isdbgrid"
    assert mongo_world.capabilities.native_wakeups is replica
    assert mongo_world.capabilities.outbox is False
    with pytest.raises(UnsupportedError):
        await mongo_world.log.append(
            "l", [NewEvent(data=b"x")], messages=[OutboxMessage(queue="q", payload=b"m")]
        )
    assert await mongo_world.log.tail("l") == 0


# ------------------------------------------------------------------------------ indexes


_OPENER = textwrap.dedent(
    """
    import asyncio, sys
    from world_mongo import connect

    async def main() -> None:
        world = await connect(url=sys.argv[1], namespace=sys.argv[2])
        await world.stream.close("first write")  # makes the collections and indexes
        await world.aclose()
        print("wrote")

    asyncio.run(main())
    """
)


def _index_names(mongo_url: str, namespace: str) -> dict[str, set[str]]:
    with MongoClient[dict[str, Any]](mongo_url, serverSelectionTimeoutMS=10_000) as client:
        db = client["world"]
        return {
            kind: {ix["name"] for ix in db[f"world.{namespace}.{kind}"].list_indexes()}
            for kind in EXPECTED_INDEXES
        }


def test_many_processes_create_indexes_at_once(mongo_url: str) -> None:
    """Four processes write first to a fresh namespace at once: each makes the indexes."""
    namespace = fresh_namespace()
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _OPENER, mongo_url, namespace],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outcomes = [child.communicate(timeout=90) for child in children]
    for child, (out, err) in zip(children, outcomes, strict=True):
        assert child.returncode == 0, err
        assert out.strip() == "wrote"
    assert _index_names(mongo_url, namespace) == EXPECTED_INDEXES


async def test_reopening_keeps_the_same_indexes(mongo_url: str) -> None:
    namespace = fresh_namespace()
    for _ in range(2):
        world = await connect(url=mongo_url, namespace=namespace)
        await world.queue.enqueue("q", b"m")
        await world.aclose()
    assert _index_names(mongo_url, namespace) == EXPECTED_INDEXES


# ------------------------------------------------------------------------------ isolation


async def test_two_namespaces_are_isolated(mongo_url: str) -> None:
    a = await connect(url=mongo_url, namespace=fresh_namespace())
    b = await connect(url=mongo_url, namespace=fresh_namespace())
    try:
        await a.log.append("same", [NewEvent(data=b"a", key="k")], status="running")
        await a.queue.enqueue("same", b"a", dedup_key="d")
        await a.stream.write("same", [b"a"])
        assert await b.log.info("same") is None
        assert await b.log.get("same", "k") is None
        assert (await b.log.list_logs()).items == []
        assert await b.queue.claim("same", "w", lease=5) == []
        assert (await b.stream.info("same")).next_index == 0
        # The same dedup key in b is a new message, not a's.
        other = await b.queue.enqueue("same", b"b", dedup_key="d")
        await b.purge()
        assert await a.log.tail("same") == 1
        leases = await a.queue.claim("same", "w", lease=5)
        assert [lease.payload for lease in leases] == [b"a"]
        assert leases[0].message_id != other
        assert (await a.stream.info("same")).next_index == 1
    finally:
        await a.purge()
        await a.aclose()
        await b.aclose()


async def test_operator_like_names_are_data(mongo_world: MongoWorld) -> None:
    odd = ["$gt", "a.b", '{"$ne": 1}', "$where", "world.x.log_heads", "..", "ü/$"]
    for name in odd:
        await mongo_world.log.append(name, [NewEvent(data=name.encode(), key=name)], status=name)
        assert (await mongo_world.log.get(name, name)) is not None
        await mongo_world.queue.enqueue(name, name.encode(), dedup_key=name)
        await mongo_world.stream.write(name, [name.encode()])
    listed = [info.log_id for info in (await mongo_world.log.list_logs()).items]
    assert listed == sorted(odd)
    for name in odd:
        info = await mongo_world.log.info(name)
        assert info is not None
        assert info.status == name
        assert info.tail == 1
        leases = await mongo_world.queue.claim(name, name, lease=5)
        assert [lease.payload for lease in leases] == [name.encode()]
        assert (await mongo_world.stream.info(name)).next_index == 1
    assert (await mongo_world.log.list_logs(prefix="$")).items[0].log_id == "$gt"


# ------------------------------------------------------------------------------ log design


async def test_concurrent_appenders_on_two_clients_give_dense_contiguous_batches(
    mongo_world: MongoWorld, mongo_url: str
) -> None:
    other = await connect(url=mongo_url, namespace=mongo_world.namespace)
    batches: dict[str, int] = {}

    async def writer(w: MongoWorld, name: str) -> None:
        for i in range(4):
            size = 1 + (i % 3)
            events = [
                NewEvent(data=f"{name}/{i}/{j}".encode(), key=f"{name}/{i}/{j}")
                for j in range(size)
            ]
            tail = await w.log.append("shared", events)
            batches[f"{name}/{i}"] = tail

    try:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for n in range(3):
                    tg.start_soon(writer, mongo_world, f"a{n}")
                    tg.start_soon(writer, other, f"b{n}")
    finally:
        await other.aclose()
    events = await mongo_world.log.read("shared")
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert len(events) == 6 * (1 + 2 + 3 + 1)
    by_key = {e.key: e for e in events}
    for batch, tail in batches.items():
        members = sorted(
            (e for e in events if e.key is not None and e.key.startswith(batch + "/")),
            key=lambda e: e.seq,
        )
        # A batch is contiguous and ends at the tail its append returned.
        assert members[-1].seq == tail
        assert [e.seq for e in members] == list(range(tail - len(members) + 1, tail + 1))
        for e in members:
            assert by_key[e.key].data == (e.key or "").encode()


async def test_racing_the_same_key_lets_exactly_one_batch_in(mongo_world: MongoWorld) -> None:
    winners: list[int] = []
    losers: list[DuplicateKeyError] = []

    async def attempt(n: int) -> None:
        try:
            winners.append(
                await mongo_world.log.append(
                    "race", [NewEvent(data=f"{n}".encode()), NewEvent(data=b"k", key="k")]
                )
            )
        except DuplicateKeyError as exc:
            losers.append(exc)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for n in range(5):
                tg.start_soon(attempt, n)
    assert winners == [2]
    assert len(losers) == 4
    assert all(exc.existing.seq == 2 and exc.existing.key == "k" for exc in losers)
    assert await mongo_world.log.tail("race") == 2


async def test_segments_of_a_deleted_generation_stay_invisible(mongo_world: MongoWorld) -> None:
    await mongo_world.log.append("g", [NewEvent(data=b"old", key="k")])
    await mongo_world.log.append("g", [NewEvent(data=b"old2")])
    heads = mongo_world._collections["log_heads"]
    segments = mongo_world._collections["log_segments"]
    old = await heads.find_one({"_id": "g"})
    assert old is not None
    await mongo_world.log.delete("g")
    # What a writer that read the head before the delete would copy afterwards.
    await segments.insert_one(
        {"o": "g", "g": old["g"], "f": 0, "e": 1, "items": [{"d": b"old", "k": "k"}], "keys": ["k"]}
    )
    assert await mongo_world.log.info("g") is None
    assert await mongo_world.log.read("g") == []
    assert await mongo_world.log.append("g", [NewEvent(data=b"new", key="k")]) == 1
    events = await mongo_world.log.read("g")
    assert [(e.seq, e.data, e.key) for e in events] == [(1, b"new", "k")]
    assert old["g"] != (await heads.find_one({"_id": "g"}) or {}).get("g")
    assert isinstance(old["g"], ObjectId)


async def test_a_stale_remembered_head_costs_a_retry_never_a_wrong_answer(
    mongo_world: MongoWorld, mongo_url: str
) -> None:
    other = await connect(url=mongo_url, namespace=mongo_world.namespace)
    try:
        assert await mongo_world.log.append("s", [NewEvent(data=b"a1", key="k1")]) == 1
        # Another client deletes the log and starts it again with the same key.
        await other.log.delete("s")
        assert await other.log.append("s", [NewEvent(data=b"b1", key="k1")]) == 1
        assert await other.log.append("s", [NewEvent(data=b"b2")]) == 2
        # Our remembered head names the old generation: the key is judged on the new one.
        with pytest.raises(DuplicateKeyError) as caught:
            await mongo_world.log.append("s", [NewEvent(data=b"a2", key="k1")])
        assert caught.value.existing.data == b"b1"
        assert caught.value.existing.seq == 1
        assert await mongo_world.log.append("s", [NewEvent(data=b"a3")], expect_tail=2) == 3
        # Streams: a close by another client beats our remembered head.
        assert await mongo_world.stream.write("t", [b"x"]) == 1
        await other.stream.close("t")
        with pytest.raises(ClosedError):
            await mongo_world.stream.write("t", [b"y"])
    finally:
        await other.aclose()
    events = await mongo_world.log.read("s")
    assert [(e.seq, e.data) for e in events] == [(1, b"b1"), (2, b"b2"), (3, b"a3")]


async def test_reads_merge_the_inline_batch_with_segments(mongo_world: MongoWorld) -> None:
    for i in range(5):
        batch = [NewEvent(data=bytes([i]), key=f"k{i}"), NewEvent(data=b"")]
        await mongo_world.log.append("m", batch)
    # Four batches were copied to segments; the newest lives only in the head.
    assert await mongo_world._collections["log_segments"].count_documents({"o": "m"}) == 4
    assert [e.seq for e in await mongo_world.log.read("m", after=3, limit=4)] == [4, 5, 6, 7]
    assert [e.seq for e in await mongo_world.log.read("m", after=8)] == [9, 10]
    found = await mongo_world.log.get("m", "k4")
    assert found is not None
    assert found.seq == 9
    assert found.data == bytes([4])
    found = await mongo_world.log.get("m", "k0")
    assert found is not None
    assert found.seq == 1


async def test_a_batch_too_big_for_one_document_is_refused_before_io(
    mongo_world: MongoWorld,
) -> None:
    key = "k" * 500
    events = [NewEvent(data=b"", key=f"{key}{i}") for i in range(20_000)]
    with pytest.raises(PayloadTooLargeError):
        await mongo_world.log.append("big", events)
    assert await mongo_world.log.info("big") is None


# ------------------------------------------------------------------------------ waiting


def test_backoff_grows_to_its_cap_and_resets() -> None:
    backoff = Backoff(0.01, 0.5)
    values = [backoff.next() for _ in range(12)]
    assert all(0.01 <= v <= 0.5 for v in values)
    # Doubling (jitter takes off at most 10 %) until the cap, then at the cap.
    assert values[:7] == sorted(values[:7])
    assert values[0] < 0.02
    assert values[5] > 0.28
    assert all(0.45 <= v <= 0.5 for v in values[6:])
    backoff.reset()
    assert backoff.next() < 0.02
    with pytest.raises(ValueError, match="minimum"):
        Backoff(0.0, 1.0)


class _CountFindAndModify(monitoring.CommandListener):
    def __init__(self, collection: str) -> None:
        self.collection = collection
        self.count = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "findAndModify" and event.command.get("findAndModify") == (
            self.collection
        ):
            self.count += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


async def test_an_idle_claim_polls_a_bounded_number_of_times(mongo_url: str) -> None:
    namespace = fresh_namespace()
    listener = _CountFindAndModify(f"world.{namespace}.queue")
    monitoring.register(listener)  # global: applies to clients created from now on
    world = await connect(url=mongo_url, namespace=namespace)
    try:
        assert await world.queue.claim("idle", "w", lease=5, wait=1.5) == []
    finally:
        await world.aclose()
    # Backoff 10 ms doubling to 500 ms (jitter up to 10 % shorter): at most 11 polls in
    # 1.5 s however fast the server is; a slower machine only polls less. A tight loop would
    # poll hundreds of times.
    assert 1 <= listener.count <= 12


async def test_a_write_in_this_process_wakes_waiters_of_another_world(
    mongo_world: MongoWorld, mongo_url: str
) -> None:
    other = await connect(url=mongo_url, namespace=mongo_world.namespace)
    try:
        assert other.notifier is mongo_world.notifier
        with mongo_world.notifier.subscribe("queue", "wake") as sub:
            await other.queue.enqueue("wake", b"x")
            assert await sub.wait(20) is True
        with mongo_world.notifier.subscribe("log", "wake") as sub:
            await other.log.append("wake", [NewEvent(data=b"x")])
            assert await sub.wait(20) is True
        with mongo_world.notifier.subscribe("stream", "wake") as sub:
            await other.stream.write("wake", [b"x"])
            assert await sub.wait(20) is True
        with mongo_world.notifier.subscribe("stream", "quiet") as sub:
            assert await sub.wait(0.05) is False
    finally:
        await other.aclose()


async def test_change_stream_relay_wakes_waiters_or_falls_back_to_polling(
    mongo_world: MongoWorld, mongo_url: str
) -> None:
    with MongoClient[dict[str, Any]](mongo_url, serverSelectionTimeoutMS=10_000) as client:
        hello = client.admin.command("hello")
    replica = bool(hello.get("setName")) or hello.get("msg") == "isdbgrid"
    heads = mongo_world._collections["log_heads"]
    notifier = Notifier()  # not the shared one: only the relay can wake this waiter
    states: list[bool] = []
    opened = asyncio.Event()

    def live(state: bool) -> None:
        states.append(state)
        if state:
            opened.set()

    relay = asyncio.create_task(
        follow_change_stream(mongo_world._db, {heads.name: "log"}, notifier, live)
    )
    try:
        with notifier.subscribe("log", "cs-probe") as sub:
            if replica:
                with anyio.fail_after(20):
                    await opened.wait()
                # A write no World made: only the change stream can report it.
                await heads.insert_one({"_id": "cs-probe", "n": 0})
            # Standalone: the relay fails to open, says so, and wakes every waiter once so
            # that nothing is missed while it retries.
            assert await sub.wait(20) is True
        assert states[-1] is replica
        assert not relay.done()
    finally:
        relay.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await relay
