"""Exported histories (world-history/1): export from a World, write as JSON, read back, import
into another World: the same events (seq, key, bytes) and blobs, on the local World and on
PostgreSQL (``WORLD_TEST_POSTGRES_URL``; skipped without it unless ``WORLD_REQUIRE`` names
postgres)."""

from __future__ import annotations

import base64
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from world_core import (
    Agent,
    Client,
    Journal,
    ModelReply,
    NewEvent,
    ScriptedModel,
    World,
    dump_history,
    load_history_file,
    open_world,
    read_history,
    read_state,
    replay_check,
    session_blobs,
    session_log_id,
    tool,
    write_history,
    write_state,
)
from world_core.errors import InvalidArgumentError, NotFoundError
from world_core.journal import HISTORY_FORMAT, BlobRef, parse_history

pytestmark = pytest.mark.anyio

THRESHOLD = 1024
SESSION = "s"
LONG_MESSAGE = "Please send the whole launch plan. " * 100  # over THRESHOLD: a blob
SURROGATE = "half an emoji: \ud83d"  # JSON can carry it, UTF-8 cannot: stored escaped
NOTE = "The launch is on Thursday. " * 40  # over THRESHOLD


def lookup(topic: str) -> str:
    """Look a topic up."""
    return NOTE


_LOOKUP = tool(lookup, replay="safe")


class _Fetcher(Agent):
    """One tool call whose result (over THRESHOLD) becomes a blob, then the reply."""

    async def run_turn(self, journal: Journal) -> str:
        note = await journal.call(_LOOKUP, {"topic": "launch"})
        return await journal.finish(f"{len(note)} characters")


def build() -> Agent:
    return _Fetcher(model=ScriptedModel(lambda request: ModelReply(content="-")))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _postgres_url() -> str:
    url = os.environ.get("WORLD_TEST_POSTGRES_URL")
    if url:
        return url
    required = {name.strip() for name in os.environ.get("WORLD_REQUIRE", "").split(",")}
    if required & {"postgres", "all"}:
        pytest.fail("WORLD_REQUIRE names postgres but WORLD_TEST_POSTGRES_URL is not set")
    pytest.skip("set WORLD_TEST_POSTGRES_URL to run against PostgreSQL")


