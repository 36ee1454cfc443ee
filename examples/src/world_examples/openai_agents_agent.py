"""An OpenAI Agents SDK agent made durable: the crash-matrix agent, written with the SDK.

The agent is plain SDK code: ``Agent`` with three ``@function_tool`` tools, ``lookup_note``
(safe to run again), ``send_email`` (must never run twice: it speaks SMTP to a real inbox)
and ``check_sent`` (safe: reads the inbox). :class:`DurableAgent` makes it durable: the one
line that matters is the replay label of each tool.

A scripted model (:class:`PolicyModel`, an SDK ``Model``) drives it without an API key: it
looks up the note, emails it, and, when told the email "may or may not have happened", checks
the inbox before sending again. For a real model, drop ``model=`` (the agent then uses the
SDK's OpenAI provider and ``OPENAI_API_KEY``).

Run it as ``world worker --agent world_examples.openai_agents_agent:build_agent`` (``world demo
openai-agents`` does, crashing it at every step). Configured by environment, as
:mod:`world_examples.crash_agent` is: ``WORLD_DEMO_SMTP`` (``host:port`` of the inbox),
``WORLD_DEMO_MAILDIR`` (the inbox's Maildir, for ``check_sent``), ``WORLD_DEMO_CALLS`` (a
file each model call appends ``{"pid", "digest"}`` to), ``WORLD_DEMO_SEND_REPLAY``
(``never``, or ``safe`` to show the duplicate a wrong label lets through).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import smtplib
from collections.abc import AsyncIterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from agents import (
    Agent,
    Model,
    ModelResponse,
    ModelSettings,
    ModelTracing,
    TResponseInputItem,
    Usage,
    function_tool,
    set_tracing_disabled,
)
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import TResponseStreamEvent
from agents.tool import Tool
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from openai.types.responses.response_prompt_param import ResponsePromptParam
from pydantic_core import to_jsonable_python

from world_core import POSSIBLY_RAN, Replay, canonical_json
from world_core.errors import ConfigurationError
from world_core.integrations.openai_agents import DurableAgent, tool_context
from world_examples._maildir import SESSION_HEADER, read_maildir
from world_examples.crash_agent import (
    MESSAGE,
    NOTES,
    SEND_TIMEOUT,
    SUBJECT,
    approval_timeout_from_env,
    send_replay_from_env,
)

__all__ = [
    "INSTRUCTIONS",
    "MESSAGE",
    "PolicyModel",
    "build_agent",
    "build_approval_agent",
    "check_sent",
    "durable_agent",
    "lookup_note",
    "policy",
    "sdk_agent",
    "send_email",
]

set_tracing_disabled(True)  # a scripted model needs no trace export (and no network)


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise ConfigurationError(f"set {name} (the demo sets it for its worker processes)")
    return value


@function_tool
def lookup_note(topic: str) -> str:
    """Read a note by topic.

    Args:
        topic: the note's topic.
    """
    return NOTES.get(topic, f"no note about {topic!r}")


@function_tool
def send_email(to: str, subject: str, body: str) -> str:
    """Send an email (SMTP).

    Args:
        to: the recipient.
        subject: the subject line.
        body: the text.
    """
    context = tool_context()  # the journal's view of this call: session, idempotency key
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


@function_tool
def check_sent(to: str, subject: str) -> str:
    """Check the mail system: has an email with this subject reached this recipient?

    Args:
        to: the recipient.
        subject: the subject line.
    """
    session = tool_context().session_id
    delivered = [
        m
        for m in read_maildir(Path(_env("WORLD_DEMO_MAILDIR")), session)
        if m["To"] == to and m["Subject"] == subject
    ]
    return f"yes: {len(delivered)} delivered" if delivered else "no: nothing delivered"


def _item(value: object) -> dict[str, Any]:
    jsonable = to_jsonable_python(value, exclude_none=True)
    return jsonable if isinstance(jsonable, dict) else {}


def _call(index: int, name: str, **arguments: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call",
        id=f"fc_{index}",
        call_id=f"call_{index}",
        name=name,
        arguments=json.dumps(arguments),
    )


def _say(index: int, text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        type="message",
        id=f"msg_{index}",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def policy(items: list[dict[str, Any]]) -> ResponseFunctionToolCall | ResponseOutputMessage:
    """The scripted model: a function of the conversation only (input items), so replays
    agree. The same script as :func:`world_examples.crash_agent.policy`."""
    start = max(i for i, item in enumerate(items) if item.get("role") == "user")
    turn = items[start + 1 :]
    asked = len([i for i in turn if i.get("type") in ("function_call", "message")])
    names = {i["call_id"]: i["name"] for i in turn if i.get("type") == "function_call"}
    results = [
        (names.get(i["call_id"], "?"), str(i.get("output", "")))
        for i in turn
        if i.get("type") == "function_call_output"
    ]
    found = re.search(r"[\w.+-]+@[\w.-]+\w", _text(items[start].get("content")))
    to = found.group(0) if found else "nobody@example.com"
    if not results:
        return _call(asked, "lookup_note", topic="launch")
    note = next(content for name, content in results if name == "lookup_note")
    name, content = results[-1]
    done = _say(asked, f"Done: the launch note went to {to}.")
    if name == "lookup_note":
        return _call(asked, "send_email", to=to, subject=SUBJECT, body=note)
    if name == "send_email":
        if content == POSSIBLY_RAN:  # it may or may not have happened: look first
            return _call(asked, "check_sent", to=to, subject=SUBJECT)
        if not content.startswith("sent"):  # refused (not approved) or failed: say so
            return _say(asked, f"The launch note was not sent to {to}: {content}")
        return done
    if name == "check_sent" and content.startswith("no"):
        return _call(asked, "send_email", to=to, subject=SUBJECT, body=note)
    return done


class PolicyModel(Model):
    """An SDK ``Model`` answering with :func:`policy`; no API key, no network. With
    ``calls_file``, each call appends ``{"pid", "digest"}`` (the digest of its input) there,
    so the demo can count the calls a process made."""

    def __init__(self, calls_file: Path | None = None) -> None:
        self.calls_file = calls_file
        self.digests: list[str] = []
        """The digest of each call's input, in call order."""

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        jsonable = [_item(item) for item in items]
        digest = hashlib.sha256(canonical_json(jsonable)).hexdigest()
        self.digests.append(digest)
        if self.calls_file is not None:
            line = json.dumps({"pid": os.getpid(), "digest": digest})
            with self.calls_file.open("a", encoding="utf-8") as handle:
                handle.write(line + "\n")
        return ModelResponse(output=[policy(jsonable)], usage=Usage(requests=1), response_id=None)

    def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("PolicyModel answers Runner.run only")


