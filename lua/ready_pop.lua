-- ready_pop.lua: not a script of its own. scripts.rs puts this function in front of
-- take.lua and claim.lua, the two scripts that hand out ready messages, so they skip the
-- same entries the same way.
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

