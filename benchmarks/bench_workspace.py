"""A file write through ``context.fs`` against a raw append of the same bytes (not a test).

    .ci/with-servers uv run python benchmarks/bench_workspace.py [--rounds R] [--worlds ...]
        [--json] [--quick]

On each World (local, postgres, redis, turso by default; ``--worlds`` adds mongo), in a
temporary namespace purged after, for file sizes of 1 KiB, 64 KiB and 1 MiB:

* ``fs write``: one ``safe`` tool call, inside an open turn, that writes one file of fresh
  random bytes through ``context.fs`` (``Journal.call``). What it costs: reading the tree
  document's head (the call's first use of the workspace), storing the bytes as a blob
  (stream info, write, close), and one atomic append of the call's outcome with the new
  tree version (a call that edits a document is appended at once, never deferred).
* ``blob put``: ``Blobs.put`` of the same bytes alone (what the contents cost).
* ``raw append``: ``world.log.append`` of one event holding the same bytes (the floor: what
  any durable write of those bytes costs on that World).

Each number is the median over ``R`` rounds (default 20; ``--quick``: 3) of one operation,
after one warm-up round; every round writes new random bytes, so no blob is already there.
The session's tree holds one file per round written (rounds are a few dozen files at most).
Timings on a shared machine are noisy: compare columns of one run, not runs.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from world_core import (
    Blobs,
    Client,
    Files,
    Journal,
    NewEvent,
    ToolContext,
    Workspace,
    list_worlds,
    open_world,
    tool,
)

SIZES = {"1KiB": 1024, "64KiB": 64 * 1024, "1MiB": 1024 * 1024}
DEFAULT_URLS = {
    "postgres": os.environ.get("WORLD_TEST_POSTGRES_URL")
    or "postgresql://postgres@127.0.0.1:5432/postgres",
    "redis": os.environ.get("WORLD_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0",
    "mongo": os.environ.get("WORLD_TEST_MONGO_URL") or "mongodb://127.0.0.1:27017",
}


async def write_file(path: str, size: int, context: ToolContext) -> int:
    """Write a file of ``size`` fresh random bytes."""
    files: Files = context.fs
    return await files.write(path, secrets.token_bytes(size))


async def measure(world_name: str, url: str | None, rounds: int) -> list[dict[str, Any]]:
    """Median milliseconds per operation and size on one World."""
    namespace = f"bench_ws_{secrets.token_hex(4)}"
    write = tool(write_file, replay="safe")
    rows: list[dict[str, Any]] = []
    async with open_world(world_name, url=url, namespace=namespace) as world:
        try:
            blobs = Blobs(world.stream)
            for label, size in SIZES.items():
                session = f"bench-{label}"
                await Client(world, queue="bench").submit(session, "go", turn_id="t")
                journal = await Journal.open(world, session, "t")
                fs_times: list[float] = []
                blob_times: list[float] = []
                append_times: list[float] = []
                for index in range(rounds + 1):  # round 0 warms up and is dropped
                    started = time.perf_counter()
                    await journal.call(write, {"path": f"f{index}.bin", "size": size})
                    fs_times.append(time.perf_counter() - started)
                    data = secrets.token_bytes(size)
                    started = time.perf_counter()
                    await blobs.put(data)
                    blob_times.append(time.perf_counter() - started)
                    data = secrets.token_bytes(size)
                    started = time.perf_counter()
                    await world.log.append(f"raw-{label}", [NewEvent(data=data)])
                    append_times.append(time.perf_counter() - started)
                await journal.finish("done")
                files = len((await Workspace(world).tree(session)).files)
                if files != rounds + 1:  # every write committed, none lost
                    raise AssertionError(f"{world_name}: {files} files, expected {rounds + 1}")
                fs_ms = statistics.median(fs_times[1:]) * 1000
                raw_ms = statistics.median(append_times[1:]) * 1000
                rows.append(
                    {
                        "world": world_name,
                        "size": label,
                        "bytes": size,
                        "fs_write_ms": round(fs_ms, 3),
                        "blob_put_ms": round(statistics.median(blob_times[1:]) * 1000, 3),
                        "raw_append_ms": round(raw_ms, 3),
                        "ratio": round(fs_ms / raw_ms, 2) if raw_ms > 0 else None,
                    }
                )
        finally:
            await world.purge()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--worlds",
        default="local,postgres,redis,turso",
        help="comma-separated World names (add mongo where a server answers)",
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON")
    parser.add_argument("--quick", action="store_true", help="3 rounds: a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 3
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    installed = {entry.name for entry in list_worlds()}
    folder = Path(tempfile.mkdtemp(prefix="bench-workspace-"))
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    try:
        for name in [w.strip() for w in args.worlds.split(",") if w.strip()]:
            if name not in installed:
                skipped[name] = "not installed"
                continue
            url = {
                "local": str(folder / "local"),
                "turso": f"file:{folder / 'turso.db'}",
            }.get(name, DEFAULT_URLS.get(name))
            try:
                rows.extend(anyio.run(measure, name, url, args.rounds))
            except OSError as exc:  # a server that does not answer: say so, go on
                skipped[name] = f"{type(exc).__name__}: {exc}"
            print(f"  measured {name}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    result = {"rounds": args.rounds, "rows": rows, "skipped": skipped}
    if not args.json:
        print(f"\nmedian ms per operation, {args.rounds} rounds (after one warm-up)")
        print(
            f"{'world':<10}{'size':>7}{'fs write':>11}{'blob put':>11}{'raw append':>12}"
            f"{'fs/raw':>8}"
        )
        for row in rows:
            print(
                f"{row['world']:<10}{row['size']:>7}{row['fs_write_ms']:>11.2f}"
                f"{row['blob_put_ms']:>11.2f}{row['raw_append_ms']:>12.2f}{row['ratio']:>7}x"
            )
        for name, why in skipped.items():
            print(f"skipped {name}: {why}")
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
