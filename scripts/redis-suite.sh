#!/usr/bin/env bash
# Redis 7.0.15's own test suite through heatshield: the yardstick of docs/redis-suite.md.
# Starts a 3-master cluster (127.0.0.1:7100-7102) and a release heatshield in front of it
# on 127.0.0.1:7190 (FLUSHALL allowed, as the suite needs), runs the units with
# ../shared/redis-suite/run.sh and prints passed/failed per unit. With --direct it runs the
# same units against one plain redis-server on 127.0.0.1:7199 instead (the baseline).
#
#   scripts/redis-suite.sh [--direct] [--units "unit/type/list unit/scan ..."] [--out DIR]
#
# HEATSHIELD_BIN=path runs that binary instead of building target/release/heatshield.
# Needs tclsh (apt-get install tcl) and ../shared (the bench harness and the suite).
set -euo pipefail
cd "$(dirname "$0")/.."
H=${BENCH_DIR:-../shared/bench}
S=${SUITE_DIR:-../shared/redis-suite}
[[ -f $H/cluster.sh && -f $S/run.sh ]] || { echo "needs $H/cluster.sh and $S/run.sh" >&2; exit 1; }
direct=0 args=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --direct) direct=1; shift ;;
    --units | --out) args+=("$1" "$2"); shift 2 ;;
    *) sed -n '2,10p' "$0" >&2; exit 2 ;;
  esac
done
W=${TMPDIR:-/tmp}/heatshield-redis-suite
mkdir -p "$W"
source scripts/benchlib.sh
cleanup() {
  bench_stop "$W/proxy.pid"
  "$H/cluster.sh" stop "$W/cluster" >/dev/null 2>&1 || true
  [[ -f $W/direct/redis.pid ]] && kill "$(cat "$W/direct/redis.pid")" 2>/dev/null || true
  rm -rf "$W/direct"
}
trap cleanup EXIT
cleanup
if ((direct)); then
  # a plain redis-server passes every test only with DEBUG allowed
  mkdir -p "$W/direct"
  redis-server --port 7199 --bind 127.0.0.1 --save '' --appendonly no --enable-debug-command yes \
    --daemonize yes --dir "$W/direct" --pidfile "$W/direct/redis.pid" --logfile "$W/direct/redis.log"
  for _ in $(seq 50); do redis-cli -p 7199 ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
  bash "$S/run.sh" --target 127.0.0.1:7199 "${args[@]}"
  exit
fi
bin=${HEATSHIELD_BIN:-}
if [[ -z $bin ]]; then
  cargo build --release --quiet
  bin=target/release/heatshield
fi
"$H/cluster.sh" start "$W/cluster" 7100 3 0 >/dev/null
printf '[server]\nallow_flush = true\n' >"$W/conf.toml"
RUST_LOG=warn "$bin" -c "$W/conf.toml" --cluster 127.0.0.1:7100 --listen 127.0.0.1:7190 \
  --metrics off >"$W/proxy.log" 2>&1 &
echo $! >"$W/proxy.pid"
for _ in $(seq 100); do redis-cli -p 7190 ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
bash "$S/run.sh" --target 127.0.0.1:7190 --nodes "127.0.0.1:7100 127.0.0.1:7101 127.0.0.1:7102" "${args[@]}"
