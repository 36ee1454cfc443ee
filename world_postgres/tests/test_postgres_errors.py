"""Errors a user can act on: a World that cannot open says which setting to fix, the host and
port it tried and the system's reason, within the connect timeout (its first connection is not
retried); a refused login or a missing privilege is a settings error. No password is shown."""

from __future__ import annotations

import errno
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import anyio
import asyncpg
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
    world_info,
)
from world_core import BackendUnavailableError, ConfigurationError
from world_postgres import connect

pytestmark = pytest.mark.anyio

SECRET = "s3cret-Pa55"
WAIT = 60.0
"""A guard against hanging only: the checks below never depend on how long anything took."""

UNKNOWN_HOST = "world-postgres-test.invalid"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WORKFLOW_POSTGRES_URL", "DATABASE_URL", "WORKFLOW_POSTGRES_CONNECT_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    # Opening must not use the retry window of an open World: an hour would show.
    monkeypatch.setenv("WORKFLOW_POSTGRES_RETRY_SECONDS", "3600")


# --------------------------------------------------------------------------------------------
# A server that is not there
# --------------------------------------------------------------------------------------------


async def test_closed_port_fails_at_once_naming_the_variable_host_and_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = _free_port()
    monkeypatch.setenv(
        "WORKFLOW_POSTGRES_URL", f"postgresql://postgres:{SECRET}@127.0.0.1:{port}/postgres"
    )
    with anyio.fail_after(WAIT), pytest.raises(BackendUnavailableError) as caught:
        await connect()
    message = str(caught.value)
    assert "WORKFLOW_POSTGRES_URL" in message
    assert f"127.0.0.1:{port}" in message
    assert os.strerror(errno.ECONNREFUSED) in message
    assert "took effect" not in message  # no connection was ever opened
    assert SECRET not in _chain(caught.value)


