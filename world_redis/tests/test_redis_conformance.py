"""The whole conformance suite, on one Redis server and on a three-master Redis Cluster."""

import pytest

from world_conformance import WorldContract


class TestRedisWorld(WorldContract):
    world_name = "redis"


class TestRedisClusterWorld(WorldContract):
    world_name = "redis"

    @pytest.fixture
    def world_url(self, cluster_url: str) -> str:
        return cluster_url
