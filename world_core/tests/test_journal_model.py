"""The OpenAI-compatible client against a real HTTP server on loopback speaking that API."""

from __future__ import annotations

import json
import logging
import random
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
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
from world_core.errors import (
    BackendUnavailableError,
    ConfigurationError,
    InvalidArgumentError,
    ModelReplyError,
    TurnFailedError,
)
from world_core.journal._client import turn_message

pytestmark = pytest.mark.anyio

KEY = "sk-test-0123456789-secret"


@dataclass(frozen=True)
class Canned:
    """One scripted answer: ``status``, ``body`` and ``headers``, sent after ``delay`` seconds
    (or never, when the server closes first)."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


class ChatServer(ThreadingHTTPServer):
    """Answers POST /v1/chat/completions like the OpenAI API: with a tool call first, then
    with text once a tool result is in the conversation. The model name picks a failure.

    A test scripts other answers: ``script`` is answered first, one entry per request in
    order, then ``forever`` (when set) for every later request. Each request's JSON, bearer
    header and arrival time (``time.monotonic()``) are kept.
    """

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.times: list[float] = []
        self.script: list[Canned] = []
        self.forever: Canned | None = None
        self.closing = threading.Event()
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def record(self, request: dict[str, Any], auth: str | None) -> Canned | None:
        """Keep one request; the scripted answer for it, if any."""
        with self._lock:
            self.times.append(time.monotonic())
            self.requests.append(request)
            self.auth.append(auth)
            return self.script.pop(0) if self.script else self.forever


class _Handler(BaseHTTPRequestHandler):
    server: ChatServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
        except ConnectionError:  # the client gave up waiting (a timeout test)
            pass

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        request = json.loads(self.rfile.read(length))
        canned = self.server.record(request, self.headers.get("Authorization"))
        if canned is not None:
            if not self.server.closing.wait(canned.delay):
                self._send(canned.status, canned.body, canned.headers)
            return
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
    # A short poll interval: shutdown() waits for it at the end of every test.
    thread = threading.Thread(target=chat.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield chat
    finally:
        chat.closing.set()
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
        ("garbage", ModelReplyError),
    ]
    for name, error in cases:
        # A small budget: a 500 is retried until the budget is spent.
        model = OpenAIChatModel(
            base_url=server.base_url, api_key=KEY, model=name, retry_budget=0.5, retry_backoff=0.05
        )
        with pytest.raises(error) as caught:
            await model.complete(request)
        assert KEY not in str(caught.value)
        assert KEY not in repr(caught.value)
        await model.aclose()
    unreachable = OpenAIChatModel(
        base_url="http://127.0.0.1:1/v1",
        api_key=KEY,
        model="m",
        retry_budget=0.5,
        retry_backoff=0.05,
    )
    with pytest.raises(BackendUnavailableError, match=r"after \d+ attempts? .*retry later") as down:
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


# -- retries and unusable replies -----------------------------------------------------------------

REQUEST = ModelRequest(messages=[{"role": "user", "content": "When is the launch?"}])
OVERLOADED = json.dumps({"error": {"message": f"overloaded (key {KEY})"}}).encode()


def completion(message: dict[str, Any]) -> bytes:
    """A chat completion whose first choice is ``message``, as the server sends it."""
    body: dict[str, Any] = {"id": "chatcmpl-2", "object": "chat.completion", "model": "gpt-test"}
    body["choices"] = [{"index": 0, "message": message, "finish_reason": "stop"}]
    return json.dumps(body).encode()  # ASCII: lone surrogates travel as \\uXXXX escapes


ModelFactory = Callable[..., OpenAIChatModel]


@pytest.fixture
async def models(server: ChatServer) -> AsyncIterator[ModelFactory]:
    """Clients of ``server`` (quick backoff unless given), all closed after the test."""
    made: list[OpenAIChatModel] = []

    def make(**options: Any) -> OpenAIChatModel:
        options.setdefault("retry_backoff", 0.05)
        model = OpenAIChatModel(base_url=server.base_url, api_key=KEY, model="gpt-test", **options)
        made.append(model)
        return model

    yield make
    for model in made:
        await model.aclose()


@pytest.fixture
def warnings_logged(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger="world.model")
    return caplog


def retry_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The retry warnings logged, after checking that none shows the key."""
    records = [r for r in caplog.records if r.name == "world.model"]
    for record in records:
        assert record.levelno == logging.WARNING
        assert KEY not in record.getMessage()
    return records


def attempts_in(error: BaseException) -> int:
    found = re.search(r"after (\d+) attempts?", str(error))
    assert found is not None, str(error)
    return int(found.group(1))


