"""Settings and unreachable servers: clear errors, bounded waits, no credential in any message.

The servers here are real sockets: a port nobody listens on, a listener that never answers, a
listener that answers but not in HTTP, and Python's ``http.server`` (HTTP, but no libSQL).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.abc
import pytest

from world_core import BackendUnavailableError, ConfigurationError, WorldError, open_world
from world_turso import connect

pytestmark = pytest.mark.anyio

SECRET = "tok-8c1f2e77-do-not-print"
WAIT = 30.0


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("WORKFLOW_TURSO_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("WORKFLOW_TURSO_AUTH_TOKEN", SECRET)
    monkeypatch.setenv("WORKFLOW_TURSO_CONNECT_TIMEOUT", "1")


def _chain(exc: BaseException) -> str:
    """Every message and repr along the exception's cause/context chain."""
    parts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None:
        parts += [str(seen), repr(seen)]
        seen = seen.__cause__ or seen.__context__
    return "\n".join(parts)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_missing_url_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORKFLOW_TURSO_URL", raising=False)
    with pytest.raises(ConfigurationError, match="WORKFLOW_TURSO_URL"):
        await connect()


async def test_url_from_the_environment(monkeypatch: pytest.MonkeyPatch, db_url: str) -> None:
    monkeypatch.setenv("WORKFLOW_TURSO_URL", db_url)
    async with open_world("turso", namespace="envns") as world:
        assert world.name == "turso"
        assert world.namespace == "envns"
        assert world.settings()["url"] == db_url


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("ws://127.0.0.1:8080", "https://"),
        ("postgres://u:pw@host/db", "unsupported scheme"),
        ("file::memory:", "in-memory"),
        (":memory:", "in-memory"),
        ("file://otherhost/x.db", "names a host"),
        ("libsql://", "no host"),
        ("libsql://host:notaport", "not a valid URL"),
    ],
)
async def test_bad_urls_refused(url: str, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=fragment) as caught:
        await connect(url=url)
    assert "pw" not in str(caught.value)


async def test_folder_and_missing_folder_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="is a folder"):
        await connect(url=f"file:{tmp_path}")
    with pytest.raises(ConfigurationError, match="does not exist"):
        await connect(url=f"file:{tmp_path / 'nope' / 'world.db'}")
    assert not (tmp_path / "nope").exists()


async def test_replica_needs_a_remote_url(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, db_url: str
) -> None:
    monkeypatch.setenv("WORKFLOW_TURSO_REPLICA_PATH", str(tmp_path / "replica.db"))
    with pytest.raises(ConfigurationError, match="WORKFLOW_TURSO_REPLICA_PATH"):
        await connect(url=db_url)


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan", "inf"])
async def test_bad_timeouts_refused(
    monkeypatch: pytest.MonkeyPatch, db_url: str, value: str
) -> None:
    monkeypatch.setenv("WORKFLOW_TURSO_BUSY_TIMEOUT", value)
    with pytest.raises(ConfigurationError, match="WORKFLOW_TURSO_BUSY_TIMEOUT"):
        await connect(url=db_url)


async def test_refused_port_fails_fast_without_the_token() -> None:
    port = _free_port()
    with anyio.fail_after(WAIT), pytest.raises(BackendUnavailableError) as caught:
        await connect(url=f"http://127.0.0.1:{port}")
    assert "cannot reach" in str(caught.value)
    assert SECRET not in _chain(caught.value)


async def test_replica_of_an_unreachable_server_fails_fast(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    replica = tmp_path / "replica.db"
    monkeypatch.setenv("WORKFLOW_TURSO_REPLICA_PATH", str(replica))
    port = _free_port()
    with anyio.fail_after(WAIT), pytest.raises(BackendUnavailableError) as caught:
        await connect(url=f"libsql://127.0.0.1:{port}")
    assert SECRET not in _chain(caught.value)
    assert not replica.exists()


async def test_unknown_host_fails_without_hanging() -> None:
    """A name the resolver says does not exist is a settings error; a resolver that does not
    answer is a transient fault."""
    try:
        socket.getaddrinfo("world-turso-test.invalid", 443)
    except socket.gaierror as exc:
        unknown = exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME))
    else:
        unknown = False
    expected = ConfigurationError if unknown else BackendUnavailableError
    with anyio.fail_after(WAIT), pytest.raises(expected) as caught:
        await connect(url="libsql://world-turso-test.invalid")
    assert SECRET not in _chain(caught.value)


async def test_silent_server_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A listener that accepts and never answers: libsql alone would wait indefinitely
    (holding the GIL); the probe gives up after WORKFLOW_TURSO_CONNECT_TIMEOUT."""
    held: list[anyio.abc.SocketStream] = []

    async def hold(stream: anyio.abc.SocketStream) -> None:
        held.append(stream)
        await anyio.sleep_forever()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, hold)
        for scheme in ("http", "libsql"):
            with anyio.fail_after(WAIT), pytest.raises(BackendUnavailableError) as caught:
                await connect(url=f"{scheme}://127.0.0.1:{port}")
            assert "WORKFLOW_TURSO_CONNECT_TIMEOUT" in str(caught.value)
            assert SECRET not in _chain(caught.value)
        tg.cancel_scope.cancel()
    for stream in held:
        await stream.aclose()
    assert held, "the probe never connected"


async def test_non_http_server_refused() -> None:
    async def babble(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await stream.send(b"-ERR unknown command\r\n")

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, babble)
        with anyio.fail_after(WAIT), pytest.raises(BackendUnavailableError, match="not as an HTTP"):
            await connect(url=f"http://127.0.0.1:{port}")
        tg.cancel_scope.cancel()


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[int]:
    """Python's http.server in a child process: it answers HTTP, but not libSQL's protocol
    (it must live in another process: a libsql call holds this process's GIL)."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        give_up = time.monotonic() + WAIT
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < give_up, "http.server did not start"
                time.sleep(0.05)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=WAIT)


async def test_http_server_that_is_not_libsql(http_server: int) -> None:
    with anyio.fail_after(WAIT), pytest.raises(WorldError) as caught:
        await connect(url=f"http://127.0.0.1:{http_server}")
    assert isinstance(caught.value, BackendUnavailableError)
    assert "libSQL failed" in str(caught.value)
    assert SECRET not in _chain(caught.value)


async def test_settings_and_repr_hide_the_token(db_url: str) -> None:
    async with await connect(url=db_url, namespace="shown") as world:
        shown = world.settings()
        assert shown["auth_token"] == "(set, hidden)"
        assert shown["mode"] == "local"
        assert shown["namespace"] == "shown"
        assert SECRET not in repr(world)
        assert SECRET not in repr(shown)
        assert world.capabilities.outbox
        assert world.capabilities.shared
