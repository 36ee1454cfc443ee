"""Model clients: the protocol the journal calls, a scripted model and an OpenAI-compatible one.

Messages are OpenAI chat-completions messages as plain JSON objects (``{"role": "user",
"content": "..."}``, assistant messages with ``tool_calls``, ``{"role": "tool",
"tool_call_id": ..., "content": ...}``), so what the journal digests is exactly what goes on
the wire.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from world_core.errors import (
    BackendUnavailableError,
    ConfigurationError,
    InvalidArgumentError,
)

if TYPE_CHECKING:
    import httpx

__all__ = [
    "MODEL_API_KEY_VARIABLE",
    "MODEL_BASE_URL_VARIABLE",
    "MODEL_VARIABLE",
    "Message",
    "ModelClient",
    "ModelReply",
    "ModelRequest",
    "OpenAIChatModel",
    "ScriptedModel",
    "ToolCall",
]

MODEL_BASE_URL_VARIABLE = "WORKFLOW_MODEL_BASE_URL"
MODEL_API_KEY_VARIABLE = "WORKFLOW_MODEL_API_KEY"
MODEL_VARIABLE = "WORKFLOW_MODEL"

Message = dict[str, Any]
"""One chat-completions message, as JSON."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ToolCall(_Frozen):
    """A tool call the model asked for. ``arguments`` is the JSON text exactly as sent."""

    id: str
    name: str
    arguments: str = "{}"


class ModelReply(_Frozen):
    """What the model answered: text, tool calls, or both."""

    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)

    def as_message(self) -> Message:
        """This reply as the assistant message to append to the conversation."""
        message: Message = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in self.tool_calls
            ]
        return message


class ModelRequest(_Frozen):
    """The whole input of one model call: the conversation and the tools offered."""

    messages: list[Message]
    tools: list[dict[str, Any]] = Field(default_factory=list)


class ModelClient(Protocol):
    """What the journal calls for a model step. Implementations may raise any error for a
    failed call; nothing is journaled then, and the step runs again on the next attempt."""

    async def complete(self, request: ModelRequest) -> ModelReply:
        """Answer one request."""
        ...


class ScriptedModel:
    """A deterministic model: ``policy`` maps the request to the reply.

    For tests and examples: the same conversation always gets the same answer, so replays and
    crash matrices are reproducible. Every call is kept in ``calls``.
    """

    def __init__(self, policy: Callable[[ModelRequest], ModelReply]) -> None:
        self._policy = policy
        self.calls: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelReply:
        self.calls.append(request)
        return self._policy(request)

    def __repr__(self) -> str:
        return f"ScriptedModel(calls={len(self.calls)})"


class OpenAIChatModel:
    """A chat-completions client (OpenAI and compatible servers) over httpx, with tool calls.

    Args:
        base_url: the API root, e.g. ``https://api.openai.com/v1``; ``/chat/completions`` is
            appended.
        api_key: sent as a bearer token; never shown in ``repr``, logs or error messages.
        model: the model name sent with each request.
        timeout: seconds for one request.
        temperature: sent when not None (0 makes providers as repeatable as they get; replay
            never depends on it, because finished calls are read from the journal).
    """

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        model: str,
        timeout: float = 120.0,
        temperature: float | None = 0.0,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ConfigurationError(
                f"{MODEL_BASE_URL_VARIABLE} must be an http(s) URL such as "
                "https://api.openai.com/v1"
            )
        if not model:
            raise ConfigurationError(f"set {MODEL_VARIABLE} to the model name")
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._key = api_key
        self.model = model
        self._temperature = temperature
        import httpx  # here, not at the top: worker processes without this client start faster

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(headers=headers, timeout=timeout)

    @classmethod
    def from_env(cls) -> OpenAIChatModel:
        """Configure from WORKFLOW_MODEL_BASE_URL, WORKFLOW_MODEL_API_KEY and WORKFLOW_MODEL.

        Raises:
            ConfigurationError: a variable is missing (the message names it; never its value).
        """
        base_url = os.environ.get(MODEL_BASE_URL_VARIABLE, "")
        model = os.environ.get(MODEL_VARIABLE, "")
        if MODEL_API_KEY_VARIABLE not in os.environ:
            raise ConfigurationError(
                f"set {MODEL_API_KEY_VARIABLE} (use an empty value for a server without keys)"
            )
        if not base_url:
            raise ConfigurationError(
                f"set {MODEL_BASE_URL_VARIABLE}, e.g. https://api.openai.com/v1"
            )
        return cls(base_url=base_url, api_key=os.environ[MODEL_API_KEY_VARIABLE], model=model)

    def __repr__(self) -> str:
        return f"OpenAIChatModel(url={self._url!r}, model={self.model!r}, api_key=***)"

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._http.aclose()

    def _scrub(self, text: str) -> str:
        return text.replace(self._key, "***") if self._key else text

    async def complete(self, request: ModelRequest) -> ModelReply:
        """POST the conversation; return the first choice.

        Raises:
            BackendUnavailableError: network failure, timeout, 429 or 5xx (retry later).
            ConfigurationError: 401, 403 or 404 (key, permissions or model name are wrong).
            InvalidArgumentError: another 4xx, or an answer that is not a chat completion.
        """
        body: dict[str, Any] = {"model": self.model, "messages": request.messages}
        if request.tools:
            body["tools"] = request.tools
        if self._temperature is not None:
            body["temperature"] = self._temperature
        import httpx

        try:
            response = await self._http.post(self._url, json=body)
        except httpx.HTTPError as exc:
            raise BackendUnavailableError(
                f"model server {self._url} unreachable ({type(exc).__name__}); retry later"
            ) from None
        if response.status_code >= 400:
            detail = self._scrub(response.text[:300])
            status = response.status_code
            message = f"model server answered {status} for {self.model!r}: {detail}"
            if status == 429 or status >= 500:
                raise BackendUnavailableError(message + " (retry later)")
            if status in (401, 403, 404):
                raise ConfigurationError(
                    message + f" (check {MODEL_API_KEY_VARIABLE} and {MODEL_VARIABLE})"
                )
            raise InvalidArgumentError(message)
        return self._parse(response)

    def _parse(self, response: httpx.Response) -> ModelReply:
        try:
            message = response.json()["choices"][0]["message"]
            calls = [
                ToolCall(
                    id=str(call["id"]),
                    name=str(call["function"]["name"]),
                    arguments=_arguments_text(call["function"].get("arguments")),
                )
                for call in message.get("tool_calls") or []
            ]
            content = message.get("content")
            return ModelReply(content=None if content is None else str(content), tool_calls=calls)
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise InvalidArgumentError(
                f"model server {self._url} sent something that is not a chat completion: "
                f"{self._scrub(response.text[:200])!r}"
            ) from exc


def _arguments_text(arguments: object) -> str:
    # Some compatible servers send an object instead of the JSON text OpenAI sends.
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, separators=(",", ":"), sort_keys=True)
