//! heatshield: a Redis-protocol proxy for Redis Cluster.
//!
//! The modules, leaves first:
//! - [`protocol`]: RESP request reader, reply scanner/decoder, reply writer (no I/O);
//! - [`command`]: the command table (arity, keys, flags, routing);
//! - [`config`]: the TOML configuration and its validation;
//! - [`errors`]: the error texts heatshield writes itself on the request path;
//! - [`backend`]: pipelined connections to one Redis node;
//! - [`cluster`]: slot function, slot map, node pools, topology refresh, announced nodes;
//! - [`dispatch`]: command lookup, the connection's gates, the route of each request;
//! - [`proxy`]: the request path (limits, route, split, fan out, redirect, merge);
//! - [`ratelimit`]: per-key rate limits (rules, GCRA budgets, tracked-key cap);
//! - [`cache`]: hot-key detection and the never-stale hot-key cache;
//! - [`locks`]: distributed-lock commands (Lua scripts, parked waiters, KEEPALIVE);
//! - [`client`]: what is known about one client connection, and its mode;
//! - [`local`]: commands the proxy answers itself;
//! - [`admin`]: `PROXY ...` commands and the proxy's own INFO sections;
//! - [`stats`]: slow log, big-key log, per-command statistics;
//! - [`metrics`]: metric names, pre-bound handles, the Prometheus exporter;
//! - [`glob`]: Redis-style glob patterns;
//! - [`session`]: one client connection, replies in order, the client's byte limits;
//! - [`server`]: the listeners, connection limit and graceful shutdown;
//! - [`worker`]: thread-per-core workers (which worker a thread is).
#![forbid(unsafe_code)]

pub mod admin;
pub mod backend;
pub mod cache;
pub mod client;
pub mod cluster;
pub mod command;
pub mod config;
pub mod dispatch;
pub mod errors;
pub mod glob;
pub mod local;
pub mod locks;
pub mod metrics;
pub mod protocol;
pub mod proxy;
pub mod ratelimit;
pub mod server;
pub mod session;
pub mod stats;
pub mod worker;
