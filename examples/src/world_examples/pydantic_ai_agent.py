"""A pydantic-ai agent made durable: the crash-matrix agent, written with pydantic-ai.

The agent is plain pydantic-ai code: ``Agent`` with three tools, ``lookup_note`` (safe to run
again), ``send_email`` (must never run twice: it speaks SMTP to a real inbox) and
``check_sent`` (safe: reads the inbox). What makes it durable is one capability,
``WorldDurability()``, and a replay label in each tool's metadata; :func:`build_agent` wraps
it in ``WorldAgent`` for a ``world`` worker.

A scripted model (pydantic-ai's ``FunctionModel`` running :func:`policy`) drives it without an
API key: it looks up the note, emails it, and, when told the email "may or may not have
happened", checks the inbox before sending again. For a real model, pass a model name instead
(``Agent("openai:gpt-4o", ...)``).

Run it as ``world worker --agent world_examples.pydantic_ai_agent:build_agent`` (``world demo
pydantic-ai`` does, crashing it at every step). Configured by environment, as
:mod:`world_examples.crash_agent` is: ``WORLD_DEMO_SMTP`` (``host:port`` of the inbox),
``WORLD_DEMO_MAILDIR`` (the inbox's Maildir, for ``check_sent``), ``WORLD_DEMO_CALLS`` (a
file each model call appends ``{"pid", "digest"}`` to).
"""

from __future__ import annotations

import json
import os
import re
import smtplib
from email.message import EmailMessage
from pathlib import Path

from pydantic_ai import Agent, Tool
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from world_core import POSSIBLY_RAN, digest_of
from world_core.errors import ConfigurationError
from world_core.integrations.pydantic_ai import WorldAgent, WorldDurability, tool_context
from world_examples._maildir import SESSION_HEADER, read_maildir

__all__ = ["MESSAGE", "SEND_TIMEOUT", "build", "build_agent", "policy", "request_digest"]

MESSAGE = "Please email the launch note to ada@example.com."
"""The user's message for the demo turn."""

NOTE = "Launch is on Thursday at 10:00; the press kit is in the shared folder."
SUBJECT = "Launch note"
SEND_TIMEOUT = 5.0
"""send_email's deadline: a worker taking over a turn whose send was cut off waits this long
(from the send's start) before the model is told it may or may not have happened."""


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise ConfigurationError(f"set {name} (the demo sets it for its worker processes)")
    return value


def lookup_note(topic: str) -> str:
    """Read a note by topic."""
    return NOTE if topic == "launch" else f"no note about {topic!r}"


def send_email(to: str, subject: str, body: str) -> str:
    """Send an email (SMTP)."""
    context = tool_context()  # the journal step's: its idempotency key, its deadline
    host, _, port = _env("WORLD_DEMO_SMTP").rpartition(":")
    message = EmailMessage()
    message["From"] = "agent@world.example"
    message["To"] = to
    message["Subject"] = subject
    if context is not None:
        message[SESSION_HEADER] = context.session_id
        message["X-Idempotency-Key"] = context.idempotency_key
        context.check()  # a worker resumed late (paused past its lease) must not send now
    message.set_content(body)
    with smtplib.SMTP(host, int(port), timeout=SEND_TIMEOUT - 1) as smtp:
        smtp.send_message(message)
    return f"sent to {to}"


def check_sent(to: str, subject: str) -> str:
    """Check the mail system: has an email with this subject reached this recipient?"""
    context = tool_context()
    session = context.session_id if context is not None else None
    delivered = [
        m
        for m in read_maildir(Path(_env("WORLD_DEMO_MAILDIR")), session)
        if m["To"] == to and m["Subject"] == subject
    ]
    return f"yes: {len(delivered)} delivered" if delivered else "no: nothing delivered"


def _call(name: str, index: int, **arguments: str) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(name, arguments, tool_call_id=f"call_{index}")])


def policy(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The scripted model: a function of the conversation only, so replays agree."""
    prompt = ""
    results: list[tuple[str, str]] = []
    asked = 0
    for message in messages:
        if isinstance(message, ModelResponse):
            asked += 1
            continue
        for part in message.parts:
            if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                prompt, results, asked = part.content, [], 0  # this turn starts here
            elif isinstance(part, ToolReturnPart | RetryPromptPart) and part.tool_name:
                content = part.content if isinstance(part.content, str) else str(part.content)
                results.append((part.tool_name, content))
    found = re.search(r"[\w.+-]+@[\w.-]+\w", prompt)
    to = found.group(0) if found else "nobody@example.com"
    done = ModelResponse(parts=[TextPart(f"Done: the launch note went to {to}.")])
    if not results:
        return _call("lookup_note", asked, topic="launch")
    note = next(content for name, content in results if name == "lookup_note")
    name, content = results[-1]
    if name == "lookup_note":
        return _call("send_email", asked, to=to, subject=SUBJECT, body=note)
    if name == "send_email":
        if POSSIBLY_RAN in content:  # it may or may not have happened: look before resending
            return _call("check_sent", asked, to=to, subject=SUBJECT)
        return done
    if name == "check_sent" and content.startswith("no"):
        return _call("send_email", asked, to=to, subject=SUBJECT, body=note)
    return done


def request_digest(messages: list[ModelMessage]) -> str:
    """What a model call was asked, as a digest: the messages without their timestamps (a
    replay stamps new ones). Equal digests: the same request."""
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    def strip(value: object) -> object:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "timestamp"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return digest_of(strip(ModelMessagesTypeAdapter.dump_python(messages, mode="json")))


def _logged(calls: Path | None) -> FunctionModel:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if calls is not None:
            line = json.dumps({"pid": os.getpid(), "digest": request_digest(messages)})
            with calls.open("a", encoding="utf-8") as handle:
                handle.write(line + "\n")
        return policy(messages, info)

    return FunctionModel(model, model_name="scripted")


def build(model: FunctionModel | None = None) -> Agent[None, str]:
    """The pydantic-ai agent: durable through ``WorldDurability``, each tool labelled."""
    return Agent(
        model if model is not None else _logged(None),
        name="launch_mailer",
        instructions="You are a careful assistant. Check before repeating anything with effects.",
        tools=[
            Tool(lookup_note, metadata={"world": {"replay": "safe"}}),
            Tool(
                send_email,
                metadata={"world": {"replay": "never", "timeout": SEND_TIMEOUT}},
            ),
            Tool(check_sent, metadata={"world": {"replay": "safe"}}),
        ],
        capabilities=[WorldDurability()],
    )


def build_agent() -> WorldAgent:
    """The agent for ``world worker --agent world_examples.pydantic_ai_agent:build_agent``."""
    calls = os.environ.get("WORLD_DEMO_CALLS")
    return WorldAgent(build(_logged(Path(calls) if calls else None)))
