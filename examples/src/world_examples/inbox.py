"""A real SMTP test inbox on loopback: aiosmtpd, delivering into a Maildir.

Emails are counted here, at the receiving end, never by the agent that sends them.
"""

from __future__ import annotations

import mailbox
import socket
from email.message import Message
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from aiosmtpd.controller import Controller

from world_examples._maildir import SESSION_HEADER, read_maildir

__all__ = ["SESSION_HEADER", "Inbox", "read_maildir"]


class _Deliver:
    def __init__(self, folder: Path) -> None:
        self._folder = folder

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        content = envelope.original_content or envelope.content
        data = content if isinstance(content, bytes) else str(content).encode("utf-8")
        # Maildir delivery is a write to tmp/ then a rename into new/: readers never see half.
        mailbox.Maildir(self._folder, create=True).add(data)
        return "250 Message accepted for delivery"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Inbox:
    """An SMTP server on 127.0.0.1 (a free port) storing every message in ``folder``.

    Use as a context manager; ``port`` is set once it runs.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        mailbox.Maildir(folder, create=True)
        self.port = _free_port()
        self._controller = Controller(_Deliver(folder), hostname="127.0.0.1", port=self.port)

    def __enter__(self) -> Self:
        self._controller.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._controller.stop()

    def messages(self, session_id: str | None = None) -> list[Message]:
        """Messages delivered so far (for one session, when given)."""
        return read_maildir(self.folder, session_id)
