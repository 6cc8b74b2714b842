#!/usr/bin/env bash
# Where one heatshield's CPU goes under redis-benchmark (docs/design/profile.md): the system
# calls it makes for 100k GETs at -P1 and -P16 (strace -c), then a perf profile of GET
# -P16 and of GET -P1 (top symbols, and the share of kernel and user space).
#
#   scripts/profile.sh [BINARY]      (default: target/release/heatshield, built if missing)
#
# One worker, metrics off, default configuration otherwise, in front of a 3-master cluster;
# 50 clients over 100k keys. Ports (127.0.0.1): cluster 7000-7002, heatshield 7440.
# Needs perf, strace and ../shared/bench. Output files go to $TMPDIR/heatshield-profile.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/benchlib.sh
bench_needs perf strace redis-benchmark
H=$(bench_harness) || exit 1
bin=${1:-target/release/heatshield}
[[ -x $bin ]] || cargo build --release --quiet
W=${TMPDIR:-/tmp}/heatshield-profile
mkdir -p "$W"
cleanup() { bench_stop "$W/proxy.pid"; "$H/cluster.sh" stop "$W/cluster" >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup
"$H/cluster.sh" start "$W/cluster" 7000 3 0 >/dev/null
RUST_LOG=warn "$bin" --cluster 127.0.0.1:7000 --listen 127.0.0.1:7440 --metrics off --threads 1 >"$W/proxy.log" 2>&1 &
echo $! >"$W/proxy.pid"
pid=$(cat "$W/proxy.pid")
for _ in $(seq 100); do redis-cli -p 7440 ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
redis-benchmark -p 7440 -c 50 -n 100000 -r 100000 -t set -q >/dev/null 2>&1

for p in 1 16; do
  strace -c -f -p "$pid" -o "$W/strace-P$p.txt" &
  spid=$!
  sleep 1
  redis-benchmark -p 7440 -c 50 -n 100000 -r 100000 -P "$p" -t get -q >/dev/null 2>&1
  kill -INT "$spid"
  wait "$spid" 2>/dev/null || true
  echo "== system calls for 100,000 GETs at -P$p"
  grep -E 'sendto|recvfrom|epoll_wait|writev|readv|write$|read$' "$W/strace-P$p.txt" | awk '{print "  " $NF ": " $4}'
done

for p in 16 1; do
  n=$((p == 16 ? 3000000 : 400000))
  perf record -F 2000 -g -p "$pid" -o "$W/perf-P$p.data" -- sleep 6 >/dev/null 2>&1 &
  rpid=$!
  sleep 0.5
  redis-benchmark -p 7440 -c 50 -n "$n" -r 100000 -P "$p" -t get -q >/dev/null 2>&1 || true
  wait "$rpid" 2>/dev/null || true
  echo "== GET -P$p: CPU by object"
  perf report -i "$W/perf-P$p.data" --no-children --sort dso -g none 2>/dev/null | grep '%' | grep -v '^#' | head -4
  echo "== GET -P$p: top symbols"
  perf report -i "$W/perf-P$p.data" --no-children --sort sym -g none 2>/dev/null | grep '%' | grep -v '^#' | head -25
done
