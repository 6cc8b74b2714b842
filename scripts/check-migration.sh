#!/usr/bin/env bash
# The move of a live cluster, again and again: tests/migration.rs's whole scenario run
# ROUNDS times (default 10), each round on new clusters (a Redis 7.0 cluster of 3
# masters moved to a Valkey 9.1 cluster of 4 through two heatshields, under load):
# shadow, dual-write, a backfill SIGKILLed midway and resumed, verify, cutover,
# rollback, cutover again, finish. Prints each round's result and the times each change
# took (docs/migration.md).
#
#   scripts/check-migration.sh [ROUNDS]
#
# Needs what the suite needs (scripts/ensure-deps.sh); a release build of the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-10}
cargo test --release --test migration --no-run >/dev/null 2>&1
pass=0
for i in $(seq "$rounds"); do
  if out=$(cargo test --release --test migration cutover_and_rollback -- --nocapture 2>&1); then
    pass=$((pass + 1))
    echo "round $i: ok; $(grep -o 'migration changes:.*' <<<"$out" | head -1)"
  else
    echo "round $i: FAILED"
    tail -40 <<<"$out"
  fi
done
echo "$pass of $rounds rounds passed"
[[ $pass -eq $rounds ]]
