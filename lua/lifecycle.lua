-- lifecycle.lua: not a script of its own. scripts.rs puts these functions in front of the
-- scripts that move messages between states under the queue's controls (take.lua,
-- claim.lua, transfer.lua, ack.lua, nack.lua; stats.lua for PRIORITY_BAND), so each move
-- is made one way, and (after it, ready_pop.lua, for take.lua and claim.lua) so the two
-- scripts that hand messages out apply the controls alike. Lua creates a function each time a
-- script runs its definition: hence controls_lib() below.

-- PRIORITY_BAND: the score distance between two priorities in `prioritized` (2^49 ms, about
-- 17,800 years of due times). A score is (9 - priority) * PRIORITY_BAND + due, at most
-- 9 * 2^49 < 2^53: an exact integer in a double, so order within a band is due order (ties
-- by id, as in `delayed`), and a higher priority always comes first. Ten bands is what fits
-- with room to spare (16 would); it is also Redisson's range, 0..9.
local PRIORITY_BAND = 562949953421312

-- The functions below matter only to a queue with controls (priorities, ttls, a rate limit,
-- a pause, max_in_flight): they are created by controls_lib(), which a script calls before
-- it uses any of them, so a run that finds no controls (the common case) never pays for
-- creating them. Calling it again in the same run does nothing.
local ready_score, expire, release, gate, log_deliveries, expired
local function controls_lib()
  if release then
    return
  end
  -- ready_score(priority, due): the score of a message of `priority` (1..9) due at `due` (ms).
  function ready_score(priority, due)
    return string.format('%d', (9 - priority) * PRIORITY_BAND + math.min(due, PRIORITY_BAND - 1))
  end

  -- expire(id, now_ms, expires, dead, reason): a message whose ttl ran out before it was
  -- handed out becomes a dead letter with reason 'expired'. Its `msg` entry stays (dead
  -- letters keep theirs); the caller has taken it off `delayed`, `ready` or `prioritized`.
  function expire(id, now_ms, expires, dead, reason)
    redis.call('ZREM', expires, id)
    redis.call('ZADD', dead, now_ms, id)
    redis.call('HSET', reason, id, 'expired')
  end

  -- release(controls, wake): a claim in flight has ended (acked, given back, expired). If a
  -- claim of any process waits for an in-flight slot (the `release_waiters` flag in
  -- `controls`, set by claim.lua when max_in_flight stopped it), the flag goes and `wake`
  -- tells every process to look again ('0': "now"). One HDEL when nobody waits.
  function release(controls, wake)
    if redis.call('HDEL', controls, 'release_waiters') == 1 then
      redis.call('SPUBLISH', wake, '0')
    end
  end


  -- gate(c, rate, now, mif_free): whether the queue's controls let a consumer have messages now,
  -- and how many. `c` is HMGET of `controls` fields paused, rate_max, rate_per (ms); `rate` the
  -- delivery log (ZSET, scores in µs); `now` the server time in µs; `mif_free` the free
  -- in-flight slots (nil: no max_in_flight applies). Returns (0, budget) when open, budget nil
  -- meaning "no rate or slot bound"; or (g, 0) when closed: g = -1 paused, -2 every in-flight
  -- slot taken, g > 0 the µs until the rate window lets the next delivery through.
  -- The log is pruned to the window (entries older than now - per go), so it never holds more
  -- than rate_max entries.
  function gate(c, rate, now, mif_free)
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
  function log_deliveries(rate, now, prefix, n)
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
  function expired(expires, id, now_ms)
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
end
