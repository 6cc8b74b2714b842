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
