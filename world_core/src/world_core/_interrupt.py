"""Running a command's coroutine so that Ctrl-C always stops it.

``anyio.run`` on asyncio turns SIGINT into one cancellation of the main task (asyncio's
runner calls ``Task.cancel()`` once). That request is edge-triggered: code that catches the
cancellation (a careless ``except``), or a cancel scope that takes it for its own (its deadline
firing in the same turn of the event loop can overwrite the request's message), ends it, and
the command runs on as if Ctrl-C never came. CI under load saw exactly that once (a waiting
``world worker --once`` ran out its whole wait; ``world demo`` finished with status 0), though
which of these ways it took was not reproduced. Here SIGINT cancels the command's cancel scope
instead, which stays cancelled (every later await raises again) until the command has
unwound, and KeyboardInterrupt is raised after it.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

__all__ = ["run_command"]

T = TypeVar("T")


def run_command(fn: Callable[..., Awaitable[T]], *args: object) -> T:
    """``anyio.run(fn, *args)``; Ctrl-C (SIGINT) cancels it and raises KeyboardInterrupt once
    it has unwound (whatever it raised meanwhile). Code inside that installs its own SIGINT
    receiver (``Worker.run``) takes the signal over while it runs."""
    if threading.current_thread() is not threading.main_thread():
        return anyio.run(fn, *args)  # signal handlers can only be set in the main thread

    async def main() -> T:
        interrupted = False
        scope = anyio.CancelScope()

        def on_interrupt() -> None:  # called by the event loop, in its thread
            nonlocal interrupted
            interrupted = True
            scope.cancel()

        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, on_interrupt)
        try:
            with scope:
                result = await fn(*args)
        except BaseException:
            if interrupted:
                raise KeyboardInterrupt from None
            raise
        finally:
            loop.remove_signal_handler(signal.SIGINT)
        if interrupted:
            raise KeyboardInterrupt
        return result

    return anyio.run(main)
