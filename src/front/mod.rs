//! The front: where clients connect and their commands enter (each file imports only the
//! ones listed before it):
//!
//! - [`dispatch`]: command lookup, the connection's gates, the route of each request;
//! - [`session`]: one client connection: requests read, replies in order, the client's
//!   byte limits;
//! - [`server`]: the listeners, connection limit and graceful shutdown.

pub mod dispatch;
pub mod server;
pub mod session;
