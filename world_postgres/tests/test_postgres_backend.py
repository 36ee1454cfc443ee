"""world_postgres beyond the conformance suite: settings, migrations under concurrency,
namespaces, purge, seq races, NOTIFY wake-ups across processes, outbox atomicity."""

from __future__ import annotations

import contextlib
import itertools
import json
import secrets
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import asyncpg
import pytest

import world_postgres._wait
from world_core import (
    BackendUnavailableError,
    ClosedError,
    ConfigurationError,
    ConflictError,
    DuplicateKeyError,
    Lease,
    LeaseLostError,
    NewEvent,
    OutboxMessage,
)
from world_postgres import PostgresWorld, connect
from world_postgres._db import Database, tag, tag_key
from world_postgres._log import _BATCHES, PostgresLog
from world_postgres._queue import PostgresQueue
from world_postgres._schema import MIGRATIONS

pytestmark = pytest.mark.anyio


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


CHILD = str(Path(__file__).with_name("pg_child.py"))
WAIT = 30.0


# --------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------


async def test_missing_url_names_both_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORKFLOW_POSTGRES_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with pytest.raises(ConfigurationError, match=r"WORKFLOW_POSTGRES_URL.*DATABASE_URL"):
        await connect()


async def test_database_url_is_the_fallback(monkeypatch: pytest.MonkeyPatch, pg_url: str) -> None:
    monkeypatch.delenv("WORKFLOW_POSTGRES_URL", raising=False)
    monkeypatch.setenv("DATABASE_URL", pg_url)
    pg_world = await connect(namespace=fresh_namespace())
    try:
        assert await pg_world.log.append("l", [NewEvent(data=b"a")]) == 1
    finally:
        await pg_world.purge()
        await pg_world.aclose()


@pytest.mark.parametrize("url", ["mysql://u@h/db", "127.0.0.1:5432", "redis://x"])
async def test_url_that_is_not_postgres_is_refused(url: str) -> None:
    with pytest.raises(ConfigurationError, match="postgresql://"):
        await connect(url=url)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://postgres:s3cret-Pa55@[::1/postgres",  # an IPv6 host never closed
        "postgresql://postgres:s3cret-Pa55@]x[/postgres",
        "postgresql://postgres:s3cret-Pa55@127.0.0.1:abc/postgres",  # a port that is no number
        "postgresql://postgres:s3cret-Pa55@127.0.0.1:99999/postgres",  # past 65535
    ],
)
async def test_malformed_url_is_a_setting_error_that_hides_the_password(url: str) -> None:
    """Each raised ValueError or OverflowError as a traceback before (world sessions too)."""
    with anyio.fail_after(WAIT), pytest.raises(ConfigurationError, match="url=") as caught:
        await connect(url=url)
    assert "s3cret-Pa55" not in str(caught.value)


@pytest.mark.parametrize("value", ["0", "-3", "ten"])
async def test_bad_pool_size_is_refused(
    monkeypatch: pytest.MonkeyPatch, pg_url: str, value: str
) -> None:
    monkeypatch.setenv("WORKFLOW_POSTGRES_POOL_SIZE", value)
    with pytest.raises(ConfigurationError, match="WORKFLOW_POSTGRES_POOL_SIZE"):
        await connect(url=pg_url)


async def test_password_never_shown(monkeypatch: pytest.MonkeyPatch, pg_url: str) -> None:
    secret = "s3cret-Pa55"
    # The local server trusts every password, so the URL with one connects.
    with_password = pg_url.replace("postgresql://postgres@", f"postgresql://postgres:{secret}@")
    assert secret in with_password
    pg_world = await connect(url=with_password, namespace=fresh_namespace())
    try:
        assert secret not in repr(pg_world)
        assert all(secret not in value for value in pg_world.settings().values())
        assert pg_world.settings()["schema"] == f"world_{pg_world.namespace}"
    finally:
        await pg_world.purge()
        await pg_world.aclose()
    monkeypatch.setenv("WORKFLOW_POSTGRES_RETRY_SECONDS", "0.3")
    monkeypatch.setenv("WORKFLOW_POSTGRES_CONNECT_TIMEOUT", "1")
    closed_port = f"postgresql://postgres:{secret}@127.0.0.1:1/postgres"
    with pytest.raises(BackendUnavailableError) as caught:
        await connect(url=closed_port)
    assert secret not in str(caught.value)


async def test_sqlalchemy_style_url_is_accepted(pg_url: str) -> None:
    url = pg_url.replace("postgresql://", "postgresql+asyncpg://", 1)
    pg_world = await connect(url=url, namespace=fresh_namespace())
    try:
        assert pg_world.capabilities.outbox
        assert pg_world.capabilities.native_wakeups
    finally:
        await pg_world.purge()
        await pg_world.aclose()


async def test_closed_world_refuses_calls(pg_world: PostgresWorld, pg_url: str) -> None:
    other = await connect(url=pg_url, namespace=pg_world.namespace)
    await other.aclose()
    await other.aclose()  # idempotent
    with pytest.raises(Exception, match="closed") as caught:
        await other.log.tail("l")
    assert type(caught.value).__name__ == "ClosedError"


# --------------------------------------------------------------------------------------------
# Migrations, namespaces, purge
# --------------------------------------------------------------------------------------------


