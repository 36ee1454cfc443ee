"""OpenAIChatModel.stream against a real HTTP server on loopback that streams server-sent
events the way the chat-completions API does (text deltas, tool calls in pieces, usage last)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from world_core import ModelRequest, OpenAIChatModel
from world_core.errors import ModelReplyError

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class StreamServer(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answers: list[tuple[str, list[bytes]]] = []  # content type, body pieces
        self.requests: list[dict[str, Any]] = []
        self.status: list[int] = []  # per answer, 200 when not given

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _Handler(BaseHTTPRequestHandler):
    server: StreamServer

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.server.requests.append(json.loads(self.rfile.read(length)))
        kind, pieces = self.server.answers.pop(0)
        self.send_response(self.server.status.pop(0) if self.server.status else 200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(sum(len(p) for p in pieces)))
        self.end_headers()
        for piece in pieces:
            self.wfile.write(piece)
            self.wfile.flush()

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def server() -> Iterator[StreamServer]:
    running = StreamServer()
    thread = threading.Thread(target=running.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield running
    running.shutdown()
    running.server_close()


def _sse(*chunks: object) -> list[bytes]:
    return [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]


def _delta(**delta: object) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


KEY = "sk-stream-test-0123456789"
REQUEST = ModelRequest(messages=[{"role": "user", "content": "hi"}])


async def test_text_and_tool_calls_are_assembled_from_their_pieces(server: StreamServer) -> None:
    call_start = {"index": 0, "id": "call_1", "function": {"name": "look", "arguments": '{"a"'}}
    call_end = {"index": 0, "function": {"arguments": ": 1}"}}
    end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}
    server.answers.append(
        (
            "text/event-stream",
            _sse(
                _delta(role="assistant", content="Let me "),
                _delta(content="look."),
                _delta(tool_calls=[call_start]),
                _delta(tool_calls=[call_end]),
                end,
                usage,
            ),
        )
    )
    model = OpenAIChatModel(base_url=server.base_url, api_key=KEY, model="m")
    pieces: list[tuple[str, int]] = []
    reply = await model.stream(REQUEST, lambda delta, retry: pieces.append((delta, retry)))
    await model.aclose()
    assert pieces == [("Let me ", 0), ("look.", 0)]
    assert reply.content == "Let me look."
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("call_1", "look", '{"a": 1}')
    ]
    assert reply.usage == {"prompt_tokens": 7, "completion_tokens": 3}
    assert server.requests[0]["stream"] is True


async def test_a_plain_json_answer_is_read_as_complete_reads_it(server: StreamServer) -> None:
    body = {"choices": [{"message": {"role": "assistant", "content": "whole"}}]}
    server.answers.append(("application/json", [json.dumps(body).encode()]))
    model = OpenAIChatModel(base_url=server.base_url, api_key=KEY, model="m")
    pieces: list[str] = []
    reply = await model.stream(REQUEST, lambda delta, retry: pieces.append(delta))
    await model.aclose()
    assert reply.content == "whole"
    assert pieces == []


async def test_a_chunk_that_is_not_json_is_an_unusable_paid_reply(server: StreamServer) -> None:
    server.answers.append(("text/event-stream", [b"data: {not json\n\n"]))
    model = OpenAIChatModel(base_url=server.base_url, api_key=KEY, model="m")
    with pytest.raises(ModelReplyError, match="not a chat-completion chunk"):
        await model.stream(REQUEST, lambda delta, retry: None)
    await model.aclose()


async def test_a_stream_cut_before_its_end_is_retried(server: StreamServer) -> None:
    server.answers.append(
        ("text/event-stream", [b'data: {"choices":[{"index":0,"delta":{"content":"Hal"}}]}\n\n'])
    )
    server.answers.append(("text/event-stream", _sse(_delta(content="Hello"), _delta(content="!"))))
    model = OpenAIChatModel(base_url=server.base_url, api_key=KEY, model="m", retry_backoff=0.01)
    pieces: list[tuple[str, int]] = []
    reply = await model.stream(REQUEST, lambda delta, retry: pieces.append((delta, retry)))
    await model.aclose()
    assert reply.content == "Hello!"
    assert pieces == [("Hal", 0), ("Hello", 1), ("!", 1)]


async def test_a_server_refusing_streams_is_asked_the_plain_way(server: StreamServer) -> None:
    body = {"choices": [{"message": {"role": "assistant", "content": "plain"}}]}
    refused = {"error": {"message": "stream_options is not supported"}}
    server.answers.append(("application/json", [json.dumps(refused).encode()]))
    server.answers.append(("application/json", [json.dumps(body).encode()]))
    server.answers.append(("application/json", [json.dumps(body).encode()]))
    server.status = [400, 200, 200]
    model = OpenAIChatModel(base_url=server.base_url, api_key=KEY, model="m")
    pieces: list[tuple[str, int]] = []
    first = await model.stream(REQUEST, lambda delta, retry: pieces.append((delta, retry)))
    second = await model.stream(REQUEST, lambda delta, retry: pieces.append((delta, retry)))
    await model.aclose()
    assert (first.content, second.content) == ("plain", "plain")
    assert [request.get("stream") for request in server.requests] == [True, None, None]
    assert [piece for piece, _ in pieces] == ["plain", "plain"]
