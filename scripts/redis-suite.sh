#!/usr/bin/env bash
# Redis 7.0.15's own test suite through heatshield: the yardstick of docs/redis-suite.md.
# Starts a 3-master cluster (127.0.0.1:7100-7102) and a release heatshield in front of it
# on 127.0.0.1:7190 (FLUSHALL allowed, as the suite needs), runs each unit with
# ../shared/redis-suite/run.sh and prints passed/failed per unit. With --direct it runs the
# same units against one plain redis-server on 127.0.0.1:7199 instead (the baseline).
#
#   scripts/redis-suite.sh [--direct] [--units "unit/type/list unit/scan ..."] [--out DIR]
#
# Each unit starts from the servers' settings as they were before the first one: the
# suite's units change settings (maxmemory, encodings, proto-max-bulk-len) and a unit
# that fails part-way leaves them changed, which would fail the next units for reasons of
# their own. Only the settings that differ are set back, with CONFIG SET on every node.
#
# HEATSHIELD_BIN=path runs that binary instead of building target/release/heatshield.
# Needs tclsh (apt-get install tcl) and ../shared (the bench harness and the suite).
set -euo pipefail
cd "$(dirname "$0")/.."
H=${BENCH_DIR:-../shared/bench}
S=${SUITE_DIR:-../shared/redis-suite}
[[ -f $H/cluster.sh && -f $S/run.sh ]] || { echo "needs $H/cluster.sh and $S/run.sh" >&2; exit 1; }
UNITS="unit/type/string unit/type/incr unit/type/list unit/type/hash unit/type/set unit/type/zset
unit/type/stream unit/expire unit/keyspace unit/scan unit/scripting unit/functions unit/multi unit/pubsub
unit/info-command unit/protocol unit/bitops unit/hyperloglog unit/geo unit/querybuf"
direct=0 OUT=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --direct) direct=1; shift ;;
    --units) UNITS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) sed -n '2,16p' "$0" >&2; exit 2 ;;
  esac
done
W=${TMPDIR:-/tmp}/heatshield-redis-suite
mkdir -p "$W"
OUT=${OUT:-$W/logs}
mkdir -p "$OUT"
source scripts/benchlib.sh
# wait_free PORT: until nothing listens there (a stopped server may linger a moment)
wait_free() {
  for _ in $(seq 100); do ss -Hltn "sport = :$1" | grep -q . || return 0; sleep 0.1; done
  echo "port $1 still in use" >&2
  return 1
}
# wait_pong PORT: until it answers PING, or fail
wait_pong() {
  for _ in $(seq 100); do redis-cli -p "$1" ping 2>/dev/null | grep -q PONG && return 0; sleep 0.1; done
  echo "nothing answers on port $1" >&2
  return 1
}
cleanup() {
  bench_stop "$W/proxy.pid"
  "$H/cluster.sh" stop "$W/cluster" >/dev/null 2>&1 || true
  [[ -f $W/direct/redis.pid ]] && kill "$(cat "$W/direct/redis.pid")" 2>/dev/null || true
  rm -rf "$W/direct"
  for p in 7100 7101 7102 7190 7199; do wait_free "$p" || true; done
}
trap cleanup EXIT
cleanup

if ((direct)); then
  # a plain redis-server passes every test only with DEBUG allowed
  mkdir -p "$W/direct"
  redis-server --port 7199 --bind 127.0.0.1 --save '' --appendonly no --enable-debug-command yes \
    --daemonize yes --dir "$W/direct" --pidfile "$W/direct/redis.pid" --logfile "$W/direct/redis.log"
  wait_pong 7199
  target=127.0.0.1:7199 nodes="127.0.0.1:7199" shim=""
else
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
  wait_pong 7190
  target=127.0.0.1:7190 nodes="127.0.0.1:7100 127.0.0.1:7101 127.0.0.1:7102" shim=$nodes
fi

# the settings of every node before the first unit, as `name value` pairs (redis-cli --raw)
for hp in $nodes; do redis-cli -p "${hp##*:}" --raw CONFIG GET '*' >"$W/settings-${hp##*:}"; done
# puts back every setting that differs from before (those that cannot be set are skipped)
restore_settings() {
  local hp port name value now
  for hp in $nodes; do
    port=${hp##*:}
    redis-cli -p "$port" --raw CONFIG GET '*' >"$W/now-$port"
    while IFS= read -r name && IFS= read -r value; do
      now=$(awk -v n="$name" 'NR % 2 == 1 && $0 == n { getline; print; exit }' "$W/now-$port")
      [[ $now == "$value" ]] || redis-cli -p "$port" CONFIG SET "$name" "$value" >/dev/null 2>&1 || true
    done <"$W/settings-$port"
  done
}

tp=0 tf=0 n=0
for u in $UNITS; do
  line=$(bash "$S/run.sh" --target "$target" ${shim:+--nodes "$shim"} --units "$u" --out "$OUT" | grep -v '^logs:\|^redis-suite:')
  log="$OUT/$(echo "$u" | tr / _).log"
  if grep -q '^\[TIMEOUT\]' "$log"; then line="$line  (aborted: timeout)"; fi
  echo "$line"
  ok=$(grep -c '^\[ok\]' "$log" || true) err=$(grep -c '^\[err\]' "$log" || true)
  tp=$((tp + ok)) tf=$((tf + err)) n=$((n + 1))
  restore_settings
done
echo "logs: $OUT"
echo "redis-suite: $tp passed, $tf failed ($n units)"
