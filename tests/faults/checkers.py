"""The history checkers, one per workload, and their self-tests.

A history is a list of operations, each a dict:
  id  unique int            p   client (process) name
  f   operation name        k   key (or resource / queue name)
  v   argument              r   result (when st == "ok")
  t0  invocation time (s)   t1  completion time (s), None when indeterminate
  st  "ok" (acknowledged), "fail" (definitely not applied, e.g. -THROTTLED) or
      "info" (error or timeout: a write may or may not have taken effect)

Every checker returns a list of anomalies: {"kind", "keys", "msg", "ops"}, "ops" being
the operations that show it (the smallest set the checker can name).

- list appends:   check_list(ops, final, stale_ms=0)
- register:       check_register(ops)           (Wing-Gong linearizability search)
- counter:        check_counter(ops, final)
- queue:          check_queue(ops, final)
- locks:          check_locks(ops, ttl_ms)
- rate limit:     check_rate(ops, bound)
`selftest()` feeds each hand-made histories with one known anomaly and clean ones."""

import bisect
import itertools

INF = float("inf")


def anomaly(kind, keys, msg, ops):
    return {"kind": kind, "keys": sorted(set(keys)), "msg": msg, "ops": list(ops)}


def _end(op):
    return INF if op.get("t1") is None else op["t1"]


# ---------------------------------------------------------------------------
# 1. list append
# ---------------------------------------------------------------------------

def check_list(ops, final, stale_ms=0.0):
    """ops: append (k, v), read (k, r=list), txappend (v={key: value}), txread
    (r={key: list}). final: {key: list} read after the run. stale_ms: reads may miss
    appends acknowledged less than this long before they began (documented replica lag);
    0 for linearizable reads."""
    out = []
    attempted = {}  # value -> op
    acked = {}  # key -> [(t1, value, op)]
    for op in ops:
        if op["f"] == "append":
            attempted[op["v"]] = op
            if op["st"] == "ok":
                acked.setdefault(op["k"], []).append((op["t1"], op["v"], op))
        elif op["f"] == "txappend":
            for k, v in op["v"].items():
                attempted[v] = op
                if op["st"] == "ok":
                    acked.setdefault(k, []).append((op["t1"], v, op))
    pos = {}
    for k, lst in final.items():
        seen = {}
        for i, v in enumerate(lst):
            if v in seen:
                out.append(anomaly("duplicate", [k], f"{v!r} twice in the final list {k}", [attempted.get(v)] if v in attempted else []))
            seen[v] = i
            if v not in attempted:
                out.append(anomaly("phantom", [k], f"{v!r} in {k} was never appended", []))
        pos[k] = seen
    for k, lst in acked.items():
        for (_, v, op) in lst:
            if v not in pos.get(k, {}):
                out.append(anomaly("lost-append", [k], f"acknowledged append {v!r} to {k} is not in the final list", [op]))
    # reads: prefix of the final list, not missing earlier acknowledged appends
    reads = []
    for op in ops:
        if op["st"] != "ok":
            continue
        if op["f"] == "read":
            reads.append((op["k"], op["r"], op))
        elif op["f"] == "txread":
            for k, r in op["r"].items():
                reads.append((k, r, op))
    acked_sorted = {}
    for k, lst in acked.items():
        lst = sorted(lst, key=lambda x: x[0])
        times = [t for (t, _, _) in lst]
        best, prefmax = (-1, None), []
        for (_, v, op) in lst:
            p = pos.get(k, {}).get(v, -1)
            if p > best[0]:
                best = (p, op)
            prefmax.append(best)
        acked_sorted[k] = (times, prefmax)
    for (k, r, op) in reads:
        fl = final.get(k, [])
        if len(set(r)) != len(r):
            out.append(anomaly("duplicate", [k], f"a read of {k} holds a value twice", [op]))
        if r != fl[:len(r)]:
            i = next((i for i in range(len(r)) if i >= len(fl) or r[i] != fl[i]), len(r))
            w = attempted.get(r[i]) if i < len(r) else None
            out.append(anomaly("non-prefix-read", [k],
                               f"read of {k} is not a prefix of the final list: at index {i} read "
                               f"{r[i] if i < len(r) else None!r}, final {fl[i] if i < len(fl) else None!r}",
                               [op] + ([w] if w else [])))
            continue
        if k in acked_sorted:
            times, prefmax = acked_sorted[k]
            j = bisect.bisect_left(times, op["t0"] - stale_ms / 1000.0) - 1
            if j >= 0:
                p, wop = prefmax[j]
                if p >= len(r):
                    out.append(anomaly("stale-read", [k],
                                       f"read of {k} (length {len(r)}) misses {fl[p]!r}, whose append was "
                                       f"acknowledged {1000 * (op['t0'] - wop['t1']):.1f} ms before the read began",
                                       [wop, op]))
    # transactions: atomic writes are seen whole or not at all, in reads and at the end
    for w in ops:
        if w["f"] != "txappend" or w["st"] == "fail":
            continue
        keys = list(w["v"].keys())
        infinal = [w["v"][k] in pos.get(k, {}) for k in keys]
        if any(infinal) and not all(infinal):
            out.append(anomaly("non-atomic-txn", keys, "a MULTI/EXEC append is only partly in the final lists", [w]))
        for op in ops:
            if op["f"] != "txread" or op["st"] != "ok" or not all(k in op["r"] for k in keys):
                continue
            seen = [w["v"][k] in op["r"][k] for k in keys]
            if any(seen) and not all(seen):
                out.append(anomaly("non-atomic-txn-read", keys,
                                   "a MULTI/EXEC read sees part of one MULTI/EXEC append", [w, op]))
    return out


