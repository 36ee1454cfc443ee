"""A separate process for the world_postgres tests (not a test module).

    python pg_child.py URL NAMESPACE open-append LOG GO_FILE
    python pg_child.py URL NAMESPACE enqueue QUEUE PAYLOAD

open-append waits (bounded) until GO_FILE exists, so that many children open the World at the
same moment, then appends one event and prints the new tail. enqueue prints the message id.
"""

from __future__ import annotations

import asyncio
import sys
import time

import anyio

from world_core import NewEvent
from world_postgres import connect


async def main(url: str, namespace: str, command: str, *args: str) -> None:
    if command == "open-append":
        log_id, go = args
        deadline = time.monotonic() + 60
        while not await anyio.Path(go).exists():
            if time.monotonic() > deadline:
                raise SystemExit("no go file within 60 s")
            await asyncio.sleep(0.005)
        world = await connect(url=url, namespace=namespace)
        try:
            print(await world.log.append(log_id, [NewEvent(data=b"x")]))
        finally:
            await world.aclose()
    elif command == "enqueue":
        queue, payload = args
        world = await connect(url=url, namespace=namespace)
        try:
            print(await world.queue.enqueue(queue, payload.encode()))
        finally:
            await world.aclose()
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
