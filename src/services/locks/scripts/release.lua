local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then return -1 end
if t ~= 'hash' or redis.call('HEXISTS', KEYS[1], 'owner') == 0 then
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return -1 end
if ARGV[2] ~= '1' and redis.call('HINCRBY', KEYS[1], 'count', -1) > 0 then return 0 end
local waiting = redis.call('HEXISTS', KEYS[1], 'waiting')
redis.call('DEL', KEYS[1])
if waiting == 1 then redis.call('PUBLISH', ARGV[3], KEYS[1]) end
return 1
