//! `PROXY FLEET`: the fleet as this instance saw it at its last sync, as one table: the
//! members (address, pid, version, digests of their colocation rules, users and rate
//! rules, when they joined and last reported), the fleet's digests and what of this
//! instance's differs, and this instance's part of each rule (docs/fleet.md).

use crate::path::pending::{Ctx, Outcome};
use crate::protocol::Writer;
use crate::proxy::Proxy;
use crate::services::fleet::Digests;

/// `PROXY FLEET`
pub(super) fn fleet_command(proxy: &Proxy, ctx: &mut Ctx) -> Outcome {
    let fleet = &proxy.fleet;
    let view = fleet.view();
    let mine = Digests { closing: fleet.closing(), ..fleet.digests() };
    let differs = if fleet.enabled() { mine.differing(&view.fleet_digests) } else { Vec::new() };
    let rules = proxy.ratelimit.rules();
    let leases = proxy.ratelimit.leases_by_rule();
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let ready = match proxy.ready() {
        Ok(()) => "yes".to_string(),
        Err(why) => format!("no: {why}"),
    };
    let digests = |w: &mut Writer, d: &Digests| {
        w.map(5);
        for (k, v) in [("colocate", &d.colocate), ("users", &d.users), ("rules", &d.rules), ("colocate_next", &d.next)]
        {
            w.bulk(k.as_bytes());
            w.bulk(v.as_bytes());
        }
        w.bulk(b"switching");
        w.bulk(if d.closing {
            &b"closed"[..]
        } else if d.next.is_empty() || d.next == d.colocate {
            b"no"
        } else {
            b"waiting"
        });
    };
    ctx.reply(|w| {
        w.map(10);
        w.bulk(b"name");
        w.bulk(fleet.config.name.as_bytes());
        w.bulk(b"id");
        w.bulk(fleet.id.as_bytes());
        w.bulk(b"synced_ms_ago");
        w.int(view.synced.map_or(-1, |t| t.elapsed().as_millis() as i64));
        w.bulk(b"error");
        w.bulk(view.error.as_deref().unwrap_or("").as_bytes());
        w.bulk(b"ready");
        w.bulk(ready.as_bytes());
        w.bulk(b"digests");
        digests(w, &mine);
        w.bulk(b"fleet_digests");
        digests(w, &view.fleet_digests);
        w.bulk(b"differs");
        w.array(differs.len());
        for d in &differs {
            w.bulk(d.as_bytes());
        }
        w.bulk(b"members");
        w.array(view.list.len());
        for m in &view.list {
            let mut about = m.about.split(' ');
            let (addr, pid, version) = (about.next(), about.next(), about.next());
            w.map(9);
            for (k, v) in [
                ("id", m.id.as_str()),
                ("address", addr.unwrap_or("")),
                ("pid", pid.unwrap_or("")),
                ("version", version.unwrap_or("")),
            ] {
                w.bulk(k.as_bytes());
                w.bulk(v.as_bytes());
            }
            w.bulk(b"me");
            w.int(i64::from(m.id == fleet.id));
            w.bulk(b"digests");
            digests(w, &m.digests);
            let differing = m.digests.differing(&view.fleet_digests);
            w.bulk(b"differs");
            w.array(differing.len());
            for d in &differing {
                w.bulk(d.as_bytes());
            }
            w.bulk(b"joined_unix_ms");
            w.int(m.since_ms as i64);
            w.bulk(b"reported_ms_ago");
            w.int(now_ms.saturating_sub(m.at_ms) as i64);
        }
        w.bulk(b"rules");
        w.array(rules.len());
        for r in rules.iter() {
            w.map(6);
            w.bulk(b"name");
            w.bulk(r.spec.name.as_bytes());
            super::ratelimit::fleet_part(w, r, &view, &leases, "members");
        }
    })
}
