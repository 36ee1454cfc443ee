"""``world replay-check`` on the checked-in histories of ``world demo``'s agent, as CI runs it:
a real process. It passes for the agent that wrote them, and fails, naming the turn and step,
for agent code that would replay them differently."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio

from world_core import Client, open_world
from world_examples.crash_agent import MESSAGE
from world_examples.histories import AGENT

HERE = Path(__file__).resolve().parent
HISTORIES = HERE.parent / "histories"
FILES = sorted(HISTORIES.glob("*.json"))
COMMAND = [sys.executable, "-m", "world_core._cli"]


def _world(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("WORKFLOW_")}
    environment.pop("CRASH_AT", None)
    environment.update(env)
    environment["PYTHONPATH"] = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [*COMMAND, *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )


def _check(agent: str, *files: Path, cwd: Path, json_output: bool = False) -> tuple[int, str]:
    args = ["replay-check", "--agent", agent, *(str(f) for f in files)]
    result = _world(*args, *(["--json"] if json_output else []), cwd=cwd)
    assert result.returncode in (0, 1), result.stdout + result.stderr
    return result.returncode, result.stdout


def _turns(report: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (session["session_id"], turn["turn_id"]): turn
        for session in report["sessions"]
        for turn in session["turns"]
    }


def test_the_checked_in_histories_are_there() -> None:
    assert [f.name for f in FILES] == ["clean.json", "crashed-after-send.json", "open-turn.json"]


def test_the_demo_agent_replays_every_checked_in_history(tmp_path: Path) -> None:
    status, out = _check(AGENT, *FILES, cwd=tmp_path)
    assert status == 0, out
    assert "replay-check ok: 5 turns in 3 sessions" in out
    assert "3 consistent, 1 prefix ok, 0 diverged, 1 skipped" in out

    status, out = _check(AGENT, HISTORIES, cwd=tmp_path, json_output=True)
    assert status == 0, out
    report = json.loads(out)
    assert report["ok"] is True
    turns = _turns(report)
    assert {key: turn["status"] for key, turn in turns.items()} == {
        ("clean", "t1"): "consistent",
        ("clean", "t2"): "consistent",
        ("crash-3-after_run", "t1"): "consistent",
        ("crash-3-before_run", "t1"): "prefix",
        ("crash-3-before_run", "t2"): "skipped",
    }
    # The crashed turn: 7 steps, among them the send cut off and check_sent after it; blobs.
    assert turns["crash-3-after_run", "t1"]["recorded_steps"] == 7
    assert turns["crash-3-after_run", "t1"]["replayed_steps"] == 7
    crashed = json.loads((HISTORIES / "crashed-after-send.json").read_text())
    assert crashed["sessions"][0]["blobs"], "the crashed history is to hold blob-stored values"
    # The open turn ends at the interrupted send (step 3): a resumed turn goes on from there.
    assert turns["crash-3-before_run", "t1"]["step"] == 3
    assert "send_email was interrupted" in turns["crash-3-before_run", "t1"]["detail"]
    assert "waits for turn t1" in turns["crash-3-before_run", "t2"]["detail"]


def test_a_new_system_prompt_diverges_at_step_0_of_every_turn(tmp_path: Path) -> None:
    status, out = _check("replay_variants:new_system_prompt", *FILES, cwd=tmp_path)
    assert status == 1, out
    assert "turn t1  DIVERGED    at step 0:" in out
    assert (
        "message 0 (system) field 'content' differs; now: \"You are a careful assistant. Never"
        in out
    )
    assert (
        "replay-check DIVERGED: 5 turns in 3 sessions: 0 consistent, 0 prefix ok, 4 diverged" in out
    )


def test_a_removed_tool_diverges_naming_it(tmp_path: Path) -> None:
    status, out = _check(
        "replay_variants:without_check_sent", HISTORIES / "clean.json", cwd=tmp_path
    )
    assert status == 1, out
    assert "at step 0:" in out
    assert "tool 'check_sent' is no longer offered" in out


def test_a_request_change_diverges_only_where_it_shows(tmp_path: Path) -> None:
    # The agent no longer sends the session's earlier turns: the first turn of a session is
    # asked for as before; the second is not, from its first model call on.
    status, out = _check("replay_variants:forgetful", HISTORIES / "clean.json", cwd=tmp_path)
    assert status == 1, out
    assert "turn t1  consistent" in out
    assert "turn t2  DIVERGED    at step 0:" in out
    assert "4 messages were sent then, 2 now" in out
    status, out = _check(
        "replay_variants:forgetful", HISTORIES / "clean.json", cwd=tmp_path, json_output=True
    )
    turns = _turns(json.loads(out))
    assert turns["clean", "t2"]["status"] == "diverged"
    assert turns["clean", "t2"]["step"] == 0


def test_adding_a_patched_branch_keeps_old_histories_consistent(tmp_path: Path) -> None:
    status, out = _check("replay_variants:patched", *FILES, cwd=tmp_path)
    assert status == 0, out


async def _submit(folder: Path) -> None:
    async with open_world("local", url=str(folder), namespace="patched") as world:
        await Client(world).submit("patched", MESSAGE, turn_id="t1")


def test_removing_a_patched_branch_an_open_history_needs_diverges(tmp_path: Path) -> None:
    # A turn of the patched agent, its worker killed just before the send: an open history
    # holding the marker of the patched branch at step 0.
    world = ["--world", "local", "--url", str(tmp_path / "world"), "--namespace", "patched"]
    anyio.run(_submit, tmp_path / "world")
    worker = _world(
        "worker", "--agent", "replay_variants:patched", *world, "--once", "--wait", "10",
        cwd=tmp_path, CRASH_AT="4:before_run",
    )  # fmt: skip
    assert worker.returncode == 1, worker.stdout + worker.stderr  # killed: os._exit(1)
    exported = tmp_path / "patched.json"
    result = _world("export", "patched", *world, "--out", str(exported), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith("exported 1 session(s), "), result.stderr

    status, out = _check("replay_variants:patched", exported, cwd=tmp_path)
    assert status == 0, out
    assert "prefix ok   up to step 4 (5 recorded)" in out

    status, out = _check(AGENT, exported, cwd=tmp_path)  # the branch removed
    assert status == 1, out
    assert "turn t1  DIVERGED    at step 0:" in out
    assert "patched('look-before-sending')" in out
    assert "Keep the patched() branch until no open history holds its marker" in out
