"""The crash-matrix agent: ``lookup_note`` (safe), ``send_email`` (never), ``check_sent`` (safe).

The agent of the reference exercise. A scripted, deterministic model drives it: it looks up
the note, emails it, and, when told the email "may or may not have happened", checks the
inbox (``check_sent``) before sending again; when the send was refused (nobody approved it)
it says so. ``send_email`` speaks SMTP to a real inbox. :func:`build_approval_agent` is the
same agent with ``send_email`` waiting for a person's approval (``world demo approval``).

Configured by environment (the demo sets it for each worker process):

``WORLD_DEMO_SMTP``              ``host:port`` of the SMTP inbox
``WORLD_DEMO_MAILDIR``           the inbox's Maildir (``check_sent`` reads it, as a mail API
                                 would)
``WORLD_DEMO_CALLS``             a file where each model call appends ``{"pid", "digest"}``
``WORLD_DEMO_SEND_REPLAY``       ``never`` (right) or ``safe`` (wrong, to show the duplicate)
``WORLD_DEMO_APPROVAL_TIMEOUT``  :func:`build_approval_agent`: seconds a send waits for a
                                 decision (default :data:`APPROVAL_TIMEOUT`)
"""

from __future__ import annotations

import json
import os
import re
import smtplib
from email.message import EmailMessage
from pathlib import Path
from typing import Annotated

from pydantic import Field

from world_core import (
    POSSIBLY_RAN,
    Agent,
    ModelReply,
    ModelRequest,
    Replay,
    ScriptedModel,
    ToolCall,
    ToolContext,
    ToolRegistry,
    digest_of,
    tool,
)
from world_core.errors import ConfigurationError
from world_examples._maildir import SESSION_HEADER, read_maildir

__all__ = [
    "APPROVAL_TIMEOUT",
    "MESSAGE",
    "NOTES",
    "approval_timeout_from_env",
    "build_agent",
    "build_approval_agent",
    "policy",
    "send_replay_from_env",
    "tools",
]

MESSAGE = "Please email the launch note to ada@example.com."
"""The user's message for the demo turn."""

NOTES = {
    "launch": "Launch is on Thursday at 10:00; the press kit is in the shared folder.",
}
SUBJECT = "Launch note"


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise ConfigurationError(f"set {name} (the demo sets it for its worker processes)")
    return value


SEND_TIMEOUT = 5.0
"""send_email's deadline: a worker taking over a turn whose send was interrupted waits this long
(from the send's start) before telling the model it may or may not have happened."""


def lookup_note(topic: Annotated[str, Field(description="the note's topic")]) -> str:
    """Read a note by topic."""
    return NOTES.get(topic, f"no note about {topic!r}")


def send_email(to: str, subject: str, body: str, context: ToolContext) -> str:
    """Send an email (SMTP)."""
    host, _, port = _env("WORLD_DEMO_SMTP").rpartition(":")
    message = EmailMessage()
    message["From"] = "agent@world.example"
    message["To"] = to
    message["Subject"] = subject
    message[SESSION_HEADER] = context.session_id
    message["X-Idempotency-Key"] = context.idempotency_key
    message.set_content(body)
    context.check()  # a worker resumed late (paused past its lease) must not send now
    with smtplib.SMTP(host, int(port), timeout=SEND_TIMEOUT - 1) as smtp:
        smtp.send_message(message)
    return f"sent to {to}"


def check_sent(to: str, subject: str, context: ToolContext) -> str:
    """Check the mail system: has an email with this subject reached this recipient?"""
    delivered = [
        m
        for m in read_maildir(Path(_env("WORLD_DEMO_MAILDIR")), context.session_id)
        if m["To"] == to and m["Subject"] == subject
    ]
    if delivered:
        return f"yes: {len(delivered)} delivered"
    return "no: nothing delivered"


def send_replay_from_env() -> Replay:
    """``WORLD_DEMO_SEND_REPLAY`` as a replay label (default ``never``)."""
    value = os.environ.get("WORLD_DEMO_SEND_REPLAY", "never")
    if value == "never":
        return "never"
    if value == "safe":
        return "safe"
    raise ConfigurationError(f"WORLD_DEMO_SEND_REPLAY must be 'never' or 'safe', got {value!r}")


APPROVAL_TIMEOUT = 120.0
"""Seconds :func:`build_approval_agent`'s send_email waits for a decision unless
``WORLD_DEMO_APPROVAL_TIMEOUT`` says otherwise."""


