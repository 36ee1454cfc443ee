"""Errors a user can act on: an unreachable remote server is named with the setting the URL
came from (WORKFLOW_TURSO_URL or url=), its host, port and the system's reason; an unknown
host, a refused auth token and a file where a folder should be are settings errors. The auth
token is never shown. The servers are real sockets and processes."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from world_conformance.connect_errors import (
    error_chain as _chain,
)
from world_conformance.connect_errors import (
    free_port as _free_port,
)
from world_core import BackendUnavailableError, ConfigurationError
from world_turso import connect

pytestmark = pytest.mark.anyio

SECRET = "tok-5d0e9a11-do-not-print"
WAIT = 30.0
"""A guard against hanging only: the checks below never depend on how long anything took."""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("WORKFLOW_TURSO_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("WORKFLOW_TURSO_AUTH_TOKEN", SECRET)


async def test_refused_port_names_the_variable_host_and_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = _free_port()
    monkeypatch.setenv("WORKFLOW_TURSO_URL", f"http://127.0.0.1:{port}")
    with anyio.fail_after(WAIT), pytest.raises(BackendUnavailableError) as caught:
        await connect()
    message = str(caught.value)
    assert "WORKFLOW_TURSO_URL" in message
    assert f"127.0.0.1:{port}" in message
    assert os.strerror(errno.ECONNREFUSED) in message
    assert SECRET not in _chain(caught.value)


async def test_refused_port_names_url_when_given() -> None:
    port = _free_port()
    with anyio.fail_after(WAIT), pytest.raises(BackendUnavailableError) as caught:
        await connect(url=f"libsql://127.0.0.1:{port}")
    assert "url=" in str(caught.value)
    assert "WORKFLOW_TURSO_URL" not in str(caught.value)


async def test_default_connect_timeout_is_five_seconds(tmp_path: Path) -> None:
    async with await connect(url=f"file:{tmp_path / 'w.db'}") as world:
        assert world.settings()["connect_timeout"] == "5"


async def test_a_file_where_the_folder_should_be(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("not a folder")
    with pytest.raises(ConfigurationError, match="is a file, not a folder") as caught:
        await connect(url=f"file:{tmp_path / 'data' / 'world.db'}")
    assert str(tmp_path / "data") in str(caught.value)
    assert "url=" in str(caught.value)


REFUSING_SERVER = textwrap.dedent(
    """
    import http.server, sys

    class Refuse(http.server.BaseHTTPRequestHandler):
        def answer(self):
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            body = b'{"error":"Unauthorized"}'
            self.send_response(int(sys.argv[2]))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = answer

        def log_message(self, *args):
            pass

    http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Refuse).serve_forever()
    """
)


@pytest.fixture(params=[401, 403])
def refusing_server(request: pytest.FixtureRequest) -> Iterator[int]:
    """An HTTP server (another process: a libsql call holds this one's GIL) that refuses every
    request as a libSQL server refuses a bad token."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", REFUSING_SERVER, str(port), str(request.param)],
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
                assert time.monotonic() < give_up, "the HTTP server did not start"
                time.sleep(0.05)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=WAIT)


async def test_refused_auth_token_is_a_configuration_error(refusing_server: int) -> None:
    with anyio.fail_after(WAIT), pytest.raises(ConfigurationError) as caught:
        await connect(url=f"http://127.0.0.1:{refusing_server}")
    assert "WORKFLOW_TURSO_AUTH_TOKEN" in str(caught.value)
    assert SECRET not in _chain(caught.value)


def test_cli_refused_port(tmp_path: Path) -> None:
    port = _free_port()
    environment = {k: v for k, v in os.environ.items() if not k.startswith("WORKFLOW_")}
    environment["WORKFLOW_TURSO_URL"] = f"http://127.0.0.1:{port}"
    environment["WORKFLOW_TURSO_AUTH_TOKEN"] = SECRET
    result = subprocess.run(
        [sys.executable, "-m", "world_core._cli", "info", "--world", "turso"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=WAIT * 2,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "WORKFLOW_TURSO_URL" in result.stderr
    assert f"127.0.0.1:{port}" in result.stderr
    assert os.strerror(errno.ECONNREFUSED) in result.stderr
    assert SECRET not in result.stderr + result.stdout
