"""The whole conformance suite, on one Redis server and on a three-master Redis Cluster."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from world_conformance import StorageProbe, WorldContract


def _stored_keys(url: str) -> StorageProbe:
    async def stored(namespace: str) -> list[str]:
        """Every key of the namespace (on every primary of a cluster)."""
        pattern = f"world:{namespace}:*"
        if url.startswith("redis+cluster://"):
            cluster = RedisCluster.from_url(url.replace("redis+cluster://", "redis://", 1))
            try:
                found = await cluster.keys(pattern, target_nodes=RedisCluster.PRIMARIES)
            finally:
                await cluster.aclose()
        else:
            single = Redis.from_url(url)
            try:
                found = await single.keys(pattern)
            finally:
                await single.aclose()
        return sorted(map(str, found))

    return stored


class TestRedisWorld(WorldContract):
    world_name = "redis"

    @pytest.fixture
    def world_storage(self, world_url: str) -> StorageProbe:
        return _stored_keys(world_url)


class TestRedisClusterWorld(WorldContract):
    world_name = "redis"

    @pytest.fixture
    def world_url(self, cluster_url: str) -> str:
        return cluster_url

    @pytest.fixture
    def world_storage(self, world_url: str) -> StorageProbe:
        return _stored_keys(world_url)
