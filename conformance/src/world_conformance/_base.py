"""The base every contract class derives from: what a backend's test class may set."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import pytest

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

    Contract classes set ``contract_area``, the heading their tests are counted under in the
    end-of-run report; test names are unique across all contract classes (``test_<area>_...``)
    because the aggregate ``WorldContract`` inherits them all.
    """

    world_name: ClassVar[str | None] = None
    known_gaps: ClassVar[Mapping[str, str]] = {}
    contract_area: ClassVar[str] = "world"

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.anyio]

    @pytest.fixture
    def anyio_backend(self) -> str:
        """Every contract runs on asyncio, a fresh event loop per test."""
        return "asyncio"
