from world_conformance import WorldContract


class TestMemoryExampleWorld(WorldContract):
    world_name = "memory_example"
