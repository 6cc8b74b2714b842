//! The front: where clients connect and their commands enter (each file imports only the
//! ones listed before it):
//!
//! - [`dispatch`]: command lookup, the connection's gates, the route of each request;
//! - [`session`]: one client connection: requests read, replies in order, the client's
//!   byte limits;
//! - [`server`]: the listeners, connection limit and graceful shutdown;
//! - [`handoff`]: the listening sockets handed to a new heatshield (`--takeover`);
//! - [`http`]: the HTTP port: `/metrics`, `/live`, `/ready`.

pub mod dispatch;
pub mod handoff;
pub mod http;
pub mod server;
pub mod session;
