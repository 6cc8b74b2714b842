#!/usr/bin/env bash
# End-to-end benchmark: direct redis, twemproxy and heatshield side by side with
# redis-benchmark, using the shared harness in ../shared/bench (see its README).
#
#   scripts/bench-e2e.sh [compare.py options, e.g. --rounds 3 --workloads get,get-P16]
#
# Starts (all on 127.0.0.1): a plain redis on 7100 (the baseline), a 3-master cluster on
# 7000-7002, twemproxy on 7300 in front of 3 plain redis (7301-7303), and two heatshield
# (release build) in front of the cluster: 7400 with metrics on (7480), 7401 with
# --metrics off; runs compare.py; stops everything. HEATSHIELD_ARGS adds flags to both
# (default: --threads 1, one worker, which is fastest on a 2-core machine shared with the
# load generator and Redis). HEATSHIELD_PGO=BINARY adds a third, that binary (a
# profile-guided build from scripts/build-pgo.sh) with metrics on (7482), on 7402.
# The peers predixy (7410) and mithril (7411), one worker each, in front of the same
# cluster: built by ../shared/bench/peers.sh into $PEERS (default /tmp/peers) when missing;
# PEERS=none leaves them out. Their configs are ../shared/bench/peers/*.conf.in.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BENCH_DIR:-../shared/bench}
[[ -x $B/compare.py || -f $B/compare.py ]] || { echo "bench harness not found at $B" >&2; exit 1; }
command -v nutcracker >/dev/null || { echo "needs nutcracker: apt-get install -y nutcracker" >&2; exit 1; }
W=${TMPDIR:-/tmp}/heatshield-bench
mkdir -p "$W"
cargo build --release --quiet
cleanup() {
  for f in "$W"/heatshield*.pid; do [[ -f $f ]] && kill "$(cat "$f")" 2>/dev/null; rm -f "$f"; done
  "$B/nutcracker.sh" stop "$W/twem" >/dev/null 2>&1 || true
  "$B/cluster.sh" stop "$W/cluster" >/dev/null 2>&1 || true
  "$B/cluster.sh" stop "$W/single" >/dev/null 2>&1 || true
}
trap cleanup EXIT
cleanup
"$B/cluster.sh" standalone "$W/single" 7100
"$B/cluster.sh" start "$W/cluster" 7000 3 0
"$B/nutcracker.sh" start "$W/twem" 7300 7301 7302 7303
ARGS=${HEATSHIELD_ARGS:---threads 1}
# shellcheck disable=SC2086
RUST_LOG=warn target/release/heatshield --cluster 127.0.0.1:7000 --listen 127.0.0.1:7400 \
  --metrics 127.0.0.1:7480 $ARGS >"$W/heatshield.log" 2>&1 &
echo $! >"$W/heatshield.pid"
# shellcheck disable=SC2086
RUST_LOG=warn target/release/heatshield --cluster 127.0.0.1:7000 --listen 127.0.0.1:7401 \
  --metrics off $ARGS >"$W/heatshield-nometrics.log" 2>&1 &
echo $! >"$W/heatshield-nometrics.pid"
pgo_target=()
if [[ -n ${HEATSHIELD_PGO:-} ]]; then
  # shellcheck disable=SC2086
  RUST_LOG=warn "$HEATSHIELD_PGO" --cluster 127.0.0.1:7000 --listen 127.0.0.1:7402 \
    --metrics 127.0.0.1:7482 $ARGS >"$W/heatshield-pgo.log" 2>&1 &
  echo $! >"$W/heatshield-pgo.pid"
  pgo_target=(heatshield-pgo=127.0.0.1:7402)
fi
peer_targets=()
if [[ ${PEERS:-} != none ]]; then
  P=${PEERS:-/tmp/peers}
  [[ -x $P/predixy && -x $P/mithril ]] || PEERS=$P bash "$B/peers.sh" >&2 || true
  if [[ -x $P/predixy ]]; then
    sed "s/@PORT@/7410/; s/@SEED@/127.0.0.1:7000/" "$B/peers/predixy.conf.in" >"$W/predixy.conf"
    "$P/predixy" "$W/predixy.conf" >"$W/predixy.log" 2>&1 &
    echo $! >"$W/heatshield-peer-predixy.pid"
    peer_targets+=(predixy=127.0.0.1:7410)
  fi
  if [[ -x $P/mithril ]]; then
    sed "s/@PORT@/7411/; s/@SEED@/127.0.0.1:7000/" "$B/peers/mithril.conf.in" >"$W/mithril.conf"
    "$P/mithril" "$W/mithril.conf" >"$W/mithril.log" 2>&1 &
    echo $! >"$W/heatshield-peer-mithril.pid"
    peer_targets+=(mithril=127.0.0.1:7411)
  fi
  ((${#peer_targets[@]} == 2)) || echo "a peer is missing (see $P/*-build.log): run without it" >&2
fi
for p in 7400 7401 ${HEATSHIELD_PGO:+7402} ${peer_targets[@]:+7410 7411}; do
  for _ in $(seq 100); do redis-cli -p $p ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
done
# scrape the metrics-on instance every 5 s, as Prometheus would
( while sleep 5; do for m in 7480 ${HEATSHIELD_PGO:+7482}; do curl -s 127.0.0.1:$m/metrics >/dev/null 2>&1 || true; done; done ) &
SCRAPER=$!
trap 'kill $SCRAPER 2>/dev/null; cleanup' EXIT
python3 "$B/compare.py" "$@" redis=127.0.0.1:7100 twemproxy=127.0.0.1:7300 \
  heatshield=127.0.0.1:7400 heatshield-nometrics=127.0.0.1:7401 "${pgo_target[@]}" "${peer_targets[@]}"
