#!/usr/bin/env bash
# Replica reads measured (docs/replicas.md): one heatshield in front of a 3+3 cluster,
# GET -P16 over 100k keys, rounds alternating `read_from = "master"` and
# `"prefer-replica"` in one run. For each round: ops per proxy CPU-second, and the CPU
# the masters and the replicas spent per million GETs (their `used_cpu_user` +
# `used_cpu_sys`, from INFO).
#
#   scripts/bench-replicas.sh [BINARY [ROUNDS]]     (default target/release/heatshield, 4)
#
# Ports (127.0.0.1): cluster 7100-7105, heatshield 7430. Needs ../shared/bench.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/heatshield}
rounds=${2:-4}
source scripts/benchlib.sh
H=$(bench_harness) || exit 1
bench_needs redis-benchmark redis-cli python3
W=${TMPDIR:-/tmp}/heatshield-bench-replicas
mkdir -p "$W"
cleanup() { bench_stop "$W/proxy.pid"; "$H/cluster.sh" stop "$W/cluster" >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup
"$H/cluster.sh" start "$W/cluster" 7100 3 1 >/dev/null
masters=() replicas=()
for _ in $(seq 100); do
  masters=() replicas=()
  for p in 7100 7101 7102 7103 7104 7105; do
    case $(redis-cli -p "$p" role | head -1) in
      master) masters+=("$p") ;;
      slave) replicas+=("$p") ;;
    esac
  done
  [[ ${#masters[@]} -eq 3 && ${#replicas[@]} -eq 3 ]] && break
  sleep 0.2
done
cpu_of() { # total CPU seconds of the nodes on the given ports
  local t=0 p
  for p in "$@"; do
    t=$(python3 -c "import sys; print($t + sum(float(l.split(':')[1]) for l in sys.stdin if l.startswith(('used_cpu_user:', 'used_cpu_sys:'))))" \
      < <(redis-cli -p "$p" info cpu | tr -d '\r'))
  done
  echo "$t"
}
tck=$(getconf CLK_TCK)
n=${REQUESTS:-2000000}
start() { # start READ_FROM
  bench_stop "$W/proxy.pid"
  printf '[cache]\nenabled = false\n[backend]\nread_from = "%s"\n' "$1" >"$W/conf.toml"
  for _ in $(seq 50); do redis-cli -p 7430 ping >/dev/null 2>&1 || break; sleep 0.1; done
  RUST_LOG=warn "$BIN" -c "$W/conf.toml" --cluster 127.0.0.1:7100 --listen 127.0.0.1:7430 \
    --metrics off --threads 1 >"$W/proxy.log" 2>&1 &
  echo $! >"$W/proxy.pid"
  for _ in $(seq 100); do redis-cli -p 7430 ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
  # replicas known and in sync (their lag is measured every 100 ms)
  sleep 3
}
start master
redis-benchmark -p 7430 -c 50 -n 200000 -r 100000 -t set -P 16 -q >/dev/null 2>&1
echo "policy          ops/s      ops per proxy CPU-s   masters CPU-s per 1M GETs   replicas CPU-s per 1M GETs"
for round in $(seq "$rounds"); do
  for policy in master prefer-replica; do
    start "$policy"
    pid=$(cat "$W/proxy.pid")
    c0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    m0=$(cpu_of "${masters[@]}") r0=$(cpu_of "${replicas[@]}")
    t0=$(date +%s.%N)
    redis-benchmark -p 7430 -c 50 -n "$n" -r 100000 -t get -P 16 -q >/dev/null 2>&1
    t1=$(date +%s.%N)
    c1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    m1=$(cpu_of "${masters[@]}") r1=$(cpu_of "${replicas[@]}")
    python3 -c "
n, tck = $n, $tck
proxy = ($c1 - $c0) / tck
print(f'{\"$policy\":<15} {n / ($t1 - $t0) / 1e3:7.1f}k   {n / proxy / 1e3:10.1f}k   {($m1 - $m0) * 1e6 / n:22.2f}   {($r1 - $r0) * 1e6 / n:26.2f}')"
  done
done
