"""OpenTelemetry spans of turns, following the GenAI semantic conventions, with ids derived
from journal positions.

One trace per turn: its trace id is derived from (session, turn), the root span
``invoke_agent {agent}`` from (session, turn), and the span of each step (``chat {model}`` for a
model call, ``execute_tool {tool}`` for a tool call) from (session, turn, step). So a turn that
resumes on another worker after a crash continues the same trace, and a step gets exactly one
span, exported by the run that made its outcome durable:

* a step read back from the journal (replayed) emits nothing;
* a step whose outcome was deferred (a ``safe`` tool) is exported once the write that carries
  it lands; a crash before that loses it, the next run runs the step again and exports it then;
* a step interrupted by a crash has no span (its run died); the run that finishes it exports it;
* the root span is exported by the run that ends the turn (reply or failure), starting when
  that run started.

Attributes: ``gen_ai.operation.name`` (``invoke_agent``, ``chat``, ``execute_tool``),
``gen_ai.agent.name``, ``gen_ai.conversation.id`` (the session), ``gen_ai.request.model``,
``gen_ai.usage.input_tokens`` / ``output_tokens`` (when the model reports usage),
``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``gen_ai.tool.type``, ``error.type``; and
``world.*`` ones (session, turn, step, worker, attempt, replay label, idempotency key). Content
(prompts and replies: ``gen_ai.input.messages`` / ``gen_ai.output.messages``; tool arguments and
results: ``gen_ai.tool.call.arguments`` / ``gen_ai.tool.call.result``) is recorded only with
``capture_content=True``.

Nothing imports ``opentelemetry`` until a :class:`TurnTracing` is made (install the ``otel``
extra: ``world-core[otel]``).
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from world_core.errors import ConfigurationError, InvalidArgumentError
from world_core.journal import RunEnd, StepInfo, TurnObserver, TurnRun
from world_core.spi import World

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = ["TurnTracing", "span_id_of", "trace_id_of"]

_CONTENT_CHARS = 16_000  # the longest content attribute (captured content is cut there)


def _derive(*parts: str, bits: int) -> int:
    seed = "\x00".join(("world", *parts)).encode("utf-8", "surrogatepass")
    value = int.from_bytes(hashlib.sha256(seed).digest()[: bits // 8], "big")
    return value or 1  # all zeros is an invalid id


def trace_id_of(session_id: str, turn_id: str) -> int:
    """The trace id of a turn (128 bits of sha-256 of its session and turn ids)."""
    return _derive("trace", session_id, turn_id, bits=128)


def span_id_of(session_id: str, turn_id: str, step: int | None = None) -> int:
    """The span id of a turn's root span (``step=None``) or of its step ``step`` (64 bits of
    sha-256 of the session, turn and step)."""
    return _derive("span", session_id, turn_id, "root" if step is None else str(step), bits=64)


class TurnTracing:
    """Exports OpenTelemetry spans of the turns workers run; an observer factory.

    Pass it to a worker with the default observers::

        tracing = TurnTracing(exporter=OTLPSpanExporter(endpoint="http://localhost:4318/v1/traces"))
        worker = Worker(world, agent, observers=[*default_observers(), tracing])

    It keeps its own SDK ``TracerProvider`` (whose ids come from the journal positions, see the
    module docstring); spans go to ``processor``, or to a ``BatchSpanProcessor`` of
    ``exporter``. Call :meth:`shutdown` before the process exits to flush them.

    Args:
        exporter: where spans go (batched); give this or ``processor``.
        processor: a span processor (``SimpleSpanProcessor(InMemorySpanExporter())`` in tests).
        resource: the SDK resource (default: ``service.name=world``).
        agent_name: ``gen_ai.agent.name`` and the root span's name (``invoke_agent {name}``).
        capture_content: record prompts, replies, tool arguments and results (off by default:
            they may hold personal data and secrets).

    Raises:
        ConfigurationError: the OpenTelemetry SDK is not installed (``world-core[otel]``).
        InvalidArgumentError: neither or both of ``exporter`` and ``processor``, or an empty
            ``agent_name``.
    """

    def __init__(
        self,
        *,
        exporter: SpanExporter | None = None,
        processor: SpanProcessor | None = None,
        resource: Resource | None = None,
        agent_name: str = "agent",
        capture_content: bool = False,
    ) -> None:
        if (exporter is None) == (processor is None):
            raise InvalidArgumentError(
                "TurnTracing needs exactly one of exporter= (an OpenTelemetry SpanExporter, "
                "e.g. OTLPSpanExporter()) and processor= (a SpanProcessor)"
            )
        if not isinstance(agent_name, str) or not agent_name:
            raise InvalidArgumentError(f"agent_name must be a non-empty str, got {agent_name!r}")
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.trace.id_generator import IdGenerator
        except ImportError as exc:  # pragma: no cover - the extra is installed in this repo
            raise ConfigurationError(
                "TurnTracing needs the OpenTelemetry SDK: install world-core[otel] "
                f"(opentelemetry-api and opentelemetry-sdk); {exc}"
            ) from exc

        class DerivedIds(IdGenerator):
            """Hands out the id set just before a span starts (journal-derived), else random."""

            def __init__(self) -> None:
                self.local = threading.local()

            def generate_span_id(self) -> int:
                value = getattr(self.local, "span", None)
                self.local.span = None
                return int(value) if value is not None else random.getrandbits(64) or 1

            def generate_trace_id(self) -> int:
                value = getattr(self.local, "trace", None)
                self.local.trace = None
                return int(value) if value is not None else random.getrandbits(128) or 1

        self._ids = DerivedIds()
        self.provider: TracerProvider = TracerProvider(
            resource=resource
            if resource is not None
            else Resource.create({"service.name": "world"}),
            id_generator=self._ids,
        )
        if processor is None:
            assert exporter is not None
            processor = BatchSpanProcessor(exporter)
        self.provider.add_span_processor(processor)
        self._tracer = self.provider.get_tracer("world_core.observe")
        self.agent_name = agent_name
        self.capture_content = bool(capture_content)

    def __call__(self, world: World, run: TurnRun) -> TurnObserver:
        """The observer of one run (the factory the worker calls)."""
        return _TracedRun(self, run)

    def shutdown(self) -> None:
        """Flush every span and stop exporting."""
        self.provider.shutdown()

    def _emit(self, span: _Span, run: TurnRun) -> None:
        from opentelemetry import trace
        from opentelemetry.context import Context
        from opentelemetry.trace import SpanKind, Status, StatusCode, TraceFlags

        trace_id = trace_id_of(run.session_id, run.turn_id)
        root = span_id_of(run.session_id, run.turn_id)
        if span.step is None:
            context = Context()  # a root, whatever span the app has open
            self._ids.local.trace = trace_id
            self._ids.local.span = root
        else:
            parent = trace.SpanContext(
                trace_id, root, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED)
            )
            context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
            self._ids.local.span = span_id_of(run.session_id, run.turn_id, span.step)
        kind = SpanKind.CLIENT if span.operation == "chat" else SpanKind.INTERNAL
        started = self._tracer.start_span(
            span.name,
            context=context,
            kind=kind,
            attributes=span.attributes,
            start_time=span.start,
        )
        if span.error is not None:
            started.set_status(Status(StatusCode.ERROR, span.error[:500]))
        started.end(end_time=span.end)


@dataclass
class _Span:
    name: str
    operation: str
    step: int | None
    start: int
    end: int
    attributes: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


class _TracedRun(TurnObserver):
    """One run's spans: kept from a step's start, exported once its outcome is durable."""

    def __init__(self, tracing: TurnTracing, run: TurnRun) -> None:
        self._tracing = tracing
        self._run = run
        self._start = time.time_ns()
        self._started: dict[int, int] = {}
        self._pending: dict[int, _Span] = {}

    def _base(self) -> dict[str, Any]:
        run = self._run
        return {
            "gen_ai.conversation.id": run.session_id,
            "world.session.id": run.session_id,
            "world.turn.id": run.turn_id,
            "world.worker": run.worker,
            "world.attempt": run.attempt,
        }

    def step_started(self, step: StepInfo) -> None:
        if step.kind in ("model", "tool"):
            self._started[step.step] = time.time_ns()

    def step_finished(
        self, step: StepInfo, result: Mapping[str, Any], state: Mapping[str, Any], recorded: bool
    ) -> None:
        start = self._started.pop(step.step, None)
        if start is None:
            return
        span = self._span(step, result, start)
        if recorded:
            self._tracing._emit(span, self._run)
        else:
            self._pending[step.step] = span

    def steps_recorded(self, steps: Sequence[int]) -> None:
        for n in steps:
            span = self._pending.pop(n, None)
            if span is not None:
                self._tracing._emit(span, self._run)

    def run_ended(self, end: RunEnd) -> None:
        if end.status not in ("done", "failed"):
            self._pending.clear()  # not durable: the run that records them exports them
            return
        # done: the reply's append carried them; failed: the turn is over, they ran once.
        for n in sorted(self._pending):
            self._tracing._emit(self._pending[n], self._run)
        self._pending.clear()
        attributes = self._base()
        attributes["gen_ai.operation.name"] = "invoke_agent"
        attributes["gen_ai.agent.name"] = self._tracing.agent_name
        root = _Span(
            name=f"invoke_agent {self._tracing.agent_name}",
            operation="invoke_agent",
            step=None,
            start=self._start,
            end=time.time_ns(),
            attributes=attributes,
        )
        if end.status == "failed":
            root.error = end.error or "failed"
            root.attributes["error.type"] = (end.error or "Error").split(":", 1)[0]
        if self._tracing.capture_content and end.reply is not None:
            root.attributes["gen_ai.output.messages"] = _content(
                [{"role": "assistant", "parts": [{"type": "text", "content": end.reply}]}]
            )
        self._tracing._emit(root, self._run)

    def _span(self, step: StepInfo, result: Mapping[str, Any], start: int) -> _Span:
        attributes = self._base()
        attributes["world.step"] = step.step
        capture = self._tracing.capture_content
        output = result.get("output")
        error = result.get("error")
        if step.kind == "model":
            model = step.model or "unknown"
            attributes["gen_ai.operation.name"] = "chat"
            attributes["gen_ai.request.model"] = model
            usage = output.get("usage") if isinstance(output, dict) else None
            if isinstance(usage, dict):
                tokens_in = usage.get("prompt_tokens", usage.get("input_tokens"))
                tokens_out = usage.get("completion_tokens", usage.get("output_tokens"))
                if isinstance(tokens_in, int):
                    attributes["gen_ai.usage.input_tokens"] = tokens_in
                if isinstance(tokens_out, int):
                    attributes["gen_ai.usage.output_tokens"] = tokens_out
            if capture and isinstance(step.input, dict):
                attributes["gen_ai.input.messages"] = _content(step.input.get("messages"))
            if capture and isinstance(output, dict):
                attributes["gen_ai.output.messages"] = _content([output])
            name, operation = f"chat {model}", "chat"
        else:
            attributes["gen_ai.operation.name"] = "execute_tool"
            attributes["gen_ai.tool.name"] = step.name
            attributes["gen_ai.tool.type"] = "function"
            if step.call_id is not None:
                attributes["gen_ai.tool.call.id"] = step.call_id
            if step.replay is not None:
                attributes["world.replay"] = step.replay
            if step.key is not None:
                attributes["world.idempotency_key"] = step.key
            if capture:
                attributes["gen_ai.tool.call.arguments"] = _content(step.input)
                if output is not None:
                    attributes["gen_ai.tool.call.result"] = _content(output)
            name, operation = f"execute_tool {step.name}", "execute_tool"
        span = _Span(name, operation, step.step, start, time.time_ns(), attributes)
        if error is not None:
            span.error = str(error)
            kind = "PossiblyRan" if result.get("interrupted") else "ToolError"
            attributes["error.type"] = "ModelReplyError" if step.kind == "model" else kind
        return span


def _content(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text[:_CONTENT_CHARS]
