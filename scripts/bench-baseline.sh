#!/usr/bin/env bash
# The working tree's release build against the fixed baseline build named in
# docs/design/performance.md ("The fixed baseline"), side by side with
# scripts/bench-ab.sh: every change on the request path is compared with the build before
# it AND with this one, so costs that each hide in one A/B's noise cannot add up unseen.
#
#   scripts/bench-baseline.sh [ROUNDS [redis-benchmark options]]
#
# e.g. scripts/bench-baseline.sh 10 -t get -r 100000 -P 16
#
# The baseline is built once from its commit in a worktree of its own under
# $TMPDIR/heatshield-baseline-COMMIT (kept for the next run); the working tree is built
# with `cargo build --release`. Prints bench-ab's rounds and "B/A ... median" (B: the
# working tree). BASELINE=COMMIT compares with another commit.
set -euo pipefail
cd "$(dirname "$0")/.."
# The fixed baseline (docs/design/performance.md says when and how it moves forward).
BASELINE=${BASELINE:-8b0da15}
dir=${TMPDIR:-/tmp}/heatshield-baseline-$BASELINE
bin=$dir/target/release/heatshield
if [[ ! -x $bin ]]; then
  if [[ ! -d $dir ]]; then
    git worktree add --detach "$dir" "$BASELINE" >/dev/null
  fi
  (cd "$dir" && CARGO_TARGET_DIR="$dir/target" cargo build --release --quiet)
fi
cargo build --release --quiet
exec scripts/bench-ab.sh "$bin" target/release/heatshield "$@"
