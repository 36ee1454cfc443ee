"""The whole conformance suite on a local database file (a temporary ``file:`` URL), or on the
server in ``WORLD_TEST_TURSO_URL`` when it is set."""

from world_conformance import WorldContract


class TestTursoWorld(WorldContract):
    world_name = "turso"
