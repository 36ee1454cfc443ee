"""Fixtures for the world_mongo tests: a real MongoDB server named by WORLD_TEST_MONGO_URL.

`.ci/servers/mongo.sh` starts one (mongoeco) and prints the variable. Without it these tests
skip, or fail when WORLD_REQUIRE names mongo (or all).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from world_mongo import MongoWorld, connect


def _required() -> bool:
    names = {p.strip().lower() for p in os.environ.get("WORLD_REQUIRE", "").split(",")}
    return bool(names & {"all", "mongo", "world_mongo", "world-mongo"})


_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test in this folder to one pytest-xdist worker (``make test`` runs with --dist
    loadgroup): the test server, mongoeco, is one single-threaded process, and with two workers'
    tests queued on it the 160-turn history contract ran past its 120 s timeout."""
    for item in items:
        if item.path.is_relative_to(_HERE):
            item.add_marker(pytest.mark.xdist_group("mongo"))


@pytest.fixture(scope="session")
def mongo_url() -> str:
    url = os.environ.get("WORLD_TEST_MONGO_URL", "").strip()
    if not url:
        reason = "WORLD_TEST_MONGO_URL is not set: run .ci/servers/mongo.sh <dir> and export it"
        if _required():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return url


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def fresh_namespace() -> str:
    return f"wm_{secrets.token_hex(8)}"


@pytest.fixture
async def mongo_world(mongo_url: str) -> AsyncIterator[MongoWorld]:
    opened = await connect(url=mongo_url, namespace=fresh_namespace())
    try:
        yield opened
    finally:
        if not opened.closed:
            await opened.purge()
        await opened.aclose()
