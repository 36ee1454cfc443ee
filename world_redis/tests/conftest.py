"""Servers for the world_redis tests: real redis-server processes on loopback, stopped by
pid: the local server (or a throwaway one), a durable one that can be killed and restarted,
and a three-master cluster."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

from world_redis import RedisWorld, connect

_START_TIMEOUT = 20.0


def free_port(*, with_bus: bool = False) -> int:
    """A loopback port free now (and, for cluster nodes, its bus port +10000 too)."""
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port + 10000 > 65535 and with_bus:
            continue
        if with_bus:
            with socket.socket() as bus:
                try:
                    bus.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
        return port
    raise RuntimeError("no free loopback port found")


def _wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + _START_TIMEOUT
    pause = 0.02
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(pause)
        pause = min(pause * 1.5, 0.25)
    raise RuntimeError(f"{what} within {_START_TIMEOUT} s")


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed: apt-get install -y redis-server")
    return found


class Server:
    """One redis-server in ``directory`` on ``port``; ``stop``/``start`` keep its data dir.
    ``extra``: more configuration arguments (``--requirepass``, ``--user``); ``password``: the
    default user's, for the readiness check."""

    def __init__(
        self,
        directory: Path,
        *,
        durable: bool,
        cluster: bool = False,
        extra: Sequence[str] = (),
        password: str | None = None,
    ) -> None:
        self.directory = directory
        self.port = free_port(with_bus=cluster)
        self.durable = durable
        self.cluster = cluster
        self.extra = list(extra)
        self.password = password
        self._process: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _argv(self) -> list[str]:
        argv = [
            _binary("redis-server"),
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--logfile",
            str(self.directory / "redis.log"),
        ]
        if self.durable:
            argv += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            argv += ["--appendonly", "no"]
        if self.cluster:
            argv += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        return argv + self.extra

    def ping(self) -> bool:
        client = redis.Redis(
            host="127.0.0.1", port=self.port, password=self.password, socket_timeout=1.0
        )
        try:
            return bool(client.ping())
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
            return False
        finally:
            client.close()

    def start(self) -> None:
        assert self._process is None, "already running"
        self._process = subprocess.Popen(
            self._argv(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _wait_until(self.ping, f"redis-server on port {self.port} did not answer")

    def kill(self) -> None:
        """SIGKILL: no shutdown save, no goodbye; what is not on disk is lost."""
        process, self._process = self._process, None
        if process is not None:
            process.kill()
            process.wait(timeout=10)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


class Cluster:
    """Three masters, no replicas, created with ``redis-cli --cluster create``."""

    def __init__(self, directory: Path) -> None:
        self.nodes = [Server(directory / f"node{i}", durable=False, cluster=True) for i in range(3)]

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def start(self) -> None:
        try:
            for node in self.nodes:
                node.start()
            subprocess.run(
                [
                    _binary("redis-cli"),
                    "--cluster",
                    "create",
                    *(f"127.0.0.1:{node.port}" for node in self.nodes),
                    "--cluster-replicas",
                    "0",
                    "--cluster-yes",
                ],
                check=True,
                capture_output=True,
                timeout=60,
            )
            _wait_until(self._ready, "the cluster did not reach cluster_state:ok")
        except BaseException:
            self.stop()
            raise

    def _ready(self) -> bool:
        for node in self.nodes:
            client: Any = redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=1.0)
            try:
                info = client.execute_command("CLUSTER", "INFO")
            finally:
                client.close()
            text = info.decode() if isinstance(info, bytes) else str(info)
            if "cluster_state:ok" not in text:
                return False
        return True

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def single_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``WORLD_TEST_REDIS_URL`` when set, else a throwaway redis-server for this session."""
    given = os.environ.get("WORLD_TEST_REDIS_URL", "").strip()
    if given:
        yield given
        return
    server = Server(Path(tmp_path_factory.mktemp("redis-single")), durable=False)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A three-master Redis Cluster on loopback, started for this session, torn down after."""
    cluster = Cluster(Path(tmp_path_factory.mktemp("redis-cluster")))
    cluster.start()
    try:
        yield cluster.url
    finally:
        cluster.stop()


@pytest.fixture(params=["single", "cluster"])
def any_url(request: pytest.FixtureRequest) -> str:
    """The same test on one server and on the cluster."""
    name = "single_url" if request.param == "single" else "cluster_url"
    return str(request.getfixturevalue(name))


def new_namespace() -> str:
    return f"wrt_{secrets.token_hex(8)}"


@pytest.fixture
async def rworld(any_url: str) -> AsyncIterator[RedisWorld]:
    """A RedisWorld in a namespace of its own, purged and closed after the test."""
    world = await connect(url=any_url, namespace=new_namespace())
    try:
        yield world
    finally:
        await world.purge()
        await world.aclose()


@pytest.fixture
def durable_server(tmp_path: Path) -> Iterator[Server]:
    """A server with ``--appendonly yes --appendfsync always`` in a temp dir, on a free port."""
    server = Server(tmp_path / "durable", durable=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


AUTH_PASSWORD = "s3cret-Pa55"
AUTH_USER_PASSWORD = "us3r-Pa55"


@pytest.fixture(scope="session")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A redis-server that wants a password (``AUTH_PASSWORD``); users ``scripts_off`` (may
    log in and read INFO, may run no script) and ``nothing`` (may run nothing), both with
    ``AUTH_USER_PASSWORD``."""
    server = Server(
        Path(tmp_path_factory.mktemp("redis-auth")),
        durable=False,
        extra=[
            "--requirepass", AUTH_PASSWORD,
            "--user", "scripts_off", "on", f">{AUTH_USER_PASSWORD}", "~*", "+@all", "-@scripting",
            "--user", "nothing", "on", f">{AUTH_USER_PASSWORD}", "~*", "-@all",
        ],
        password=AUTH_PASSWORD,
    )  # fmt: skip
    server.start()
    try:
        yield server
    finally:
        server.stop()
