#!/usr/bin/env bash
# Where a proxy's CPU per request goes beyond Redis's own (docs/design/profile.md, "The floor at
# -P1"): for direct Redis, twemproxy and heatshield in turn, the server process's user and
# kernel CPU per request, and per request the system calls it makes, the tasks it wakes
# and the times it is switched out (perf's tracepoints), plus the load generator's CPU.
#
#   scripts/bench-floor.sh [ROUNDS] [PIPELINE]      (defaults: 3 rounds, -P 1)
#
# redis-benchmark GET, 50 clients, 100k keys, 100-byte values, $N requests per run
# (default 400000). One worker, metrics off. Ports (127.0.0.1): a plain redis on 7100, a
# 3-master cluster on 7000-7002, twemproxy on 7300 (plain redis on 7301-7303), heatshield on
# 7400. Needs perf (run as root, or with perf_event_paranoid <= 1 and tracefs readable),
# nutcracker and ../shared/bench. HEATSHIELD_BIN picks the binary (default: the release
# build, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
pipeline=${2:-1}
n=${N:-400000}
source scripts/benchlib.sh
bench_needs perf nutcracker redis-benchmark
B=$(bench_harness) || exit 1
bin=${HEATSHIELD_BIN:-target/release/heatshield}
[[ -x $bin ]] || cargo build --release --quiet
W=${TMPDIR:-/tmp}/heatshield-floor
mkdir -p "$W"
cleanup() {
  bench_stop "$W/heatshield.pid"
  "$B/nutcracker.sh" stop "$W/twem" >/dev/null 2>&1 || true
  "$B/cluster.sh" stop "$W/cluster" >/dev/null 2>&1 || true
  "$B/cluster.sh" stop "$W/single" >/dev/null 2>&1 || true
}
trap cleanup EXIT
cleanup
"$B/cluster.sh" standalone "$W/single" 7100 >/dev/null
"$B/cluster.sh" start "$W/cluster" 7000 3 0 >/dev/null
"$B/nutcracker.sh" start "$W/twem" 7300 7301 7302 7303 >/dev/null
RUST_LOG=warn "$bin" --cluster 127.0.0.1:7000 --listen 127.0.0.1:7400 --metrics off --threads 1 \
  >"$W/heatshield.log" 2>&1 &
echo $! >"$W/heatshield.pid"
for p in 7100 7300 7400; do
  for _ in $(seq 100); do redis-cli -p $p ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
  redis-benchmark -p $p -c 50 -n 100000 -r 100000 -d 100 -t set -q >/dev/null 2>&1
