//! A real client library against the proxy: redis-py with its default configuration
//! (`redis.Redis(host, port)`, which in redis-py 8 negotiates RESP3 with `HELLO 3` and
//! sends `CLIENT SETINFO` on connect) and with `protocol=2`. The Python script prints
//! `name=repr(result)` lines that the test compares with what Redis would answer.
//!
//! Needs `python3` with the `redis` package: run scripts/ensure-deps.sh.

mod common;

use std::process::Command;
use std::sync::Arc;

use common::{ClusterEnv, Shared};

static ENV: Shared<ClusterEnv> = Shared::new();

fn env() -> Arc<ClusterEnv> {
    ENV.get(|| ClusterEnv::start(None))
}

const SCRIPT: &str = r#"
import sys, redis
port, mode, prefix = int(sys.argv[1]), sys.argv[2], sys.argv[3]
keys = sys.argv[4:]
if mode == "default":
    r = redis.Redis(host="127.0.0.1", port=port)
else:
    r = redis.Redis(host="127.0.0.1", port=port, protocol=int(mode))

def out(name, value):
    print(f"{name}={value!r}", flush=True)

out("ping", r.ping())
out("resp", r.client_info().get("resp"))
out("set", r.set(keys[0], "v0"))
out("get", r.get(keys[0]))
out("get_missing", r.get(prefix + "missing"))
out("mset", r.mset({k: f"val-{i}" for i, k in enumerate(keys)}))
out("mget", r.mget(keys + [prefix + "missing"]))
out("hset", r.hset(prefix + "h", mapping={"f1": "a", "f2": "b"}))
out("hgetall", sorted(r.hgetall(prefix + "h").items()))
out("incr", r.incr(prefix + "ctr"))
out("incrby", r.incrby(prefix + "ctr", 41))
out("zadd", r.zadd(prefix + "z", {"m": 1.5}))
out("zscore", r.zscore(prefix + "z", "m"))
p = r.pipeline(transaction=False)
p.set(prefix + "p", "pv")
p.get(prefix + "p")
p.incr(prefix + "ctr")
p.mget([keys[0], keys[1], keys[2], prefix + "missing"])
p.hget(prefix + "h", "f2")
p.exists(*keys)
out("pipeline", p.execute())
# redis-py's default pipeline is a transaction (MULTI ... EXEC); its keys share a slot
t = "{" + prefix + "tx}"
out("transaction", r.pipeline().set(t + "a", "x").incr(t + "n").get(t + "a").execute())
try:
    r.pipeline().set(t + "b", "x").set(prefix + "elsewhere", "y").execute()
    out("cross_slot", "no error")
except redis.RedisError as e:
    out("cross_slot", type(e).__name__)
out("tx_applied", r.exists(t + "a", t + "n", t + "b", prefix + "elsewhere"))
r.delete(t + "a", t + "n")
out("exists", r.exists(*keys))
out("delete", r.delete(*keys, prefix + "h", prefix + "ctr", prefix + "z", prefix + "p"))
out("mget_after", r.mget(keys))
"#;

fn python_with_redis() {
    let ok = Command::new("python3").args(["-c", "import redis"]).status().is_ok_and(|s| s.success());
    assert!(
        ok,
        "python3 with the `redis` package is required for this test: run scripts/ensure-deps.sh \
         (it installs redis-py with pip)"
    );
}