async def test_429_waits_as_long_as_retry_after_asks(
    server: ChatServer, models: ModelFactory, warnings_logged: pytest.LogCaptureFixture
) -> None:
    server.script = [Canned(429, OVERLOADED, {"Retry-After": "1"})]
    reply = await models(retry_budget=5.0).complete(REQUEST)
    assert reply.tool_calls[0].name == "lookup"
    assert len(server.requests) == 2
    # A lower bound the protocol sets: the second request may not come before the asked wait.
    assert server.times[1] - server.times[0] >= 0.9
    [record] = retry_records(warnings_logged)
    assert "429" in record.getMessage()
    assert "Retry-After" in record.getMessage()


async def test_503_three_times_then_an_answer(
    server: ChatServer, models: ModelFactory, warnings_logged: pytest.LogCaptureFixture
) -> None:
    server.script = [Canned(503, OVERLOADED)] * 3
    reply = await models(retry_budget=5.0).complete(REQUEST)
    assert reply.tool_calls[0].arguments == '{"topic": "launch"}'
    assert len(server.requests) == 4
    assert server.auth == [f"Bearer {KEY}"] * 4
    assert len(retry_records(warnings_logged)) == 3


async def test_500_forever_gives_up_when_the_budget_is_spent(
    server: ChatServer,
    models: ModelFactory,
    warnings_logged: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each wait at the low end of its jitter: 0.25 s, 0.5 s, then 1 s, which no longer fits.
    # With jitter the wait before the third attempt can end a few milliseconds short of the
    # budget; that attempt then times out at once (the message's last failure is that
    # timeout, and the server may see the request only after the call gave up).
    monkeypatch.setattr(random, "uniform", lambda low, high: low)
    server.forever = Canned(500, OVERLOADED)
    model = models(retry_budget=1.5, retry_backoff=0.5)  # the default backoff
    with pytest.raises(BackendUnavailableError, match="retry later") as caught:
        await model.complete(REQUEST)
    message = str(caught.value)
    assert attempts_in(caught.value) == len(server.requests) >= 2
    assert "last: 500" in message
    assert "retry_budget" in message
    assert KEY not in message
    assert "***" in message  # the server's echo of the key, scrubbed
    assert len(retry_records(warnings_logged)) == len(server.requests) - 1


async def test_no_retry_is_sent_with_a_sliver_of_the_budget(
    server: ChatServer, models: ModelFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first wait is 0.95 s of a 1 s budget: a retry after it would get a few hundredths of
    # a second and end in a timeout that hides the 500. The call gives up at once instead.
    monkeypatch.setattr(random, "uniform", lambda low, high: low)
    server.forever = Canned(500, OVERLOADED)
    with pytest.raises(BackendUnavailableError, match="too little of retry_budget") as caught:
        await models(retry_budget=1.0, retry_backoff=1.9).complete(REQUEST)
    assert attempts_in(caught.value) == len(server.requests) == 1
    assert "last: 500" in str(caught.value)


async def test_max_retries_bounds_the_attempts(server: ChatServer, models: ModelFactory) -> None:
    server.forever = Canned(502, b"bad gateway")
    with pytest.raises(BackendUnavailableError, match="max_retries=2") as caught:
        await models(retry_budget=30.0, max_retries=2, retry_backoff=0.01).complete(REQUEST)
    assert attempts_in(caught.value) == len(server.requests) == 3
    assert "last: 502: bad gateway" in str(caught.value)


@pytest.mark.parametrize(
    "retry_after",
    ["60", formatdate(time.time() + 3600, usegmt=True)],
    ids=["seconds", "http-date"],
)
async def test_retry_after_past_the_budget_gives_up_at_once(
    server: ChatServer, models: ModelFactory, retry_after: str
) -> None:
    server.forever = Canned(429, OVERLOADED, {"Retry-After": retry_after})
    with pytest.raises(BackendUnavailableError, match="Retry-After") as caught:
        await models(retry_budget=2.0).complete(REQUEST)
    assert attempts_in(caught.value) == len(server.requests) == 1
    assert "last: 429" in str(caught.value)


async def test_no_retry_without_a_budget(
    server: ChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.forever = Canned(503, OVERLOADED)
    monkeypatch.setenv("WORKFLOW_MODEL_BASE_URL", server.base_url)
    monkeypatch.setenv("WORKFLOW_MODEL_API_KEY", KEY)
    monkeypatch.setenv("WORKFLOW_MODEL", "gpt-test")
    monkeypatch.setenv("WORKFLOW_MODEL_RETRY_BUDGET", "0")
    model = OpenAIChatModel.from_env()
    try:
        with pytest.raises(BackendUnavailableError, match="after 1 attempt "):
            await model.complete(REQUEST)
    finally:
        await model.aclose()
    assert len(server.requests) == 1


async def test_a_timeout_is_retried(
    server: ChatServer, models: ModelFactory, warnings_logged: pytest.LogCaptureFixture
) -> None:
    # The first answer comes long after the client's timeout (or never: the test ends first).
    server.script = [Canned(delay=30.0)]
    reply = await models(timeout=0.3, retry_budget=5.0).complete(REQUEST)
    assert reply.tool_calls[0].name == "lookup"
    assert len(server.requests) == 2
    [record] = retry_records(warnings_logged)
    assert "timeout" in record.getMessage()


@pytest.mark.parametrize(
    "body",
    [
        b"<html><body>502 Bad Gateway</body></html>",
        b'{"id": "x"}',
        b'{"choices": []}',
        b"[1, 2]",
        b'{"choices": [{"message": "hello"}]}',
        b'{"choices": [{"message": {"content": 5}}]}',
        b'{"choices": [{"message": {"content": [1]}}]}',
        b'{"choices": [{"message": {"content": [{"text": 5}]}}]}',
        b'{"choices": [{"message": {"content": null, "tool_calls": {"id": "c"}}}]}',
        b'{"choices": [{"message": {"tool_calls": [{"id": "c", "function": {}}]}}]}',
        b'{"choices": [{"message": {"tool_calls": [{"function": {"name": "f"}}]}}]}',
        b'{"error": {"message": "upstream failed for ' + KEY.encode() + b'"}}',
        b"\xff\xfe not text",
    ],
)
async def test_an_unusable_2xx_is_a_model_reply_error_and_never_retried(
    server: ChatServer, models: ModelFactory, body: bytes
) -> None:
    server.forever = Canned(200, body)
    with pytest.raises(ModelReplyError, match="not a chat completion") as caught:
        await models(retry_budget=5.0).complete(REQUEST)
    assert len(server.requests) == 1
    raw = caught.value.raw
    assert raw == body.decode(errors="replace").replace(KEY, "***")
    assert KEY not in str(caught.value)


async def test_a_reply_nested_too_deep_to_parse_is_unusable_and_not_retried(
    server: ChatServer, models: ModelFactory
) -> None:
    # json.loads raises RecursionError (not ValueError) here; it was retried, paid each time.
    server.forever = Canned(200, b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(ModelReplyError, match="not a chat completion"):
        await models(retry_budget=5.0).complete(REQUEST)
    assert len(server.requests) == 1


async def test_a_long_unusable_reply_keeps_its_start(
    server: ChatServer, models: ModelFactory
) -> None:
    # The key straddles the cut at 2000 characters: no part of it may be kept.
    body = b"x" * 1990 + KEY.encode() + b"y" * 10_000
    server.forever = Canned(200, body)
    with pytest.raises(ModelReplyError) as caught:
        await models().complete(REQUEST)
    assert caught.value.raw == ("x" * 1990 + "***" + "y" * 10)[:2000]
    assert len(server.requests) == 1


async def test_other_answers_are_typed_and_not_retried(
    server: ChatServer, models: ModelFactory
) -> None:
    cases: list[tuple[Canned, type[Exception], str]] = [
        (Canned(400, b'{"error": {"message": "bad tools"}}'), InvalidArgumentError, "400"),
        (Canned(403, b"forbidden"), ConfigurationError, "WORKFLOW_MODEL_API_KEY"),
        (Canned(404, b"no such model"), ConfigurationError, "WORKFLOW_MODEL"),
        (Canned(308, b"", {"Location": "https://x/v1"}), ConfigurationError, "BASE_URL"),
    ]
    for count, (canned, error, hint) in enumerate(cases, start=1):
        server.forever = canned
        with pytest.raises(error, match=hint):
            await models(retry_budget=5.0).complete(REQUEST)
        assert len(server.requests) == count


async def test_content_parts_are_joined(server: ChatServer, models: ModelFactory) -> None:
    parts = [
        {"type": "text", "text": "The launch "},
        {"type": "image_url", "image_url": {"url": "https://example.com/x.png"}},
        {"type": "text", "text": "is on Thursday."},
    ]
    server.script = [
        Canned(200, completion({"role": "assistant", "content": parts})),
        Canned(200, completion({"role": "assistant", "content": []})),
    ]
    model = models()
    assert (await model.complete(REQUEST)).content == "The launch is on Thursday."
    assert (await model.complete(REQUEST)).content == ""


async def test_lone_surrogates_come_through_unchanged(
    server: ChatServer, models: ModelFactory
) -> None:
    text = "a\ud83db"  # a high surrogate alone: valid JSON when escaped, not valid UTF-8
    message = {
        "role": "assistant",
        "content": text,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"topic": text})},
            },
            {"id": "call_2", "type": "function", "function": {"name": "lookup", "arguments": {}}},
        ],
    }
    body = completion(message)
    assert b"a\\ud83db" in body  # the six characters \ud83d on the wire
    server.script = [Canned(200, body)]
    model = models()
    reply = await model.complete(REQUEST)
    assert reply.content == text
    assert reply.tool_calls[0].arguments == '{"topic": "a\\ud83db"}'
    assert json.loads(reply.tool_calls[0].arguments) == {"topic": text}
    # The conversation goes back to the server with the reply in it, surrogate included.
    follow_up = ModelRequest(messages=[*REQUEST.messages, reply.as_message()])
    await model.complete(follow_up)
    sent = server.requests[-1]["messages"][-1]
    assert sent["content"] == text
    assert sent["tool_calls"][0]["function"]["arguments"] == reply.tool_calls[0].arguments


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("retry_budget", -1.0),
        ("retry_budget", float("nan")),
        ("retry_budget", float("inf")),
        ("max_retries", -1),
        ("max_retries", 1.5),
        ("retry_backoff", -0.1),
        ("timeout", 0.0),
    ],
)
def test_retry_settings_are_checked(option: str, value: object) -> None:
    options: dict[str, Any] = {option: value}
    with pytest.raises(ConfigurationError, match=option):
        OpenAIChatModel(base_url="http://127.0.0.1:9/v1", api_key=KEY, model="m", **options)


