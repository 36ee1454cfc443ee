"""``world ui``: the trace viewer, served on this machine with the standard library.

A static page shipped in the package (``observe/ui/``: HTML, JavaScript and CSS, no build
step) and a small JSON API over the same trace model as ``world trace``:

=============================================  ===================================================
``GET /api/config``                            ``world``, ``namespace``, ``content``, ``poll``
``GET /api/sessions?status=&limit=&cursor=``   a :class:`~world_core.observe.SessionPage`
``GET /api/trace?session=S[&turn=T]``          a :class:`~world_core.observe.SessionTrace`
=============================================  ===================================================

Errors are JSON ``{"error": "..."}`` with status 400 (bad input) or 404 (no such session).
The page polls the trace every ``poll`` seconds while the session has an open turn (live
updates) and the session list every few seconds. The server binds to loopback by default and
then answers only requests whose ``Host`` is a loopback name (no DNS rebinding).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from anyio.from_thread import BlockingPortal, start_blocking_portal

from world_core._select import open_world
from world_core.errors import ConfigurationError, InvalidArgumentError, NotFoundError, WorldError
from world_core.observe._sessions import list_sessions
from world_core.observe._trace import trace_session
from world_core.spi import World

__all__ = ["serve"]

_STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}
_LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


def _static(name: str) -> bytes:
    return resources.files("world_core.observe").joinpath("ui", name).read_bytes()


def _handler(
    portal: BlockingPortal, world: World, content: bool, poll: float, host: str
) -> type[BaseHTTPRequestHandler]:
    config = {
        "world": world.name,
        "namespace": world.namespace,
        "content": content,
        "poll": poll,
    }

    class Handler(BaseHTTPRequestHandler):
        server_version = "world-ui"

        def log_message(self, format: str, *args: Any) -> None:
            return  # quiet: the terminal shows the URL, not every poll

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, value: Any) -> None:
            self._send(status, json.dumps(value).encode(), "application/json")

        def do_GET(self) -> None:
            name = (self.headers.get("Host") or "").rsplit(":", 1)[0]
            if host in _LOOPBACK and name not in _LOOPBACK:
                # A page on another site cannot reach a loopback viewer through a DNS name of
                # its own (DNS rebinding). Bound to another address, the user opened it up.
                self._json(HTTPStatus.FORBIDDEN, {"error": f"unexpected Host {name!r}"})
                return
            parts = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            try:
                if parts.path in _STATIC:
                    file, kind = _STATIC[parts.path]
                    self._send(HTTPStatus.OK, _static(file), kind)
                elif parts.path == "/api/config":
                    self._json(HTTPStatus.OK, config)
                elif parts.path == "/api/sessions":
                    self._json(HTTPStatus.OK, self._sessions(query))
                elif parts.path == "/api/trace":
                    self._json(HTTPStatus.OK, self._trace(query))
                else:
                    self._json(HTTPStatus.NOT_FOUND, {"error": f"no such page: {parts.path}"})
            except NotFoundError as exc:
                self._json(HTTPStatus.NOT_FOUND, {"error": str(exc)})
            except WorldError as exc:
                self._json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
            except (BrokenPipeError, ConnectionResetError):
                return

        def _sessions(self, query: dict[str, str]) -> Any:
            try:
                limit = int(query.get("limit", "50"))
            except ValueError:
                raise InvalidArgumentError("limit must be an integer") from None
            page = portal.call(
                lambda: list_sessions(
                    world,
                    status=query.get("status") or None,
                    limit=limit,
                    cursor=query.get("cursor") or None,
                )
            )
            return page.model_dump(mode="json")

        def _trace(self, query: dict[str, str]) -> Any:
            session = query.get("session")
            if not session:
                raise InvalidArgumentError("give the session: /api/trace?session=<id>")
            trace = portal.call(
                lambda: trace_session(
                    world, session, turn=query.get("turn") or None, content=content
                )
            )
            return trace.model_dump(mode="json")

    return Handler


def serve(
    *,
    world: str | None = None,
    url: str | None = None,
    namespace: str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    content: bool = False,
    poll: float = 1.0,
    on_ready: Callable[[str], object] | None = None,
) -> int:
    """Serve the viewer until interrupted (Ctrl-C); prints its URL first.

    Args:
        world, url, namespace: the World to open (see :func:`world_core.open_world`).
        host: the address to bind; loopback by default. Anything else exposes every session
            to the network (content stays hidden unless ``content``).
        port: the port; 0 takes a free one.
        content: show prompts, tool arguments and results (redacted).
        poll: seconds between the page's refreshes of an open turn.
        on_ready: called with the URL once it serves (besides printing it).

    Returns:
        The exit status (0).

    Raises:
        ConfigurationError: the World cannot be opened, or the address cannot be listened on
            (taken, not this machine's).
    """
    with start_blocking_portal() as portal:
        opened: AbstractContextManager[World] = portal.wrap_async_context_manager(
            open_world(world, url=url, namespace=namespace)
        )
        with opened as store:
            try:
                server = ThreadingHTTPServer(
                    (host, port), _handler(portal, store, content, poll, host)
                )
            except OSError as exc:
                raise ConfigurationError(
                    f"world ui cannot listen on {host}:{port}: {exc.strerror or exc}; pick "
                    "another --port (0: any free one) or --host"
                ) from None
            server.daemon_threads = True
            bound_host, bound_port = server.server_address[:2]
            name = bound_host.decode() if isinstance(bound_host, bytes) else str(bound_host)
            shown = f"[{name}]" if ":" in name else name
            address = f"http://{shown}:{bound_port}/"
            print(f"world ui: serving {store.name} namespace {store.namespace} at {address}")
            print("press Ctrl-C to stop", flush=True)
            if on_ready is not None:
                on_ready(address)
            try:
                server.serve_forever(poll_interval=0.2)
            finally:
                server.server_close()
                sys.stdout.flush()
    return 0