fn run_redis_py(mode: &str) {
    python_with_redis();
    let env = env();
    let prefix = format!("py:{mode}:");
    let keys: Vec<String> = env.owners.key_per_master(&format!("{prefix}k")).into_iter().map(|(_, k)| k).collect();
    assert_eq!(keys.len(), 3, "one key per master");
    let port = env.proxy.port().to_string();
    let out =
        Command::new("python3").args(["-c", SCRIPT, &port, mode, &prefix]).args(&keys).output().expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "redis-py ({mode}) script failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let resp = if mode == "default" { "3" } else { mode };
    let expected = [
        "ping=True".to_string(),
        format!("resp='{resp}'"),
        "set=True".into(),
        "get=b'v0'".into(),
        "get_missing=None".into(),
        "mset=True".into(),
        "mget=[b'val-0', b'val-1', b'val-2', None]".into(),
        "hset=2".into(),
        "hgetall=[(b'f1', b'a'), (b'f2', b'b')]".into(),
        "incr=1".into(),
        "incrby=42".into(),
        "zadd=1".into(),
        "zscore=1.5".into(),
        "pipeline=[True, b'pv', 43, [b'val-0', b'val-1', b'val-2', None], b'b', 3]".into(),
    ];
    let lines: Vec<&str> = stdout.lines().collect();
    for (i, want) in expected.iter().enumerate() {
        assert_eq!(
            lines.get(i).copied(),
            Some(want.as_str()),
            "redis-py ({mode}) line {i}\nfull output:\n{stdout}\nstderr:\n{stderr}"
        );
    }
    assert_eq!(
        &lines[expected.len()..],
        [
            "transaction=[True, 1, b'x']",
            "cross_slot='ClusterCrossSlotError'",
            "tx_applied=2",
            "exists=3",
            "delete=7",
            "mget_after=[None, None, None]"
        ],
        "redis-py ({mode})\nfull output:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(env.proxy.is_alive());
}

#[test]
fn redis_py_default_configuration_resp3() {
    run_redis_py("default");
}

#[test]
fn redis_py_protocol_2() {
    run_redis_py("2");
}

/// redis-py's WATCH helper (`Redis.transaction`), a WATCH conflict, and an rq-style worker
/// loop (a blocking move from the queue to a processing list, with a timeout, for jobs
/// queued before and after the worker started waiting).
const WORKER_SCRIPT: &str = r#"
import sys, threading, time, redis
port, t = int(sys.argv[1]), sys.argv[2]
r = redis.Redis(host="127.0.0.1", port=port)

def out(name, value):
    print(f"{name}={value!r}", flush=True)

# Redis.transaction: WATCH the key, run the function, MULTI/EXEC, retry on WatchError
r.set(t + "stock", 3)
def buy(pipe):
    left = int(pipe.get(t + "stock"))
    pipe.multi()
    pipe.set(t + "stock", left - 1)
out("transaction", r.transaction(buy, t + "stock"))
out("stock", r.get(t + "stock"))
# a write by another client between WATCH and EXEC: WatchError, nothing ran
other = redis.Redis(host="127.0.0.1", port=port)
with r.pipeline() as p:
    p.watch(t + "stock")
    other.set(t + "stock", 100)
    p.multi()
    p.decr(t + "stock")
    try:
        p.execute()
        out("watch", "ran")
    except redis.WatchError:
        out("watch", "WatchError")
out("stock_after", r.get(t + "stock"))

# an rq-style worker: BLMOVE queue -> processing with a 1 s timeout, in a loop
r.rpush(t + "queue", "job1")
done = []
def worker():
    w = redis.Redis(host="127.0.0.1", port=port)
    idle = 0
    while len(done) < 2 and idle < 10:
        job = w.blmove(t + "queue", t + "processing", 1, "RIGHT", "LEFT")
        if job is None:
            idle += 1
            continue
        done.append(job)
        w.lrem(t + "processing", 1, job)
th = threading.Thread(target=worker)
th.start()
time.sleep(1.5)  # the worker drained the queue and is waiting (and timing out) again
r.rpush(t + "queue", "job2")
th.join(20)
out("worker", done)
out("left", (r.llen(t + "queue"), r.llen(t + "processing")))
r.delete(t + "stock")
"#;

#[test]
fn redis_py_watch_helper_and_a_worker_loop() {
    python_with_redis();
    let env = env();
    let port = env.proxy.port().to_string();
    let out = Command::new("python3").args(["-c", WORKER_SCRIPT, &port, "{pyw}"]).output().expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "script failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "transaction=[True]",
            "stock=b'2'",
            "watch='WatchError'",
            "stock_after=b'100'",
            "worker=[b'job1', b'job2']",
            "left=(0, 0)",
        ],
        "stderr:\n{stderr}"
    );
}

/// redis-py's `pubsub()` as applications use it (subscribe, psubscribe, get_message,
/// listen from a thread), and a Redisson-style lock (shared/seeds/ 001 and 004): a hash
/// taken by a Lua script, whose waiters SUBSCRIBE to the lock's channel and whose release
/// script PUBLISHes on it, so waiters wake instead of polling. 32 clients contend; a
/// counter each one increments with GET then SET while it holds the lock must come out
/// exact.
const PUBSUB_SCRIPT: &str = r#"
import sys, threading, time, uuid, redis
port, proto, t = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
r = redis.Redis(host="127.0.0.1", port=port, protocol=proto)

def out(name, value):
    print(f"{name}={value!r}", flush=True)