@pytest.mark.parametrize("budget", ["-1", "soon", "nan", "inf"])
def test_retry_budget_variable_is_checked(monkeypatch: pytest.MonkeyPatch, budget: str) -> None:
    monkeypatch.setenv("WORKFLOW_MODEL_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("WORKFLOW_MODEL_API_KEY", KEY)
    monkeypatch.setenv("WORKFLOW_MODEL", "gpt-test")
    monkeypatch.setenv("WORKFLOW_MODEL_RETRY_BUDGET", budget)
    with pytest.raises(ConfigurationError, match="WORKFLOW_MODEL_RETRY_BUDGET") as caught:
        OpenAIChatModel.from_env()
    assert KEY not in str(caught.value)


# -- journal and worker over the loopback server ---------------------------------------------------


@pytest.mark.parametrize("first", ["worker", "crashed-after-recording"])
async def test_an_unusable_reply_is_billed_once_across_redeliveries(
    world: World, server: ChatServer, first: str
) -> None:
    """A 200 that is not a chat completion was paid for: the journal records it, the turn
    fails, and no delivery of the turn sends the request again."""
    model = OpenAIChatModel(base_url=server.base_url, api_key=KEY, model="garbage")
    agent = Agent(model=model, tools=[tool(lookup, replay="safe")])
    client = Client(world)
    turn = await client.submit("s", "When is the launch?")
    worker = Worker(world, agent, lease=10, crash=None, max_attempts=5)
    try:
        with anyio.fail_after(20):
            if first == "crashed-after-recording":
                # A worker recorded the unusable reply and died before recording the failure.
                with pytest.raises(ModelReplyError):
                    await agent.run_turn(await Journal.open(world, "s", turn))
                assert len(server.requests) == 1
            result = await worker.run_once(wait=5)
            assert result is not None
            assert result.status == "failed"
            with pytest.raises(TurnFailedError) as caught:
                await client.wait("s", turn, timeout=20)
            # The turn's message delivered once more (a duplicate, a redelivery).
            await world.queue.enqueue("turns", turn_message("s", turn))
            again = await worker.run_once(wait=5)
            assert again is not None
            assert again.status == "failed"
            assert await worker.run_once() is None
    finally:
        await model.aclose()
    assert len(server.requests) == 1
    assert caught.value.error_type == "ModelReplyError"
    assert caught.value.attempts == 1
    assert caught.value.step == 0
    assert "not a chat completion" in caught.value.error
    assert await client.status("s", turn) == "failed"


async def test_429_and_5xx_inside_the_model_client_use_no_turn_attempt(
    world: World, server: ChatServer, models: ModelFactory
) -> None:
    """The client waits out 429s and 5xx itself; the worker never sees them, so a worker
    allowed a single attempt still finishes the turn."""
    busy = {"Retry-After": "0"}
    server.script = [Canned(429, OVERLOADED, busy), Canned(429, OVERLOADED, busy)]
    server.script.append(Canned(503, OVERLOADED, busy))
    agent = Agent(model=models(retry_budget=10.0), tools=[tool(lookup, replay="safe")])
    client = Client(world)
    turn = await client.submit("s", "When is the launch?")
    with anyio.fail_after(20):
        result = await Worker(world, agent, lease=10, crash=None, max_attempts=1).run_once(wait=5)
    assert result is not None
    assert result.status == "done"
    assert result.reply == "The note: launch is on Thursday"
    assert result.model_calls == 2
    assert len(server.requests) == 5  # three refused, then the tool call and the answer
    assert await client.status("s", turn) == "done"
    assert await world.queue.claim("turns", "probe", lease=5) == []
