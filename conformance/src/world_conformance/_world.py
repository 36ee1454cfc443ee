"""WorldContract: every contract area at once, what a backend's test class derives from."""

from __future__ import annotations

from world_conformance._isolation import IsolationContract
from world_conformance._lifecycle import LifecycleContract
from world_conformance._log import LogContract
from world_conformance._model import ModelContract
from world_conformance._outbox import OutboxContract
from world_conformance._payload import PayloadContract
from world_conformance._process import ProcessContract
from world_conformance._queue import QueueContract
from world_conformance._storage import StorageContract
from world_conformance._stream import StreamContract
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

__all__ = ["WorldContract"]


class WorldContract(
    LogContract,
    QueueContract,
    StreamContract,
    PayloadContract,
    IsolationContract,
    OutboxContract,
    LifecycleContract,
    StorageContract,
    ProcessContract,
    ModelContract,
    # Contracts of the layers above the SPI join here, one line each (JournalContract ...).
    JournalContract,
    JournalResilienceContract,
    JournalOrderContract,
    JournalTimerContract,
    JournalSignalContract,
    JournalVersioningContract,
    JournalChildContract,
    JournalHistoryContract,
    JournalDeleteContract,
    JournalShellContract,
    DocumentsContract,
    WorkspaceContract,
    ObserveContract,
):
    """Every contract of the World SPI; a backend's test class derives from it and sets
    ``world_name`` (see ``ContractBase`` for ``known_gaps`` and the ``world_url`` override,
    and ``StorageContract`` for the ``world_storage`` probe it should provide)."""