@pytest.fixture(params=["local", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    if request.param == "local":
        return "local", str(tmp_path / "world")
    return "postgres", _postgres_url()


async def _opened(target: tuple[str, str]) -> AsyncIterator[World]:
    name, url = target
    namespace = f"history_{uuid.uuid4().hex[:12]}"
    async with open_world(name, url=url, namespace=namespace) as world:
        try:
            yield world
        finally:
            await world.purge()


@pytest.fixture
async def source(target: tuple[str, str]) -> AsyncIterator[World]:
    async for world in _opened(target):
        yield world


@pytest.fixture
async def copy(target: tuple[str, str]) -> AsyncIterator[World]:
    async for world in _opened(target):
        yield world


async def _record(world: World) -> None:
    """A session with blob-stored values of every kind, and events that are not the journal's."""
    client = Client(world, blob_threshold=THRESHOLD)
    await client.submit(SESSION, LONG_MESSAGE, turn_id="t1")  # the input: a blob
    journal = await Journal.open(world, SESSION, "t1", blob_threshold=THRESHOLD)
    reply = await build().run_turn(journal)  # lookup's result (over 1 KiB): a blob outcome
    assert reply == f"{len(NOTE)} characters"
    await write_state(world, SESSION, "plan", {"text": NOTE}, threshold=THRESHOLD)
    await client.submit(SESSION, SURROGATE, turn_id="t2")
    await world.log.append(
        session_log_id(SESSION),
        [
            NewEvent(data=b"a note, not JSON"),
            NewEvent(data=b"\x00\xff binary", key="raw/binary"),
            NewEvent(data=b'{"b": 1, "a": 2}', key="raw/json-not-canonical"),
            NewEvent(data=b""),
        ],
    )


async def test_export_and_import_keep_every_event_and_blob(
    source: World, copy: World, tmp_path: Path
) -> None:
    await _record(source)
    history = await read_history(source, SESSION)
    assert len(history.blobs) == 3  # the long input, lookup's outcome, the state value
    exported = tmp_path / "history.json"
    exported.write_text(dump_history([history]), encoding="utf-8")

    document: dict[str, Any] = json.loads(exported.read_text(encoding="utf-8"))
    assert document["format"] == HISTORY_FORMAT
    events = document["sessions"][0]["events"]
    encodings = {event["key"]: event["encoding"] for event in events}
    assert encodings["turn/t1/input"] == "json"
    assert events[0]["data"]["blob"]["size"] > THRESHOLD  # a journal event, readable as JSON
    assert encodings["turn/t2/input"] == "json"  # with its escaped surrogate
    assert encodings["raw/binary"] == "base64"
    assert encodings["raw/json-not-canonical"] == "utf-8"  # as JSON, its bytes would change
    unkeyed = [(e["encoding"], e["data"]) for e in events if e["key"] is None]
    assert unkeyed[-2:] == [("utf-8", "a note, not JSON"), ("utf-8", "")]
    assert unkeyed[0][0] == "json"  # the state written with write_state

    [loaded] = load_history_file(exported)
    assert loaded.session_id == SESSION
    assert loaded.source == str(exported)
    assert loaded.events == history.events
    assert dict(loaded.blobs) == dict(history.blobs)

    await write_history(copy, loaded)
    original = await source.log.read(session_log_id(SESSION))
    imported = await copy.log.read(session_log_id(SESSION))
    assert [(e.seq, e.key, e.data) for e in imported] == [(e.seq, e.key, e.data) for e in original]
    for digest, data in history.blobs.items():  # the imported session's own blobs
        assert (
            await session_blobs(copy, SESSION).get(BlobRef(digest=digest, size=len(data))) == data
        )
        assert not (await copy.stream.info(BlobRef(digest=digest, size=0).stream_id)).closed
    # The journal reads the copy as it read the original: messages, replies, state.
    journal = await Journal.open(copy, SESSION, "t2")
    assert journal.history == [(LONG_MESSAGE, f"{len(NOTE)} characters")]
    assert journal.user_message == SURROGATE
    assert await read_state(copy, SESSION, "plan") == {"text": NOTE}
    report = await replay_check([loaded], build)
    assert [(t.turn_id, t.status) for t in report.turns()] == [
        ("t1", "consistent"),
        ("t2", "prefix"),
    ]


async def test_a_session_without_events_is_not_exported(source: World) -> None:
    with pytest.raises(NotFoundError, match="session 'nobody' has no events in namespace"):
        await read_history(source, "nobody")


async def test_a_history_is_imported_into_an_empty_session_only(source: World, copy: World) -> None:
    await _record(source)
    history = await read_history(source, SESSION)
    await copy.log.append(session_log_id(SESSION), [NewEvent(data=b"x")])
    with pytest.raises(InvalidArgumentError, match="already has 1 events"):
        await write_history(copy, history)


def _document() -> dict[str, Any]:
    blob = b'"a blob value"'
    digest = __import__("hashlib").sha256(blob).hexdigest()
    body = {
        "t": "input",
        "turn": "t1",
        "digest": "d",
        "blob": {"digest": digest, "size": len(blob)},
    }
    return {
        "format": HISTORY_FORMAT,
        "sessions": [
            {
                "session_id": "s",
                "status": None,
                "events": [{"seq": 1, "key": "turn/t1/input", "encoding": "json", "data": body}],
                "blobs": {digest: base64.b64encode(blob).decode()},
            }
        ],
    }


def test_a_valid_document_parses() -> None:
    [history] = parse_history(_document(), "doc.json")
    assert (
        history.events[0].data
        == json.dumps(
            _document()["sessions"][0]["events"][0]["data"], sort_keys=True, separators=(",", ":")
        ).encode()
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(format="world-history/0"), "format 'world-history/0' is not"),
        (lambda d: d.pop("sessions"), "'sessions' is missing"),
        (lambda d: d["sessions"][0].update(session_id=""), "must not be empty"),
        (lambda d: d["sessions"][0].update(events=[]), "no events"),
        (
            lambda d: d["sessions"][0]["events"].append(dict(d["sessions"][0]["events"][0])),
            "seq 1 does not follow the one before",
        ),
        (
            lambda d: d["sessions"][0]["events"][0].update(encoding="hex"),
            "encoding must be 'json', 'utf-8' or 'base64'",
        ),
        (
            lambda d: d["sessions"][0]["events"][0].update(encoding="base64", data="%%"),
            "data is not base64",
        ),
        (
            lambda d: d["sessions"][0].update(
                blobs={k: base64.b64encode(b"altered").decode() for k in d["sessions"][0]["blobs"]}
            ),
            "does not match its digest",
        ),
        (lambda d: d["sessions"][0].update(blobs={}), "which is not in the file"),
    ],
)
def test_a_damaged_document_is_refused_naming_the_place(change: Any, message: str) -> None:
    document = _document()
    change(document)
    with pytest.raises(InvalidArgumentError, match=message) as caught:
        parse_history(document, "doc.json")
    assert str(caught.value).startswith("doc.json")


def test_a_file_that_is_not_a_history_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.json"
    path.write_text("not json", encoding="utf-8")
    with pytest.raises(InvalidArgumentError, match=r"notes\.json: not JSON"):
        load_history_file(path)
    with pytest.raises(InvalidArgumentError, match=r"missing\.json: cannot be read"):
        load_history_file(tmp_path / "missing.json")
    path.write_text("[]", encoding="utf-8")
    with pytest.raises(InvalidArgumentError, match="not a world history"):
        load_history_file(path)
