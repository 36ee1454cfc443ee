"""The shared World contracts, run against MongoDB (WORLD_TEST_MONGO_URL or a mongo:7 container)."""

from world_conformance import WorldContract


class TestMongoWorld(WorldContract):
    world_name = "mongo"
