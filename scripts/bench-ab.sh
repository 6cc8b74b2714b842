#!/usr/bin/env bash
# Two heatshield builds side by side: both in front of one 3-master cluster (release
# builds, one worker each, metrics off), loaded at the same time by their own
# redis-benchmark, so drift on a shared machine hits both alike. Prints each one's ops per
# proxy CPU-second and the ratio B/A per round; the two swap ports and start order every
# round (use an even number of rounds).
#
#   scripts/bench-ab.sh A B [ROUNDS [redis-benchmark options]]
#
# A and B are each a heatshield binary, optionally with a configuration file as
# BINARY@CONFIG (default: the hot-key cache off, nothing else set), so the same script
# compares two builds or two configurations of one build (scripts/bench-ratelimit.sh).
# Either may also be the word `predixy` or `mithril`: that peer, one worker, with its
# config from ../shared/bench/peers/ (built by ../shared/bench/peers.sh into $PEERS,
# default /tmp/peers, when missing), so a row of scripts/bench-e2e.sh, where each target
# runs in turn, can be checked with both loaded at once.
#
# e.g. to check a change against the commit before it:
#   git worktree add /tmp/before HEAD~1 && (cd /tmp/before && cargo build --release)
#   cargo build --release
#   scripts/bench-ab.sh /tmp/before/target/release/heatshield target/release/heatshield 6 -t get -P 16 -r 100000
#
# Default load: GET -P16 over 100k random keys, 50 clients, $REQUESTS requests (2M).
# AB_METRICS=1 turns the Prometheus exporter on for both (ports 7520 and 7521).
# AB_HOT_KEY=1 sets the key redis-benchmark reads without -r (key:__rand_int__, 100
# bytes) once the cluster is up, for the hot-key row: heatshield's cache on with
# B@benches/configs/defaults.toml, e.g. `AB_HOT_KEY=1 scripts/bench-ab.sh mithril
# target/release/heatshield@benches/configs/defaults.toml 6 -t get -P 1`.
# Ports (127.0.0.1): cluster 7000-7002, heatshield 7420 and 7421. Needs ../shared/bench.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 2 ]] || { sed -n '2,14p' "$0" >&2; exit 2; }
A=$1 B=$2
shift 2
rounds=${1:-6}
shift $(($# < 1 ? $# : 1))
[[ $# -gt 0 ]] || set -- -t get -r 100000 -P 16
H=${BENCH_DIR:-../shared/bench}
[[ -f $H/cluster.sh ]] || { echo "bench harness not found at $H" >&2; exit 1; }
W=${TMPDIR:-/tmp}/heatshield-bench-ab
mkdir -p "$W"
source scripts/benchlib.sh
stop_proxies() { bench_stop "$W/proxy-*.pid"; }
cleanup() { stop_proxies; "$H/cluster.sh" stop "$W/cluster" >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup
"$H/cluster.sh" start "$W/cluster" 7000 3 0 >/dev/null
if [[ -n ${AB_HOT_KEY:-} ]]; then
  redis-cli -c -p 7000 set key:__rand_int__ "$(printf 'x%.0s' $(seq 100))" >/dev/null
fi
printf '[cache]\nenabled = false\n' >"$W/conf.toml"
PEERS=${PEERS:-/tmp/peers}
for spec in "$A" "$B"; do
  case $spec in
    predixy | mithril) [[ -x $PEERS/$spec ]] || PEERS=$PEERS bash "$H/peers.sh" >&2 ;;
  esac
done
# start NAME:BINARY[@CONFIG]:PORT...
start() {
  stop_proxies
  for t in "$@"; do
    IFS=: read -r name spec port <<<"$t"
    bin=${spec%%@*} conf=$W/conf.toml
    [[ $spec == *@* ]] && conf=${spec#*@}
    for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 || break; sleep 0.1; done
    case $spec in
      predixy | mithril)
        sed "s/@PORT@/$port/; s/@SEED@/127.0.0.1:7000/" "$H/peers/$spec.conf.in" >"$W/$name.conf"
        "$PEERS/$spec" "$W/$name.conf" >"$W/proxy-$name.log" 2>&1 &
        ;;
      *)
        metrics=off
        [[ -n ${AB_METRICS:-} ]] && metrics=127.0.0.1:$((port + 100))
        RUST_LOG=warn "$bin" -c "$conf" --cluster 127.0.0.1:7000 --listen 127.0.0.1:"$port" \
          --metrics "$metrics" --threads 1 >"$W/proxy-$name.log" 2>&1 &
        ;;
    esac
    echo $! >"$W/proxy-$name.pid"
    for _ in $(seq 100); do redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
  done
}
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; } # utime + stime, in clock ticks
tck=$(getconf CLK_TCK)
n=${REQUESTS:-2000000}
ratios=()
for round in $(seq "$rounds"); do
  if ((round % 2)); then start a:"$A":7420 b:"$B":7421; else start b:"$B":7420 a:"$A":7421; fi
  pa=$(cat "$W/proxy-a.pid") pb=$(cat "$W/proxy-b.pid")
  ca=$(cpu "$pa") cb=$(cpu "$pb")
  jobs=()
  for port in 7420 7421; do
    redis-benchmark -p "$port" -c 50 -n "$n" -q "$@" >/dev/null 2>&1 &
    jobs+=($!)
  done
  wait "${jobs[@]}"
  line=$(python3 -c "import sys; a, b = ($n / ((float(y) - float(x)) / $tck) for x, y in ((sys.argv[1], sys.argv[2]), (sys.argv[3], sys.argv[4]))); print(f'{b / a:.3f} round $round: A {a / 1e3:.1f}k  B {b / 1e3:.1f}k ops per CPU-second  B/A {b / a:.3f}')" \
    "$ca" "$(cpu "$pa")" "$cb" "$(cpu "$pb")")
  ratios+=("${line%% *}")
  echo "${line#* }"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR] = $1} END {m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; printf "B/A over %d rounds: min %.3f  median %.3f  max %.3f\n", NR, a[1], m, a[NR]}'