def tools(send_replay: Replay = "never", *, approval_timeout: float | None = None) -> ToolRegistry:
    """The three tools; ``send_replay`` labels send_email, and with ``approval_timeout`` every
    send waits (at most that many seconds) for a person's approval before it runs."""
    if approval_timeout is None:
        send = tool(send_email, replay="never", timeout=SEND_TIMEOUT)
    else:
        send = tool(
            send_email,
            replay="never",
            timeout=SEND_TIMEOUT,
            approval="required",
            approval_timeout=approval_timeout,
        )
    return ToolRegistry(
        [
            tool(lookup_note, replay="safe"),
            send.relabel(send_replay),
            tool(check_sent, replay="safe"),
        ]
    )


def _call(index: int, name: str, **arguments: str) -> ModelReply:
    return ModelReply(
        tool_calls=[ToolCall(id=f"call_{index}", name=name, arguments=json.dumps(arguments))]
    )


def policy(request: ModelRequest) -> ModelReply:
    """The scripted model: a function of the conversation only, so replays agree."""
    messages = request.messages
    start = max(i for i, m in enumerate(messages) if m["role"] == "user")
    turn = messages[start + 1 :]
    asked = len([m for m in turn if m["role"] == "assistant"])
    names = {
        call["id"]: call["function"]["name"]
        for m in turn
        if m["role"] == "assistant"
        for call in m.get("tool_calls") or []
    }
    results = [(names[m["tool_call_id"]], m["content"]) for m in turn if m["role"] == "tool"]
    found = re.search(r"[\w.+-]+@[\w.-]+\w", messages[start]["content"])
    to = found.group(0) if found else "nobody@example.com"
    if not results:
        return _call(asked, "lookup_note", topic="launch")
    note = next(content for name, content in results if name == "lookup_note")
    name, content = results[-1]
    done = ModelReply(content=f"Done: the launch note went to {to}.")
    if name == "lookup_note":
        return _call(asked, "send_email", to=to, subject=SUBJECT, body=note)
    if name == "send_email":
        # Told the call may or may not have happened: look before sending again.
        if content == POSSIBLY_RAN:
            return _call(asked, "check_sent", to=to, subject=SUBJECT)
        if content.startswith("Error: "):  # refused (not approved) or failed: say so
            why = content.removeprefix("Error: ").rstrip(".")
            return ModelReply(content=f"The launch note was not sent to {to}: {why}.")
        return done
    if name == "check_sent" and content.startswith("no"):
        return _call(asked, "send_email", to=to, subject=SUBJECT, body=note)
    return done


class _LoggedModel(ScriptedModel):
    """The scripted model, appending each call's request digest to a file the demo reads."""

    def __init__(self, calls_file: Path | None) -> None:
        super().__init__(policy)
        self._calls_file = calls_file

    async def complete(self, request: ModelRequest) -> ModelReply:
        if self._calls_file is not None:
            digest = digest_of(request.model_dump(mode="json"))
            line = json.dumps({"pid": os.getpid(), "digest": digest})
            with self._calls_file.open("a", encoding="utf-8") as handle:
                handle.write(line + "\n")
        return await super().complete(request)


_SYSTEM = "You are a careful assistant. Check before repeating anything with side effects."


def build_agent() -> Agent:
    """The agent for ``world worker --agent world_examples.crash_agent:build_agent``."""
    calls = os.environ.get("WORLD_DEMO_CALLS")
    return Agent(
        model=_LoggedModel(Path(calls) if calls else None),
        tools=tools(send_replay_from_env()),
        system=_SYSTEM,
    )


def approval_timeout_from_env() -> float:
    """``WORLD_DEMO_APPROVAL_TIMEOUT`` in seconds (default :data:`APPROVAL_TIMEOUT`)."""
    value = os.environ.get("WORLD_DEMO_APPROVAL_TIMEOUT", "").strip()
    if not value:
        return APPROVAL_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ConfigurationError(
            f"WORLD_DEMO_APPROVAL_TIMEOUT must be a number of seconds > 0, got {value!r}"
        )
    return seconds


def build_approval_agent() -> Agent:
    """The same agent, each send_email waiting for a person's approval (``world approve``):
    ``world worker --agent world_examples.crash_agent:build_approval_agent``."""
    calls = os.environ.get("WORLD_DEMO_CALLS")
    return Agent(
        model=_LoggedModel(Path(calls) if calls else None),
        tools=tools(send_replay_from_env(), approval_timeout=approval_timeout_from_env()),
        system=_SYSTEM,
    )
