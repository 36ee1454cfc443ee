"""The PostgreSQL World: log, queue and stream in one schema per namespace, through asyncpg.

    world = await world_postgres.connect(url="postgresql://...", namespace="default")

Select it with ``WORKFLOW_TARGET_WORLD=postgres``; settings are documented on :func:`connect`.
"""

from world_postgres._world import PostgresWorld, connect

__all__ = ["PostgresWorld", "connect"]
