//! The process's life, from start-up to exit; the binary (`src/main.rs`) only reads its
//! command line and calls `start::run`. In order (each file imports only the ones listed
//! before it), every step with unit tests of its own:
//!
//! - [`listen`]: the listeners bound, or taken over from the heatshield serving them, and
//!   spread over the workers;
//! - [`drain`]: the signal that ends the serving, and the drain's grace after it;
//! - [`reloaders`]: the configuration reloaded on SIGHUP, the certificates when their
//!   files change;
//! - [`gauges`]: the sampled gauges and the per-second housekeeping;
//! - [`start`]: start-up in order (listeners, slot map, services, learned commands,
//!   workers), the end of the serving, and the exit code.

pub mod drain;
pub mod gauges;
pub mod listen;
pub mod reloaders;
pub mod start;