async def test_concurrent_migrations_from_processes(pg_url: str, tmp_path: Path) -> None:
    namespace = fresh_namespace()
    go = tmp_path / "go"

    def run_children() -> list[tuple[int, bytes, bytes]]:
        children = [
            subprocess.Popen(
                [sys.executable, CHILD, pg_url, namespace, "open-append", "m", str(go)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for _ in range(6)
        ]
        go.touch()  # every child opens the fresh namespace and makes its schema at once
        outputs = [child.communicate(timeout=WAIT) for child in children]
        return [(c.returncode, out, err) for c, (out, err) in zip(children, outputs, strict=True)]

    results = await anyio.to_thread.run_sync(run_children)
    for code, _, err in results:
        assert code == 0, err.decode()
    assert sorted(int(out) for _, out, _ in results) == [1, 2, 3, 4, 5, 6]
    conn = await asyncpg.connect(pg_url)
    try:
        versions = await conn.fetch(f'SELECT version FROM "world_{namespace}".migrations')
        assert sorted(r[0] for r in versions) == list(range(1, len(MIGRATIONS) + 1))
        await conn.execute(f'DROP SCHEMA "world_{namespace}" CASCADE')
    finally:
        await conn.close()


async def test_two_namespaces_do_not_see_each_other(pg_world: PostgresWorld, pg_url: str) -> None:
    other = await connect(url=pg_url, namespace=fresh_namespace())
    try:
        await pg_world.log.append("same", [NewEvent(data=b"a", key="k")], status="s")
        await pg_world.queue.enqueue("q", b"m", dedup_key="d")
        await pg_world.stream.write("st", [b"c"])
        assert await other.log.info("same") is None
        assert await other.log.get("same", "k") is None
        assert (await other.log.list_logs()).items == []
        assert await other.queue.claim("q", "w", lease=5) == []
        assert (await other.stream.info("st")).next_index == 0
        # The same key and dedup key are free in the other namespace.
        await other.log.append("same", [NewEvent(data=b"b", key="k")])
        other_id = await other.queue.enqueue("q", b"n", dedup_key="d")
        assert other_id != await pg_world.queue.enqueue("q", b"x", dedup_key="d")
        await other.purge()
        assert [e.data for e in await pg_world.log.read("same")] == [b"a"]
        assert len(await pg_world.queue.claim("q", "w", lease=5, limit=10)) == 1
        assert (await pg_world.stream.info("st")).next_index == 1
    finally:
        await other.purge()
        await other.aclose()


async def test_purge_is_seen_by_another_world_of_the_namespace(
    pg_world: PostgresWorld, pg_url: str
) -> None:
    other = await connect(url=pg_url, namespace=pg_world.namespace)
    try:
        await other.log.append("l", [NewEvent(data=b"old")])
        await pg_world.purge()
        # The other World reads the namespace as empty; its next write recreates the schema.
        assert await other.log.tail("l") == 0
        assert await other.log.append("l", [NewEvent(data=b"new")]) == 1
        assert [e.data for e in await pg_world.log.read("l")] == [b"new"]
    finally:
        await other.aclose()


async def test_identifiers_stay_data(pg_world: PostgresWorld) -> None:
    nasty = "x'; DROP SCHEMA public CASCADE; --\"$1 {}*:../\u00e9\U0001f600"
    await pg_world.log.append(nasty, [NewEvent(data=b"a", key=nasty)], status=nasty[:60])
    await pg_world.queue.enqueue(nasty, b"m", dedup_key=nasty)
    await pg_world.stream.write(nasty, [b"c"])
    assert (await pg_world.log.get(nasty, nasty)) is not None
    assert [i.log_id for i in (await pg_world.log.list_logs(prefix="x'")).items] == [nasty]
    assert len(await pg_world.queue.claim(nasty, nasty, lease=5)) == 1
    assert (await pg_world.stream.info(nasty)).next_index == 1


# --------------------------------------------------------------------------------------------
# Log races
# --------------------------------------------------------------------------------------------


async def test_concurrent_appenders_across_pools_stay_dense(
    pg_world: PostgresWorld, pg_url: str
) -> None:
    others = [await connect(url=pg_url, namespace=pg_world.namespace) for _ in range(2)]
    worlds = [pg_world, *others]
    acknowledged: dict[int, bytes] = {}

    async def appender(w: PostgresWorld, name: str) -> None:
        for n in range(15):
            size = 1 + n % 3
            batch = [NewEvent(data=f"{name}/{n}/{i}".encode()) for i in range(size)]
            tail = await w.log.append("race", batch)
            for i, event in enumerate(batch):
                acknowledged[tail - size + 1 + i] = event.data

    try:
        async with anyio.create_task_group() as tg:
            for index, w in enumerate(worlds):
                for task in range(3):
                    tg.start_soon(appender, w, f"{index}.{task}")
        events = await pg_world.log.read("race")
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert {e.seq: e.data for e in events} == acknowledged
        # Each batch is contiguous: event i of a batch directly follows event i-1.
        for before, after in itertools.pairwise(events):
            name, n, i = after.data.decode().split("/")
            if i != "0":
                assert before.data == f"{name}/{n}/{int(i) - 1}".encode()
    finally:
        for other in others:
            await other.aclose()


async def test_delete_racing_appends_leaves_no_hole(pg_world: PostgresWorld, pg_url: str) -> None:
    other = await connect(url=pg_url, namespace=pg_world.namespace)
    try:

        async def appender() -> None:
            for n in range(60):
                await other.log.append("d", [NewEvent(data=str(n).encode())])

        async def deleter() -> None:
            for _ in range(10):
                await pg_world.log.delete("d")
                await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            tg.start_soon(appender)
            tg.start_soon(appender)
            tg.start_soon(deleter)
        events = await pg_world.log.read("d")
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        info = await pg_world.log.info("d")
        assert (info.tail if info else 0) == len(events)
    finally:
        await other.aclose()


async def _until_waiting(conn: asyncpg.Connection, pid: int) -> None:
    """Return once the session ``pid`` waits for a lock (asked on ``conn``)."""
    with anyio.fail_after(WAIT):
        for _ in itertools.count():
            if await conn.fetchval(
                "SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $1 AND NOT granted)", pid
            ):
                return
            await anyio.sleep(0.01)


async def _one_event(
    log: PostgresLog,
    conn: asyncpg.Connection,
    statement: str,
    log_id: str,
    data: bytes,
    key: str | None = None,
) -> list[Any]:
    """Run on ``conn`` the single-event INSERT named by ``statement``: ``probe`` (_APPEND_ONE,
    which finds the tail) or ``after`` (_APPEND_AFTER, told the tail event's seq and ctid, read
    here first as a World's hint would be)."""
    log_tag = tag("l", log_id)
    wake = (tag_key(log_tag), log_tag)
    if statement == "probe":
        return list(await conn.fetch(log._append_one, log_id, data, key, uuid.uuid4(), None, *wake))
    seq, ctid = await conn.fetchrow(
        log._db.sql("SELECT seq, ctid FROM @s@.events WHERE log_id = $1 ORDER BY seq DESC LIMIT 1"),
        log_id,
    )
    return list(
        await conn.fetch(log._append_after, log_id, data, key, uuid.uuid4(), seq, *wake, ctid)
    )


SINGLE_EVENT_STATEMENTS = pytest.mark.parametrize("statement", ["probe", "after"])


@contextlib.asynccontextmanager
async def _in_transaction_and_other(
    pg_url: str,
) -> AsyncIterator[tuple[asyncpg.Connection, Any, asyncpg.Connection, int]]:
    """A connection in a started transaction (and that transaction), and another connection
    (and its backend pid, for :func:`_until_waiting`)."""
    first = await asyncpg.connect(pg_url)
    other = await asyncpg.connect(pg_url)
    try:
        other_pid = await other.fetchval("SELECT pg_backend_pid()")
        transaction = first.transaction()
        await transaction.start()
        yield first, transaction, other, other_pid
    finally:
        await first.close()
        await other.close()


@SINGLE_EVENT_STATEMENTS
async def test_delete_waits_for_a_single_event_append_in_flight(
    pg_world: PostgresWorld, pg_url: str, statement: str
) -> None:
    """A single-event append is one INSERT that locks the log's tail event, not the advisory
    lock delete_log takes: a delete that starts while one is uncommitted waits for its commit,
    then removes its event too, so the log never resumes past a hole."""
    log = pg_world.log
    assert isinstance(log, PostgresLog)
    assert await log.append("d", [NewEvent(data=b"1")]) == 1
    async with _in_transaction_and_other(pg_url) as (holder, transaction, deleter, deleter_pid):
        rows = await _one_event(log, holder, statement, "d", b"2")
        assert [row[0] for row in rows] == [2]
        deleted = anyio.Event()

        async def delete() -> None:
            await deleter.execute(log._delete, "d")
            deleted.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(delete)
            await _until_waiting(holder, deleter_pid)
            assert not deleted.is_set()
            await transaction.commit()
        assert await pg_world.log.read("d") == []
        assert await pg_world.log.info("d") is None
        assert await pg_world.log.append("d", [NewEvent(data=b"again")]) == 1


@SINGLE_EVENT_STATEMENTS
async def test_single_event_append_after_an_uncommitted_delete_finds_no_tail(
    pg_world: PostgresWorld, pg_url: str, statement: str
) -> None:
    """A single-event append whose snapshot still shows the events an uncommitted delete
    removed waits for the delete's commit, then finds no tail to lock and writes nothing (the
    append() function then starts the log again at 1), instead of resuming past the delete."""
    log = pg_world.log
    assert isinstance(log, PostgresLog)
    for n in range(3):
        await log.append("d", [NewEvent(data=str(n).encode())])
    async with _in_transaction_and_other(pg_url) as (deleter, transaction, appender, appender_pid):
        await deleter.execute(log._delete, "d")
        rows: list[Any] = []

        async def append() -> None:
            rows.extend(await _one_event(log, appender, statement, "d", b"late"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(append)
            await _until_waiting(deleter, appender_pid)
            await transaction.commit()
        assert rows == []
        assert await log.read("d") == []
        assert await log.append("d", [NewEvent(data=b"again")]) == 1
        assert [e.data for e in await log.read("d")] == [b"again"]


@SINGLE_EVENT_STATEMENTS
async def test_a_delete_racing_an_append_of_a_taken_key_does_not_deadlock(
    pg_world: PostgresWorld, pg_url: str, statement: str
) -> None:
    """The window between a single-event append's lock of the tail event and its INSERT's key
    check, held open here by a transaction that appends twice: the second append's key is
    taken by an earlier event, which the waiting delete must not have locked first."""
    log = pg_world.log
    assert isinstance(log, PostgresLog)
    await log.append("d", [NewEvent(data=b"1", key="k")])
    await log.append("d", [NewEvent(data=b"2")])
    async with _in_transaction_and_other(pg_url) as (holder, transaction, deleter, deleter_pid):
        assert [r[0] for r in await _one_event(log, holder, statement, "d", b"3")] == [3]
        failed: list[BaseException] = []

        async def delete() -> None:
            try:
                await deleter.execute(log._delete, "d")
            except asyncpg.PostgresError as exc:
                failed.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(delete)
            await _until_waiting(holder, deleter_pid)
            with pytest.raises(asyncpg.UniqueViolationError):
                await _one_event(log, holder, statement, "d", b"4", "k")
            await transaction.rollback()
        assert failed == []
        assert await log.read("d") == []


async def test_a_world_appending_alone_names_its_tail_event(pg_world: PostgresWorld) -> None:
    """A World appending alone to a log names the event it appended last (_APPEND_AFTER, by
    its ctid) rather than probing for the tail: once it has appended twice, no probe runs."""
    log = pg_world.log
    assert isinstance(log, PostgresLog)
    for n in (1, 2):
        assert await log.append("solo", [NewEvent(data=b"x")]) == n
    log._append_one = "SELECT 1/0"  # a probe would fail the append
    for n in (3, 4, 5):
        assert await log.append("solo", [NewEvent(data=b"x")]) == n
    assert await log.append("solo", [NewEvent(data=b"y")], expect_tail=5) == 6


async def test_every_append_carries_a_batch_id_of_its_own(
    pg_world: PostgresWorld, pg_url: str
) -> None:
    """Batch ids are drawn _BATCHES at a time: across draws, over logs and through both the
    single INSERTs and append(), no two appends of a World carry the same one (a retry would
    take another append's event for its own)."""
    log = pg_world.log
    assert isinstance(log, PostgresLog)
    appends = 0
    for i in range(2 * _BATCHES + 3):
        await log.append(f"b{i % 3}", [NewEvent(data=b"x")])
        appends += 1
        if i % 50 == 0:
            await log.append("many", [NewEvent(data=b"y"), NewEvent(data=b"z")])
            appends += 1
    conn = await asyncpg.connect(pg_url)
    try:
        # batch is set on the last event of each append only.
        count, distinct = await conn.fetchrow(
            log._db.sql("SELECT count(batch), count(DISTINCT batch) FROM @s@.events")
        )
    finally:
        await conn.close()
    assert (count, distinct) == (appends, appends)


async def test_a_named_append_sends_its_own_logs_wake_tag(
    pg_world: PostgresWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wake tag and lock key an append sends (kept with the log's tail event once it has
    appended) are its own log's, with appends to several logs interleaved."""
    log = pg_world.log
    assert isinstance(log, PostgresLog)
    original_first_try = Database.first_try
    sent: list[tuple[object, ...]] = []

    async def recording(
        self: Database, query: str, args: tuple[object, ...]
    ) -> tuple[list[Any] | None, bool]:
        sent.append(args)
        return await original_first_try(self, query, args)

    monkeypatch.setattr(Database, "first_try", recording)
    for _ in range(3):
        for name in ("t1", "t2", "t3"):
            await log.append(name, [NewEvent(data=b"x")])
    assert len(sent) == 9
    for args in sent:
        log_id = args[0]
        assert isinstance(log_id, str)
        assert args[5:7] == (tag_key(tag("l", log_id)), tag("l", log_id))


async def test_a_named_append_whose_reply_was_lost_applies_once(
    pg_world: PostgresWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The named INSERT (_APPEND_AFTER) committed and its reply was lost: the append goes on
    under run as a retry, which finds its batch, instead of appending the event again."""
    log = pg_world.log
    assert isinstance(log, PostgresLog)
    for n in (1, 2):
        assert await log.append("l", [NewEvent(data=str(n).encode())]) == n
    original_first_try = Database.first_try
    named: list[str] = []

    async def lost_reply(
        self: Database, query: str, args: tuple[object, ...]
    ) -> tuple[list[Any] | None, bool]:
        rows, _ = await original_first_try(self, query, args)
        assert rows, "the first try did not apply"
        named.append(query)
        return None, True

    monkeypatch.setattr(Database, "first_try", lost_reply)
    assert await log.append("l", [NewEvent(data=b"3")]) == 3
    assert named == [log._append_after]
    monkeypatch.setattr(Database, "first_try", original_first_try)
    assert [e.data for e in await log.read("l")] == [b"1", b"2", b"3"]
    assert await log.append("l", [NewEvent(data=b"4")]) == 4


async def test_a_tail_event_another_world_appended_after_is_probed_past(
    pg_world: PostgresWorld, pg_url: str
) -> None:
    """The event a World appended last is no longer the tail once another World appended:
    the named INSERT fails on events_pkey and the probe finds the tail, with or without
    expect_tail."""
    other = await connect(url=pg_url, namespace=pg_world.namespace)
    try:
        for n in (1, 2, 3):
            assert await pg_world.log.append("l", [NewEvent(data=b"mine")]) == n
        assert await other.log.append("l", [NewEvent(data=b"other")]) == 4
        assert await pg_world.log.append("l", [NewEvent(data=b"mine")]) == 5
        assert await pg_world.log.append("l", [NewEvent(data=b"mine")], expect_tail=5) == 6
        assert await other.log.append("l", [NewEvent(data=b"other")]) == 7
        with pytest.raises(ConflictError) as caught:
            await pg_world.log.append("l", [NewEvent(data=b"late")], expect_tail=6)
        assert caught.value.actual == 7
        assert await pg_world.log.append("l", [NewEvent(data=b"mine")]) == 8
        events = await pg_world.log.read("l")
        assert [e.seq for e in events] == list(range(1, 9))
        assert [e.data for e in events].count(b"other") == 2
    finally:
        await other.aclose()


async def test_a_tail_event_another_world_deleted_starts_the_log_again(
    pg_world: PostgresWorld, pg_url: str
) -> None:
    """The event a World appended last was removed by another World's delete: the named
    INSERT finds no row, and the log starts again at 1 instead of resuming past a hole."""
    other = await connect(url=pg_url, namespace=pg_world.namespace)
    try:
        for n in (1, 2, 3):
            assert await pg_world.log.append("l", [NewEvent(data=b"old")]) == n
        await other.log.delete("l")
        assert await pg_world.log.append("l", [NewEvent(data=b"new")]) == 1
        assert [(e.seq, e.data) for e in await pg_world.log.read("l")] == [(1, b"new")]
    finally:
        await other.aclose()


async def test_a_tail_event_moved_by_vacuum_full_is_found_again(
    pg_world: PostgresWorld, pg_url: str
) -> None:
    """VACUUM FULL moves the events: the ctid a World kept for its last event holds another
    log's event afterwards, which the named INSERT refuses (log and seq checked); the probe
    finds the tail."""
    log = pg_world.log
    assert isinstance(log, PostgresLog)
    for _ in range(40):
        await log.append("filler", [NewEvent(data=b"f")])
    for n in (1, 2, 3):
        assert await log.append("moved", [NewEvent(data=b"m")]) == n
    await log.delete("filler")
    where = log._db.sql("SELECT ctid FROM @s@.events WHERE log_id = $1 AND seq = $2")
    conn = await asyncpg.connect(pg_url)
    try:
        before = await conn.fetchval(where, "moved", 3)
        # VACUUM FULL keeps, in place, the deleted rows a snapshot of another session (another
        # test's transaction on this server) may still see: it moves the events only once
        # none may. So it runs again until they moved, within WAIT.
        with anyio.fail_after(WAIT):
            while True:
                await conn.execute(log._db.sql("VACUUM FULL @s@.events"))
                if await conn.fetchval(where, "moved", 3) != before:
                    break
                await anyio.sleep(0.2)
        for _ in range(40):
            await log.append("other", [NewEvent(data=b"o")])
        holder = await conn.fetchval(
            log._db.sql("SELECT log_id FROM @s@.events WHERE ctid = $1"), before
        )
        assert holder == "other"
    finally:
        await conn.close()
    assert await log.append("moved", [NewEvent(data=b"m")]) == 4
    assert [e.seq for e in await log.read("moved")] == [1, 2, 3, 4]
    assert [e.seq for e in await log.read("other")] == list(range(1, 41))


async def test_a_duplicate_key_whose_event_a_delete_removed_meanwhile_is_appended(
    pg_world: PostgresWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append refused by events_key whose conflicting event a delete_log removed before
    the lookup of that event (a delete racing the append) tries again: the log was deleted,
    so the append starts it again at 1, instead of failing as "a bug in world-postgres"."""
    log = pg_world.log
    assert isinstance(log, PostgresLog)
    await log.append("d", [NewEvent(data=b"first", key="k")])
    real = PostgresLog._first_existing

    async def deleted_meanwhile(self: PostgresLog, *args: Any) -> Any:
        await pg_world.log.delete("d")
        return await real(self, *args)

    monkeypatch.setattr(PostgresLog, "_first_existing", deleted_meanwhile)
    assert await log.append("d", [NewEvent(data=b"again", key="k")]) == 1
    assert [(e.seq, e.key, e.data) for e in await log.read("d")] == [(1, "k", b"again")]


async def test_racing_keys_give_duplicate_key_error(pg_world: PostgresWorld, pg_url: str) -> None:
    others = [await connect(url=pg_url, namespace=pg_world.namespace) for _ in range(3)]
    outcomes: list[str] = []
    existing: list[str | None] = []

    async def writer(w: PostgresWorld, me: int) -> None:
        try:
            await w.log.append("k", [NewEvent(data=f"{me}".encode(), key="the-key")])
            outcomes.append("ok")
        except DuplicateKeyError as exc:
            existing.append(exc.existing.key)
            outcomes.append("dup")

    try:
        async with anyio.create_task_group() as tg:
            for me, w in enumerate([pg_world, *others]):
                tg.start_soon(writer, w, me)
        assert sorted(outcomes) == ["dup", "dup", "dup", "ok"]
        assert existing == ["the-key"] * 3
        assert await pg_world.log.tail("k") == 1
    finally:
        for other in others:
            await other.aclose()


# --------------------------------------------------------------------------------------------
# Outbox and queue
# --------------------------------------------------------------------------------------------


async def test_outbox_is_atomic_with_the_append(pg_world: PostgresWorld) -> None:
    await pg_world.log.append("o", [NewEvent(data=b"a", key="k")])
    message = OutboxMessage(queue="q", payload=b"must not exist")
    with pytest.raises(DuplicateKeyError):
        await pg_world.log.append("o", [NewEvent(data=b"b", key="k")], messages=[message])
    assert await pg_world.queue.claim("q", "w", lease=5) == []
    tail = await pg_world.log.append(
        "o",
        [NewEvent(data=b"c")],
        messages=[message, OutboxMessage(queue="q", payload=b"later", delay=3600)],
    )
    assert tail == 2
    leases = await pg_world.queue.claim("q", "w", lease=5, limit=10)
    assert [lease.payload for lease in leases] == [b"must not exist"]


async def test_forged_token_is_a_lost_lease(pg_world: PostgresWorld) -> None:
    await pg_world.queue.enqueue("q", b"m")
    (lease,) = await pg_world.queue.claim("q", "w", lease=30)
    forged = lease.model_copy(update={"token": "not-a-uuid"})
    with pytest.raises(LeaseLostError):
        await pg_world.queue.ack(forged)
    with pytest.raises(LeaseLostError):
        await pg_world.queue.renew(forged, 5)
    await pg_world.queue.ack(lease)


async def test_claim_is_woken_by_notify_from_another_process(
    pg_world: PostgresWorld, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without its safety poll, only a NOTIFY can end this claim before its hour-long wait.
    monkeypatch.setattr(world_postgres._wait, "_POLL_LISTENING", 3600.0)
    result: list[bytes] = []

    async def claimer() -> None:
        leases = await pg_world.queue.claim("wake", "w", lease=30, wait=3600)
        result.extend(lease.payload for lease in leases)

    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(claimer)
            # Once the claimer found nothing and sleeps, only the enqueue elsewhere wakes it.
            await until(
                lambda: pg_world._listener.listening and pg_world._listener.sleeping > 0,
                "the claimer asleep on a listening connection",
            )
            done = await anyio.run_process(
                [sys.executable, CHILD, pg_url, pg_world.namespace, "enqueue", "wake", "hello"]
            )
            assert done.returncode == 0
    assert result == [b"hello"]


async def test_no_wakeup_lost_while_waiters_register(
    pg_world: PostgresWorld, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Writers notify only registered tags; an enqueue racing the registration must still be
    # seen: by the look after registering, or by a notification. No safety poll here.
    monkeypatch.setattr(world_postgres._wait, "_POLL_LISTENING", 3600.0)
    producer = await connect(url=pg_url, namespace=pg_world.namespace)
    try:
        for round_ in range(25):
            queue = f"race-{round_}"
            got: list[bytes] = []

            async def claimer(queue: str = queue, got: list[bytes] = got) -> None:
                leases = await pg_world.queue.claim(queue, "w", lease=30, wait=3600)
                got.extend(lease.payload for lease in leases)

            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(claimer)
                    for _ in range(round_ % 5):  # land the enqueue at varying moments
                        await anyio.lowlevel.checkpoint()
                    await producer.queue.enqueue(queue, b"m")
            assert got == [b"m"]
    finally:
        await producer.aclose()


async def test_registration_survives_other_waiters_leaving(
    pg_world: PostgresWorld, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(world_postgres._wait, "_POLL_LISTENING", 3600.0)
    producer = await connect(url=pg_url, namespace=pg_world.namespace)
    try:
        # A short wait on the log comes and goes; the long one must still be notified.
        assert await pg_world.queue.claim("q", "w", lease=5, wait=0.05) == []
        got: list[bytes] = []

        async def claimer() -> None:
            got.extend(
                lease.payload for lease in await pg_world.queue.claim("q", "w", lease=5, wait=3600)
            )

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(claimer)
                await until(lambda: pg_world._listener.sleeping > 0, "the claimer asleep")
                assert await pg_world.queue.claim("q", "other", lease=5, wait=0.05) == []
                await producer.queue.enqueue("q", b"late")
        assert got == [b"late"]
    finally:
        await producer.aclose()


async def test_a_message_wakes_one_sleeping_claimer_of_a_process(
    pg_world: PostgresWorld, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Waking every sleeping claimer would cost each a claim query per message: at 50,000
    # sessions, hundreds of claim loops a process.
    monkeypatch.setattr(world_postgres._wait, "_POLL_LISTENING", 3600.0)
    looks = 0
    claim_now = PostgresQueue._claim_now

    async def counted(self: PostgresQueue, *args: Any) -> Any:
        nonlocal looks
        looks += 1
        return await claim_now(self, *args)

    monkeypatch.setattr(PostgresQueue, "_claim_now", counted)
    round_trips = 0
    run = Database.run

    async def counted_run(self: Database, what: str, *args: Any, **how: Any) -> Any:
        nonlocal round_trips
        round_trips += what == "claim"
        return await run(self, what, *args, **how)

    monkeypatch.setattr(Database, "run", counted_run)
    listener = pg_world._listener
    producer = await connect(url=pg_url, namespace=pg_world.namespace)
    claimers, messages = 12, 5
    got: list[bytes] = []

    async def claimer() -> None:
        leases = await pg_world.queue.claim("herd", "w", lease=30, wait=3600)
        got.extend(lease.payload for lease in leases)

    try:
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                for _ in range(claimers):
                    tg.start_soon(claimer)
                await until(lambda: listener.sleeping == claimers, "every claimer asleep")
                before = looks
                for n in range(messages):
                    await producer.queue.enqueue("herd", b"m%d" % n)

                    def settled(n: int = n) -> bool:
                        return len(got) == n + 1 and listener.sleeping == claimers - n - 1

                    await until(settled, f"message {n} claimed, the other claimers asleep")
                assert listener.reconnects == 0  # a reconnect wakes every claimer, by design
                assert looks - before == messages  # one look each: the claimer that got it
                # A look that finds nothing learns when to look again in the same round trip.
                assert round_trips == looks
                tg.cancel_scope.cancel()
        assert sorted(got) == [b"m%d" % n for n in range(messages)]
    finally:
        await producer.aclose()


@pytest.mark.parametrize("leaves_by", ["deadline", "cancellation"])
async def test_a_claimer_leaving_hands_its_wakeup_on(
    pg_world: PostgresWorld, pg_url: str, monkeypatch: pytest.MonkeyPatch, leaves_by: str
) -> None:
    """The claimer woken for a message leaves without it: chosen while looking (its look
    began before the message) and then past its deadline, or cancelled in the look its
    wake-up started. The other claimer, which looked before the message and then sleeps (the
    look, and the query for the soonest visible message, are what would see it), must still
    get it; no safety poll here."""
    monkeypatch.setattr(world_postgres._wait, "_POLL_LISTENING", 3600.0)
    # Held steps, per claimer (task name): before or after its next look, or before its next
    # real sleep; the events say it is held and let it go.
    hold: dict[str, str] = (
        {"first": "after look", "second": "sleep"} if leaves_by == "deadline" else {}
    )
    held = {name: anyio.Event() for name in ("first", "second")}
    go = {name: anyio.Event() for name in ("first", "second")}

    async def gate(step: str) -> None:
        name = anyio.get_current_task().name or ""
        if hold.get(name) == step:
            del hold[name]
            held[name].set()
            await go[name].wait()

    claim_now = PostgresQueue._claim_now

    async def gated_look(self: PostgresQueue, *args: Any) -> Any:
        await gate("before look")
        leases = await claim_now(self, *args)
        await gate("after look")
        return leases

    sleep = world_postgres._wait.Waiter.sleep

    async def gated_sleep(self: world_postgres._wait.Waiter, seconds: float | None = None) -> None:
        if self._listener.is_registered(self._tag):  # else it registers and looks again
            await gate("sleep")
        await sleep(self, seconds)

    monkeypatch.setattr(PostgresQueue, "_claim_now", gated_look)
    monkeypatch.setattr(world_postgres._wait.Waiter, "sleep", gated_sleep)
    listener = pg_world._listener
    wake_tag = tag("q", "q")
    producer = await connect(url=pg_url, namespace=pg_world.namespace)
    got: dict[str, list[bytes]] = {"first": [], "second": []}
    first = anyio.CancelScope()

    first_gone = anyio.Event()

    async def claimer(name: str, wait: float) -> None:
        try:
            with first if name == "first" else contextlib.nullcontext():
                leases = await pg_world.queue.claim("q", name, lease=30, wait=wait)
                got[name].extend(lease.payload for lease in leases)
        finally:
            if name == "first":
                first_gone.set()

    try:
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                # The first subscribes first: of two alike, the older is woken.
                deadline = 0.05 if leaves_by == "deadline" else 3600
                tg.start_soon(claimer, "first", deadline, name="first")
                if leaves_by == "deadline":
                    await held["first"].wait()  # looking, past the look's query
                tg.start_soon(claimer, "second", 3600, name="second")
                if leaves_by == "deadline":
                    await held["second"].wait()  # about to sleep: neither sleeps
                else:
                    await until(lambda: listener.sleeping == 2, "both claimers asleep")
                    hold["first"] = "before look"
                await until(lambda: listener.is_registered(wake_tag), "the tag registered")
                await producer.queue.enqueue("q", b"m")
                if leaves_by == "deadline":
                    await until(
                        lambda: (
                            [s.event.is_set() for s in listener._waiters[wake_tag]] == [True, False]
                        ),
                        "the first claimer chosen",
                    )
                    await anyio.sleep(deadline)  # its deadline passes while it looks
                    go["first"].set()
                else:
                    await held["first"].wait()  # it took the wake-up; cancelled before looking
                    first.cancel()
                await first_gone.wait()
                go["second"].set()
                await until(lambda: got["second"] == [b"m"], "the second claimer got it")
        assert got["first"] == []
    finally:
        await producer.aclose()


# --------------------------------------------------------------------------------------------
# Retries: every write may run again after a lost reply, and must not apply twice
# --------------------------------------------------------------------------------------------


async def test_writes_replayed_after_a_lost_reply_apply_once(
    pg_world: PostgresWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each write runs its operation twice on the real server, the second time as the retry
    that follows a reply lost after commit; the caller sees the second answer. (A replayed
    claim leases more messages, whose leases run out: at least once, by design.)"""
    original = Database.run

    async def replay(
        self: Database, what: str, op: Callable[[Any, bool], Awaitable[Any]], **how: Any
    ) -> Any:
        if what == "claim":
            return await original(self, what, op, **how)
        await original(self, what, op, **how)
        return await original(self, what, lambda conn, _retried: op(conn, True), **how)

    monkeypatch.setattr(Database, "run", replay)
    # A single-event append's first try, outside run, committed too and lost its reply: the
    # append goes on under run, told that it may have taken effect.
    original_first_try = Database.first_try

    async def lost_reply(
        self: Database, query: str, args: tuple[object, ...]
    ) -> tuple[list[Any] | None, bool]:
        rows, _ = await original_first_try(self, query, args)
        assert rows, "the first try did not apply"
        return None, True

    monkeypatch.setattr(Database, "first_try", lost_reply)
    log, queue, stream = pg_world.log, pg_world.queue, pg_world.stream

    assert await log.append("l", [NewEvent(data=b"a"), NewEvent(data=b"b", key="k")]) == 2
    assert await log.append("l", [NewEvent(data=b"c")], expect_tail=2, status="s") == 3
    # One event without a status: the single INSERT first, then the retry finds its batch.
    assert await log.append("l", [NewEvent(data=b"d", key="k2")], expect_tail=3) == 4
    assert await log.append("l", [NewEvent(data=b"e")]) == 5
    assert [e.data for e in await log.read("l")] == [b"a", b"b", b"c", b"d", b"e"]

    message_id = await queue.enqueue("q", b"m")
    (lease,) = await queue.claim("q", "w", lease=30, limit=10)
    assert lease.message_id == message_id
    lease = await queue.renew(lease, 30)
    await queue.release(lease)
    (lease,) = await queue.claim("q", "w", lease=30, limit=10)
    await queue.ack(lease)
    assert await queue.claim("q", "w", lease=30, limit=10) == []

    await queue.enqueue("dead", b"d", max_attempts=1)
    (lease,) = await queue.claim("dead", "w", lease=30)
    await queue.release(lease)  # the last attempt: dead-lettered
    (letter,) = await queue.dead_letters("dead")
    await queue.requeue("dead", letter.message_id)
    assert len(await queue.claim("dead", "w", lease=30, limit=10)) == 1

    # Enqueues and acks made at once, merged into one statement after the first (_merge.py).
    ids: list[str] = []

    async def enqueue(n: int) -> None:
        ids.append(await queue.enqueue("m", b"%d" % n, dedup_key="k" if n == 3 else None))

    async with anyio.create_task_group() as group:
        for n in range(5):
            group.start_soon(enqueue, n)
    assert len(set(ids)) == 5
    leases = await queue.claim("m", "w", lease=30, limit=10)
    assert sorted(lease.payload for lease in leases) == [b"%d" % n for n in range(5)]
    async with anyio.create_task_group() as group:
        for lease in leases:
            group.start_soon(queue.ack, lease)
    assert await queue.claim("m", "w", lease=30, limit=10) == []

    assert await stream.write("s", [b"1", b"2"]) == 2
    assert await stream.write("s", [b"3"], expect_next=2) == 3
    await stream.close("s")
    monkeypatch.setattr(Database, "run", original)
    monkeypatch.setattr(Database, "first_try", original_first_try)
    assert [c.data async for c in stream.read("s")] == [b"1", b"2", b"3"]


async def test_claims_reuse_their_plan_once_the_queue_has_statistics(
    pg_world: PostgresWorld, pg_url: str
) -> None:
    """With its LIMIT a parameter, the claim's generic plan had to guess it, was always dearer
    than a custom one, and PostgreSQL planned every claim anew once the table was analyzed."""
    other = await asyncpg.connect(pg_url)
    try:
        # As many messages as a busy queue holds, made fast, and the statistics autovacuum
        # would gather.
        await pg_world.queue.enqueue("q", b"first")
        await other.execute(
            f'INSERT INTO "world_{pg_world.namespace}".messages (id, queue, payload, visible_at,'
            " max_attempts) SELECT g::text, 'q', '', now(), 10 FROM generate_series(1, $1) g",
            2000,
        )
        await other.execute(f'ANALYZE "world_{pg_world.namespace}".messages')
    finally:
        await other.close()
    for _ in range(10):  # one at a time: each on the pool's most recently used connection
        assert len(await pg_world.queue.claim("q", "w", lease=30)) == 1

    async def plans(conn: Any, retried: bool) -> list[Any]:
        return list(
            await conn.fetch(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE strpos(statement, $1) > 0",
                "FOR UPDATE SKIP LOCKED",
            )
        )

    ((generic, custom),) = await pg_world._db.run("plans", plans)
    assert (generic, custom) == (5, 5), "PostgreSQL switches to the generic plan after 5"


async def test_a_claim_reads_only_its_rows_when_the_statistics_are_stale(
    pg_world: PostgresWorld, pg_url: str
) -> None:
    """Statistics taken while the queue was empty (autovacuum's, between two bursts) made the
    planner drive the claim's UPDATE by a scan of the whole primary key, joined to the picked
    rows: 8 ms instead of 0.4 for a claim of 10 among 3,000 messages."""
    queue = pg_world.queue
    assert isinstance(queue, PostgresQueue)
    await queue.enqueue("q", b"makes the schema")
    table = f'"world_{pg_world.namespace}".messages'
    fill = (
        f"INSERT INTO {table} (id, queue, payload, visible_at, max_attempts)"
        " SELECT $1 || g, 'q', '', now(), 10 FROM generate_series(1, 3000) g"
    )
    conn: Any = await asyncpg.connect(pg_url)
    try:
        await conn.execute(fill, "a")
        await conn.execute(f"DELETE FROM {table}")
        await conn.execute(f"ANALYZE {table}")
        await conn.execute(fill, "b")
        async with conn.transaction():
            explained = await conn.fetchval(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + queue._claim_sql(10), "q", "w", 30.0
            )

        def scanned(node: dict[str, Any]) -> int:
            table_scan = "Relation Name" in node and node["Node Type"].endswith("Scan")
            own = node["Actual Rows"] * node["Actual Loops"] if table_scan else 0
            return own + sum(scanned(child) for child in node.get("Plans", []))

        # The pick's 10 rows and the update's 10; the soonest-row branch does not run.
        assert scanned(json.loads(explained)[0]["Plan"]) <= 20
    finally:
        await conn.close()


async def test_acks_cut_off_by_aclose_never_raise_closed_error_yet_take_effect(pg_url: str) -> None:
    """Acks in flight when the World closes: one that raised ClosedError did not ack (its
    lease is still current); one whose outcome is unknown raised BackendUnavailableError
    (``Database.run``'s ``stores``: an ack answers ``absent`` in an empty namespace, yet
    writes). Three closing moments."""
    namespace = fresh_namespace()
    async with await connect(url=pg_url, namespace=namespace) as keeper:
        try:
            for after in (0.02, 0.05, 0.1):
                for i in range(400):
                    await keeper.queue.enqueue("q", str(i).encode())
                closing = await connect(url=pg_url, namespace=namespace)
                leases = await closing.queue.claim("q", "w", lease=600, limit=400)
                closed: list[Lease] = []

                async def acker(
                    chunk: list[Lease], world: PostgresWorld = closing, cut: list[Lease] = closed
                ) -> None:
                    for lease in chunk:
                        try:
                            await world.queue.ack(lease)
                        except ClosedError:
                            cut.append(lease)
                            return
                        except BackendUnavailableError:
                            return

                with anyio.fail_after(WAIT):
                    async with anyio.create_task_group() as group:
                        for task in range(8):
                            group.start_soon(acker, leases[task::8])
                        await anyio.sleep(after)
                        await closing.aclose()
                lies = []
                for lease in closed:
                    try:
                        await keeper.queue.renew(lease, 600)
                    except LeaseLostError:
                        lies.append(lease.message_id)
                assert not lies, f"ClosedError, yet acked ({after} s in): {lies}"
                await keeper.purge()
        finally:
            await keeper.purge()
