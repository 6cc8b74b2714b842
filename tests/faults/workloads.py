"""The workloads: client threads that drive one key space each and record every
operation (invocation time, completion time, result or error) in a History, the final
state read back from the cluster, and the call into the matching checker.

Sides: "hs" clients talk to a heatshield (redis.Redis, no client-side retry); "bl"
(baseline) clients talk to the cluster directly (redis.cluster.RedisCluster, no retry on
connection errors: MOVED / ASK / TRYAGAIN are still followed, as a cluster client must).
Both sides use the same workload code on different key prefixes."""

import itertools
import random
import threading
import time

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

import checkers

CLOCK0 = time.monotonic()


def now():
    return time.monotonic() - CLOCK0


class History:
    """The operations of one workload on one side, in invocation order."""

    _ids = itertools.count()

    def __init__(self):
        self.ops = []
        self.lock = threading.Lock()

    def invoke(self, p, f, k, v=None):
        op = {"id": next(History._ids), "p": p, "f": f, "k": k, "v": v, "r": None,
              "t0": now(), "t1": None, "st": "info"}
        with self.lock:
            self.ops.append(op)
        return op

    @staticmethod
    def ok(op, r):
        op["t1"] = now()
        op["r"] = r
        op["st"] = "ok"

    @staticmethod
    def info(op, e):
        op["e"] = f"{type(e).__name__}: {e}"[:200]

    @staticmethod
    def fail(op, e):
        op["t1"] = now()
        op["st"] = "fail"
        op["e"] = f"{type(e).__name__}: {e}"[:200]


NO_RETRY = Retry(NoBackoff(), 0)


def hs_client(port, timeout=7.0):
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=timeout, socket_connect_timeout=1.0,
                       retry=NO_RETRY, decode_responses=True)


def bl_client(seeds, timeout=7.0):
    nodes = [ClusterNode(*s.split(":")) for s in seeds]
    return RedisCluster(startup_nodes=nodes, retry=NO_RETRY, socket_timeout=timeout,
                        socket_connect_timeout=1.0, decode_responses=True)


class Ctx:
    """What a workload needs to reach its side."""

    def __init__(self, side, factory, prefix, rng, pace=0.002):
        self.side, self.factory, self.prefix, self.rng, self.pace = side, factory, prefix, rng, pace

    def client(self):
        while True:
            try:
                return self.factory()
            except Exception:  # noqa: BLE001 - the cluster may be failing over right now
                time.sleep(0.2)


def _loop(stop, body, pace):
    while not stop.is_set():
        try:
            body()
        except Exception:  # noqa: BLE001 - recorded by body; never kill the thread
            time.sleep(0.05)
        if pace:
            time.sleep(pace)


NOT_EXECUTED = ("CLUSTERDOWN", "TRYAGAIN", "MOVED", "ASK ", "LOADING", "READONLY")


def not_executed(e):
    """True for errors that say the command never ran: the connection could not even be
    made, or the server refused it before running it (cluster down, slot moving)."""
    s = str(e)
    if isinstance(e, (redis.ConnectionError, redis.TimeoutError)) and "connecting to" in s:
        return True
    return isinstance(e, redis.ResponseError) and s.upper().startswith(NOT_EXECUTED)


def _do(hist, op, fn):
    try:
        r = fn()
    except Exception as e:  # noqa: BLE001
        if not_executed(e):
            hist.fail(op, e)
        else:
            hist.info(op, e)
        time.sleep(0.02)
        raise
    hist.ok(op, r)
    return r


class Workload:
    name = "?"

    def __init__(self, ctx):
        self.ctx = ctx
        self.hist = History()
        self.p = ctx.prefix

    def keys(self):
        return []

    def threads(self):
        return []

    def final(self, rc):
        return {}

    def check(self, final):
        return []


