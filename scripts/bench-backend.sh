#!/usr/bin/env bash
# What heatshield saves the cluster: the masters' CPU per request with the clients
# straight on the cluster (`redis-benchmark --cluster`) and through one heatshield worker,
# heatshield's own CPU per request, and the median latency redis-benchmark saw each way,
# for GET and SET at -P1 and -P16 and several client counts (docs/design/performance.md,
# "The cluster's side"; the README shows the table). With --conf, e.g. a [backend]
# section with flush_delay_ms, the same with those settings. With --floor, each -P1 cell
# also measures the best any proxy could do there: one connection a master, each carrying
# its master's share of the clients' requests in one batch (redis-benchmark --cluster
# -c 3 -P clients/3, straight to the masters), over the clients straight on the cluster.
# With --pin the masters run on the last CPU and heatshield and redis-benchmark on the
# others, as where the cluster has machines of its own; without it the scheduler places
# all five processes on every CPU (docs/design/performance.md says what that changes).
#
#   scripts/bench-backend.sh [--clients "50 400 2000"] [--tests "get set"] [--pipelines "1 16"]
#                            [--rounds N] [--bin BINARY] [--conf EXTRA.toml] [--floor] [--pin]
#
# A round runs every cell once, direct then through heatshield; with several rounds each
# figure is the median and the spread (min-max) is printed beside it. Requests a cell:
# $BACKEND_REQUESTS_P1 (300000) at -P1, $BACKEND_REQUESTS_P16 (2000000) at -P16, over 100k
# random keys, 100-byte values. CPU is read from /proc (utime + stime) of each master and
# of heatshield before and after the load. Ports (127.0.0.1): cluster 7100-7102 (3 masters,
# no replicas), heatshield 7190 (one worker, the hot-key cache off, metrics off).
# Needs redis-server, redis-cli and redis-benchmark 7.x, and ../shared/bench.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/benchlib.sh
clients="50 400 2000" tests="get set" pipes="1 16" rounds=1 bin="" extra="" floor=0 pin=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --clients) clients=$2; shift 2 ;;
    --tests) tests=$2; shift 2 ;;
    --pipelines) pipes=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --conf) extra=$2; shift 2 ;;
    --floor) floor=1; shift ;;
    --pin) pin=1; shift ;;
    *) sed -n '2,24p' "$0" >&2; exit 2 ;;
  esac
done
bench_needs redis-server redis-cli redis-benchmark
H=$(bench_harness) || exit 1
if [[ -z $bin ]]; then
  cargo build --release --quiet
  bin=target/release/heatshield
