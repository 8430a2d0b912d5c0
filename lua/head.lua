-- head.lua: not a script of its own. scripts.rs puts this function in front of every script
-- that adds a due time or a visibility deadline to queue N (offer, offer_batch, nack, claim,
-- extend, schedule_fire), so that field `due` of `redwheel:{N}:head` stays what the guard
-- sweep relies on.
--
-- redwheel:{N}:head  HASH  `due`: epoch ms, server clock, a lower bound of every score in
--                          `delayed` and `inflight` (the earliest instant the queue's transfer
--                          may have work); absent when both were empty at the last transfer
--                          and nothing was added since. (`schedules` is the schedules' own
--                          field: schedule_lib.lua.)
--
-- lower_head(head, ms) makes `due` at most `ms`: one HGET, and an HSET only when `ms` is
-- earlier. transfer.lua, which reads both sets' heads anyway, sets it to the exact earliest
-- score (or deletes it). A guard sweep reads the hash with one HMGET per queue instead of
-- running the transfer, and runs the transfer only when `due` is due: a lower bound that is
-- too low costs one transfer, one that is too high would strand a message, so every writer
-- of a score lowers it in the same script.
local function lower_head(head, ms)
  local h = redis.call('HGET', head, 'due')
  if not h or ms < tonumber(h) then
    redis.call('HSET', head, 'due', string.format('%d', ms))
  end
end

