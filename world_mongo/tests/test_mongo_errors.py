"""Errors a user can act on: a World that cannot open says which setting to fix, the host and
port it tried and the system's reason, bounded by WORKFLOW_MONGO_CONNECT_TIMEOUT (not by the
server selection timeout of an open World); refused credentials are a settings error. No
password is ever shown."""

from __future__ import annotations

import errno
import gc
import os
import secrets
import subprocess
import sys
import warnings
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
from world_conformance.connect_errors import (
    resolves_as_unknown as _resolves_as_unknown,
)
from world_conformance.connect_errors import (
    silent_listener,
)
from world_core import BackendUnavailableError, ConfigurationError
from world_mongo import connect

pytestmark = pytest.mark.anyio

SECRET = "s3cret-Pa55"
WAIT = 60.0
"""A guard against hanging only: the checks below never depend on how long anything took."""

UNKNOWN_HOST = "world-mongo-test.invalid"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORKFLOW_MONGO_URL", raising=False)
    monkeypatch.delenv("WORKFLOW_MONGO_CONNECT_TIMEOUT", raising=False)


@pytest.fixture(autouse=True)
def _collect_leaked_sockets() -> Iterator[None]:
    """pymongo (4.20) leaks the socket of a connect attempt that is cancelled when its client
    closes (``pool_shared._async_create_connection`` closes it on OSError only), as a World
    that failed to open closes its client. Collect it when the test that made it ends, with its
    ResourceWarning ignored, so that it is not reported against whichever test runs next."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


# The URL asks for a server selection timeout far beyond any wait here: it can end none of
# these opens.
PATIENT = "serverSelectionTimeoutMS=3600000"
HOUR = "3600"
"""A connect timeout no test here waits for: what ends those opens is the servers' refusal."""


