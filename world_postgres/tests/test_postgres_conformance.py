"""The whole conformance suite against PostgreSQL (WORLD_TEST_POSTGRES_URL, or a container)."""

from __future__ import annotations

import asyncpg
import pytest

from world_conformance import StorageProbe, WorldContract


class TestPostgresWorld(WorldContract):
    world_name = "postgres"

    @pytest.fixture
    def world_storage(self, world_url: str) -> StorageProbe:
        async def stored(namespace: str) -> list[tuple[str, str | None]]:
            """The namespace's schema and every relation in it (tables, indexes ...)."""
            conn = await asyncpg.connect(world_url)
            try:
                rows = await conn.fetch(
                    "SELECT n.nspname, c.relname FROM pg_namespace n"
                    " LEFT JOIN pg_class c ON c.relnamespace = n.oid"
                    " WHERE n.nspname = $1 ORDER BY c.relname",
                    f"world_{namespace}",
                )
            finally:
                await conn.close()
            return [(row[0], row[1]) for row in rows]

        return stored
