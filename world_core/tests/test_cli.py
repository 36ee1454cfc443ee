"""The `world` command, run as a user runs it: a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def _world(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("WORKFLOW_")}
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-m", "world_core._cli", *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_worlds_lists_local(tmp_path: Path) -> None:
    result = _world("worlds", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert any(line.split()[:2] == ["local", "world-local"] for line in result.stdout.splitlines())
    listed = json.loads(_world("worlds", "--json", cwd=tmp_path).stdout)
    assert {"name": "local", "distribution": "world-local"} in [
        {"name": entry["name"], "distribution": entry["distribution"]} for entry in listed
    ]


def test_info_on_the_default_world(tmp_path: Path) -> None:
    result = _world("info", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["world"] == "local"
    assert report["namespace"] == "default"
    assert set(report["capabilities"]) >= {"outbox", "shared", "native_wakeups"}
    text = _world("info", cwd=tmp_path)
    assert text.returncode == 0
    assert text.stdout.startswith("world      local")


def test_unknown_world_exits_nonzero_with_the_list_and_a_suggestion(tmp_path: Path) -> None:
    result = _world("info", cwd=tmp_path, WORKFLOW_TARGET_WORLD="postgress")
    assert result.returncode == 2
    assert "Did you mean 'postgres'?" in result.stderr
    assert "Installed: " in result.stderr
    assert "local" in result.stderr
    assert result.stdout == ""


def test_bad_namespace_exits_nonzero(tmp_path: Path) -> None:
    result = _world("info", "--namespace", "Nope!", cwd=tmp_path)
    assert result.returncode == 2
    assert "WORKFLOW_NAMESPACE" in result.stderr
