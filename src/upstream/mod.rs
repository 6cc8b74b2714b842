//! What faces the Redis nodes, below everything that decides what to send: one room per
//! concern, each importing only the protocol, the metrics and the ones listed before it.
//!
//! - [`backend`]: pipelined connections to one node (shared and dedicated), the order in
//!   which blocking commands reach a node, server-assisted caching state per node;
//! - [`side`]: heatshield's own connections to a node (topology, lag, WAIT, the fleet,
//!   subscribers, invalidations), one type with one handshake, timeout and backoff;
//! - [`cluster`]: the slot function, slot map snapshots, node pools, topology refresh and
//!   the nodes the cluster announced;
//! - [`lag`]: how far behind each replica that serves reads is, from its and its
//!   master's replication offsets;
//! - [`retry`]: what a node's reply asks of its request (follow, wait and send again,
//!   pass on), for the request path and the lock task alike.

pub mod backend;
pub mod cluster;
pub mod lag;
pub mod retry;
pub mod side;
