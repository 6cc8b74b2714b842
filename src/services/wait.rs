//! WAIT and WAITAOF: how many replicas (and, for WAITAOF, the master itself) have what
//! the client wrote, asked of the masters without blocking a connection other clients use.
//!
//! A server answers both for the offset of the last write *of the connection they are sent
//! on*. heatshield's backend connections are shared: a WAIT there would hold every other
//! client's commands behind it for up to its timeout, and on a connection of its own it
//! would count nothing (that connection wrote nothing). So, once the client's earlier
//! commands have their replies (its lane is a way of its own, see crate::conn::order), each
//! master the client wrote to gets a connection of its own that first writes, in one
//! transaction, a key of heatshield's that nobody sees (`SET` then `DEL` of
//! `{heatshield:wait:N}` in a slot that master owns): that connection's last write is then
//! past every write of the client's, and the client's `WAIT` / `WAITAOF` itself, sent next
//! on it, is counted and timed by the master exactly as Redis counts it. The answer is the
//! least count over those masters (WAITAOF: each of its two counts); a client that wrote
//! nothing is answered for every master, by a connection that wrote nothing (Redis then
//! counts the replicas connected). Up to [`MAX_RUNNING`] run at once proxy-wide; more wait
//! for their turn.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::sync::Semaphore;

use crate::mailbox::{Delivery, ReplyTx, Tag};
use crate::protocol::Request;
use crate::upstream::cluster::{NodePool, Topology};
use crate::upstream::side::Side;

/// WAIT / WAITAOF asked at once, proxy-wide (each holds one connection per master asked).
pub const MAX_RUNNING: usize = 64;

/// How often a waiting ask looks whether its client is still there.
const GONE_CHECK: Duration = Duration::from_millis(100);

static RUNNING: Semaphore = Semaphore::const_new(MAX_RUNNING);

/// A master to ask, and the slot of the key that makes its connection's last write past
/// the client's (`None`: the client wrote nothing there).
pub struct Ask {
    pub node: Arc<NodePool>,
    pub touch: Option<String>,
}

/// The masters to ask for a client whose writes went to the nodes of mask `wrote` (their
/// pools' bits): those masters, each with a key it serves; a bit no master has (a node
/// that is no master any more, after a failover) makes `lost`. Nothing written: every
/// master, with no key. (Bits are shared by pools made 64 apart: a master that shares one
/// is asked too, which can only make the answer smaller.)
pub fn asks(topo: &Topology, wrote: u64) -> (Vec<Ask>, bool) {
    if wrote == 0 {
        return (topo.masters.iter().map(|m| Ask { node: m.clone(), touch: None }).collect(), false);
    }
    let mut out = Vec::new();
    let mut covered = 0u64;
    for m in topo.masters.iter().filter(|m| wrote & m.bit != 0) {
        covered |= m.bit;
        match touch_key(topo, m) {
            Some(k) => out.push(Ask { node: m.clone(), touch: Some(k) }),
            None => return (out, true),
        }
    }
    (out, wrote & !covered != 0)
}

/// A key of heatshield's that `node` serves now: `{heatshield:wait:N}` for the least N
/// that hashes to one of its slots (a few tries: names spread evenly over the slots).
fn touch_key(topo: &Topology, node: &Arc<NodePool>) -> Option<String> {
    (0u32..1 << 16).map(|n| format!("{{heatshield:wait:{n}}}")).find(|k| {
        topo.master_for_slot(crate::upstream::cluster::slot::slot(k.as_bytes())).is_some_and(|m| Arc::ptr_eq(m, node))
    })
}

/// What the client asked.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Wait,
    WaitAof,
}

/// Answers the request `tag` on `reply_to`: the client's own `req` (WAIT or WAITAOF) asked
/// of every master in `asks`, the counts merged (least of each). `lost`: a node the client
/// wrote to is no master any more, and nothing says where its writes are: the answer is 0
/// (WAITAOF: `[0, 0]`) unless an error comes first. `deadline`: when the client's timeout
/// ends (`None`: never); the masters time it themselves.
pub fn spawn(
    asks: Vec<Ask>,
    kind: Kind,
    req: Request,
    lost: bool,
    deadline: Option<Instant>,
    reply_to: ReplyTx,
    tag: Tag,
) {
    tokio::spawn(async move {
        let reply = answer(asks, kind, &req, lost, deadline, &reply_to).await;
        let _ = reply_to.send(Delivery::reply(tag, Ok(reply)));
    });
}

