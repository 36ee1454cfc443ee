"""The World contract, run against the local World."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

import anyio.to_thread
import pytest

from world_conformance import StorageProbe, WorldContract


class TestLocalWorld(WorldContract):
    world_name = "local"

    @pytest.fixture
    def world_storage(self, world_url: str) -> StorageProbe:
        root = Path(
            unquote(urlsplit(world_url).path) if world_url.startswith("file:") else world_url
        )

        def look(namespace: str) -> list[str]:
            folder = root / namespace
            if not folder.exists():
                return []
            return sorted(str(p.relative_to(root)) for p in [folder, *folder.rglob("*")])

        async def stored(namespace: str) -> list[str]:
            """The namespace's folder and everything in it, as paths under the World's folder."""
            return await anyio.to_thread.run_sync(look, namespace)

        return stored
