"""Key names. Every identifier is hex-encoded inside the hash tag, so no identifier can contain
``{``, ``}`` or ``:`` as far as Redis is concerned, collide with another identifier's keys or
reach outside its namespace; all keys of one log, queue or stream share one cluster slot."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["Keys"]

QUEUE_SUFFIXES = ("v", "l", "z", "p", "s", "dk", "dd", "n", "g", "r")
_CACHE_SIZE = 4096

K = TypeVar("K")


def _cached(cache: dict[str, K], ident: str, make: Callable[[str], K]) -> K:
    # Hot identifiers (a worker's queue, a session's log) are encoded once; the cache is
    # simply dropped when full.
    found = cache.get(ident)
    if found is None:
        if len(cache) >= _CACHE_SIZE:
            cache.clear()
        found = cache[ident] = make(ident)
    return found


class Keys:
    """Key names of one namespace: ``world:<namespace>:...``."""

    def __init__(self, namespace: str) -> None:
        self.prefix = f"world:{namespace}:"
        self.pattern = f"{self.prefix}*"
        self.registry = f"{self.prefix}logs"
        self.status_index = f"{self.prefix}logstatus"
        self._logs: dict[str, tuple[str, str, str]] = {}
        self._queues: dict[str, tuple[str, ...]] = {}
        self._streams: dict[str, tuple[str, str]] = {}

    def _tag(self, kind: str, ident: str) -> str:
        return f"{self.prefix}{kind}:{{{ident.encode('utf-8').hex()}}}:"

    def log(self, log_id: str) -> tuple[str, str, str]:
        """Events stream, key -> seq hash, meta hash."""

        def make(ident: str) -> tuple[str, str, str]:
            base = self._tag("log", ident)
            return base + "x", base + "k", base + "m"

        return _cached(self._logs, log_id, make)

    def queue(self, queue: str) -> tuple[str, ...]:
        """The ten keys of a queue, in the order ``qk`` in the Lua expects."""

        def make(ident: str) -> tuple[str, ...]:
            base = self._tag("q", ident)
            return tuple(base + suffix for suffix in QUEUE_SUFFIXES)

        return _cached(self._queues, queue, make)

    def queue_signal(self, queue: str) -> str:
        return self.queue(queue)[QUEUE_SUFFIXES.index("g")]

    def stream(self, stream_id: str) -> tuple[str, str]:
        """Chunks stream, meta hash."""

        def make(ident: str) -> tuple[str, str]:
            base = self._tag("s", ident)
            return base + "x", base + "m"

        return _cached(self._streams, stream_id, make)
