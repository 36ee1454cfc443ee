"""The durable step journal: every model call and tool call of a turn, recorded in the session log.

One log per session (``session/<session_id>``). A turn's calls are numbered steps 0, 1, 2 ...
in the order the agent code makes them. Events (JSON) and their keys, unique in the log:

=============================  ==============================================================
``turn/<t>/input``             the user's message (written by :class:`~world_core.Client`)
``turn/<t>/step/<n>/intent``   a ``never`` tool is about to run (kind, name, input digest)
``turn/<t>/step/<n>/outcome``  the step's result (or a blob reference), with its identity
``turn/<t>/step/<n>/doc/<d>``  document ``d`` as step ``n``'s tool left it (see Documents)
``turn/<t>/reply``             the final reply; the turn is finished
=============================  ==============================================================

The rules, for step ``n``:

* Outcome recorded: return it, call nothing.
* Intent recorded, no outcome (the call was interrupted): a model call and a ``safe`` tool run
  again; a ``never`` tool does not run: its outcome becomes :data:`POSSIBLY_RAN`, telling the
  model the call may or may not have happened and to check the current state first.
* Nothing recorded: a ``never`` tool's intent is appended (and committed) before the tool
  runs, in an append of its own that nothing of the tool's can join; then the call runs; then
  its outcome is appended at once. Model calls and ``safe`` tools write no intent: an
  interrupted one has nothing recorded and, by the rule above, runs again anyway, so the
  intent would cost a round trip and change no decision.
* Deferred outcomes: a ``safe`` tool's outcome, and the values of ``now()``, ``uuid()`` and
  ``random()`` (steps too), are not appended on their own: they ride with the next append
  (the next model call's outcome, a ``never`` intent, the reply; or on their own past 1 MiB).
  A crash before that loses them, and the replay runs the ``safe`` tool again or draws a fresh
  value, which is what ``safe`` allows, and nothing durable can have used them: appends keep
  step order, so any later outcome is in the same atomic batch or after it.
* Round trips per step: model call 1; ``never`` tool 2 (intent, outcome); ``safe`` tool and
  ``now``/``uuid``/``random`` 0 of their own (``defer_safe=False``: 1 per ``safe`` tool).
* Every recorded step carries its kind, name and a sha-256 of its canonical input (for a model
  call: the whole request, conversation and tool schemas). Replay compares them at each
  position; any difference raises :class:`~world_core.errors.NonDeterminismError` with both
  sides, before anything runs or is written. So does code that goes on past a recorded reply,
  or stops before the recorded steps end.
* Single ownership: keys are unique in the log, so of two workers on one step, the second
  intent (``never``) or the second outcome (any step) is refused with
  :class:`~world_core.errors.DuplicateKeyError`; the loser stops, having run no ``never`` tool.
  After any failed append the Journal refuses further steps (its view may be stale): open a
  new one.
* Documents: a tool's edits (``context.docs.put``) become ``turn/<t>/step/<n>/doc/<name>``
  events in the same atomic append as its outcome (or the same deferred batch), and only if
  the tool returned: an interrupted or failing call edits nothing.
* Results whose canonical JSON exceeds ``blob_threshold`` bytes go to a content-addressed blob
  (written before the outcome); the outcome keeps digest and size; replay reads them back.
"""

from __future__ import annotations

import hashlib
import json
import random as _random
import time
import uuid as _uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic_core import to_jsonable_python

from world_core.errors import (
    InvalidArgumentError,
    NonDeterminismError,
    NotFoundError,
    WorldError,
)
from world_core.journal._blobs import BlobRef, Blobs
from world_core.journal._crash import CrashPoint
from world_core.journal._model import ModelClient, ModelReply, ModelRequest, ToolCall
from world_core.journal._tools import Replay, Tool, ToolContext
from world_core.spi import MAX_ID_BYTES, NewEvent, World, validate_id
from world_core.workspace._documents import DocumentEdits, document_event

__all__ = [
    "DEFAULT_BLOB_THRESHOLD",
    "POSSIBLY_RAN",
    "Journal",
    "canonical_json",
    "digest_of",
    "session_log_id",
]

DEFAULT_BLOB_THRESHOLD = 64 * 1024
"""Results larger than this (canonical JSON bytes) are stored as blobs."""

POSSIBLY_RAN = (
    "This call was interrupted before its result was saved, so it may or may not have "
    "happened. Check the current state before you try it again."
)
"""The tool result a model gets for an interrupted ``never`` tool."""

