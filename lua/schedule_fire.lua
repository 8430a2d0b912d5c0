-- schedule_fire.lua: offers the occurrences of schedules of queue N that are due or fall due
-- within the lead, and advances each schedule, both in one step, only from the `next` the
-- client planned from (the exactly-once step of recurring schedules). After head.lua and
-- schedule_lib.lua.
--
-- KEYS[1]  redwheel:{N}:schedules:next     ZSET    name -> next occurrence (ms)
-- KEYS[2]  redwheel:{N}:schedules:payload  HASH    name -> payload
-- KEYS[3]  redwheel:{N}:schedules:last     HASH    name -> last occurrence fired (ms)
-- KEYS[4]  redwheel:{N}:head               HASH    `schedules`: "<version>:<earliest next>";
--                                                  `due`: lower bound of every due (head.lua)
-- KEYS[5]  redwheel:{N}:delayed            ZSET    id -> due (ms)
-- KEYS[6]  redwheel:{N}:msg                HASH    id -> "<due ms>:<payload>"
-- KEYS[7]  redwheel:{N}:schedules:ahead    HASH    name -> occurrences offered ahead
--                                                  (schedule_lib.lua)
-- ARGV[1]  the version of the definitions the client planned with
-- ARGV[2]  the lead (ms): how long before it falls due an occurrence may be offered
-- ARGV[3..] one group per schedule (the client sends at most 1,000 groups):
--          name, expected next (ms), settled (ms, or ''), new next (ms, or '' for none), k,
--          then k occurrences to fire (ms, oldest first; k may be 0)
--          "settled" is the latest occurrence the catch-up policy judged due (fired or
--          skipped), '' when the plan judged none (it only fires ahead); the occurrences are
--          those the policy fires, then every occurrence after the due ones up to the
--          client's estimate of now + the lead; the new next is the first after them.
--
-- Reply: { now, version, applied, fired, written, name, stored, name, stored, … }
--   now      the server's TIME (ms) this call judged by
--   version  the current version; when it is not ARGV[1], nothing was written and the reply
--            is { now, version, -1 }: the client reads the changed definitions first
--   applied  groups applied; fired: occurrences they fired; written: messages written (an
--            occurrence whose id is already a message of the queue is not written again)
--   then, per group refused: its name and the schedule's stored next (ms), or -1 when it
--   has none (paused, removed, finished). A group is refused when its expected next is not
--   the stored one (another process applied it, or the schedule changed), when its settled
--   instant is later than `now`, or when its last occurrence is later than `now` + the lead
--   (the client's clock estimate ran ahead).
--
-- Invariant: an occurrence is offered only by the call that moves its schedule's `next`
-- past it, from the value the plan was made from, with the definitions of that plan, and
-- never more than the lead before it falls due by TIME: any number of processes may fire
-- the same schedule, retry after an unknown outcome, or die between planning and applying,
-- and each occurrence is offered at most once; one that is due is offered by whichever call
-- applies first; the catch-up policy only ever skips occurrences at or before TIME. Each
-- occurrence is the message "sched:<name>:<occurrence ms>", due at the occurrence (at once,
-- or up to the lead later), written as offer.lua writes one; `head`'s `due` is lowered to
-- it, so a transfer moves it when it falls due even if this process dies now. Each
-- occurrence offered after TIME is listed in `ahead` (with the last one fired before), so a
-- pause, replacement or removal before it falls due takes it back.
local now = now_ms()
local version = sched_version(KEYS[4])
if version ~= tonumber(ARGV[1]) then
  return { now, version, -1 }
end
local lead = tonumber(ARGV[2])
local starts, names = {}, {}
local i = 3
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
  local k = tonumber(ARGV[at + 4])
  if s and tonumber(s) == tonumber(ARGV[at + 1])
    and (ARGV[at + 2] == '' or tonumber(ARGV[at + 2]) <= now)
    and (k == 0 or tonumber(ARGV[at + 4 + k]) <= now + lead) then
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
local known = sched_hmget(KEYS[6], ids)
for j = 1, n do
  if not known[j] then
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
sched_chunked('ZADD', KEYS[5], zargs, 2 * step)
sched_chunked('HSET', KEYS[6], hargs, 2 * step)
if earliest then
  lower_head(KEYS[4], earliest)
end
-- The entries in `ahead` of the schedules that fired something: what is still ahead of now
-- after this call (those of the entry that fell due meanwhile move into its base).
local ahead_names, ahead_at = {}, {}
for _, at in ipairs(apply) do
  if tonumber(ARGV[at + 4]) > 0 then
    ahead_names[#ahead_names + 1] = ARGV[at]
    ahead_at[#ahead_at + 1] = at
  end
end
local ahead_set, ahead_gone = {}, {}
local entries = sched_hmget(KEYS[7], ahead_names)
local fired_before = sched_hmget(KEYS[3], ahead_names)
for j, name in ipairs(ahead_names) do
  local at = ahead_at[j]
  local k = tonumber(ARGV[at + 4])
  if entries[j] or tonumber(ARGV[at + 4 + k]) > now then
    -- The entry's base and occurrences (none: no entry yet), then this call's occurrences
    -- after them; the base starts from the last fired before this call too, when that is
    -- due (a firing that left no entry, as one by an earlier build, still counts).
    local base, all = false, {}
    if entries[j] then
      base, all = sched_ahead_parse(entries[j])
    end
    local last = fired_before[j]
    if last and tonumber(last) <= now and (not base or tonumber(last) > tonumber(base)) then
      base = last
    end
    for g = at + 5, at + 4 + k do
      all[#all + 1] = ARGV[g]
    end
    -- Those now due move into the base; the rest stay listed.
    local list = {}
    for _, o in ipairs(all) do
      if tonumber(o) > now then
        list[#list + 1] = o
      elseif not base or tonumber(o) > tonumber(base) then
        base = o
      end
    end
    if #list == 0 then
      ahead_gone[#ahead_gone + 1] = name
    else
      ahead_set[#ahead_set + 1] = name
      ahead_set[#ahead_set + 1] = (base or 'x') .. ':' .. table.concat(list, ':')
    end
  end
end
sched_chunked('HSET', KEYS[7], ahead_set, 2 * step)
sched_chunked('HDEL', KEYS[7], ahead_gone, step)
sched_chunked('ZADD', KEYS[1], nexts, 2 * step)
sched_chunked('ZREM', KEYS[1], gone, step)
sched_chunked('HSET', KEYS[3], lasts, 2 * step)
sched_set_head(KEYS[4], KEYS[1], version)
out[3] = #apply
out[4] = fired
out[5] = w / 2
return out
