#!/usr/bin/env python3
"""Lock benchmark: LOCK.ACQUIRE + LOCK.RELEASE through heatshield against the plain idiom
(SET NX PX + EVAL compare-and-delete) run directly on Redis, and 32 clients contending
for one lock.

    scripts/bench-locks.py [--rounds 3] [--seconds 4]

Starts (127.0.0.1 only, with ../shared/bench/cluster.sh): a plain redis-server on 7100, a
3-master cluster on 7000-7002, and two release heatshield with --threads 1 and metrics
off: 7440 in front of the plain redis (the same backend as the direct run) and 7441 in
front of the cluster. The load comes from benches/load/lock_load.rs: 50 clients for the
uncontended pairs (each on its own key), 32 on one key for contention. Runs alternate
over `--rounds`; the table shows medians, with CPU-seconds per second of run.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time

from benchlib import BENCH, ROOT, build, cpu, redis_pid, sh, wait_ping














def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4)
    opts = ap.parse_args()
    load = build("lock_load")
    work = tempfile.mkdtemp(prefix="heatshield-bench-locks-")
    procs = []
    try:
        sh(os.path.join(BENCH, "cluster.sh"), "standalone", os.path.join(work, "single"), "7100")
        sh(os.path.join(BENCH, "cluster.sh"), "start", os.path.join(work, "cluster"), "7000", "3", "0")
        env = dict(os.environ, RUST_LOG="warn")
        hs = os.path.join(ROOT, "target", "release", "heatshield")
        common = ["--threads", "1", "--metrics", "off"]
        logs = open(os.path.join(work, "heatshield.log"), "w")
        procs.append(subprocess.Popen([hs, "--standalone", "127.0.0.1:7100", "--listen", "127.0.0.1:7440", *common],
                                      env=env, stderr=logs))
        procs.append(subprocess.Popen([hs, "--cluster", "127.0.0.1:7000", "--listen", "127.0.0.1:7441", *common],
                                      env=env, stderr=logs))
        for p in (7440, 7441):
            wait_ping(p)
        runs = [
            ("uncontended pairs", "SET NX PX + EVAL unlock, direct redis", 7100, "plain", 50, None),
            ("uncontended pairs", "SET NX PX + EVAL unlock, heatshield -> redis", 7440, "plain", 50, procs[0].pid),
            ("uncontended pairs", "LOCK.ACQUIRE + RELEASE, heatshield -> redis", 7440, "pairs", 50, procs[0].pid),
            ("uncontended pairs", "LOCK.ACQUIRE + RELEASE, heatshield -> cluster", 7441, "pairs", 50, procs[1].pid),
            ("32 clients, one lock", "heatshield -> redis", 7440, "contended", 32, procs[0].pid),
            ("32 clients, one lock", "heatshield -> cluster", 7441, "contended", 32, procs[1].pid),
        ]
        rpid = redis_pid(7100)
        results = {}
        for rnd in range(opts.rounds):
            for i, (_, _, port, mode, clients, ppid) in enumerate(runs):
                p0 = cpu(ppid) if ppid else None
                r0 = cpu(rpid)
                t0 = time.time()
                line = sh(load, "--addr", f"127.0.0.1:{port}", "--mode", mode, "--clients", str(clients),
                          "--seconds", str(opts.seconds))
                dt = time.time() - t0
                m = dict(kv.split("=") for kv in line.split())
                row = {
                    "per_sec": float(m["per_sec"]),
                    "proxy_cpu": (cpu(ppid) - p0) / dt if ppid else None,
                    "redis_cpu": (cpu(rpid) - r0) / dt if port != 7441 else None,
                    "p50": int(m.get("wake_p50_us", 0)),
                    "p99": int(m.get("wake_p99_us", 0)),
                }
                results.setdefault(i, []).append(row)
                print(f"round {rnd + 1}: {line.strip()}", flush=True, file=__import__("sys").stderr)
        print(f"\nmedians of {opts.rounds} rounds, {opts.seconds:g} s each; CPU in seconds per second of run\n")
        print("| workload | how | per second | proxy CPU | redis CPU | wake-up p50 / p99 |")
        print("|---|---|---|---|---|---|")
        for i, (work_name, how, _, mode, _, _) in enumerate(runs):
            rows = results[i]
            med = lambda k: statistics.median(r[k] for r in rows)
            unit = "acquisitions" if mode == "contended" else "pairs"
            proxy = "" if rows[0]["proxy_cpu"] is None else f"{med('proxy_cpu'):.2f}"
            redis = "" if rows[0]["redis_cpu"] is None else f"{med('redis_cpu'):.2f}"
            wake = f"{med('p50'):.0f} µs / {med('p99'):.0f} µs" if mode == "contended" else ""
            print(f"| {work_name} | {how} | {med('per_sec'):,.0f} {unit} | {proxy} | {redis} | {wake} |")
    finally:
        for p in procs:
            p.terminate()
        for d in ("single", "cluster"):
            subprocess.run([os.path.join(BENCH, "cluster.sh"), "stop", os.path.join(work, d)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
