#!/usr/bin/env bash
# Run heatshield in front of a throwaway local Redis Cluster (3 masters, 3 replicas).
#
# Usage:
#   scripts/demo.sh [start] [-- EXTRA HEATSHIELD ARGS...]   build, start cluster, run proxy
#   scripts/demo.sh stop                                    stop a running or previous demo (proxy and servers)
#
# Environment:
#   DEMO_PORT_BASE    first Redis port (default 30001; nodes use BASE..BASE+5,
#                     cluster bus ports are +10000)
#   DEMO_LISTEN_PORT  port heatshield listens on (default 6380, on 127.0.0.1)
#   TMPDIR            the demo lives in ${TMPDIR:-/tmp}/heatshield-demo
#
# Everything binds to 127.0.0.1 only. Ctrl-C (or SIGTERM) stops the proxy and
# the Redis servers this script started.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEMO_DIR="${TMPDIR:-/tmp}/heatshield-demo"
DEMO_DIR_REAL="$(realpath -m "$DEMO_DIR")"
PORT_BASE="${DEMO_PORT_BASE:-30001}"
LISTEN_PORT="${DEMO_LISTEN_PORT:-6380}"
NODES=6
HOST=127.0.0.1

log() { printf '[demo] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ "$PORT_BASE" =~ ^[0-9]+$ ]] || die "DEMO_PORT_BASE must be a number, got '$PORT_BASE'"
[[ "$LISTEN_PORT" =~ ^[0-9]+$ ]] || die "DEMO_LISTEN_PORT must be a number, got '$LISTEN_PORT'"
if ((PORT_BASE < 1024 || PORT_BASE + NODES - 1 + 10000 > 65535)); then
    die "DEMO_PORT_BASE=$PORT_BASE out of range (need 1024..$((65535 - 10000 - NODES + 1)))"
fi

PORTS=()
for ((i = 0; i < NODES; i++)); do
    PORTS+=($((PORT_BASE + i)))
done

# True if something accepts TCP connections on 127.0.0.1:$1.
port_in_use() {
    (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null
}

# True if the redis on port $1 is one of ours (its working dir is under DEMO_DIR).
is_our_redis() {
    local dir
    # timeout: a non-Redis listener may accept and never answer.
    dir="$(timeout 3 redis-cli -h "$HOST" -p "$1" --raw config get dir 2>/dev/null | sed -n '2p')" || return 1
    [[ -n "$dir" && ("$dir" == "$DEMO_DIR"/* || "$dir" == "$DEMO_DIR_REAL"/*) ]]
}

# True if process $1 exists and is not a zombie.
pid_alive() {
    local state
    kill -0 "$1" 2>/dev/null || return 1
    state="$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)" || return 0
    [[ "$state" != Z ]]
}

# Stop every node of the demo at once (SIGTERM by pidfile, or SHUTDOWN NOSAVE
# for a node whose pidfile is gone if its dir shows it is ours), wait for all,
# then SIGKILL stragglers.
stop_all() {
    local port pid pidfile
    local -a pids=() ports=()
    for port in "${PORTS[@]}"; do
        pidfile="$DEMO_DIR/$port/redis.pid"
        pid=""
        if [[ -f "$pidfile" ]]; then
            pid="$(cat "$pidfile" 2>/dev/null || true)"
        fi
        if [[ -n "$pid" ]] && pid_alive "$pid"; then
            # SIGTERM = SHUTDOWN (nothing is saved: save "" and no AOF), and
            # unlike redis-cli it never blocks on a busy node.
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
            ports+=("$port")
        elif port_in_use "$port" && is_our_redis "$port"; then
            redis-cli -h "$HOST" -p "$port" shutdown nosave >/dev/null 2>&1 || true
            pids+=("")
            ports+=("$port")
        fi
    done
    local i deadline=$((SECONDS + 10)) waiting
    while :; do
        waiting=0
        for i in "${!ports[@]}"; do
            if [[ -n "${pids[i]}" ]]; then
                pid_alive "${pids[i]}" && waiting=1
            else
                port_in_use "${ports[i]}" && waiting=1
            fi
        done
        ((waiting && SECONDS < deadline)) || break
        sleep 0.1
    done
    for i in "${!ports[@]}"; do
        if [[ -n "${pids[i]}" ]] && pid_alive "${pids[i]}"; then
            log "redis on port ${ports[i]} (pid ${pids[i]}) did not stop; sending SIGKILL"
            kill -KILL "${pids[i]}" 2>/dev/null || true
        elif [[ -z "${pids[i]}" ]] && port_in_use "${ports[i]}"; then
            log "warning: redis on port ${ports[i]} is still running"
        fi
        log "stopped redis on port ${ports[i]}"
    done
    for port in "${PORTS[@]}"; do
        rm -f "$DEMO_DIR/$port/redis.pid"
    done
}

# Start one daemonized cluster node on port $1 and wait until it answers PING.
# Ports 40001+ (the cluster bus) lie in Linux's ephemeral range, so a closing
# outgoing connection (TIME_WAIT) can briefly hold one: retry for up to ~70s.
start_node() {
    local port="$1" dir="$DEMO_DIR/$1" attempt i warned=0
    for ((attempt = 0; attempt < 70; attempt++)); do
        rm -rf "${dir:?}"
        mkdir -p "$dir"
        redis-server \
            --port "$port" \
            --bind "$HOST" \
            --dir "$dir" \
            --daemonize yes \
            --pidfile "$dir/redis.pid" \
            --logfile "$dir/redis.log" \
            --cluster-enabled yes \
            --cluster-config-file nodes.conf \
            --cluster-node-timeout 5000 \
            --repl-diskless-sync-delay 0 \
            --save "" \
            --appendonly no
        for ((i = 0; i < 100; i++)); do
            if [[ "$(redis-cli -h "$HOST" -p "$port" ping 2>/dev/null)" == PONG ]]; then
                return 0
            fi
            if grep -q 'Address already in use' "$dir/redis.log" 2>/dev/null; then
                break
            fi
            sleep 0.1
        done
        if ! grep -q 'Address already in use' "$dir/redis.log" 2>/dev/null; then
            die "redis on port $port did not come up; see $dir/redis.log"
        fi
        if ((!warned)); then
            log "port $port or $((port + 10000)) is held by a closing connection; waiting for it to free up"
            warned=1
        fi
        sleep 1
    done
    die "port $port or $((port + 10000)) stayed busy; see $dir/redis.log (or set DEMO_PORT_BASE)"
}

start_cluster() {
    local port bus
    stop_all # leftovers from a previous demo on these ports
    for port in "${PORTS[@]}"; do
        bus=$((port + 10000))
        if port_in_use "$port"; then
            die "port $port is in use by something that is not a heatshield demo; set DEMO_PORT_BASE"
        fi
        if port_in_use "$bus"; then
            die "cluster bus port $bus is in use; set DEMO_PORT_BASE"
        fi
    done
    if port_in_use "$LISTEN_PORT"; then
        die "port $LISTEN_PORT (heatshield listen) is in use; set DEMO_LISTEN_PORT"
    fi

    mkdir -p "$DEMO_DIR"
    for port in "${PORTS[@]}"; do
        start_node "$port"
    done

    local addrs=()
    for port in "${PORTS[@]}"; do
        addrs+=("$HOST:$port")
    done
    log "creating cluster: ${addrs[*]}"
    if ! redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes \
        >"$DEMO_DIR/cluster-create.log" 2>&1; then
        cat "$DEMO_DIR/cluster-create.log" >&2
        die "redis-cli --cluster create failed"
    fi

    log "waiting for cluster_state:ok on all nodes"
    local deadline=$((SECONDS + 60)) all_ok
    while :; do
        all_ok=1
        for port in "${PORTS[@]}"; do
            if ! redis-cli -h "$HOST" -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; then
                all_ok=0
                break
            fi
        done
        ((all_ok)) && break
        ((SECONDS < deadline)) || die "cluster did not reach cluster_state:ok within 60s"
        sleep 0.2
    done
    log "cluster is up (data and logs in $DEMO_DIR)"
}

# Stop the proxy of a demo running elsewhere (its pid is in $DEMO_DIR/heatshield.pid);
# that demo then stops its Redis servers itself, and stop_all makes sure of it.
stop_proxy() {
    local pidfile="$DEMO_DIR/heatshield.pid" pid
    [[ -f "$pidfile" ]] || return 0
    pid="$(cat "$pidfile" 2>/dev/null || true)"
    if [[ -n "$pid" ]] && pid_alive "$pid" && grep -qa heatshield "/proc/$pid/cmdline" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 100); do
            pid_alive "$pid" || break
            sleep 0.1
        done
        log "stopped heatshield (pid $pid)"
    fi
    rm -f "$pidfile"
}

cmd="${1:-start}"
case "$cmd" in
    stop)
        stop_proxy
        stop_all
        exit 0
        ;;
    start)
        shift || true
        ;;
    --)
        ;;
    -h | --help)
        awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
        exit 0
        ;;
    *)
        die "unknown command '$cmd' (use: start | stop)"
        ;;
esac
if [[ "${1:-}" == "--" ]]; then
    shift
fi
extra_args=("$@")

bash "$REPO_ROOT/scripts/ensure-deps.sh"

log "building heatshield (release)"
(cd "$REPO_ROOT" && cargo build --release)
BIN="$REPO_ROOT/target/release/heatshield"
[[ -x "$BIN" ]] || die "$BIN not found after build"

HS_PID=""
CLEANED=0
# shellcheck disable=SC2317  # invoked from traps
cleanup() {
    ((CLEANED)) && return
    CLEANED=1
    if [[ -n "$HS_PID" ]] && kill -0 "$HS_PID" 2>/dev/null; then
        kill -TERM "$HS_PID" 2>/dev/null || true
        wait "$HS_PID" 2>/dev/null || true
    fi
    rm -f "$DEMO_DIR/heatshield.pid"
    log "stopping redis servers"
    stop_all
}
# shellcheck disable=SC2317  # invoked from traps
on_signal() {
    trap - INT TERM
    log "caught $1, shutting down"
    cleanup
    exit "$2"
}
trap cleanup EXIT
trap 'on_signal SIGINT 130' INT
trap 'on_signal SIGTERM 143' TERM

start_cluster

cluster_arg="$(
    IFS=,
    printf '%s' "${PORTS[*]/#/$HOST:}"
)"
hs_args=(--cluster "$cluster_arg" --listen "$HOST:$LISTEN_PORT")
if [[ -f "$REPO_ROOT/conf/heatshield.toml" ]]; then
    hs_args=(--config "$REPO_ROOT/conf/heatshield.toml" "${hs_args[@]}")
else
    log "warning: conf/heatshield.toml not found; running without --config"
fi

cat >&2 <<EOF

  heatshield is starting on $HOST:$LISTEN_PORT in front of the cluster $cluster_arg
  Try it from another terminal:
      redis-cli -p $LISTEN_PORT
      redis-cli -p $LISTEN_PORT set foo bar
      redis-cli -p $LISTEN_PORT get foo
  Press Ctrl-C to stop heatshield and the Redis servers.
  (If this script is killed hard, clean up with: scripts/demo.sh stop)

EOF

# Run in the background and wait, so that signals reach the trap promptly and
# are forwarded to heatshield.
"$BIN" "${hs_args[@]}" "${extra_args[@]}" &
HS_PID=$!
echo "$HS_PID" >"$DEMO_DIR/heatshield.pid" # for scripts/demo.sh stop
rc=0
wait "$HS_PID" || rc=$?
HS_PID=""
log "heatshield exited with status $rc"
exit "$rc"