# ---------------------------------------------------------------------------
# 2. register: linearizability (Wing & Gong search with memoisation, as Knossos / Lowe)
# ---------------------------------------------------------------------------

def _step(state, op):
    """(ok, new_state) of applying op to a register holding state."""
    f = op["f"]
    if f == "write":
        return True, op["v"]
    if f == "read":
        return op["r"] == state, state
    if f == "cas":
        old, new = op["v"]
        hit = state == old
        if op["st"] == "ok":
            return (op["r"] == 1) == hit, (new if hit else state)
        return True, (new if hit else state)
    raise ValueError(f)


def linearizable(ops, init=None, budget=2_000_000):
    """(True, None) when the single-register history `ops` is linearizable; (False,
    info) when not, info naming the op no order could place; (None, note) when the search
    ran out of budget. Indeterminate writes may take effect at any time after their
    invocation, or never; failed reads are dropped by the caller."""
    ops = sorted(ops, key=lambda o: o["t0"])
    n = len(ops)
    if n == 0:
        return True, None
    must = 0
    for i, o in enumerate(ops):
        if o["t1"] is not None:
            must |= 1 << i
    ends = [_end(o) for o in ops]
    t0s = [o["t0"] for o in ops]
    seen = set()
    stack = [(0, init)]
    explored = 0
    deepest = (-1, 0, init)
    while stack:
        mask, state = stack.pop()
        if (mask, state) in seen:
            continue
        seen.add((mask, state))
        explored += 1
        if explored > budget:
            return None, f"search budget of {budget} states exhausted"
        if mask & must == must:
            return True, None
        depth = bin(mask & must).count("1")
        if depth > deepest[0]:
            deepest = (depth, mask, state)
        # earliest completion among ops not yet linearized
        first = 0
        while (mask >> first) & 1:
            first += 1
        horizon = INF
        for i in range(first, n):
            if not (mask >> i) & 1 and ends[i] < horizon:
                horizon = ends[i]
            if t0s[i] > horizon:
                break
        for i in range(first, n):
            if t0s[i] > horizon:
                break
            if (mask >> i) & 1:
                continue
            ok, ns = _step(state, ops[i])
            if ok:
                stack.append((mask | (1 << i), ns))
    _, mask, state = deepest
    # the op that could not be placed: the earliest-completing determinate op left
    left = [i for i in range(n) if not (mask >> i) & 1 and ops[i]["t1"] is not None]
    blocker = min(left, key=lambda i: ends[i])
    around = [ops[i] for i in range(n) if t0s[i] <= ends[blocker] and ends[i] >= t0s[blocker] and i != blocker]
    return False, {"state": state, "blocker": ops[blocker], "concurrent": around[:12]}


