local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then
  local token = redis.call('INCR', KEYS[2])
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'count', 1, 'token', token)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return token
end
if t ~= 'hash' or redis.call('HEXISTS', KEYS[1], 'owner') == 0 then
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('HINCRBY', KEYS[1], 'count', 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('HGET', KEYS[1], 'token'))
end
if ARGV[3] == '1' then redis.call('HSET', KEYS[1], 'waiting', 1) end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then ttl = 0 end
return -1 - ttl
