"""The OpenAI-compatible client against a real HTTP server on loopback speaking that API."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from world_core import (
    Agent,
    Client,
    Journal,
    ModelRequest,
    OpenAIChatModel,
    Worker,
    World,
    open_world,
    tool,
)
from world_core.errors import BackendUnavailableError, ConfigurationError, InvalidArgumentError

pytestmark = pytest.mark.anyio

KEY = "sk-test-0123456789-secret"


class ChatServer(ThreadingHTTPServer):
    """Answers POST /v1/chat/completions like the OpenAI API: with a tool call first, then
    with text once a tool result is in the conversation. The model name picks a failure."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[dict[str, Any]] = []
        self.auth: list[str | None] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _Handler(BaseHTTPRequestHandler):
    server: ChatServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        request = json.loads(self.rfile.read(length))
        self.server.requests.append(request)
        self.server.auth.append(self.headers.get("Authorization"))
        if self.path != "/v1/chat/completions":
            self._send(404, b'{"error": {"message": "no such path"}}')
            return
        model = request["model"]
        if model == "fail-401":
            error = {"error": {"message": f"Incorrect API key provided: {KEY}"}}
            self._send(401, json.dumps(error).encode())
            return
        if model == "fail-500":
            self._send(500, b'{"error": {"message": "overloaded"}}')
            return
        if model == "garbage":
            self._send(200, b'{"id": "x"}')
            return
        tool_results = [m for m in request["messages"] if m["role"] == "tool"]
        if not tool_results:
            message: dict[str, Any] = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_abc",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"topic": "launch"}'},
                    }
                ],
            }
        else:
            message = {"role": "assistant", "content": f"The note: {tool_results[-1]['content']}"}
        body = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        }
        self._send(200, json.dumps(body).encode())


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def server() -> Iterator[ChatServer]:
    chat = ChatServer()
    thread = threading.Thread(target=chat.serve_forever, daemon=True)
    thread.start()
    try:
        yield chat
    finally:
        chat.shutdown()
        chat.server_close()
        thread.join(timeout=10)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with open_world("local", url=str(tmp_path / "world"), namespace="model") as opened:
        yield opened


def lookup(topic: str) -> str:
    """Read a note."""
    return f"{topic} is on Thursday"


async def test_agent_turn_over_chat_completions_then_replay_offline(
    world: World, server: ChatServer
) -> None:
    model = OpenAIChatModel(base_url=server.base_url, api_key=KEY, model="gpt-test")
    agent = Agent(model=model, tools=[tool(lookup, replay="safe")], system="Be brief.")
    client = Client(world)
    turn = await client.submit("s", "When is the launch?")
    result = await Worker(world, agent, lease=10, crash=None).run_once(wait=5)
    await model.aclose()
    assert result is not None
    assert result.status == "done"
    assert result.reply == "The note: launch is on Thursday"
    assert await client.reply("s", turn) == result.reply
    assert server.auth == [f"Bearer {KEY}", f"Bearer {KEY}"]
    first, second = server.requests
    assert first["model"] == "gpt-test"
    assert first["temperature"] == 0.0
    assert first["tools"][0]["function"]["name"] == "lookup"
    assert first["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "When is the launch?"},
    ]
    assert second["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"topic": "launch"}'
    assert second["messages"][3] == {
        "role": "tool",
        "tool_call_id": "call_abc",
        "content": "launch is on Thursday",
    }
    # Replay with the server gone: the same reply, read from the journal.
    server.shutdown()
    offline = OpenAIChatModel(base_url=server.base_url, api_key=KEY, model="gpt-test")
    journal = await Journal.open(world, "s", turn)
    replay = Agent(model=offline, tools=[tool(lookup, replay="safe")], system="Be brief.")
    assert await replay.run_turn(journal) == result.reply
    assert journal.model_calls == 0
    await offline.aclose()


async def test_errors_are_typed_and_never_show_the_key(server: ChatServer) -> None:
    request = ModelRequest(messages=[{"role": "user", "content": "hi"}])
    cases: list[tuple[str, type[Exception]]] = [
        ("fail-401", ConfigurationError),
        ("fail-500", BackendUnavailableError),
        ("garbage", InvalidArgumentError),
    ]
    for name, error in cases:
        model = OpenAIChatModel(base_url=server.base_url, api_key=KEY, model=name)
        with pytest.raises(error) as caught:
            await model.complete(request)
        assert KEY not in str(caught.value)
        assert KEY not in repr(caught.value)
        await model.aclose()
    unreachable = OpenAIChatModel(base_url="http://127.0.0.1:1/v1", api_key=KEY, model="m")
    with pytest.raises(BackendUnavailableError) as down:
        await unreachable.complete(request)
    assert KEY not in str(down.value)
    assert KEY not in repr(unreachable)
    await unreachable.aclose()


def test_configuration_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WORKFLOW_MODEL_BASE_URL", "WORKFLOW_MODEL_API_KEY", "WORKFLOW_MODEL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigurationError, match="WORKFLOW_MODEL_API_KEY"):
        OpenAIChatModel.from_env()
    monkeypatch.setenv("WORKFLOW_MODEL_API_KEY", KEY)
    with pytest.raises(ConfigurationError, match="WORKFLOW_MODEL_BASE_URL") as caught:
        OpenAIChatModel.from_env()
    assert KEY not in str(caught.value)
    monkeypatch.setenv("WORKFLOW_MODEL_BASE_URL", "http://127.0.0.1:9/v1")
    with pytest.raises(ConfigurationError, match="WORKFLOW_MODEL"):
        OpenAIChatModel.from_env()
    monkeypatch.setenv("WORKFLOW_MODEL", "gpt-test")
    model = OpenAIChatModel.from_env()
    assert model.model == "gpt-test"
    assert KEY not in repr(model)
    assert "***" in repr(model)
    with pytest.raises(ConfigurationError, match="http"):
        OpenAIChatModel(base_url="ftp://x", api_key=KEY, model="m")
