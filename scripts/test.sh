#!/usr/bin/env bash
# Run heatshield's test suite: installs missing deps, checks formatting
# (`cargo fmt --check`) and lints (`cargo clippy --all-targets -- -D warnings`), then
# `cargo test --no-fail-fast` of every target (unit, integration, examples and
# benches in test mode; not doctests), in two runs: seven integration test binaries whose
# tests mostly wait run with four test threads (see below), the rest with the default.
# With arguments or TEST_THREADS, one `cargo test --all-targets --no-fail-fast` run.
#
# Usage: scripts/test.sh [extra cargo test args...]
#   e.g. scripts/test.sh -- --test-threads=1
# Environment: CARGO_INCREMENTAL defaults to 0 here (see below); TEST_THREADS=N adds `-- --test-threads=N` (if no `--` was given);
# SKIP_LINT=1 skips the fmt and clippy checks (for a quick local run; CI never sets it).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

bash scripts/ensure-deps.sh

export RUST_BACKTRACE=1
# A whole suite's build gains nothing from incremental compilation's data, and on a fresh
# checkout writing it costs about a quarter of compiling heatshield's own crates (87 s
# against 66 s for the library, binary, tests and benches on 2 cores). Set
# CARGO_INCREMENTAL=1 to keep it.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

if [[ -z "${SKIP_LINT:-}" ]]; then
    echo "+ cargo fmt --all -- --check"
    cargo fmt --all -- --check || { echo "formatting differs: run cargo fmt"; exit 1; }
    echo "+ cargo clippy --all-targets -- -D warnings"
    cargo clippy --all-targets -- -D warnings || { echo "clippy found problems"; exit 1; }
fi

args=(--all-targets --no-fail-fast "$@")
if [[ -n "${TEST_THREADS:-}" ]]; then
    has_sep=0
    for a in "$@"; do
        if [[ "$a" == "--" ]]; then
            has_sep=1
        fi
    done
    if ((has_sep)); then
        args+=("--test-threads=$TEST_THREADS")
    else
        args+=(-- "--test-threads=$TEST_THREADS")
    fi
fi

log_file="$(mktemp "${TMPDIR:-/tmp}/heatshield-test.XXXXXX")"
trap 'rm -f "$log_file"' EXIT

start=$SECONDS
rc=0
if [[ $# -eq 0 && -z "${TEST_THREADS:-}" ]]; then
    # The whole suite. These binaries' tests mostly wait (failovers, migrations, replicas'
    # lag, clients held by their limits) and count nothing another test of theirs changes:
    # they run four tests at a time, the rest two (one per core). On 2 cores: ordering
    # 41 s to 27 s, replicas 24 to 11, bounds 22 to 12, stale 17 to 10, redis_py 15 to 8,
    # migration 31 to 21, blocking 36 to 30, fleet 101 to 88 (its three tests that move
    # clients between instances take turns, 70 s of it: the others run beside them).
    # (Not cache or pubsub: their tests count the connections on a shared master.)
    wide=(ordering replicas bounds stale redis_py migration blocking fleet)
    narrow=(--lib --bins --examples --benches)
    for f in tests/*.rs; do
        n=$(basename "$f" .rs)
        [[ " ${wide[*]} " == *" $n "* ]] || narrow+=(--test "$n")
    done
    wide_args=()
    for n in "${wide[@]}"; do
        wide_args+=(--test "$n")
    done
    echo "+ cargo test --no-fail-fast ${narrow[*]}"
    cargo test --no-fail-fast "${narrow[@]}" 2>&1 | tee "$log_file" || rc=$?
    echo "+ cargo test --no-fail-fast ${wide_args[*]} -- --test-threads=4"
    cargo test --no-fail-fast "${wide_args[@]}" -- --test-threads=4 2>&1 | tee -a "$log_file" || rc=$((rc ? rc : $?))
else
    echo "+ cargo test ${args[*]}"
    cargo test "${args[@]}" 2>&1 | tee "$log_file" || rc=$?
fi
elapsed=$((SECONDS - start))

# Sum the per-binary "test result:" lines.
read -r passed failed ignored suites < <(
    awk '/^test result: / {
            for (i = 1; i <= NF; i++) {
                if ($(i + 1) ~ /^passed;?$/) p += $i
                if ($(i + 1) ~ /^failed;?$/) f += $i
                if ($(i + 1) ~ /^ignored;?$/) g += $i
            }
            n++
        }
        END { printf "%d %d %d %d\n", p, f, g, n }' "$log_file"
)

echo
echo "==================== heatshield test summary ===================="
if ((suites == 0)); then
    echo "no test results: cargo test exited with status $rc before running tests (see above)"
else
    # Failing tests, if any (cargo prints them under "failures:").
    if ((failed > 0)); then
        echo "failed tests:"
        grep -E '^test .* \.\.\. FAILED$' "$log_file" | sed -e 's/^test /  /' -e 's/ \.\.\. FAILED$//' | sort -u || true
    fi
    echo "$suites test binaries, ${elapsed}s, cargo exit status $rc"
    echo "summary: $passed passed, $failed failed, $ignored skipped"
fi
echo "================================================================="
exit "$rc"
