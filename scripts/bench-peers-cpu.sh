#!/usr/bin/env bash
# Where each proxy's CPU goes, side by side: heatshield, predixy and mithril (one worker
# each) in front of one 3-master cluster, loaded in turn by redis-benchmark, round after
# round. Per request: the proxy's user and kernel CPU (/proc/PID/stat), the three masters'
# CPU, and the commands each master read per read (INFO stats), so a difference between
# proxies can be told apart: the proxy's own code (user), its system calls and wake-ups
# (kernel), or what it makes the masters do (docs/design/performance.md).
#
#   scripts/bench-peers-cpu.sh [--rounds N] [--requests N] [--pipeline P] [--test get|set]
#                              [--clients C] [--bin BINARY]
#
# Defaults: 3 rounds of 300000 GETs at -P1, 50 clients, 100k random keys, 100-byte values.
# The peers are built by ../shared/bench/peers.sh into $PEERS (default /tmp/peers) when
# missing; their configs are ../shared/bench/peers/*.conf.in. heatshield runs with the
# hot-key cache off and metrics off. Ports (127.0.0.1): cluster 7150-7152, heatshield
# 7442, predixy 7443, mithril 7444.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/benchlib.sh
rounds=3 n=300000 p=1 t=get c=50 bin=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --requests) n=$2; shift 2 ;;
    --pipeline) p=$2; shift 2 ;;
    --test) t=$2; shift 2 ;;
    --clients) c=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    *) sed -n '2,16p' "$0" >&2; exit 2 ;;
  esac
done
bench_needs redis-server redis-cli redis-benchmark
H=$(bench_harness) || exit 1
P=${PEERS:-/tmp/peers}
[[ -x $P/predixy && -x $P/mithril ]] || PEERS=$P bash "$H/peers.sh" >&2
if [[ -z $bin ]]; then
  cargo build --release --quiet
  bin=target/release/heatshield
fi
W=${TMPDIR:-/tmp}/heatshield-bench-peers-cpu
mkdir -p "$W"
cleanup() { bench_stop "$W/*.pid"; "$H/cluster.sh" stop "$W/cluster" >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup
"$H/cluster.sh" start "$W/cluster" 7150 3 0 >/dev/null
printf '[cache]\nenabled = false\n' >"$W/hs.toml"
RUST_LOG=warn "$bin" -c "$W/hs.toml" --cluster 127.0.0.1:7150 --listen 127.0.0.1:7442 --metrics off \
  --threads 1 >"$W/heatshield.log" 2>&1 &
echo $! >"$W/heatshield.pid"
sed "s/@PORT@/7443/; s/@SEED@/127.0.0.1:7150/" "$H/peers/predixy.conf.in" >"$W/predixy.conf"
"$P/predixy" "$W/predixy.conf" >"$W/predixy.log" 2>&1 &
echo $! >"$W/predixy.pid"
sed "s/@PORT@/7444/; s/@SEED@/127.0.0.1:7150/" "$H/peers/mithril.conf.in" >"$W/mithril.conf"
"$P/mithril" "$W/mithril.conf" >"$W/mithril.log" 2>&1 &
echo $! >"$W/mithril.pid"
for port in 7442 7443 7444; do
  for _ in $(seq 100); do redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
done
masters=()
for port in 7150 7151 7152; do masters+=("$(cat "$W/cluster/$port/redis.pid")"); done
ticks() { # summed utime + stime of the given pids
  local s=0 x
  for x in "$@"; do s=$((s + $(awk '{print $14 + $15}' "/proc/$x/stat"))); done
  echo "$s"
}
reads() { # the masters' reads and commands processed, summed
  local r=0 k=0 a b port
  for port in 7150 7151 7152; do
    read -r a b < <(redis-cli -p "$port" info stats | tr -d '\r' |
      awk -F: '/^total_reads_processed/ {r = $2} /^total_commands_processed/ {k = $2} END {print r, k}')
    r=$((r + a)) k=$((k + b))
  done
  echo "$r $k"
}
# warm up: connections made, keys written
for port in 7442 7443 7444; do
  redis-benchmark -p "$port" -c "$c" -n 50000 -r 100000 -d 100 -P 16 -t set -q >/dev/null 2>&1
done
tck=$(getconf CLK_TCK)
echo "${t^^} -P$p, $c clients, $n requests a run; µs per request"
printf '%-6s %-11s %6s %6s %6s %8s %10s %10s\n' round proxy user kernel total masters "cmds/read" "ops/s"
for r in $(seq "$rounds"); do
  for name in heatshield predixy mithril; do
    case $name in heatshield) port=7442 ;; predixy) port=7443 ;; mithril) port=7444 ;; esac
    pid=$(cat "$W/$name.pid")
    read -r u0 s0 < <(awk '{print $14, $15}' "/proc/$pid/stat")
    m0=$(ticks "${masters[@]}")
    read -r mr0 mc0 < <(reads)
    ops=$(redis-benchmark -p "$port" -c "$c" -n "$n" -r 100000 -d 100 -P "$p" -t "$t" -q 2>&1 |
      tr '\r' '\n' | awk '/requests per second/ {v = $2} END {print v}')
    read -r u1 s1 < <(awk '{print $14, $15}' "/proc/$pid/stat")
    m1=$(ticks "${masters[@]}")
    read -r mr1 mc1 < <(reads)
    awk -v r="$r" -v nm="$name" -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v m=$((m1 - m0)) -v n="$n" -v k="$tck" \
      -v mr=$((mr1 - mr0)) -v mc=$((mc1 - mc0)) -v ops="$ops" \
      'BEGIN {f = 1e6 / k / n; printf "%-6d %-11s %6.2f %6.2f %6.2f %8.2f %10.1f %10s\n", r, nm, u * f, s * f, (u + s) * f, m * f, (mr ? mc / mr : 0), ops}'
  done
done
