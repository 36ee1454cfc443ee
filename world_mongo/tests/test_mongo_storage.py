"""A namespace's collections and indexes are made by its first write, never by opening or
reading: `world info` on a mistyped namespace leaves the database as it was."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest
from pymongo import AsyncMongoClient

from world_conformance.connect_errors import world_info
from world_core import NewEvent
from world_mongo import connect

pytestmark = pytest.mark.anyio


async def _collections(url: str, namespace: str) -> dict[str, set[str]]:
    """The namespace's collections, each with the names of its indexes."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    try:
        db = client.get_default_database("world")
        found: dict[str, set[str]] = {}
        for name in await db.list_collection_names():
            if name.startswith(f"world.{namespace}."):
                indexes = await db[name].list_indexes()
                found[name] = {index["name"] async for index in indexes}
        return found
    finally:
        await client.close()


async def _drop(url: str, namespace: str) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    try:
        db = client.get_default_database("world")
        for name in await db.list_collection_names():
            if name.startswith(f"world.{namespace}."):
                await db.drop_collection(name)
    finally:
        await client.close()


def _typo() -> str:
    return f"typo_{secrets.token_hex(6)}"


async def test_cli_info_on_a_mistyped_namespace_makes_no_collection(
    mongo_url: str, tmp_path: Path
) -> None:
    namespace = _typo()
    result = world_info(
        "mongo", "--namespace", namespace, cwd=tmp_path, WORKFLOW_MONGO_URL=mongo_url
    )
    assert result.returncode == 0, result.stderr
    assert await _collections(mongo_url, namespace) == {}


async def test_reads_make_nothing_and_the_first_write_makes_the_indexes(mongo_url: str) -> None:
    namespace = _typo()
    try:
        async with await connect(url=mongo_url, namespace=namespace) as world:
            assert await world.log.read("l") == []
            assert (await world.log.list_logs()).items == []
            assert await world.queue.claim("q", "w", lease=5.0, wait=0.1) == []
            assert await world.queue.dead_letters("q") == []
            assert (await world.stream.info("s")).next_index == 0
            await world.log.delete("l")
            await world.stream.delete("s")
            await world.purge()
            assert await _collections(mongo_url, namespace) == {}
            await world.log.append("l", [NewEvent(data=b"x", key="k")])
            made = await _collections(mongo_url, namespace)
        assert f"world.{namespace}.queue" in made  # every collection, not only the log's
        assert all(len(indexes) > 1 for indexes in made.values()), made
    finally:
        await _drop(mongo_url, namespace)
