#!/usr/bin/env bash
# What TLS on the client side costs heatshield: one build run twice in front of one
# 3-master cluster (release build, one worker each, metrics off, the hot-key cache off),
# one serving redis-benchmark over plain TCP, the other over TLS (its `[tls]` listener,
# a certificate made here with openssl), both loaded at the same time so drift on a
# shared machine hits both alike. Prints each one's ops per proxy CPU-second and the
# ratio TLS/plain per round; the two swap ports and start order every round.
#
#   scripts/bench-tls.sh BINARY [ROUNDS [redis-benchmark options]]
#
# e.g. scripts/bench-tls.sh target/release/heatshield 6 -t get -P 16 -r 100000
# Default load: GET -P16 over 100k random keys, 50 clients, $REQUESTS requests (1M).
# Ports (127.0.0.1): cluster 7000-7002, heatshield 7420/7421 (plain) and 7430/7431 (TLS).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 ]] || { sed -n '2,13p' "$0" >&2; exit 2; }
BIN=$1
shift
rounds=${1:-6}
shift $(($# < 1 ? $# : 1))
[[ $# -gt 0 ]] || set -- -t get -r 100000 -P 16
source scripts/benchlib.sh
bench_needs openssl redis-benchmark redis-cli
H=$(bench_harness) || exit 1
W=${TMPDIR:-/tmp}/heatshield-bench-tls
mkdir -p "$W"
stop_proxies() { bench_stop "$W/proxy-*.pid"; }
cleanup() { stop_proxies; "$H/cluster.sh" stop "$W/cluster" >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup
"$H/cluster.sh" start "$W/cluster" 7000 3 0 >/dev/null

# a CA and a certificate for 127.0.0.1
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=bench-ca \
  -keyout "$W/ca.key" -out "$W/ca.crt" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=heatshield \
  -keyout "$W/hs.key" -out "$W/hs.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\n' >"$W/hs.ext"
openssl x509 -req -in "$W/hs.csr" -CA "$W/ca.crt" -CAkey "$W/ca.key" -CAcreateserial -days 2 \
  -extfile "$W/hs.ext" -out "$W/hs.crt" 2>/dev/null

# start NAME PLAIN_PORT [TLS_PORT]
start() {
  local name=$1 port=$2 tls=${3:-}
  printf '[cache]\nenabled = false\n' >"$W/conf-$name.toml"
  if [[ -n $tls ]]; then
    printf '[tls]\nlisten = "127.0.0.1:%s"\ncert_file = "%s"\nkey_file = "%s"\n' "$tls" "$W/hs.crt" "$W/hs.key" \
      >>"$W/conf-$name.toml"
  fi
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 || break; sleep 0.1; done
  RUST_LOG=warn "$BIN" -c "$W/conf-$name.toml" --cluster 127.0.0.1:7000 --listen 127.0.0.1:"$port" \
    --metrics off --threads 1 >"$W/proxy-$name.log" 2>&1 &
  echo $! >"$W/proxy-$name.pid"
  for _ in $(seq 100); do redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
}
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; } # utime + stime, in clock ticks
tck=$(getconf CLK_TCK)
n=${REQUESTS:-1000000}
ratios=()
for round in $(seq "$rounds"); do
  stop_proxies
  if ((round % 2)); then
    start plain 7420; start tls 7421 7431; plain_args=(-p 7420); tls_args=(-p 7431)
  else
    start tls 7420 7430; start plain 7421; plain_args=(-p 7421); tls_args=(-p 7430)
  fi
  pa=$(cat "$W/proxy-plain.pid") pb=$(cat "$W/proxy-tls.pid")
  ca=$(cpu "$pa") cb=$(cpu "$pb")
  redis-benchmark "${plain_args[@]}" -c 50 -n "$n" -q "$@" >/dev/null 2>&1 &
  j1=$!
  redis-benchmark "${tls_args[@]}" --tls --cacert "$W/ca.crt" -c 50 -n "$n" -q "$@" >"$W/tls-bench.out" 2>&1 &
  j2=$!
  wait "$j1" "$j2"
  grep -qi "error" "$W/tls-bench.out" && { cat "$W/tls-bench.out" >&2; exit 1; }
  line=$(python3 -c "import sys; a, b = ($n / ((float(y) - float(x)) / $tck) for x, y in ((sys.argv[1], sys.argv[2]), (sys.argv[3], sys.argv[4]))); print(f'{b / a:.3f} round $round: plain {a / 1e3:.1f}k  TLS {b / 1e3:.1f}k ops per CPU-second  TLS/plain {b / a:.3f}')" \
    "$ca" "$(cpu "$pa")" "$cb" "$(cpu "$pb")")
  ratios+=("${line%% *}")
  echo "${line#* }"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR] = $1} END {m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; printf "TLS/plain over %d rounds: min %.3f  median %.3f  max %.3f\n", NR, a[1], m, a[NR]}'