def prune_unobserved(h):
    """Drops indeterminate writes / CASes whose new value nobody observed (no read
    returned it, no CAS expected it) when no acknowledged CAS failed after they began.
    Sound: had such a write taken effect, nothing could have been linearized between it
    and the next write (a read would have returned its value, a CAS expecting it would
    name it, a failing CAS is excluded), so the history is linearizable with it iff it
    is without it. Keeps the search from branching on every write lost in a failover."""
    observed = set()
    for op in h:
        if op["f"] == "read" and op["st"] == "ok":
            observed.add(op["r"])
        elif op["f"] == "cas":
            observed.add(op["v"][0])
    out = []
    for op in h:
        if op["st"] == "info" and op["f"] in ("write", "cas"):
            new = op["v"] if op["f"] == "write" else op["v"][1]
            failing_cas_after = any(o["f"] == "cas" and o["st"] == "ok" and o["r"] == 0 and _end(o) > op["t0"]
                                    for o in h)
            if new not in observed and not failing_cas_after:
                continue
        out.append(op)
    return out


def check_register(ops, budget=400_000):
    out = []
    bykey = {}
    for op in ops:
        if op["f"] == "read" and op["st"] != "ok":
            continue
        if op["st"] == "fail":
            continue
        bykey.setdefault(op["k"], []).append(op)
    for k, h in sorted(bykey.items()):
        ok, info = linearizable(prune_unobserved(h), budget=budget)
        if ok is False:
            b = info["blocker"]
            out.append(anomaly("non-linearizable", [k],
                               f"register {k}: no linearization places {b['f']} {b.get('v')!r} -> {b.get('r')!r} "
                               f"(value when stuck: {info['state']!r})", [b] + info["concurrent"]))
        elif ok is None:
            out.append(anomaly("checker-undecided", [k], f"register {k}: {info}", []))
    return out


# ---------------------------------------------------------------------------
# 3. counter
# ---------------------------------------------------------------------------

def _subset_sums_contains(amounts, target):
    if target < 0:
        return False
    if len(amounts) > 64:
        return None
    bits = 1
    for a in amounts:
        bits |= bits << a
        if bits.bit_length() > 50_000_000:
            return None
    return bool((bits >> target) & 1)


def check_counter(ops, final):
    """ops: incr (k, v=amount, distinct), read (k, r=int). final: {key: int}."""
    out = []
    keys = {op["k"] for op in ops}
    for k in sorted(keys):
        inc = [op for op in ops if op["k"] == k and op["f"] == "incr"]
        acked = [op for op in inc if op["st"] == "ok"]
        unk = [op for op in inc if op["st"] == "info"]
        lo = sum(op["v"] for op in acked)
        hi = lo + sum(op["v"] for op in unk)
        fv = final.get(k, 0)
        if fv < lo:
            out.append(anomaly("counter-below-acked", [k], f"{k} ends at {fv}, below the {lo} acknowledged",
                               acked[-3:]))
        elif fv > hi:
            out.append(anomaly("counter-above-max", [k], f"{k} ends at {fv}, above every increment attempted ({hi})",
                               unk[-3:]))
        else:
            fits = _subset_sums_contains([op["v"] for op in unk], fv - lo)
            if fits is False:
                out.append(anomaly("counter-impossible", [k],
                                   f"{k} ends at {fv}: {fv - lo} above the acknowledged sum, which no subset "
                                   f"of the {len(unk)} indeterminate increments adds up to", unk[:8]))
        # reads: at least what was acknowledged before they began, at most what was sent
        # before they ended
        acked_by_end = sorted((op["t1"], op["v"]) for op in acked)
        ends = [t for t, _ in acked_by_end]
        csum = list(itertools.accumulate(v for _, v in acked_by_end))
        inv_sorted = sorted((op["t0"], op["v"]) for op in inc if op["st"] != "fail")
        invs = [t for t, _ in inv_sorted]
        isum = list(itertools.accumulate(v for _, v in inv_sorted))
        for op in ops:
            if op["k"] != k or op["f"] != "read" or op["st"] != "ok":
                continue
            j = bisect.bisect_left(ends, op["t0"]) - 1
            need = csum[j] if j >= 0 else 0
            r = op["r"] or 0
            if r < need:
                out.append(anomaly("counter-stale-read", [k],
                                   f"read of {k} = {r}, below the {need} acknowledged before it began", [op]))
            j2 = bisect.bisect_right(invs, op["t1"]) - 1
            most = isum[j2] if j2 >= 0 else 0
            if r > most:
                out.append(anomaly("counter-phantom-read", [k],
                                   f"read of {k} = {r}, above every increment sent before it ended ({most})", [op]))
    return out