p = r.pubsub()
p.subscribe(t + "news")
p.psubscribe(t + "alerts.*")
out("confirm", [p.get_message(timeout=5)["type"] for _ in range(2)])
out("publish", r.publish(t + "news", "hello"))
out("message", {k: v for k, v in p.get_message(timeout=5).items() if k != "pattern"})
r.publish(t + "alerts.disk", "full")
m = p.get_message(timeout=5)
out("pmessage", (m["type"], m["pattern"], m["channel"], m["data"]))
out("numsub", r.pubsub_numsub(t + "news"))
p.unsubscribe(t + "news")
p.punsubscribe()
out("unsubscribed", [p.get_message(timeout=5)["type"] for _ in range(2)])
p.close()

# a handler thread, as applications run one
got = []
q = r.pubsub()
q.subscribe(**{t + "jobs": lambda m: got.append(m["data"])})
th = q.run_in_thread(sleep_time=0.01)
time.sleep(0.2)
for i in range(5):
    r.publish(t + "jobs", f"j{i}")
deadline = time.time() + 5
while len(got) < 5 and time.time() < deadline:
    time.sleep(0.01)
th.stop()
out("thread", got)

LOCK = """
if (redis.call('exists', KEYS[1]) == 0) then
    redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end;
if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
    redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end;
return redis.call('pttl', KEYS[1]);
"""
UNLOCK = """
if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then return nil; end;
local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1);
if (counter > 0) then redis.call('pexpire', KEYS[1], ARGV[2]); return 0;
else redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], ARGV[1]); return 1; end;
"""
name, channel, counter = t + "lock", "redisson_lock__channel:" + t + "lock", t + "counter"
r.set(counter, 0)
wakeups, errors = [0], []
N, ROUNDS = 32, 15

def contender():
    c = redis.Redis(host="127.0.0.1", port=port, protocol=proto)
    me = str(uuid.uuid4()) + ":1"
    lock, unlock = c.register_script(LOCK), c.register_script(UNLOCK)
    sub = c.pubsub()
    sub.subscribe(channel)
    sub.get_message(timeout=5)
    try:
        for _ in range(ROUNDS):
            while True:
                ttl = lock(keys=[name], args=[30000, me])
                if ttl is None:
                    break
                if sub.get_message(timeout=min(ttl, 1000) / 1000):
                    wakeups[0] += 1
            v = int(c.get(counter))
            c.set(counter, v + 1)
            if unlock(keys=[name, channel], args=[0, 30000, me]) != 1:
                errors.append("unlock")
    except Exception as e:
        errors.append(repr(e))
    sub.close()

threads = [threading.Thread(target=contender) for _ in range(N)]
for th in threads:
    th.start()
for th in threads:
    th.join(120)
out("counter", int(r.get(counter)))
out("errors", errors)
print(f"wakeups={wakeups[0]}", file=sys.stderr)
out("woken", wakeups[0] > 0)
"#;

fn run_pubsub_script(proto: &str) {
    python_with_redis();
    let env = env();
    let port = env.proxy.port().to_string();
    let tag = format!("{{pyps{proto}}}");
    let out = Command::new("python3").args(["-c", PUBSUB_SCRIPT, &port, proto, &tag]).output().expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "script failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    let t = &tag;
    let want = [
        "confirm=['subscribe', 'psubscribe']".to_string(),
        "publish=1".into(),
        format!("message={{'type': 'message', 'channel': b'{t}news', 'data': b'hello'}}"),
        format!("pmessage=('pmessage', b'{t}alerts.*', b'{t}alerts.disk', b'full')"),
        format!("numsub=[(b'{t}news', 1)]"),
        "unsubscribed=['unsubscribe', 'punsubscribe']".into(),
        "thread=[b'j0', b'j1', b'j2', b'j3', b'j4']".into(),
        "counter=480".into(),
        "errors=[]".into(),
        "woken=True".into(),
    ];
    assert_eq!(stdout.lines().collect::<Vec<_>>(), want, "redis-py protocol {proto}\nstderr:\n{stderr}");
    eprintln!("protocol {proto}: {}", stderr.trim());
}

#[test]
fn redis_py_pubsub_and_a_redisson_style_lock_resp2() {
    run_pubsub_script("2");
}

#[test]
fn redis_py_pubsub_and_a_redisson_style_lock_resp3() {
    run_pubsub_script("3");
}