done
redis_pid=$(cat "$W/single/7100/redis.pid" 2>/dev/null || pgrep -f 'redis-server 127.0.0.1:7100' | head -1)
twem_pid=$(cat "$W/twem/nutcracker.pid")
hs_pid=$(cat "$W/heatshield.pid")
twem_backends=$(cat "$W"/twem/redis/*/redis.pid | tr '\n' ' ')
cluster_nodes=$(cat "$W"/cluster/*/redis.pid | tr '\n' ' ')
# sleeps PID...: voluntary context switches (times it went to sleep) of these processes
sleeps() {
  local p s=0
  for p in "$@"; do s=$((s + $(awk '/^voluntary_ctxt_switches/ { v += $2 } END { print v + 0 }' /proc/"$p"/task/*/status))); done
  echo "$s"
}
# cpu PID...: user + system clock ticks of these processes
cpu() {
  local p s=0
  for p in "$@"; do s=$((s + $(awk '{ print $14 + $15 }' /proc/"$p"/stat))); done
  echo "$s"
}
tck=$(getconf CLK_TCK)
events=syscalls:sys_enter_sendto,syscalls:sys_enter_write,syscalls:sys_enter_writev
events=$events,syscalls:sys_enter_recvfrom,syscalls:sys_enter_read,syscalls:sys_enter_readv
events=$events,syscalls:sys_enter_epoll_wait,sched:sched_wakeup,sched:sched_switch

# per_req COUNT: COUNT per request, 3 decimals
per_req() { awk -v c="$1" -v n="$n" 'BEGIN { printf "%.3f", c / n }'; }
# ns TICKS: clock ticks as nanoseconds per request
ns() { awk -v t="$1" -v tck="$tck" -v n="$n" 'BEGIN { printf "%d", t * 1e9 / tck / n }'; }
count() { awk -v e="$1" '$2 == e { gsub(",", "", $1); s += $1 } END { print s + 0 }' "$W/perf.txt"; }

printf '%-5s %-10s %8s %8s %8s %8s %6s %6s %6s %6s %6s %8s %8s %8s %8s\n' round server ops/s user_ns sys_ns \
  total_ns sends recvs epoll wakes switch gen_ns gen_slp back_slp back_ns
for r in $(seq "$rounds"); do
  for spec in "redis:7100:$redis_pid:" "twemproxy:7300:$twem_pid:$twem_backends" \
    "heatshield:7400:$hs_pid:$cluster_nodes"; do
    IFS=: read -r name port pid backends <<<"$spec"
    # shellcheck disable=SC2086
    b1=$(sleeps $backends)
    # shellcheck disable=SC2086
    c1=$(cpu $backends)
    read -r u1 s1 < <(awk '{print $14, $15}' "/proc/$pid/stat")
    # perf stops after the benchmark (SIGINT does not reach a background job; its own
    # command ends it): the window is the benchmark's run plus a little
    perf stat -e "$events" -p "$pid" -o "$W/perf.txt" -- sleep 1000 2>/dev/null &
    perf_pid=$!
    sleep 0.3
    /usr/bin/time -f '%U %S %w' -o "$W/gen.txt" redis-benchmark -p "$port" -c 50 -n "$n" -r 100000 \
      -d 100 -P "$pipeline" -t get -q >"$W/bench.txt" 2>&1
    read -r u2 s2 < <(awk '{print $14, $15}' "/proc/$pid/stat")
    pkill -TERM -P "$perf_pid" sleep 2>/dev/null || true
    wait "$perf_pid" 2>/dev/null || true
    # shellcheck disable=SC2086
    b2=$(sleeps $backends)
    # shellcheck disable=SC2086
    c2=$(cpu $backends)
    read -r gu gs gw <"$W/gen.txt"
    ops=$(tr '\r' '\n' <"$W/bench.txt" | grep -o '[0-9.]* requests per second' | head -1 | cut -d' ' -f1)
    printf '%-5s %-10s %8.0f %8s %8s %8s %6s %6s %6s %6s %6s %8s %8s %8s %8s\n' "$r" "$name" "$ops" \
      "$(ns $((u2 - u1)))" "$(ns $((s2 - s1)))" "$(ns $((u2 - u1 + s2 - s1)))" \
      "$(per_req $(($(count syscalls:sys_enter_sendto) + $(count syscalls:sys_enter_write) + $(count syscalls:sys_enter_writev))))" \
      "$(per_req $(($(count syscalls:sys_enter_recvfrom) + $(count syscalls:sys_enter_read) + $(count syscalls:sys_enter_readv))))" \
      "$(per_req "$(count syscalls:sys_enter_epoll_wait)")" \
      "$(per_req "$(count sched:sched_wakeup)")" "$(per_req "$(count sched:sched_switch)")" \
      "$(awk -v u="$gu" -v s="$gs" -v n="$n" 'BEGIN { printf "%d", (u + s) * 1e9 / n }')" \
      "$(per_req "$gw")" "$(per_req $((b2 - b1)))" "$(ns $((c2 - c1)))"
  done
done
echo "user_ns, sys_ns, total_ns: the server process's CPU per request; sends, recvs, epoll: its"
echo "system calls per request; wakes: tasks it woke per request; switch: times it was switched"
echo "out per request; gen_ns: redis-benchmark's CPU per request; gen_slp, back_slp: times per"
echo "request redis-benchmark and the proxy's Redis servers went to sleep (each one wake-up);"
echo "back_ns: those Redis servers' CPU per request, together"
