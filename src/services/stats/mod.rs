//! Statistics of answered commands: the slow log, the big-key log, HOTKEYS sessions, per-command calls and
//! latency histograms (for INFO's `# Commandstats` and `# Latencystats`), and the stages
//! of a slow command. Filled when a reply has been written ([`crate::proxy::Proxy::observe`]);
//! read by the admin commands and INFO.

mod bigkeys;
mod commands;
mod hotkeys;
mod slowlog;

pub use bigkeys::BigKeys;
pub use commands::{CommandStats, Totals, percentile};
pub use hotkeys::Hotkeys;
pub use slowlog::{Moments, SlowLog, Stages};

/// heatshield's own CPU time (user, system) in seconds, from /proc (0 elsewhere).
pub fn own_cpu() -> (f64, f64) {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return (0.0, 0.0) };
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, r)| r).split_whitespace().collect();
    // utime and stime, fields 14 and 15, in ticks of 1/100 s (USER_HZ on Linux)
    let tick = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) / 100.0;
    (tick(11), tick(12))
}
