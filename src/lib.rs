//! heatshield: a Redis-protocol proxy for Redis Cluster.
//!
//! Every module imports only from the modules listed before it (docs/architecture.md
//! has the floors and the path of a request):
//! - [`protocol`]: RESP request reader, reply scanner/decoder, reply writer (no I/O);
//! - [`errors`]: the error texts heatshield writes itself on the request path;
//! - [`glob`]: Redis-style glob patterns; [`worker`]: which worker thread this is;
//!   [`queue`]: the batch-drained channel between sessions and backend connections;
//!   [`mailbox`]: what reaches a session on its channel (replies, pushes, control);
//! - [`metrics`]: metric names, pre-bound handles, the Prometheus exporter;
//! - [`command`]: the command table (arity, keys, flags, routing);
//! - [`upstream`]: what faces the Redis nodes: pipelined connections to one node
//!   (`backend`), the slot map, node pools and topology refresh (`cluster`), and what a
//!   node's reply asks of its request (`retry`);
//! - [`stats`]: slow log, big-key log, HOTKEYS sessions, per-command statistics;
//! - [`ratelimit`]: per-key rate limits (rules, GCRA budgets, tracked-key cap);
//! - [`cache`]: hot-key detection and the never-stale hot-key cache;
//! - [`locks`]: distributed-lock commands (Lua scripts, parked waiters, KEEPALIVE);
//! - [`scripts`]: the Lua script bodies seen (EVAL, SCRIPT LOAD), for EVALSHA anywhere;
//! - [`pubsub`]: subscribers, the shared backend subscriptions that serve them, message
//!   fan-out;
//! - [`client`]: what is known about one client connection, and its mode; the registry of
//!   connected clients;
//! - [`order`]: the ordering rule: which way to Redis a request takes, and when it must
//!   wait for the client's requests in flight;
//! - [`config`]: the TOML configuration, its validation, the live settings;
//! - [`proxy`]: the state every session shares, and the record of each answered command;
//! - [`learn`]: the command table learned from the masters (`COMMAND`), kept current;
//! - [`replicas`]: WAIT and WAITAOF, asked of the masters the client wrote to;
//! - [`merge`]: how part replies become one (split MGET order, sums, SCAN cursors);
//! - [`pending`]: a request's context, and a request in flight (sends, redirections, retries);
//! - [`route`]: where an admitted request's parts go (one node, split by slot, fan-out);
//! - [`policy`]: admission, in one order: keys → cache lookup → rate limits → cache plan;
//! - [`transaction`]: MULTI / EXEC / DISCARD: commands checked and queued, sent as one
//!   native transaction; WATCH / UNWATCH on a pinned dedicated connection;
//! - [`subscribe`]: SUBSCRIBE / UNSUBSCRIBE and their pattern and shard forms, PUBLISH;
//! - [`face`]: what heatshield answers as one Redis would, from its own state or the
//!   masters': INFO, CONFIG, PROXY (admin), CLUSTER, CLIENT and CLIENT TRACKING, and the
//!   other commands it answers itself (PING, HELLO, SELECT, WAIT, HOTKEYS, ...);
//! - [`dispatch`]: command lookup, the connection's gates, the route of each request;
//! - [`session`]: one client connection, replies in order, the client's byte limits;
//! - [`server`]: the listeners, connection limit and graceful shutdown.
#![forbid(unsafe_code)]

pub mod cache;
pub mod client;
pub mod command;
pub mod config;
pub mod dispatch;
pub mod errors;
pub mod face;
pub mod glob;
pub mod learn;
pub mod locks;
pub mod mailbox;
pub mod merge;
pub mod metrics;
pub mod order;
pub mod pending;
pub mod policy;
pub mod protocol;
pub mod proxy;
pub mod pubsub;
pub mod queue;
pub mod ratelimit;
pub mod replicas;
pub mod route;
pub mod scripts;
pub mod server;
pub mod session;
pub mod stats;
pub mod subscribe;
pub mod transaction;
pub mod upstream;
pub mod worker;
