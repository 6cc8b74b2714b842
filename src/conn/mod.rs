//! One client connection: what heatshield knows about it ([`ClientState`]), and the modes
//! it is in ([`Modes`]: one value). A connection may be in several modes at once, as on
//! Redis (WATCH then MULTI; subscribed and in a transaction in RESP3; tracking throughout),
//! so a mode is a field of [`Modes`] with its state in a room of its own: [`multi`]
//! (MULTI's queued commands), [`watch`] (WATCH's pinned connection), the subscriptions
//! (`services::pubsub`), tracking (`services::cache::clients`), CLIENT REPLY
//! ([`ReplyMode`]). Each mode's gate and its teardown are written here once, and used by
//! dispatch, RESET and the end of the connection alike; the commands that enter and
//! leave the modes are in `crate::modes`. A blocking command is the one mode the session
//! keeps (it holds the connection's reading).
//!
//! [`info`]: what other connections see of this one; [`order`]: the ordering rule.

pub mod info;
pub mod multi;
pub mod order;
pub mod watch;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::protocol::Proto;
use crate::services::cache::clients::{ClientSide, ClientTracking};
use crate::services::pubsub::{Hub, Subscriptions};

pub use crate::mailbox::Control;
pub use info::{ClientInfo, Names, Registry, flag};
pub use multi::{Mode, Queued};
pub use order::Lane;
pub use watch::Watch;

/// CLIENT REPLY: whether the client's replies are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplyMode {
    #[default]
    On,
    Off,
    /// The next command's reply is not written.
    Skip,
}

/// The modes a connection is in (see the module comment): one value, each mode a field
/// with its state in a room of its own.
#[derive(Default)]
pub struct Modes {
    /// MULTI: which commands the connection may send now, and what they mean.
    pub multi: Mode,
    /// WATCH in effect (see [`Watch`]).
    pub watch: Option<Box<Watch>>,
    /// The connection's subscriptions (`None`: none); they coexist with any other mode (in
    /// RESP3 a subscribed client may run a transaction).
    pub subs: Option<Box<Subscriptions>>,
    /// CLIENT TRACKING on (`None`: off).
    pub tracking: Option<Box<ClientTracking>>,
}

/// What the proxy knows about a client connection.
pub struct ClientState {
    pub id: u64,
    pub proto: Proto,
    pub authed: bool,
    /// The ACL user it is logged in as (`default` until AUTH).
    pub user: Arc<crate::services::acl::User>,
    /// Its user's permissions as last seen (see `User::perms_cached`).
    pub perms_seen: crate::services::acl::PermsSeen,
    /// What other connections see of this one.
    pub info: Arc<ClientInfo>,
    /// CLIENT REPLY.
    pub reply: ReplyMode,
    /// CLIENT NO-EVICT / NO-TOUCH (accepted; heatshield evicts no client).
    pub no_evict: bool,
    pub no_touch: bool,
    /// QUIT was received: close once its reply is written.
    pub quit: bool,
    /// The modes the connection is in.
    pub modes: Modes,
    /// `PROXY AUTH` succeeded on this connection.
    pub admin: bool,
    /// Requests dispatched whose replies are not complete yet.
    pub inflight: u32,
    /// The way to Redis those requests took (they share one: see [`crate::conn::order`]).
    pub lane: Lane,
    /// The slot map's version they were routed by (see [`crate::conn::order`]).
    pub map_version: u64,
    /// The client parked a LOCK.ACQUIRE ... WAIT or holds KEEPALIVE locks: the lock task
    /// must hear when it leaves.
    pub used_locks: bool,
    /// The client acquired a lock with KEEPALIVE.
    pub keepalive_locks: bool,
    /// This session's handle on the rate limiter.
    pub rl: crate::services::ratelimit::View,
    /// The nodes this client's writes were sent to, as a mask of their pools' bits (what
    /// WAIT and WAITAOF answer for, see crate::services::wait).
    pub wrote: u64,
    /// SELECT: the database this client's commands run in (see `crate::upstream::backend::BackendRequest::db`).
    pub db: u16,
    /// When the reply to this client's last write came (`backend::clock_ms`; 0: none),
    /// while replicas are read: its reads go only to a replica that has the write
    /// (crate::services::reads).
    pub last_write_ms: u64,
}

impl ClientState {
    /// The [`flag`] bits of this client now (`blocked`: a blocking command waits).
    pub fn flags(&self, blocked: bool) -> u8 {
        let mut f = 0;
        if matches!(self.modes.multi, Mode::Multi(_)) {
            f |= flag::MULTI;
        }
        if blocked {
            f |= flag::BLOCKED;
        }
        if self.modes.watch.is_some() {
            f |= flag::WATCH;
        }
        if self.no_evict {
            f |= flag::NO_EVICT;
        }
        if self.no_touch {
            f |= flag::NO_TOUCH;
        }
        if self.modes.subs.is_some() {
            f |= flag::PUBSUB;
        }
        if let Some(t) = &self.modes.tracking {
            f |= flag::TRACKING;
            if t.mode.bcast {
                f |= flag::BCAST;
            }
        }
        f
    }

    /// The RESP2 subscribed gate: a RESP2 connection with subscriptions takes only the
    /// subscription commands (and PING, answered message-shaped), as on Redis.
    #[inline]
    pub fn subscribed_resp2(&self) -> bool {
        self.modes.subs.is_some() && self.proto == Proto::Resp2
    }

