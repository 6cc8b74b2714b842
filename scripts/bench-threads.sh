#!/usr/bin/env bash
# How many worker threads serve best on this machine: one release heatshield in front of a
# 3-master cluster, started in turn with each worker count, loaded by redis-benchmark
# (50 clients, 100k random keys, 100-byte values) at -P1 and -P16 for GET and SET. The
# counts alternate round by round, so drift on a shared machine hits them alike. Prints
# requests per second and per proxy CPU-second for each count, per round, and the
# medians. The default of `server.threads` (docs: README, "Configuration") was chosen
# from this.
#
#   scripts/bench-threads.sh [ROUNDS [COUNTS...]]     (default: 4 rounds, counts 1 2)
#
# Ports (127.0.0.1): cluster 7000-7002, heatshield 7430. Needs ../shared/bench.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-4}
shift $(($# < 1 ? $# : 1))
counts=("$@")
[[ ${#counts[@]} -gt 0 ]] || counts=(1 2)
H=${BENCH_DIR:-../shared/bench}
[[ -f $H/cluster.sh ]] || { echo "bench harness not found at $H" >&2; exit 1; }
W=${TMPDIR:-/tmp}/heatshield-bench-threads
mkdir -p "$W"
source scripts/benchlib.sh
cleanup() { bench_stop "$W/proxy.pid"; "$H/cluster.sh" stop "$W/cluster" >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup
cargo build --release --quiet
"$H/cluster.sh" start "$W/cluster" 7000 3 0 >/dev/null
printf '[cache]\nenabled = false\n' >"$W/conf.toml"
redis-benchmark -p 7000 -q -n 1 -t set >/dev/null 2>&1 || true
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
tck=$(getconf CLK_TCK)
n=${REQUESTS:-400000}
: >"$W/results"
for round in $(seq "$rounds"); do
  for t in "${counts[@]}"; do
    bench_stop "$W/proxy.pid"
    for _ in $(seq 50); do redis-cli -p 7430 ping >/dev/null 2>&1 || break; sleep 0.1; done
    RUST_LOG=warn target/release/heatshield -c "$W/conf.toml" --cluster 127.0.0.1:7000 --listen 127.0.0.1:7430 \
      --metrics off --threads "$t" >"$W/proxy.log" 2>&1 &
    echo $! >"$W/proxy.pid"
    for _ in $(seq 100); do redis-cli -p 7430 ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
    pid=$(cat "$W/proxy.pid")
    for load in "get 1" "set 1" "get 16" "set 16"; do
      read -r cmd pipe <<<"$load"
      c0=$(cpu "$pid")
      rps=$(redis-benchmark -p 7430 -c 50 -n "$n" -r 100000 -d 100 -P "$pipe" -t "$cmd" --csv 2>/dev/null |
        awk -F'"' 'NR == 2 {print $4}')
      c1=$(cpu "$pid")
      per_cpu=$(python3 -c "print(f'{$n / (($c1 - $c0) / $tck):.0f}')")
      echo "$t ${cmd^^}-P$pipe $rps $per_cpu" >>"$W/results"
      printf 'round %d  threads %d  %-8s %9.0f req/s  %9.0f per proxy CPU-second\n' "$round" "$t" "${cmd^^}-P$pipe" "$rps" "$per_cpu"
    done
  done
done
echo "medians:"
python3 - "$W/results" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
for load in dict.fromkeys(r[1] for r in rows):
    parts = []
    for t in dict.fromkeys(r[0] for r in rows):
        rps = [float(r[2]) for r in rows if r[0] == t and r[1] == load]
        cpu = [float(r[3]) for r in rows if r[0] == t and r[1] == load]
        parts.append(f"threads {t}: {statistics.median(rps):9.0f} req/s {statistics.median(cpu):9.0f}/CPU-s")
    print(f"{load:8s} " + "   ".join(parts))
EOF
