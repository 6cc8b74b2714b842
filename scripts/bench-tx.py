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
import statistics

from benchlib import build, cpu, redis_pid, sh, slot_owner, start_cluster, start_proxy, stop_cluster

PROXY_PORT = 7450


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--clients", type=int, default=50)
    a = ap.parse_args()
    load = build("tx_load")
    work = "/tmp/heatshield-bench-tx"
    cluster = start_cluster(work, 7000)
    proxy = None
    try:
        proxy = start_proxy(work, "[cache]\nenabled = false\n", 7000, PROXY_PORT, "--threads", "1")
        tag = "benchtx"
        owner = slot_owner(7000, tag)
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
        if proxy:
            proxy.terminate()
            proxy.wait()
        stop_cluster(cluster)


if __name__ == "__main__":
    main()
