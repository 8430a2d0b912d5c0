-- offer_lib.lua: not a script of its own. scripts.rs puts these functions in front of the
-- three offer scripts (offer.lua, offer_batch.lua, offer_with.lua), so they compute a due
-- time and apply max_len one way.

-- due_at(how, value, now): a due time (ms) from 'r' (value is a delay added to now) or 'a'
-- (value is an epoch ms; a past one is clamped to now).
local function due_at(how, value, now)
  if how == 'r' then
    return now + tonumber(value)
  end
  return math.max(now, tonumber(value))
end

-- full(controls, msg, dead, adding): nil when `adding` more messages fit under the queue's
-- max_len (a field of `controls`; none: no bound), else the error reply to return, nothing
-- written. The length is HLEN msg - ZCARD dead: delayed, ready and in flight.
local function full(controls, msg, dead, adding)
  local max_len = redis.call('HGET', controls, 'max_len')
  if not max_len then
    return nil
  end
  local len = redis.call('HLEN', msg) - redis.call('ZCARD', dead)
  if len + adding > tonumber(max_len) then
    return redis.error_reply('ERR redwheel: queue full (' .. len .. ' of max_len ' .. max_len
      .. ', ' .. adding .. ' to add)')
  end
  return nil
end