class ListAppend(Workload):
    """RPUSH of unique values to 24 keys, LRANGE reads; MULTI/EXEC appends to two keys
    of one hash tag at once and MULTI/EXEC reads of both."""
    name = "list"

    def __init__(self, ctx, stale_ms=0.0):
        super().__init__(ctx)
        self.single = [f"{self.p}la:{i}" for i in range(24)]
        self.groups = [(f"{{{self.p}g{j}}}:a", f"{{{self.p}g{j}}}:b") for j in range(3)]
        self.stale_ms = stale_ms
        self.seq = itertools.count()

    def keys(self):
        return self.single + [k for g in self.groups for k in g]

    def threads(self):
        return [self._appender(i) for i in range(3)] + [self._reader(), self._txwriter(), self._txreader()]

    def _appender(self, i):
        def run(stop):
            c, rng, h = self.ctx.client(), random.Random(i), self.hist
            name = f"{self.ctx.side}-app{i}"

            def body():
                k = rng.choice(self.single)
                v = f"{name}-{next(self.seq)}"
                op = h.invoke(name, "append", k, v)
                _do(h, op, lambda: c.rpush(k, v))
            _loop(stop, body, self.ctx.pace)
        return run

    def _reader(self):
        def run(stop):
            c, rng, h = self.ctx.client(), random.Random(99), self.hist
            name = f"{self.ctx.side}-read"

            def body():
                k = rng.choice(self.single)
                op = h.invoke(name, "read", k)
                _do(h, op, lambda: c.lrange(k, 0, -1))
            _loop(stop, body, self.ctx.pace)
        return run

    def _txwriter(self):
        def run(stop):
            c, rng, h = self.ctx.client(), random.Random(7), self.hist
            name = f"{self.ctx.side}-txw"

            def body():
                a, b = rng.choice(self.groups)
                n = next(self.seq)
                v = {a: f"{name}-{n}a", b: f"{name}-{n}b"}
                op = h.invoke(name, "txappend", None, v)

                def tx():
                    pl = c.pipeline(transaction=True)
                    pl.rpush(a, v[a])
                    pl.rpush(b, v[b])
                    return pl.execute()
                _do(h, op, tx)
            _loop(stop, body, self.ctx.pace)
        return run

    def _txreader(self):
        def run(stop):
            c, rng, h = self.ctx.client(), random.Random(8), self.hist
            name = f"{self.ctx.side}-txr"

            def body():
                a, b = rng.choice(self.groups)
                op = h.invoke(name, "txread", None, [a, b])

                def tx():
                    pl = c.pipeline(transaction=True)
                    pl.lrange(a, 0, -1)
                    pl.lrange(b, 0, -1)
                    ra, rb = pl.execute()
                    return {a: ra, b: rb}
                _do(h, op, tx)
            _loop(stop, body, self.ctx.pace)
        return run

    def final(self, rc):
        return {k: rc.lrange(k, 0, -1) for k in self.keys()}

    def check(self, final):
        return checkers.check_list(self.hist.ops, final, stale_ms=self.stale_ms)


CAS = ("local v = redis.call('GET', KEYS[1]) "
       "if v == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2]) return 1 end return 0")


class Register(Workload):
    """SET / GET / compare-and-set (EVAL with the key declared) on 3 keys: through
    heatshield they are pinned in its cache (`cache.pin`), so reads are cache hits."""
    name = "register"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.regs = [f"{self.p}reg:{i}" for i in range(3)]
        self.seq = itertools.count()

    def keys(self):
        return self.regs

    def threads(self):
        return [self._client(i) for i in range(3)] + [self._hammer()]

    def _client(self, i):
        def run(stop):
            c, rng, h = self.ctx.client(), random.Random(100 + i), self.hist
            name = f"{self.ctx.side}-reg{i}"
            last = {}

            def body():
                k = rng.choice(self.regs)
                x = rng.random()
                if x < 0.4:
                    op = h.invoke(name, "read", k)
                    last[k] = _do(h, op, lambda: c.get(k))
                elif x < 0.7:
                    v = f"{name}-{next(self.seq)}"
                    op = h.invoke(name, "write", k, v)
                    _do(h, op, lambda: c.set(k, v))
                else:
                    new = f"{name}-{next(self.seq)}"
                    old = last.get(k)
                    op = h.invoke(name, "cas", k, [old, new])
                    _do(h, op, lambda: int(c.eval(CAS, 1, k, old if old is not None else "", new)))
            _loop(stop, body, self.ctx.pace * 2)
        return run

    def _hammer(self):
        def run(stop):
            c, rng, h = self.ctx.client(), random.Random(5), self.hist
            name = f"{self.ctx.side}-reghot"

            def body():
                k = rng.choice(self.regs)
                op = h.invoke(name, "read", k)
                _do(h, op, lambda: c.get(k))
            _loop(stop, body, self.ctx.pace)
        return run

    def check(self, final):
        # a CAS whose expected value was "nothing" compares with "" (never written)
        ops = []
        for op in self.hist.ops:
            if op["f"] == "cas" and op["v"][0] is None:
                op = dict(op, v=["", op["v"][1]])
            ops.append(op)
        return checkers.check_register(ops)


