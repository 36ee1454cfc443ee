"""world: crash-safe AI agents on a World of log, queue and stream.

Open the World that ``WORKFLOW_TARGET_WORLD`` selects (local files by default)::

    async with open_world() as world:
        await world.log.append("session-1", [NewEvent(data=b"hello")])
"""

from world_core._select import (
    ENTRY_POINT_GROUP,
    WorldEntry,
    connect_world,
    list_worlds,
    open_world,
    redact,
    resolve_world,
)
from world_core.errors import (
    BackendUnavailableError,
    ClosedError,
    ConfigurationError,
    ConflictError,
    DuplicateKeyError,
    InvalidArgumentError,
    InvalidIdentifierError,
    LeaseLostError,
    NonDeterminismError,
    NotFoundError,
    PayloadTooLargeError,
    UnsupportedError,
    WorldError,
)
from world_core.spi import (
    Capabilities,
    Chunk,
    DeadLetter,
    Event,
    Lease,
    LogInfo,
    NewEvent,
    OutboxMessage,
    Page,
    StreamInfo,
    World,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "BackendUnavailableError",
    "Capabilities",
    "Chunk",
    "ClosedError",
    "ConfigurationError",
    "ConflictError",
    "DeadLetter",
    "DuplicateKeyError",
    "Event",
    "InvalidArgumentError",
    "InvalidIdentifierError",
    "Lease",
    "LeaseLostError",
    "LogInfo",
    "NewEvent",
    "NonDeterminismError",
    "NotFoundError",
    "OutboxMessage",
    "Page",
    "PayloadTooLargeError",
    "StreamInfo",
    "UnsupportedError",
    "World",
    "WorldEntry",
    "WorldError",
    "connect_world",
    "list_worlds",
    "open_world",
    "redact",
    "resolve_world",
]
