"""The shared World contracts, run against MongoDB (WORLD_TEST_MONGO_URL or a mongo:7 container)."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo import AsyncMongoClient

from world_conformance import StorageProbe, WorldContract


class TestMongoWorld(WorldContract):
    world_name = "mongo"

    @pytest.fixture
    def world_storage(self, world_url: str) -> StorageProbe:
        async def stored(namespace: str) -> list[str]:
            """The namespace's collections (``world.<namespace>.*``) in the URL's database."""
            client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(world_url)
            try:
                names = await client.get_default_database("world").list_collection_names()
            finally:
                await client.close()
            return sorted(name for name in names if name.startswith(f"world.{namespace}."))

        return stored
