"""The journal contracts on the local World, until the aggregate WorldContract carries them."""

from __future__ import annotations

from world_conformance.journal import JournalContract


class TestJournalOnLocal(JournalContract):
    world_name = "local"
