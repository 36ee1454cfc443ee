"""A child process for the local World's multi-process tests (run as a script, never imported).

    python child.py MODE FOLDER NAMESPACE TARGET REPORT [ARG]

It writes one line to REPORT (flushed, not fsynced: a killed process's page cache survives)
for every call that *returned*, so the parent knows what was acknowledged.

Modes:
    append  append batches of 3 keyed events to log TARGET forever (line: batch number);
            ARG prefixes the keys, so several appenders can share a log.
    outbox  like append, each batch with one outbox message to queue ``TARGET.q`` whose
            payload is the batch's label ``<ARG><n>``.
    stream  write batches of 3 chunks to stream TARGET forever (line: batch number); ARG
            prefixes the chunks.
    claim   claim (lease ARG seconds) and ack from queue TARGET forever
            (lines: ``claimed <id>``, ``acked <id>``).
    churn   ARG is ``<count>:<lease>``; count times: enqueue a 100 kB message, claim up to 2
            and ack them (lines: ``enqueued <id>``, ``acked <id>``).
    drain   claim and ack from queue TARGET until it stays empty (line: ``acked <id>``).
    hold    claim one message (lease ARG seconds), report ``claimed <id> <attempt>``, exit.
    watch   report each event of log TARGET as it arrives (line: its data) until ARG events.
"""

from __future__ import annotations

import sys
from typing import TextIO

import anyio

from world_core.spi import NewEvent, OutboxMessage
from world_local import LocalWorld, connect

BATCH = 3


async def _append(
    world: LocalWorld, target: str, out: TextIO, tag: str, outbox: bool = False
) -> None:
    n = 0
    while True:
        events = [
            NewEvent(data=f"{tag}{n}/{i}".encode(), key=f"{tag}{n}/{i}") for i in range(BATCH)
        ]
        messages = [OutboxMessage(queue=f"{target}.q", payload=f"{tag}{n}".encode())]
        await world.log.append(target, events, messages=messages if outbox else ())
        print(n, file=out, flush=True)
        n += 1


async def _stream(world: LocalWorld, target: str, out: TextIO, tag: str) -> None:
    n = 0
    while True:
        await world.stream.write(target, [f"{tag}{n}/{i}".encode() for i in range(BATCH)])
        print(n, file=out, flush=True)
        n += 1


async def _claim(world: LocalWorld, target: str, out: TextIO, lease: float) -> None:
    while True:
        for held in await world.queue.claim(target, "child", lease=lease, limit=3, wait=1.0):
            print("claimed", held.message_id, file=out, flush=True)
            await world.queue.ack(held)
            print("acked", held.message_id, file=out, flush=True)


async def _churn(world: LocalWorld, target: str, out: TextIO, count: int, lease: float) -> None:
    for i in range(count):
        # Big payloads, so the queue file is compacted (renamed over) often while others wait.
        message_id = await world.queue.enqueue(target, b"x" * 100_000 + b"%d" % i)
        print("enqueued", message_id, file=out, flush=True)
        for held in await world.queue.claim(target, "churn", lease=lease, limit=2):
            await world.queue.ack(held)
            print("acked", held.message_id, file=out, flush=True)


async def _drain(world: LocalWorld, target: str, out: TextIO) -> None:
    while leases := await world.queue.claim(target, "drain", lease=60, limit=2, wait=0.5):
        for held in leases:
            await world.queue.ack(held)
            print("acked", held.message_id, file=out, flush=True)


async def _hold(world: LocalWorld, target: str, out: TextIO, lease: float) -> None:
    (held,) = await world.queue.claim(target, "holder", lease=lease, wait=20)
    print("claimed", held.message_id, held.attempt, file=out, flush=True)


async def _watch(world: LocalWorld, target: str, out: TextIO, count: int) -> None:
    print("ready", file=out, flush=True)
    seen = 0
    async for event in world.log.watch(target):
        print(event.data.decode(), file=out, flush=True)
        seen += 1
        if seen == count:
            return


async def main(mode: str, folder: str, namespace: str, target: str, out: TextIO, arg: str) -> None:
    async with await connect(url=folder, namespace=namespace) as world:
        if mode == "append":
            await _append(world, target, out, arg)
        elif mode == "outbox":
            await _append(world, target, out, arg, outbox=True)
        elif mode == "stream":
            await _stream(world, target, out, arg)
        elif mode == "claim":
            await _claim(world, target, out, float(arg))
        elif mode == "churn":
            count, lease = arg.split(":")
            await _churn(world, target, out, int(count), float(lease))
        elif mode == "drain":
            await _drain(world, target, out)
        elif mode == "hold":
            await _hold(world, target, out, float(arg))
        elif mode == "watch":
            await _watch(world, target, out, int(arg))
        else:
            raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    mode, folder, namespace, target, report, *rest = sys.argv[1:]
    with open(report, "a", encoding="utf-8") as out:
        anyio.run(main, mode, folder, namespace, target, out, rest[0] if rest else "")
