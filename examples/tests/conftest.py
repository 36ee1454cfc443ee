"""Every test in this folder to one pytest-xdist worker (``make test`` runs with --dist
loadgroup), one after another, as before the suite ran on several workers.

The demos here start worker processes by the dozen and give them leases of a few seconds; a
worker whose renewals fall behind its lease on its own clock refuses a ``never`` send (the
turn then fails, saying so). Two demos at once, each with its processes, beside two other test
workers on a 2-core machine made that happen once in CI (the pydantic-ai demo, 22f8ea4's run).
"""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(_HERE):
            item.add_marker(pytest.mark.xdist_group("examples"))
