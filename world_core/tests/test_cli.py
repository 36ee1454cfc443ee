"""The `world` command, run as a user runs it: a real process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path

import anyio
import pytest

from world_core._cli import for_the_command_line
from world_core._interrupt import run_command


def _environment(env: dict[str, str]) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("WORKFLOW_")}
    environment.update(env)
    return environment


def _world(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "world_core._cli", *args],
        cwd=cwd,
        env=_environment(env),
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


def test_bad_namespace_variable_exits_nonzero_naming_it(tmp_path: Path) -> None:
    result = _world("info", cwd=tmp_path, WORKFLOW_NAMESPACE="Nope!")
    assert result.returncode == 2
    assert "namespace 'Nope!' (from WORKFLOW_NAMESPACE) is invalid" in result.stderr


def test_world_alone_prints_its_help_on_stdout(tmp_path: Path) -> None:
    result = _world(cwd=tmp_path)
    # Status 2 (no command ran; a script notices), the help itself on stdout, nothing on stderr.
    assert result.returncode == 2
    assert result.stdout.startswith("usage: world")
    for command in ("worlds", "info", "worker", "exit status"):
        assert command in result.stdout
    assert result.stderr == ""


def test_version_names_core_and_the_installed_worlds(tmp_path: Path) -> None:
    result = _world("--version", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"world-core {metadata.version('world-core')}"
    assert ["local", "world-local", metadata.version("world-local")] in [
        line.split() for line in lines[1:]
    ]


@pytest.mark.parametrize("value", ["", " "])
def test_empty_target_world_is_refused(tmp_path: Path, value: str) -> None:
    result = _world("info", cwd=tmp_path, WORKFLOW_TARGET_WORLD=value)
    assert result.returncode == 2
    assert result.stderr.startswith("world: error: WORKFLOW_TARGET_WORLD is set but empty")
    assert "local" in result.stderr  # the installed Worlds are listed
    assert result.stdout == ""
    assert list(tmp_path.iterdir()) == []  # no local World opened in its place


def test_missing_url_names_the_option_or_the_variable_not_a_keyword(tmp_path: Path) -> None:
    # No WORKFLOW_REDIS_URL (the helper drops WORKFLOW_*): refused before any connection.
    result = _world("info", cwd=tmp_path, WORKFLOW_TARGET_WORLD="redis")
    assert result.returncode == 2
    assert "WORKFLOW_REDIS_URL" in result.stderr
    assert not re.search(r"(?<![\w-])url=", result.stderr), result.stderr
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    ("message", "shown"),
    [
        ("set X, or pass url=", "set X, or pass --url"),
        (
            "namespace 'B' (from namespace=) is invalid",
            "namespace 'B' (from --namespace) is invalid",
        ),
        ("unknown World 'x' (from target=).", "unknown World 'x' (from --world)."),
        (
            "RedisWorld(url='redis://h', namespace='a')",
            "RedisWorld(url='redis://h', namespace='a')",
        ),
        ("set WORKFLOW_REDIS_URL=redis://h", "set WORKFLOW_REDIS_URL=redis://h"),
    ],
)
def test_messages_name_options_not_python_keywords(message: str, shown: str) -> None:
    assert for_the_command_line(message) == shown


def test_bad_namespace_option_is_named_as_the_source(tmp_path: Path) -> None:
    result = _world("info", "--namespace", "Nope!", cwd=tmp_path, WORKFLOW_NAMESPACE="fine")
    assert result.returncode == 2
    assert "namespace 'Nope!' (from --namespace) is invalid" in result.stderr
    assert "WORKFLOW_NAMESPACE" not in result.stderr


def test_unknown_world_option_is_named_as_the_source(tmp_path: Path) -> None:
    result = _world("info", "--world", "postgress", cwd=tmp_path, WORKFLOW_TARGET_WORLD="local")
    assert result.returncode == 2
    assert "unknown World 'postgress' (from --world). Did you mean 'postgres'?" in result.stderr
    assert "WORKFLOW_TARGET_WORLD" not in result.stderr


def test_closed_stdout_ends_quietly(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line, as after `| head -0`
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "world_core._cli", "worlds"],
            cwd=tmp_path,
            env=_environment({}),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        os.close(write_end)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 141
    assert stderr == ""


def test_ctrl_c_prints_one_line_and_exits_130(tmp_path: Path) -> None:
    folder = tmp_path / "world"
    # Opening the local World creates nothing, but it removes the temporary files that dead
    # writers left: this one going tells that the World is open.
    (folder / "default" / "queues").mkdir(parents=True)
    (folder / "default" / "queues" / ".tmp-left-by-a-dead-writer").touch()
    # A worker waiting for a turn that never comes: interrupted inside the event loop.
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "world_core._cli", "worker", "--once", "--wait", "60"),
            *("--agent", "journal_support:build_replying", "--url", str(folder)),
            *("--queue", "nothing"),
        ],
        cwd=tmp_path,
        env=_environment({"PYTHONPATH": str(Path(__file__).parent)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # Ctrl-C signals the terminal's whole foreground group
    )
    try:
        deadline = time.monotonic() + 60
        # Gone: the World is open, the wait has begun.
        while (folder / "default" / "queues" / ".tmp-left-by-a-dead-writer").exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the worker did not open its World"
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130
    assert stderr == "interrupted\n"
    assert stdout == ""


def test_ctrl_c_cannot_be_swallowed_by_the_command() -> None:
    """Ctrl-C cancels the command's scope, which stays cancelled: a command that catches the
    first cancellation and goes on waiting is cancelled again at its next await, and
    KeyboardInterrupt is raised after it. (With plain ``anyio.run`` the one cancellation of
    the main task is gone once caught, and such a command runs to its end.)"""
    waits: list[str] = []

    async def stubborn() -> str:
        for _ in range(3):
            try:
                await anyio.sleep(10)
            except anyio.get_cancelled_exc_class():
                waits.append("cancelled")  # swallowed, as a careless command might
        return "ran to its end"

    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_command(stubborn)
    finally:
        timer.cancel()
    assert waits == ["cancelled"] * 3
