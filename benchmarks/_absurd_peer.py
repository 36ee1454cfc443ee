"""Absurd (``absurd-sdk``, durable execution on Postgres) as a step-overhead peer (not a test).

Used by ``bench_steps.py``: ``absurd_medians(url, rounds, sizes)`` returns the median T(N), in
seconds, of an Absurd task of N no-op steps for each N in ``sizes`` (R rounds after one
warm-up round, like the DBOS peer), measured in a temporary database created on the server of
``url`` and dropped after.

What one T(N) holds, Absurd's counterpart of our turn: ``spawn`` (one row in the task and run
tables), then one worker pass (``work_batch``) that claims the task, loads its checkpoints, runs
N ``ctx.step`` no-ops and completes the run; the clock stops when ``complete_run`` has returned
on an autocommit connection, so the completion is durable. Each step costs Absurd two round
trips: a checkpoint look-up (a step absent from the checkpoints loaded at claim time is asked
for again) and the checkpoint write. The worker is driven directly rather than by the polling
``start_worker`` loop, so no poll interval sits inside T; spawn and claim are fixed costs that
cancel out of the per-step overhead (T(N) - T(0)) / N anyway. Client and worker share one
connection, as our turn shares one World.

The schema is the one ``absurdctl init`` applies (``absurdctl.BUNDLED_SCHEMA_SQL``, the release
of absurd-sdk); ``absurdctl`` pipes it to ``psql``, here it goes as one simple-protocol script.
The SDK is asyncio and keeps no global state, so it runs in the benchmark's own process.
"""

from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Sequence
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import anyio
import psycopg
from absurd_sdk import AsyncAbsurd, AsyncTaskContext

QUEUE = "bench"
TURN_DEADLINE = 60.0  # seconds for one spawn-to-complete turn of at most 100 no-op steps
CONNECT_TIMEOUT = 10  # seconds, libpq's connect_timeout


def database_url(url: str, database: str) -> str:
    """``url`` with its database (the path) replaced by ``database``; query and user kept."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"url: expected a postgresql:// URL, got scheme {parts.scheme!r}")
    return parts._replace(path=f"/{database}").geturl()


async def _admin(url: str, sql: str) -> None:
    # CREATE/DROP DATABASE refuse to run inside a transaction block: autocommit.
    async with await psycopg.AsyncConnection.connect(
        url, autocommit=True, connect_timeout=CONNECT_TIMEOUT
    ) as conn:
        await conn.execute(sql.encode())


async def _noop(i: int) -> int:
    return i


async def _turn(params: Any, ctx: AsyncTaskContext) -> str:
    for i in range(int(params["n"])):
        # A loop's steps share a name; the SDK numbers repeats (noop, noop#2, ...).
        await ctx.step("noop", partial(_noop, i))
    return "done"


async def _measure(url: str, rounds: int, sizes: Sequence[int]) -> dict[int, float]:
    import absurdctl

    schema: str = absurdctl.BUNDLED_SCHEMA_SQL
    # psycopg sends a query without parameters by the simple protocol: many statements at once.
    await _admin(url, schema)
    client = AsyncAbsurd(url, queue_name=QUEUE)
    client.register_task("turn")(_turn)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    try:
        await client.create_queue()
        for _ in range(rounds + 1):  # the first round warms up, and is dropped
            for n in sizes:
                with anyio.fail_after(TURN_DEADLINE):
                    started = time.perf_counter()
                    spawned = await client.spawn("turn", {"n": n}, max_attempts=1)
                    await client.work_batch(worker_id="bench", claim_timeout=int(TURN_DEADLINE))
                    elapsed = time.perf_counter() - started
                    snapshot = await client.fetch_task_result(str(spawned["task_id"]))
                # work_batch records a handler's failure in the run instead of raising: check.
                if snapshot is None or snapshot.state != "completed":
                    raise RuntimeError(f"Absurd task of {n} steps did not complete: {snapshot}")
                times[n].append(elapsed)
    finally:
        await client.close()
    return {n: statistics.median(values[1:]) for n, values in times.items()}


async def absurd_medians(url: str, rounds: int, sizes: Sequence[int]) -> dict[int, float]:
    """Median T(N) in seconds per N of ``sizes``, in a temporary database on ``url``'s server.

    Args:
        url: a ``postgresql://`` URL of a user allowed to create databases; only its server
            and credentials are used.
        rounds: measured rounds (at least 1); one more round warms up first.
        sizes: the step counts N to measure.

    Raises:
        ValueError: ``url`` is not a Postgres URL, or ``rounds`` is below 1.
        RuntimeError: a task did not reach the ``completed`` state.
    """
    if rounds < 1:
        raise ValueError(f"rounds: expected at least 1, got {rounds}")
    database = f"bench_absurd_{secrets.token_hex(4)}"
    target = database_url(url, database)
    await _admin(url, f'CREATE DATABASE "{database}"')
    try:
        return await _measure(target, rounds, sizes)
    finally:
        await _admin(url, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
