"""``world export`` and ``world replay-check`` as a user runs them: real processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import anyio

from world_core import Client, open_world

HERE = Path(__file__).resolve().parent
NAMESPACE = "cli_replay"


def _world(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("WORKFLOW_")}
    environment["PYTHONPATH"] = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "world_core._cli", *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def _submit(folder: str) -> None:
    async with open_world("local", url=folder, namespace=NAMESPACE) as world:
        await Client(world).submit("s", "hello", turn_id="t1")


def _world_options(folder: Path) -> list[str]:
    return ["--world", "local", "--url", str(folder), "--namespace", NAMESPACE]


def _one_turn_run(tmp_path: Path) -> Path:
    """A local World (its folder) holding session ``s`` with turn ``t1`` run by a worker."""
    folder = tmp_path / "world"
    anyio.run(_submit, str(folder))
    worker = _world(
        "worker", "--agent", "replay_support:build", *_world_options(folder), "--once",
        "--wait", "10", cwd=tmp_path,
    )  # fmt: skip
    assert worker.returncode == 0, worker.stdout + worker.stderr
    return folder


def test_export_then_replay_check_consistent_and_diverged(tmp_path: Path) -> None:
    folder = _one_turn_run(tmp_path)
    exported = tmp_path / "s.json"
    result = _world("export", "s", *_world_options(folder), "--out", str(exported), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(
        rf"exported 1 session\(s\), \d+ events, 0 blobs to {re.escape(str(exported))}\n",
        result.stderr,
    )
    assert json.loads(exported.read_text())["format"] == "world-history/1"

    to_stdout = _world("export", "s", *_world_options(folder), cwd=tmp_path)
    assert to_stdout.returncode == 0, to_stdout.stderr
    assert to_stdout.stdout == exported.read_text()

    ok = _world("replay-check", "--agent", "replay_support:build", str(exported), cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.splitlines() == [
        f"{exported}: session s",
        "  turn t1  consistent  replayed 5 steps to the recorded reply",
        "",
        "replay-check ok: 1 turn in 1 session: 1 consistent, 0 prefix ok, 0 diverged, 0 skipped",
    ]

    # The same session, read from the World instead of a file.
    live = _world(
        "replay-check", "--agent", "replay_support:build", "--session", "s",
        *_world_options(folder), "--json", cwd=tmp_path,
    )  # fmt: skip
    assert live.returncode == 0, live.stdout + live.stderr
    report = json.loads(live.stdout)
    assert report["ok"] is True
    assert report["sessions"][0]["source"] == f"local World, namespace {NAMESPACE}"

    changed = _world(
        "replay-check", "--agent", "replay_support:reworded", str(tmp_path), cwd=tmp_path
    )
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert "  turn t1  DIVERGED    at step 0: the journal holds a model request" in changed.stdout
    assert "message 0 (system) field 'content' differs; now: \"You help, briefly.\"" in (
        changed.stdout
    )
    assert changed.stdout.rstrip().endswith("0 consistent, 0 prefix ok, 1 diverged, 0 skipped")


def test_a_session_named_twice_is_exported_and_checked_once(tmp_path: Path) -> None:
    """``world export s s`` wrote the session twice, and replay-check refused that file (and
    a file given twice, or with its folder, or ``--session s --session s``): "session 's'
    already has 5 events ... import a history into an empty session only", exit 2."""
    folder = _one_turn_run(tmp_path)
    histories = tmp_path / "histories"
    histories.mkdir()
    exported = histories / "s.json"
    twice = _world(
        "export", "s", "s", *_world_options(folder), "--out", str(exported), cwd=tmp_path
    )
    assert twice.returncode == 0, twice.stderr
    assert twice.stderr.startswith("exported 1 session(s)"), twice.stderr
    assert len(json.loads(exported.read_text())["sessions"]) == 1
    for sources in (
        [str(exported)],
        [str(exported), str(exported)],
        [str(histories), str(exported)],
        ["--session", "s", "--session", "s", *_world_options(folder)],
    ):
        checked = _world("replay-check", "--agent", "replay_support:build", *sources, cwd=tmp_path)
        assert checked.returncode == 0, (sources, checked.stdout + checked.stderr)
        assert checked.stdout.rstrip().endswith(
            "1 turn in 1 session: 1 consistent, 0 prefix ok, 0 diverged, 0 skipped"
        ), checked.stdout


def test_usage_and_configuration_errors_exit_2(tmp_path: Path) -> None:
    nothing = _world("replay-check", "--agent", "replay_support:build", cwd=tmp_path)
    assert nothing.returncode == 2
    assert "nothing to check" in nothing.stderr

    (tmp_path / "notes.json").write_text("{}", encoding="utf-8")
    bad = _world("replay-check", "--agent", "replay_support:build", "notes.json", cwd=tmp_path)
    assert bad.returncode == 2
    assert "world: error: notes.json: format None is not 'world-history/1'" in bad.stderr

    empty = tmp_path / "empty"
    empty.mkdir()
    folder = _world("replay-check", "--agent", "replay_support:build", str(empty), cwd=tmp_path)
    assert folder.returncode == 2
    assert "a folder without *.json history files" in folder.stderr

    agent = _world("replay-check", "--agent", "no_such_module:build", "notes.json", cwd=tmp_path)
    assert agent.returncode == 2
    assert "cannot import 'no_such_module'" in agent.stderr

    missing = _world("export", "nobody", *_world_options(tmp_path / "world"), cwd=tmp_path)
    assert missing.returncode == 2
    assert "session 'nobody' has no events in namespace 'cli_replay'" in missing.stderr
