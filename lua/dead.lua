-- dead.lua: read the oldest dead letters of queue N.
--
-- KEYS[1]  redwheel:{N}:dead      ZSET  id -> when it died (epoch ms)
-- KEYS[2]  redwheel:{N}:msg       HASH  id -> "<due ms>:<payload>"
-- KEYS[3]  redwheel:{N}:reason    HASH  id -> why it died
-- KEYS[4]  redwheel:{N}:attempts  HASH  id -> deliveries so far
-- ARGV[1]  the most to return (>= 1)
--
-- Reply: { id, value, reason, attempts, died_ms, … } oldest first; value is the stored
--        "<due ms>:<payload>", reason "" and attempts 0 when unknown.
--
-- Invariant: read-only.
local ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
local out = {}
for i = 1, #ids, 2 do
  local id = ids[i]
  local v = redis.call('HGET', KEYS[2], id)
  if v then
    out[#out + 1] = id
    out[#out + 1] = v
    out[#out + 1] = redis.call('HGET', KEYS[3], id) or ''
    out[#out + 1] = tonumber(redis.call('HGET', KEYS[4], id) or '0')
    out[#out + 1] = tonumber(ids[i + 1])
  end
end
return out
