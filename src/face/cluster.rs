//! What a cluster-aware client sees when it asks heatshield about the cluster: a cluster
//! of one master, heatshield itself, owning all 16,384 slots (`CLUSTER INFO`, `MYID`, `MYSHARDID`,
//! `SLOTS`, `SHARDS`, `NODES`, `KEYSLOT`). Such clients (redis-py `RedisCluster`, ioredis
//! `Cluster`, Jedis `JedisCluster`) then send every command to heatshield, which routes it
//! to the real cluster behind it. `COUNTKEYSINSLOT` and `GETKEYSINSLOT` are asked of the
//! master that really owns the slot.
//!
//! The address announced is `server.announce` when set, else the address the client
//! connected to (so it is right for every listener and every client).

use crate::errors;
use crate::path::pending::{Ctx, Outcome};
use crate::path::route;
use crate::protocol::Request;
use crate::protocol::request::parse_i64;
use crate::proxy::Proxy;
use crate::upstream::cluster::slot;

/// `CLUSTER <subcommand> ...` (the subcommands listed in the module comment).
pub fn run(proxy: &Proxy, ctx: &mut Ctx, req: &Request) -> Outcome {
    let sub = req.arg(1).to_ascii_uppercase();
    let addr = proxy.config.server.announce.clone().unwrap_or_else(|| ctx.client.info.laddr.clone());
    let (ip, port) = match addr.rsplit_once(':') {
        Some((ip, port)) => (ip.trim_start_matches('[').trim_end_matches(']').to_string(), port.parse().unwrap_or(0)),
        None => (addr.clone(), 0),
    };
    let id = node_id(&addr);
    match sub.as_slice() {
        b"MYID" => ctx.reply(|w| w.bulk(id.as_bytes())),
        // (Redis 7.2, Valkey 8: the one shard heatshield is)
        b"MYSHARDID" => ctx.reply(|w| w.bulk(shard_id(&addr).as_bytes())),
        b"KEYSLOT" => {
            let s = slot(req.arg(2));
            ctx.reply(|w| w.int(s as i64))
        }
        b"INFO" => {
            let text = "cluster_enabled:1\r\ncluster_state:ok\r\ncluster_slots_assigned:16384\r\n\
                cluster_slots_ok:16384\r\ncluster_slots_pfail:0\r\ncluster_slots_fail:0\r\n\
                cluster_known_nodes:1\r\ncluster_size:1\r\ncluster_current_epoch:1\r\ncluster_my_epoch:1\r\n\
                cluster_stats_messages_sent:0\r\ncluster_stats_messages_received:0\r\n\
                total_cluster_links_buffer_limit_exceeded:0\r\n";
            ctx.reply(|w| w.verbatim(text.as_bytes()))
        }
        b"NODES" => {
            let line = format!("{id} {ip}:{port}@0 myself,master - 0 0 1 connected 0-16383\n");
            ctx.reply(|w| w.verbatim(line.as_bytes()))
        }
        b"SLOTS" => ctx.reply(|w| {
            w.array(1);
            w.array(3);
            w.int(0);
            w.int(16383);
            w.array(4);
            w.bulk(ip.as_bytes());
            w.int(port);
            w.bulk(id.as_bytes());
            w.map(0);
        }),
        b"SHARDS" => ctx.reply(|w| {
            w.array(1);
            w.map(2);
            w.bulk(b"slots");
            w.array(2);
            w.int(0);
            w.int(16383);
            w.bulk(b"nodes");
            w.array(1);
            w.map(7);
            w.bulk(b"id");
            w.bulk(id.as_bytes());
            w.bulk(b"port");
            w.int(port);
            w.bulk(b"ip");
            w.bulk(ip.as_bytes());
            w.bulk(b"endpoint");
            w.bulk(ip.as_bytes());
            w.bulk(b"role");
            w.bulk(b"master");
            w.bulk(b"replication-offset");
            w.int(0);
            w.bulk(b"health");
            w.bulk(b"online");
        }),
        // the real owner answers
        b"COUNTKEYSINSLOT" | b"GETKEYSINSLOT" => match parse_i64(req.arg(2)) {
            Some(s) if (0..16384).contains(&s) => route::to_slot(proxy, ctx, s as u16),
            Some(_) => ctx.error(errors::INVALID_SLOT),
            None => ctx.error(errors::NOT_AN_INTEGER),
        },
        _ => ctx.error(&errors::unsupported(&format!("CLUSTER {}", String::from_utf8_lossy(&sub)), "")),
    }
}

/// heatshield's shard id for the address it announces, as stable as [`node_id`].
fn shard_id(addr: &str) -> String {
    sha1_smol::Sha1::from(format!("heatshield shard {addr}")).digest().to_string()
}

/// heatshield's node id for the address it announces: 40 hex digits, the same for the
/// same address (so a client that reconnects sees the same node).
fn node_id(addr: &str) -> String {
    sha1_smol::Sha1::from(format!("heatshield {addr}")).digest().to_string()
}
