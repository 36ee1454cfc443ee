"""A child process for the process contracts: opens a World by name, URL and namespace.

    python -m world_conformance._child --world NAME [--url URL] --namespace NS COMMAND ...

Commands (each prints ``{"ready": true}`` once the World is open, then waits for a line on
stdin before it starts, so that several children start together; then one JSON line per
acknowledged operation, flushed at once):

    append LOG --batches N --size S --tag T [--pad P]
        N batches of S events; event j of batch i holds ``T:i:j`` then P NUL bytes.
        Prints ``{"batch": i, "tail": t}`` after each append returned.
    claim QUEUE --worker W [--limit L]
        Claims with a long lease until the queue is empty, acking each message.
        Prints ``{"id": message_id, "payload": hex}`` after each ack returned.
    work QUEUE --worker W --lease SECONDS
        Claims one message at a time forever (until killed): prints ``{"claimed": id}`` once
        the claim returned, ``{"acked": id}`` once the ack returned.
    write STREAM --batches N --size S --tag T [--pad P]
        N writes of S chunks each, chunk j of write i holding ``T:i:j`` then P NUL bytes.
        Prints ``{"batch": i, "next": n}`` after each write returned.
    poke NAME
        One write per line read, until ``end`` or end of input: ``append`` appends one event
        to log NAME, ``enqueue`` enqueues one message on queue NAME, ``write`` writes one
        chunk to stream NAME (each holding the word). Prints ``{"done": word}`` after each
        returned.
    signal SESSION NAME PAYLOAD --sender S --id ID --queue Q --check SECONDS [--die-after-append]
        ``Client(queue=Q, signal_check=SECONDS).signal`` (PAYLOAD is JSON); prints ``{"sent":
        id}`` once it returned. With
        ``--die-after-append`` the process kills itself (SIGKILL) as soon as the signal's
        append returned, before the signal wakes anyone: a sender killed between its two
        writes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence

import anyio
import anyio.to_thread

from world_conformance.wrappers import PassThroughLog, PassThroughWorld
from world_core import Client, NewEvent, OutboxMessage, World, open_world

__all__ = ["event_data", "main"]


def event_data(tag: str, batch: int, index: int, pad: int = 0) -> bytes:
    """The data of event ``index`` of batch ``batch`` written by the child tagged ``tag``."""
    return f"{tag}:{batch}:{index}".encode() + b"\x00" * pad


def _say(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


async def _append(world: World, args: argparse.Namespace) -> None:
    for batch in range(args.batches):
        events = [NewEvent(data=event_data(args.tag, batch, i, args.pad)) for i in range(args.size)]
        tail = await world.log.append(args.log, events)
        _say(batch=batch, tail=tail)


async def _claim(world: World, args: argparse.Namespace) -> None:
    while True:
        leases = await world.queue.claim(args.queue, args.worker, lease=120.0, limit=args.limit)
        if not leases:
            return
        for lease in leases:
            await world.queue.ack(lease)
            _say(id=lease.message_id, payload=lease.payload.hex())


async def _work(world: World, args: argparse.Namespace) -> None:
    while True:
        for lease in await world.queue.claim(args.queue, args.worker, lease=args.lease, wait=0.5):
            _say(claimed=lease.message_id)
            await world.queue.ack(lease)
            _say(acked=lease.message_id)


async def _write(world: World, args: argparse.Namespace) -> None:
    for batch in range(args.batches):
        chunks = [event_data(args.tag, batch, i, args.pad) for i in range(args.size)]
        _say(batch=batch, next=await world.stream.write(args.stream, chunks))


async def _poke(world: World, args: argparse.Namespace) -> None:
    while True:
        word = (await anyio.to_thread.run_sync(sys.stdin.readline)).strip()
        if word in ("", "end"):
            return
        if word == "append":
            await world.log.append(args.name, [NewEvent(data=word.encode())])
        elif word == "enqueue":
            await world.queue.enqueue(args.name, word.encode())
        elif word == "write":
            await world.stream.write(args.name, [word.encode()])
        else:
            raise SystemExit(f"poke: unknown word {word!r}")
        _say(done=word)


class _DiesAfterSignal(PassThroughLog):
    """A log whose process is killed (SIGKILL) once a signal's append returned."""

    async def append(
        self,
        log_id: str,
        events: Sequence[NewEvent],
        *,
        expect_tail: int | None = None,
        status: str | None = None,
        messages: Sequence[OutboxMessage] = (),
    ) -> int:
        tail = await super().append(
            log_id, events, expect_tail=expect_tail, status=status, messages=messages
        )
        if any((event.key or "").startswith("signal/") for event in events):
            os.kill(os.getpid(), signal.SIGKILL)
        return tail


async def _signal(world: World, args: argparse.Namespace) -> None:
    if args.die_after_append:
        world = PassThroughWorld(world, log=_DiesAfterSignal(world.log))
    client = Client(world, queue=args.queue, signal_check=args.check)
    sent = await client.signal(
        args.session, args.name, json.loads(args.payload), sender=args.sender, signal_id=args.id
    )
    _say(sent=sent)


_COMMANDS = {
    "append": _append,
    "claim": _claim,
    "work": _work,
    "write": _write,
    "poke": _poke,
    "signal": _signal,
}


async def _run(args: argparse.Namespace) -> None:
    async with open_world(args.world, url=args.url, namespace=args.namespace) as world:
        _say(ready=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        await _COMMANDS[args.command](world, args)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m world_conformance._child")
    parser.add_argument("--world", required=True)
    parser.add_argument("--url", default=None)
    parser.add_argument("--namespace", required=True)
    commands = parser.add_subparsers(dest="command", required=True)
    append = commands.add_parser("append")
    append.add_argument("log")
    append.add_argument("--batches", type=int, required=True)
    append.add_argument("--size", type=int, required=True)
    append.add_argument("--tag", required=True)
    append.add_argument("--pad", type=int, default=0)
    claim = commands.add_parser("claim")
    claim.add_argument("queue")
    claim.add_argument("--worker", required=True)
    claim.add_argument("--limit", type=int, default=1)
    work = commands.add_parser("work")
    work.add_argument("queue")
    work.add_argument("--worker", required=True)
    work.add_argument("--lease", type=float, required=True)
    write = commands.add_parser("write")
    write.add_argument("stream")
    write.add_argument("--batches", type=int, required=True)
    write.add_argument("--size", type=int, required=True)
    write.add_argument("--tag", required=True)
    write.add_argument("--pad", type=int, default=0)
    send = commands.add_parser("signal")
    send.add_argument("session")
    send.add_argument("name")
    send.add_argument("payload")
    send.add_argument("--sender", required=True)
    send.add_argument("--id", required=True)
    send.add_argument("--queue", required=True)
    send.add_argument("--check", type=float, required=True)
    send.add_argument("--die-after-append", action="store_true")
    poke = commands.add_parser("poke")
    poke.add_argument("name")
    anyio.run(_run, parser.parse_args(argv))


if __name__ == "__main__":
    main()
