"""The Redis and Redis Cluster World (redis-py asyncio).

Open it with ``WORKFLOW_TARGET_WORLD=redis`` and ``WORKFLOW_REDIS_URL`` (``redis://``,
``rediss://``, ``unix://``; ``redis+cluster://host:port`` for Redis Cluster, or any cluster
node's ``redis://`` URL, which is detected). ``WORKFLOW_NAMESPACE`` is the key prefix
``world:<namespace>:``.

Layout: each log, queue and stream owns a few keys sharing one hash tag, the hex of its
identifier (``world:ns:log:{6162}:x``), so each lives in one cluster slot and no identifier can
break, escape or collide with another's tag. Logs and streams are Redis streams with entry
ids ``<seq>-0``; queues are sorted sets by visible-at time and lease deadline plus hashes.
Every multi-key change is one Lua script (EVALSHA, EVAL on NOSCRIPT); lease deadlines and
visibility times come from the server's ``TIME``.

Wake-ups: ``Log.watch`` and ``Stream.read`` block in ``XREAD BLOCK`` on the log's or stream's
own Redis stream (a stream close writes a marker entry that ends readers); ``Queue.claim(wait)``
blocks in ``BLPOP`` on the queue's signal list, which every enqueue, release and requeue pushes
to, with a timeout no later than the next delayed message or lease deadline. Blocking calls
use a second client with its own connections, so waiters never starve other calls.

Throughput: script calls are pipelined (``_pipe``). A call made while nothing is
on the wire is sent at once; calls made while others are on the wire wait for a round trip to
end (two at most are on the wire, each on a dedicated connection) and then go out together in
one write. Concurrent enqueues to one queue, and concurrent acks on one queue, become one script
call that handles each item as its own call would (its own id, its own fencing check, a second
ack of one lease refused). Results and errors stay per call; a call cancelled before it was sent
is never sent. Replies are parsed by hiredis. On a cluster each primary has its own pipe, chosen
from the cluster client's slot map; a call redirected (MOVED, ASK: it did not run) is sent again
through the cluster client, which follows the redirection and updates the map.

Redis Cluster: every script touches one slot. ``list_logs`` needs a namespace registry (a
sorted set); on a single node it and a status index are updated in the append's own script.
In a cluster the registry is another slot: it is written after the append commits, and the
log is marked registered only after that write succeeded, so a registry entry lost to a crash
in between is repaired by the log's next append (until then ``list_logs`` misses that log);
entries of deleted logs are never returned, because ``list_logs`` checks each entry against
the log's own keys, and in a cluster filters by status that way too (cost proportional to the
logs under the prefix). ``Capabilities.outbox`` is true on a single node only: in a cluster a
log and a queue are in different slots, and ``append(messages=...)`` raises UnsupportedError.

Durability is Redis' own; an acknowledged call is only as durable as the server's settings:

* ``appendonly no`` (with or without RDB snapshots): a restart loses everything written since
  the last snapshot, or everything without one. Logs can lose acknowledged events, queues can
  lose or resurrect messages. Fit for tests and caches only.
* ``appendonly yes``, ``appendfsync everysec`` (Redis' default for AOF): a process crash loses
  nothing, but a machine or power failure loses up to about one second of acknowledged writes.
* ``appendonly yes``, ``appendfsync always``: each write is fsynced before its reply, so an
  acknowledged append, enqueue, ack or stream write survives a restart or power loss. This is
  what production needs for crash-safe agents (a journal that forgets an intent after a crash
  can run a ``never`` tool twice). Replicas and failover add their own window: ``WAIT`` is not
  used, so a failover may lose writes the old primary acknowledged.

Whatever the persistence, set ``maxmemory-policy noeviction``: any evicting policy may drop a
log, queue or stream key silently. With ``noeviction`` a full server refuses writes, which
surface as BackendUnavailableError.

Quirk: ``Log.watch`` and ``Stream.read`` follow entry ids, so a watcher or reader that outlives
a ``delete`` of its log or stream does not see the re-created one until it passes its old
position; open a new watcher after deleting.

Calls never retry on their own: a dropped connection raises BackendUnavailableError and the
outcome of a write is then unknown (use ``expect_tail`` or event keys to retry safely).
"""

from world_redis._world import RedisWorld, connect

__all__ = ["RedisWorld", "connect"]
