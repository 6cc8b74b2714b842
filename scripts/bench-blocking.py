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
import os
import re
import subprocess
import threading
import time

from benchlib import BENCH, ROOT, build, sh, wait_ping

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
    os.makedirs(work, exist_ok=True)
    cluster = os.path.join(work, "cluster")
    subprocess.run([f"{BENCH}/cluster.sh", "stop", cluster], capture_output=True)
    sh(f"{BENCH}/cluster.sh", "start", cluster, "7100", "3", "0")
    conf = os.path.join(work, "conf.toml")
    with open(conf, "w") as f:
        f.write("[backend]\ndedicated_max_per_node = 8000\n[cache]\nenabled = false\n")
    proxy = subprocess.Popen(
        [os.path.join(ROOT, "target/release/heatshield"), "-c", conf, "--cluster", "127.0.0.1:7100",
         "--listen", f"127.0.0.1:{PROXY_PORT}", "--metrics", "off"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "RUST_LOG": "warn"})
    try:
        wait_ping(PROXY_PORT)
        tag = "benchblk"
        owner = None
        slot = int(sh("redis-cli", "-p", "7100", "CLUSTER", "KEYSLOT", tag).strip())
        for line in sh("redis-cli", "-p", "7100", "CLUSTER", "NODES").splitlines():
            f = line.split()
            if "master" in f[2]:
                for r in f[8:]:
                    lo, _, hi = r.partition("-")
                    if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                        owner = int(f[1].split("@")[0].rsplit(":", 1)[1])
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
        proxy.terminate()
        proxy.wait()
        subprocess.run([f"{BENCH}/cluster.sh", "stop", cluster], capture_output=True)


if __name__ == "__main__":
    main()
