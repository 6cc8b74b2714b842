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
