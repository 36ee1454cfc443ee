"""LangGraph's own checkpointer conformance suite (``langgraph-checkpoint-conformance``) run
against :class:`~world_core.integrations.langgraph.WorldCheckpointSaver` on every backend.

Each test runs one capability's whole spec through the suite's own runner (``validate``), on
a fresh namespace of the backend's World (the conformance plugin's ``world`` fixture: a
missing server skips, or fails under ``WORLD_REQUIRE``), as a contract area of its own,
``langgraph``. The saver implements all eight
capabilities, so none may be reported "not implemented" and none is skipped.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import Capability, DetectedCapabilities

from world_conformance import ContractBase
from world_core import World
from world_core.integrations.langgraph import WorldCheckpointSaver

CAPABILITIES = [c.value for c in Capability]

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _conforms(world: World, capability: str) -> None:
    @checkpointer_test(name=f"WorldCheckpointSaver[{world.name}]")
    async def saver() -> AsyncGenerator[BaseCheckpointSaver[int], None]:
        yield WorldCheckpointSaver(world)

    report = await validate(saver, capabilities={capability})
    result = report.results[capability]
    assert result.detected, f"{capability} is not implemented"
    assert result.failures == [], "\n".join(result.failures)
    assert result.passed is True
    assert result.tests_passed > 0
    assert result.tests_skipped == 0


def test_every_capability_is_detected() -> None:
    # Detection looks at which methods the class overrides: no World is needed.
    unopened = WorldCheckpointSaver.__new__(WorldCheckpointSaver)
    detected = DetectedCapabilities.from_instance(unopened)
    assert {c.value for c in detected.detected} == set(CAPABILITIES)
    assert detected.missing == frozenset()


@pytest.mark.parametrize("capability", CAPABILITIES)
class _Conformance(ContractBase):
    # Counted under its own heading in the end-of-run report, and listed in CI's 3.13 run's
    # WORLD_CONFORMANCE_AREAS_ONLY_ON (the saver is the same code on every backend).
    contract_area = "langgraph"

    async def test_langgraph_conformance(self, world: World, capability: str) -> None:
        await _conforms(world, capability)


class TestLocal(_Conformance):
    world_name = "local"


class TestPostgres(_Conformance):
    world_name = "postgres"


class TestRedis(_Conformance):
    world_name = "redis"


class TestMongo(_Conformance):
    world_name = "mongo"


class TestTurso(_Conformance):
    world_name = "turso"
