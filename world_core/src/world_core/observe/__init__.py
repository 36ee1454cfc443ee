"""The observe layer: what happened in a turn, and what is happening now.

The trace model (:mod:`world_core.observe._trace`) is read from the journal's logs and feeds
``world sessions``, ``world trace``, ``world tail`` and ``world ui``. Imports only the layers
below it (the journal, the SPI, the errors), through their public names.
"""

from world_core.journal import add_default_observer
from world_core.observe._events import MAX_QUEUED, PREVIEW_CHARS, LiveEvents, live_events
from world_core.observe._otel import TurnTracing, span_id_of, trace_id_of
from world_core.observe._sessions import SessionPage, SessionSummary, list_sessions
from world_core.observe._trace import (
    TRACE_FORMAT,
    RunTrace,
    SessionTrace,
    StepAttempt,
    StepStatus,
    StepTrace,
    Stop,
    TurnStatus,
    TurnTrace,
    Usage,
    build_trace,
    redact_content,
    step_id,
    trace_events,
    trace_session,
)

__all__ = [
    "MAX_QUEUED",
    "PREVIEW_CHARS",
    "LiveEvents",
    "live_events",
    "TurnTracing",
    "span_id_of",
    "trace_id_of",
    "TRACE_FORMAT",
    "RunTrace",
    "SessionPage",
    "SessionSummary",
    "SessionTrace",
    "StepAttempt",
    "StepStatus",
    "StepTrace",
    "Stop",
    "TurnStatus",
    "TurnTrace",
    "Usage",
    "build_trace",
    "list_sessions",
    "redact_content",
    "step_id",
    "trace_events",
    "trace_session",
]

add_default_observer(live_events)  # every Worker publishes its turns' live events
