"""The journal layer: the durable step journal, tools, model clients, the agent loop, the
worker that runs turns and the client that submits them, and content-addressed blobs.

Imports only the layer below (``world_core.spi``, ``world_core.errors``); the workspace,
observers and adapters build on its public names.
"""

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

__all__ = [
    "DEFAULT_BLOB_THRESHOLD",
    "DEFAULT_QUEUE",
    "POSSIBLY_RAN",
    "Agent",
    "BlobRef",
    "Blobs",
    "Client",
    "CrashPoint",
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
]
