"""Servers for the world_postgres tests: the PostgreSQL named by WORLD_TEST_POSTGRES_URL, a
throwaway cluster (initdb on a free loopback port) that tests may restart, and one that checks
passwords (scram-sha-256)."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import pytest

from world_postgres import PostgresWorld, connect


def _unavailable(reason: str) -> NoReturn:
    required = {r.strip().lower() for r in os.environ.get("WORLD_REQUIRE", "").split(",")}
    if required & {"all", "postgres"}:
        pytest.fail(f"{reason} (WORLD_REQUIRE names postgres)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # asyncpg runs on asyncio only


@pytest.fixture(scope="session")
def pg_url() -> str:
    """The shared test server."""
    url = os.environ.get("WORLD_TEST_POSTGRES_URL", "")
    if not url:
        _unavailable("WORLD_TEST_POSTGRES_URL is not set; see .ci/servers/postgres.sh")
    return url


@pytest.fixture
async def pg_world(pg_url: str) -> AsyncIterator[PostgresWorld]:
    """A World in a namespace of its own, purged and closed afterwards."""
    opened = await connect(url=pg_url, namespace=fresh_namespace())
    try:
        yield opened
    finally:
        await opened.purge()
        await opened.aclose()


def fresh_namespace() -> str:
    return f"pgt_{secrets.token_hex(8)}"


_START_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pg_bin() -> Path | None:
    roots = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))
    for root in reversed(roots):
        if (root / "initdb").exists():
            return root
    found = shutil.which("initdb")
    return Path(found).parent if found else None


class Cluster:
    """A throwaway PostgreSQL cluster on loopback; ``restart`` keeps its data. With a
    ``password``, every login needs one (scram-sha-256); ``url`` carries the superuser's."""

    def __init__(self, bindir: Path, directory: Path, password: str | None = None) -> None:
        self.bindir = bindir
        self.directory = directory
        self.data = directory / "data"
        self.password = password
        self._on(free_port())

    def _on(self, port: int) -> None:
        self.port = port
        user = "postgres" if self.password is None else f"postgres:{self.password}"
        self.url = f"postgresql://{user}@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        command = list(argv)
        # PostgreSQL refuses to run as root: run its tools as the postgres user then.
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, check=check, timeout=_START_TIMEOUT)

    def init(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres")
        auth = ["-A", "trust"]
        if self.password is not None:
            pwfile = self.directory / "pwfile"
            pwfile.write_text(self.password + "\n")
            if os.geteuid() == 0:
                shutil.chown(pwfile, "postgres")
            auth = ["-A", "scram-sha-256", f"--pwfile={pwfile}"]
        self._run(
            str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres", *auth,
            "-E", "UTF8", "--no-sync",
        )  # fmt: skip

    def pg_ctl(self, action: str, *extra: str) -> None:
        self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l",
            str(self.directory / "pg.log"), "-w", "-t", str(int(_START_TIMEOUT)),
            "-o", f"-h 127.0.0.1 -p {self.port} -k {self.directory} -c fsync=off",
            *extra, action,
        )  # fmt: skip

    def start(self) -> None:
        """Start on the port chosen, or on another one when it was taken meanwhile: a port
        found free can be bound by anything before the server binds it (an outgoing
        connection's ephemeral port, another test's server); CI met "Address already in
        use" once."""
        log = self.directory / "pg.log"
        for attempt in range(1, 6):
            try:
                self.pg_ctl("start")
                return
            except subprocess.CalledProcessError:
                taken = log.exists() and "Address already in use" in log.read_text()
                if not taken or attempt == 5:
                    raise
                log.unlink()
                self._on(free_port())

    def restart(self) -> None:
        """Stop (fast: open connections are cut) and start again."""
        self.pg_ctl("restart", "-m", "fast")

    def stop(self) -> None:
        self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop",
            check=False,
        )  # fmt: skip


@contextmanager
def _throwaway(password: str | None = None) -> Iterator[Cluster]:
    bindir = pg_bin()
    if bindir is None:
        _unavailable("initdb not found: apt-get install -y postgresql")
    with tempfile.TemporaryDirectory(prefix="world_pg_") as folder:
        directory = Path(folder)
        os.chmod(directory, 0o755)
        server = Cluster(bindir, directory, password)
        try:
            server.init()
            server.start()
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            log = directory / "pg.log"
            detail = log.read_text() if log.exists() else ""
            server.stop()
            pytest.fail(f"throwaway PostgreSQL did not start: {exc}\n{detail}", pytrace=False)
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A throwaway cluster for tests that restart the server."""
    with _throwaway() as server:
        yield server


@pytest.fixture(scope="module")
def auth_cluster() -> Iterator[Cluster]:
    """A throwaway cluster that checks passwords (scram-sha-256)."""
    with _throwaway(password=f"su-{secrets.token_hex(8)}") as server:
        yield server
