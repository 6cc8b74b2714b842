"""Helpers shared by scripts/bench-cache.py and scripts/bench-locks.py: running commands,
reading a process's CPU time, finding Redis's pid, waiting for a port, and building a
load generator from benches/load/."""
import json
import os
import re
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.environ.get("BENCH_DIR", os.path.join(ROOT, "..", "shared", "bench"))
TICK = os.sysconf("SC_CLK_TCK")


def sh(*args, **kw):
    return subprocess.run(args, check=True, text=True, capture_output=True, **kw).stdout


def cpu(pid):
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def redis_pid(port):
    return int(re.search(r"process_id:(\d+)", sh("redis-cli", "-p", str(port), "INFO", "server")).group(1))


def wait_ping(port):
    for _ in range(100):
        try:
            if "PONG" in sh("redis-cli", "-p", str(port), "PING"):
                return
        except subprocess.CalledProcessError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"nothing answers on {port}")


def build(load):
    """Builds heatshield (release) and the load generator benches/load/<load>.rs, a cargo
    example; returns the generator's path (as cargo reports it, so CARGO_TARGET_DIR is
    honoured)."""
    out = sh("cargo", "build", "--release", "--bins", "--example", load, "--message-format=json", cwd=ROOT)
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg["target"]["name"] == load and msg.get("executable"):
            return msg["executable"]
    raise SystemExit(f"cargo built no executable for the example {load}")


def start_cluster(work, port):
    """A fresh 3-master cluster (../shared/bench) in work/cluster on ports port..port+2;
    returns its folder, for stop_cluster."""
    os.makedirs(work, exist_ok=True)
    cluster = os.path.join(work, "cluster")
    stop_cluster(cluster)
    sh(f"{BENCH}/cluster.sh", "start", cluster, str(port), "3", "0")
    return cluster


def stop_cluster(cluster):
    subprocess.run([f"{BENCH}/cluster.sh", "stop", cluster], capture_output=True)


def start_proxy(work, conf_text, cluster_port, listen_port, *extra):
    """Release heatshield (metrics off, RUST_LOG=warn) with conf_text as its configuration,
    in front of the cluster at cluster_port; returns the process once it answers PING.
    HEATSHIELD_BIN names another binary (an older build, for a comparison)."""
    conf = os.path.join(work, "conf.toml")
    with open(conf, "w") as f:
        f.write(conf_text)
    proxy = subprocess.Popen(
        [os.environ.get("HEATSHIELD_BIN", os.path.join(ROOT, "target/release/heatshield")), "-c", conf, "--cluster", f"127.0.0.1:{cluster_port}",
         "--listen", f"127.0.0.1:{listen_port}", "--metrics", "off", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "RUST_LOG": "warn"})
    wait_ping(listen_port)
    return proxy


def slot_owner(seed_port, key):
    """The port of the master that owns key's slot."""
    slot = int(sh("redis-cli", "-p", str(seed_port), "CLUSTER", "KEYSLOT", key).strip())
    for line in sh("redis-cli", "-p", str(seed_port), "CLUSTER", "NODES").splitlines():
        f = line.split()
        if "master" in f[2]:
            for r in f[8:]:
                lo, _, hi = r.partition("-")
                if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                    return int(f[1].split("@")[0].rsplit(":", 1)[1])
    raise SystemExit(f"no master owns slot {slot}")