_PREVIEW_CHARS = 300
_PENDING_FLUSH_BYTES = 1024 * 1024  # deferred outcomes are written once they reach this


def canonical_json(value: object) -> bytes:
    """Sorted keys, no spaces, UTF-8: the bytes digests and blobs are computed over."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def digest_of(value: object) -> str:
    """sha-256 (hex) of ``value``'s canonical JSON."""
    return hashlib.sha256(canonical_json(value)).hexdigest()


def session_log_id(session_id: str) -> str:
    """The log holding a session's turns and journal."""
    validate_id(session_id, "session_id")
    log_id = f"session/{session_id}"
    return validate_id(log_id, "session log id (session/<session_id>)")


def check_turn_id(turn_id: str) -> str:
    validate_id(turn_id, "turn_id")
    if "/" in turn_id or len(turn_id.encode()) > MAX_ID_BYTES - 64:
        raise InvalidArgumentError(
            f"turn_id {turn_id!r} must not contain '/' and must leave room for step keys "
            f"(at most {MAX_ID_BYTES - 64} UTF-8 bytes)"
        )
    return turn_id


def _preview(value: object) -> str:
    text = canonical_json(value).decode("utf-8")
    return text if len(text) <= _PREVIEW_CHARS else text[:_PREVIEW_CHARS] + "..."


@dataclass
class _Step:
    intent: dict[str, Any] | None = None
    outcome: dict[str, Any] | None = None

    @property
    def identity(self) -> dict[str, Any]:
        source = self.outcome if self.outcome is not None else self.intent
        assert source is not None
        return {k: source.get(k) for k in ("kind", "name", "digest", "preview")}


@dataclass
class _Turn:
    steps: dict[int, _Step] = field(default_factory=dict)
    user_message: str | None = None
    reply: str | None = None
    history: list[tuple[str, str]] = field(default_factory=list)
    documents: dict[str, Any] = field(default_factory=dict)


