"""Small helpers the contracts share: bounded waits, iterator draining, fresh namespaces."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import anyio

__all__ = ["WAIT", "aclose", "drain", "eventually", "fresh_namespace", "take"]

T = TypeVar("T")

WAIT = 20.0
"""Upper bound, in seconds, of any single wait in the suite. A bound, never an expectation:
a healthy backend answers in milliseconds; this only keeps a broken one from hanging the run."""


def fresh_namespace() -> str:
    """A namespace no other test (of this run or a concurrent one on the same server) uses."""
    return f"wc_{secrets.token_hex(10)}"


async def aclose(iterator: AsyncIterator[object]) -> None:
    """Close an async iterator that has the async-generator ``aclose`` (watch and read do)."""
    closer = getattr(iterator, "aclose", None)
    if closer is not None:
        await closer()


async def take(iterator: AsyncIterator[T], count: int, *, bound: float = WAIT) -> list[T]:
    """The next ``count`` items of ``iterator`` (fewer only if it ends), then close it.

    Fails the test when they do not arrive within ``bound`` seconds.
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
            f"only {len(items)} of {count} items arrived within {bound} s: {items!r}"
        ) from exc
    finally:
        await aclose(iterator)
    return items


async def drain(iterator: AsyncIterator[T], *, bound: float = WAIT) -> list[T]:
    """Every item of an iterator that must end (a closed stream's reader)."""
    items: list[T] = []
    try:
        with anyio.fail_after(bound):
            async for item in iterator:
                items.append(item)
    except TimeoutError as exc:
        raise AssertionError(
            f"the iterator did not end within {bound} s after {len(items)} items"
        ) from exc
    finally:
        await aclose(iterator)
    return items


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