INSTRUCTIONS = "You are a careful assistant. Check before repeating anything with side effects."


def sdk_agent(model: Model | None = None, *, needs_approval: bool = False) -> Agent[Any]:
    """The plain SDK agent, what a user already has (``needs_approval``: the SDK's own flag
    on ``send_email``). ``model`` None: :class:`PolicyModel`."""
    send = dataclasses.replace(send_email, needs_approval=True) if needs_approval else send_email
    return Agent(
        name="mailer",
        instructions=INSTRUCTIONS,
        model=model if model is not None else PolicyModel(),
        tools=[lookup_note, send, check_sent],
    )


def durable_agent(
    model: Model | None = None,
    *,
    send_replay: Replay = "never",
    send_timeout: float = SEND_TIMEOUT,
    needs_approval: bool = False,
    approval_timeout: float = 120.0,
) -> DurableAgent:
    """The SDK agent made durable: a replay label per tool, and ``send_email``'s deadline."""
    return DurableAgent(
        sdk_agent(model, needs_approval=needs_approval),
        replay={"lookup_note": "safe", "send_email": send_replay, "check_sent": "safe"},
        timeouts={"send_email": send_timeout},
        approval_timeout=approval_timeout,
    )


def _calls_file() -> Path | None:
    calls = os.environ.get("WORLD_DEMO_CALLS")
    return Path(calls) if calls else None


def build_agent() -> DurableAgent:
    """For ``world worker --agent world_examples.openai_agents_agent:build_agent``."""
    return durable_agent(PolicyModel(_calls_file()), send_replay=send_replay_from_env())


def build_approval_agent() -> DurableAgent:
    """The same agent with ``send_email`` declared ``needs_approval=True``: each send waits
    for ``world approve`` (at most ``WORLD_DEMO_APPROVAL_TIMEOUT`` seconds, default 120)."""
    seconds = approval_timeout_from_env()
    return durable_agent(PolicyModel(_calls_file()), needs_approval=True, approval_timeout=seconds)
