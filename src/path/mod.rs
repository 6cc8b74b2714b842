//! The request path: what happens to a command from admission to its reply, in the
//! order a request meets it (each file imports only the ones listed before it):
//!
//! - [`merge`]: how part replies become one (split MGET order, sums, SCAN cursors);
//! - [`pending`]: a request's context, and a request in flight: its parts sent, each
//!   node's reply acted on as `upstream::retry` says, the parts' replies merged;
//! - [`route`]: where an admitted request's parts go (one node, split by slot, fan-out,
//!   a dedicated connection for a blocking command);
//! - [`policy`]: admission, in one order: keys → cache lookup → rate limits → cache plan.

pub mod merge;
pub mod pending;
pub mod policy;
pub mod route;