    /// Leaves the subscriptions and tracking modes (RESET, and the end of the connection):
    /// the hub forgets the client's subscriptions, tracking stops, and what other
    /// connections see of it says so.
    pub fn leave_pushing_modes(&mut self, hub: &Hub, client_side: &ClientSide) {
        if let Some(subs) = self.modes.subs.take() {
            hub.gone(self.id, &subs);
            for n in &self.info.subs {
                n.store(0, Ordering::Relaxed);
            }
        }
        if self.modes.tracking.take().is_some() {
            client_side.disable(self.id);
            self.info.redir.store(-1, Ordering::Relaxed);
        }
    }

    /// RESET: every mode left (a queued transaction dropped, WATCH ended with its pinned
    /// connection given back after an UNWATCH, subscriptions and tracking ended).
    pub fn leave_modes(&mut self, hub: &Hub, client_side: &ClientSide) {
        self.leave_pushing_modes(hub, client_side);
        self.modes.multi = Mode::Normal;
        self.unwatch();
        self.reply = ReplyMode::On;
    }

    /// Ends WATCH: the pinned connection goes back to the pool after an UNWATCH, or is
    /// closed.
    pub fn unwatch(&mut self) {
        if let Some(w) = self.modes.watch.take()
            && let Some(l) = w.lease
        {
            l.release(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::cache::clients::TrackingOptions;
    use crate::upstream::backend::BackendOptions;
    use crate::upstream::cluster::{Backing, Cluster};

    fn client(proto: Proto) -> ClientState {
        let (tx, _) = crate::mailbox::reply_channel();
        let limiter = crate::services::ratelimit::Limiter::new(vec![], 16, std::time::Duration::from_secs(1));
        ClientState {
            id: 7,
            proto,
            authed: true,
            user: Arc::new(crate::services::acl::User::new("default", crate::services::acl::Perms::everything(None))),
            perms_seen: None,
            info: Arc::new(ClientInfo::new(7, "a".into(), "l".into(), tx)),
            reply: ReplyMode::On,
            no_evict: false,
            no_touch: false,
            quit: false,
            modes: Modes::default(),
            admin: false,
            inflight: 0,
            lane: Lane::Local,
            map_version: 0,
            used_locks: false,
            keepalive_locks: false,
            rl: limiter.view(),
            wrote: 0,
            db: 0,
            last_write_ms: 0,
        }
    }

    fn options() -> BackendOptions {
        BackendOptions::plain(std::time::Duration::from_secs(1))
    }

    #[test]
    fn each_mode_shows_in_the_flags_and_they_coexist() {
        let mut c = client(Proto::Resp3);
        assert_eq!(c.flags(false), 0);
        c.modes.watch = Some(Box::new(Watch { slot: 1, lease: None, voided: false }));
        c.modes.multi = Mode::Multi(Box::default());
        c.modes.subs = Some(Box::default());
        let bcast = TrackingOptions { bcast: true, ..TrackingOptions::default() };
        c.modes.tracking = Some(Box::new(ClientTracking { mode: bcast, caching: None }));
        assert_eq!(
            c.flags(true),
            flag::MULTI | flag::BLOCKED | flag::WATCH | flag::PUBSUB | flag::TRACKING | flag::BCAST
        );
        // a WATCH without its connection guards nothing
        assert!(c.modes.watch.as_ref().unwrap().void());
    }

    #[test]
    fn only_a_subscribed_resp2_connection_is_gated() {
        let mut c = client(Proto::Resp2);
        assert!(!c.subscribed_resp2());
        c.modes.subs = Some(Box::default());
        assert!(c.subscribed_resp2());
        c.proto = Proto::Resp3;
        assert!(!c.subscribed_resp2(), "RESP3 takes any command while subscribed");
    }

    /// The services the modes' teardown tells: the pub/sub hub (of a cluster with no
    /// node yet: nothing is connected) and the tracking clients' registry.
    fn services() -> (Hub, ClientSide) {
        let cluster = Cluster::new(Backing::Cluster { seeds: vec![] }, options(), 1, 1);
        (Hub::new(cluster, 10), ClientSide::new(10, Default::default()))
    }

    #[test]
    fn reset_leaves_every_mode_and_says_so_to_other_connections() {
        let (hub, client_side) = services();
        let mut c = client(Proto::Resp2);
        c.modes.multi = Mode::Multi(Box::default());
        c.modes.watch = Some(Box::new(Watch { slot: 1, lease: None, voided: false }));
        c.modes.subs = Some(Box::default());
        c.info.subs[0].store(2, Ordering::Relaxed);
        let (tx, _rx) = crate::mailbox::reply_channel();
        client_side.enable(c.id, tx, false, true, &TrackingOptions::default());
        c.modes.tracking = Some(Box::default());
        c.info.redir.store(0, Ordering::Relaxed);
        c.reply = ReplyMode::Off;
        assert_eq!(client_side.clients(), 1);

        c.leave_modes(&hub, &client_side);
        assert!(matches!(c.modes.multi, Mode::Normal));
        assert!(c.modes.watch.is_none() && c.modes.subs.is_none() && c.modes.tracking.is_none());
        assert_eq!(c.flags(false), 0);
        assert_eq!(c.reply, ReplyMode::On);
        assert_eq!(client_side.clients(), 0, "tracking ended where invalidations are sent from");
        assert_eq!(c.info.subs[0].load(Ordering::Relaxed), 0);
        assert_eq!(c.info.redir.load(Ordering::Relaxed), -1);
    }

    #[test]
    fn the_end_of_a_connection_leaves_the_pushing_modes_only() {
        let (hub, client_side) = services();
        let mut c = client(Proto::Resp2);
        c.modes.multi = Mode::Multi(Box::default());
        c.modes.subs = Some(Box::default());
        c.leave_pushing_modes(&hub, &client_side);
        assert!(c.modes.subs.is_none());
        // (the queued transaction goes with the connection's state)
        assert!(matches!(c.modes.multi, Mode::Multi(_)));
    }
}