# ---------------------------------------------------------------------------
# 4. queue
# ---------------------------------------------------------------------------

def check_queue(ops, final):
    """ops: push (k=queue, v=item), pop (BRPOP: r=item or None), move (BLMOVE to the
    processing list: r=item or None), ack (LREM: v=item, r=count removed).
    final: {queue: items left in the queue and its processing list}."""
    out = []
    for q in sorted({op["k"] for op in ops}):
        qops = [op for op in ops if op["k"] == q]
        pushed = {op["v"]: op for op in qops if op["f"] == "push"}
        acked_push = {v for v, op in pushed.items() if op["st"] == "ok"}
        delivered = {}
        for op in qops:
            if op["f"] in ("pop", "move") and op["st"] == "ok" and op["r"] is not None:
                delivered.setdefault(op["r"], []).append(op)
        acks = {}
        for op in qops:
            if op["f"] == "ack" and op["st"] == "ok":
                acks.setdefault(op["v"], []).append(op)
        left = final.get(q, [])
        left_set = set(left)
        unknown_takes = [op for op in qops if op["f"] in ("pop", "move") and op["st"] == "info"]
        for item, ds in delivered.items():
            if item not in pushed:
                out.append(anomaly("phantom-item", [q], f"{item!r} delivered but never pushed", ds[:1]))
            if len(ds) > 1:
                out.append(anomaly("duplicate-delivery", [q], f"{item!r} delivered {len(ds)} times", ds))
        for item in left:
            if item in delivered and (delivered[item][0]["f"] == "pop" or item in acks):
                out.append(anomaly("duplicate-delivery", [q],
                                   f"{item!r} was delivered and acknowledged, yet is still queued at the end",
                                   delivered[item] + acks.get(item, [])))
        for item, aops in acks.items():
            if all(a["r"] == 0 for a in aops) and item in delivered and item not in left_set:
                pass  # the processing entry vanished: counted as lost below only if not delivered
        missing = [v for v in acked_push if v not in delivered and v not in left_set]
        if len(missing) > len(unknown_takes):
            ex = sorted(missing, key=lambda v: pushed[v]["t1"])
            out.append(anomaly("lost-item", [q],
                               f"{len(missing)} acknowledged pushes neither delivered nor left in {q} "
                               f"(only {len(unknown_takes)} indeterminate pops could have taken them): "
                               f"{ex[:5]}", [pushed[v] for v in ex[:5]]))
    return out


# ---------------------------------------------------------------------------
# 5. locks with fencing
# ---------------------------------------------------------------------------

