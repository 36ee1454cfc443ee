"""Serve mongoeco's in-memory engine over the MongoDB wire protocol on loopback.

Run with the Python 3.13 interpreter of the venv that has ``mongoeco`` installed (mongo.sh
makes it). A test server only: it stands in for mongod where none can be installed, proves
functional behaviour and nothing about MongoDB's performance.

    python mongoeco_server.py --port PORT [--host 127.0.0.1]

Stops cleanly on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from mongoeco.engines.memory import MemoryEngine
from mongoeco.wire import AsyncMongoEcoProxyServer


async def serve(host: str, port: int) -> None:
    server = AsyncMongoEcoProxyServer(engine=MemoryEngine(), host=host, port=port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    address = await server.start()
    print(f"mongoeco listening on {address.host}:{address.port}", file=sys.stderr, flush=True)
    try:
        await stop.wait()
    finally:
        await server.close()
        print("mongoeco stopped", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
