//! heatshield: a Redis-protocol proxy for Redis Cluster.
//!
//! The folders are the floors; every module imports only from the modules listed before
//! it (docs/architecture.md has the floors and the path of a request):
//! - [`protocol`]: RESP request reader, reply scanner/decoder, reply writer (no I/O);
//! - [`errors`]: the error texts heatshield writes itself on the request path;
//! - [`glob`]: Redis-style glob patterns; [`worker`]: which worker thread this is;
//!   [`queue`]: the batch-drained channel between sessions and backend connections;
//!   [`mailbox`]: what reaches a session on its channel (replies, pushes, control);
//!   [`wake`]: which of a task's sources woke it;
//! - [`tls`]: TLS on both sides (rustls): the listener's acceptor, the backends'
//!   connector, the certificates they reload, a backend link plain or TLS;
//! - [`metrics`]: metric names, pre-bound handles, the Prometheus exporter;
//! - [`command`]: the command table (arity, keys, flags, routing, traits);
//! - [`upstream`]: what faces the Redis nodes: pipelined connections to one node
//!   (`backend`), the slot map, node pools and topology refresh (`cluster`), and the
//!   reaction table to a node's reply (`retry`);
//! - [`services`]: what a request may use on its way: ACL users, statistics, rate
//!   limits, the hot-key cache, locks, scripts, pub/sub, WAIT;
//! - [`conn`]: one client connection: what is known about it, the state of each of its
//!   modes (their gates and teardown written once), the ordering rule, the registry of
//!   connected clients;
//! - [`config`]: the TOML configuration, its validation, the live settings;
//! - [`migrate`]: `heatshield colocate-migrate`: a colocation rule's existing keys moved
//!   to their colocated names, resumably;
//! - [`proxy`]: the state every session shares, and the record of each answered command;
//! - [`learn`]: the command table learned from the masters (`COMMAND`), kept current;
//! - [`reload`]: the configuration file reloaded while heatshield runs;
//! - [`path`]: the request path: admission (`policy`), where parts go (`route`), a
//!   request in flight (`pending`), replies merged (`merge`);
//! - [`modes`]: the commands that change a connection's mode: MULTI / EXEC / WATCH,
//!   SUBSCRIBE and its forms, CLIENT TRACKING;
//! - [`face`]: what heatshield answers as one Redis would, from its own state or the
//!   masters': INFO, CONFIG, PROXY (admin), CLUSTER, CLIENT, and the other commands it
//!   answers itself (PING, HELLO, SELECT, WAIT, HOTKEYS, ...);
//! - [`front`]: where clients connect: dispatch (lookup, gates, route), the session (one
//!   connection, replies in order, byte limits), the listeners and shutdown;
//! - [`life`]: the process's life: start-up in order, listeners bound or taken over, the
//!   drain after a signal, reloads on their signals, the sampled gauges.
#![forbid(unsafe_code)]

pub mod command;
pub mod config;
pub mod conn;
pub mod errors;
pub mod face;
pub mod front;
pub mod glob;
pub mod learn;
pub mod life;
pub mod mailbox;
pub mod metrics;
pub mod migrate;
pub mod modes;
pub mod path;
pub mod protocol;
pub mod proxy;
pub mod queue;
pub mod reload;
pub mod services;
pub mod tls;
pub mod upstream;
pub mod wake;
pub mod worker;
