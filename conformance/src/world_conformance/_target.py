"""WorldTarget: everything needed to open the World under test again, here or in a child."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

from world_conformance._support import fresh_namespace
from world_core import World, open_world

__all__ = ["WorldTarget"]


@dataclass(frozen=True)
class WorldTarget:
    """The World under test: its name (entry point, distribution or ``module:attr``), its URL
    and the namespace of the current test.

    The ``world`` fixture is ``target.open()`` purged afterwards; tests use the target to open
    a second connection to the same namespace, a sibling namespace, or a child process.
    """

    name: str
    url: str | None
    namespace: str

    @asynccontextmanager
    async def open(self) -> AsyncIterator[World]:
        """Open another World on this target's namespace; closed (not purged) on exit."""
        async with open_world(self.name, url=self.url, namespace=self.namespace) as world:
            yield world

    @asynccontextmanager
    async def scratch(self) -> AsyncIterator[World]:
        """Open this target's namespace and purge it on exit (for namespaces a test made)."""
        async with self.open() as world:
            try:
                yield world
            finally:
                await world.purge()

    def sibling(self) -> WorldTarget:
        """The same World and server under a fresh namespace of its own."""
        return replace(self, namespace=fresh_namespace())

    def child_command(self, *args: str) -> list[str]:
        """argv of a child process that opens this target and runs a ``_child`` command."""
        argv = [sys.executable, "-m", "world_conformance._child", "--world", self.name]
        if self.url is not None:
            argv += ["--url", self.url]
        return [*argv, "--namespace", self.namespace, *args]
