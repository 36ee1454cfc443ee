"""The MongoDB World backend: logs, queues and streams on pymongo's AsyncMongoClient.

Works on a standalone mongod (no transactions, no change streams); uses change streams for
wake-ups where a replica set offers them. Open it through ``world_core.open_world`` with
``WORKFLOW_TARGET_WORLD=mongo`` and ``WORKFLOW_MONGO_URL``, or directly::

    world = await connect(url="mongodb://127.0.0.1:27017/app", namespace="default")
"""

from world_mongo._world import (
    CONNECT_TIMEOUT_VARIABLE,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_DATABASE,
    URL_VARIABLE,
    MongoWorld,
    connect,
)

__all__ = [
    "CONNECT_TIMEOUT_VARIABLE",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_DATABASE",
    "URL_VARIABLE",
    "MongoWorld",
    "connect",
]