async fn answer(
    asks: Vec<Ask>,
    kind: Kind,
    req: &Request,
    lost: bool,
    deadline: Option<Instant>,
    gone: &ReplyTx,
) -> Bytes {
    let Ok(_turn) = RUNNING.acquire().await else { return crate::errors::resp(crate::errors::STOPPING) };
    // the timeout is what remains of the client's (it may have waited for its turn)
    let data = match deadline {
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now()).as_millis().max(1).to_string();
            let args: Vec<&[u8]> =
                req.args().enumerate().map(|(i, a)| if i + 1 == req.argc() { left.as_bytes() } else { a }).collect();
            Request::from_args(&args).raw().clone()
        }
        None => req.raw().clone(),
    };
    let tasks: Vec<_> = asks
        .into_iter()
        .map(|a| {
            let (data, gone) = (data.clone(), gone.clone());
            tokio::spawn(async move { ask(&a, &data, deadline, &gone).await })
        })
        .collect();
    let mut least: Option<[i64; 2]> = lost.then_some([0, 0]);
    for t in tasks {
        let r = match t.await {
            Ok(r) => r,
            Err(e) => Err(crate::errors::resp(&crate::errors::wait_failed("a master", &e.to_string()))),
        };
        match r {
            Ok(n) => least = Some(least.map_or(n, |l| [l[0].min(n[0]), l[1].min(n[1])])),
            // a server's error (bad arguments, WAITAOF without appendonly): the client's
            Err(e) => return e,
        }
    }
    let n = least.unwrap_or([0, 0]);
    match kind {
        Kind::Wait => Bytes::from(format!(":{}\r\n", n[0])),
        Kind::WaitAof => Bytes::from(format!("*2\r\n:{}\r\n:{}\r\n", n[0], n[1])),
    }
}

/// One master's counts for `data` (WAIT: `[n, n]`; WAITAOF: `[local, replicas]`), or the
/// error reply to give the client.
async fn ask(a: &Ask, data: &Bytes, deadline: Option<Instant>, gone: &ReplyTx) -> Result<[i64; 2], Bytes> {
    let fail = |e: String| crate::errors::resp(&crate::errors::wait_failed(&a.node.addr, &e));
    let mut s = Side::new(a.node.addr.clone(), a.node.options(), "wait");
    s.open().await.map_err(|e| fail(e.to_string()))?;
    if let Some(key) = &a.touch {
        let mut batch = BytesMut::new();
        for args in [&["MULTI"][..], &["SET", key, "1"], &["DEL", key], &["EXEC"]] {
            batch.extend_from_slice(Request::from_args(args).raw());
        }
        let replies = s.call_raw(&batch, 4).await.map_err(|e| fail(e.to_string()))?;
        if let Some(e) = replies.iter().find(|r| r.first() == Some(&b'-')) {
            return Err(fail(String::from_utf8_lossy(e.trim_ascii_end()).into_owned()));
        }
    }
    // the master times the client's timeout; heatshield gives it the usual reply time on
    // top, and stops when the client has gone (the connection closed unblocks it)
    let until = deadline.map(|d| d + a.node.options().command_timeout);
    s.send(data).await.map_err(|e| fail(e.to_string()))?;
    loop {
        tokio::select! {
            r = s.frame() => {
                let r = r.map_err(|e| fail(e.to_string()))?;
                return counts(&r).ok_or(r);
            }
            _ = tokio::time::sleep(GONE_CHECK) => {
                if gone.is_closed() || until.is_some_and(|u| Instant::now() >= u) {
                    return Err(fail("timeout".into()));
                }
            }
        }
    }
}

/// WAIT's `:n` as `[n, n]`, WAITAOF's `*2 :local :replicas`; `None` for anything else (an
/// error reply, given to the client as it is).
fn counts(reply: &[u8]) -> Option<[i64; 2]> {
    let text = std::str::from_utf8(reply).ok()?;
    let ints: Vec<i64> = text.split("\r\n").filter_map(|l| l.strip_prefix(':')?.parse().ok()).collect();
    match (reply.first()?, ints.as_slice()) {
        (b':', &[n]) => Some([n, n]),
        (b'*', &[l, r]) => Some([l, r]),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_read_from_both_replies() {
        assert_eq!(counts(b":2\r\n"), Some([2, 2]));
        assert_eq!(counts(b"*2\r\n:1\r\n:0\r\n"), Some([1, 0]));
        assert_eq!(counts(b"-ERR WAITAOF cannot be used\r\n"), None);
    }
}