class Journal:
    """The journal of one turn. Open with :meth:`open`; drive it with :meth:`model`,
    :meth:`call`, :meth:`tool`, :meth:`now`, :meth:`uuid`, :meth:`random`; end with
    :meth:`finish`. Not safe for concurrent use: steps are numbered in call order.

    Counters for observers: ``model_calls`` (model requests this instance sent),
    ``tool_runs`` (tool bodies it ran), ``replayed`` (steps it read back instead).
    """

    def __init__(
        self,
        world: World,
        session_id: str,
        turn_id: str,
        turn: _Turn,
        *,
        crash: CrashPoint | None,
        blob_threshold: int,
        defer_safe: bool = True,
    ) -> None:
        self._world = world
        self.session_id = session_id
        self.turn_id = turn_id
        self._log_id = session_log_id(session_id)
        self._turn = turn
        self._crash = crash
        self._blob_threshold = blob_threshold
        self._blobs = Blobs(world.stream)
        self._next = 0
        self._pending: list[NewEvent] = []
        self._pending_bytes = 0
        self._defer_safe = defer_safe
        self._staged_docs: dict[str, Any] = {}
        self._broken: BaseException | None = None
        self.model_calls = 0
        self.tool_runs = 0
        self.replayed = 0

    @classmethod
    async def open(
        cls,
        world: World,
        session_id: str,
        turn_id: str,
        *,
        crash: CrashPoint | None = None,
        blob_threshold: int = DEFAULT_BLOB_THRESHOLD,
        defer_safe: bool = True,
    ) -> Journal:
        """Load the session log (one read) and return the journal of ``turn_id``.

        Args:
            crash: die at this point (see :mod:`world_core.journal._crash`); None in production.
            blob_threshold: results above this many bytes go to blobs.
            defer_safe: let ``safe`` tool outcomes ride with the next append (the default);
                False writes each at once, one append per ``safe`` step.

        Raises:
            InvalidIdentifierError, InvalidArgumentError: bad ids (nothing is read).
        """
        log_id = session_log_id(session_id)
        check_turn_id(turn_id)
        if blob_threshold < 0:
            raise InvalidArgumentError("blob_threshold must be >= 0")
        events = await world.log.read(log_id)
        return cls(
            world,
            session_id,
            turn_id,
            _load(events_data=[(e.seq, e.data) for e in events], turn_id=turn_id),
            crash=crash,
            blob_threshold=blob_threshold,
            defer_safe=defer_safe,
        )

    # -- what the turn is about ----------------------------------------------------------------

    @property
    def user_message(self) -> str:
        """The message submitted for this turn.

        Raises:
            NotFoundError: the turn was never submitted (no ``turn/<t>/input`` event).
        """
        if self._turn.user_message is None:
            raise NotFoundError(
                f"turn {self.turn_id!r} of session {self.session_id!r} has no input; "
                "submit it with Client.submit"
            )
        return self._turn.user_message

    @property
    def history(self) -> list[tuple[str, str]]:
        """(message, reply) of the session's turns that had replied before this one was
        submitted, oldest first: fixed once the turn exists, so replay sees the same."""
        return list(self._turn.history)

    @property
    def recorded_reply(self) -> str | None:
        """The reply already recorded for this turn, if it finished before."""
        return self._turn.reply

    @property
    def idempotency_prefix(self) -> str:
        return f"{self.session_id}/{self.turn_id}"

    # -- steps -----------------------------------------------------------------------------------

    async def model(self, client: ModelClient, request: ModelRequest) -> ModelReply:
        """One model call as a step (no intent; one append when it runs)."""
        payload = request.model_dump(mode="json")
        preview = {
            "messages": len(payload["messages"]),
            "tools": [t.get("function", {}).get("name") for t in payload["tools"]],
            "last_message": payload["messages"][-1] if payload["messages"] else None,
        }

        async def run(step: int) -> dict[str, Any]:
            self.model_calls += 1
            reply = await client.complete(request)
            return {"output": reply.model_dump(mode="json")}

        result = await self._step("model", "model", digest_of(payload), preview, "safe", run)
        return ModelReply.model_validate(result["output"])

    async def call(self, tool: Tool, arguments: dict[str, Any]) -> Any:
        """Run ``tool`` with ``arguments`` as a step; returns its JSON result.

        An exception raised by the tool is recorded as the step's outcome (``{"error": ...}``
        is returned), since the call happened; model clients' and the World's errors are not.

        Raises:
            InvalidArgumentError: arguments do not match the tool's schema (no step is taken).
        """
        args = tool.parse(arguments)
        result = await self._tool_step(tool, args)
        return result["error"] if "error" in result else result["output"]

    async def tool(self, tool: Tool, call: ToolCall) -> str:
        """Run a tool call the model made; returns the text for the ``tool`` message.

        Arguments that are not JSON or do not match the schema take no step: the model gets
        the error text (deterministic, since the call came from a journaled reply).
        """
        try:
            arguments = json.loads(call.arguments or "{}")
            if not isinstance(arguments, dict):
                raise ValueError("arguments must be a JSON object")
            args = tool.parse(arguments)
        except (ValueError, InvalidArgumentError) as exc:
            return f"Error: {exc}"
        result = await self._tool_step(tool, args)
        if "error" in result:
            return f"Error: {result['error']}"
        output = result["output"]
        return output if isinstance(output, str) else canonical_json(output).decode("utf-8")

    async def _tool_step(self, tool: Tool, args: dict[str, Any]) -> dict[str, Any]:
        async def run(step: int) -> dict[str, Any]:
            self.tool_runs += 1
            docs = DocumentEdits(self._turn.documents)
            context = ToolContext(self.session_id, self.turn_id, step, docs)
            try:
                value = await tool.call(args, context)
            except Exception as exc:  # the tool ran and failed: that is its outcome
                return {"error": f"{type(exc).__name__}: {exc}"}
            try:
                result = {"output": to_jsonable_python(value)}
            except Exception as exc:
                return {"error": f"tool returned a value that is not JSON: {exc}"}
            self._staged_docs = docs.staged  # committed with the outcome, by _step
            return result

        return await self._step("tool", tool.name, digest_of(args), args, tool.replay, run)

    def now(self) -> float:
        """UNIX time, journaled: replay returns the recorded value."""
        return float(self._value("now", time.time))

    def uuid(self) -> str:
        """A random UUID (hex string), journaled."""
        return str(self._value("uuid", lambda: str(_uuid.uuid4())))

    def random(self) -> float:
        """A float in [0, 1), journaled."""
        return float(self._value("random", _random.random))

    async def finish(self, reply: str) -> str:
        """Record the turn's reply (with any deferred steps) and return it.

        On replay of a finished turn, nothing is written: the recorded reply is returned.

        Raises:
            NonDeterminismError: the journal holds steps this run did not reach, or another
                reply.
        """
        self._check_usable()
        beyond = sorted(n for n in self._turn.steps if n >= self._next)
        if beyond:
            raise self._mismatch(beyond[0], self._turn.steps[beyond[0]].identity, "end of turn")
        if self._turn.reply is not None:
            if self._turn.reply != reply:
                raise NonDeterminismError(
                    f"turn {self.turn_id!r} recorded the reply {self._turn.reply[:200]!r} but "
                    f"this run produced {reply[:200]!r}; replay must be deterministic",
                    position=f"turn {self.turn_id} reply",
                    recorded=self._turn.reply,
                    attempted=reply,
                )
            return reply
        event = self._event("reply", {"reply": reply, "steps": self._next})
        await self._append([event])
        self._turn.reply = reply
        return reply

    # -- machinery -------------------------------------------------------------------------------

    def _event(self, what: str, body: dict[str, Any], step: int | None = None) -> NewEvent:
        key = (
            f"turn/{self.turn_id}/{what}"
            if step is None
            else (f"turn/{self.turn_id}/step/{step}/{what}")
        )
        data: dict[str, Any] = {"t": what, "turn": self.turn_id, **body}
        if step is not None:
            data["step"] = step
        return NewEvent(key=key, data=canonical_json(data))

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise WorldError(
                f"this Journal stopped after {type(self._broken).__name__}: {self._broken}; "
                "open a new one to continue the turn"
            ) from self._broken

    async def _append(self, events: list[NewEvent]) -> None:
        batch = [*self._pending, *events]
        if not batch:
            return
        try:
            await self._world.log.append(self._log_id, batch)
        except BaseException as exc:
            self._broken = exc
            raise
        self._pending.clear()
        self._pending_bytes = 0

    def _mismatch(self, step: int, recorded: object, attempted: object) -> NonDeterminismError:
        return NonDeterminismError(
            f"turn {self.turn_id!r} step {step}: the journal holds {recorded!r} but the code "
            f"now does {attempted!r}. The code or its inputs changed since the turn ran; "
            "deploy the version that wrote it, or start a new turn.",
            position=f"turn {self.turn_id} step {step}",
            recorded=recorded,
            attempted=attempted,
        )

    def _claim_position(self, kind: str, name: str, digest: str, preview: object) -> int:
        """Take the next step number; check a recorded step there matches."""
        self._check_usable()
        n = self._next
        attempted = {"kind": kind, "name": name, "digest": digest, "preview": _preview(preview)}
        step = self._turn.steps.get(n)
        if step is not None:
            recorded = step.identity
            if (recorded["kind"], recorded["name"], recorded["digest"]) != (kind, name, digest):
                raise self._mismatch(n, recorded, attempted)
        elif self._turn.reply is not None:
            raise self._mismatch(n, "end of turn (reply recorded)", attempted)
        self._next += 1
        return n

    def _value(self, kind: str, make: Callable[[], Any]) -> Any:
        n = self._claim_position(kind, kind, digest_of(None), None)
        step = self._turn.steps.get(n)
        if step is not None and step.outcome is not None:
            self.replayed += 1
            return step.outcome["result"]["output"]
        value = make()
        body = {"kind": kind, "name": kind, "digest": digest_of(None), "preview": "null"}
        self._pending.append(self._event("outcome", {**body, "result": {"output": value}}, n))
        return value

    async def _step(
        self,
        kind: str,
        name: str,
        digest: str,
        preview: object,
        replay: Replay,
        run: Callable[[int], Awaitable[dict[str, Any]]],
    ) -> dict[str, Any]:
        n = self._claim_position(kind, name, digest, preview)
        try:
            return await self._take(n, kind, name, digest, preview, replay, run)
        except BaseException:
            # The step raised (a model client's error, a cancelled tool, a blob write) and
            # recorded no outcome: code that calls again is at step n again. Going on at n + 1
            # would leave a hole that a replay fills with a second call (a model billed twice,
            # then a divergence). A never intent written here makes the retry an interrupted
            # call, as the rules say. After a failed append the Journal is unusable anyway.
            self._next = n
            raise

    async def _take(
        self,
        n: int,
        kind: str,
        name: str,
        digest: str,
        preview: object,
        replay: Replay,
        run: Callable[[int], Awaitable[dict[str, Any]]],
    ) -> dict[str, Any]:
        identity = {"kind": kind, "name": name, "digest": digest, "preview": _preview(preview)}
        step = self._turn.steps.get(n)
        if step is not None and step.outcome is not None:
            self.replayed += 1
            return await self._result(step.outcome)
        if step is not None and replay == "never":
            result = {"output": POSSIBLY_RAN, "interrupted": True}
            await self._append([self._event("outcome", {**identity, "result": result}, n)])
            self._record(n, outcome={"result": result})
            return result
        if step is None and replay == "never":
            await self._append([self._event("intent", {**identity, "replay": replay}, n)])
            self._record(n, intent=identity)
        crash = self._crash
        if crash is not None and crash.step == n and crash.when == "before_run":
            crash.hit()
        self._staged_docs = {}
        result = await run(n)
        if crash is not None and crash.step == n and crash.when == "after_run":
            crash.hit()
        try:
            encoded = canonical_json(result)
        except ValueError as exc:  # NaN or infinity: the call happened, record that it failed
            if kind != "tool":
                raise
            result, self._staged_docs = {"error": f"result is not JSON: {exc}"}, {}
            encoded = canonical_json(result)
        body: dict[str, Any] = dict(identity)
        if len(encoded) > self._blob_threshold:
            ref = await self._blobs.put(encoded)
            body["blob"] = ref.model_dump()
        else:
            body["result"] = result
        events = [self._event("outcome", body, n)]
        staged, self._staged_docs = self._staged_docs, {}
        for doc_name, value in staged.items():
            key = f"turn/{self.turn_id}/step/{n}/doc/{doc_name}"
            events.append(document_event(doc_name, value, key=key, turn=self.turn_id, step=n))
        if kind == "tool" and replay == "safe" and self._defer_safe:
            # Rides with the next append: lost only to a crash before it, and then the tool
            # simply runs again, which its label allows. Every later outcome (a model call's)
            # is in the same or a later batch, so nothing durable ever depends on it alone.
            self._pending.extend(events)
            self._pending_bytes += sum(len(event.data) for event in events)
            if self._pending_bytes > _PENDING_FLUSH_BYTES:
                await self._append([])
        else:
            await self._append(events)
        self._turn.documents.update(staged)
        self._record(n, outcome=body)
        # Return what replay will return: the JSON form, not the Python objects.
        decoded: dict[str, Any] = json.loads(encoded)
        return decoded

    def _record(
        self, n: int, *, intent: dict[str, Any] | None = None, outcome: dict[str, Any] | None = None
    ) -> None:
        step = self._turn.steps.setdefault(n, _Step())
        if intent is not None:
            step.intent = intent
        if outcome is not None:
            step.outcome = outcome

    async def _result(self, outcome: dict[str, Any]) -> dict[str, Any]:
        if "blob" in outcome:
            data = await self._blobs.get(BlobRef.model_validate(outcome["blob"]))
            loaded: dict[str, Any] = json.loads(data)
            return loaded
        result: dict[str, Any] = outcome["result"]
        return result


