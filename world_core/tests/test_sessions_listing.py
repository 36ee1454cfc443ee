"""Listing sessions by id pages through the log listing: a page reads its own sessions only,
so a namespace of any size lists (``world sessions --all``) holding one page at a time; and
``world delete`` removes one of them."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from world_conformance.wrappers import PassThroughLog, PassThroughWorld
from world_core import Client, InvalidArgumentError, World, open_world
from world_core.observe import list_sessions

pytestmark = pytest.mark.anyio

SESSIONS = 230
NAMESPACE = "listing"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with open_world("local", url=str(tmp_path / "world"), namespace=NAMESPACE) as opened:
        client = Client(opened)
        for n in range(SESSIONS):
            await client.submit(f"s{n:04d}", "hello", turn_id="t")
        yield opened


class _Counting(PassThroughLog):
    """Counts the session logs read and the items the log listing hands out."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.sessions_read: set[str] = set()
        self.listed = 0

    async def read(self, log_id: str, *, after: int = 0, limit: int | None = None) -> Any:
        self.sessions_read.add(log_id)
        return await super().read(log_id, after=after, limit=limit)

    async def list_logs(self, **kwargs: Any) -> Any:
        page = await super().list_logs(**kwargs)
        self.listed += len(page.items)
        return page


async def test_by_id_pages_read_only_their_sessions_and_list_each_once(world: World) -> None:
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        log = _Counting(world.log)
        page = await list_sessions(
            PassThroughWorld(world, log=log), order="id", limit=50, cursor=cursor
        )
        pages += 1
        names = [s.session for s in page.sessions]
        assert log.sessions_read == {f"session/{name}" for name in names}
        assert log.listed == len(names)
        seen += names
        cursor = page.next_cursor
        if cursor is None:
            break
    assert pages == 5
    assert seen == [f"s{n:04d}" for n in range(SESSIONS)]
    assert all(s.status == "queued" for s in (await list_sessions(world, order="id")).sessions)


async def test_by_id_filters_and_refuses_what_it_cannot_do(world: World) -> None:
    page = await list_sessions(world, order="id", status="done", limit=10)
    assert page.sessions == []
    assert page.next_cursor is None
    newest = await list_sessions(world, limit=10)
    assert newest.next_cursor is not None
    with pytest.raises(InvalidArgumentError, match="same order"):
        await list_sessions(world, order="id", cursor=newest.next_cursor)
    with pytest.raises(InvalidArgumentError, match="follow next_cursor"):
        await list_sessions(world, order="id", page=2)


async def test_newest_first_pages_are_the_same_with_a_bounded_heap(world: World) -> None:
    whole = await list_sessions(world, limit=1000)
    assert len(whole.sessions) == SESSIONS
    pages: list[str] = []
    cursor: str | None = None
    while True:
        page = await list_sessions(world, limit=7, cursor=cursor)
        pages += [s.session for s in page.sessions]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert pages == [s.session for s in whole.sessions]


async def test_world_sessions_all_streams_every_session_by_id(world: World, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "world_core._cli", "sessions", "--world", "local"]
    command += ["--url", str(tmp_path / "world"), "--namespace", NAMESPACE]

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, *extra], capture_output=True, text=True, timeout=120, check=False
        )

    streamed = await anyio.to_thread.run_sync(lambda: run("--all", "--json", "--limit", "40"))
    assert streamed.returncode == 0, streamed.stderr
    lines = [json.loads(line) for line in streamed.stdout.splitlines()]
    assert [line["session"] for line in lines] == [f"s{n:04d}" for n in range(SESSIONS)]
    text = await anyio.to_thread.run_sync(lambda: run("--all", "--limit", "100"))
    assert text.returncode == 0, text.stderr
    rows = text.stdout.splitlines()
    assert rows[0].split()[:2] == ["session", "status"]
    assert len(rows) == SESSIONS + 1
    paged = await anyio.to_thread.run_sync(lambda: run("--order", "id", "--limit", "100"))
    assert paged.stdout.splitlines()[-1].startswith("more: world sessions --order id --cursor ")
    refused = await anyio.to_thread.run_sync(lambda: run("--all", "--order", "updated"))
    assert refused.returncode == 2
    assert "--all lists by id" in refused.stderr


async def test_world_delete_refuses_an_unfinished_turn_and_deletes_with_force(
    world: World, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "world_core._cli", "delete", "s0007", "--world", "local"]
    command += ["--url", str(tmp_path / "world"), "--namespace", NAMESPACE]

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, *extra], capture_output=True, text=True, timeout=120, check=False
        )

    refused = await anyio.to_thread.run_sync(run)
    assert refused.returncode == 1
    assert "turn 't' of session 's0007' is not finished" in refused.stderr
    assert "--force" in refused.stderr
    assert await world.log.tail("session/s0007") == 1
    deleted = await anyio.to_thread.run_sync(lambda: run("--force"))
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout == f"deleted session s0007 (namespace {NAMESPACE})\n"
    listed = [s.session for s in (await list_sessions(world, order="id", limit=1000)).sessions]
    assert "s0007" not in listed
    assert len(listed) == SESSIONS - 1
    again = await anyio.to_thread.run_sync(run)  # gone now: a typo's answer, not "deleted"
    assert again.returncode == 1
    assert again.stderr == (
        f"world delete: no session 's0007' in namespace '{NAMESPACE}': nothing to delete "
        "(world sessions lists them)\n"
    )
