"""The example chat route (a plain ASGI app) called the way an ASGI server calls it: a message
submitted, its turn's events served as server-sent events, a browser that drops the
connection mid-turn reconnecting with Last-Event-ID."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from world_core import Worker, World, open_world
from world_examples.chat_app import ASGIApp, build_agent, create_app

pytestmark = pytest.mark.anyio

WAIT = 30.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with open_world("local", url=str(tmp_path / "world"), namespace="chat") as opened:
        yield opened


async def _call(
    app: ASGIApp,
    method: str,
    path: str,
    *,
    body: bytes = b"",
    headers: list[tuple[bytes, bytes]] | None = None,
    disconnect_after: int | None = None,
) -> tuple[int, bytes]:
    """One request; with ``disconnect_after``, the client goes away after that many events."""
    scope: dict[str, Any] = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": headers or [],
    }
    status = 0
    received = bytearray()
    sent_body = False
    gone = anyio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        else:
            received.extend(message.get("body", b""))
            if disconnect_after is not None and received.count(b"\n\n") >= disconnect_after:
                gone.set()

    with anyio.fail_after(WAIT):
        await app(scope, receive, send)
    return status, bytes(received)


def _events(stream: bytes) -> list[tuple[int, str, dict[str, Any]]]:
    found = []
    for block in stream.decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "id" in fields:
            found.append((int(fields["id"]), fields["event"], json.loads(fields["data"])))
    return found


async def test_a_message_and_its_turn_as_server_sent_events(world: World) -> None:
    app = create_app(world)
    status, body = await _call(
        app, "POST", "/sessions/s1/messages", body=b'{"message": "When is the launch?"}'
    )
    assert status == 202
    answer = json.loads(body)
    events_url = answer["events"]
    assert events_url == f"/sessions/s1/turns/{answer['turn_id']}/events"

    seen: list[tuple[int, str, dict[str, Any]]] = []

    async def browser() -> None:
        """Drops the connection after 4 events, then reconnects with Last-Event-ID, twice."""
        last: int | None = None
        for drop in (4, 3, None):
            headers = [] if last is None else [(b"last-event-id", str(last).encode())]
            code, stream = await _call(
                app, "GET", events_url, headers=headers, disconnect_after=drop
            )
            assert code == 200
            events = _events(stream)
            seen.extend(events)
            if events:
                last = events[-1][0]

    async with anyio.create_task_group() as tg:
        tg.start_soon(browser)
        result = await Worker(world, build_agent(), crash=None).run_once(wait=WAIT)
        assert result is not None
        assert result.status == "done"
        reply = result.reply
    assert [position for position, _, _ in seen] == list(range(len(seen)))
    assert seen[-1][1] == "reply"
    assert seen[-1][2]["text"] == reply
    _, full = await _call(app, "GET", events_url)
    assert _events(full) == seen
    last = [(b"last-event-id", str(seen[-1][0]).encode())]
    assert await _call(app, "GET", events_url, headers=last) == (204, b"")
    text = "".join(data.get("text", "") for _, kind, data in seen if kind == "text")
    assert text == reply


async def test_bad_requests_are_refused_with_the_reason(world: World) -> None:
    app = create_app(world)
    status, body = await _call(app, "POST", "/sessions/s1/messages", body=b"{}")
    assert status == 400
    assert "message" in json.loads(body)["error"]
    status, body = await _call(
        app, "GET", "/sessions/s1/turns/t/events", headers=[(b"last-event-id", b"x")]
    )
    assert status == 400
    status, _ = await _call(app, "GET", "/nowhere")
    assert status == 404


async def test_the_app_opens_and_closes_its_world_in_the_lifespan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKFLOW_TARGET_WORLD", "local")
    monkeypatch.setenv("WORKFLOW_LOCAL_DIR", str(tmp_path / "data"))
    app = create_app()
    to_app = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    replies: list[str] = []

    async def receive() -> dict[str, Any]:
        return to_app.pop(0)

    async def send(message: Any) -> None:
        replies.append(message["type"])
        if message["type"] == "lifespan.startup.complete":
            status, body = await _call(
                app, "POST", "/sessions/s1/messages", body=b'{"message": "hi"}'
            )
            assert status == 202, body

    with anyio.fail_after(WAIT):
        await app({"type": "lifespan"}, receive, send)
    assert replies == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    with pytest.raises(RuntimeError, match="not open"):
        _ = app.client


async def test_over_http_with_uvicorn_and_a_reconnecting_client(world: World) -> None:
    """The app behind a real HTTP server (uvicorn on loopback), read by an HTTP client that
    drops the connection after two events and reconnects with Last-Event-ID."""
    import httpx
    import uvicorn

    app = create_app(world)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    seen: list[tuple[int, str, dict[str, Any]]] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        for _ in range(int(WAIT / 0.02)):  # uvicorn has no event to wait on
            if server.started:
                break
            await anyio.sleep(0.02)
        else:
            pytest.fail(f"uvicorn did not start within {WAIT} s")
        port = server.servers[0].sockets[0].getsockname()[1]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=WAIT) as http:
            posted = await http.post("/sessions/s2/messages", json={"message": "launch?"})
            assert posted.status_code == 202
            url = posted.json()["events"]

            async def read(last: int | None, most: int | None) -> None:
                headers = {} if last is None else {"Last-Event-ID": str(last)}
                async with http.stream("GET", url, headers=headers) as response:
                    assert response.status_code == 200
                    assert response.headers["content-type"].startswith("text/event-stream")
                    block = ""
                    async for line in response.aiter_lines():
                        if line:
                            block += line + "\n"
                            continue
                        seen.extend(_events(block.encode() + b"\n"))
                        block = ""
                        if most is not None and len(seen) >= most:
                            return  # drop the connection mid-turn

            async def browser() -> None:
                await read(None, 2)
                await read(seen[-1][0], None)

            async with anyio.create_task_group() as inner:
                inner.start_soon(browser)
                result = await Worker(world, build_agent(), crash=None).run_once(wait=WAIT)
                assert result is not None
                assert result.status == "done"
        server.should_exit = True
    assert [position for position, _, _ in seen] == list(range(len(seen)))
    assert seen[-1][1] == "reply"
