//! Ports for the processes a test starts: [`free_port`] hands out ports in
//! `20000..=29999` on `127.0.0.1`, never twice per process, verified by binding both `P`
//! and the cluster-bus port `P + 10000`.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::Mutex;

use super::process::lock;

const PORT_LO: u16 = 20000;
const PORT_HI: u16 = 29999;
const PORT_SPAN: u32 = (PORT_HI - PORT_LO + 1) as u32;
/// Offset of the cluster-bus port Redis derives from the client port.
const BUS_OFFSET: u16 = 10000;

/// Process-wide state of [`free_port`].
struct PortRegistry {
    /// Next candidate, as an offset from `PORT_LO`. `None` until first use,
    /// then seeded from the process id so parallel test binaries start far
    /// apart from each other.
    cursor: Option<u32>,
    /// Every port ever handed out by this process.
    handed_out: BTreeSet<u16>,
}

static PORTS: Mutex<PortRegistry> = Mutex::new(PortRegistry { cursor: None, handed_out: BTreeSet::new() });

fn bindable(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// Returns a port `P` in `20000..=29999` such that `127.0.0.1:P` and
/// `127.0.0.1:P+10000` (the Redis cluster bus) are bindable right now.
///
/// A port is never returned twice within one process. The scan starts at an
/// offset derived from the process id so concurrently running test binaries
/// rarely probe the same ports; binding is still verified because other
/// processes may hold any of them. (There is an unavoidable race between the
/// check and the real bind; [`RedisServer`](super::RedisServer) and [`Proxy`](super::Proxy) retry on
/// "Address already in use".)
pub fn free_port() -> u16 {
    let mut reg = lock(&PORTS);
    let start = *reg.cursor.get_or_insert_with(|| std::process::id().wrapping_mul(7919) % PORT_SPAN);
    for i in 0..PORT_SPAN {
        let offset = (start + i) % PORT_SPAN;
        let port = PORT_LO + offset as u16;
        if port == 6379 || reg.handed_out.contains(&port) {
            continue;
        }
        if bindable(port) && bindable(port + BUS_OFFSET) {
            reg.handed_out.insert(port);
            reg.cursor = Some((offset + 1) % PORT_SPAN);
            return port;
        }
    }
    panic!("free_port: no free port left in {PORT_LO}..={PORT_HI}");
}

/// `addr` string for a local port.
pub fn local(port: u16) -> String {
    format!("127.0.0.1:{port}")
}
