"""``world demo pydantic-ai`` as a user runs it: real worker processes, each crashed at its
point, the report read back as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic_ai.messages import (
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo

from world_core import POSSIBLY_RAN
from world_examples.pydantic_ai_agent import MESSAGE, build, policy

COMMAND = [sys.executable, "-m", "world_core._cli"]
STEPS = ["model", "tool lookup_note", "model", "tool send_email", "model"]
POINTS = [f"{n}:{when}" for n in range(5) for when in ("before_run", "after_run")]
DONE = "Done: the launch note went to ada@example.com."


@pytest.mark.timeout(300)
def test_world_demo_pydantic_ai_json_meets_every_target(tmp_path: Path) -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("WORKFLOW_")}
    environment.pop("CRASH_AT", None)
    result = subprocess.run(
        [*COMMAND, "demo", "pydantic-ai", "--json"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["demo"] == "pydantic-ai"
    assert report["world"] == "local"
    assert report["targets_met"] is True
    assert report["steps"] == STEPS
    assert report["clean_reply"] == DONE
    points: list[dict[str, Any]] = report["crash_points"]
    assert [p["crash_at"] for p in points] == POINTS
    for point in points:
        assert point["crashed"] is True, point
        assert point["repeated_model_calls"] == 0, point
        assert point["effects"] == 1, point
        assert point["reply_matches"] is True, point
        assert point["processes"][0] == "crash", point
        assert point["processes"][-1] == "done", point
    by_point = {p["crash_at"]: p for p in points}
    # Teeth: the model responses journaled before each crash are real records, and a crash
    # after a model step's call (its response lost) pays for that one request again.
    assert [by_point[f"{n}:before_run"]["journaled_model_calls"] for n in range(5)] == [
        0,
        1,
        1,
        2,
        2,
    ]
    assert by_point["4:after_run"]["replay_model_calls"] == 1
    # Around the never send: told it may or may not have happened, the model looked first.
    assert by_point["3:before_run"]["checked_sent"] == "no: nothing delivered"
    assert by_point["3:after_run"]["checked_sent"] == "yes: 1 delivered"
    assert by_point["3:after_run"]["told_possibly_ran"] is True
    assert "crashing at 10 points" in result.stderr
    assert "Warning" not in result.stderr  # nothing but the narrative from the processes
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []  # a temporary folder, not .workflow-data here


def _after(*results: tuple[str, str]) -> list[Any]:
    messages: list[Any] = [ModelRequest(parts=[UserPromptPart(MESSAGE)])]
    for index, (name, content) in enumerate(results):
        messages.append(ModelResponse(parts=[ToolCallPart(name, {}, f"c{index}")]))
        messages.append(ModelRequest(parts=[ToolReturnPart(name, content, f"c{index}")]))
    return messages


def _next(*results: tuple[str, str]) -> tuple[str, object]:
    """What the scripted model does after these tool results: (tool name, arguments) or
    ("text", the reply). It reads only the messages."""
    part = policy(_after(*results), cast(AgentInfo, None)).parts[0]
    if isinstance(part, ToolCallPart):
        return part.tool_name, part.args
    assert isinstance(part, TextPart)
    return "text", part.content


def test_the_scripted_model_checks_before_sending_again() -> None:
    note = ("lookup_note", "the note")
    mail = {"to": "ada@example.com", "subject": "Launch note", "body": "the note"}
    assert _next() == ("lookup_note", {"topic": "launch"})
    assert _next(note) == ("send_email", mail)
    cut_off = ("send_email", POSSIBLY_RAN)
    assert _next(note, cut_off) == (
        "check_sent",
        {"to": "ada@example.com", "subject": "Launch note"},
    )
    assert _next(note, cut_off, ("check_sent", "no: nothing delivered")) == ("send_email", mail)
    assert _next(note, cut_off, ("check_sent", "yes: 1 delivered")) == ("text", DONE)
    assert _next(note, ("send_email", "sent to ada@example.com")) == ("text", DONE)


def test_every_tool_of_the_example_agent_has_a_replay_label() -> None:
    agent = build()
    labels = {
        name: (tool.metadata or {})["world"]["replay"]
        for name, tool in agent._function_toolset.tools.items()
    }
    assert labels == {"lookup_note": "safe", "send_email": "never", "check_sent": "safe"}
