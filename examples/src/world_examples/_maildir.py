"""Reading the demo inbox's Maildir, without importing the SMTP server (worker processes do
this, and start faster without aiosmtpd)."""

from __future__ import annotations

import mailbox
from email import message_from_bytes
from email.message import Message
from pathlib import Path

__all__ = ["SESSION_HEADER", "read_maildir"]

SESSION_HEADER = "X-World-Session"
"""Header the example agent's emails carry, so one inbox can serve several sessions."""


def read_maildir(folder: Path, session_id: str | None = None) -> list[Message]:
    """The messages in a Maildir, oldest first by delivery name, filtered by session header."""
    box = mailbox.Maildir(folder, create=True)
    found: list[Message] = []
    for key in sorted(box.keys()):
        with box.get_file(key) as handle:
            message = message_from_bytes(handle.read())
        if session_id is None or message.get(SESSION_HEADER) == session_id:
            found.append(message)
    return found
