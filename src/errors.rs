//! The error texts heatshield writes itself, in one table, so each is spelled once (where heatshield answers as a single Redis would, the text is Redis's
//! own). Texts carry no leading `-`: the reply writer adds it, or [`resp`] for a raw
//! error reply. Errors from a backend are not here: they pass through as Redis sent them.
//! A leaf module: it imports nothing of heatshield.

pub const NOAUTH: &str = "NOAUTH Authentication required.";
pub const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";
pub const NESTED_MULTI: &str = "ERR MULTI calls can not be nested";
pub const EXECABORT: &str = "EXECABORT Transaction discarded because of previous errors.";
/// A command sent after a refused MULTI, before EXEC or DISCARD.
pub const AFTER_REFUSED_MULTI: &str =
    "ERR heatshield does not support transactions: command not executed (MULTI was refused; send DISCARD or EXEC)";
pub const NO_SLOT_MAP: &str = "CLUSTERDOWN heatshield has no slot map yet";
pub const INVALID_CURSOR: &str = "ERR invalid cursor";
pub const LOCK_SERVICE_DOWN: &str = "ERR heatshield: the lock service is not running";
pub const MAX_CLIENTS: &str = "ERR max number of clients reached";
pub const SYNTAX: &str = "ERR syntax error";
pub const NOT_AN_INTEGER: &str = "ERR value is not an integer or out of range";

/// `text` as a RESP error reply (`-text\r\n`).
pub fn resp(text: &str) -> bytes::Bytes {
    bytes::Bytes::from(format!("-{text}\r\n"))
}

pub fn slot_not_served(slot: u16) -> String {
    format!("CLUSTERDOWN Hash slot {slot} not served")
}

/// A command heatshield refuses on purpose (`why` may be empty).
pub fn unsupported(name: &str, why: &str) -> String {
    if why.is_empty() {
        format!("ERR heatshield does not support '{name}'")
    } else {
        format!("ERR heatshield does not support '{name}': {why}")
    }
}

pub fn blocking_unsupported(name: &str) -> String {
    format!("ERR heatshield does not support '{name}' with BLOCK: blocking commands are not supported yet")
}

/// Redis's arity error (`name` in lower case, as Redis writes it).
pub fn wrong_arity(name: &str) -> String {
    format!("ERR wrong number of arguments for '{name}' command")
}

pub fn flush_disabled(name: &str) -> String {
    format!(
        "ERR {name} is disabled in heatshield (it would empty every master); set server.allow_flush = true to enable it"
    )
}

pub fn node_unreachable(addr: &str) -> String {
    format!("CLUSTERDOWN heatshield cannot reach node {addr}")
}

/// A request without a reply from its backend (lost connection, timeout).
pub fn backend_failed(why: &dyn std::fmt::Display) -> String {
    format!("ERR heatshield: {why}")
}

pub fn merge_failed(what: &str) -> String {
    format!("ERR heatshield could not merge replies: {what}")
}

/// A request that got no reply (nor retry outcome) within the reply deadline.
pub fn expired(ms: u128) -> String {
    format!("ERR heatshield: no reply within {ms} ms")
}

/// Malformed input from a client (the connection closes after it).
pub fn protocol(e: &dyn std::fmt::Display) -> String {
    format!("ERR {e}")
}
