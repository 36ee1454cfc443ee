"""Key names. Every identifier is hex-encoded inside the hash tag, so no identifier can contain
``{``, ``}`` or ``:`` as far as Redis is concerned, collide with another identifier's keys or
reach outside its namespace; all keys of one log, queue or stream share one cluster slot."""

from __future__ import annotations

__all__ = ["Keys"]

QUEUE_SUFFIXES = ("v", "l", "z", "p", "s", "dk", "dd", "n", "g", "r")


class Keys:
    """Key names of one namespace: ``world:<namespace>:...``."""

    def __init__(self, namespace: str) -> None:
        self.prefix = f"world:{namespace}:"
        self.pattern = f"{self.prefix}*"
        self.registry = f"{self.prefix}logs"
        self.status_index = f"{self.prefix}logstatus"

    def _tag(self, kind: str, ident: str) -> str:
        return f"{self.prefix}{kind}:{{{ident.encode('utf-8').hex()}}}:"

    def log(self, log_id: str) -> tuple[str, str, str]:
        """Events stream, key -> seq hash, meta hash."""
        base = self._tag("log", log_id)
        return base + "x", base + "k", base + "m"

    def queue(self, queue: str) -> list[str]:
        """The ten keys of a queue, in the order ``qk`` in the Lua expects."""
        base = self._tag("q", queue)
        return [base + suffix for suffix in QUEUE_SUFFIXES]

    def queue_signal(self, queue: str) -> str:
        return self._tag("q", queue) + "g"

    def stream(self, stream_id: str) -> tuple[str, str]:
        """Chunks stream, meta hash."""
        base = self._tag("s", stream_id)
        return base + "x", base + "m"
