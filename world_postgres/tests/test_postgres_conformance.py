"""The whole conformance suite against PostgreSQL (WORLD_TEST_POSTGRES_URL, or a container)."""

from world_conformance import WorldContract


class TestPostgresWorld(WorldContract):
    world_name = "postgres"
