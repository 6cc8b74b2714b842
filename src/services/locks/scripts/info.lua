local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then return false end
if t ~= 'hash' or redis.call('HEXISTS', KEYS[1], 'owner') == 0 then
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end
local v = redis.call('HMGET', KEYS[1], 'owner', 'count', 'token')
return {v[1], tonumber(v[2]), redis.call('PTTL', KEYS[1]), tonumber(v[3])}