def _load(*, events_data: list[tuple[int, bytes]], turn_id: str) -> _Turn:
    turn = _Turn()
    inputs: dict[str, tuple[int, str]] = {}
    replies: dict[str, tuple[int, str]] = {}
    for seq, data in events_data:
        try:
            event = json.loads(data)
        except ValueError:
            continue  # not ours: the session log may carry other events
        if not isinstance(event, dict):
            continue
        what, turn_of = event.get("t"), str(event.get("turn"))
        if what == "doc":
            turn.documents[event["name"]] = event["value"]
        elif what == "input":
            inputs[turn_of] = (seq, event["message"])
        elif what == "reply":
            replies[turn_of] = (seq, event["reply"])
        if turn_of != turn_id:
            continue
        if what == "intent":
            turn.steps.setdefault(event["step"], _Step()).intent = event
        elif what == "outcome":
            turn.steps.setdefault(event["step"], _Step()).outcome = event
    if turn_id in inputs:
        start, turn.user_message = inputs[turn_id]
        turn.history = [
            (message, replies[other][1])
            for other, (seq, message) in sorted(inputs.items(), key=lambda item: item[1][0])
            if other != turn_id and other in replies and replies[other][0] < start
        ]
    if turn_id in replies:
        turn.reply = replies[turn_id][1]
    return turn
