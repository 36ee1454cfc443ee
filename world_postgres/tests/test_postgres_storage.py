"""The schema of a namespace is made by its first write, never by opening or reading: `world
info` on a mistyped namespace, reads and a purge leave the database as it was."""

from __future__ import annotations

import secrets
from pathlib import Path

import asyncpg
import pytest

import world_postgres._db
from world_conformance.connect_errors import world_info
from world_core import ConfigurationError, NewEvent
from world_postgres import connect
from world_postgres._schema import MIGRATIONS

pytestmark = pytest.mark.anyio

DATA_TABLES = {"chunks", "events", "logs", "messages", "migrations", "streams"}


async def _tables(url: str, namespace: str) -> set[str] | None:
    """The tables of the namespace's schema; None when the schema does not exist."""
    conn = await asyncpg.connect(url)
    try:
        schema = f"world_{namespace}"
        if not await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", schema):
            return None
        rows = await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", schema
        )
        return {row[0] for row in rows}
    finally:
        await conn.close()


async def _drop(url: str, namespace: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "world_{namespace}" CASCADE')
    finally:
        await conn.close()


def _typo() -> str:
    return f"typo_{secrets.token_hex(6)}"


async def test_cli_info_on_a_mistyped_namespace_makes_no_schema(
    pg_url: str, tmp_path: Path
) -> None:
    namespace = _typo()
    result = world_info(
        "postgres", "--namespace", namespace, cwd=tmp_path, WORKFLOW_POSTGRES_URL=pg_url
    )
    assert result.returncode == 0, result.stderr
    assert f"namespace  {namespace}" in result.stdout
    assert await _tables(pg_url, namespace) is None, "world info made a schema"


async def test_reads_make_nothing_and_the_first_write_makes_the_schema(pg_url: str) -> None:
    namespace = _typo()
    try:
        async with await connect(url=pg_url, namespace=namespace) as world:
            assert await world.log.read("l") == []
            assert (await world.log.list_logs()).items == []
            assert await world.queue.claim("q", "w", lease=5.0, wait=0.1) == []
            assert await world.queue.dead_letters("q") == []
            assert (await world.stream.info("s")).next_index == 0
            await world.log.delete("l")
            await world.purge()
            assert await _tables(pg_url, namespace) is None
            await world.queue.enqueue("q", b"m")
            assert await _tables(pg_url, namespace) == DATA_TABLES
            await world.purge()  # drops the schema
            assert await _tables(pg_url, namespace) is None
            assert await world.queue.claim("q", "w", lease=5.0) == []
            assert await _tables(pg_url, namespace) is None, "a read after a purge made it again"
            assert await world.log.append("l", [NewEvent(data=b"x")]) == 1
            assert await _tables(pg_url, namespace) == DATA_TABLES
    finally:
        await _drop(pg_url, namespace)


async def test_an_older_schema_is_migrated_when_opened(pg_url: str) -> None:
    """Existing storage is brought to the current layout on opening, as its reads need it."""
    namespace = _typo()
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute(f'CREATE SCHEMA "world_{namespace}"')
        await conn.execute(
            f'CREATE TABLE "world_{namespace}".migrations (version integer PRIMARY KEY,'
            " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        async with await connect(url=pg_url, namespace=namespace):
            pass
        versions = await conn.fetch(f'SELECT version FROM "world_{namespace}".migrations')
        assert sorted(row[0] for row in versions) == list(range(1, len(MIGRATIONS) + 1))
    finally:
        await conn.close()
        await _drop(pg_url, namespace)


async def test_a_namespace_at_the_previous_version_upgrades_and_keeps_its_data(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A namespace written by the previous release (its schema one migration behind) is
    migrated when a World of this release opens it; every log, status, key, message and chunk
    is still there, and appends and deletes go on as before."""
    namespace = _typo()
    try:
        monkeypatch.setattr(world_postgres._db, "MIGRATIONS", MIGRATIONS[:-1])
        async with await connect(url=pg_url, namespace=namespace) as old:
            await old.log.append("a", [NewEvent(data=b"1"), NewEvent(data=b"2", key="k")])
            await old.log.append("a", [NewEvent(data=b"3")], status="busy")
            await old.log.append("b", [NewEvent(data=b"x")])
            await old.queue.enqueue("q", b"m")
            await old.stream.write("s", [b"c0", b"c1"])
            await old.stream.close("s")
        monkeypatch.undo()
        conn = await asyncpg.connect(pg_url)
        try:
            versions = f'SELECT version FROM "world_{namespace}".migrations ORDER BY version'
            assert [r[0] for r in await conn.fetch(versions)] == list(range(1, len(MIGRATIONS)))
            async with await connect(url=pg_url, namespace=namespace) as world:
                assert [r[0] for r in await conn.fetch(versions)] == list(
                    range(1, len(MIGRATIONS) + 1)
                )
                assert [(e.seq, e.key, e.data) for e in await world.log.read("a")] == [
                    (1, None, b"1"),
                    (2, "k", b"2"),
                    (3, None, b"3"),
                ]
                info = await world.log.info("a")
                assert info is not None
                assert (info.tail, info.status) == (3, "busy")
                assert [i.log_id for i in (await world.log.list_logs()).items] == ["a", "b"]
                (lease,) = await world.queue.claim("q", "w", lease=30)
                assert lease.payload == b"m"
                assert [c.data async for c in world.stream.read("s")] == [b"c0", b"c1"]
                # Appends continue at the tail; a delete empties the log; it starts again at 1.
                assert await world.log.append("a", [NewEvent(data=b"4")], expect_tail=3) == 4
                assert await world.log.append("a", [NewEvent(data=b"5", key="k2")]) == 5
                await world.log.delete("a")
                assert await world.log.info("a") is None
                assert await world.log.append("a", [NewEvent(data=b"new")]) == 1
                assert await world.log.append("a", [NewEvent(data=b"new2")]) == 2
                assert [e.seq for e in await world.log.read("b")] == [1]
        finally:
            await conn.close()
    finally:
        await _drop(pg_url, namespace)


async def test_a_newer_schema_is_refused_when_opened(pg_url: str) -> None:
    namespace = _typo()
    async with await connect(url=pg_url, namespace=namespace) as world:
        await world.log.append("l", [NewEvent(data=b"x")])
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute(
            f"INSERT INTO \"world_{namespace}\".migrations (version, name) VALUES ($1, 'later')",
            len(MIGRATIONS) + 1,
        )
        with pytest.raises(ConfigurationError, match="newer than this world-postgres knows"):
            await connect(url=pg_url, namespace=namespace)
    finally:
        await conn.close()
        await _drop(pg_url, namespace)
