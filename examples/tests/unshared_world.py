"""A World that declares it cannot be shared by several processes (for ``world demo``'s check).

The real local World underneath, with ``capabilities.shared`` set to False. Open it with
``--world unshared_world:connect`` and this folder on ``PYTHONPATH``.
"""

from __future__ import annotations

from collections.abc import Mapping

import world_local
from world_core import Capabilities, World


class UnsharedWorld(World):
    """The local World, declaring ``shared=False``."""

    def __init__(self, inner: World) -> None:
        self.inner = inner
        self.name = "unshared"
        self.namespace = inner.namespace
        self.log = inner.log
        self.queue = inner.queue
        self.stream = inner.stream

    @property
    def capabilities(self) -> Capabilities:
        return self.inner.capabilities.model_copy(update={"shared": False})

    def settings(self) -> Mapping[str, str]:
        return self.inner.settings()

    async def purge(self) -> None:
        await self.inner.purge()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def connect(*, url: str | None = None, namespace: str = "default") -> World:
    """Open the local World at ``url`` as an unshared one."""
    return UnsharedWorld(await world_local.connect(url=url, namespace=namespace))
