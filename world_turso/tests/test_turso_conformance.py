"""The whole conformance suite on a local database file (a temporary ``file:`` URL), or on the
server in ``WORLD_TEST_TURSO_URL`` when it is set."""

from __future__ import annotations

from pathlib import Path

import anyio.to_thread
import libsql
import pytest

from world_conformance import StorageProbe, WorldContract


class TestTursoWorld(WorldContract):
    world_name = "turso"

    @pytest.fixture
    def world_storage(self, world_url: str) -> StorageProbe | None:
        if not world_url.startswith("file:"):
            return None  # a server: its tables are not looked at here
        path = Path(world_url.removeprefix("file:"))

        def look(namespace: str) -> list[str]:
            if not path.exists():  # connecting would create it
                return []
            raw = libsql.connect(str(path), isolation_level=None)
            try:
                rows = raw.execute(
                    "SELECT name FROM sqlite_master WHERE substr(name, 1, ?) = ? ORDER BY name",
                    [len(namespace) + 3, f"w_{namespace}_"],
                ).fetchall()
            finally:
                raw.close()
            return [str(row[0]) for row in rows]

        async def stored(namespace: str) -> list[str]:
            """The namespace's tables and indexes (``w_<namespace>_*``) in the file."""
            return await anyio.to_thread.run_sync(look, namespace)

        return stored
