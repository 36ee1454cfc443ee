"""Small helpers the contracts share: bounded waits, iterator draining, fresh namespaces.

Every helper that can fail says which guarantee was broken (its ``what``), so a failure reads
without the test's source: ``watch('w') before the log existed, woken by appends from other
tasks: only 3 of 7 items arrived within 20 s`` rather than a bare timeout.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

import anyio

if TYPE_CHECKING:
    from world_core import Lease, Worker, World

__all__ = [
    "WAIT",
    "aclose",
    "claim_one",
    "drain",
    "eventually",
    "fresh_namespace",
    "refusal_at_call",
    "run_until_done",
    "take",
    "within",
]

T = TypeVar("T")

WAIT = float(os.environ.get("WORLD_CONFORMANCE_WAIT", "") or 20.0)
"""Upper bound, in seconds, of any single wait in the suite. A bound, never an expectation:
a healthy backend answers in milliseconds; this only keeps a broken one from hanging the run.
``WORLD_CONFORMANCE_WAIT`` changes it (raise it for a distant server, lower it to see a
failing wait sooner)."""

_NO_ITEMS = "the iterator"


def fresh_namespace() -> str:
    """A namespace no other test (of this run or a concurrent one on the same server) uses."""
    return f"wc_{secrets.token_hex(10)}"


async def aclose(iterator: AsyncIterator[object]) -> None:
    """Close an async iterator that has the async-generator ``aclose`` (watch and read do)."""
    closer = getattr(iterator, "aclose", None)
    if closer is not None:
        await closer()


async def take(
    iterator: AsyncIterator[T], count: int, *, bound: float = WAIT, what: str = _NO_ITEMS
) -> list[T]:
    """The next ``count`` items of ``iterator`` (fewer only if it ends), then close it.

    Fails the test, naming ``what`` (the guarantee the items stand for), when they do not
    arrive within ``bound`` seconds, or when closing the iterator then hangs.
    """
    items: list[T] = []
    try:
        with anyio.fail_after(bound):
            while len(items) < count:
                try:
                    items.append(await anext(iterator))
                except StopAsyncIteration:
                    break
    except TimeoutError as exc:
        raise AssertionError(
            f"{what}: only {len(items)} of {count} items arrived within {bound} s "
            f"(never woken, or stuck): {_preview(items)}"
        ) from exc
    finally:
        await _bounded_close(iterator, what, bound)
    return items


async def drain(
    iterator: AsyncIterator[T], *, bound: float = WAIT, what: str = _NO_ITEMS
) -> list[T]:
    """Every item of an iterator that must end (a closed stream's reader)."""
    items: list[T] = []
    try:
        with anyio.fail_after(bound):
            async for item in iterator:
                items.append(item)
    except TimeoutError as exc:
        raise AssertionError(
            f"{what}: the iterator did not end within {bound} s after {len(items)} items "
            f"(a closed stream's reader must end): {_preview(items)}"
        ) from exc
    finally:
        await _bounded_close(iterator, what, bound)
    return items


async def _bounded_close(iterator: AsyncIterator[object], what: str, bound: float) -> None:
    with anyio.CancelScope(shield=True), anyio.move_on_after(bound) as scope:
        await aclose(iterator)
    if scope.cancelled_caught:
        raise AssertionError(f"{what}: closing the iterator (aclose) hung for {bound} s")


async def refusal_at_call(
    call: Callable[[], AsyncIterator[object]], error: type[Exception], what: str
) -> str | None:
    """Call a method that returns an async iterator (``Log.watch``, ``Stream.read``) in a way
    it must refuse: None when the call itself raised ``error``, before returning an iterator;
    otherwise what it did instead, starting with ``what`` (for a failure message).

    An ``async def`` generator runs none of its body until its first step, so its checks
    would only fail there (or never, for an iterator nobody iterates): the contract asks for
    a plain method that checks, then returns the iterator.
    """
    try:
        iterator = call()
    except error:
        return None
    except Exception as exc:
        return f"{what} raised {type(exc).__name__} instead of {error.__name__}: {exc}"
    later = "its first step did not raise it either"
    try:
        with anyio.fail_after(5):
            await anext(iterator)
    except error:
        later = f"it raised {error.__name__} only at its first step"
    except TimeoutError:
        later = "its first step waited instead"
    except Exception as exc:
        later = f"its first step raised {type(exc).__name__}: {exc}"
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(WAIT):
            await aclose(iterator)
    return (
        f"{what} returned an iterator instead of raising {error.__name__} when called ({later}); "
        "check the arguments and the World in a plain method, then return the async generator"
    )


def _preview(items: list[T]) -> str:
    text = repr(items)
    return text if len(text) <= 600 else f"{text[:600]}... ({len(items)} items)"


@contextmanager
def within(what: str, bound: float = WAIT * 3) -> Iterator[None]:
    """Bound a block (often a task group) and fail naming the guarantee, not a bare timeout.

    A single failure inside a task group is raised as itself rather than as a group of one.
    """
    try:
        with anyio.fail_after(bound):
            yield
    except TimeoutError as exc:
        raise AssertionError(f"{what}: not done within {bound} s") from exc
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if len(leaves) == 1 and isinstance(leaves[0], AssertionError):
            raise leaves[0] from group
        raise


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        found.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found


CLAIMABLE = "a message enqueued (or released, requeued) without delay is claimable at once"


async def claim_one(
    world: World, queue: str, worker: str, *, lease: float, what: str = CLAIMABLE
) -> Lease:
    """Claim exactly one message; fail naming the guarantee when there is none, or several."""
    leases = await world.queue.claim(queue, worker, lease=lease)
    if len(leases) != 1:
        found = "nothing" if not leases else f"{len(leases)} messages: {_preview(leases)}"
        raise AssertionError(
            f"{what}: Queue.claim({queue!r}, limit=1) by {worker!r} returned {found}, "
            "expected exactly one message"
        )
    return leases[0]


async def eventually(
    probe: Callable[[], Awaitable[T | None]], what: str, *, bound: float = WAIT
) -> T:
    """Call ``probe`` with growing pauses until it returns something other than None.

    Used where the contract promises a state "after a deadline" (lease expiry, delays) and no
    notification announces it. Fails the test, naming ``what``, after ``bound`` seconds.
    """
    pause = 0.02
    with anyio.move_on_after(bound):
        while True:
            result = await probe()
            if result is not None:
                return result
            await anyio.sleep(pause)
            pause = min(pause * 1.5, 0.25)
    raise AssertionError(f"{what}: not seen within {bound} s")


async def run_until_done(
    worker: Worker, turns: set[tuple[str, str]], *, within: float = WAIT * 3
) -> None:
    """Run ``worker``'s messages until each (session, turn) of ``turns`` is done; fails when
    no message comes for the ones left (one was deduplicated away, or never queued)."""
    waiting = set(turns)
    with anyio.fail_after(within):
        while waiting:
            found = await worker.run_once(wait=WAIT / 2)
            assert found is not None, (
                f"no message came for {sorted(waiting)}: a message of theirs was lost (another "
                "message with the same deduplication key, or none queued)"
            )
            if found.status == "done":
                waiting.discard((found.session_id, found.turn_id))