def check_locks(ops, ttl_ms):
    """ops per resource k, each holder round: acquire (v=owner, r=token or None), fence
    (v=token, r=1 accepted / 0 refused), release (v=owner). A hold is certainly
    exclusive from its acquire's reply to the earlier of its release's invocation and
    acquire-invocation + ttl (the TTL started at the server after the invocation)."""
    out = []
    for k in sorted({op["k"] for op in ops}):
        rops = sorted((op for op in ops if op["k"] == k), key=lambda o: o["t0"])
        holds = []
        by_owner_open = {}
        for op in rops:
            if op["f"] == "acquire" and op["st"] == "ok" and op["r"] is not None:
                h = {"acq": op, "token": op["r"], "start": op["t1"],
                     "end": op["t0"] + ttl_ms / 1000.0, "fence": None, "rel": None}
                holds.append(h)
                by_owner_open[op["p"]] = h
            elif op["f"] in ("fence", "release") and op["p"] in by_owner_open:
                h = by_owner_open[op["p"]]
                if op["f"] == "fence":
                    h["fence"] = op
                else:
                    h["end"] = min(h["end"], op["t0"])
                    h["rel"] = op
                    del by_owner_open[op["p"]]
        # tokens strictly increase in real-time order
        toks = {}
        for h in holds:
            toks.setdefault(h["token"], []).append(h)
        for t, hs in toks.items():
            if len(hs) > 1:
                out.append(anomaly("duplicate-token", [k], f"token {t} issued to {len(hs)} holders of {k}",
                                   [h["acq"] for h in hs]))
        by_end = sorted(holds, key=lambda h: h["acq"]["t1"])
        for a in by_end:
            for b in holds:
                if b is a or b["acq"]["t0"] <= a["acq"]["t1"]:
                    continue
                if b["token"] <= a["token"] and b["token"] != a["token"]:
                    out.append(anomaly("token-not-increasing", [k],
                                       f"{k}: token {b['token']} acquired after token {a['token']}",
                                       [a["acq"], b["acq"]]))
                    break
        # no two certain holds overlap
        hs = sorted(holds, key=lambda h: h["start"])
        for i, a in enumerate(hs):
            for b in hs[i + 1:]:
                if b["start"] >= a["end"]:
                    break
                if b["start"] < b["end"]:
                    out.append(anomaly("two-holders", [k],
                                       f"{k} held by {a['acq']['p']} (token {a['token']}) and {b['acq']['p']} "
                                       f"(token {b['token']}) at once, for {1000 * (min(a['end'], b['end']) - b['start']):.1f} ms",
                                       [x for x in (a["acq"], a["rel"], b["acq"], b["rel"]) if x]))
        # a fenced write made inside its certain hold must be accepted
        for h in holds:
            f = h["fence"]
            if f and f["st"] == "ok" and f["r"] == 0 and f["t1"] is not None and f["t1"] <= h["end"]:
                out.append(anomaly("fenced-in-hold", [k],
                                   f"{k}: the write of token {h['token']} was refused during its holder's certain hold",
                                   [h["acq"], f]))
    return out


# ---------------------------------------------------------------------------
# 6. rate limit
# ---------------------------------------------------------------------------

