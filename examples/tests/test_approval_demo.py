"""``world demo approval`` as a user runs it: real worker processes, ``world approve`` in a
process of its own, the report read back as JSON and as text."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from world_core import ConfigurationError, ModelRequest
from world_examples.crash_agent import MESSAGE, build_approval_agent, policy

HERE = Path(__file__).resolve().parent
COMMAND = [sys.executable, "-m", "world_core._cli"]
STEPS = ["model", "tool lookup_note", "model", "approval send_email", "tool send_email", "model"]
POINTS = ["3:before_run", "3:after_run", "4:before_run", "4:after_run", "3:before_run+4:after_run"]
DONE = "Done: the launch note went to ada@example.com."


def _world(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("WORKFLOW_")}
    environment.pop("CRASH_AT", None)
    environment.update(env)
    return subprocess.run(
        [*COMMAND, *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )


@pytest.mark.timeout(240)
def test_world_demo_approval_json_meets_every_target(tmp_path: Path) -> None:
    result = _world("demo", "approval", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["demo"] == "approval"
    assert report["world"] == "local"
    assert report["namespace"].startswith("demo_")
    assert report["targets_met"] is True
    assert report["missed"] == []
    assert report["steps"] == STEPS
    assert report["clean_reply"] == DONE
    # The clean turns: approved from another process, or left to time out.
    clean, unanswered = report["clean"], report["clean_timed_out"]
    assert clean["workers"] == ["suspended", "approve", "done"]
    assert (clean["approvals_consumed"], clean["tool_runs"]) == (1, 1)
    assert unanswered["workers"][0] == "suspended"  # then woken at its timeout
    assert unanswered["workers"][-1] == "done"
    assert "approve" not in unanswered["workers"]
    assert (unanswered["approvals_consumed"], unanswered["tool_runs"]) == (0, 0)
    timeout_reply = report["timeout_reply"]
    assert timeout_reply.startswith("The launch note was not sent to ada@example.com: nobody")
    assert f"within {report['approval_timeout']:g} s" in timeout_reply

    points: list[dict[str, Any]] = report["crash_points"]
    assert [p["crash_at"] for p in points] == POINTS
    for point in points:
        assert point["crashed"] is True, point
        # One approval, also where the model sends again after a cut-off send (4:before_run):
        # the approval given covers the retry of the same call.
        assert point["approvals_consumed"] == point["approvals_target"] == 1, point
        assert point["approvals_asked"] == point["approvals_consumed"], point
        assert point["approvals_given"] == point["approvals_consumed"], point
        assert point["approved_by"] == ["demo-reviewer"] * point["approvals_consumed"], point
        assert point["tool_runs"] == point["tool_runs_target"] == 1, point
        assert point["reply_matches"] is True, point
        assert point["reply"] == DONE, point
        # Each crash worker really died (once per point named), the turn really suspended,
        # and the approval came after it did, from a process of its own.
        workers = point["workers"]
        assert workers.count("crash") == len(point["crash_at"].split("+")), point
        assert workers.index("suspended") < workers.index("approve"), point
        assert workers.count("approve") == point["approvals_given"], point
        assert workers[-1] == "done", point
    by_point = {p["crash_at"]: p for p in points}
    # Crashed before the wait looked for a decision: the first worker died, not suspended.
    assert by_point["3:before_run"]["workers"][0] == "crash"
    # Crashed after the approval was found: it died after the approval, then one worker ended
    # the turn with the same approval (none asked again).
    assert by_point["3:after_run"]["workers"] == ["suspended", "approve", "crash", "done"]
    # Around the send: the worker taking over waits for its deadline, is told the email
    # "may or may not have happened", and checks: nothing there before, one email after.
    assert by_point["4:before_run"]["checked_sent"] == "no: nothing delivered"
    assert by_point["4:after_run"]["checked_sent"] == "yes: 1 delivered"
    assert by_point["3:before_run+4:after_run"]["checked_sent"] == "yes: 1 delivered"
    for name in ("3:before_run", "3:after_run"):
        assert by_point[name]["told_possibly_ran"] is False

    late = report["timed_out"]
    assert late["crash_at"] == "3:after_run"
    assert late["crashed"] is True
    assert (late["approvals_asked"], late["approvals_consumed"], late["tool_runs"]) == (1, 0, 0)
    assert late["approvals_given"] == 0
    assert late["workers"].count("crash") == 1
    assert late["workers"][-1] == "done"
    assert "approve" not in late["workers"]
    assert late["reply_matches"] is True
    assert late["reply"] == timeout_reply

    assert "crashing at 5 points" in result.stderr  # the narrative goes to stderr with --json
    assert "done in" in result.stderr
    assert list(tmp_path.iterdir()) == []  # a temporary folder, not .workflow-data here


@pytest.mark.timeout(240)
def test_world_demo_approval_text_explains_itself_in_the_given_folder_and_namespace(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    result = _world(
        "demo", "approval", cwd=tmp_path, WORKFLOW_LOCAL_DIR=str(data), WORKFLOW_NAMESPACE="ops"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert out.startswith("world demo approval: ")
    assert re.search(r"namespace (ops_demo_[0-9a-f]{8})\b", out), out
    assert f"in folder {data}" in out
    assert list(data.iterdir()) == []  # purged
    for phrase in ("no API key", "SMTP server on 127.0.0.1", "world approve", "under 40 s"):
        assert phrase in out, phrase
    for term in ("asked", "consumed", "emails", "reply", "below"):
        assert re.search(rf"^   {term} +\S", out, re.MULTILINE), term
    header = "crash at                  asked  consumed  emails  reply"
    matrix, timeout_part = out.split("3. The turn nobody approves", 1)
    table = matrix.split(header, 1)[1]
    rows = [line.split()[0] for line in table.splitlines() if line[:1].isdigit()]
    assert rows == POINTS
    marked = [line.split()[0] for line in table.splitlines() if line.endswith(" *")]
    assert "4:before_run" in marked
    assert "    crash > suspended > approve > done" in table
    assert "the approval already given covers it" in table
    assert header in timeout_part
    assert "3:after_run                   1         0       0  identical" in timeout_part
    assert "nobody approved this" in timeout_part
    assert "MISSED" not in out
    assert "Targets met" in out
    assert "\r" not in out  # no progress line when stdout is not a terminal
    assert result.stderr == ""


def test_world_demo_takes_which_demo_as_an_optional_argument(tmp_path: Path) -> None:
    shown = _world("demo", "--help", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    choices = " ".join(shown.stdout.split()).split("[{", 1)[1].split("}]", 1)[0]
    assert choices.split(",")[:2] == ["crashes", "approval"]  # then every demo installed
    assert "pydantic-ai" in choices.split(",")
    wrong = _world("demo", "approvals", cwd=tmp_path)
    assert wrong.returncode == 2
    assert "invalid choice: 'approvals'" in wrong.stderr
    assert wrong.stdout == ""


def test_world_demo_approval_refuses_a_world_that_cannot_be_shared(tmp_path: Path) -> None:
    result = _world(
        "demo",
        "approval",
        "--world",
        "unshared_world:connect",
        "--url",
        str(tmp_path / "world"),
        cwd=tmp_path,
        PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "cannot be shared by several processes" in result.stderr
    assert "clean turns" not in result.stdout


def _after_send(content: str) -> ModelRequest:
    messages: list[dict[str, object]] = [{"role": "user", "content": MESSAGE}]
    for index, (name, result) in enumerate((("lookup_note", "the note"), ("send_email", content))):
        call: dict[str, object] = {"id": f"c{index}", "type": "function"}
        call["function"] = {"name": name, "arguments": "{}"}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{index}", "content": result})
    return ModelRequest(messages=messages)


def test_the_model_says_plainly_when_the_send_was_refused() -> None:
    refused = policy(
        _after_send("Error: alice rejected this call of send_email, so it did not run")
    )
    assert refused.tool_calls == []
    assert refused.content == (
        "The launch note was not sent to ada@example.com: alice rejected this call of "
        "send_email, so it did not run."
    )
    assert policy(_after_send("sent to ada@example.com")).content == DONE


def test_the_approval_agent_gates_send_email_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_DEMO_APPROVAL_TIMEOUT", "7.5")
    tools = {item.name: item for item in build_approval_agent().tools}
    assert (tools["send_email"].approval, tools["send_email"].approval_timeout) == (
        "required",
        7.5,
    )
    assert tools["send_email"].replay == "never"
    assert {tools[name].approval for name in ("lookup_note", "check_sent")} == {"none"}
    monkeypatch.setenv("WORLD_DEMO_APPROVAL_TIMEOUT", "-1")
    with pytest.raises(ConfigurationError, match="WORLD_DEMO_APPROVAL_TIMEOUT"):
        build_approval_agent()
