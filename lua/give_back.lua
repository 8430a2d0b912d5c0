-- give_back.lua: puts back at the head of the ready list a message that take.lua handed to an
-- async taker whose future was dropped before it read the reply (feature `async`), so a
-- cancelled take never loses a message.
--
-- KEYS[1]  redwheel:{N}:ready   LIST  ids that are due, in due order
-- KEYS[2]  redwheel:{N}:msg     HASH  id -> "<due ms>:<payload>"
-- KEYS[3]  redwheel:{N}:counts  HASH  'delivered' -> messages handed out
-- ARGV[1]  the message id, as take.lua replied it
-- ARGV[2]  its stored value "<due ms>:<payload>", as take.lua replied it
--
-- Reply: 1 put back (first on the ready list, its delivery uncounted); 0 nothing done: the id
--        is known to the queue again (offered anew meanwhile), which wins.
--
-- Invariant: a message is deliverable iff it has a msg entry, and an id is on the ready list
-- at most once per deliverable message: the entry and the list item are written together,
-- and only if the id has no entry. The caller sends it only after take.lua's reply came (the
-- message is surely gone), and never again after an unknown outcome (a second one could
-- put back a message taken in between).
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then
  return 0
end
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('HINCRBY', KEYS[3], 'delivered', -1)
return 1
