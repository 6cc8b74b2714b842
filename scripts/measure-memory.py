#!/usr/bin/env python3
"""Resident memory of a running heatshield: idle, with N idle clients, and with 50 busy clients.

    scripts/measure-memory.py PORT [--idle 1000]

Finds the process listening on PORT (needs ss), opens --idle connections that each send
PING once and then stay open, reads VmRSS, then runs redis-benchmark with 50 clients
(GET/SET, 100-byte values, -P 16) for a few seconds while sampling VmRSS, and prints the
figures in KiB.
"""
import argparse, re, socket, subprocess, threading, time

ap = argparse.ArgumentParser()
ap.add_argument("port", type=int)
ap.add_argument("--idle", type=int, default=1000)
a = ap.parse_args()

out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout
pid = next(int(m.group(1)) for line in out.splitlines() if f":{a.port} " in line
           for m in [re.search(r"pid=(\d+)", line)] if m)
rss = lambda: int(re.search(r"VmRSS:\s+(\d+)", open(f"/proc/{pid}/status").read()).group(1))

print(f"heatshield pid {pid}: idle process {rss()} KiB")
conns = []
for _ in range(a.idle):
    s = socket.create_connection(("127.0.0.1", a.port))
    s.sendall(b"PING\r\n")
    conns.append(s)
for s in conns:
    assert s.recv(16).startswith(b"+PONG")
time.sleep(0.5)
print(f"with {a.idle} idle clients: {rss()} KiB")
peak = [0]
stop = False
def sample():
    while not stop:
        peak[0] = max(peak[0], rss())
        time.sleep(0.05)
t = threading.Thread(target=sample); t.start()
subprocess.run(["redis-benchmark", "-p", str(a.port), "-c", "50", "-n", "2000000", "-P", "16", "-d", "100",
                "-r", "100000", "-t", "set,get", "-q"], capture_output=True)
stop = True; t.join()
print(f"with {a.idle} idle + 50 busy clients (redis-benchmark -P 16): peak {peak[0]} KiB")
for s in conns:
    s.close()
