"""The one place where pymongo exceptions become `world_core.errors`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from pymongo import errors as pe

from world_core.errors import (
    BackendUnavailableError,
    ClosedError,
    ConfigurationError,
    PayloadTooLargeError,
    WorldError,
)

__all__ = ["BSON_LIMIT", "translate"]

BSON_LIMIT = 16 * 1024 * 1024
"""MongoDB's largest document; one batch, with its keys and framing, must fit in one."""

_TRANSIENT_LABELS = ("RetryableWriteError", "TransientTransactionError", "NetworkError")


@contextmanager
def translate(action: str) -> Iterator[None]:
    """Map driver errors raised inside the block to the world error tree, chained.

    ``action`` says what was being done ("append to a log"); messages never carry the URL.
    DuplicateKeyError is handled by the callers that expect it, before it gets here.
    """
    try:
        yield
    except WorldError:
        raise
    except pe.DocumentTooLarge as exc:
        raise PayloadTooLargeError(
            f"cannot {action}: the document exceeds MongoDB's 16 MiB limit; "
            "send fewer or smaller events per call",
            size=BSON_LIMIT + 1,
            limit=BSON_LIMIT,
        ) from exc
    except pe.ConfigurationError as exc:
        raise ConfigurationError(
            f"cannot {action}: MongoDB client configuration is wrong ({type(exc).__name__}); "
            "check WORKFLOW_MONGO_URL"
        ) from exc
    except pe.InvalidOperation as exc:
        # pymongo raises this for a closed client.
        raise ClosedError(f"cannot {action}: the MongoDB client is closed") from exc
    except (pe.ConnectionFailure, pe.ExecutionTimeout, pe.WTimeoutError) as exc:
        raise BackendUnavailableError(
            f"cannot {action}: MongoDB is unreachable or timed out ({type(exc).__name__}); "
            "retry later, idempotently where it matters"
        ) from exc
    except pe.OperationFailure as exc:
        if exc.code in (13, 18) or "authentication failed" in str(exc).lower():
            raise ConfigurationError(
                f"cannot {action}: MongoDB refused the credentials or privileges of "
                f"WORKFLOW_MONGO_URL (code {exc.code}); fix the user, password or authSource"
            ) from exc
        _raise_other(action, exc)
    except pe.PyMongoError as exc:
        _raise_other(action, exc)


def _raise_other(action: str, exc: pe.PyMongoError) -> NoReturn:
    if any(exc.has_error_label(label) for label in _TRANSIENT_LABELS):
        raise BackendUnavailableError(
            f"cannot {action}: transient MongoDB fault ({type(exc).__name__}); retry later"
        ) from exc
    code = getattr(exc, "code", None)
    raise WorldError(
        f"cannot {action}: MongoDB refused it ({type(exc).__name__}, code {code}); "
        "check the server version and the user's privileges"
    ) from exc
