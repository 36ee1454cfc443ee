"""Server-side Lua: every multi-key operation is one script, so it is atomic on the server.

Scripts run with EVALSHA and fall back to EVAL on NOSCRIPT (a restarted server, a cluster node
that never saw the script); EVAL caches the script on that node again. Redis 7 replicates a
script's effects, not the script, so ``TIME`` may be called before writes.

Key layout passed in ``KEYS`` (see ``_keys``); all keys of one script share one hash tag.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

__all__ = ["Script"]


@dataclass(frozen=True)
class Script:
    """A Lua script and its SHA-1, for EVALSHA."""

    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


# Shared helpers. Times are integer microseconds of the server clock.
_PRELUDE = r"""
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function fmt(n) return string.format('%d', n) end
-- One command over many arguments (HSET key f v f v ..., ZREM key m m ...), in slices that
-- stay far below Lua's unpack limit; returns the sum of integer replies.
local function bulk(cmd, key, args, step)
  local total = 0
  for i = 1, #args, step do
    local r = redis.call(cmd, key, unpack(args, i, math.min(i + step - 1, #args)))
    if type(r) == 'number' then total = total + r end
  end
  return total
end
-- HMGET over any number of fields, in slices.
local function mget(key, fields)
  local out = {}
  for i = 1, #fields, 500 do
    local part = redis.call('HMGET', key, unpack(fields, i, math.min(i + 499, #fields)))
    for j = 1, #part do out[#out + 1] = part[j] end
  end
  return out
end
"""

# Queue keys, 10 from offset b: V visible/delayed zset (score: visible-at), L leased zset
# (score: deadline), Z dead zset (score: dead-at), P payloads, S state "attempts:max:token",
# DK id -> dedup key, DD dedup key -> id (live messages only), N id/token counter,
# G wake-up signal list, R dead reasons.
_QUEUE = r"""
local function qk(b)
  return {V=KEYS[b], L=KEYS[b+1], Z=KEYS[b+2], P=KEYS[b+3], S=KEYS[b+4], DK=KEYS[b+5],
          DD=KEYS[b+6], N=KEYS[b+7], G=KEYS[b+8], R=KEYS[b+9]}
end
local function q_signal(q, count)
  -- One token per message made visible wakes one BLPOP waiter each; the list stays short.
  local tokens = {}
  for i = 1, math.min(count or 1, 64) do tokens[i] = '1' end
  redis.call('LPUSH', q.G, unpack(tokens))
  redis.call('LTRIM', q.G, 0, 63)
end
local function q_state(q, id)
  local s = redis.call('HGET', q.S, id)
  if not s then return nil end
  local a, x, t = string.match(s, '^(%d+):(%d+):(.*)$')
  return tonumber(a), tonumber(x), t
end
local function q_free_dedup(q, id)
  local k = redis.call('HGET', q.DK, id)
  if k and redis.call('HGET', q.DD, k) == id then redis.call('HDEL', q.DD, k) end
end
local function q_dead(q, now, id, a, x, reason)
  redis.call('ZREM', q.V, id)
  redis.call('ZREM', q.L, id)
  redis.call('ZADD', q.Z, now, id)
  redis.call('HSET', q.S, id, a .. ':' .. x .. ':')
  redis.call('HSET', q.R, id, reason)
  q_free_dedup(q, id)
end
local function q_enqueue(q, now, payload, delay, dedup, maxa, nonce)
  -- Returns the id, and whether the message is new (not an existing one's dedup key); the
  -- caller signals waiters.
  if dedup ~= '' then
    local existing = redis.call('HGET', q.DD, dedup)
    if existing then return existing, false end
  end
  -- The padded counter orders ties of visible-at by enqueue order; the caller's random
  -- nonce makes ids unique across queues too.
  local id = string.format('%016d', redis.call('INCR', q.N)) .. '-' .. nonce
  redis.call('HSET', q.P, id, payload)
  redis.call('HSET', q.S, id, '0:' .. maxa .. ':')
  if dedup ~= '' then
    redis.call('HSET', q.DK, id, dedup)
    redis.call('HSET', q.DD, dedup, id)
  end
  redis.call('ZADD', q.V, now + tonumber(delay), id)
  return id, true
end
"""

ENQUEUE = Script(
    "enqueue",
    _PRELUDE
    + _QUEUE
    + r"""
-- ARGV: messages of 5 arguments each: payload, delay_us, dedup ('' none), max_attempts,
-- nonce. Returns their ids, in order (a batch of concurrent enqueues, see _pipe).
local q = qk(1)
local now = now_us()
local n = #ARGV / 5
local out = {}
local plain = true
for i = 3, #ARGV, 5 do
  if ARGV[i] ~= '' then plain = false break end
end
if plain then
  -- No dedup keys: reserve n ids at once and write each structure with one command.
  local first = redis.call('INCRBY', q.N, n) - n
  local p, st, v = {}, {}, {}
  for j = 1, n do
    local i = 5 * j - 4
    local id = string.format('%016d', first + j) .. '-' .. ARGV[i + 4]
    out[j] = id
    p[#p + 1] = id
    p[#p + 1] = ARGV[i]
    st[#st + 1] = id
    st[#st + 1] = '0:' .. ARGV[i + 3] .. ':'
    v[#v + 1] = now + tonumber(ARGV[i + 1])
    v[#v + 1] = id
  end
  bulk('HSET', q.P, p, 1000)
  bulk('HSET', q.S, st, 1000)
  bulk('ZADD', q.V, v, 1000)
  q_signal(q, n)
  return out
end
local fresh = 0
for i = 1, #ARGV, 5 do
  local id, new = q_enqueue(q, now, ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4])
  out[#out + 1] = id
  if new then fresh = fresh + 1 end
end
if fresh > 0 then q_signal(q, fresh) end
return out
""",
)

CLAIM = Script(
    "claim",
    _PRELUDE
    + _QUEUE
    + r"""
-- ARGV: lease_us, limit. Returns {deadline, wait_us, id, payload, attempt, max, token, ...};
-- wait_us is -1 when nothing is pending, else how long until the next message may be visible.
local q = qk(1)
local now = now_us()
-- Expired leases become visible again at their deadline (bounded sweep per call).
local exp = redis.call('ZRANGE', q.L, '-inf', now, 'BYSCORE', 'LIMIT', 0, 1000, 'WITHSCORES')
if #exp > 0 then
  local back, gone = {}, {}
  for i = 1, #exp, 2 do
    back[#back + 1] = exp[i + 1]
    back[#back + 1] = exp[i]
    gone[#gone + 1] = exp[i]
  end
  bulk('ZADD', q.V, back, 1000)
  bulk('ZREM', q.L, gone, 500)
end
local limit = tonumber(ARGV[2])
local deadline = now + tonumber(ARGV[1])
local out = {deadline, 0}
local got = 0
while got < limit do
  local ids = redis.call('ZRANGE', q.V, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit - got)
  if #ids == 0 then break end
  local states = mget(q.S, ids)
  local live, attempts, maxes = {}, {}, {}
  for j, id in ipairs(ids) do
    local a, x = string.match(states[j], '^(%d+):(%d+):')
    a, x = tonumber(a), tonumber(x)
    if a >= x then
      q_dead(q, now, id, a, x, 'delivered ' .. a .. ' times, max_attempts is ' .. x)
    else
      live[#live + 1] = id
      attempts[#attempts + 1] = a + 1
      maxes[#maxes + 1] = x
    end
  end
  if #live > 0 then
    local first = redis.call('INCRBY', q.N, #live) - #live
    local st, leased = {}, {}
    for j, id in ipairs(live) do
      st[#st + 1] = id
      st[#st + 1] = attempts[j] .. ':' .. maxes[j] .. ':' .. fmt(first + j)
      leased[#leased + 1] = deadline
      leased[#leased + 1] = id
    end
    bulk('HSET', q.S, st, 1000)
    bulk('ZREM', q.V, live, 500)
    bulk('ZADD', q.L, leased, 1000)
    local payloads = mget(q.P, live)
    for j, id in ipairs(live) do
      out[#out + 1] = id
      out[#out + 1] = payloads[j]
      out[#out + 1] = attempts[j]
      out[#out + 1] = maxes[j]
      out[#out + 1] = fmt(first + j)
    end
    got = got + #live
  end
end
if got == 0 then
  local nxt = -1
  local v1 = redis.call('ZRANGE', q.V, 0, 0, 'WITHSCORES')
  local l1 = redis.call('ZRANGE', q.L, 0, 0, 'WITHSCORES')
  if #v1 > 0 then nxt = tonumber(v1[2]) end
  if #l1 > 0 and (nxt < 0 or tonumber(l1[2]) < nxt) then nxt = tonumber(l1[2]) end
  if nxt >= 0 then nxt = math.max(nxt - now, 0) end
  out[2] = nxt
end
return out
""",
)

RENEW = Script(
    "renew",
    _PRELUDE
    + _QUEUE
    + r"""
-- ARGV: id, token, duration_us. Returns the new deadline, or -1 when the token is not current.
local q = qk(1)
local a, x, t = q_state(q, ARGV[1])
if not a or t == '' or t ~= ARGV[2] then return -1 end
local deadline = now_us() + tonumber(ARGV[3])
-- An expired lease may have been swept back to visible; nobody claimed it, so take it back.
redis.call('ZREM', q.V, ARGV[1])
redis.call('ZADD', q.L, deadline, ARGV[1])
return deadline
""",
)

ACK = Script(
    "ack",
    _PRELUDE
    + _QUEUE
    + r"""
-- ARGV: leases of 2 arguments each: id, token. Returns for each 1, or 0 when its token is
-- not current (a batch of concurrent acks, see _pipe; a second ack of one lease gets 0).
local q = qk(1)
local ids = {}
for i = 1, #ARGV, 2 do ids[#ids + 1] = ARGV[i] end
local states = mget(q.S, ids)
local dedups = mget(q.DK, ids)
local out, done, seen = {}, {}, {}
for j, id in ipairs(ids) do
  local s = states[j]
  local t = s and string.match(s, '^%d+:%d+:(.*)$')
  if t and t ~= '' and t == ARGV[2 * j] and not seen[id] then
    seen[id] = true
    done[#done + 1] = id
    out[j] = 1
    local k = dedups[j]
    if k then
      if redis.call('HGET', q.DD, k) == id then redis.call('HDEL', q.DD, k) end
      redis.call('HDEL', q.DK, id)
    end
  else
    out[j] = 0
  end
end
if #done > 0 then
  -- An expired lease may have been swept back to visible: the ack still wins.
  if bulk('ZREM', q.L, done, 500) < #done then bulk('ZREM', q.V, done, 500) end
  bulk('HDEL', q.P, done, 500)
  bulk('HDEL', q.S, done, 500)
end
return out
""",
)

RELEASE = Script(
    "release",
    _PRELUDE
    + _QUEUE
    + r"""
-- ARGV: id, token, delay_us. Returns 1, or 0 when the token is not current.
local q = qk(1)
local id = ARGV[1]
local a, x, t = q_state(q, id)
if not a or t == '' or t ~= ARGV[2] then return 0 end
local now = now_us()
if a >= x then
  q_dead(q, now, id, a, x, 'released after delivery ' .. a .. ' of max_attempts ' .. x)
  return 1
end
redis.call('ZREM', q.L, id)
redis.call('HSET', q.S, id, a .. ':' .. x .. ':')
redis.call('ZADD', q.V, now + tonumber(ARGV[3]), id)
q_signal(q)
return 1
""",
)

DEAD_LETTERS = Script(
    "dead_letters",
    _PRELUDE
    + _QUEUE
    + r"""
-- ARGV: limit. Returns {id, payload, attempts, reason, ...}, oldest first.
local q = qk(1)
local out = {}
for _, id in ipairs(redis.call('ZRANGE', q.Z, 0, tonumber(ARGV[1]) - 1)) do
  local a = q_state(q, id)
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', q.P, id)
  out[#out + 1] = a
  out[#out + 1] = redis.call('HGET', q.R, id) or ''
end
return out
""",
)

REQUEUE = Script(
    "requeue",
    _PRELUDE
    + _QUEUE
    + r"""
-- ARGV: id. Returns 1, or 0 when there is no such dead letter.
local q = qk(1)
local id = ARGV[1]
if not redis.call('ZSCORE', q.Z, id) then return 0 end
local a, x = q_state(q, id)
redis.call('ZREM', q.Z, id)
redis.call('HDEL', q.R, id)
redis.call('HSET', q.S, id, '0:' .. x .. ':')
local k = redis.call('HGET', q.DK, id)
-- Take the dedup key back only if no other live message holds it meanwhile.
if k then redis.call('HSETNX', q.DD, k, id) end
redis.call('ZADD', q.V, now_us(), id)
q_signal(q)
return 1
""",
)

_APPEND_BODY = r"""
-- ARGV: expect_tail ('' none), status ('' none), log_id, n, n*(key ('' none), data)
--       [, m, m*(payload, delay_us, dedup, max_attempts, nonce)]: the outbox variant only,
--       its queue keys from KEYS[6], 10 each. Indexed (single node) when KEYS[4], KEYS[5] are
--       given: the namespace registry and status index.
local X, K, M = KEYS[1], KEYS[2], KEYS[3]
local tail = redis.call('XLEN', X)
if ARGV[1] ~= '' and tonumber(ARGV[1]) ~= tail then return {'conflict', tail} end
local n = tonumber(ARGV[4])
for i = 0, n - 1 do
  local key = ARGV[5 + 2 * i]
  if key ~= '' then
    local seq = redis.call('HGET', K, key)
    if seq then
      local e = redis.call('XRANGE', X, seq .. '-0', seq .. '-0')
      return {'dup', key, tonumber(seq), e[1][2][2]}
    end
  end
end
for i = 0, n - 1 do
  local key, data = ARGV[5 + 2 * i], ARGV[6 + 2 * i]
  local id = fmt(tail + i + 1) .. '-0'
  if key ~= '' then
    redis.call('XADD', X, id, 'd', data, 'k', key)
    redis.call('HSET', K, key, tail + i + 1)
  else
    redis.call('XADD', X, id, 'd', data)
  end
end
local status, log_id, indexed = ARGV[2], ARGV[3], #KEYS >= 5
if status ~= '' then
  local old = redis.call('HGET', M, 'st')
  redis.call('HSET', M, 'st', status)
  if indexed and old ~= status then
    if old then redis.call('ZREM', KEYS[5], old .. '\0' .. log_id) end
    redis.call('ZADD', KEYS[5], 0, status .. '\0' .. log_id)
  end
end
local registered = 1
if indexed then
  if tail == 0 then redis.call('ZADD', KEYS[4], 0, log_id) end
elseif not redis.call('HGET', M, 'r') then
  registered = 0
end
"""

_OUTBOX = r"""
local pos = 5 + 2 * n
local m = tonumber(ARGV[pos])
if m > 0 then
  local now = now_us()
  for j = 0, m - 1 do
    local p = pos + 1 + 5 * j
    local q = qk(6 + 10 * j)
    local _, new = q_enqueue(q, now, ARGV[p], ARGV[p + 1], ARGV[p + 2], ARGV[p + 3], ARGV[p + 4])
    if new then q_signal(q) end
  end
end
"""

_APPEND_RETURN = r"""
return {'ok', tail + n, registered}
"""

# Log keys: X the events (a Redis stream, entry id "<seq>-0", fields d=data [k=key]),
# K key -> seq, M meta (st: status, r: registered in the namespace registry, cluster only).
# On a single node KEYS[4], KEYS[5] are the namespace registry and status index and are
# updated in the same script; in a cluster they live in other slots (see _log).
APPEND = Script("append", _PRELUDE + _APPEND_BODY + _APPEND_RETURN)
APPEND_OUTBOX = Script("append_outbox", _PRELUDE + _QUEUE + _APPEND_BODY + _OUTBOX + _APPEND_RETURN)

LOG_GET = Script(
    "log_get",
    r"""
-- KEYS: X, K. ARGV: key. Returns {seq, data} or nil.
local seq = redis.call('HGET', KEYS[2], ARGV[1])
if not seq then return nil end
local e = redis.call('XRANGE', KEYS[1], seq .. '-0', seq .. '-0')
if #e == 0 then return nil end
return {tonumber(seq), e[1][2][2]}
""",
)

LOG_INFO = Script(
    "log_info",
    r"""
-- KEYS: X, M. Returns {tail, status or nil}.
return {redis.call('XLEN', KEYS[1]), redis.call('HGET', KEYS[2], 'st')}
""",
)

LOG_DELETE = Script(
    "log_delete",
    r"""
-- KEYS: X, K, M [, registry, status index]. ARGV: log_id, indexed.
local st = redis.call('HGET', KEYS[3], 'st')
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
if ARGV[2] == '1' then
  redis.call('ZREM', KEYS[4], ARGV[1])
  if st then redis.call('ZREM', KEYS[5], st .. '\0' .. ARGV[1]) end
end
return 1
""",
)

LOG_MARK_REGISTERED = Script(
    "log_mark_registered",
    r"""
-- KEYS: X, M. Cluster only: the registry entry was written after the append committed.
-- Marking a log that was deleted meanwhile would hide its next incarnation from repair.
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[2], 'r', '1') end
return 1
""",
)

# Stream keys: X the chunks (a Redis stream, chunk index i at entry id "<i+1>-0", field d; a
# close adds one last entry with field c), M meta (n: next index, c: closed).
STREAM_WRITE = Script(
    "stream_write",
    _PRELUDE
    + r"""
-- ARGV: expect_next ('' none), chunks... Returns {'ok', next} | {'closed'} | {'conflict', next}.
if redis.call('HGET', KEYS[2], 'c') then return {'closed'} end
local n = tonumber(redis.call('HGET', KEYS[2], 'n') or '0')
if ARGV[1] ~= '' and tonumber(ARGV[1]) ~= n then return {'conflict', n} end
for i = 2, #ARGV do
  redis.call('XADD', KEYS[1], fmt(n + i - 1) .. '-0', 'd', ARGV[i])
end
n = n + #ARGV - 1
redis.call('HSET', KEYS[2], 'n', n)
return {'ok', n}
""",
)

STREAM_CLOSE = Script(
    "stream_close",
    _PRELUDE
    + r"""
-- KEYS: X, M. The close marker wakes blocked readers through the same XREAD they wait on.
if redis.call('HGET', KEYS[2], 'c') then return 0 end
local n = tonumber(redis.call('HGET', KEYS[2], 'n') or '0')
redis.call('XADD', KEYS[1], fmt(n + 1) .. '-0', 'c', '1')
redis.call('HSET', KEYS[2], 'c', '1', 'n', n)
return 1
""",
)
