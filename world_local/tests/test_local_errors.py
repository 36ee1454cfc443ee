"""Errors a user can act on: a folder that cannot be used names WORKFLOW_LOCAL_DIR (or url=,
when that was the source) and says what is wrong with it, as a ConfigurationError."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from world_core import ConfigurationError, NewEvent
from world_local import connect

pytestmark = pytest.mark.anyio

WAIT = 60.0


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORKFLOW_LOCAL_DIR", raising=False)


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("not a folder")
    return path


async def test_a_file_given_as_the_folder(a_file: Path) -> None:
    with pytest.raises(ConfigurationError) as caught:
        await connect(url=str(a_file))
    message = str(caught.value)
    assert f"{a_file} is a file, not a folder" in message
    assert "url=" in message
    assert "permissions" not in message


async def test_a_file_on_the_way_to_the_folder_named_by_the_variable(
    a_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKFLOW_LOCAL_DIR", str(a_file / "world"))
    with pytest.raises(ConfigurationError) as caught:
        await connect()
    message = str(caught.value)
    assert f"{a_file} is a file, not a folder" in message
    assert "WORKFLOW_LOCAL_DIR" in message
    assert "url=" not in message


async def test_a_file_where_the_namespace_folder_goes(tmp_path: Path) -> None:
    (tmp_path / "tenant").write_text("")
    with pytest.raises(ConfigurationError, match="is a file, not a folder") as caught:
        await connect(url=str(tmp_path), namespace="tenant")
    assert str(tmp_path / "tenant") in str(caught.value)


async def test_an_open_world_names_its_setting_too(tmp_path: Path) -> None:
    """A folder replaced by a file under a running World: the same message, not a retry."""
    world = await connect(url=f"file://{tmp_path}", namespace="replaced")
    try:
        await world.log.append("l", [NewEvent(data=b"x")])  # the folders exist from here
        shutil.rmtree(tmp_path / "replaced" / "logs")
        (tmp_path / "replaced" / "logs").write_text("")
        with pytest.raises(ConfigurationError) as caught:
            await world.log.append("l", [NewEvent(data=b"x")])
    finally:
        await world.aclose()
    message = str(caught.value)
    assert "is a file, not a folder" in message
    assert "url=" in message


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root may write any folder: a permission error cannot happen"
)
async def test_a_folder_without_permission(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(ConfigurationError) as caught:
            await connect(url=str(locked / "world"))
    finally:
        locked.chmod(0o700)
    message = str(caught.value)
    assert "url=" in message
    assert str(locked) in message


def _world_info(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("WORKFLOW_")}
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-m", "world_core._cli", "info", *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )


def test_cli_variable(tmp_path: Path, a_file: Path) -> None:
    result = _world_info(cwd=tmp_path, WORKFLOW_LOCAL_DIR=str(a_file))
    assert result.returncode == 2, result.stderr
    assert "WORKFLOW_LOCAL_DIR" in result.stderr
    assert f"{a_file} is a file, not a folder" in result.stderr
    assert "check the disk and permissions" not in result.stderr


def test_cli_url_option(tmp_path: Path, a_file: Path) -> None:
    result = _world_info("--url", str(a_file / "sub"), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert f"{a_file} is a file, not a folder" in result.stderr
    assert "url" in result.stderr  # --url once the command names its options, else url=
    assert "WORKFLOW_LOCAL_DIR" not in result.stderr
