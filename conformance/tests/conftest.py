"""Tests of the conformance plugin itself, run through pytest's own ``pytester``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def _faulty_worlds_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inner pytest runs in subprocesses import ``faulty_worlds`` from this folder, and start
    without the outer run's WORLD_REQUIRE (CI sets it to ``all``) and
    WORLD_CONFORMANCE_AREAS_ONLY_ON (CI's second Python run sets it); the tests of those set
    them themselves."""
    monkeypatch.delenv("WORLD_REQUIRE", raising=False)
    monkeypatch.delenv("WORLD_CONFORMANCE_AREAS_ONLY_ON", raising=False)
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(HERE), path) if p))
