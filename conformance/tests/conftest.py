"""Tests of the conformance plugin itself, run through pytest's own ``pytester``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def _faulty_worlds_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inner pytest runs in subprocesses import ``faulty_worlds`` from this folder."""
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(HERE), path) if p))
