#!/usr/bin/env bash
# Instructions heatshield executes for one fixed load, counted by valgrind's callgrind: a
# figure that does not move with the machine's noise, for checking that a change to the
# request path costs nothing (the side-by-side run, scripts/bench-ab.sh, gives the ops per
# CPU-second; this gives the instructions behind them).
#
#   scripts/bench-instructions.sh BINARY [BINARY ...]
#
# For each binary (one worker, metrics off, the hot-key cache off) in front of a 3-master
# cluster, the load is redis-benchmark with 50 clients: 200k GET -P16 over 100k keys, 30k
# GET -P1, 100k SET -P16 and 50k MSET -P16 (10 keys in random slots), each step against a
# fresh proxy. Prints the instructions of each step and of all, and their ratio to the
# first binary's. Then a GET -P1 request's instruction-cache footprint: the 64-byte lines
# of machine code that run at least once per request, counted over 30k GET -P1 after a
# warm-up of 20k (scripts/code-footprint.py; at -P1 the kernel evicts much of that cache
# between two requests, so user time follows these lines more than the instructions).
# FOOTPRINT_TOP=N also lists the N functions holding most of those lines (on stderr).
# Ports (127.0.0.1): cluster 7000-7002, heatshield 7430. Needs valgrind and ../shared/bench.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 ]] || { sed -n '2,13p' "$0" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 1; }
H=${BENCH_DIR:-../shared/bench}
[[ -f $H/cluster.sh ]] || { echo "bench harness not found at $H" >&2; exit 1; }
W=${TMPDIR:-/tmp}/heatshield-bench-instructions
mkdir -p "$W"
cleanup() { "$H/cluster.sh" stop "$W/cluster" >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup
"$H/cluster.sh" start "$W/cluster" 7000 3 0 >/dev/null
# slow-log bookkeeping would follow valgrind's slowness, not the load: keep it out
printf '[cache]\nenabled = false\n[admin]\nslowlog_slower_than_us = 100000000\n' >"$W/conf.toml"
steps=("get:16:200000" "get:1:30000" "set:16:100000" "mset:16:50000")
declare -A base
for bin in "$@"; do
  line="$bin:" sum=0 sum_base=0
  for step in "${steps[@]}"; do
    IFS=: read -r t p n <<<"$step"
    # one proxy per step, so each count is that load plus the same start-up and shutdown
    rm -f "$W/cg.out"
    RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$W/cg.out" "$bin" -c "$W/conf.toml" \
      --cluster 127.0.0.1:7000 --listen 127.0.0.1:7430 --metrics off --threads 1 >"$W/proxy.log" 2>&1 &
    pid=$!
    for _ in $(seq 300); do redis-cli -p 7430 ping 2>/dev/null | grep -q PONG && break; sleep 0.2; done
    redis-benchmark -p 7430 -c 50 -n "$n" -r 100000 -P "$p" -t "$t" -q >/dev/null 2>&1
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    ir=$(awk '/^totals:/ {print $2}' "$W/cg.out")
    [[ -n ${base[$step]:-} ]] || base[$step]=$ir
    sum=$((sum + ir)) sum_base=$((sum_base + base[$step]))
    line+=$(printf '  %s -P%s %.1fM (%.3f)' "$t" "$p" "$(bc -l <<<"$ir / 1000000")" "$(bc -l <<<"$ir / ${base[$step]}")")
  done
  printf '%s  all %.1fM (%.3f of the first)' "$line" "$(bc -l <<<"$sum / 1000000")" "$(bc -l <<<"$sum / $sum_base")"
  # the footprint: counters zeroed after the warm-up, dumped after the load
  abs=$(readlink -f "$bin")
  rm -f "$W"/fp.out*
  RUST_LOG=warn valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file="$W/fp.out" "$abs" -c "$W/conf.toml" \
    --cluster 127.0.0.1:7000 --listen 127.0.0.1:7430 --metrics off --threads 1 >"$W/proxy.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do redis-cli -p 7430 ping 2>/dev/null | grep -q PONG && break; sleep 0.2; done
  redis-benchmark -p 7430 -c 50 -n 20000 -r 100000 -P 1 -t get -q >/dev/null 2>&1
  callgrind_control -z "$pid" >/dev/null 2>&1
  redis-benchmark -p 7430 -c 50 -n 30000 -r 100000 -P 1 -t get -q >/dev/null 2>&1
  callgrind_control -d "$pid" >/dev/null 2>&1
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  # (the dump of the worker thread's counters is the newest numbered part)
  fp=$(ls -t "$W"/fp.out.* 2>/dev/null | head -1)
  lines=$(python3 scripts/code-footprint.py "${fp:-$W/fp.out}" "$abs" 30000 "${FOOTPRINT_TOP:-0}")
  [[ -n ${base[lines]:-} ]] || base[lines]=$lines
  printf '  GET -P1 hot code lines %s (%.3f)\n' "$lines" "$(bc -l <<<"$lines / ${base[lines]}")"
done
