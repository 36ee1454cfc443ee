"""Model clients: the protocol the journal calls, a scripted model and an OpenAI-compatible one.

Messages are OpenAI chat-completions messages as plain JSON objects (``{"role": "user",
"content": "..."}``, assistant messages with ``tool_calls``, ``{"role": "tool",
"tool_call_id": ..., "content": ...}``), so what the journal digests is exactly what goes on
the wire.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, Protocol

import anyio
from pydantic import BaseModel, ConfigDict, Field

from world_core.errors import (
    BackendUnavailableError,
    ConfigurationError,
    InvalidArgumentError,
    ModelReplyError,
)

if TYPE_CHECKING:
    import httpx

__all__ = [
    "MODEL_API_KEY_VARIABLE",
    "MODEL_BASE_URL_VARIABLE",
    "MODEL_RETRY_BUDGET_VARIABLE",
    "MODEL_VARIABLE",
    "Message",
    "ModelClient",
    "ModelReply",
    "ModelRequest",
    "OpenAIChatModel",
    "ScriptedModel",
    "StreamingModelClient",
    "TextSink",
    "ToolCall",
]

MODEL_BASE_URL_VARIABLE = "WORKFLOW_MODEL_BASE_URL"
MODEL_API_KEY_VARIABLE = "WORKFLOW_MODEL_API_KEY"
MODEL_VARIABLE = "WORKFLOW_MODEL"
MODEL_RETRY_BUDGET_VARIABLE = "WORKFLOW_MODEL_RETRY_BUDGET"

_log = logging.getLogger("world.model")

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
    usage: dict[str, int] | None = None
    """Token counts as the model server reported them (``prompt_tokens``,
    ``completion_tokens``, ``total_tokens`` for an OpenAI-compatible server), or None when it
    reported none. Recorded with the step's outcome (only when present) for traces."""

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
    failed call; nothing is journaled then, and the step runs again on the next attempt. The
    exception is :class:`~world_core.errors.ModelReplyError` (an answer that was paid for but
    cannot be used): the journal records it, so the same request is never paid for twice."""

    async def complete(self, request: ModelRequest) -> ModelReply:
        """Answer one request."""
        ...


TextSink = Callable[[str, int], None]
"""Receives a streamed reply's text as ``(delta, retry)``: ``retry`` counts the client's
retries of the request, so a new value means the text of the earlier try was abandoned (its
stream broke and the request was sent again)."""


class StreamingModelClient(ModelClient, Protocol):
    """A model client that can also stream its reply.

    :meth:`stream` answers exactly like ``complete`` (the same reply, recorded the same way:
    a streamed reply is assembled before the journal sees it) and passes the reply's text to
    ``on_text`` piece by piece as it arrives. The journal streams when an observer watches
    the turn (the worker's live events do), and calls ``complete`` otherwise.
    """

    async def stream(self, request: ModelRequest, on_text: TextSink) -> ModelReply:
        """Answer one request, passing its text to ``on_text`` as it arrives."""
        ...


_WORDS = re.compile(r"\s*\S+\s*|\s+")


class ScriptedModel:
    """A deterministic model: ``policy`` maps the request to the reply.

    For tests and examples: the same conversation always gets the same answer, so replays and
    crash matrices are reproducible. Every call is kept in ``calls``. It streams too
    (:meth:`stream`): the reply's text word by word, ``stream_delay`` seconds apart.

    Raises:
        InvalidArgumentError: ``stream_delay`` is not a number of seconds >= 0.
    """

    def __init__(
        self, policy: Callable[[ModelRequest], ModelReply], *, stream_delay: float = 0.0
    ) -> None:
        if (
            isinstance(stream_delay, bool)
            or not isinstance(stream_delay, int | float)
            or not math.isfinite(stream_delay)
            or stream_delay < 0
        ):
            raise InvalidArgumentError(
                f"stream_delay must be a number of seconds >= 0, got {stream_delay!r}"
            )
        self._policy = policy
        self._stream_delay = float(stream_delay)
        self.calls: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelReply:
        self.calls.append(request)
        return self._policy(request)

    async def stream(self, request: ModelRequest, on_text: TextSink) -> ModelReply:
        """The reply :meth:`complete` gives, its text passed to ``on_text`` word by word."""
        reply = await self.complete(request)
        for piece in _WORDS.findall(reply.content or ""):
            if self._stream_delay:
                await anyio.sleep(self._stream_delay)
            on_text(piece, 0)
        return reply

    def __repr__(self) -> str:
        return f"ScriptedModel(calls={len(self.calls)})"


_DEFAULT_RETRY_BUDGET = 300.0

_BACKOFF_CAP = 30.0
"""The longest wait between two attempts when the server does not say how long to wait."""

_RAW_LIMIT = 2000
"""Characters of an unusable reply kept in ``ModelReplyError.raw``."""

_DETAIL_LIMIT = 300
"""Characters of an error answer quoted in messages and logs."""

_JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class _Transient:
    """One attempt that failed in a way worth retrying."""

    what: str  # for messages and logs, already scrubbed: "503: overloaded", "timeout ..."
    retry_after: float | None = None  # seconds the server asked for, when it said


class _NotAReply(Exception):
    """The JSON of a 2xx answer is not a chat completion; the message says what is missing."""


class OpenAIChatModel:
    """A chat-completions client (OpenAI and compatible servers) over httpx, with tool calls.

    Transient failures (429, any 5xx, timeouts, connection errors) are retried inside
    ``complete``: after the wait the server asks for in ``Retry-After`` (seconds or an HTTP
    date; ``retry-after-ms`` first when sent) or, when it does not say, after an exponential
    backoff with jitter (``retry_backoff`` doubled per retry, at most 30 s, each wait drawn
    between half and all of that). ``retry_budget`` is counted from the start of the call: a
    wait that would leave less than a tenth of the budget (or of ``timeout``, when shorter) for
    the request after it is not started (the call gives up at once with the last failure, so a
    Retry-After longer than what is left fails immediately, and no retry is sent with a sliver
    of time that would only end in a timeout hiding the real failure), and a retried request
    gets at most the time left. A request that timed out may still have been processed (and
    billed) by the server.

    A 2xx answer is never retried, even when it cannot be used (``ModelReplyError``): it was
    paid for, and the journal records that outcome instead of paying again.

    Args:
        base_url: the API root, e.g. ``https://api.openai.com/v1``; ``/chat/completions`` is
            appended.
        api_key: sent as a bearer token; never shown in ``repr``, logs or error messages.
        model: the model name sent with each request.
        timeout: seconds for one request, the whole exchange from connecting to the last byte
            of the answer.
        temperature: sent when not None (0 makes providers as repeatable as they get; replay
            never depends on it, because finished calls are read from the journal).
        retry_budget: seconds, from the start of a call, within which transient failures are
            retried; 0 turns retrying off.
        max_retries: the most retries after the first attempt; 0 turns retrying off.
        retry_backoff: seconds to wait before the first retry when the server does not say;
            doubled for each later retry.

    Raises:
        ConfigurationError: ``base_url`` is not an http(s) URL, ``model`` is empty, or a
            number above is negative (``timeout``: not positive); the message names it.
    """

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        model: str,
        timeout: float = 120.0,
        temperature: float | None = 0.0,
        retry_budget: float = _DEFAULT_RETRY_BUDGET,
        max_retries: int = 8,
        retry_backoff: float = 0.5,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ConfigurationError(
                f"{MODEL_BASE_URL_VARIABLE} must be an http(s) URL such as "
                "https://api.openai.com/v1"
            )
        if not model:
            raise ConfigurationError(f"set {MODEL_VARIABLE} to the model name")
        self._timeout = _seconds("timeout", timeout, positive=True)
        self._retry_budget = _seconds("retry_budget", retry_budget)
        self._retry_backoff = _seconds("retry_backoff", retry_backoff)
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigurationError(
                f"max_retries must be a non-negative whole number (got {max_retries!r})"
            )
        self._max_retries = max_retries
        self._streaming = True  # False once the server refused a streamed request
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._key = api_key
        self.model = model
        self._temperature = temperature
        import httpx  # here, not at the top: worker processes without this client start faster

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(headers=headers, timeout=self._timeout)

    @classmethod
    def from_env(cls) -> OpenAIChatModel:
        """Configure from WORKFLOW_MODEL_BASE_URL, WORKFLOW_MODEL_API_KEY and WORKFLOW_MODEL,
        and WORKFLOW_MODEL_RETRY_BUDGET (seconds; 300 when unset or empty).

        Raises:
            ConfigurationError: a variable is missing, or the retry budget is not a
                non-negative number (the message names the variable; never the key).
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
        retry_budget = _DEFAULT_RETRY_BUDGET
        budget = os.environ.get(MODEL_RETRY_BUDGET_VARIABLE, "").strip()
        if budget:
            seconds = _number(budget)
            if seconds is None:
                raise ConfigurationError(
                    f"{MODEL_RETRY_BUDGET_VARIABLE} must be a non-negative number of seconds, "
                    f"e.g. 300 (got {budget!r})"
                )
            retry_budget = seconds
        return cls(
            base_url=base_url,
            api_key=os.environ[MODEL_API_KEY_VARIABLE],
            model=model,
            retry_budget=retry_budget,
        )

    def __repr__(self) -> str:
        return f"OpenAIChatModel(url={self._url!r}, model={self.model!r}, api_key=***)"

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._http.aclose()

    def _scrub(self, text: str) -> str:
        return text.replace(self._key, "***") if self._key else text

    def _excerpt(self, text: str, limit: int) -> str:
        # Scrub before cutting, so a key straddling the cut cannot leave a readable prefix.
        cut = text[: limit + len(self._key)]
        return self._scrub(cut)[:limit]

    async def complete(self, request: ModelRequest) -> ModelReply:
        """POST the conversation; return the first choice, retrying transient failures.

        Content sent as a list of parts becomes the parts' ``text`` strings joined with no
        separator; parts without text (images, refusals) are skipped. Text is kept exactly as
        the JSON carried it, lone surrogates (``"\\ud83d"``) included, and sent back the same.

        Args:
            request: the conversation and the tools offered.

        Raises:
            BackendUnavailableError: 429, 5xx, timeouts or network failures lasted past
                ``max_retries`` or ``retry_budget``; the message says how many attempts were
                made and what the last one got. Retry later.
            ConfigurationError: 401, 403 or 404 (key, permissions or model name are wrong), or
                a redirect (the base URL is not the API root).
            InvalidArgumentError: another 4xx, or a request that cannot be sent as JSON.
            ModelReplyError: a 2xx answer that is not a chat completion (not JSON, no choices,
                no message, wrong types); ``raw`` holds its start. Never retried: it was paid
                for.
        """
        payload = self._encode(request)
        started = anyio.current_time()
        deadline = started + self._retry_budget
        limit = self._timeout  # the first attempt gets the whole timeout, whatever the budget
        attempts = 0
        while True:
            attempts += 1
            outcome = await self._attempt(payload, limit)
            if not isinstance(outcome, _Transient):
                return self._answer(outcome)
            wait, why = self._next_wait(outcome, attempts, deadline)
            if wait is None:
                raise self._gave_up(attempts, started, outcome, why)
            _log.warning(
                "model call to %s for %r failed (attempt %d of at most %d: %s); "
                "retrying in %.2f s (%s)",
                self._scrub(self._url),
                self._scrub(self.model),
                attempts,
                self._max_retries + 1,
                outcome.what,
                wait,
                why,
            )
            await anyio.sleep(wait)
            limit = min(self._timeout, deadline - anyio.current_time())
            if limit <= 0:  # the sleep overslept the budget: no request without a deadline
                raise self._gave_up(attempts, started, outcome, "retry_budget is used up")

    async def stream(self, request: ModelRequest, on_text: TextSink) -> ModelReply:
        """Like :meth:`complete`, with ``"stream": true``: the reply's text goes to ``on_text``
        as the server sends it (server-sent events), and the assembled reply (text, tool calls
        from their pieces, usage when the server reports it) is returned, the same reply
        ``complete`` would give. A server that answers with a plain JSON completion instead
        is read as ``complete`` reads it; one that refuses streamed requests (400 or 422) is
        asked with ``complete`` from then on, and ``on_text`` gets the reply's text whole.
        Retries are as for ``complete``; a stream that breaks is retried too, and ``on_text``
        is then told the retry's number.

        Raises:
            The errors of :meth:`complete`; also ``ModelReplyError`` for a stream whose
            events are not chat-completion chunks.
        """
        if not self._streaming:
            reply = await self.complete(request)
            if reply.content:
                on_text(reply.content, 0)
            return reply
        payload = self._encode(request, stream=True)
        started = anyio.current_time()
        deadline = started + self._retry_budget
        limit = self._timeout
        attempts = 0
        while True:
            attempts += 1
            outcome = await self._attempt_stream(payload, limit, on_text, attempts - 1)
            if isinstance(outcome, ModelReply):
                return outcome
            if not isinstance(outcome, _Transient):
                if outcome.status_code in (400, 422):
                    # A server that refuses streaming (or stream_options) was not paid: ask
                    # it the plain way from now on, and pass the text on whole.
                    _log.warning(
                        "model server %s refused a streamed request for %r (%d); not streaming",
                        self._scrub(self._url),
                        self._scrub(self.model),
                        outcome.status_code,
                    )
                    self._streaming = False
                    reply = await self.complete(request)
                    if reply.content:
                        on_text(reply.content, attempts)
                    return reply
                return self._answer(outcome)
            wait, why = self._next_wait(outcome, attempts, deadline)
            if wait is None:
                raise self._gave_up(attempts, started, outcome, why)
            _log.warning(
                "streamed model call to %s for %r failed (attempt %d of at most %d: %s); "
                "retrying in %.2f s (%s)",
                self._scrub(self._url),
                self._scrub(self.model),
                attempts,
                self._max_retries + 1,
                outcome.what,
                wait,
                why,
            )
            await anyio.sleep(wait)
            limit = min(self._timeout, deadline - anyio.current_time())
            if limit <= 0:
                raise self._gave_up(attempts, started, outcome, "retry_budget is used up")

    async def _attempt_stream(
        self, payload: bytes, limit: float, on_text: TextSink, retry: int
    ) -> ModelReply | httpx.Response | _Transient:
        """One streamed POST: the assembled reply, a final response to read as ``complete``
        does (an error, or a plain JSON completion), or what went wrong when worth retrying."""
        import httpx

        try:
            with anyio.fail_after(limit):
                async with self._http.stream(
                    "POST", self._url, content=payload, headers=_JSON_HEADERS, timeout=limit
                ) as response:
                    status = response.status_code
                    kind = response.headers.get("content-type", "")
                    if status >= 300 or "event-stream" not in kind:
                        await response.aread()
                        if status == 429 or status >= 500:
                            detail = self._excerpt(response.text, _DETAIL_LIMIT)
                            return _Transient(f"{status}: {detail}", _retry_after(response.headers))
                        return response
                    return await self._assemble(response, on_text, retry)
        except (TimeoutError, httpx.TimeoutException):
            return _Transient(f"timeout: no whole answer within {limit:.2f} s")
        except httpx.HTTPError as exc:
            return _Transient(f"{type(exc).__name__}: {self._excerpt(str(exc), _DETAIL_LIMIT)}")

    async def _assemble(
        self, response: httpx.Response, on_text: TextSink, retry: int
    ) -> ModelReply | _Transient:
        """Read a chat-completions event stream into one reply, passing text on as it comes."""
        texts: list[str] = []
        has_text = False
        calls: dict[int, dict[str, str]] = {}
        usage: dict[str, int] | None = None
        ended = False
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue  # comments, event names, keep-alives
            data = line[5:].strip()
            if data == "[DONE]":
                ended = True
                break
            try:
                chunk = json.loads(data)
                if not isinstance(chunk, dict):
                    raise _NotAReply(f"a JSON {type(chunk).__name__}, not an object")
                if chunk.get("error") and not chunk.get("choices"):
                    raise _NotAReply(f"error: {chunk['error']}"[:_DETAIL_LIMIT])
                usage = _usage(chunk.get("usage")) or usage
                for choice in chunk.get("choices") or []:
                    if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                        continue
                    if choice.get("finish_reason"):
                        ended = True
                    delta = choice.get("delta") or {}
                    if not isinstance(delta, dict):
                        raise _NotAReply("a chunk's delta is not an object")
                    text = delta.get("content")
                    if text is not None:
                        piece = _content_text(text) or ""
                        has_text = True
                        if piece:
                            texts.append(piece)
                            on_text(piece, retry)
                    for call in delta.get("tool_calls") or []:
                        _add_call_piece(calls, call)
            except (ValueError, RecursionError, _NotAReply) as exc:
                reason = "not JSON" if isinstance(exc, ValueError) else str(exc)
                raw = self._excerpt(data, _RAW_LIMIT)
                raise ModelReplyError(
                    self._scrub(
                        f"model server {self._url} streamed something for {self.model!r} that "
                        f"is not a chat-completion chunk ({reason}): {raw[:200]!r}. It was paid "
                        "for, so it is not retried"
                    ),
                    raw=raw,
                ) from None
        if not ended:
            return _Transient("the stream ended before its last chunk")
        try:
            tool_calls = [_tool_call(_call_of(calls[index])) for index in sorted(calls)]
        except _NotAReply as exc:
            raise ModelReplyError(
                self._scrub(f"model server {self._url} streamed a tool call without {exc}"),
                raw=self._excerpt(json.dumps(calls), _RAW_LIMIT),
            ) from None
        return ModelReply(
            content="".join(texts) if has_text else None, tool_calls=tool_calls, usage=usage
        )

    def _encode(self, request: ModelRequest, *, stream: bool = False) -> bytes:
        body: dict[str, Any] = {"model": self.model, "messages": request.messages}
        if request.tools:
            body["tools"] = request.tools
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if self._temperature is not None:
            body["temperature"] = self._temperature
        try:
            # ASCII JSON, not httpx's UTF-8: a lone surrogate a model sent earlier (a valid
            # JSON escape) goes back as the same escape instead of failing to encode.
            text = json.dumps(body, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                f"the request for {self.model!r} cannot be sent as JSON ({exc}); "
                "messages and tools must hold JSON values only"
            ) from exc
        return text.encode("ascii")

    async def _attempt(self, payload: bytes, limit: float) -> httpx.Response | _Transient:
        """One POST: the response, or what went wrong when it is worth retrying."""
        import httpx

        try:
            # httpx's timeout bounds each connect, read and write; this bounds the exchange.
            with anyio.fail_after(limit):
                response = await self._http.post(
                    self._url, content=payload, headers=_JSON_HEADERS, timeout=limit
                )
        except (TimeoutError, httpx.TimeoutException):
            return _Transient(f"timeout: no answer within {limit:.2f} s")
        except httpx.HTTPError as exc:
            # Kept as scrubbed text only: the exception's request holds the Authorization header.
            return _Transient(f"{type(exc).__name__}: {self._excerpt(str(exc), _DETAIL_LIMIT)}")
        status = response.status_code
        if status == 429 or status >= 500:
            detail = self._excerpt(response.text, _DETAIL_LIMIT)
            return _Transient(f"{status}: {detail}", _retry_after(response.headers))
        return response

    def _next_wait(
        self, failure: _Transient, attempts: int, deadline: float
    ) -> tuple[float | None, str]:
        """The wait before the next attempt and why, or None and why there is none."""
        if attempts > self._max_retries:
            return None, f"max_retries={self._max_retries} are used up"
        # What a retry needs after its wait: less would end in a timeout that says nothing.
        left = deadline - anyio.current_time() - min(self._timeout, self._retry_budget / 10)
        if failure.retry_after is not None:
            if failure.retry_after >= left:
                return None, (
                    f"the server asks to wait {failure.retry_after:g} s (Retry-After) and only "
                    f"{max(left, 0.0):.2f} s of retry_budget={self._retry_budget:g} s are left "
                    "for a wait and a request after it"
                )
            return failure.retry_after, "as Retry-After asks"
        # Equal jitter: at least half the step keeps the backoff, the random half spreads out
        # clients that failed together.
        step = min(_BACKOFF_CAP, self._retry_backoff * 2.0 ** min(attempts - 1, 32))
        wait = step / 2 + random.uniform(0.0, step / 2)
        if wait >= left:
            return None, (
                f"the next wait ({wait:.2f} s) would leave too little of "
                f"retry_budget={self._retry_budget:g} s for a request after it"
            )
        return wait, "backoff"

    def _gave_up(
        self, attempts: int, started: float, last: _Transient, why: str
    ) -> BackendUnavailableError:
        elapsed = anyio.current_time() - started
        plural = "attempt" if attempts == 1 else "attempts"
        return BackendUnavailableError(
            self._scrub(
                f"model server {self._url} did not answer {self.model!r} after {attempts} "
                f"{plural} in {elapsed:.1f} s (last: {last.what}); gave up because {why}; "
                f"retry later, or allow more with retry_budget ({MODEL_RETRY_BUDGET_VARIABLE}) "
                "and max_retries"
            )
        )

    def _answer(self, response: httpx.Response) -> ModelReply:
        """The reply in a final (not retried) response, or the error it stands for."""
        status = response.status_code
        if status >= 400:
            detail = self._excerpt(response.text, _DETAIL_LIMIT)
            message = self._scrub(f"model server answered {status} for {self.model!r}: ") + detail
            if status in (401, 403, 404):
                raise ConfigurationError(
                    message + f" (check {MODEL_API_KEY_VARIABLE} and {MODEL_VARIABLE})"
                )
            raise InvalidArgumentError(message)
        if status >= 300:
            location = self._excerpt(response.headers.get("location", "?"), _DETAIL_LIMIT)
            raise ConfigurationError(
                self._scrub(f"model server {self._url} answered {status} (redirect to ")
                + f"{location}); set {MODEL_BASE_URL_VARIABLE} to the API root itself"
            )
        try:
            return _reply_from(response.json())
        except (ValueError, RecursionError, _NotAReply) as exc:  # not JSON, not UTF-8, too deep
            reason = "not JSON" if isinstance(exc, ValueError) else str(exc)
            raw = self._excerpt(response.text, _RAW_LIMIT)
            # Not chained: a JSONDecodeError carries the whole body, key included.
            raise ModelReplyError(
                self._scrub(
                    f"model server {self._url} answered {status} for {self.model!r} with "
                    f"something that is not a chat completion ({reason}): {raw[:200]!r}. "
                    "It was paid for, so it is not retried; check that "
                    f"{MODEL_BASE_URL_VARIABLE} is a chat-completions API and {MODEL_VARIABLE} "
                    "a chat model"
                ),
                raw=raw,
            ) from None


def _reply_from(data: object) -> ModelReply:
    """The first choice of a chat completion, parsed from JSON.

    Raises:
        _NotAReply: something required is missing or of the wrong type.
    """
    if not isinstance(data, dict):
        raise _NotAReply(f"a JSON {type(data).__name__}, not an object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        error = data.get("error")
        raise _NotAReply("no choices" + (f"; error: {error}"[:_DETAIL_LIMIT] if error else ""))
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise _NotAReply("no message in the first choice")
    calls = message.get("tool_calls")
    if calls is None:
        calls = []
    if not isinstance(calls, list):
        raise _NotAReply("tool_calls is not a list")
    return ModelReply(
        content=_content_text(message.get("content")),
        tool_calls=[_tool_call(call) for call in calls],
        usage=_usage(data.get("usage")),
    )


def _usage(value: object) -> dict[str, int] | None:
    """The integer token counts of a completion's ``usage`` (others ignored), or None."""
    if not isinstance(value, dict):
        return None
    counts = {str(k): v for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool)}
    return counts or None


def _add_call_piece(calls: dict[int, dict[str, str]], piece: object) -> None:
    """Add one streamed piece of a tool call (``index``, ``id``, ``function`` name and
    arguments, each sent in pieces) to ``calls``."""
    if not isinstance(piece, dict):
        raise _NotAReply("a tool call piece is not an object")
    index = piece.get("index", 0)
    if isinstance(index, bool) or not isinstance(index, int):
        raise _NotAReply("a tool call piece has no index")
    entry = calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
    call_id = piece.get("id")
    if isinstance(call_id, str | int) and not isinstance(call_id, bool) and str(call_id):
        entry["id"] = str(call_id)
    function = piece.get("function") or {}
    if not isinstance(function, dict):
        raise _NotAReply("a tool call piece's function is not an object")
    name = function.get("name")
    if isinstance(name, str):
        entry["name"] += name
    arguments = function.get("arguments")
    if arguments is not None:
        entry["arguments"] += _arguments_text(arguments)


def _call_of(entry: dict[str, str]) -> dict[str, Any]:
    """A tool call assembled from its pieces, in the form of a non-streamed one."""
    return {
        "id": entry["id"] or None,
        "function": {"name": entry["name"] or None, "arguments": entry["arguments"] or "{}"},
    }


def _tool_call(call: object) -> ToolCall:
    if not isinstance(call, dict):
        raise _NotAReply("a tool call is not an object")
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise _NotAReply("a tool call has no function name")
    call_id = call.get("id")
    # Some compatible servers number their calls.
    if isinstance(call_id, bool) or not isinstance(call_id, str | int):
        raise _NotAReply("a tool call has no id")
    arguments = _arguments_text(function.get("arguments"))
    return ToolCall(id=str(call_id), name=function["name"], arguments=arguments)


def _content_text(content: object) -> str | None:
    """Text content as sent; a list of parts as its text parts joined with no separator."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _NotAReply(f"content is a JSON {type(content).__name__}, not text or parts")
    texts: list[str] = []
    for part in content:
        if not isinstance(part, dict):
            raise _NotAReply("a content part is not an object")
        text = part.get("text")
        if text is None:  # an image, a refusal ...: nothing to read as text
            continue
        if not isinstance(text, str):
            raise _NotAReply("a content part's text is not a string")
        texts.append(text)
    return "".join(texts)


def _retry_after(headers: httpx.Headers) -> float | None:
    """Seconds the server asks to wait: ``retry-after-ms``, else ``Retry-After`` as seconds or
    an HTTP date. None when it does not say, or says something unreadable."""
    millis = _number(headers.get("retry-after-ms", ""))
    if millis is not None:
        return millis / 1000
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _number(value)
    if seconds is not None:
        return seconds
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # "-0000": UTC by RFC 5322
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _number(text: str) -> float | None:
    """A finite non-negative number, or None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _seconds(name: str, value: object, *, positive: bool = False) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
    ):
        kind = "positive" if positive else "non-negative"
        raise ConfigurationError(f"{name} must be a {kind} number of seconds (got {value!r})")
    return float(value)


def _arguments_text(arguments: object) -> str:
    # Some compatible servers send an object instead of the JSON text OpenAI sends.
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, separators=(",", ":"), sort_keys=True)