async def test_closed_port_fails_at_once_naming_the_variable_host_and_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pymongo would wait for its whole timeout; the first refused check ends the open."""
    port = _free_port()
    monkeypatch.setenv("WORKFLOW_MONGO_URL", f"mongodb://u:{SECRET}@127.0.0.1:{port}/db?{PATIENT}")
    monkeypatch.setenv("WORKFLOW_MONGO_CONNECT_TIMEOUT", HOUR)
    with anyio.fail_after(WAIT), pytest.raises(BackendUnavailableError) as caught:
        await connect()
    message = str(caught.value)
    assert "WORKFLOW_MONGO_URL" in message
    assert f"127.0.0.1:{port}" in message
    assert os.strerror(errno.ECONNREFUSED) in message
    assert "within" not in message  # the refusal, not the timeout, ended it
    assert SECRET not in _chain(caught.value)


async def test_every_seed_refused_fails_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = _free_port(), _free_port()
    monkeypatch.setenv("WORKFLOW_MONGO_CONNECT_TIMEOUT", HOUR)
    url = f"mongodb://127.0.0.1:{first},127.0.0.1:{second}/db?{PATIENT}"
    with anyio.fail_after(WAIT), pytest.raises(BackendUnavailableError) as caught:
        await connect(url=url)
    message = str(caught.value)
    assert f"127.0.0.1:{first}: {os.strerror(errno.ECONNREFUSED)}" in message
    assert f"127.0.0.1:{second}: {os.strerror(errno.ECONNREFUSED)}" in message


async def test_one_silent_seed_keeps_the_open_waiting_for_the_timeout(
    monkeypatch: pytest.MonkeyPatch, silent_port: int
) -> None:
    """A refused seed does not end the open while another may still answer."""
    refused = _free_port()
    monkeypatch.setenv("WORKFLOW_MONGO_CONNECT_TIMEOUT", "0.5")
    url = f"mongodb://127.0.0.1:{refused},127.0.0.1:{silent_port}/db?{PATIENT}"
    with anyio.fail_after(WAIT), pytest.raises(BackendUnavailableError) as caught:
        await connect(url=url)
    message = str(caught.value)
    assert f"127.0.0.1:{refused}: {os.strerror(errno.ECONNREFUSED)}" in message
    assert f"127.0.0.1:{silent_port}: no answer within 0.5 s" in message


async def test_silent_server_is_bounded_by_the_connect_timeout(
    monkeypatch: pytest.MonkeyPatch, silent_port: int
) -> None:
    monkeypatch.setenv("WORKFLOW_MONGO_CONNECT_TIMEOUT", "0.5")
    with anyio.fail_after(WAIT), pytest.raises(BackendUnavailableError) as caught:
        await connect(url=f"mongodb://u:{SECRET}@127.0.0.1:{silent_port}/db?{PATIENT}")
    message = str(caught.value)
    assert "no answer within 0.5 s (WORKFLOW_MONGO_CONNECT_TIMEOUT)" in message
    assert f"127.0.0.1:{silent_port}" in message
    assert "url=" in message  # the argument, not the variable, was the source
    assert SECRET not in _chain(caught.value)


async def test_unknown_host_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    if not _resolves_as_unknown(UNKNOWN_HOST):
        pytest.skip(f"this machine's resolver does not answer 'unknown' for {UNKNOWN_HOST}")
    monkeypatch.setenv("WORKFLOW_MONGO_CONNECT_TIMEOUT", HOUR)
    with anyio.fail_after(WAIT), pytest.raises(ConfigurationError) as caught:
        await connect(url=f"mongodb://u:{SECRET}@{UNKNOWN_HOST}:27017/db?{PATIENT}")
    message = str(caught.value)
    assert f"{UNKNOWN_HOST}:27017" in message
    assert "host name is unknown" in message
    assert SECRET not in _chain(caught.value)


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan"])
async def test_bad_connect_timeout_is_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("WORKFLOW_MONGO_CONNECT_TIMEOUT", value)
    with pytest.raises(ConfigurationError, match="WORKFLOW_MONGO_CONNECT_TIMEOUT"):
        await connect(url="mongodb://127.0.0.1:1/db")


async def test_refused_credentials_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, mongo_url: str
) -> None:
    host = mongo_url.split("://", 1)[1].split("/", 1)[0]
    monkeypatch.setenv("WORKFLOW_MONGO_URL", f"mongodb://bob:{SECRET}@{host}/")
    with anyio.fail_after(WAIT), pytest.raises(ConfigurationError) as caught:
        await connect()
    message = str(caught.value)
    assert "WORKFLOW_MONGO_URL" in message
    assert "refused the credentials" in message
    assert SECRET not in _chain(caught.value)


async def test_the_connect_timeout_is_shown(
    monkeypatch: pytest.MonkeyPatch, mongo_url: str
) -> None:
    monkeypatch.setenv("WORKFLOW_MONGO_CONNECT_TIMEOUT", "2.5")
    world = await connect(url=mongo_url, namespace=f"wm_{secrets.token_hex(8)}")
    try:
        assert world.settings()["WORKFLOW_MONGO_CONNECT_TIMEOUT"] == "2.5"
    finally:
        await world.aclose()


def test_cli_closed_port(tmp_path: Path) -> None:
    port = _free_port()
    environment = {k: v for k, v in os.environ.items() if not k.startswith("WORKFLOW_")}
    environment["WORKFLOW_MONGO_URL"] = f"mongodb://u:{SECRET}@127.0.0.1:{port}/db?{PATIENT}"
    environment["WORKFLOW_MONGO_CONNECT_TIMEOUT"] = HOUR
    result = subprocess.run(
        [sys.executable, "-m", "world_core._cli", "info", "--world", "mongo"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "WORKFLOW_MONGO_URL" in result.stderr
    assert f"127.0.0.1:{port}" in result.stderr
    assert os.strerror(errno.ECONNREFUSED) in result.stderr
    assert SECRET not in result.stderr + result.stdout


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A listener whose connections the kernel accepts and nobody ever answers."""
    with silent_listener() as port:
        yield port
