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
