#!/usr/bin/env python3
"""Blocking commands at scale (issue: transactions, WATCH and blocking commands): N
clients blocked in BLPOP on lists of their own, then LPUSHes at a steady rate to lists
picked at random; the handoff latency is from just before the LPUSH is written to the
blocked client's reply (benches/load/block_load.rs). Every list has one hash tag, so all
live on one master, and the same load goes straight to that master for comparison.

While the clients are blocked the script reads heatshield's RSS and the master's
connected_clients, so the table also gives memory and connections per blocked client.

    scripts/bench-blocking.py [--clients N] [--pushes P] [--rate R]
"""
import argparse
import re
import threading
import time

from benchlib import build, sh, slot_owner, start_cluster, start_proxy, stop_cluster

PROXY_PORT = 7460


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def connected(port):
    return int(re.search(r"connected_clients:(\d+)", sh("redis-cli", "-p", str(port), "INFO", "clients")).group(1))


def blocked(port):
    return int(re.search(r"blocked_clients:(\d+)", sh("redis-cli", "-p", str(port), "INFO", "clients")).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=5000)
    ap.add_argument("--pushes", type=int, default=10000)
    ap.add_argument("--rate", type=int, default=2000)
    a = ap.parse_args()
    load = build("block_load")
    work = "/tmp/heatshield-bench-blocking"
    cluster = start_cluster(work, 7100)
    proxy = None
    try:
        proxy = start_proxy(work, "[backend]\ndedicated_max_per_node = 8000\n[cache]\nenabled = false\n", 7100,
                            PROXY_PORT)
        tag = "benchblk"
        owner = slot_owner(7100, tag)
        rows = []
        for target in ("direct", "heatshield"):
            port = owner if target == "direct" else PROXY_PORT
            base_conns = connected(owner)
            base_rss = rss_kib(proxy.pid)
            seen = {}

            def watch():
                # once every client is blocked: memory and connections
                deadline = time.time() + 60
                while time.time() < deadline:
                    if blocked(owner) >= a.clients:
                        seen["rss"] = rss_kib(proxy.pid)
                        seen["conns"] = connected(owner)
                        return
                    time.sleep(0.2)

            t = threading.Thread(target=watch)
            t.start()
            out = sh(load, "--addr", f"127.0.0.1:{port}", "--clients", str(a.clients),
                     "--pushes", str(a.pushes), "--rate", str(a.rate), "--tag", tag)
            t.join()
            kv = dict(p.split("=") for p in out.split())
            extra = ""
            if target == "heatshield" and "rss" in seen:
                per_kib = (seen["rss"] - base_rss) / a.clients
                per_conn = (seen["conns"] - base_conns) / a.clients
                extra = f"{per_kib:.1f} KiB RSS and {per_conn:.2f} backend connections per blocked client"
            rows.append((target, kv, extra))
            time.sleep(1)
        for target, kv, extra in rows:
            print(f"| {target} | {kv['clients']} | {kv['served']}/{kv['pushes']} at {a.rate}/s "
                  f"| {int(kv['p50_us']) / 1000:.2f} ms | {int(kv['p99_us']) / 1000:.2f} ms "
                  f"| {int(kv['max_us']) / 1000:.1f} ms | {extra} |")
    finally:
        if proxy:
            proxy.terminate()
            proxy.wait()
        stop_cluster(cluster)


if __name__ == "__main__":
    main()
