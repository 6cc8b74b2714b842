import json, sys, threading, time
from redis import Redis
import redis_lock
r = Redis(port=int(sys.argv[1]))
name = "orders-%s" % sys.argv[2]
out = {}
a = redis_lock.Lock(r, name, expire=30, id=b"holder-a")
out["acquired"] = a.acquire(blocking=False)
out["locked"] = a.locked()
out["other_fails"] = redis_lock.Lock(r, name, expire=30).acquire(blocking=False)
a.extend(expire=60)
out["ttl_after_extend"] = 50 < r.ttl("lock:" + name) <= 60
out["owner"] = a.get_owner_id()
woke = {}
def waiter():
    b = redis_lock.Lock(r, name, expire=30, id=b"waiter-b")
    t = time.time()
    woke["got"] = b.acquire(blocking=True, timeout=20)
    woke["seconds"] = time.time() - t
    b.release()
t = threading.Thread(target=waiter)
t.start()
time.sleep(0.5)
a.release()
t.join()
out["waiter_got"] = woke["got"]
out["waiter_woken_by_signal"] = woke["seconds"] < 5
out["after"] = redis_lock.Lock(r, name).locked()
try:
    a.release()
    out["double_release"] = "none"
except redis_lock.NotAcquired as e:
    out["double_release"] = type(e).__name__

print(json.dumps(out, sort_keys=True))