fi
W=${TMPDIR:-/tmp}/heatshield-bench-backend
mkdir -p "$W"
BASE=7100 LISTEN=7190
cleanup() { bench_stop "$W/proxy.pid"; "$H/cluster.sh" stop "$W/cluster" >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup
"$H/cluster.sh" start "$W/cluster" "$BASE" 3 0 >/dev/null
masters=()
for p in $BASE $((BASE + 1)) $((BASE + 2)); do masters+=("$(cat "$W/cluster/$p/redis.pid")"); done
near=() # (with --pin: heatshield and redis-benchmark on every CPU but the masters' one)
if ((pin)); then
  ncpu=$(nproc)
  ((ncpu >= 2)) || { echo "--pin needs two CPUs or more" >&2; exit 2; }
  for m in "${masters[@]}"; do taskset -a -c -p $((ncpu - 1)) "$m" >/dev/null; done
  near=(taskset -c "0-$((ncpu - 2))")
fi
printf '[cache]\nenabled = false\n' >"$W/conf.toml"
# (--conf: more settings, e.g. a [backend] section, appended)
[[ -z $extra ]] || cat "$extra" >>"$W/conf.toml"
RUST_LOG=warn "${near[@]}" "$bin" -c "$W/conf.toml" --cluster "127.0.0.1:$BASE" --listen "127.0.0.1:$LISTEN" \
  --metrics off --threads 1 >"$W/proxy.log" 2>&1 &
echo $! >"$W/proxy.pid"
proxy=$(cat "$W/proxy.pid")
for _ in $(seq 100); do redis-cli -p "$LISTEN" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
cpu() { # summed utime + stime of the given pids, in clock ticks
  local t=0 p
  for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  echo "$t"
}
tck=$(getconf CLK_TCK)
# run DIRECT|PROXY TEST P C: prints masters' and heatshield's µs per request, and the
# median latency redis-benchmark saw (ms)
run() {
  local mode=$1 t=$2 p=$3 c=$4 n
  n=${BACKEND_REQUESTS_P1:-300000}
  ((p > 1)) && n=${BACKEND_REQUESTS_P16:-2000000}
  local args=(-c "$c" -n "$n" -r 100000 -d 100 -P "$p" -t "$t" -q)
  local m0 h0 m1 h1
  m0=$(cpu "${masters[@]}") h0=$(cpu "$proxy")
  if [[ $mode == direct ]]; then
    "${near[@]}" redis-benchmark -h 127.0.0.1 -p "$BASE" --cluster "${args[@]}" >"$W/last.log" 2>&1
  else
    "${near[@]}" redis-benchmark -h 127.0.0.1 -p "$LISTEN" "${args[@]}" >"$W/last.log" 2>&1
  fi
  m1=$(cpu "${masters[@]}") h1=$(cpu "$proxy")
  grep -q "requests per second" "$W/last.log" || { cat "$W/last.log" >&2; echo "redis-benchmark failed" >&2; exit 1; }
  local p50
  p50=$(grep -ao 'p50=[0-9.]*' "$W/last.log" | tail -1 | cut -d= -f2)
  awk -v m=$((m1 - m0)) -v h=$((h1 - h0)) -v n="$n" -v k="$tck" -v l="${p50:-nan}" \
    'BEGIN {printf "%.2f %.2f %s\n", m / k * 1e6 / n, h / k * 1e6 / n, l}'
}
# warm up: connections made, keys written
redis-benchmark -h 127.0.0.1 -p "$LISTEN" -c 50 -n 200000 -r 100000 -d 100 -P 16 -t set -q >/dev/null 2>&1
declare -A res
for r in $(seq "$rounds"); do
  for c in $clients; do
    for t in $tests; do
      for p in $pipes; do
        read -r md _ ld < <(run direct "$t" "$p" "$c")
        read -r mp hp lp < <(run proxy "$t" "$p" "$c")
        # the floor: every master's share of the clients in one batch, no proxy
        mf=nan
        ((floor && p == 1)) && read -r mf _ _ < <(run direct "$t" $(((c + 2) / 3)) 3)
        res[$t $p $c]+="$md $mp $hp $ld $lp $mf;"
        fl=""
        [[ $mf == nan ]] || fl=" (the floor: $mf)"
        printf 'round %d: %s -P%s, %s clients: masters %s µs/request direct, %s through heatshield%s; heatshield %s; p50 %s / %s ms\n' \
          "$r" "${t^^}" "$p" "$c" "$md" "$mp" "$fl" "$hp" "$ld" "$lp" >&2
      done
    done
  done
done
echo
place="every process on every CPU"
((pin)) && place="the masters on CPU $((ncpu - 1)), heatshield and redis-benchmark on CPU 0-$((ncpu - 2))"
echo "Masters' CPU per request (µs, the 3 masters together), direct and through one heatshield worker; $rounds round(s), median (min-max); $place"
echo
if ((floor)); then
  echo "The floor: the masters' CPU per request with each master's share of the clients in one batch"
  echo "(redis-benchmark --cluster -c 3 -P clients/3), over direct: the best batching can do."
  echo
  echo "| workload | clients | masters, direct | masters, through heatshield | ratio | heatshield's own | p50 latency (ms), direct / through | the floor | floor ratio |"
  echo "|---|---|---|---|---|---|---|---|---|"
else
  echo "| workload | clients | masters, direct | masters, through heatshield | ratio | heatshield's own | p50 latency (ms), direct / through |"
  echo "|---|---|---|---|---|---|---|"
fi
for t in $tests; do
  for p in $pipes; do
    for c in $clients; do
      python3 - "${t^^} -P$p" "$c" "${res[$t $p $c]}" "$floor" <<'EOF'
import statistics, sys
name, clients, data, floor = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
rows = [tuple(map(float, x.split())) for x in data.split(';') if x.strip()]
def f(i):
    v = [r[i] for r in rows]
    m = statistics.median(v)
    return f"{m:.2f}" if len(v) == 1 else f"{m:.2f} ({min(v):.2f}-{max(v):.2f})"
ratios = [r[1] / r[0] for r in rows if r[0] > 0]
rm = statistics.median(ratios) if ratios else float('nan')
rs = f"{rm:.2f}×" if len(ratios) <= 1 else f"{rm:.2f}× ({min(ratios):.2f}-{max(ratios):.2f})"
def lat(i):
    v = [r[i] for r in rows if r[i] == r[i]]
    return f"{statistics.median(v):.3f}" if v else "?"
row = f"| {name} | {clients} | {f(0)} | {f(1)} | {rs} | {f(2)} | {lat(3)} / {lat(4)} |"
if floor:
    fl = [r for r in rows if r[5] == r[5]]
    if fl:
        v = [r[5] for r in fl]
        fr = [r[5] / r[0] for r in fl if r[0] > 0]
        fv = f"{statistics.median(v):.2f}" if len(v) == 1 else f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
        fs = f"{statistics.median(fr):.2f}×" if len(fr) == 1 else f"{statistics.median(fr):.2f}× ({min(fr):.2f}-{max(fr):.2f})"
        row += f" {fv} | {fs} |"
    else:
        row += " | |"
print(row)
EOF
    done
  done
done
