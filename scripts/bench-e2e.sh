#!/usr/bin/env bash
# End-to-end benchmark: direct redis, twemproxy and heatshield side by side with
# redis-benchmark, using the shared harness in ../shared/bench (see its README).
#
#   scripts/bench-e2e.sh [compare.py options, e.g. --rounds 3 --workloads get,get-P16]
#
# Starts (all on 127.0.0.1): a plain redis on 7100 (the baseline), a 3-master cluster on
# 7000-7002, twemproxy on 7300 in front of 3 plain redis (7301-7303), and heatshield
# (release build) on 7400 in front of the cluster; runs compare.py; stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BENCH_DIR:-../shared/bench}
[[ -x $B/compare.py || -f $B/compare.py ]] || { echo "bench harness not found at $B" >&2; exit 1; }
command -v nutcracker >/dev/null || { echo "needs nutcracker: apt-get install -y nutcracker" >&2; exit 1; }
W=${TMPDIR:-/tmp}/heatshield-bench
mkdir -p "$W"
cargo build --release --quiet
cleanup() {
  [[ -f $W/heatshield.pid ]] && kill "$(cat "$W/heatshield.pid")" 2>/dev/null || true
  "$B/nutcracker.sh" stop "$W/twem" >/dev/null 2>&1 || true
  "$B/cluster.sh" stop "$W/cluster" >/dev/null 2>&1 || true
  "$B/cluster.sh" stop "$W/single" >/dev/null 2>&1 || true
}
trap cleanup EXIT
cleanup
"$B/cluster.sh" standalone "$W/single" 7100
"$B/cluster.sh" start "$W/cluster" 7000 3 0
"$B/nutcracker.sh" start "$W/twem" 7300 7301 7302 7303
RUST_LOG=warn ${HEATSHIELD_ENV:-} target/release/heatshield --cluster 127.0.0.1:7000 --listen 127.0.0.1:7400 \
  ${HEATSHIELD_ARGS:-} >"$W/heatshield.log" 2>&1 &
echo $! >"$W/heatshield.pid"
for _ in $(seq 100); do redis-cli -p 7400 ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
python3 "$B/compare.py" "$@" redis=127.0.0.1:7100 twemproxy=127.0.0.1:7300 heatshield=127.0.0.1:7400
