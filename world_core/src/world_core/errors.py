"""The one error hierarchy of `world`.

Every backend translates its driver's exceptions into these, in one place, and chains the
original (``raise BackendUnavailableError(...) from exc``). Code above the SPI, tests and the
conformance suite only ever see these types::

    WorldError
    ├── ConfigurationError        (also ValueError)   settings missing or wrong
    ├── InvalidArgumentError      (also ValueError)   a call refused before any I/O
    │   ├── InvalidIdentifierError                    an id, key or namespace the store refuses
    │   └── PathError                                 a workspace path refused or of the wrong kind
    ├── PayloadTooLargeError      (also ValueError)   one call carries more bytes than allowed
    ├── NotFoundError             (also LookupError)  the thing asked for does not exist
    │   └── PathNotFoundError     (also FileNotFoundError)  no such file in the workspace
    ├── ConflictError                                 a compare-and-set saw another state
    │   └── DocumentConflictError                     a document changed since it was read
    ├── DuplicateKeyError                             an event key already exists in the log
    ├── DocumentSchemaError       (also ValueError)   a stored document's schema is unreadable here
    ├── LeaseLostError                                the lease's token is no longer current
    ├── ClosedError                                   write to a closed stream or World
    ├── UnsupportedError          (also NotImplementedError)  feature declared absent
    ├── BackendUnavailableError   (also ConnectionError)      transient fault; retry later
    ├── NonDeterminismError                           replay differs from the journal
    ├── CallInFlightError                             a never call may still be running
    ├── ModelReplyError                               a paid model reply that cannot be used
    ├── ShellLimitError                               a shell script stopped by a limit
    ├── ToolError                                     a journaled tool call failed
    │   └── PossiblyRanError                          a never call interrupted: may have run
    ├── TurnFailedError                               the turn recorded a failure
    ├── TurnNotReadyError                             an earlier turn of the session runs
    └── WorkspaceLimitError       (also ValueError)   a workspace size limit would be passed

Each message says what the reader can do next.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from world_core.spi import Event

__all__ = [
    "BackendUnavailableError",
    "CallInFlightError",
    "ClosedError",
    "ConfigurationError",
    "ConflictError",
    "DocumentConflictError",
    "DocumentSchemaError",
    "DuplicateKeyError",
    "InvalidArgumentError",
    "InvalidIdentifierError",
    "LeaseLostError",
    "ModelReplyError",
    "NonDeterminismError",
    "NotFoundError",
    "PathError",
    "PathNotFoundError",
    "PayloadTooLargeError",
    "PossiblyRanError",
    "ShellLimitError",
    "ToolError",
    "TurnFailedError",
    "TurnNotReadyError",
    "UnsupportedError",
    "WorkspaceLimitError",
    "WorldError",
]


class WorldError(Exception):
    """Root of every error raised by `world` and its backends."""


class ConfigurationError(WorldError, ValueError):
    """A setting is missing or wrong: the message names the variable or option to fix."""


class InvalidArgumentError(WorldError, ValueError):
    """A call was refused before anything was written (empty batch, negative delay ...)."""


class InvalidIdentifierError(InvalidArgumentError):
    """An identifier, event key, status or namespace was refused before anything was written."""


class PathError(InvalidArgumentError):
    """A workspace path was refused (absolute, ``..`` above the root, a backslash, NUL or a
    control character, too long, a link) or names the wrong kind of entry (a directory where
    a file is needed ...); nothing was changed.

    Attributes:
        path: the path as given.
    """

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class PayloadTooLargeError(WorldError, ValueError):
    """One call carries more payload bytes than the World accepts; nothing was written.

    Attributes:
        size: the bytes the call carried.
        limit: the most a single call may carry.
    """

    def __init__(self, message: str, *, size: int, limit: int) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class NotFoundError(WorldError, LookupError):
    """The log, message, stream or dead letter asked for does not exist."""


class PathNotFoundError(NotFoundError, FileNotFoundError):
    """No file or directory at this path of the workspace (also a ``FileNotFoundError``).

    Attributes:
        path: the normalised path.
    """

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class ConflictError(WorldError):
    """A compare-and-set (``expect_tail``, ``expect_next``) found another state; nothing written.

    Attributes:
        expected: the value the caller expected.
        actual: the value the store holds; read from there and decide again.
    """

    def __init__(self, message: str, *, expected: int, actual: int) -> None:
        super().__init__(message)
        self.expected = expected
        self.actual = actual


class DocumentConflictError(ConflictError):
    """A document edit stated the version it read, and the document has moved on since: the
    edit was not saved. Read the document again and decide again (``Documents.update`` does).

    Attributes:
        document: the document's name.
        expected: the version the edit was based on.
        actual: the document's current version.
    """

    def __init__(self, message: str, *, document: str, expected: int, actual: int) -> None:
        super().__init__(message, expected=expected, actual=actual)
        self.document = document


class DocumentSchemaError(WorldError, ValueError):
    """A stored document cannot be read by this code: it was written with a newer schema
    version than the model declares (deploy the newer code), or an older one and the model
    has no ``migrate`` (or its ``migrate`` failed), or the model does not validate the stored
    value (changed without a new schema version). Nothing was changed.

    Attributes:
        document: the document's name.
        stored: the schema version it is stored with.
        current: the schema version the model declares.
    """

    def __init__(self, message: str, *, document: str, stored: int, current: int) -> None:
        super().__init__(message)
        self.document = document
        self.stored = stored
        self.current = current


class DuplicateKeyError(WorldError):
    """A batch carried an event key that already exists in the log; the whole batch was refused.

    Attributes:
        key: the key that collided.
        existing: the event already stored under that key.
    """

    def __init__(self, message: str, *, key: str, existing: Event) -> None:
        super().__init__(message)
        self.key = key
        self.existing = existing


class LeaseLostError(WorldError):
    """The lease's fencing token is no longer current (the message was claimed again, acked or
    dead-lettered). The holder must stop working on the message and must not retry the call."""


class ClosedError(WorldError):
    """Write to a closed stream, or use of a World after ``aclose()``."""


class UnsupportedError(WorldError, NotImplementedError):
    """The backend declares this optional feature absent in its ``Capabilities``."""


class BackendUnavailableError(WorldError, ConnectionError):
    """A transient fault (server down, connection dropped, timeout). Whether the operation took
    effect is unknown unless the message says otherwise; retry it, idempotently where it matters."""


class NonDeterminismError(WorldError):
    """Replay reached a step that differs from what the journal holds at that position.

    Attributes:
        position: where in the turn the mismatch was found.
        recorded: what the journal holds there.
        attempted: what the code tried to do there now.
    """

    def __init__(self, message: str, *, position: str, recorded: object, attempted: object) -> None:
        super().__init__(message)
        self.position = position
        self.recorded = recorded
        self.attempted = attempted


class ModelReplyError(WorldError):
    """The model server answered (so the call was paid for) with something that is not a
    usable reply. The journal records it as the step's outcome, so a redelivered turn does not
    pay for the same request again; the turn fails with this error.

    Attributes:
        raw: the start of what the server sent (credentials scrubbed).
    """

    def __init__(self, message: str, *, raw: str = "") -> None:
        super().__init__(message)
        self.raw = raw


class ToolError(WorldError):
    """A tool call recorded in the journal did not return a result (``Journal.call``).

    The call happened (or may have): the error is its recorded outcome, and replay raises the
    same error again without running the tool.

    Attributes:
        tool: the tool's name.
        step: the step number of the call in its turn.
        error: the recorded error text (``"ValueError: ..."``).
    """

    def __init__(self, message: str, *, tool: str, step: int, error: str) -> None:
        super().__init__(message)
        self.tool = tool
        self.step = step
        self.error = error


class PossiblyRanError(ToolError):
    """A ``never`` tool call was interrupted (a crash, a pause past its lease, its timeout)
    before its outcome was saved: it may or may not have happened. Check the state it acts on
    before trying again; a retry with the same arguments in the same turn reuses
    ``idempotency_key``.

    Attributes:
        idempotency_key: the key the interrupted call was given.
    """

    def __init__(
        self, message: str, *, tool: str, step: int, error: str, idempotency_key: str
    ) -> None:
        super().__init__(message, tool=tool, step=step, error=error)
        self.idempotency_key = idempotency_key


class ShellLimitError(WorldError):
    """A shell script was stopped by one of its limits (``ShellLimits``); it changed no file.
    The message names the setting to raise.

    Attributes:
        limit: which limit (``time``, ``output``, ``loop``, ``commands``, ``memory``, ``depth``,
            ``engine``).
    """

    def __init__(self, message: str, *, limit: str) -> None:
        super().__init__(message)
        self.limit = limit


class TurnFailedError(WorldError):
    """The turn could not finish and recorded why in its session (``Client.wait`` raises it).

    Attributes:
        session_id, turn_id: the turn.
        error_type: the class name of the error that ended it (``NonDeterminismError`` ...).
        error: its message.
        attempts: deliveries the turn had when it failed.
        step: the step it stopped at (None: before its first step or after its last).
    """

    def __init__(
        self,
        message: str,
        *,
        session_id: str,
        turn_id: str,
        error_type: str,
        error: str,
        attempts: int,
        step: int | None,
    ) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.turn_id = turn_id
        self.error_type = error_type
        self.error = error
        self.attempts = attempts
        self.step = step


class CallInFlightError(WorldError):
    """A ``never`` call recorded by another worker may still be running: its deadline (on the
    store's clock) has not passed, so nobody may answer for it yet. The worker re-queues the
    turn to resume after ``retry_after`` seconds; code driving a Journal by hand waits that long
    and opens a new one.

    Attributes:
        step: the step of the call in flight.
        retry_after: seconds until its deadline (plus a margin for clock error) has passed.
    """

    def __init__(self, message: str, *, step: int, retry_after: float) -> None:
        super().__init__(message)
        self.step = step
        self.retry_after = retry_after


class TurnNotReadyError(WorldError):
    """A turn was driven while an earlier turn of its session (submitted before it) had not
    finished: the turns of a session run one at a time, in submission order, so each sees every
    earlier one. A :class:`~world_core.Worker` never raises it (it hands the turn on to run
    after the earlier one); code driving a Journal by hand finishes the earlier turn first.

    Attributes:
        waiting_for: the id of the earliest unfinished turn submitted before this one.
    """

    def __init__(self, message: str, *, waiting_for: str) -> None:
        super().__init__(message)
        self.waiting_for = waiting_for


class WorkspaceLimitError(WorldError, ValueError):
    """A change would pass one of the workspace's limits (``WorkspaceLimits``); nothing was
    changed. The message names the limit and how to raise it.

    Attributes:
        limit: the limit's name (``max_file_bytes``, ``max_total_bytes``, ``max_entries``).
        allowed: its value.
        needed: what the change would have needed.
    """

    def __init__(self, message: str, *, limit: str, allowed: int, needed: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.allowed = allowed
        self.needed = needed
