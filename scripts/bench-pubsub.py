#!/usr/bin/env python3
"""Pub/sub fan-out (issue: pub/sub, sharded pub/sub and client tracking): N subscribers of
one channel and one publisher (benches/load/pubsub_load.rs), straight to the master that
owns slot 0 (where heatshield keeps its channel subscriptions) and through heatshield,
in turn, R rounds each. Two loads: a fixed rate (delivery latency), and as fast as the
publisher can go with 16 PUBLISHes in flight (messages delivered per second). CPU
seconds of heatshield and of the master are read around each run, and heatshield's RSS
with N subscribers connected (in the first run through it) gives memory per subscribed
client.

    scripts/bench-pubsub.py [--subscribers N] [--rate R] [--seconds S] [--rounds K]
"""
import argparse
import re
import statistics
import threading
import time

from benchlib import build, cpu, redis_pid, sh, slot_owner, start_cluster, start_proxy, stop_cluster

PROXY_PORT = 7470


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--subscribers", type=int, default=1000)
    ap.add_argument("--rate", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    load = build("pubsub_load")
    work = "/tmp/heatshield-bench-pubsub"
    cluster = start_cluster(work, 7100)
    proxy = None
    try:
        proxy = start_proxy(work, "[cache]\nenabled = false\n", 7100, PROXY_PORT, "--threads", "1")
        home = slot_owner(7100, "{06S}")  # a key of slot 0
        rpid = redis_pid(home)
        results = {}
        rss = {}
        for rnd in range(a.rounds):
            for mode, rate in (("rate", a.rate), ("max", 0)):
                for target in ("direct", "heatshield"):
                    port = home if target == "direct" else PROXY_PORT
                    base = rss_kib(proxy.pid)
                    seen = {}

                    def watch():
                        # memory once every subscriber is in (the first second of the run)
                        time.sleep(a.seconds / 2)
                        seen["rss"] = rss_kib(proxy.pid)

                    t = threading.Thread(target=watch)
                    t.start()
                    c0, r0 = cpu(proxy.pid), cpu(rpid)
                    out = sh(load, "--addr", f"127.0.0.1:{port}", "--subscribers", str(a.subscribers),
                             "--seconds", str(a.seconds), "--rate", str(rate), "--channel", f"bench-{rnd}-{mode}")
                    c1, r1 = cpu(proxy.pid), cpu(rpid)
                    t.join()
                    kv = {k: float(v) for k, v in (p.split("=") for p in out.split())}
                    kv["proxy_cpu"] = c1 - c0
                    kv["redis_cpu"] = r1 - r0
                    results.setdefault((mode, target), []).append(kv)
                    # memory from the first run through heatshield only: later runs reuse
                    # what the allocator kept, and would look cheaper than they are
                    if target == "heatshield" and "rss" in seen and "per_sub" not in rss:
                        rss["per_sub"] = [(seen["rss"] - base) / a.subscribers]
                    time.sleep(1)

        def med(mode, target, k):
            return statistics.median(r[k] for r in results[(mode, target)])

        print(f"{a.subscribers} subscribers of one channel, {a.rounds} rounds, medians")
        print("| load | path | published/s | delivered/s | p50 | p99 | heatshield CPU-s | Redis CPU-s |")
        print("|---|---|---|---|---|---|---|---|")
        for mode in ("rate", "max"):
            for target in ("direct", "heatshield"):
                label = f"{a.rate} msg/s" if mode == "rate" else "as fast as it goes"
                pcpu = f"{med(mode, target, 'proxy_cpu'):.2f}" if target == "heatshield" else "-"
                print(f"| {label} | {target} | {med(mode, target, 'published_per_s'):,.0f} "
                      f"| {med(mode, target, 'delivered_per_s'):,.0f} "
                      f"| {med(mode, target, 'p50_us') / 1000:.2f} ms | {med(mode, target, 'p99_us') / 1000:.2f} ms "
                      f"| {pcpu} | {med(mode, target, 'redis_cpu'):.2f} |")
        for target in ("direct", "heatshield"):
            lost = sum(r["expected"] - r["delivered"] for m in ("rate", "max") for r in results[(m, target)])
            print(f"{target}: {lost:.0f} messages not delivered in all runs")
        if rss.get("per_sub"):
            print(f"heatshield RSS per subscribed client: {statistics.median(rss['per_sub']):.1f} KiB")
    finally:
        if proxy:
            proxy.terminate()
            proxy.wait()
        stop_cluster(cluster)


if __name__ == "__main__":
    main()
