"""The World contract, run against the local World."""

from __future__ import annotations

from world_conformance import WorldContract


class TestLocalWorld(WorldContract):
    world_name = "local"
