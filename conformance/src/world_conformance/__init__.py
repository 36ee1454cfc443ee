"""world-conformance: the contract every World backend passes, as a pytest plugin.

A backend's conformance file is about ten lines::

    from world_conformance import WorldContract

    class TestPostgresWorld(WorldContract):
        world_name = "postgres"

The plugin (``world_conformance.plugin``, loaded by pytest through its ``pytest11`` entry
point) finds a server, opens a fresh namespace per test and reports results per contract
area. Run the suite against any installed World with
``pytest --pyargs world_conformance --world NAME [--world-url URL]``. See README.md.

Names are imported on first use, so that the child processes of the process contracts
(``python -m world_conformance._child``) start without importing pytest or Hypothesis.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from world_conformance._base import ContractBase
    from world_conformance._isolation import (
        BAD_IDENTIFIERS,
        ODD_IDENTIFIERS,
        IsolationContract,
    )
    from world_conformance._lifecycle import LifecycleContract
    from world_conformance._log import LogContract
    from world_conformance._model import ModelContract, world_state_machine
    from world_conformance._outbox import OutboxContract
    from world_conformance._payload import PAYLOADS, PayloadContract
    from world_conformance._process import ProcessContract
    from world_conformance._queue import QueueContract
    from world_conformance._storage import StorageContract, StorageProbe
    from world_conformance._stream import StreamContract
    from world_conformance._target import WorldTarget
    from world_conformance._world import WorldContract
    from world_conformance.documents import DocumentsContract
    from world_conformance.journal import JournalContract
    from world_conformance.journal_delete import JournalDeleteContract
    from world_conformance.journal_history import JournalHistoryContract
    from world_conformance.journal_order import JournalOrderContract
    from world_conformance.journal_resilience import JournalResilienceContract
    from world_conformance.journal_shell import JournalShellContract
    from world_conformance.journal_waits import (
        JournalChildContract,
        JournalSignalContract,
        JournalTimerContract,
        JournalVersioningContract,
    )
    from world_conformance.observe import ObserveContract
    from world_conformance.workspace import WorkspaceContract

__all__ = [
    "BAD_IDENTIFIERS",
    "ODD_IDENTIFIERS",
    "PAYLOADS",
    "ContractBase",
    "DocumentsContract",
    "IsolationContract",
    "JournalChildContract",
    "JournalContract",
    "JournalDeleteContract",
    "JournalHistoryContract",
    "JournalOrderContract",
    "JournalResilienceContract",
    "JournalShellContract",
    "JournalSignalContract",
    "JournalTimerContract",
    "JournalVersioningContract",
    "LifecycleContract",
    "LogContract",
    "ModelContract",
    "ObserveContract",
    "OutboxContract",
    "PayloadContract",
    "ProcessContract",
    "QueueContract",
    "StorageContract",
    "StorageProbe",
    "StreamContract",
    "WorkspaceContract",
    "WorldContract",
    "WorldTarget",
    "world_state_machine",
]

_HOME = {
    "BAD_IDENTIFIERS": "_isolation",
    "ODD_IDENTIFIERS": "_isolation",
    "PAYLOADS": "_payload",
    "ContractBase": "_base",
    "DocumentsContract": "documents",
    "IsolationContract": "_isolation",
    "JournalChildContract": "journal_waits",
    "JournalContract": "journal",
    "JournalDeleteContract": "journal_delete",
    "JournalHistoryContract": "journal_history",
    "JournalOrderContract": "journal_order",
    "JournalResilienceContract": "journal_resilience",
    "JournalShellContract": "journal_shell",
    "JournalSignalContract": "journal_waits",
    "JournalTimerContract": "journal_waits",
    "JournalVersioningContract": "journal_waits",
    "LifecycleContract": "_lifecycle",
    "LogContract": "_log",
    "ModelContract": "_model",
    "ObserveContract": "observe",
    "OutboxContract": "_outbox",
    "PayloadContract": "_payload",
    "ProcessContract": "_process",
    "QueueContract": "_queue",
    "StorageContract": "_storage",
    "StorageProbe": "_storage",
    "StreamContract": "_stream",
    "WorkspaceContract": "workspace",
    "WorldContract": "_world",
    "WorldTarget": "_target",
    "world_state_machine": "_model",
}


def __getattr__(name: str) -> object:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'world_conformance' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"world_conformance.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
