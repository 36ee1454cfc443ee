"""Finding a server for each backend: temp folders, testcontainers, environment URLs.

Nothing here imports a database driver, Docker or testcontainers until a backend that needs a
container is actually asked for; the Docker probe runs at most once per session.
"""

from __future__ import annotations

import gc
import os
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CONTAINER_IMAGES",
    "Provisioner",
    "Unavailable",
    "env_var",
    "needs_server",
    "required_names",
    "server_key",
]

CONTAINER_IMAGES = {"postgres": "postgres:16", "redis": "redis:7", "mongo": "mongo:7"}
"""Backends started in a testcontainers container when a Docker daemon answers."""


class Unavailable(Exception):
    """No server could be provided for a backend; the message says why and what to set."""


def server_key(world_name: str) -> str:
    """The provisioning name of a World: ``postgres`` for ``postgres``, ``world-postgres``,
    ``world_postgres`` and ``world_postgres:connect`` alike."""
    base = world_name.split(":", 1)[0].split(".", 1)[0]
    base = re.sub(r"[-_.]+", "_", base).strip("_").lower()
    return base.removeprefix("world_") or base


def env_var(server: str) -> str:
    """``WORLD_TEST_<NAME>_URL`` for a provisioning name."""
    return f"WORLD_TEST_{re.sub(r'[^A-Z0-9]+', '_', server.upper())}_URL"


def required_names(value: str | None = None) -> frozenset[str]:
    """The backends ``WORLD_REQUIRE`` names (comma-separated, or ``all``), lower-cased."""
    raw = os.environ.get("WORLD_REQUIRE", "") if value is None else value
    return frozenset(part.strip().lower() for part in raw.split(",") if part.strip())


@dataclass
class _Result:
    url: str | None = None
    reason: str | None = None


class Provisioner:
    """One per test session: hands out one server URL per backend and stops what it started.

    Order per backend: ``local`` gets a temporary folder (``WORLD_TEST_LOCAL_URL`` if set);
    ``turso`` gets ``WORLD_TEST_TURSO_URL``, else ``file:<tmp>/world.db``; ``postgres``,
    ``redis`` and ``mongo`` get a container (postgres:16, redis:7, mongo:7) when a Docker
    daemon answers, else ``WORLD_TEST_<NAME>_URL``; a World whose factory declares
    ``needs_server = False`` gets ``WORLD_TEST_<NAME>_URL`` if set, else a temporary folder;
    any other backend gets ``WORLD_TEST_<NAME>_URL``. Failing all, :class:`Unavailable` says
    what to set.
    """

    def __init__(self, make_temp_dir: Callable[[str], Path]) -> None:
        self._make_temp_dir = make_temp_dir
        self._results: dict[str, _Result] = {}
        self._docker_reason: str | None = None
        self._docker_checked = False
        self._containers: list[Any] = []

    def url(self, server: str, *, needs_server: bool = True) -> str:
        """The URL for a provisioning name (see :func:`server_key`).

        ``needs_server=False`` (the World's factory declares it, see :func:`needs_server`):
        ``WORLD_TEST_<NAME>_URL`` if set, else a temporary folder, as for ``local``.

        Raises:
            Unavailable: no server for it; the message names the variable to set.
        """
        result = self._results.get(server)
        if result is None:
            try:
                result = _Result(url=self._provide(server, needs_server=needs_server))
            except Unavailable as exc:
                result = _Result(reason=str(exc))
            self._results[server] = result
        if result.url is None:
            raise Unavailable(result.reason or "unavailable")
        return result.url

    def close(self) -> None:
        """Stop every container this provisioner started."""
        while self._containers:
            container = self._containers.pop()
            try:
                container.stop()
            except Exception as exc:  # teardown must stop the others too
                warnings.warn(f"could not stop test container: {exc}", stacklevel=1)

    def _provide(self, server: str, *, needs_server: bool = True) -> str:
        variable = env_var(server)
        from_env = os.environ.get(variable, "").strip()
        if not needs_server and server not in CONTAINER_IMAGES and server != "turso":
            return from_env or str(self._make_temp_dir(f"world-{server}"))
        if server == "local":
            return from_env or str(self._make_temp_dir("world-local"))
        if server == "turso":
            return from_env or f"file:{self._make_temp_dir('world-turso') / 'world.db'}"
        if server in CONTAINER_IMAGES:
            docker_reason = self._docker_unavailable()
            if docker_reason is None:
                return self._start_container(server)
            if from_env:
                return from_env
            raise Unavailable(
                f"{docker_reason} and {variable} is not set: start a "
                f"{CONTAINER_IMAGES[server]} server and set {variable} to its URL"
            )
        if from_env:
            return from_env
        raise Unavailable(
            f"no server for World {server!r}: set {variable}, pass --world-url, "
            "or override the world_url fixture in the test class (a World that needs no "
            "server declares it on its factory: connect.needs_server = False)"
        )

    def _docker_unavailable(self) -> str | None:
        """None when a Docker daemon answers, else why not. Probed once, in milliseconds."""
        if not self._docker_checked:
            self._docker_checked = True
            self._docker_reason = _probe_docker()
        return self._docker_reason

    def _start_container(self, server: str) -> str:
        image = CONTAINER_IMAGES[server]
        try:
            if server == "postgres":
                from testcontainers.community.postgres import (
                    PostgresContainer,
                )

                postgres = PostgresContainer(image, driver=None)
                postgres.start()
                self._containers.append(postgres)
                return str(postgres.get_connection_url())
            if server == "redis":
                from testcontainers.community.redis import RedisContainer

                redis = RedisContainer(image)
                redis.start()
                self._containers.append(redis)
                host, port = redis.get_container_host_ip(), redis.get_exposed_port(6379)
                return f"redis://{host}:{port}/0"
            from testcontainers.community.mongodb import MongoDbContainer

            mongo = MongoDbContainer(image)
            mongo.start()
            self._containers.append(mongo)
            return str(mongo.get_connection_url())
        except Exception as exc:
            raise Unavailable(f"the {image} container did not start: {exc}") from exc


def _probe_docker() -> str | None:
    """``docker.from_env().ping()``, skipped when there is plainly no daemon to ask."""
    host = os.environ.get("DOCKER_HOST", "")
    if not host and not Path("/var/run/docker.sock").exists():
        return "no Docker daemon (no DOCKER_HOST, no /var/run/docker.sock)"
    # docker-py leaves the socket of a refused connection to the garbage collector; collect it
    # here, where its ResourceWarning is expected, rather than in some later test.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            import docker

            client = docker.from_env(timeout=3)
            try:
                client.ping()
            finally:
                client.close()
        except Exception as exc:  # any failure means: no usable daemon
            return f"no Docker daemon ({type(exc).__name__}: {exc})"
        finally:
            gc.collect()
    return None


def needs_server(factory: object) -> bool:
    """Whether a World's factory needs a server from the provisioner.

    A World that keeps its data in memory or in files declares ``needs_server = False`` on
    its factory (``connect.needs_server = False`` after ``async def connect``); the plugin
    then hands it ``WORLD_TEST_<NAME>_URL`` if set, else a fresh temporary folder (an
    in-memory World ignores it, a file World keeps its files there), and
    ``pytest --pyargs world_conformance --world NAME`` runs with no URL at all.
    """
    return getattr(factory, "needs_server", True) is not False
