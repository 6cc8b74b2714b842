//! The commands that put a connection in a mode, and take it out: one room per mode, each
//! with its commands' rules. The modes' state is the connection's (`crate::conn`), where
//! each mode's gate and its teardown are written once; here is what their commands do.
//!
//! - [`transaction`]: MULTI / EXEC / DISCARD (commands checked and queued, sent as one
//!   native transaction) and WATCH / UNWATCH (a pinned dedicated connection);
//! - [`subscribe`]: SUBSCRIBE / UNSUBSCRIBE and their pattern and shard forms, PUBLISH;
//! - [`tracking`]: CLIENT TRACKING / CACHING / GETREDIR / TRACKINGINFO.
//!
//! A blocking command is a mode too, for as long as it waits: its rules are properties of
//! the command table (`command::traits`), its connection is leased in `path::route` and
//! its timeout kept by the session.

pub mod subscribe;
pub mod tracking;
pub mod transaction;
