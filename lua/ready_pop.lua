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

-- Reply records (queue/request.rs). Each take or claim call is a request: a record key of
-- its own slot (KEYS, a STRING with a TTL: "<request number>:<cmsgpack of the list>") and a
-- request number that grows within the slot. A request sent again after its reply was lost
-- must answer what it did the first time, never hand out more. (Only the process that owns
-- a slot writes or reads its record, so the record's format is that process's own.)
--
-- replay(record, seq) returns:
--   nil        no record of this request: run it (the slot's record, if any, is older);
--   false      the record is of a later request of the slot: this is an old attempt of an
--              earlier call, reaching Redis late; do nothing;
--   r          this very request ran before: r is what remember() stored, answer from it.
-- Only the request number is parsed unless it is this request's: the common call (a newer
-- request than the record) unpacks nothing.
local function replay(record, seq)
  local packed = redis.call('GET', record)
  if not packed then
    return nil
  end
  local colon = string.find(packed, ':', 1, true)
  local rseq = tonumber(string.sub(packed, 1, colon - 1))
  if rseq == seq then
    return cmsgpack.unpack(string.sub(packed, colon + 1))
  end
  if rseq > seq then
    return false
  end
  return nil
end

-- remember(record, r, ttl) stores r (a list whose first element is the request number) as
-- the slot's reply record for ttl ms, replacing the slot's previous one: one SET with PX.
local function remember(record, r, ttl)
  redis.call('SET', record, string.format('%d', r[1]) .. ':' .. cmsgpack.pack(r), 'PX', ttl)
end
