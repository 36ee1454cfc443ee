"""``world demo`` as a user runs it, and the pieces it is made of."""

from __future__ import annotations

import json
import os
import smtplib
import subprocess
import sys
from email.message import EmailMessage
from pathlib import Path

import pytest

from world_core import POSSIBLY_RAN, ModelRequest
from world_examples.crash_agent import MESSAGE, policy
from world_examples.inbox import SESSION_HEADER, Inbox


def _world(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKFLOW_")}
    env.pop("CRASH_AT", None)
    return subprocess.run(
        [sys.executable, "-m", "world_core._cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )


@pytest.mark.timeout(300)
def test_world_demo_json_on_the_default_world(tmp_path: Path) -> None:
    result = _world("demo", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["world"] == "local"
    assert report["targets_met"] is True
    assert report["steps"] == ["model", "tool lookup_note", "model", "tool send_email", "model"]
    points = report["crash_points"]
    assert [p["crash_at"] for p in points] == [
        f"{n}:{when}" for n in range(5) for when in ("before_run", "after_run")
    ]
    for point in points:
        assert point["crashed"] is True, point
        assert point["repeated_model_calls"] == 0, point
        assert point["emails"] == 1, point
        assert point["reply_matches"] is True, point
        # The zero counts against real records: the model steps (0, 2, 4) before the crash
        # were journaled, and the fresh worker did make the model calls after it.
        step = int(point["crash_at"].split(":")[0])
        assert point["finished_model_steps"] == len([m for m in (0, 2, 4) if m < step]), point
        assert point["replay_model_calls"] >= 1, point
    wrong = report["relabelled"]
    assert wrong["send_email_replay"] == "safe"
    assert wrong["crash_at"] == "3:after_run"
    assert wrong["emails"] == 2
    assert "crashing at 10 points" in result.stderr  # progress goes to stderr with --json
    assert list(tmp_path.iterdir()) == []  # a temporary folder, not .workflow-data here


def test_demo_is_a_world_command(tmp_path: Path) -> None:
    result = _world("--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "demo" in result.stdout


def test_inbox_receives_real_smtp(tmp_path: Path) -> None:
    with Inbox(tmp_path / "mail") as inbox:
        for session in ("a", "b", "a"):
            message = EmailMessage()
            message["To"] = "ada@example.com"
            message["Subject"] = "hi"
            message[SESSION_HEADER] = session
            message.set_content("hello")
            with smtplib.SMTP("127.0.0.1", inbox.port, timeout=10) as smtp:
                smtp.send_message(message)
        assert len(inbox.messages("a")) == 2
        assert len(inbox.messages("b")) == 1
        assert len(inbox.messages()) == 3


def _conversation(*results: tuple[str, str, str]) -> ModelRequest:
    messages: list[dict[str, object]] = [{"role": "user", "content": MESSAGE}]
    for index, (name, arguments, content) in enumerate(results):
        call: dict[str, object] = {"id": f"c{index}", "type": "function"}
        call["function"] = {"name": name, "arguments": arguments}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{index}", "content": content})
    return ModelRequest(messages=messages)


def test_scripted_model_checks_before_sending_again() -> None:
    first = policy(_conversation())
    assert first.tool_calls[0].name == "lookup_note"
    note = ("lookup_note", '{"topic": "launch"}', "the note")
    send = policy(_conversation(note)).tool_calls[0]
    assert send.name == "send_email"
    assert json.loads(send.arguments)["to"] == "ada@example.com"
    interrupted = ("send_email", send.arguments, POSSIBLY_RAN)
    check = policy(_conversation(note, interrupted)).tool_calls[0]
    assert check.name == "check_sent"
    not_sent = ("check_sent", check.arguments, "no: nothing delivered")
    assert policy(_conversation(note, interrupted, not_sent)).tool_calls[0].name == "send_email"
    sent = ("check_sent", check.arguments, "yes: 1 delivered")
    done = policy(_conversation(note, interrupted, sent))
    assert done.tool_calls == []
    assert done.content == policy(_conversation(note, ("send_email", "{}", "sent"))).content
