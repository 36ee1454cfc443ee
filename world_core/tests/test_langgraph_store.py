"""WorldStore, LangGraph's long-term memory store on a World: items, search, namespaces on
every backend (contract area ``langgraph``), a graph using it and its refusals on local."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from langgraph.config import get_store
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.store.base import InvalidNamespaceError, MatchCondition

from world_conformance import ContractBase
from world_core import InvalidArgumentError, World, open_world
from world_core.integrations.langgraph import WorldCheckpointSaver, WorldStore


class _StoreContract(ContractBase):
    contract_area = "langgraph"

    async def test_store_items_are_put_updated_read_and_deleted(self, world: World) -> None:
        store = WorldStore(world)
        assert await store.aget(("users", "ada"), "prefs") is None
        await store.aput(("users", "ada"), "prefs", {"theme": "dark", "n": 1})
        first = await store.aget(("users", "ada"), "prefs")
        assert first is not None
        assert (first.namespace, first.key, first.value) == (
            ("users", "ada"),
            "prefs",
            {"theme": "dark", "n": 1},
        )
        await anyio.sleep(0.01)
        await store.aput(("users", "ada"), "prefs", {"theme": "light"})
        second = await store.aget(("users", "ada"), "prefs")
        assert second is not None
        assert second.value == {"theme": "light"}
        assert second.created_at == first.created_at
        assert second.updated_at > first.updated_at
        assert await store.aget(("users",), "prefs") is None  # another namespace
        odd = ("a/b", "100%")  # separators and escapes are data
        await store.aput(odd, "x/y", {"ok": True})
        found = await store.aget(odd, "x/y")
        assert found is not None
        assert (found.namespace, found.key) == (odd, "x/y")
        assert await store.aget(("a", "b", "100%"), "x/y") is None
        await store.adelete(("users", "ada"), "prefs")
        assert await store.aget(("users", "ada"), "prefs") is None

    async def test_store_search_by_prefix_filter_offset_and_limit(self, world: World) -> None:
        store = WorldStore(world)
        for user, age in [("ada", 36), ("bob", 17), ("cy", 52)]:
            await store.aput(("people", user), "card", {"age": age, "tags": {"vip": age > 40}})
        await store.aput(("other",), "card", {"age": 99})
        everyone = await store.asearch(("people",))
        assert [i.namespace for i in everyone] == [
            ("people", "ada"),
            ("people", "bob"),
            ("people", "cy"),
        ]
        assert all(i.score is None for i in everyone)
        adults = await store.asearch(("people",), filter={"age": {"$gte": 18}})
        assert [i.namespace[1] for i in adults] == ["ada", "cy"]
        vips = await store.asearch(("people",), filter={"tags": {"vip": True}})
        assert [i.namespace[1] for i in vips] == ["cy"]
        page = await store.asearch(("people",), offset=1, limit=1)
        assert [i.namespace[1] for i in page] == ["bob"]
        assert await store.asearch(("nobody",)) == []

    async def test_store_lists_namespaces_by_prefix_suffix_and_depth(self, world: World) -> None:
        store = WorldStore(world)
        for namespace in [("a", "x", "1"), ("a", "y", "1"), ("b", "x", "1"), ("a", "x", "2")]:
            await store.aput(namespace, "k", {"v": 1})
        assert await store.alist_namespaces(prefix=("a",)) == [
            ("a", "x", "1"),
            ("a", "x", "2"),
            ("a", "y", "1"),
        ]
        assert await store.alist_namespaces(prefix=("*", "x")) == [
            ("a", "x", "1"),
            ("a", "x", "2"),
            ("b", "x", "1"),
        ]
        assert await store.alist_namespaces(suffix=("1",), max_depth=2) == [
            ("a", "x"),
            ("a", "y"),
            ("b", "x"),
        ]
        assert await store.alist_namespaces(limit=1, offset=1) == [("a", "x", "2")]
        condition = MatchCondition(match_type="prefix", path=("b",))
        assert await store.abatch([]) == []
        assert len(await store.alist_namespaces(prefix=condition.path)) == 1


class TestLocalStore(_StoreContract):
    world_name = "local"


class TestPostgresStore(_StoreContract):
    world_name = "postgres"


class TestRedisStore(_StoreContract):
    world_name = "redis"


class TestMongoStore(_StoreContract):
    world_name = "mongo"


class TestTursoStore(_StoreContract):
    world_name = "turso"


# -- local only --------------------------------------------------------------------------------

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[World]:
    async with open_world("local", url=str(tmp_path / "world"), namespace="lg") as opened:
        yield opened


async def test_a_sync_graph_in_a_worker_thread_remembers_through_the_store(local: World) -> None:
    store = WorldStore(local)

    def remember(state: MessagesState) -> dict[str, Any]:
        memories = get_store()
        seen = memories.get(("users", "ada"), "visits")
        count = (seen.value["count"] if seen else 0) + 1
        memories.put(("users", "ada"), "visits", {"count": count})
        return {"messages": [("ai", f"visit {count}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("remember", remember)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", END)
    graph = builder.compile(checkpointer=WorldCheckpointSaver(local), store=store)

    def visit(thread: str) -> Any:
        return graph.invoke({"messages": []}, {"configurable": {"thread_id": thread}})

    await anyio.to_thread.run_sync(visit, "one")
    state = await anyio.to_thread.run_sync(visit, "two")
    assert state["messages"][-1].content == "visit 2"  # the second thread saw the first's
    assert await anyio.to_thread.run_sync(lambda: store.search(("users",))[0].value) == {"count": 2}


async def test_the_store_refuses_what_it_cannot_keep(local: World) -> None:
    store = WorldStore(local)
    with pytest.raises(NotImplementedError, match="TTL"):
        await store.aput(("users",), "k", {"v": 1}, ttl=5)
    with pytest.raises(InvalidArgumentError, match="JSON"):
        await store.aput(("users",), "k", {"v": {1, 2}})
    with pytest.raises(InvalidNamespaceError):
        await store.aput((), "k", {"v": 1})
    await store.aput(("users",), "k", {"v": 1})
    with pytest.raises(InvalidArgumentError, match="operator"):
        await store.asearch(("users",), filter={"v": {"$near": 1}})
    with pytest.raises(RuntimeError, match="event loop"):
        store.get(("users",), "k")  # on the loop's own thread
    with pytest.raises(InvalidArgumentError, match="World"):
        # why: the wrong type is the point: its refusal is tested
        WorldStore("local")  # type: ignore[arg-type]
