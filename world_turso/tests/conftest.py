"""Fixtures of the backend-specific tests: a temporary database file and a World on it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from world_turso import TursoWorld, connect


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """A ``file:`` URL of a database no other test uses."""
    return f"file:{tmp_path / 'world.db'}"


@pytest.fixture
async def turso(db_url: str) -> AsyncIterator[TursoWorld]:
    world = await connect(url=db_url, namespace="t")
    try:
        yield world
    finally:
        await world.aclose()
