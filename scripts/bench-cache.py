#!/usr/bin/env python3
"""Hot-key cache benchmark: direct Redis, heatshield without the cache and heatshield
with it, on a single hot key and on a Zipf(1.1) read mix over 100,000 keys.

    scripts/bench-cache.py [--rounds 3] [--seconds 5] [--clients 50]

Starts (127.0.0.1 only, with ../shared/bench/cluster.sh): a plain redis on 7100 (the
baseline), a 3-master cluster on 7000-7002, and two release heatshield in front of the
cluster with --threads 1 and metrics off: 7410 with the cache (defaults), 7411 with
[cache] enabled = false. The load comes from benches/load/cache_load.rs (50 clients, GETs of
100-byte values). Targets run round-robin, `--rounds` times; the table shows medians.

Columns: ops/s; the proxy's CPU per second of run; the owning shard's CPU per second
(for the hot key: the master that owns it; for the Zipf mix: all three masters); and the
share of reads that reached Redis (GET calls on those masters / reads sent). Each target
is warmed up for 1.5 s right before each run, so hot keys are already detected: the table is
the steady state.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import BENCH, ROOT, build, cpu, redis_pid, sh, wait_ping











def get_calls(port):
    out = sh("redis-cli", "-p", str(port), "INFO", "commandstats")
    m = re.search(r"cmdstat_get:calls=(\d+)", out)
    return int(m.group(1)) if m else 0


def owner_of(key, masters):
    for p in masters:
        if not sh("redis-cli", "-p", str(p), "GET", key).startswith("MOVED"):
            return p
    raise SystemExit(f"no master owns {key}")





def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--clients", type=int, default=50)
    opts = ap.parse_args()

    load = build("cache_load")

    work = tempfile.mkdtemp(prefix="heatshield-bench-cache-")
    procs = []

    def cleanup():
        for p in procs:
            p.terminate()
        for d in ("single", "cluster"):
            subprocess.run([os.path.join(BENCH, "cluster.sh"), "stop", os.path.join(work, d)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)

    try:
        sh(os.path.join(BENCH, "cluster.sh"), "standalone", os.path.join(work, "single"), "7100")
        sh(os.path.join(BENCH, "cluster.sh"), "start", os.path.join(work, "cluster"), "7000", "3", "0")
        masters = [7000, 7001, 7002]
        off = os.path.join(work, "nocache.toml")
        with open(off, "w") as f:
            f.write("[cache]\nenabled = false\n")
        env = dict(os.environ, RUST_LOG="warn")
        hs = os.path.join(ROOT, "target", "release", "heatshield")
        base = ["--cluster", "127.0.0.1:7000", "--threads", "1", "--metrics", "off"]
        logs = open(os.path.join(work, "heatshield.log"), "w")
        procs.append(subprocess.Popen([hs, *base, "--listen", "127.0.0.1:7410"], env=env, stderr=logs))
        procs.append(subprocess.Popen([hs, *base, "--listen", "127.0.0.1:7411", "--config", off], env=env, stderr=logs))
        for p in (7410, 7411):
            wait_ping(p)
        pids = {"heatshield (cache)": procs[0].pid, "heatshield (no cache)": procs[1].pid}
        targets = [("redis", 7100), ("heatshield (no cache)", 7411), ("heatshield (cache)", 7410)]
        print("prefilling 100,000 keys on redis and on the cluster ...", file=sys.stderr)
        sh(load, "--addr", "127.0.0.1:7100", "--mode", "prefill")
        sh(load, "--addr", "127.0.0.1:7411", "--mode", "prefill")
        hot_owner = owner_of("hotkey", masters)
        results = {}
        workloads = [("hot", 1), ("hot", 16), ("zipf", 1)]
        for rnd in range(opts.rounds):
            for mode, pipe in workloads:
                for name, port in targets:
                    # Warm up: hot keys are detected within a window or two (and cool after
                    # three without reads); the table is the steady state.
                    sh(load, "--addr", f"127.0.0.1:{port}", "--mode", mode, "--seconds", "1.5")
                    shard_ports = [7100] if port == 7100 else ([hot_owner] if mode == "hot" else masters)
                    shard_pids = [redis_pid(p) for p in shard_ports]
                    c0 = [cpu(p) for p in shard_pids]
                    p0 = cpu(pids[name]) if name in pids else None
                    g0 = sum(get_calls(p) for p in shard_ports)
                    t0 = time.time()
                    line = sh(load, "--addr", f"127.0.0.1:{port}", "--mode", mode, "--clients", str(opts.clients),
                              "--seconds", str(opts.seconds), "--pipeline", str(pipe))
                    dt = time.time() - t0
                    m = dict(kv.split("=") for kv in line.split())
                    ops = int(m["ops"])
                    row = {
                        "ops_s": float(m["ops_per_sec"]),
                        "shard_cpu": sum(cpu(p) for p in shard_pids) - sum(c0),
                        "proxy_cpu": (cpu(pids[name]) - p0) if p0 is not None else None,
                        "reached": (sum(get_calls(p) for p in shard_ports) - g0) / ops,
                        "seconds": dt,
                        "errors": int(m["errors"]),
                    }
                    results.setdefault((mode, pipe, name), []).append(row)
                    print(f"round {rnd + 1} {mode:4} P{pipe:<2} {name:22} {row['ops_s']:>9.0f} ops/s  shard cpu "
                          f"{row['shard_cpu'] / dt:.2f}/s  reached {row['reached']:.4f}", file=sys.stderr)
        print(f"\n{opts.clients} clients, GET of 100-byte values, {opts.seconds:g} s per run, median of "
              f"{opts.rounds} rounds; CPU in seconds per second of run\n")
        print("| workload | target | ops/s | vs redis | proxy CPU | shard CPU | reads reaching Redis |")
        print("|---|---|---|---|---|---|---|")
        labels = {"hot": "single hot key", "zipf": "Zipf(1.1), 100k keys"}
        for mode, pipe in workloads:
            label = labels[mode] + ("" if pipe == 1 else f", -P {pipe}")
            base_ops = statistics.median(r["ops_s"] for r in results[(mode, pipe, "redis")])
            for name, _ in targets:
                rows = results[(mode, pipe, name)]
                med = lambda k: statistics.median(r[k] / (r["seconds"] if "cpu" in k else 1) for r in rows)
                ops = med("ops_s")
                proxy = "" if rows[0]["proxy_cpu"] is None else f"{med('proxy_cpu'):.2f}"
                reached = f"{100 * med('reached'):.2f}%"
                errs = sum(r["errors"] for r in rows)
                note = f" ({errs} errors)" if errs else ""
                print(f"| {label} | {name} | {ops:,.0f}{note} | {ops / base_ops:.2f}x | {proxy} | "
                      f"{med('shard_cpu'):.3f} | {reached} |")
    finally:
        cleanup()


if __name__ == "__main__":
    main()
