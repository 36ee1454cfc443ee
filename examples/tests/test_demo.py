"""``world demo`` as a user runs it, and the pieces it is made of."""

from __future__ import annotations

import json
import os
import re
import signal
import smtplib
import subprocess
import sys
from email.message import EmailMessage
from pathlib import Path

import pytest

from world_core import POSSIBLY_RAN, ModelRequest
from world_examples.crash_agent import MESSAGE, policy
from world_examples.inbox import SESSION_HEADER, Inbox

HERE = Path(__file__).resolve().parent
COMMAND = [sys.executable, "-m", "world_core._cli"]
POINTS = [f"{n}:{when}" for n in range(5) for when in ("before_run", "after_run")]


def _environment(env: dict[str, str]) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("WORKFLOW_")}
    environment.pop("CRASH_AT", None)
    environment.update(env)
    return environment


def _world(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *args],
        cwd=cwd,
        env=_environment(env),
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )


def _running_demo(cwd: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*COMMAND, "demo"],
        cwd=cwd,
        env=_environment(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )


@pytest.mark.timeout(300)
def test_world_demo_json_on_the_default_world(tmp_path: Path) -> None:
    result = _world("demo", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["world"] == "local"
    assert report["targets_met"] is True
    assert report["steps"] == ["model", "tool lookup_note", "model", "tool send_email", "model"]
    assert report["namespace"].startswith("demo_")
    points = report["crash_points"]
    assert [p["crash_at"] for p in points] == POINTS
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
        # Told "may or may not have happened" exactly where send_email was cut off, and then
        # the agent looked before sending: nothing there before the send, the email after it.
        told = point["crash_at"] in ("3:before_run", "3:after_run")
        assert point["told_possibly_ran"] is told, point
        checked = {"3:before_run": "no", "3:after_run": "yes"}.get(point["crash_at"])
        assert (point["checked_sent"] or "")[:3].split(":")[0] == (checked or ""), point
        assert bool(point["note"]) is told, point
    wrong = report["relabelled"]
    assert wrong["send_email_replay"] == "safe"
    assert wrong["crash_at"] == "3:after_run"
    assert wrong["emails"] == 2
    assert wrong["checked_sent"] is None  # safe: run again without looking
    assert "crashing at 10 points" in result.stderr  # the narrative goes to stderr with --json
    assert "interrupted" not in result.stderr
    assert list(tmp_path.iterdir()) == []  # a temporary folder, not .workflow-data here


@pytest.mark.timeout(300)
def test_world_demo_text_honours_the_folder_and_namespace_and_explains_itself(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    result = _world(
        "demo", cwd=tmp_path, WORKFLOW_LOCAL_DIR=str(data), WORKFLOW_NAMESPACE="tenant_a"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    # Its own namespace, named after WORKFLOW_NAMESPACE, in WORKFLOW_LOCAL_DIR, cleaned up.
    found = re.search(r"namespace (tenant_a_demo_[0-9a-f]{8})\b", out)
    assert found, out
    assert f"in folder {data}" in out
    assert list(data.iterdir()) == []
    assert sorted(path.name for path in tmp_path.iterdir()) == ["data"]
    # What a newcomer needs before the numbers: no key, no cost, a real inbox, how long.
    for phrase in ("no API key", "no cost", "SMTP server on 127.0.0.1", "half a minute"):
        assert phrase in out
    # The legend explains each column and both kinds of crash point.
    for term in ("n:before_run", "n:after_run", "steps count from 0"):
        assert term in out
    header = "crash at      step               journaled  replay  repeated  emails  reply"
    assert header in out
    for column in ("step", "journaled", "replay", "repeated", "emails", "reply"):
        assert re.search(rf"^   {column} +\S", out, re.MULTILINE), column
    # Rows in crash-point order (not as they finished), the two cut-off sends marked.
    table = out.split(header, 1)[1]
    rows = [line.split()[0] for line in table.splitlines() if line[:1].isdigit()]
    assert rows[: len(POINTS)] == POINTS
    marked = [line.split()[0] for line in table.splitlines() if line.endswith(" *")]
    assert marked == ["3:before_run", "3:after_run"]
    assert '"may or may not have happened"' in out
    assert "3:before_run  check_sent found nothing, so the model sent the email" in out
    assert "3:after_run   check_sent found the email, so it was not sent again" in out
    assert "Targets met" in out
    assert "\r" not in out  # no progress line when stdout is not a terminal
    assert result.stderr == ""


@pytest.mark.parametrize(
    ("variable", "value"),
    [("WORKFLOW_NAMESPACE", "Not-A-Namespace"), ("WORKFLOW_LOCAL_DIR", "file://elsewhere/x")],
)
def test_world_demo_refuses_a_bad_setting_naming_it(
    tmp_path: Path, variable: str, value: str
) -> None:
    result = _world("demo", cwd=tmp_path, **{variable: value})
    assert result.returncode == 2
    assert result.stderr.startswith("world: error: ")
    assert variable in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert result.stdout == ""


def test_world_demo_refuses_a_world_that_cannot_be_shared_at_once(tmp_path: Path) -> None:
    result = _world(
        "demo",
        "--world",
        "unshared_world:connect",
        "--url",
        str(tmp_path / "world"),
        cwd=tmp_path,
        PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "cannot be shared by several processes" in result.stderr
    assert "--world or WORKFLOW_TARGET_WORLD" in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert "clean turn" not in result.stdout  # refused before any worker was started
    world = tmp_path / "world"  # nothing left behind (opening a local World makes no folder)
    assert not world.exists() or list(world.iterdir()) == []


def test_world_demo_stops_quietly_when_its_reader_goes(tmp_path: Path) -> None:
    (tmp_path / "tmp").mkdir()
    process = _running_demo(tmp_path, TMPDIR=str(tmp_path / "tmp"))
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("world demo")
        process.stdout.close()  # as `world demo | head -1` does
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 141
    assert len(stderr.splitlines()) <= 1, stderr
    assert list((tmp_path / "tmp").iterdir()) == []  # the run's folder was still removed


@pytest.mark.timeout(300)
def test_world_demo_ctrl_c_prints_one_line(tmp_path: Path) -> None:
    (tmp_path / "tmp").mkdir()
    process = _running_demo(tmp_path, TMPDIR=str(tmp_path / "tmp"))
    try:
        assert process.stdout is not None
        for line in process.stdout:  # wait until crashed workers are running
            if line.startswith("crash at"):
                break
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C sends: the foreground group
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130
    assert stderr == "interrupted\n"
    assert list((tmp_path / "tmp").iterdir()) == []


def test_demo_is_a_world_command(tmp_path: Path) -> None:
    result = _world("--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "demo" in result.stdout
    assert "Start with: world demo" in result.stdout


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
