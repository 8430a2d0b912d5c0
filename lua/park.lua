-- park.lua: put back a taken message whose payload could not be decoded, as a dead letter.
--
-- KEYS[1]  redwheel:{N}:msg       HASH  id -> "<due ms>:<payload>"
-- KEYS[2]  redwheel:{N}:dead      LIST  ids parked for inspection
-- ARGV[1]  the message id
-- ARGV[2]  the stored value exactly as take.lua returned it
--
-- Reply: 1.
--
-- Invariant: a message a consumer could not decode is not lost: its `msg` entry comes
-- back unchanged and its id goes to `dead`, never to `ready`, so it cannot poison every
-- later take. It no longer counts in the queue's length.
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('RPUSH', KEYS[2], ARGV[1])
return 1
