"""The one place where pymongo exceptions become `world_core.errors`."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NoReturn

from pymongo import errors as pe

from world_core.errors import (
    BackendUnavailableError,
    ClosedError,
    ConfigurationError,
    PayloadTooLargeError,
    WorldError,
)

__all__ = ["BSON_LIMIT", "CONNECT_TIMEOUT_VARIABLE", "URL_VARIABLE", "Opening", "translate"]

BSON_LIMIT = 16 * 1024 * 1024
"""MongoDB's largest document; one batch, with its keys and framing, must fit in one."""

URL_VARIABLE = "WORKFLOW_MONGO_URL"
CONNECT_TIMEOUT_VARIABLE = "WORKFLOW_MONGO_CONNECT_TIMEOUT"

_TRANSIENT_LABELS = ("RetryableWriteError", "TransientTransactionError", "NetworkError")
# getaddrinfo's answers for a name that does not exist (a typo), as opposed to EAI_AGAIN (the
# resolver did not answer) and the like, which may pass.
_UNKNOWN_HOST = {
    code for code in (getattr(socket, name, None) for name in ("EAI_NONAME", "EAI_NODATA")) if code
}
_ERRNO = re.compile(r"\[Errno (-?\d+)\] ?([^(]*)")
_CONFIGURED = re.compile(r" \(configured timeouts:[^)]*\)")


@dataclass(frozen=True)
class Opening:
    """A World being opened: what its first command's errors say (never the password)."""

    where: str
    """The URL, redacted."""
    source: str
    """Where the URL came from: ``WORKFLOW_MONGO_URL`` or ``url=``."""
    timeout: float
    servers: Callable[[], Mapping[str, Exception | None]]
    """``host:port`` of each server the client tried, with the last error it met there."""


def _server_reason(error: Exception | None, timeout: float) -> tuple[str, bool]:
    """What the client met at one server, in the system's words; and whether the host name
    is unknown. pymongo keeps only the text of the socket error."""
    text = "" if error is None else _CONFIGURED.sub("", str(error))
    if error is None or isinstance(error, pe.NetworkTimeout) or text.endswith("timed out"):
        return f"no answer within {timeout:g} s ({CONNECT_TIMEOUT_VARIABLE})", False
    found = _ERRNO.search(text)
    if found is None:
        return text.split(": ", 1)[-1], False  # pymongo starts with "host:port: "
    code = int(found.group(1))
    if code in _UNKNOWN_HOST:
        return found.group(2).strip(), True
    return (os.strerror(code) if code > 0 else found.group(2).strip()), False


def _source(opening: Opening | None) -> str:
    return f"{opening.source} ({opening.where})" if opening else f"{URL_VARIABLE} (or url=)"


def _not_connected(exc: pe.PyMongoError, opening: Opening) -> WorldError:
    servers = opening.servers()
    seen = {address: _server_reason(error, opening.timeout) for address, error in servers.items()}
    addresses = ", ".join(seen) or "the URL's hosts"
    url = f"{opening.source} ({opening.where})"
    if len(seen) == 1:
        ((reason, _),) = seen.values()
    elif seen:
        reason = "; ".join(f"{address}: {why}" for address, (why, _) in seen.items())
    else:
        reason = f"{type(exc).__name__}, within {opening.timeout:g} s ({CONNECT_TIMEOUT_VARIABLE})"
    if seen and all(unknown for _, unknown in seen.values()):
        return ConfigurationError(
            f"cannot connect to MongoDB at {addresses}: the host name is unknown ({reason}); "
            f"fix the host in {url}"
        )
    return BackendUnavailableError(
        f"cannot connect to MongoDB at {addresses}: {reason}. Check that the server runs and "
        f"that {url} names the right host and port. Nothing was done."
    )


@contextmanager
def translate(action: str, opening: Opening | None = None) -> Iterator[None]:
    """Map driver errors raised inside the block to the world error tree, chained.

    ``action`` says what was being done ("append to a log"); messages never carry the
    password. With ``opening``, the block is a World's first command: failing to reach the
    server is reported as such (the World never worked, nothing was done), naming the setting.
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
            f"check {_source(opening)}"
        ) from exc
    except pe.InvalidOperation as exc:
        # pymongo raises this for a closed client.
        raise ClosedError(f"cannot {action}: the MongoDB client is closed") from exc
    except (pe.ConnectionFailure, pe.ExecutionTimeout, pe.WTimeoutError) as exc:
        if opening is not None and isinstance(exc, pe.ConnectionFailure | pe.ExecutionTimeout):
            raise _not_connected(exc, opening) from exc
        raise BackendUnavailableError(
            f"cannot {action}: MongoDB is unreachable or timed out ({type(exc).__name__}); "
            "retry later, idempotently where it matters"
        ) from exc
    except pe.OperationFailure as exc:
        said = str((exc.details or {}).get("errmsg") or exc).rstrip(".")
        if exc.code == 13:
            raise ConfigurationError(
                f"cannot {action}: the MongoDB user of {_source(opening)} lacks a privilege "
                f"({said}); "
                "grant it readWrite (and createIndex) on the database, or use another user"
            ) from exc
        if exc.code == 18 or "authentication failed" in said.lower():
            raise ConfigurationError(
                f"cannot {action}: MongoDB refused the credentials of {_source(opening)} "
                f"({said}); fix the user, password or authSource"
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
