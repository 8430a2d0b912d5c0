-- schedule_read.lua: reads the schedules of queue N, all of them or those changed since a
-- version (how each process keeps its copy current; also Queue::schedules and the
-- inspector). Read-only. After schedule_lib.lua.
--
-- KEYS[1]  redwheel:{N}:schedules          HASH    name -> "<rev>:<paused>:<definition>"
-- KEYS[2]  redwheel:{N}:schedules:next     ZSET    name -> next occurrence (ms)
-- KEYS[3]  redwheel:{N}:schedules:last     HASH    name -> last occurrence fired (ms)
-- KEYS[4]  redwheel:{N}:schedules:changes  ZSET    name -> version of its last change
-- KEYS[5]  redwheel:{N}:head               HASH    `schedules`: "<version>:<earliest next>"
-- KEYS[6]  redwheel:{N}:schedules:payload  HASH    name -> payload
-- ARGV[1]  the version the caller's copy is at, or -1 for everything
-- ARGV[2]  'p' to include each schedule's payload, '' not to
--
-- Reply: { version, full, now, name, record, next, last[, payload], name, … }
--   version  the version read
--   full     1: every schedule follows (a schedule of the caller's copy that is not listed
--            is gone); 0: only those changed after ARGV[1] follow (ARGV[1] was recent
--            enough for `changes` to have every change since)
--   now      the server's TIME in ms
--   then per schedule: its name; its record "<rev>:<paused>:<definition>", or false when it
--   was removed; its next occurrence (ms) or false; its last occurrence fired or false;
--   and, with 'p', its payload (or false)
--   Nothing follows when ARGV[1] is the current version.
--
-- Invariant: one atomic read, so the copy a process builds from it is the state of one
-- instant, at the version returned. O(changes), or O(schedules) when full.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local version = sched_version(KEYS[5])
local known = tonumber(ARGV[1])
local out = { version, 0, now }
if known == version then
  return out
end
local with_payload = ARGV[2] == 'p'
local function emit(name, record, next, last)
  out[#out + 1] = name
  out[#out + 1] = record
  if next then
    next = string.format('%d', tonumber(next))
  end
  out[#out + 1] = next
  out[#out + 1] = last
  if with_payload then
    out[#out + 1] = redis.call('HGET', KEYS[6], name)
  end
end
if known < 0 or known > version or known < version - KEEP then
  -- Everything, in three reads rather than three per schedule.
  out[2] = 1
  local nexts, lasts = {}, {}
  local z = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  for i = 1, #z, 2 do
    nexts[z[i]] = z[i + 1]
  end
  local l = redis.call('HGETALL', KEYS[3])
  for i = 1, #l, 2 do
    lasts[l[i]] = l[i + 1]
  end
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    emit(all[i], all[i + 1], nexts[all[i]] or false, lasts[all[i]] or false)
  end
else
  local names = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. string.format('%d', known), '+inf')
  for _, name in ipairs(names) do
    emit(name, redis.call('HGET', KEYS[1], name), redis.call('ZSCORE', KEYS[2], name),
      redis.call('HGET', KEYS[3], name))
  end
end
return out
