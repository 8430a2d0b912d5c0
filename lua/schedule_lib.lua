-- schedule_lib.lua: not a script of its own. scripts.rs puts these functions in front of
-- every schedule script (schedule_set, schedule_remove, schedule_pause, schedule_read,
-- schedule_fire), so that they read and keep the schedules' keys of queue N alike:
--
-- redwheel:{N}:schedules          HASH    name -> "<rev>:<paused 0|1>:<definition>": the
--                                          canonical definition (redwheel::schedule), and the
--                                          version of its last change (rev)
-- redwheel:{N}:schedules:payload  HASH    name -> the payload each occurrence carries
-- redwheel:{N}:schedules:next     ZSET    name -> its next occurrence (epoch ms, server clock),
--                                          for the running schedules that have one
-- redwheel:{N}:schedules:last     HASH    name -> its last occurrence fired (epoch ms)
-- redwheel:{N}:schedules:changes  ZSET    name -> the version of its last change (removals
--                                          included), kept for the last KEEP versions
-- redwheel:{N}:schedules:ahead    HASH    name -> "<base>:<o1>:<o2>…": occurrences offered
--                                          before they fell due (schedule_fire.lua fires up to
--                                          its lead ahead), o1 < o2 < …, each the message
--                                          `sched:<name>:<o>`; base: the last occurrence fired
--                                          before o1 ('x': none). Every occurrence fired after
--                                          base is listed, so a pause, a replacement or a
--                                          removal can take back those still ahead of TIME
--                                          (sched_ahead_read, sched_take_back) and put `last`
--                                          back; those a consumer pool claimed ahead stay
--                                          listed (they count as fired) until they fall due.
--                                          An entry whose occurrences all fell due is stale
--                                          and harmless (nothing is ahead to take back).
-- redwheel:{N}:head               HASH    field `schedules`: "<version>:<earliest next or
--                                          empty>", what a process reads to know whether its
--                                          copy of the schedules is current, and when the next
--                                          one falls due (the guard sweep reads it beside
--                                          field `due`, head.lua)
--
-- The version counts changes to the set (create, replace, pause, resume, remove), never
-- firings, from a start taken from the clock (sched_next_version): each process keeps a copy
-- of the definitions and brings it up to date from `changes` when the version moves
-- (schedule_read.lua).

-- Changes kept in `changes`: a process whose copy is older reads every schedule again.
local KEEP = 10000

-- The server's TIME in epoch ms.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The version in `head` (0 when there is none yet).
local function sched_version(head)
  local h = redis.call('HGET', head, 'schedules')
  if not h then
    return 0
  end
  return tonumber(string.match(h, '^(%d+)'))
end

-- The version a change writes: one more than the current one; the first one is the server's
-- TIME in µs, so that a process whose copy was read before Redis lost its data (a restart
-- without persistence, a failover to an empty replica) never finds its old version again.
local function sched_next_version(head)
  local v = sched_version(head)
  if v == 0 then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return v + 1
end

-- Writes `head` for `version`, with the earliest next occurrence of `next`.
local function sched_set_head(head, next, version)
  local first = redis.call('ZRANGE', next, 0, 0, 'WITHSCORES')
  local at = ''
  if first[2] then
    at = string.format('%d', tonumber(first[2]))
  end
  redis.call('HSET', head, 'schedules', string.format('%d', version) .. ':' .. at)
end

-- Records a change of `name` at `version`, and forgets changes older than KEEP versions.
local function sched_changed(changes, name, version)
  redis.call('ZADD', changes, version, name)
  redis.call('ZREMRANGEBYSCORE', changes, '-inf', '(' .. string.format('%d', version - KEEP))
end

