"""Fixtures of the local World's own tests (the conformance run's come from its plugin)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from world_local import LocalWorld, connect


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def local_world(tmp_path: Path) -> AsyncIterator[LocalWorld]:
    """A World in a folder of its own, namespace ``t`` (test modules name it ``world``: not
    here, where it would replace the conformance plugin's ``world``)."""
    async with await connect(url=str(tmp_path / "store"), namespace="t") as opened:
        yield opened
