"""The Turso / libSQL World: logs, queues and streams in one libSQL database.

A local database file (several processes may share it), a remote libSQL server or Turso
database, or an embedded replica of one. Select it with ``WORKFLOW_TARGET_WORLD=turso`` and
``WORKFLOW_TURSO_URL``; see the README for every setting.
"""

from world_turso._world import TursoWorld, connect

__all__ = ["TursoWorld", "connect"]
