# Shell helpers shared by the bench scripts (sourced, not run).

# bench_stop 'DIR/NAME-*.pid': stops the processes whose pid files match the pattern
# (given unexpanded) and removes the files.
bench_stop() {
  local f
  for f in $1; do
    if [[ -f $f ]]; then kill "$(cat "$f")" 2>/dev/null || true; fi
    rm -f "$f"
  done
}

# bench_needs TOOL...: exits unless every tool is on PATH.
bench_needs() {
  local t
  for t in "$@"; do command -v "$t" >/dev/null || { echo "needs $t" >&2; exit 1; }; done
}

# bench_harness: prints the shared bench harness's directory ($BENCH_DIR, default
# ../shared/bench); fails when it is not there (use as: B=$(bench_harness) || exit 1).
bench_harness() {
  local h=${BENCH_DIR:-../shared/bench}
  [[ -f $h/cluster.sh ]] || { echo "bench harness not found at $h" >&2; return 1; }
  echo "$h"
}
