#!/usr/bin/env bash
# What a rate-limit rule costs: two heatshield (release build, one worker, hot-key cache
# off) in front of one 3-master cluster, one without rules and one with a per-key rule on
# every key that never refuses, measured side by side with the shared harness (rounds
# interleaved, so noise hits both alike). docs/ratelimit.md has the latest table.
#
#   scripts/bench-ratelimit.sh [compare.py options; default --rounds 3 --workloads get,get-P16,hot-get]
#   scripts/bench-ratelimit.sh --simultaneous ROUNDS [redis-benchmark options]
#
# --simultaneous loads both at the same time, each with its own redis-benchmark (50
# clients, $REQUESTS requests, default 3M; by default GET -P16 over 100k random keys,
# i.e. "-t get -r 100000 -P 16"), and prints each one's ops per CPU-second and their ratio per
# round: drift on a shared machine then hits both alike. The two swap ports (and start
# order) every round; use an even number of rounds.
#
# Ports (127.0.0.1): cluster 7000-7002, heatshield 7410 (no rules) and 7411 (the rule);
# with --simultaneous those of scripts/bench-ab.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ${1:-} == --simultaneous ]]; then
  # both loaded at once: scripts/bench-ab.sh with one build and two configurations
  W=${TMPDIR:-/tmp}/heatshield-bench-ratelimit
  mkdir -p "$W"
  cargo build --release --quiet
  printf '[cache]\nenabled = false\n' >"$W/norule.toml"
  printf '[cache]\nenabled = false\n\n[[ratelimit.rules]]\nname = "all"\npattern = "*"\nrate = 1000000000\nburst = 1000000000\n' >"$W/rule.toml"
  rounds=${2:-6}
  shift $(($# < 2 ? $# : 2))
  [[ $# -gt 0 ]] || set -- -t get -r 100000 -P 16
  echo "A = no rule, B = a never-refusing per-key rule on every key"
  REQUESTS=${REQUESTS:-3000000} exec scripts/bench-ab.sh "target/release/heatshield@$W/norule.toml" \
    "target/release/heatshield@$W/rule.toml" "$rounds" "$@"
fi
B=${BENCH_DIR:-../shared/bench}
[[ -f $B/compare.py ]] || { echo "bench harness not found at $B" >&2; exit 1; }
W=${TMPDIR:-/tmp}/heatshield-bench-ratelimit
mkdir -p "$W"
cargo build --release --quiet
source scripts/benchlib.sh
stop_proxies() { bench_stop "$W/heatshield*.pid"; }
cleanup() { stop_proxies; "$B/cluster.sh" stop "$W/cluster" >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup
"$B/cluster.sh" start "$W/cluster" 7000 3 0
printf '[cache]\nenabled = false\n' >"$W/norule.toml"
printf '[cache]\nenabled = false\n\n[[ratelimit.rules]]\nname = "all"\npattern = "*"\nrate = 1000000000\nburst = 1000000000\n' >"$W/rule.toml"
# start NAME:PORT... (restarting any running heatshield)
start() {
  stop_proxies
  for t in "$@"; do
    name=${t%:*} port=${t#*:}
    for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 || break; sleep 0.1; done
    RUST_LOG=warn target/release/heatshield -c "$W/$name.toml" --cluster 127.0.0.1:7000 \
      --listen 127.0.0.1:"$port" --metrics off --threads 1 >"$W/heatshield-$name.log" 2>&1 &
    echo $! >"$W/heatshield-$name.pid"
    for _ in $(seq 100); do redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
  done
}
start norule:7410 rule:7411
[[ $# -gt 0 ]] || set -- --rounds 3 --workloads get,get-P16,hot-get
python3 "$B/compare.py" --baseline no-rule "$@" no-rule=127.0.0.1:7410 rule=127.0.0.1:7411
