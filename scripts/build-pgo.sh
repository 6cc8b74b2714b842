#!/usr/bin/env bash
# A profile-guided release build of heatshield (docs/design/performance.md, docs/design/profile.md):
# builds an instrumented heatshield, runs it in front of a throwaway 3-master Redis
# Cluster under redis-benchmark (GET, SET, INCR, LPUSH, LPOP and MSET at -P1 and -P16,
# one hot key, a metrics scrape), and builds again with what it recorded, so the
# compiler lays out and inlines the request path for the way it actually runs.
#
#   scripts/build-pgo.sh        -> target/pgo/release/heatshield
#
# Needs redis-server, redis-cli and redis-benchmark, and llvm-profdata of the LLVM
# version rustc uses (`rustc -vV`): found as llvm-profdata-N, /usr/lib/llvm-N/bin, or
# rustup's llvm-tools; otherwise installed with `apt-get install llvm-N` when run as root.
# Environment: PGO_PORT_BASE, first of the 3 Redis ports (default 7600, cluster bus
# +10000), PGO_LISTEN_PORT (default 7690). Everything binds to 127.0.0.1 and lives in
# ${TMPDIR:-/tmp}/heatshield-pgo.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${PGO_PORT_BASE:-7600}
LISTEN=${PGO_LISTEN_PORT:-7690}
W=${TMPDIR:-/tmp}/heatshield-pgo
log() { printf '[pgo] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
for t in redis-server redis-cli redis-benchmark cargo rustc; do
  command -v "$t" >/dev/null || die "needs $t"
done

major=$(rustc -vV | awk '/^LLVM version/ {split($3, v, "."); print v[1]}')
[[ -n $major ]] || die "cannot tell rustc's LLVM version"
find_profdata() {
  local c
  for c in "llvm-profdata-$major" "/usr/lib/llvm-$major/bin/llvm-profdata" \
    "$(rustc --print sysroot)"/lib/rustlib/*/bin/llvm-profdata; do
    if command -v "$c" >/dev/null 2>&1; then
      echo "$c"
      return
    fi
  done
  if command -v llvm-profdata >/dev/null && llvm-profdata --version | grep -q "LLVM version $major\."; then
    echo llvm-profdata
  fi
}
profdata=$(find_profdata)
if [[ -z $profdata ]]; then
  [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null || die "needs llvm-profdata of LLVM $major (apt-get install llvm-$major, or rustup component add llvm-tools)"
  log "installing llvm-$major (for llvm-profdata)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "llvm-$major" >/dev/null
  profdata=$(find_profdata)
  [[ -n $profdata ]] || die "llvm-$major installed, but no llvm-profdata found"
fi

ports=("$BASE" $((BASE + 1)) $((BASE + 2)))
cleanup() {
  [[ -f $W/proxy.pid ]] && kill "$(cat "$W/proxy.pid")" 2>/dev/null
  rm -f "$W/proxy.pid"
  for p in "${ports[@]}"; do redis-cli -h 127.0.0.1 -p "$p" shutdown nosave >/dev/null 2>&1 || true; done
}
trap cleanup EXIT
cleanup
rm -rf "$W"
mkdir -p "$W/data"

log "building the instrumented heatshield"
RUSTFLAGS="-Cprofile-generate=$W/data" CARGO_TARGET_DIR=target/pgo-gen cargo build --release --quiet

log "starting a 3-master cluster on 127.0.0.1:${ports[*]}"
for p in "${ports[@]}"; do
  mkdir -p "$W/node-$p"
  redis-server --port "$p" --bind 127.0.0.1 --dir "$W/node-$p" --daemonize yes --save '' --appendonly no \
    --cluster-enabled yes --cluster-config-file nodes.conf --logfile "$W/node-$p/log" >/dev/null
done
for p in "${ports[@]}"; do
  for _ in $(seq 50); do redis-cli -h 127.0.0.1 -p "$p" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
done
redis-cli --cluster create "${ports[@]/#/127.0.0.1:}" --cluster-yes >"$W/create.log" 2>&1 || { cat "$W/create.log" >&2; die "cluster create failed"; }
for _ in $(seq 100); do
  ok=1
  for p in "${ports[@]}"; do redis-cli -h 127.0.0.1 -p "$p" cluster info | grep -q '^cluster_state:ok' || ok=0; done
  ((ok)) && break
  sleep 0.2
done

log "training run"
RUST_LOG=warn target/pgo-gen/release/heatshield --cluster "127.0.0.1:$BASE" --listen "127.0.0.1:$LISTEN" \
  --metrics "127.0.0.1:$((LISTEN + 1))" --threads 1 >"$W/proxy.log" 2>&1 &
echo $! >"$W/proxy.pid"
for _ in $(seq 100); do redis-cli -p "$LISTEN" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
for p in 1 16; do
  redis-benchmark -p "$LISTEN" -c 50 -n $((p == 1 ? 100000 : 400000)) -r 100000 -d 100 -P "$p" \
    -t set,get,incr,lpush,lpop,mset -q >/dev/null
done
redis-benchmark -p "$LISTEN" -c 50 -n 200000 -d 100 -P 16 -t get -q >/dev/null # one hot key
curl -s "127.0.0.1:$((LISTEN + 1))/metrics" >/dev/null 2>&1 || true
# a graceful stop writes the profile
pid=$(cat "$W/proxy.pid")
kill -INT "$pid"
wait "$pid" || true
rm -f "$W/proxy.pid"

"$profdata" merge -o "$W/heatshield.profdata" "$W/data"
log "building with the profile"
RUSTFLAGS="-Cprofile-use=$W/heatshield.profdata -Cllvm-args=-pgo-warn-missing-function=false" \
  CARGO_TARGET_DIR=target/pgo cargo build --release --quiet
log "done: target/pgo/release/heatshield"
