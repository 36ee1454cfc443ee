"""A chat route as a plain ASGI app: submit a message, watch its turn as server-sent events.

Routes:

``POST /sessions/{session}/messages``   body ``{"message": "..."}``: the turn is submitted
                                        (a worker runs it); answers 202 with ``turn_id`` and the
                                        ``events`` URL.
``GET /sessions/{session}/turns/{turn}/events``
                                        the turn's live events (``Client.events``) as
                                        ``text/event-stream``: each event's ``id`` is its
                                        position, ``event`` its type, ``data`` its JSON. The
                                        stream ends after the ``reply`` or ``failed`` event.
                                        A browser's ``EventSource`` reconnects by itself and
                                        sends ``Last-Event-ID``: the stream resumes after that
                                        event, so the page misses nothing and sees nothing
                                        twice, also when the worker crashed meanwhile (a
                                        ``resumed`` event, then the other worker's events).
                                        Once the client has seen the end, 204 (No Content)
                                        tells an ``EventSource`` to stop reconnecting.

Run it (two terminals; any ASGI server, uvicorn shown)::

    uv run world worker --agent world_examples.chat_app:build_agent
    uv run uvicorn world_examples.chat_app:create_app --factory

    curl -X POST localhost:8000/sessions/s1/messages -d '{"message": "When is the launch?"}'
    curl -N localhost:8000/sessions/s1/turns/<turn_id>/events

The agent is scripted (no key, no network): it looks up a note and answers, its text streamed
word by word. With ``WORKFLOW_MODEL_BASE_URL`` set it uses that model server instead
(``OpenAIChatModel.from_env``), streamed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio

from world_core import (
    Agent,
    Client,
    ModelClient,
    ModelReply,
    ModelRequest,
    OpenAIChatModel,
    ScriptedModel,
    ToolCall,
    World,
    open_world,
    tool,
)
from world_core.errors import InvalidArgumentError, WorldError
from world_core.journal import turn_events_stream

__all__ = ["NOTES", "build_agent", "create_app", "policy", "sse_event"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

NOTES = {"launch": "The launch is on Thursday at 10:00; the press kit is in the shared folder."}

_MESSAGES = re.compile(r"^/sessions/([^/]+)/messages$")
_EVENTS = re.compile(r"^/sessions/([^/]+)/turns/([^/]+)/events$")
_MAX_BODY = 64 * 1024


def lookup_note(topic: str) -> str:
    """Read the note about ``topic``."""
    return NOTES.get(topic, f"no note about {topic!r}")


def policy(request: ModelRequest) -> ModelReply:
    """The scripted model: look the note up, then answer with it."""
    results = [m for m in request.messages if m["role"] == "tool"]
    if results:
        return ModelReply(content=f"Here is what I found: {results[-1]['content']}")
    call = ToolCall(id="call_1", name="lookup_note", arguments=json.dumps({"topic": "launch"}))
    return ModelReply(tool_calls=[call])


def build_agent() -> Agent:
    """The chat agent (for ``world worker --agent world_examples.chat_app:build_agent``)."""
    model: ModelClient
    if os.environ.get("WORKFLOW_MODEL_BASE_URL"):
        model = OpenAIChatModel.from_env()
    else:
        model = ScriptedModel(policy, stream_delay=0.02)
    return Agent(model=model, tools=[tool(lookup_note, replay="safe")])


def sse_event(position: int, type_: str, data: str) -> bytes:
    """One server-sent event: ``id`` (the position), ``event`` and ``data`` lines."""
    lines = "".join(f"data: {line}\n" for line in data.split("\n"))
    return f"id: {position}\nevent: {type_}\n{lines}\n".encode()


def create_app(world: World | None = None, *, events_timeout: float = 300.0) -> ASGIApp:
    """The ASGI app. Without ``world`` it opens the World ``world`` selects
    (``WORKFLOW_TARGET_WORLD``) at startup (ASGI lifespan) and closes it at shutdown."""
    return ASGIApp(world, events_timeout=events_timeout)


class ASGIApp:
    """The chat routes (see the module docstring) as an ASGI 3 application."""

    def __init__(self, world: World | None, *, events_timeout: float) -> None:
        self._world = world
        self._owns_world = world is None
        self._stack = contextlib.AsyncExitStack()
        self._events_timeout = events_timeout

    @property
    def client(self) -> Client:
        if self._world is None:
            raise RuntimeError("the World is not open: the server did not run the lifespan")
        return Client(self._world)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if (match := _MESSAGES.match(path)) and method == "POST":
            await self._submit(match.group(1), receive, send)
        elif (match := _EVENTS.match(path)) and method == "GET":
            await self._events(match.group(1), match.group(2), scope, receive, send)
        else:
            await _json(send, 404, {"error": f"no route for {method} {path}"})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if self._owns_world:
                    self._world = await self._stack.enter_async_context(open_world())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self._stack.aclose()
                if self._owns_world:
                    self._world = None
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _submit(self, session: str, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if len(body) > _MAX_BODY:
                await _json(send, 413, {"error": f"the body is over {_MAX_BODY} bytes"})
                return
            if not message.get("more_body"):
                break
        try:
            text = json.loads(body or b"{}").get("message")
            if not isinstance(text, str) or not text:
                raise ValueError('send {"message": "..."}')
            turn = await self.client.submit(session, text)
        except (ValueError, AttributeError, InvalidArgumentError) as exc:
            await _json(send, 400, {"error": str(exc)})
            return
        events = f"/sessions/{session}/turns/{turn}/events"
        await _json(send, 202, {"session_id": session, "turn_id": turn, "events": events})

    async def _events(
        self, session: str, turn: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        after: int | None = None
        for name, value in scope.get("headers", []):
            if name.lower() == b"last-event-id" and value.strip():
                try:
                    after = int(value)
                except ValueError:
                    await _json(send, 400, {"error": "Last-Event-ID must be an event's id"})
                    return
        try:
            events = self.client.events(session, turn, after=after, timeout=self._events_timeout)
        except InvalidArgumentError as exc:
            await _json(send, 400, {"error": str(exc)})
            return
        assert self._world is not None  # self.client checked it
        info = await self._world.stream.info(turn_events_stream(session, turn))
        if info.closed and after is not None and after + 1 >= info.next_index:
            # The turn has ended and the client has seen its end: 204 tells an EventSource
            # to stop reconnecting.
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        async with anyio.create_task_group() as tg:

            async def stop_on_disconnect() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                tg.cancel_scope.cancel()  # the browser went away: it reconnects with its id

            tg.start_soon(stop_on_disconnect)
            try:
                async for event in events:
                    data = event.model_dump_json(exclude_defaults=True)
                    chunk = sse_event(event.position, event.type, data)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except (TimeoutError, WorldError) as exc:
                error = json.dumps({"error": str(exc)})
                chunk = f"event: error\ndata: {error}\n\n".encode()
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            tg.cancel_scope.cancel()


async def _json(send: Send, status: int, value: object) -> None:
    body = json.dumps(value).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
