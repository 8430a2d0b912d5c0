-- schedule_fire.lua: offers due occurrences of schedules of queue N and advances each
-- schedule, both in one step, only from the `next` the client planned from (the exactly-once
-- step of recurring schedules). After head.lua and schedule_lib.lua.
--
-- KEYS[1]  redwheel:{N}:schedules:next     ZSET    name -> next occurrence (ms)
-- KEYS[2]  redwheel:{N}:schedules:payload  HASH    name -> payload
-- KEYS[3]  redwheel:{N}:schedules:last     HASH    name -> last occurrence fired (ms)
-- KEYS[4]  redwheel:{N}:head               HASH    `schedules`: "<version>:<earliest next>";
--                                                  `due`: lower bound of every due (head.lua)
-- KEYS[5]  redwheel:{N}:delayed            ZSET    id -> due (ms)
-- KEYS[6]  redwheel:{N}:msg                HASH    id -> "<due ms>:<payload>"
-- ARGV[1]  the version of the definitions the client planned with
-- ARGV[2..] one group per schedule (the client sends at most 1,000 groups):
--          name, expected next (ms), settled (ms), new next (ms, or '' for none), k, then k
--          occurrences to fire (ms, oldest first; k may be 0)
--          "settled" is the latest due occurrence of the plan (fired or skipped by the
--          catch-up policy); the new next is the schedule's first occurrence after it.
--
-- Reply: { now, version, applied, fired, written, name, stored, name, stored, … }
--   now      the server's TIME (ms) this call judged by
--   version  the current version; when it is not ARGV[1], nothing was written and the reply
--            is { now, version, -1 }: the client reads the changed definitions first
--   applied  groups applied; fired: occurrences they fired; written: messages written (an
--            occurrence whose id is already a message of the queue is not written again)
--   then, per group refused: its name and the schedule's stored next (ms), or -1 when it
--   has none (paused, removed, finished). A group is refused when its expected next is not
--   the stored one (another process applied it, or the schedule changed) or when its
--   settled instant is later than `now` (the client's clock estimate ran ahead).
--
-- Invariant: an occurrence is offered only by the call that moves its schedule's `next`
-- past it, from the value the plan was made from, with the definitions of that plan: any
-- number of processes may fire the same schedule, retry after an unknown outcome, or die
-- between planning and applying, and each occurrence is offered at most once; one that is
-- due is offered by whichever call applies first. Each occurrence is the message
-- "sched:<name>:<occurrence ms>", due at the occurrence (so it is due at once), written as
-- offer.lua writes one; `head`'s `due` is lowered to it, so a transfer moves it even if this
-- process dies now.
local now = now_ms()
local version = sched_version(KEYS[4])
if version ~= tonumber(ARGV[1]) then
  return { now, version, -1 }
end
local starts, names = {}, {}
local i = 2
while i <= #ARGV do
  starts[#starts + 1] = i
  names[#names + 1] = ARGV[i]
  i = i + 5 + tonumber(ARGV[i + 4])
end
local out = { now, version, 0, 0, 0 }
if #names == 0 then
  return out
end
local stored = redis.call('ZMSCORE', KEYS[1], unpack(names))
local apply, pay_names = {}, {}
for g, at in ipairs(starts) do
  local s = stored[g]
  if s and tonumber(s) == tonumber(ARGV[at + 1]) and tonumber(ARGV[at + 2]) <= now then
    apply[#apply + 1] = at
    pay_names[#pay_names + 1] = ARGV[at]
  else
    out[#out + 1] = ARGV[at]
    out[#out + 1] = s and tonumber(s) or -1
  end
end
if #apply == 0 then
  return out
end
local payloads = redis.call('HMGET', KEYS[2], unpack(pay_names))
-- Per occurrence: its id, its score (the occurrence, as sent), the payload it carries.
local ids, occs, pays, n = {}, {}, {}, 0
local nexts, gone, lasts = {}, {}, {}
local fired = 0
for a, at in ipairs(apply) do
  local name = ARGV[at]
  local k = tonumber(ARGV[at + 4])
  local prefix = 'sched:' .. name .. ':'
  local payload = ':' .. (payloads[a] or '')
  for j = at + 5, at + 4 + k do
    n = n + 1
    ids[n] = prefix .. ARGV[j]
    occs[n] = ARGV[j]
    pays[n] = payload
  end
  fired = fired + k
  if k > 0 then
    lasts[#lasts + 1] = name
    lasts[#lasts + 1] = ARGV[at + 4 + k]
  end
  if ARGV[at + 3] == '' then
    gone[#gone + 1] = name
  else
    nexts[#nexts + 1] = ARGV[at + 3]
    nexts[#nexts + 1] = name
  end
end
-- Write each occurrence whose id is not a message of the queue already.
local zargs, hargs, w = {}, {}, 0
local earliest
local step = 1000
local c = 1
while c <= n do
  local d = math.min(n, c + step - 1)
  local known = redis.call('HMGET', KEYS[6], unpack(ids, c, d))
  for j = c, d do
    if not known[j - c + 1] then
      w = w + 2
      zargs[w - 1] = occs[j]
      zargs[w] = ids[j]
      hargs[w - 1] = ids[j]
      hargs[w] = occs[j] .. pays[j]
      local due = tonumber(occs[j])
      if not earliest or due < earliest then
        earliest = due
      end
    end
  end
  c = d + 1
end
sched_chunked('ZADD', KEYS[5], zargs, 2 * step)
sched_chunked('HSET', KEYS[6], hargs, 2 * step)
if earliest then
  lower_head(KEYS[4], earliest)
end
sched_chunked('ZADD', KEYS[1], nexts, 2 * step)
sched_chunked('ZREM', KEYS[1], gone, step)
sched_chunked('HSET', KEYS[3], lasts, 2 * step)
sched_set_head(KEYS[4], KEYS[1], version)
out[3] = #apply
out[4] = fired
out[5] = w / 2
return out
