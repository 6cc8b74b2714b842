//! heatshield: a Redis-protocol proxy for Redis Cluster.
//!
//! Every module imports only from the modules listed before it (the README's
//! "Architecture" has the floors and the path of a request):
//! - [`protocol`]: RESP request reader, reply scanner/decoder, reply writer (no I/O);
//! - [`errors`]: the error texts heatshield writes itself on the request path;
//! - [`metrics`]: metric names, pre-bound handles, the Prometheus exporter;
//! - [`glob`]: Redis-style glob patterns; [`worker`]: which worker thread this is;
//! - [`command`]: the command table (arity, keys, flags, routing);
//! - [`backend`]: pipelined connections to one Redis node;
//! - [`stats`]: slow log, big-key log, per-command statistics;
//! - [`cluster`]: slot function, slot map, node pools, topology refresh, announced nodes;
//! - [`ratelimit`]: per-key rate limits (rules, GCRA budgets, tracked-key cap);
//! - [`cache`]: hot-key detection and the never-stale hot-key cache;
//! - [`locks`]: distributed-lock commands (Lua scripts, parked waiters, KEEPALIVE);
//! - [`client`]: what is known about one client connection, and its mode;
//! - [`config`]: the TOML configuration, its validation, the live settings;
//! - [`proxy`]: the request path (limits, cache, route, split, fan out, redirect, merge);
//! - [`admin`]: `PROXY ...` commands and INFO's proxy sections;
//! - [`local`]: commands the proxy answers itself;
//! - [`dispatch`]: command lookup, the connection's gates, the route of each request;
//! - [`session`]: one client connection, replies in order, the client's byte limits;
//! - [`server`]: the listeners, connection limit and graceful shutdown.
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
