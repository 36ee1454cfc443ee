"""Errors a user can act on: a World that cannot open says which setting to fix, the host and
port it tried and the system's reason, bounded by WORKFLOW_REDIS_CONNECT_TIMEOUT; refused
credentials (WRONGPASS, NOAUTH) and missing permissions (NOPERM) are settings errors. No
password is ever shown."""

from __future__ import annotations

import errno
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import anyio
import pytest

from world_conformance.connect_errors import (
    error_chain as _chain,
)
from world_conformance.connect_errors import (
    free_port,
    silent_listener,
    world_info,
)
from world_conformance.connect_errors import (
    resolves_as_unknown as _resolves_as_unknown,
)
from world_core import BackendUnavailableError, ConfigurationError, NewEvent
from world_redis import connect

pytestmark = pytest.mark.anyio

SECRET = "s3cret-Pa55"  # the auth_server's password (conftest)
USER_SECRET = "us3r-Pa55"  # its users' (conftest)
WAIT = 60.0
"""A guard against hanging only: the checks below never depend on how long anything took."""

UNKNOWN_HOST = "world-redis-test.invalid"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORKFLOW_REDIS_URL", raising=False)
    monkeypatch.delenv("WORKFLOW_REDIS_CONNECT_TIMEOUT", raising=False)


class Guarded(Protocol):
    """The ``auth_server`` fixture (conftest): a redis-server that wants a password."""

    port: int
    password: str | None


@pytest.fixture
def guarded(auth_server: Guarded) -> Guarded:
    assert auth_server.password == SECRET
    return auth_server


# --------------------------------------------------------------------------------------------
# A server that is not there
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["redis", "redis+cluster"])
async def test_closed_port_names_the_variable_host_and_reason(
    monkeypatch: pytest.MonkeyPatch, scheme: str
) -> None:
    port = free_port()
    monkeypatch.setenv("WORKFLOW_REDIS_URL", f"{scheme}://:{SECRET}@127.0.0.1:{port}/0")
    with anyio.fail_after(WAIT), pytest.raises(BackendUnavailableError) as caught:
        await connect()
    message = str(caught.value)
    assert "WORKFLOW_REDIS_URL" in message
    assert f"127.0.0.1:{port}" in message
    assert os.strerror(errno.ECONNREFUSED) in message
    assert "took effect" not in message  # no connection was ever opened
    assert SECRET not in _chain(caught.value)


async def test_silent_server_is_bounded_by_the_connect_timeout(
    monkeypatch: pytest.MonkeyPatch, silent_port: int
) -> None:
    """The kernel accepts the connection, so only the first answer can be waited for: the
    connect timeout bounds that too (the 30 s socket timeout of later calls did before)."""
    monkeypatch.setenv("WORKFLOW_REDIS_CONNECT_TIMEOUT", "0.5")
    with anyio.fail_after(WAIT), pytest.raises(BackendUnavailableError) as caught:
        await connect(url=f"redis://:{SECRET}@127.0.0.1:{silent_port}/0")
    message = str(caught.value)
    assert "no answer within 0.5 s (WORKFLOW_REDIS_CONNECT_TIMEOUT)" in message
    assert f"127.0.0.1:{silent_port}" in message
    assert "url=" in message  # the argument, not the variable, was the source
    assert SECRET not in _chain(caught.value)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        *(("WORKFLOW_REDIS_CONNECT_TIMEOUT", value) for value in ["0", "-1", "soon", "nan"]),
        *(("WORKFLOW_REDIS_MAX_WAITS", value) for value in ["0", "-3", "many", "1.5"]),
    ],
)
async def test_bad_setting_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, single_url: str, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError, match=f"{variable}={value!r} is not a positive"):
        await connect(url=single_url)


async def test_waits_past_max_waits_say_which_setting_to_raise(
    monkeypatch: pytest.MonkeyPatch, single_url: str
) -> None:
    """With WORKFLOW_REDIS_MAX_WAITS=2, two watches asleep hold both blocking connections; a
    third waiter is refused at once with the setting named, and the two still work."""
    monkeypatch.setenv("WORKFLOW_REDIS_MAX_WAITS", "2")
    world = await connect(url=single_url, namespace=f"wrt_{secrets.token_hex(8)}")
    try:
        assert world.settings()["max_waits"] == "2"
        blocking: Any = world._conn.blocking
        pool = blocking.connection_pool
        seen: list[str] = []

        async def watch(log_id: str) -> None:
            async for event in world.log.watch(log_id):
                seen.append(f"{log_id}:{event.seq}")
                return

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch, "a")
                tg.start_soon(watch, "b")
                while len(pool._in_use_connections) < 2:  # noqa: ASYNC110 (both in XREAD BLOCK)
                    await anyio.sleep(0.01)
                with pytest.raises(BackendUnavailableError) as caught:
                    await anext(aiter(world.log.watch("c")))
                message = str(caught.value)
                assert "raise WORKFLOW_REDIS_MAX_WAITS (now 2)" in message, message
                await world.log.append("a", [NewEvent(data=b"x")])
                await world.log.append("b", [NewEvent(data=b"y")])
        assert sorted(seen) == ["a:1", "b:1"]
    finally:
        await world.purge()
        await world.aclose()


