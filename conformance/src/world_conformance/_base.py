"""The base every contract class derives from: what a backend's test class may set."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import pytest

from world_core import World

__all__ = ["ContractBase"]


class ContractBase:
    """Shared by every contract class (``LogContract``, ``QueueContract`` ...).

    A backend's test class sets, as class attributes:

    * ``world_name``: what :func:`world_core.open_world` opens: an entry-point name
      (``"postgres"``), a distribution name, or ``"module:attr"`` (useful before the entry point
      is registered). ``None`` means the ``--world`` command-line option.
    * ``known_gaps``: ``{"test_id": "why"}`` for contracts the backend knowingly fails. Each is
      run as a strict xfail, so the run fails the moment a gap is fixed and not removed. Keys are
      test names, optionally with their parameter id (``"test_payload_sizes[5MiB]"``); a key
      naming no test of the class stops the run.

    It may override the fixture ``world_url`` (a method returning the URL) to point every
    contract at another server, e.g. a Redis Cluster.

    Every test marked ``world_process`` (it starts other OS processes on the same World:
    children, worker processes) is skipped, with the reason, when the World under test
    declares ``Capabilities.shared=False``: the gate is here, once, so a new process contract
    only needs the marker.

    Contract classes set ``contract_area``, the heading their tests are counted under in the
    end-of-run report; test names are unique across all contract classes (``test_<area>_...``)
    because the aggregate ``WorldContract`` inherits them all.
    """

    world_name: ClassVar[str | None] = None
    known_gaps: ClassVar[Mapping[str, str]] = {}
    contract_area: ClassVar[str] = "world"

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.anyio]

    @pytest.fixture(autouse=True)
    def _process_contracts_need_shared(self, request: pytest.FixtureRequest) -> None:
        """Skip a ``world_process`` test on a World that one process at a time may open."""
        if request.node.get_closest_marker("world_process") is None:
            return
        world = request.getfixturevalue("world")
        if not isinstance(world, World) or world.capabilities.shared:
            return
        pytest.skip(
            "Capabilities.shared is false (one process at a time): this process contract "
            "opens the World from other processes"
        )

    @pytest.fixture
    def anyio_backend(self) -> str:
        """Every contract runs on asyncio, a fresh event loop per test."""
        return "asyncio"
