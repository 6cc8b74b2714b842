//! What heatshield answers as one Redis would, from its own state or the masters', one
//! room per command family: a newcomer looking for where CLIENT, CLUSTER, CONFIG, INFO,
//! PROXY or PING is answered finds it here. Above the request path (policy, route,
//! pending) and the connection modes (CLIENT TRACKING is answered in `modes`), below
//! dispatch, which calls [`local::run`] for every command routed
//! `Route::Local`.
//!
//! - [`info`]: INFO (heatshield's own sections, the masters' keyspace and statistics);
//! - [`config`]: CONFIG GET / SET / RESETSTAT / REWRITE: the masters' settings as one server's;
//! - [`admin`]: `PROXY ...` (settings, rate-limit rules, views);
//! - [`cluster`]: CLUSTER INFO / SLOTS / SHARDS / NODES / ...: heatshield as a one-node
//!   cluster for cluster-aware clients;
//! - [`client`]: CLIENT LIST / INFO / KILL / REPLY / UNBLOCK / ... about heatshield's own
//!   clients;
//! - [`local`]: the commands heatshield answers itself (PING, ECHO, HELLO, AUTH, SELECT,
//!   WAIT, HOTKEYS, ...), and the door to the others above.

pub mod admin;
pub mod client;
pub mod cluster;
pub mod config;
pub mod info;
pub mod local;
