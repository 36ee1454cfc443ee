"""The journal layer: the durable step journal, tools, model clients, the agent loop, the
worker that runs turns and the client that submits them, and content-addressed blobs.

Imports only the layer below (``world_core.spi``, ``world_core.errors``); the workspace,
observers and adapters build on its public names.
"""

from world_core.journal._agent import Agent
from world_core.journal._blobs import BlobRef, Blobs
from world_core.journal._client import DEFAULT_QUEUE, Client, TurnStatus
from world_core.journal._crash import CrashPoint, SimulatedCrash, parse_crash_at
from world_core.journal._history import (
    HISTORY_FORMAT,
    SessionHistory,
    dump_history,
    history_document,
    load_history_file,
    parse_history,
    read_histories,
    read_history,
    write_history,
)
from world_core.journal._journal import (
    CLOCK_MARGIN,
    DEFAULT_BLOB_THRESHOLD,
    MAX_TURN_ID_BYTES,
    POSSIBLY_RAN,
    Journal,
    PastTurn,
    canonical_json,
    digest_of,
    read_state,
    session_log_id,
    write_state,
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
from world_core.journal._order import hand_on
from world_core.journal._replay import (
    HistoryEnds,
    ReplayReport,
    SessionCheck,
    TurnCheck,
    format_report,
    replay_check,
)
from world_core.journal._session import session_chain
from world_core.journal._tools import (
    DEFAULT_TOOL_TIMEOUT,
    MAX_IDEMPOTENCY_KEY_BYTES,
    Replay,
    Tool,
    ToolContext,
    ToolRegistry,
    idempotency_key,
    tool,
)
from world_core.journal._waits import (
    ChildResult,
    PendingApproval,
    Signal,
    TurnSuspended,
    sign_signal,
)
from world_core.journal._worker import TurnAgent, TurnResult, Worker

__all__ = [
    "CLOCK_MARGIN",
    "DEFAULT_BLOB_THRESHOLD",
    "DEFAULT_TOOL_TIMEOUT",
    "MAX_IDEMPOTENCY_KEY_BYTES",
    "MAX_TURN_ID_BYTES",
    "DEFAULT_QUEUE",
    "HISTORY_FORMAT",
    "POSSIBLY_RAN",
    "Agent",
    "BlobRef",
    "ChildResult",
    "Blobs",
    "Client",
    "CrashPoint",
    "HistoryEnds",
    "Journal",
    "Message",
    "ModelClient",
    "PastTurn",
    "ModelReply",
    "ModelRequest",
    "OpenAIChatModel",
    "PendingApproval",
    "Replay",
    "ReplayReport",
    "ScriptedModel",
    "SessionCheck",
    "SessionHistory",
    "Signal",
    "SimulatedCrash",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolRegistry",
    "TurnCheck",
    "TurnAgent",
    "TurnResult",
    "TurnSuspended",
    "TurnStatus",
    "Worker",
    "canonical_json",
    "digest_of",
    "dump_history",
    "format_report",
    "hand_on",
    "history_document",
    "idempotency_key",
    "load_history_file",
    "parse_crash_at",
    "parse_history",
    "read_histories",
    "read_history",
    "read_state",
    "replay_check",
    "session_chain",
    "session_log_id",
    "sign_signal",
    "tool",
    "write_history",
    "write_state",
]