@pytest.mark.parametrize("scheme", ["redis", "redis+cluster"])
async def test_malformed_url_is_a_setting_error_that_hides_the_password(scheme: str) -> None:
    """An IPv6 host whose '[' is never closed: a ValueError traceback before."""
    malformed = f"{scheme}://:{SECRET}@[::1/0"
    with anyio.fail_after(WAIT), pytest.raises(ConfigurationError, match="not a valid") as caught:
        await connect(url=malformed)
    assert SECRET not in str(caught.value)


async def test_the_connect_timeout_is_shown(
    monkeypatch: pytest.MonkeyPatch, single_url: str
) -> None:
    monkeypatch.setenv("WORKFLOW_REDIS_CONNECT_TIMEOUT", "2.5")
    world = await connect(url=single_url, namespace=f"wrt_{secrets.token_hex(8)}")
    try:
        assert world.settings()["connect_timeout"] == "2.5"
    finally:
        await world.aclose()


async def test_unknown_host_is_a_configuration_error() -> None:
    if not _resolves_as_unknown(UNKNOWN_HOST):
        pytest.skip(f"this machine's resolver does not answer 'unknown' for {UNKNOWN_HOST}")
    with anyio.fail_after(WAIT), pytest.raises(ConfigurationError) as caught:
        await connect(url=f"redis://:{SECRET}@{UNKNOWN_HOST}:6379/0")
    message = str(caught.value)
    assert f"{UNKNOWN_HOST}:6379" in message
    assert "host name is unknown" in message
    assert SECRET not in _chain(caught.value)


# --------------------------------------------------------------------------------------------
# A server that says no
# --------------------------------------------------------------------------------------------


async def test_wrong_password_is_a_configuration_error(
    guarded: Guarded, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = "not-the-password-42"
    monkeypatch.setenv("WORKFLOW_REDIS_URL", f"redis://:{wrong}@127.0.0.1:{guarded.port}/0")
    with anyio.fail_after(WAIT), pytest.raises(ConfigurationError) as caught:
        await connect()
    message = str(caught.value)
    assert "WORKFLOW_REDIS_URL" in message
    assert "refused the credentials" in message
    assert wrong not in _chain(caught.value)


async def test_missing_password_is_a_configuration_error(guarded: Guarded) -> None:
    with anyio.fail_after(WAIT), pytest.raises(ConfigurationError) as caught:
        await connect(url=f"redis://127.0.0.1:{guarded.port}/0")
    message = str(caught.value)
    assert "wants a password" in message
    assert "url=" in message


async def test_user_without_any_permission_cannot_open(guarded: Guarded) -> None:
    url = f"redis://nothing:{USER_SECRET}@127.0.0.1:{guarded.port}/0"
    with anyio.fail_after(WAIT), pytest.raises(ConfigurationError) as caught:
        await connect(url=url)
    message = str(caught.value)
    assert "NOPERM" in message or "permission" in message
    assert "url=" in message
    assert USER_SECRET not in _chain(caught.value)


async def test_user_without_scripts_gets_a_configuration_error_at_first_use(
    guarded: Guarded, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "WORKFLOW_REDIS_URL", f"redis://scripts_off:{USER_SECRET}@127.0.0.1:{guarded.port}/0"
    )
    world = await connect(namespace=f"wrt_{secrets.token_hex(8)}")
    try:
        with anyio.fail_after(WAIT), pytest.raises(ConfigurationError) as caught:
            await world.log.append("l", [NewEvent(data=b"x")])
    finally:
        await world.aclose()
    message = str(caught.value)
    assert "WORKFLOW_REDIS_URL" in message
    assert "permission" in message
    assert USER_SECRET not in _chain(caught.value)


# --------------------------------------------------------------------------------------------
# The `world` command, as a user runs it
# --------------------------------------------------------------------------------------------


def test_cli_closed_port(tmp_path: Path) -> None:
    port = free_port()
    result = _world_info(cwd=tmp_path, WORKFLOW_REDIS_URL=f"redis://:{SECRET}@127.0.0.1:{port}/0")
    assert result.returncode == 2, result.stderr
    assert "WORKFLOW_REDIS_URL" in result.stderr
    assert f"127.0.0.1:{port}" in result.stderr
    assert os.strerror(errno.ECONNREFUSED) in result.stderr
    assert "took effect" not in result.stderr
    assert SECRET not in result.stderr + result.stdout


def test_cli_wrong_password(tmp_path: Path, guarded: Guarded) -> None:
    wrong = "not-the-password-42"
    result = _world_info("--url", f"redis://:{wrong}@127.0.0.1:{guarded.port}/0", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "refused the credentials" in result.stderr
    assert "Retry later" not in result.stderr
    assert wrong not in result.stderr + result.stdout


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A listener whose connections the kernel accepts and nobody ever answers."""
    with silent_listener() as port:
        yield port


def _world_info(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return world_info("redis", *args, cwd=cwd, **env)