def check_rate(ops, bound, max_starts=400):
    """ops: req (st ok = admitted, fail = throttled). bound(t0, t1) -> the most requests
    the rule may admit in the window [t0, t1]. A server admits request i at some moment
    in [t0_i, t1_i], so the admitted requests whose whole interval lies in [a, b] were
    admitted in that window: their count must stay within bound(a, b)."""
    out = []
    for k in sorted({op["k"] for op in ops}):
        adm = sorted((op for op in ops if op["k"] == k and op["st"] == "ok"), key=lambda o: o["t0"])
        if not adm:
            continue
        step = max(1, len(adm) // max_starts)
        worst = None
        for i in list(range(0, len(adm), step)) + [0]:
            a = adm[i]["t0"]
            b = -INF
            for j in range(i, len(adm)):
                b = max(b, adm[j]["t1"])
                cnt = j - i + 1
                lim = bound(a, b)
                if cnt > lim and (worst is None or cnt - lim > worst[0]):
                    worst = (cnt - lim, a, b, cnt, lim, adm[i:j + 1])
        if worst:
            _, a, b, cnt, lim, w = worst
            out.append(anomaly("rate-over-bound", [k],
                               f"{k}: {cnt} requests admitted within {1000 * (b - a):.1f} ms, the bound allows {lim:.1f}",
                               [w[0], w[-1]]))
    return out


def _resets_near(resets, a, b):
    """The budget resets that can add to the window [a, b]: those in it or in the second
    before it (a bucket refills within burst / rate, a fraction of a second here)."""
    return sum(1 for t in resets if a - 1.0 <= t <= b)


def gcra_bound(rate, burst, resets=(), slack=1):
    """burst + rate x t, plus one more burst for each budget reset (a restart) in or
    just before the window, plus slack for the bucket's rounding."""
    def f(a, b):
        extra = _resets_near(resets, a, b)
        return burst * (1 + extra) + rate * (b - a) + slack
    return f


def fleet_bound(rate, burst, members, resets=(), slack=1):
    """docs/fleet.md: "In any one-second window the fleet admits at most [...] 1.1 x the
    rule plus one burst, moves or not", plus one request per member for a rule slower
    than 20 x members requests/s. A longer window is covered by ceil(t) one-second
    windows (the documentation states no tighter bound for it). A member restarted in or
    just before the window brings a fresh part of the burst (budgets are in memory), and
    so does the fleet's master failing or coming back (docs/fleet.md: the parts' bursts
    and the bucket's meet in that second)."""
    import math
    floor = members if rate < 20 * members else 0

    def f(a, b):
        extra = _resets_near(resets, a, b)
        windows = max(1, math.ceil((b - a) - 1e-9))
        return windows * (1.1 * rate + burst + floor) + burst * extra + slack
    return f


# ---------------------------------------------------------------------------
# self-tests
# ---------------------------------------------------------------------------

class _H:
    def __init__(self):
        self.ops = []

    def add(self, f, k, v=None, r=None, t0=0.0, t1=0.0, st="ok", p="c1"):
        op = {"id": len(self.ops), "p": p, "f": f, "k": k, "v": v, "r": r, "t0": t0,
              "t1": None if st == "info" else t1, "st": st}
        self.ops.append(op)
        return op


def _kinds(anoms):
    return sorted({a["kind"] for a in anoms})


def selftest():
    failures = []

    def expect(name, anoms, kinds):
        got = _kinds(anoms)
        if sorted(kinds) != got:
            failures.append(f"{name}: expected {sorted(kinds)}, got {got}: {[a['msg'] for a in anoms]}")

    # list
    def lst():
        h = _H()
        h.add("append", "a", "1", t0=0, t1=1)
        h.add("append", "a", "2", t0=2, t1=3)
        h.add("read", "a", r=["1"], t0=1.5, t1=1.6)
        h.add("append", "a", "3", t0=4, t1=None, st="info")
        h.add("txappend", None, {"x": "x1", "y": "y1"}, t0=5, t1=6)
        h.add("txread", None, r={"x": ["x1"], "y": ["y1"]}, t0=7, t1=8)
        return h
    h = lst()
    expect("list clean", check_list(h.ops, {"a": ["1", "2"], "x": ["x1"], "y": ["y1"]}), [])
    expect("list clean with indeterminate applied", check_list(h.ops, {"a": ["1", "2", "3"], "x": ["x1"], "y": ["y1"]}), [])
    expect("lost append", check_list(h.ops, {"a": ["1"], "x": ["x1"], "y": ["y1"]}), ["lost-append"])
    expect("duplicate", check_list(h.ops, {"a": ["1", "2", "2"], "x": ["x1"], "y": ["y1"]}), ["duplicate"])
    h = lst()
    h.add("read", "a", r=["2"], t0=3.5, t1=3.6)
    expect("non-prefix read", check_list(h.ops, {"a": ["1", "2"], "x": ["x1"], "y": ["y1"]}), ["non-prefix-read"])
    h = lst()
    h.add("read", "a", r=["1"], t0=3.5, t1=3.6)
    expect("stale read", check_list(h.ops, {"a": ["1", "2"], "x": ["x1"], "y": ["y1"]}), ["stale-read"])
    expect("stale read within tolerance", check_list(h.ops, {"a": ["1", "2"], "x": ["x1"], "y": ["y1"]}, stale_ms=1000), [])
    h = lst()
    h.add("txread", None, r={"x": ["x1"], "y": []}, t0=5.5, t1=5.6)
    expect("txn read torn", check_list(h.ops, {"a": ["1", "2"], "x": ["x1"], "y": ["y1"]}), ["non-atomic-txn-read"])
    expect("txn torn at end", check_list(lst().ops, {"a": ["1", "2"], "x": ["x1"], "y": []}), ["lost-append", "non-atomic-txn", "non-prefix-read"])

    # register
    def reg():
        h = _H()
        h.add("write", "r", "1", t0=0, t1=1, p="a")
        h.add("read", "r", r="1", t0=1.5, t1=2, p="b")
        h.add("write", "r", "2", t0=2.5, t1=4, p="a")
        h.add("read", "r", r="1", t0=3, t1=3.5, p="b")  # concurrent with write 2: fine
        h.add("cas", "r", ["2", "3"], r=1, t0=5, t1=6, p="b")
        h.add("read", "r", r="3", t0=7, t1=8, p="a")
        return h
    expect("register clean", check_register(reg().ops), [])
    h = reg()
    h.add("read", "r", r="2", t0=9, t1=10, p="b")
    expect("register stale read", check_register(h.ops), ["non-linearizable"])
    h = reg()
    h.add("cas", "r", ["3", "4"], r=0, t0=9, t1=10, p="b")
    expect("register cas refused wrongly", check_register(h.ops), ["non-linearizable"])
    h = reg()
    h.add("write", "r", "9", t0=8.5, st="info", p="c")
    h.add("read", "r", r="9", t0=20, t1=21, p="a")
    h.add("read", "r", r="9", t0=22, t1=23, p="b")
    expect("register indeterminate write applied late", check_register(h.ops), [])
    h2 = reg()
    for i in range(40):
        h2.add("write", "r", f"lost{i}", t0=8.1 + i * 0.01, st="info", p=f"x{i}")
    h2.add("read", "r", r="3", t0=9, t1=10, p="a")
    expect("register many unobserved indeterminate writes", check_register(h2.ops, budget=20000), [])
    h.add("read", "r", r="3", t0=24, t1=25, p="b")
    expect("register value goes back", check_register(h.ops), ["non-linearizable"])
    h = _H()
    h.add("read", "r", r=None, t0=0, t1=1)
    h.add("write", "r", "1", t0=2, t1=3)
    h.add("read", "r", r=None, t0=4, t1=5)
    expect("register read of nothing after a write", check_register(h.ops), ["non-linearizable"])

    # counter
    def ctr():
        h = _H()
        h.add("incr", "c", 1, t0=0, t1=1)
        h.add("incr", "c", 2, t0=1, t1=2)
        h.add("incr", "c", 4, t0=2, st="info")
        h.add("incr", "c", 8, t0=3, t1=4)
        h.add("read", "c", r=3, t0=2.5, t1=2.6)
        return h
    expect("counter clean", check_counter(ctr().ops, {"c": 11}), [])
    expect("counter clean + indeterminate", check_counter(ctr().ops, {"c": 15}), [])
    expect("counter below acked", check_counter(ctr().ops, {"c": 9}), ["counter-below-acked"])
    expect("counter above max", check_counter(ctr().ops, {"c": 16}), ["counter-above-max"])
    expect("counter impossible", check_counter(ctr().ops, {"c": 13}), ["counter-impossible"])
    h = ctr()
    h.add("read", "c", r=1, t0=5, t1=6)
    expect("counter stale read", check_counter(h.ops, {"c": 11}), ["counter-stale-read"])

    # queue
    def que():
        h = _H()
        h.add("push", "q", "i1", t0=0, t1=1)
        h.add("push", "q", "i2", t0=1, t1=2)
        h.add("push", "q", "i3", t0=2, t1=3)
        h.add("pop", "q", r="i1", t0=3, t1=4)
        h.add("move", "q", r="i2", t0=4, t1=5)
        h.add("ack", "q", "i2", r=1, t0=5, t1=6)
        return h
    expect("queue clean", check_queue(que().ops, {"q": ["i3"]}), [])
    expect("queue lost", check_queue(que().ops, {"q": []}), ["lost-item"])
    h = que()
    h.add("pop", "q", t0=6, st="info")
    expect("queue loss explained by an indeterminate pop", check_queue(h.ops, {"q": []}), [])
    h = que()
    h.add("pop", "q", r="i1", t0=6, t1=7)
    expect("queue duplicate", check_queue(h.ops, {"q": ["i3"]}), ["duplicate-delivery"])
    expect("queue resurrected", check_queue(que().ops, {"q": ["i3", "i1"]}), ["duplicate-delivery"])

    # locks
    def lk():
        h = _H()
        for n, (tok, a) in enumerate([(10, 0.0), (20, 1.0), (30, 2.0)]):
            p = f"p{n}"
            h.add("acquire", "L", p, r=tok, t0=a, t1=a + 0.1, p=p)
            h.add("fence", "L", tok, r=1, t0=a + 0.2, t1=a + 0.3, p=p)
            h.add("release", "L", p, r=1, t0=a + 0.4, t1=a + 0.5, p=p)
        return h
    expect("locks clean", check_locks(lk().ops, 5000), [])
    h = lk()
    h.add("acquire", "L", "px", r=15, t0=0.05, t1=0.15, p="px")
    expect("locks two holders", check_locks(h.ops, 5000), ["two-holders"])
    h = lk()
    h.add("acquire", "L", "px", r=20, t0=3.0, t1=3.1, p="px")
    h.add("release", "L", "px", r=1, t0=3.2, t1=3.3, p="px")
    expect("locks token reused", check_locks(h.ops, 5000), ["duplicate-token", "token-not-increasing"])
    h = _H()
    h.add("acquire", "L", "a", r=5, t0=0, t1=0.1, p="a")
    h.add("release", "L", "a", r=1, t0=0.2, t1=0.3, p="a")
    h.add("acquire", "L", "b", r=4, t0=1, t1=1.1, p="b")
    h.add("release", "L", "b", r=1, t0=1.2, t1=1.3, p="b")
    expect("locks token decreasing", check_locks(h.ops, 5000), ["token-not-increasing"])
    h = _H()
    h.add("acquire", "L", "a", r=1, t0=0, t1=0.1, p="a")
    h.add("acquire", "L", "b", r=2, t0=0.2, t1=0.3, p="b")  # a's ttl (100 ms) ran out: fine
    h.add("fence", "L", 1, r=0, t0=0.4, t1=0.5, p="a")
    expect("locks expiry is not two holders", check_locks(h.ops, 100), [])

    # rate
    def rl(n, spacing):
        h = _H()
        for i in range(n):
            h.add("req", "k", t0=i * spacing, t1=i * spacing + 0.001)
        return h
    expect("rate clean", check_rate(rl(30, 0.1).ops, gcra_bound(10, 5)), [])
    expect("rate over", check_rate(rl(40, 0.01).ops, gcra_bound(10, 5)), ["rate-over-bound"])
    expect("rate reset allowance", check_rate(rl(11, 0.001).ops, gcra_bound(10, 5, resets=[0.005])), [])
    expect("fleet over", check_rate(rl(200, 0.004).ops, fleet_bound(100, 20, 3)), ["rate-over-bound"])
    expect("fleet clean", check_rate(rl(300, 0.0095).ops, fleet_bound(100, 20, 3)), [])

    # linearizability search on a larger clean history stays fast
    import random
    import time
    rng = random.Random(7)
    h = _H()
    val, t = None, 0.0
    for i in range(600):
        t += rng.random() * 0.01
        if rng.random() < 0.5:
            val = str(i)
            h.add("write", "big", val, t0=t, t1=t + 0.005, p=f"p{i % 3}")
        else:
            h.add("read", "big", r=val, t0=t, t1=t + 0.005, p=f"p{i % 3}")
        t += 0.006
    s = time.time()
    expect("register 600 sequential ops", check_register(h.ops), [])
    if time.time() - s > 5:
        failures.append("register search too slow on 600 ops")
    return failures