class Counter(Workload):
    """INCRBY of distinct amounts on 4 keys, GET reads."""
    name = "counter"

    def __init__(self, ctx, stale_ms=0.0):
        super().__init__(ctx)
        self.ctrs = [f"{self.p}ctr:{i}" for i in range(4)]
        self.amounts = itertools.count(1)
        self.stale_ms = stale_ms

    def keys(self):
        return self.ctrs

    def threads(self):
        return [self._incr(i) for i in range(2)] + [self._read()]

    def _incr(self, i):
        def run(stop):
            c, rng, h = self.ctx.client(), random.Random(200 + i), self.hist
            name = f"{self.ctx.side}-inc{i}"

            def body():
                k = rng.choice(self.ctrs)
                a = next(self.amounts)
                op = h.invoke(name, "incr", k, a)
                _do(h, op, lambda: c.incrby(k, a))
            _loop(stop, body, self.ctx.pace)
        return run

    def _read(self):
        def run(stop):
            c, rng, h = self.ctx.client(), random.Random(300), self.hist
            name = f"{self.ctx.side}-ctrread"

            def body():
                k = rng.choice(self.ctrs)
                op = h.invoke(name, "read", k)
                _do(h, op, lambda: int(c.get(k) or 0))
            _loop(stop, body, self.ctx.pace)
        return run

    def final(self, rc):
        return {k: int(rc.get(k) or 0) for k in self.ctrs}

    def check(self, final):
        ops = self.hist.ops
        if self.stale_ms:
            # replica reads may lag: a read is judged against the writes acknowledged
            # stale_ms before it began
            ops = [dict(op, t0=op["t0"] - self.stale_ms / 1000.0) if op["f"] == "read" else op for op in ops]
        return checkers.check_counter(ops, final)


class Queue(Workload):
    """LPUSH producers; a BRPOP consumer; a BLMOVE consumer that moves to a processing
    list and acknowledges with LREM."""
    name = "queue"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.q = f"{{{self.p}q}}:items"
        self.proc = f"{{{self.p}q}}:proc"
        self.seq = itertools.count()

    def keys(self):
        return [self.q]

    def threads(self):
        return [self._producer(i) for i in range(2)] + [self._brpop(), self._blmove()]

    def _producer(self, i):
        def run(stop):
            c, h = self.ctx.client(), self.hist
            name = f"{self.ctx.side}-push{i}"

            def body():
                v = f"{name}-{next(self.seq)}"
                op = h.invoke(name, "push", self.q, v)
                _do(h, op, lambda: c.lpush(self.q, v))
            _loop(stop, body, self.ctx.pace * 2)
        return run

    def _brpop(self):
        def run(stop):
            c, h = self.ctx.client(), self.hist
            name = f"{self.ctx.side}-brpop"

            def body():
                op = h.invoke(name, "pop", self.q)
                r = _do(h, op, lambda: c.brpop([self.q], timeout=1))
                op["r"] = r[1] if r else None
            _loop(stop, body, 0)
        return run

    def _blmove(self):
        def run(stop):
            c, h = self.ctx.client(), self.hist
            name = f"{self.ctx.side}-blmove"

            def body():
                op = h.invoke(name, "move", self.q)
                r = _do(h, op, lambda: c.blmove(self.q, self.proc, 1, "RIGHT", "LEFT"))
                if r is not None:
                    ack = h.invoke(name, "ack", self.q, r)
                    _do(h, ack, lambda: c.lrem(self.proc, 1, r))
            _loop(stop, body, 0)
        return run

    def final(self, rc):
        return {self.q: rc.lrange(self.q, 0, -1) + rc.lrange(self.proc, 0, -1)}

    def check(self, final):
        return checkers.check_queue(self.hist.ops, final)


FENCE = ("local cur = tonumber(redis.call('GET', KEYS[1]) or '0') "
         "if tonumber(ARGV[1]) > cur then redis.call('SET', KEYS[1], ARGV[1]) return 1 end return 0")


