#!/usr/bin/env python3
"""Same-slot 3-command transactions through heatshield against the same transactions sent
straight to the slot's master (issue: transactions). Each client sends MULTI, INCR, SET,
GET, EXEC in one write and reads the five replies (benches/load/tx_load.rs); every key has
one hash tag, so all of them live on one master.

Rounds alternate the two targets; the table gives medians of transactions per second, of
transactions per CPU-second of the process that served them (the master for direct, the
proxy for heatshield), and both ratios: throughput, and per CPU-second as the project's
other proxy tables give it (a proxy's ops per CPU-second over Redis's own). heatshield runs with one
worker and the hot-key cache off, in front of a 3-master cluster (../shared/bench).

    scripts/bench-tx.py [--rounds N] [--seconds S] [--clients C]
"""
import argparse
import os
import statistics
import subprocess

from benchlib import BENCH, ROOT, build, cpu, redis_pid, sh, wait_ping

PROXY_PORT = 7450


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--clients", type=int, default=50)
    a = ap.parse_args()
    load = build("tx_load")
    work = "/tmp/heatshield-bench-tx"
    os.makedirs(work, exist_ok=True)
    cluster = os.path.join(work, "cluster")
    subprocess.run([f"{BENCH}/cluster.sh", "stop", cluster], capture_output=True)
    sh(f"{BENCH}/cluster.sh", "start", cluster, "7000", "3", "0")
    conf = os.path.join(work, "conf.toml")
    with open(conf, "w") as f:
        f.write("[cache]\nenabled = false\n")
    proxy = subprocess.Popen(
        [os.path.join(ROOT, "target/release/heatshield"), "-c", conf, "--cluster", "127.0.0.1:7000",
         "--listen", f"127.0.0.1:{PROXY_PORT}", "--metrics", "off", "--threads", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "RUST_LOG": "warn"})
    try:
        wait_ping(PROXY_PORT)
        tag = "benchtx"
        slot = int(sh("redis-cli", "-p", "7000", "CLUSTER", "KEYSLOT", tag).strip())
        owner = None
        for line in sh("redis-cli", "-p", "7000", "CLUSTER", "NODES").splitlines():
            f = line.split()
            if "master" in f[2]:
                for r in f[8:]:
                    lo, _, hi = r.partition("-")
                    if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                        owner = int(f[1].split("@")[0].rsplit(":", 1)[1])
        master = redis_pid(owner)
        direct, through, direct_cpu, per_cpu = [], [], [], []
        for _ in range(a.rounds):
            for target in ("direct", "heatshield"):
                port, pid = (owner, master) if target == "direct" else (PROXY_PORT, proxy.pid)
                c0 = cpu(pid)
                out = sh(load, "--addr", f"127.0.0.1:{port}", "--clients", str(a.clients),
                         "--seconds", str(a.seconds), "--tag", tag)
                c1 = cpu(pid)
                kv = dict(p.split("=") for p in out.split())
                tps, per = float(kv["tps"]), float(kv["transactions"]) / max(c1 - c0, 1e-9)
                if target == "direct":
                    direct.append(tps)
                    direct_cpu.append(per)
                else:
                    through.append(tps)
                    per_cpu.append(per)
        d, t = statistics.median(direct), statistics.median(through)
        dc, c = statistics.median(direct_cpu), statistics.median(per_cpu)
        pairs = sorted(h / x for h, x in zip(per_cpu, direct_cpu))
        print("| workload | direct tx/s (tx/cpu-s of Redis) | heatshield tx/s (tx/cpu-s of proxy) "
              "| throughput ratio | per cpu-s ratio |")
        print(f"| 3-command transaction, {a.clients} clients | {d / 1e3:.1f}k ({dc / 1e3:.1f}k) "
              f"| {t / 1e3:.1f}k ({c / 1e3:.1f}k) | {t / d:.2f}x | {c / dc:.2f}x |")
        print(f"rounds: direct {[round(x) for x in direct]}, heatshield {[round(x) for x in through]}")
        print(f"per cpu-s: direct {[round(x) for x in direct_cpu]}, heatshield {[round(x) for x in per_cpu]}")
        print(f"per cpu-s ratio round by round: median {statistics.median(pairs):.2f}, "
              f"range {pairs[0]:.2f}-{pairs[-1]:.2f}")
    finally:
        proxy.terminate()
        proxy.wait()
        subprocess.run([f"{BENCH}/cluster.sh", "stop", cluster], capture_output=True)


if __name__ == "__main__":
    main()