async def test_database_url_is_named_when_it_was_the_source(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DATABASE_URL", f"postgresql://postgres@127.0.0.1:{_free_port()}/postgres")
    with anyio.fail_after(WAIT), pytest.raises(BackendUnavailableError, match="DATABASE_URL"):
        await connect()


async def test_silent_server_is_bounded_by_the_connect_timeout(
    monkeypatch: pytest.MonkeyPatch, silent_port: int
) -> None:
    monkeypatch.setenv("WORKFLOW_POSTGRES_CONNECT_TIMEOUT", "0.5")
    url = f"postgresql://postgres:{SECRET}@127.0.0.1:{silent_port}/postgres"
    with anyio.fail_after(WAIT), pytest.raises(BackendUnavailableError) as caught:
        await connect(url=url)
    message = str(caught.value)
    assert "no answer within 0.5 s (WORKFLOW_POSTGRES_CONNECT_TIMEOUT)" in message
    assert f"127.0.0.1:{silent_port}" in message
    assert "url=" in message  # the argument, not a variable, was the source
    assert "took effect" not in message
    assert SECRET not in _chain(caught.value)


async def test_unknown_host_is_a_configuration_error() -> None:
    if not _resolves_as_unknown(UNKNOWN_HOST):
        pytest.skip(f"this machine's resolver does not answer 'unknown' for {UNKNOWN_HOST}")
    url = f"postgresql://postgres:{SECRET}@{UNKNOWN_HOST}:5432/postgres"
    with anyio.fail_after(WAIT), pytest.raises(ConfigurationError) as caught:
        await connect(url=url)
    message = str(caught.value)
    assert f"{UNKNOWN_HOST}:5432" in message
    assert "host name is unknown" in message
    assert SECRET not in _chain(caught.value)


# --------------------------------------------------------------------------------------------
# A server that says no
# --------------------------------------------------------------------------------------------


class Server(Protocol):
    """The ``auth_cluster`` fixture: a throwaway cluster that checks passwords."""

    url: str
    port: int


@pytest.fixture(scope="module")
def roles(auth_cluster: Server) -> Server:
    """The cluster with a role that may log in but not create a schema."""

    async def setup() -> None:
        conn = await asyncpg.connect(auth_cluster.url)
        try:
            await conn.execute(f"CREATE ROLE plain LOGIN PASSWORD '{SECRET}'")
            await conn.execute("REVOKE CREATE ON DATABASE postgres FROM PUBLIC")
        finally:
            await conn.close()

    anyio.run(setup)
    return auth_cluster


async def test_wrong_password_is_a_configuration_error(
    roles: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = "not-the-password-42"
    monkeypatch.setenv(
        "WORKFLOW_POSTGRES_URL", f"postgresql://postgres:{wrong}@127.0.0.1:{roles.port}/postgres"
    )
    with anyio.fail_after(WAIT), pytest.raises(ConfigurationError) as caught:
        await connect()
    message = str(caught.value)
    assert "WORKFLOW_POSTGRES_URL" in message
    assert "password" in message
    assert wrong not in _chain(caught.value)


async def test_unknown_role_is_a_configuration_error(pg_url: str) -> None:
    """On a server that trusts every login, a role that does not exist is refused (28000)."""
    url = pg_url.replace("postgresql://postgres@", f"postgresql://nobody_here:{SECRET}@", 1)
    assert SECRET in url
    with anyio.fail_after(WAIT), pytest.raises(ConfigurationError) as caught:
        await connect(url=url)
    message = str(caught.value)
    assert "url=" in message
    assert "nobody_here" in message
    assert SECRET not in _chain(caught.value)


async def test_missing_create_privilege_is_a_configuration_error(roles: Server) -> None:
    url = f"postgresql://plain:{SECRET}@127.0.0.1:{roles.port}/postgres"
    with anyio.fail_after(WAIT), pytest.raises(ConfigurationError) as caught:
        await connect(url=url)
    message = str(caught.value)
    assert "url=" in message
    assert "permission denied" in message
    assert "CREATE" in message
    assert SECRET not in _chain(caught.value)


# --------------------------------------------------------------------------------------------
# The `world` command, as a user runs it
# --------------------------------------------------------------------------------------------


def test_cli_closed_port(tmp_path: Path) -> None:
    port = _free_port()
    result = _world_info(
        cwd=tmp_path,
        WORKFLOW_POSTGRES_URL=f"postgresql://postgres:{SECRET}@127.0.0.1:{port}/postgres",
        WORKFLOW_POSTGRES_RETRY_SECONDS="3600",
    )
    assert result.returncode == 2, result.stderr
    assert "WORKFLOW_POSTGRES_URL" in result.stderr
    assert f"127.0.0.1:{port}" in result.stderr
    assert os.strerror(errno.ECONNREFUSED) in result.stderr
    assert "took effect" not in result.stderr
    assert SECRET not in result.stderr + result.stdout


def test_cli_silent_server_with_url_option(tmp_path: Path, silent_port: int) -> None:
    url = f"postgresql://postgres:{SECRET}@127.0.0.1:{silent_port}/postgres"
    result = _world_info(
        "--url",
        url,
        cwd=tmp_path,
        WORKFLOW_POSTGRES_CONNECT_TIMEOUT="0.5",
        WORKFLOW_POSTGRES_RETRY_SECONDS="3600",
    )
    assert result.returncode == 2, result.stderr
    assert "0.5 s (WORKFLOW_POSTGRES_CONNECT_TIMEOUT)" in result.stderr
    assert f"127.0.0.1:{silent_port}" in result.stderr
    assert SECRET not in result.stderr + result.stdout


def test_cli_wrong_password(tmp_path: Path, roles: Server) -> None:
    wrong = "not-the-password-42"
    result = _world_info(
        cwd=tmp_path,
        WORKFLOW_POSTGRES_URL=f"postgresql://postgres:{wrong}@127.0.0.1:{roles.port}/postgres",
    )
    assert result.returncode == 2, result.stderr
    assert "refused the login" in result.stderr
    assert "WORKFLOW_POSTGRES_URL" in result.stderr
    assert "bug" not in result.stderr
    assert wrong not in result.stderr + result.stdout


async def test_a_world_that_worked_is_not_affected(pg_url: str) -> None:
    """The connect timeout and the no-retry rule are for opening only; settings show both."""
    world = await connect(url=pg_url, namespace=f"pgt_{secrets.token_hex(8)}")
    try:
        assert world.settings()["retry_seconds"] == "3600"
        assert world.settings()["connect_timeout"] == "5"
    finally:
        await world.purge()
        await world.aclose()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A listener whose connections the kernel accepts and nobody ever answers."""
    with silent_listener() as port:
        yield port


def _world_info(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return world_info("postgres", *args, cwd=cwd, **env)
