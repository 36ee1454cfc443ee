"""Queue and stream measurements shared by the embedded backends' benchmarks."""

from __future__ import annotations

import time

import anyio

from world_core import World


async def write_to_read(writer: World, reader: World, stream: str, count: int) -> list[float]:
    """Seconds from the start of each ``Stream.write`` of one 4-byte chunk on ``writer`` to
    ``reader`` yielding it, one chunk at a time (the next is written once the last arrived).
    Bounded: two minutes in all."""
    times: list[float] = []
    arrived = anyio.Event()
    sent_at = 0.0

    async def read() -> None:
        nonlocal arrived
        async for chunk in reader.stream.read(stream):
            times.append(time.perf_counter() - sent_at)
            arrived.set()
            if chunk.index + 1 == count:
                return

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            for i in range(count):
                arrived = anyio.Event()
                sent_at = time.perf_counter()
                await writer.stream.write(stream, [i.to_bytes(4, "big")])
                await arrived.wait()
    return times


async def drain(world: World, queue: str, messages: int, workers: int) -> float:
    """Enqueue ``messages`` to ``queue``, then the seconds ``workers`` tasks take to claim
    and ack them all. Bounded: two minutes for the draining."""
    for i in range(messages):
        await world.queue.enqueue(queue, i.to_bytes(4, "big"))
    done = 0

    async def worker(name: str) -> None:
        nonlocal done
        while leases := await world.queue.claim(queue, name, lease=60):
            for lease in leases:
                await world.queue.ack(lease)
                done += 1

    start = time.perf_counter()
    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for n in range(workers):
                tg.start_soon(worker, f"w{n}")
    elapsed = time.perf_counter() - start
    if done != messages:
        raise RuntimeError(f"the queue run processed {done} of {messages} messages")
    return elapsed