class Locks(Workload):
    """LOCK.ACQUIRE (WAIT) / fenced write / LOCK.RELEASE on 2 resources, 4 clients. The
    resource is a key colocated with the lock (same hash tag) that a Lua script sets to
    the holder's token only if it is above the stored one."""
    name = "locks"
    TTL_MS = 3000

    def __init__(self, ctx):
        super().__init__(ctx)
        self.res = [(f"{{{self.p}lk{r}}}:lock", f"{{{self.p}lk{r}}}:res") for r in range(2)]

    def keys(self):
        return [l for l, _ in self.res]

    def threads(self):
        return [self._holder(i) for i in range(4)]

    def _holder(self, i):
        def run(stop):
            c, rng, h = self.ctx.client(), random.Random(400 + i), self.hist
            name = f"{self.p}holder{i}"

            n = itertools.count()

            def body():
                lk, res = rng.choice(self.res)
                # a fresh owner per attempt: an acquire whose reply was lost may have
                # taken the lock, and the same owner acquiring again would re-enter it
                # (same token, by design) instead of being a new holder
                owner = f"{name}-{next(n)}"
                op = h.invoke(owner, "acquire", lk, owner)
                tok = _do(h, op, lambda: c.execute_command("LOCK.ACQUIRE", lk, owner, self.TTL_MS, "WAIT", 1000))
                if tok is None:
                    return
                tok = int(tok)
                op["r"] = tok
                f = h.invoke(owner, "fence", lk, tok)
                try:
                    _do(h, f, lambda: int(c.eval(FENCE, 1, res, tok)))
                except Exception:  # noqa: BLE001
                    pass
                time.sleep(0.003)
                rel = h.invoke(owner, "release", lk, owner)
                try:
                    _do(h, rel, lambda: c.execute_command("LOCK.RELEASE", lk, owner))
                except Exception:  # noqa: BLE001 - NOTOWNER, connection errors: recorded
                    pass
            _loop(stop, body, self.ctx.pace)
        return run

    def check(self, final):
        return checkers.check_locks(self.hist.ops, self.TTL_MS)


RL_RATE, RL_BURST = 100, 20


class RateLimit(Workload):
    """Clients INCR one key a per-key rule limits (rate 100/s, burst 20) as fast as they
    can, through one heatshield (`ports` of one element) or through each instance of a
    fleet. INCR, a write, is never answered by the cache, and the key's final value is
    the number of requests Redis saw."""
    name = "ratelimit"

    def __init__(self, ctx, ports, fleet=False):
        super().__init__(ctx)
        self.ports = ports
        self.fleet = fleet
        self.key = f"{self.p}rl:{'fleet' if fleet else 'one'}"
        self.resets = []
        if fleet:
            self.name = "ratelimit-fleet"

    def keys(self):
        return [self.key]

    def threads(self):
        n = 3 if self.fleet else 2
        return [self._hammer(i, self.ports[i % len(self.ports)]) for i in range(n)]

    def _hammer(self, i, port):
        def run(stop):
            c, h = hs_client(port), self.hist
            name = f"rl{i}@{port}"

            def body():
                op = h.invoke(name, "req", self.key)
                try:
                    r = c.incr(self.key)
                except redis.ResponseError as e:
                    if str(e).startswith("THROTTLED"):
                        h.fail(op, e)
                        return
                    h.info(op, e)
                    time.sleep(0.02)
                    return
                except Exception as e:  # noqa: BLE001
                    h.info(op, e)
                    time.sleep(0.02)
                    return
                h.ok(op, r)
            _loop(stop, body, 0.0005)
        return run

    def final(self, rc):
        return {self.key: int(rc.get(self.key) or 0)}

    def bound(self):
        if self.fleet:
            # (slack: one request per member, the precision measured over 114 episodes:
            # docs/reliability.md)
            return checkers.fleet_bound(RL_RATE, RL_BURST, 3, resets=self.resets, slack=3)
        return checkers.gcra_bound(RL_RATE, RL_BURST, resets=self.resets)

    def check(self, final):
        b = self.bound()
        out = checkers.check_rate(self.hist.ops, b)
        ops = [op for op in self.hist.ops if op["st"] != "fail"]
        if ops:
            t0 = min(op["t0"] for op in ops)
            t1 = max(op["t1"] if op["t1"] is not None else now() for op in ops)
            seen = final.get(self.key, 0)
            lim = b(t0, t1)
            if seen > lim:
                out.append(checkers.anomaly("rate-over-bound", [self.key],
                                            f"{self.key}: Redis counted {seen} admitted INCRs in {t1 - t0:.2f} s, "
                                            f"the bound allows {lim:.1f}", []))
            okc = sum(1 for op in ops if op["st"] == "ok")
            if seen < okc:
                out.append(checkers.anomaly("lost-append", [self.key],
                                            f"{self.key}: {okc} INCRs acknowledged but the key holds {seen}", []))
        return out
