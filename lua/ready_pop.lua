-- ready_pop.lua: not a script of its own. scripts.rs puts these functions in front of
-- take.lua and claim.lua, the two scripts that hand out ready messages, so they skip the
-- same entries the same way and answer a resent request the same way.
--
-- pop_ready(ready, msg, stale, any_stale) pops the head of `ready` (LIST) and returns:
--   nil                 the list is empty;
--   id, false           an entry to drop: left by a message removed after its transfer
--                       (counted in `stale`, HASH id -> such entries; the count goes down
--                       by one) or an id with no `msg` entry;
--   id, value           the message to hand out, its stored "<due ms>:<payload>".
-- `stale` is looked up only when `any_stale` (the caller's EXISTS of it, once per call).
-- Entries left by a removed message come before any entry of the same id offered again:
-- every push onto `ready` is an RPUSH and every pop an LPOP.
local function pop_ready(ready, msg, stale, any_stale)
  local id = redis.call('LPOP', ready)
  if not id then
    return nil
  end
  if any_stale then
    local n = redis.call('HGET', stale, id)
    if n then
      if n == '1' then
        redis.call('HDEL', stale, id)
      else
        redis.call('HINCRBY', stale, id, -1)
      end
      return id, false
    end
  end
  return id, redis.call('HGET', msg, id)
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
