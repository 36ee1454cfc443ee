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
from world_core.journal._agent import Agent
from world_core.journal._blobs import BlobRef, Blobs
from world_core.journal._client import DEFAULT_QUEUE, Client
from world_core.journal._crash import CrashPoint, parse_crash_at
from world_core.journal._journal import (
    DEFAULT_BLOB_THRESHOLD,
    POSSIBLY_RAN,
    Journal,
    canonical_json,
    digest_of,
    session_log_id,
)
from world_core.journal._model import (
    Message,
    ModelClient,
    ModelReply,
    ModelRequest,
    OpenAIChatModel,
    ScriptedModel,
    ToolCall,
)
from world_core.journal._tools import Replay, Tool, ToolContext, ToolRegistry, tool
from world_core.journal._worker import TurnResult, Worker
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
from world_core.workspace._documents import DocumentEdits, Documents

__all__ = [
    "DEFAULT_BLOB_THRESHOLD",
    "DEFAULT_QUEUE",
    "ENTRY_POINT_GROUP",
    "POSSIBLY_RAN",
    "Agent",
    "BlobRef",
    "Blobs",
    "Client",
    "CrashPoint",
    "DocumentEdits",
    "Documents",
    "Journal",
    "Message",
    "ModelClient",
    "ModelReply",
    "ModelRequest",
    "OpenAIChatModel",
    "Replay",
    "ScriptedModel",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolRegistry",
    "TurnResult",
    "Worker",
    "canonical_json",
    "digest_of",
    "parse_crash_at",
    "session_log_id",
    "tool",
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
