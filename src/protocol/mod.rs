//! The Redis protocol as heatshield needs it: a bounded, resumable reader for client
//! requests ([`request`]), a boundary scanner and small decoder for backend replies
//! ([`reply`]), and a writer for the replies the proxy composes itself ([`encode`]).
//! Nothing here does I/O.

pub mod encode;
pub mod reply;
pub mod request;

pub use encode::{Proto, Writer};
pub use reply::{ReplyScanner, Value};
pub use request::{Next, ProtocolError, Request, RequestReader};