-- Whether a schedule may start (again) from `settled`, and the instant it may start from: not
-- before its last occurrence fired (in `last`), so that nothing fired is owed again, and not
-- after the later of the server's now and that occurrence (one fired ahead and claimed ahead
-- by a consumer pool counts as fired though it is not due yet: the schedule goes on after it).
-- `back` (sched_ahead_read's, or nil): the occurrences offered ahead that the caller takes
-- back in the same script do not count. Returns (ok, from): a refused call starts again from
-- `from`.
local function sched_may_start(last, name, settled, now, back)
  local fired
  if back and #back.ids > 0 then
    fired = back.last
  else
    fired = redis.call('HGET', last, name)
  end
  fired = fired and tonumber(fired)
  local from = now
  if fired and fired > now then
    from = fired
  end
  return settled <= from and not (fired and settled < fired), from
end

-- (rev, paused, definition) of a stored record.
local function sched_parse(record)
  return string.match(record, '^(%d+):([01]):(.*)$')
end

-- redis.call(cmd, key, ...) with `args` in pieces of at most `step` (Lua's unpack stops near
-- 8,000 values); `step` keeps pairs together when it is even.
local function sched_chunked(cmd, key, args, step)
  local i = 1
  while i <= #args do
    local j = math.min(#args, i + step - 1)
    redis.call(cmd, key, unpack(args, i, j))
    i = j + 1
  end
end


-- HMGET key over `fields`, in pieces of at most 1,000 (Lua's unpack stops near 8,000 values):
-- one value per field, false for a missing one.
local function sched_hmget(key, fields)
  local out = {}
  local i = 1
  while i <= #fields do
    local j = math.min(#fields, i + 999)
    local got = redis.call('HMGET', key, unpack(fields, i, j))
    for g = 1, #got do
      out[i + g - 1] = got[g]
    end
    i = j + 1
  end
  return out
end

-- An entry of `ahead`: its base (false: none) and its occurrences (strings, oldest first).
local function sched_ahead_parse(entry)
  local base, list, first = false, {}, true
  for part in string.gmatch(entry, '[^:]+') do
    if first then
      first = false
      if part ~= 'x' then
        base = part
      end
    else
      list[#list + 1] = part
    end
  end
  return base, list
end

-- What taking back the occurrences of `name` offered ahead of `now` means, writing nothing
-- (a script that may still refuse reads this first): nil when `name` has no entry in `ahead`;
-- else { ids = the messages to remove: occurrences after `now` still in `delayed`; last = the
-- last occurrence fired once they are gone (false: none); kept = the occurrences after `now`
-- that are not in `delayed` (claimed ahead by a consumer pool: they count as fired, and stay
-- listed, so that if the pool gives one back before its time a later change still takes it
-- back); base = the last occurrence fired before them (false: none) }. O(entries: at most the
-- lead in ms).
local function sched_ahead_read(ahead, delayed, name, now)
  local entry = redis.call('HGET', ahead, name)
  if not entry then
    return nil
  end
  local base, list = sched_ahead_parse(entry)
  local ids, kept = {}, {}
  for _, o in ipairs(list) do
    local id = 'sched:' .. name .. ':' .. o
    if tonumber(o) > now and redis.call('ZSCORE', delayed, id) then
      ids[#ids + 1] = id
    elseif tonumber(o) > now then
      kept[#kept + 1] = o
    elseif not base or tonumber(o) > tonumber(base) then
      base = o
    end
  end
  local last = base
  if #kept > 0 then
    last = kept[#kept]
  end
  return { ids = ids, last = last, kept = kept, base = base }
end

-- Applies sched_ahead_read's `back`: the messages go (as remove.lua removes a delayed one:
-- they are only in `delayed` and `msg`; `head`'s `due` stays a lower bound), `last` goes back
-- to what was fired before them, and the entry lists only the occurrences kept (dropped when
-- there are none).
local function sched_take_back(back, ahead, delayed, msg, last, name)
  if #back.ids > 0 then
    redis.call('ZREM', delayed, unpack(back.ids))
    redis.call('HDEL', msg, unpack(back.ids))
    if back.last then
      redis.call('HSET', last, name, back.last)
    else
      redis.call('HDEL', last, name)
    end
  end
  if #back.kept > 0 then
    redis.call('HSET', ahead, name, (back.base or 'x') .. ':' .. table.concat(back.kept, ':'))
  else
    redis.call('HDEL', ahead, name)
  end
end
