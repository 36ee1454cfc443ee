"""A child process of the multi-process tests: ``python turso_child.py COMMAND URL NS ...``.

Commands:
    append LOG TAG N     open (racing the other children at schema creation), then N appends
                         of 1 to 3 events keyed ``TAG:i:j``; prints {"done": N}.
    cas LOG TAG N        N appends with expect_tail = the tail just read, retrying on
                         ConflictError; prints {"done": N, "conflicts": c}.
    churn LOG STREAM     forever: one append of BATCH events of 4 KiB, then one stream write;
                         prints {"batch": i} after both returned (to be SIGKILLed).

``python turso_child.py lock PATH`` holds the file's write lock with a plain libsql connection
(BEGIN IMMEDIATE) from {"locked": true} until a line arrives on stdin, then commits.
"""

from __future__ import annotations

import json
import random
import sys

import anyio
import libsql

from world_core import ConflictError, NewEvent
from world_turso import connect

BATCH = 40
EVENT_BYTES = 4096


def say(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def churn_event(batch: int, index: int) -> bytes:
    head = f"{batch}:{index}:".encode()
    return head + b"x" * (EVENT_BYTES - len(head))


async def main(argv: list[str]) -> None:
    command, url, namespace, *rest = argv
    async with await connect(url=url, namespace=namespace) as world:
        if command == "append":
            log, tag, count = rest[0], rest[1], int(rest[2])
            for i in range(count):
                size = random.randint(1, 3)
                events = [
                    NewEvent(data=f"{tag}:{i}:{j}".encode(), key=f"{tag}:{i}:{j}")
                    for j in range(size)
                ]
                await world.log.append(log, events)
            say(done=count)
        elif command == "cas":
            log, tag, count = rest[0], rest[1], int(rest[2])
            conflicts = 0
            for i in range(count):
                while True:
                    tail = await world.log.tail(log)
                    try:
                        await world.log.append(
                            log, [NewEvent(data=f"{tag}:{i}".encode())], expect_tail=tail
                        )
                        break
                    except ConflictError:
                        conflicts += 1
            say(done=count, conflicts=conflicts)
        elif command == "churn":
            log, stream = rest[0], rest[1]
            batch = 0
            while True:
                await world.log.append(
                    log, [NewEvent(data=churn_event(batch, j)) for j in range(BATCH)]
                )
                await world.stream.write(stream, [f"{batch}:{j}".encode() for j in range(5)])
                say(batch=batch)
                batch += 1
        else:
            raise SystemExit(f"unknown command {command!r}")


def hold_lock(path: str) -> None:
    raw = libsql.connect(path, isolation_level=None, timeout=0.0)
    raw.execute("BEGIN IMMEDIATE").fetchall()
    say(locked=True)
    sys.stdin.readline()
    raw.execute("COMMIT").fetchall()
    raw.close()


if __name__ == "__main__":
    if sys.argv[1] == "lock":
        hold_lock(sys.argv[2])
    else:
        anyio.run(main, sys.argv[1:])
