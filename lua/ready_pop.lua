-- ready_pop.lua: not a script of its own. scripts.rs puts these functions in front of
-- take.lua and claim.lua (after lifecycle.lua), the two scripts that hand out ready
-- messages, so they apply the queue's controls, skip the same entries, check a ttl the
-- same way and answer a resent request the same way.
--
-- pop_ready(ready, msg, stale, any_stale, prioritized) pops the next message to hand out:
-- first the head of `prioritized` (ZSET of due messages of priority 1..9, by band and due
-- time; nil when the queue never had a priority > 0), then the head of `ready` (LIST). It
-- returns:
--   nil                 nothing left;
--   id, false           an entry to drop: left by a message removed after its transfer
--                       (counted in `stale`, HASH id -> such entries; the count goes down
--                       by one), an id with no `msg` entry, or '' (the wake marker
--                       transfer.lua pushes so that consumers blocked on `ready` look at
--                       `prioritized`);
--   id, value           the message to hand out, its stored "<due ms>:<payload>".
-- and, third, true once `prioritized` was found empty (the caller stops looking there).
-- `stale` is looked up only when `any_stale` (the caller's EXISTS of it, once per call).
-- Entries left by a removed message come before any entry of the same id offered again:
-- every push onto `ready` is an RPUSH and every pop an LPOP. An id in `prioritized` is never
-- stale: whatever removes a message ZREMs it there.
local function pop_ready(ready, msg, stale, any_stale, prioritized)
  if prioritized then
    local z = redis.call('ZPOPMIN', prioritized)
    if z[1] then
      return z[1], redis.call('HGET', msg, z[1]) or false, false
    end
  end
  local id = redis.call('LPOP', ready)
  if not id then
    return nil, nil, prioritized ~= nil
  end
  if id == '' then
    return id, false, prioritized ~= nil
  end
  if any_stale then
    local n = redis.call('HGET', stale, id)
    if n then
      if n == '1' then
        redis.call('HDEL', stale, id)
      else
        redis.call('HINCRBY', stale, id, -1)
      end
      return id, false, prioritized ~= nil
    end
  end
  return id, redis.call('HGET', msg, id) or false, prioritized ~= nil
end

-- NO_CONTROLS: what HMGET of the controls gives for a queue without any (every field
-- absent), for callers that found no `controls` hash.
local NO_CONTROLS = { false, false, false, false, false, false }

-- now_us(): the server's TIME in µs (an exact integer in a double until year 2255).
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- gate(c, rate, now, mif_free): whether the queue's controls let a consumer have messages now,
-- and how many. `c` is HMGET of `controls` fields paused, rate_max, rate_per (ms); `rate` the
-- delivery log (ZSET, scores in µs); `now` the server time in µs; `mif_free` the free
-- in-flight slots (nil: no max_in_flight applies). Returns (0, budget) when open, budget nil
-- meaning "no rate or slot bound"; or (g, 0) when closed: g = -1 paused, -2 every in-flight
-- slot taken, g > 0 the µs until the rate window lets the next delivery through.
-- The log is pruned to the window (entries older than now - per go), so it never holds more
-- than rate_max entries.
local function gate(c, rate, now, mif_free)
  if c[1] then
    return -1, 0
  end
  local budget
  if mif_free then
    if mif_free <= 0 then
      return -2, 0
    end
    budget = mif_free
  end
  if c[2] then
    local max = tonumber(c[2])
    local per = tonumber(c[3]) * 1000
    redis.call('ZREMRANGEBYSCORE', rate, '-inf', string.format('%d', now - per))
    local free = max - redis.call('ZCARD', rate)
    if free <= 0 then
      local oldest = redis.call('ZRANGE', rate, 0, 0, 'WITHSCORES')
      return math.max(1, tonumber(oldest[2]) + per - now), 0
    end
    if not budget or free < budget then
      budget = free
    end
  end
  return 0, budget
end

-- log_deliveries(rate, now, prefix, n): n deliveries at `now` (µs) in the rate log, each a
-- member of its own (prefix .. ':' .. i; the prefix is unique to the calling script run).
local function log_deliveries(rate, now, prefix, n)
  local args = {}
  local score = string.format('%d', now)
  for i = 1, n do
    args[2 * i - 1] = score
    args[2 * i] = prefix .. ':' .. i
  end
  redis.call('ZADD', rate, unpack(args))
end

-- expired(expires, id, now_ms): for a message with a ttl (an entry in `expires`, ZSET id ->
-- the time by which it must be handed out), true when that time has passed: the caller makes
-- it a dead letter instead of handing it out. Otherwise its entry goes (it is being handed
-- out now, and a ttl only bounds the first hand-out) and false.
local function expired(expires, id, now_ms)
  local deadline = redis.call('ZSCORE', expires, id)
  if not deadline then
    return false
  end
  if tonumber(deadline) < now_ms then
    return true
  end
  redis.call('ZREM', expires, id)
  return false
end

-- Reply records (queue/request.rs). Each take or claim call is a request: a record key of
-- its own slot (KEYS, a HASH with one field 'r' and a TTL) and a request number that grows
-- within the slot. A request sent again after its reply was lost must answer what it did
-- the first time, never hand out more.
--
-- replay(record, seq) returns:
--   nil        no record of this request: run it (the slot's record, if any, is older);
--   false      the record is of a later request of the slot: this is an old attempt of an
--              earlier call, reaching Redis late; do nothing;
--   r          this very request ran before: r is what remember() stored, answer from it.
local function replay(record, seq)
  local packed = redis.call('HGET', record, 'r')
  if not packed then
    return nil
  end
  local r = cmsgpack.unpack(packed)
  if r[1] == seq then
    return r
  end
  if r[1] > seq then
    return false
  end
  return nil
end

-- remember(record, r, ttl) stores r (a list whose first element is the request number) as
-- the slot's reply record for ttl ms, replacing the slot's previous one.
local function remember(record, r, ttl)
  redis.call('HSET', record, 'r', cmsgpack.pack(r))
  redis.call('PEXPIRE', record, ttl)
end
