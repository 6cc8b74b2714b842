//! `verify`: every key compared between the source and the target (type, value, remaining
//! time to live within a tolerance), with a summary by kind of difference and by slot,
//! and the first differing keys.
//!
//! - The source's keys come from a `SCAN` of each of its masters, in batches: one
//!   pipelined `TYPE` and `PTTL` per key on each side, then one pipelined `GET` for the
//!   strings; other types are compared key by key, in pieces of [`CHUNK`] elements
//!   (`LRANGE`, `HSCAN` then `HMGET`, `SSCAN` then `SMISMEMBER`, `ZSCAN` then `ZMSCORE`,
//!   `XRANGE`), so a hash of a million fields is never read in one reply. Scores are
//!   compared as numbers (Redis 7.0 and Valkey print them differently). Other types
//!   (modules) are compared by their `DUMP`, which is only equal between servers of one
//!   RDB version.
//! - Then the target's keys: one the source does not have is reported as extra.
//! - A key that differs is compared again, up to `verify_rechecks` times,
//!   `verify_recheck_delay_ms` apart, and reported only if it still differs: a key written
//!   while the check ran settles (its write reaches both sides) and is counted as such,
//!   not reported. A key gone from both sides meanwhile is counted as gone.
//! - Only reads: `SCAN`, `TYPE`, `PTTL` and the reads above, on the masters. Database 0
//!   (the only one of a cluster). heatshield's own keys (`{heatshield:...`: a fleet's
//!   state, the copies' versions) are not compared.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{Clusters, Nodes, int, scan_reply};
use crate::protocol::reply::{Value, error_text};
use crate::upstream::cluster::slot;

/// Elements read per piece of a collection, and keys per `SCAN` batch.
pub const CHUNK: usize = 1000;

/// How a key differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// On the source only.
    Missing,
    /// On the target only.
    Extra,
    /// Of another type on each side.
    Type,
    /// Of one type, with other contents.
    Value,
    /// Equal contents, remaining times to live further apart than the tolerance.
    Ttl,
    /// A side answered an error for it.
    Unreadable,
}

impl Kind {
    pub const ALL: [Kind; 6] = [Kind::Missing, Kind::Extra, Kind::Type, Kind::Value, Kind::Ttl, Kind::Unreadable];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Missing => "missing",
            Kind::Extra => "extra",
            Kind::Type => "type",
            Kind::Value => "value",
            Kind::Ttl => "ttl",
            Kind::Unreadable => "unreadable",
        }
    }
}

/// A key that differs, and how.
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    pub key: Vec<u8>,
    pub slot: u16,
    pub kind: Kind,
    pub detail: String,
}

/// What a run found.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// Keys of the source compared.
    pub source_keys: u64,
    /// Keys of the target looked at for ones the source lacks.
    pub target_keys: u64,
    /// Keys equal at the first comparison.
    pub equal: u64,
    /// Keys that differed at first and were equal when compared again.
    pub settled: u64,
    /// Keys gone from both sides while they were compared.
    pub gone: u64,
    /// Differences that remained, by kind and by slot.
    pub by_kind: BTreeMap<Kind, u64>,
    pub by_slot: BTreeMap<u16, u64>,
    /// The first differences (at most `Options::first`), in the order found.
    pub first: Vec<Difference>,
    /// How long it took.
    pub took: Duration,
}

impl Report {
    pub fn differences(&self) -> u64 {
        self.by_kind.values().sum()
    }

    /// The report as `heatshield migrate verify` prints it.
    pub fn render(&self) -> String {
        let mut s = format!(
            "verify: {} source keys compared ({} equal, {} settled on a recheck, {} gone meanwhile), {} target keys looked at, in {:.1} s: {} differences\n",
            self.source_keys,
            self.equal,
            self.settled,
            self.gone,
            self.target_keys,
            self.took.as_secs_f64(),
            self.differences()
        );
        let kinds: Vec<String> =
            Kind::ALL.iter().map(|k| format!("{} {}", k.name(), self.by_kind.get(k).copied().unwrap_or(0))).collect();
        s += &format!("by kind: {}\n", kinds.join(", "));
        if !self.by_slot.is_empty() {
            let mut slots: Vec<(u16, u64)> = self.by_slot.iter().map(|(&s, &n)| (s, n)).collect();
            slots.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            let shown: Vec<String> = slots.iter().take(20).map(|(s, n)| format!("{s} ({n})")).collect();
            s += &format!(
                "slots with differences: {}{}\n",
                self.by_slot.len(),
                if shown.is_empty() { String::new() } else { format!(": {}", shown.join(", ")) }
            );
        }
        for d in &self.first {
            s += &format!(
                "difference: {} {} (slot {}): {}\n",
                d.kind.name(),
                crate::protocol::reply::quoted(&d.key),
                d.slot,
                d.detail
            );
        }
        s
    }
}

/// Options of one run.
pub struct Options {
    pub ttl_tolerance: Duration,
    pub rechecks: u32,
    pub recheck_delay: Duration,
    /// Differences listed in the report (all are counted).
    pub first: usize,
    /// Called after each batch with (source keys compared, source keys at the start).
    pub progress: Box<dyn FnMut(u64, u64) + Send>,
}

/// What one comparison of a key found.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Equal,
    Gone,
    Differs(Kind, String),
}

/// The two sides.
struct Sides {
    src: Nodes,
    dst: Nodes,
    tolerance_ms: i64,
}

/// Runs `verify` of `source` against `target`.
pub async fn run(clusters: Clusters, mut o: Options) -> Result<Report, String> {
    let started = std::time::Instant::now();
    let (src, dst) = clusters.open("verify").await?;
    let mut sides = Sides { src, dst, tolerance_ms: o.ttl_tolerance.as_millis().min(i64::MAX as u128) as i64 };
    let mut report = Report::default();
    let mut suspects: Vec<(Vec<u8>, Outcome)> = Vec::new();

    // the source's size, for the progress
    let mut total = 0;
    for m in sides.src.masters() {
        total += int(&sides.src.ask(&m, vec![b"DBSIZE"]).await?).unwrap_or(0).max(0) as u64;
    }
    // 1. every key of the source
    for m in sides.src.masters() {
        let mut cursor = b"0".to_vec();
        loop {
            let count = CHUNK.to_string();
            let r = sides.src.ask(&m, vec![b"SCAN", &cursor, b"COUNT", count.as_bytes()]).await?;
            let (next, mut keys) = scan_reply(&r).map_err(|e| format!("{m}: SCAN: {e}"))?;
            // heatshield's own keys (a fleet's state, a copy's versions) are not data
            keys.retain(|k| !crate::command::reserved(k));
            let outcomes = sides.compare_batch(&m, &keys).await?;
            for (key, out) in keys.into_iter().zip(outcomes) {
                report.source_keys += 1;
                match out {
                    Outcome::Equal => report.equal += 1,
                    Outcome::Gone => report.gone += 1,
                    d => suspects.push((key, d)),
                }
            }
            (o.progress)(report.source_keys, total);
            cursor = next;
            if cursor == b"0" {
                break;
            }
        }
    }
    // 2. the target's keys the source lacks
    for m in sides.dst.masters() {
        let mut cursor = b"0".to_vec();
        loop {
            let count = CHUNK.to_string();
            let r = sides.dst.ask(&m, vec![b"SCAN", &cursor, b"COUNT", count.as_bytes()]).await?;
            let (next, mut keys) = scan_reply(&r).map_err(|e| format!("{m}: SCAN: {e}"))?;
            keys.retain(|k| !crate::command::reserved(k));
            report.target_keys += keys.len() as u64;
            let mut by_owner: HashMap<Arc<str>, Vec<Vec<u8>>> = HashMap::new();
            for k in keys {
                by_owner.entry(sides.src.owner(&k)?).or_default().push(k);
            }
            for (addr, keys) in by_owner {
                let cmds: Vec<Vec<&[u8]>> = keys.iter().map(|k| vec![&b"EXISTS"[..], k]).collect();
                let replies = sides.src.pipe(&addr, &cmds).await?;
                for (k, r) in keys.into_iter().zip(replies) {
                    if int(&r) == Some(0) {
                        suspects.push((k, Outcome::Differs(Kind::Extra, "not on the source".into())));
                    }
                }
            }
            cursor = next;
            if cursor == b"0" {
                break;
            }
        }
    }
    // 3. differing keys, compared again: those written during the check settle
    for _ in 0..o.rechecks {
        if suspects.is_empty() {
            break;
        }
        tokio::time::sleep(o.recheck_delay).await;
        for c in [&sides.src.cluster, &sides.dst.cluster] {
            if c.is_cluster() {
                let _ = c.refresh().await;
            }
        }
        let mut still = Vec::new();
        for (key, _) in suspects {
            match sides.compare(&key).await? {
                Outcome::Equal => report.settled += 1,
                Outcome::Gone => report.gone += 1,
                d => still.push((key, d)),
            }
        }
        suspects = still;
    }
    for (key, out) in suspects {
        let Outcome::Differs(kind, detail) = out else { continue };
        let s = slot(&key);
        *report.by_kind.entry(kind).or_default() += 1;
        *report.by_slot.entry(s).or_default() += 1;
        if report.first.len() < o.first {
            report.first.push(Difference { key, slot: s, kind, detail });
        }
    }
    report.took = started.elapsed();
    Ok(report)
}

impl Sides {
    /// Compares the keys a `SCAN` of source master `m` returned: types and times to live
    /// pipelined per node, string values pipelined, the rest key by key.
    async fn compare_batch(&mut self, m: &Arc<str>, keys: &[Vec<u8>]) -> Result<Vec<Outcome>, String> {
        if keys.is_empty() {
            return Ok(vec![]);
        }
        fn probe(k: &[u8]) -> [Vec<&[u8]>; 2] {
            [vec![&b"TYPE"[..], k], vec![&b"PTTL"[..], k]]
        }
        let cmds: Vec<Vec<&[u8]>> = keys.iter().flat_map(|k| probe(k)).collect();
        let src = self.src.pipe(m, &cmds).await?;
        let mut dst: Vec<Bytes> = vec![Bytes::new(); keys.len() * 2];
        let mut by_owner: HashMap<Arc<str>, Vec<usize>> = HashMap::new();
        for (i, k) in keys.iter().enumerate() {
            by_owner.entry(self.dst.owner(k)?).or_default().push(i);
        }
        for (addr, idx) in &by_owner {
            let cmds: Vec<Vec<&[u8]>> = idx.iter().flat_map(|&i| probe(&keys[i])).collect();
            let replies = self.dst.pipe(addr, &cmds).await?;
            for (n, r) in replies.into_iter().enumerate() {
                dst[idx[n / 2] * 2 + n % 2] = r;
            }
        }
        let mut out = Vec::with_capacity(keys.len());
        let mut strings = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            let o = self.head(&src[2 * i], &src[2 * i + 1], &dst[2 * i], &dst[2 * i + 1]);
            match o {
                Ok(t) if t == b"string" => {
                    strings.push(i);
                    out.push(Outcome::Equal);
                }
                Ok(t) => out.push(self.compare_value(k, &t).await?),
                Err(d) => out.push(d),
            }
        }
        // string values: one pipelined GET on each node
        if !strings.is_empty() {
            let gets: Vec<Vec<&[u8]>> = strings.iter().map(|&i| vec![&b"GET"[..], &keys[i]]).collect();
            let a = self.src.pipe(m, &gets).await?;
            let mut b: Vec<Bytes> = vec![Bytes::new(); strings.len()];
            let mut by_owner: HashMap<Arc<str>, Vec<usize>> = HashMap::new();
            for (n, &i) in strings.iter().enumerate() {
                by_owner.entry(self.dst.owner(&keys[i])?).or_default().push(n);
            }
            for (addr, ns) in &by_owner {
                let gets: Vec<Vec<&[u8]>> = ns.iter().map(|&n| vec![&b"GET"[..], &keys[strings[n]]]).collect();
                for (j, r) in self.dst.pipe(addr, &gets).await?.into_iter().enumerate() {
                    b[ns[j]] = r;
                }
            }
            for (n, &i) in strings.iter().enumerate() {
                out[i] = same_reply(&a[n], &b[n], "the string");
            }
        }
        Ok(out)
    }

    /// Compares one key from scratch, on the masters serving it now.
    async fn compare(&mut self, key: &[u8]) -> Result<Outcome, String> {
        let st = self.src.ask_for(key, vec![b"TYPE", key]).await?;
        let sp = self.src.ask_for(key, vec![b"PTTL", key]).await?;
        let dt = self.dst.ask_for(key, vec![b"TYPE", key]).await?;
        let dp = self.dst.ask_for(key, vec![b"PTTL", key]).await?;
        match self.head(&st, &sp, &dt, &dp) {
            Ok(t) => self.compare_value(key, &t).await,
            Err(o) => Ok(o),
        }
    }

    /// From the two sides' `TYPE` and `PTTL` replies: the type, when both have the key
    /// with one type and times to live within the tolerance; otherwise the outcome.
    fn head(&self, st: &[u8], sp: &[u8], dt: &[u8], dp: &[u8]) -> Result<Vec<u8>, Outcome> {
        for r in [st, sp, dt, dp] {
            if let Some(e) = error_text(r) {
                return Err(Outcome::Differs(Kind::Unreadable, String::from_utf8_lossy(e).into_owned()));
            }
        }
        let ty =
            |r: &[u8]| Value::parse(r).ok().and_then(|(v, _)| v.as_bytes().map(<[u8]>::to_vec)).unwrap_or_default();
        let (st, dt) = (ty(st), ty(dt));
        let (sp, dp) = (int(sp).unwrap_or(-2), int(dp).unwrap_or(-2));
        let none = |t: &[u8], p: i64| t == b"none" || p == -2;
        match (none(&st, sp), none(&dt, dp)) {
            (true, true) => return Err(Outcome::Gone),
            (true, false) => return Err(Outcome::Differs(Kind::Extra, "not on the source".into())),
            (false, true) => return Err(Outcome::Differs(Kind::Missing, "not on the target".into())),
            _ => {}
        }
        if st != dt {
            let d = format!(
                "{} on the source, {} on the target",
                String::from_utf8_lossy(&st),
                String::from_utf8_lossy(&dt)
            );
            return Err(Outcome::Differs(Kind::Type, d));
        }
        let ttl = |p: i64| if p < 0 { "no expiry".to_string() } else { format!("{p} ms left") };
        let apart = match (sp, dp) {
            (-1, -1) => false,
            (a, b) if a >= 0 && b >= 0 => (a - b).abs() > self.tolerance_ms,
            _ => true,
        };
        if apart {
            return Err(Outcome::Differs(Kind::Ttl, format!("{} on the source, {} on the target", ttl(sp), ttl(dp))));
        }
        Ok(st)
    }

    /// Compares a key's contents, of type `ty` on both sides, in pieces.
    async fn compare_value(&mut self, key: &[u8], ty: &[u8]) -> Result<Outcome, String> {
        let chunk = CHUNK.to_string();
        let chunk = chunk.as_bytes();
        Ok(match ty {
            b"string" => {
                let a = self.src.ask_for(key, vec![b"GET", key]).await?;
                let b = self.dst.ask_for(key, vec![b"GET", key]).await?;
                same_reply(&a, &b, "the string")
            }
            b"list" => {
                let (n, d) = self.sizes(key, b"LLEN").await?;
                if let Some(d) = d {
                    return Ok(d);
                }
                let mut start = 0;
                while start < n {
                    let (from, to) = (start.to_string(), (start + CHUNK as i64 - 1).to_string());
                    let cmd = vec![&b"LRANGE"[..], key, from.as_bytes(), to.as_bytes()];
                    let a = self.src.ask_for(key, cmd.clone()).await?;
                    let b = self.dst.ask_for(key, cmd).await?;
                    if let d @ Outcome::Differs(..) = same_reply(&a, &b, &format!("elements {from} to {to}")) {
                        return Ok(d);
                    }
                    start += CHUNK as i64;
                }
                Outcome::Equal
            }
            b"stream" => {
                let (_, d) = self.sizes(key, b"XLEN").await?;
                if let Some(d) = d {
                    return Ok(d);
                }
                let mut from = b"-".to_vec();
                loop {
                    let cmd = vec![&b"XRANGE"[..], key, &from, b"+", b"COUNT", chunk];
                    let a = self.src.ask_for(key, cmd.clone()).await?;
                    let b = self.dst.ask_for(key, cmd).await?;
                    if let d @ Outcome::Differs(..) =
                        same_reply(&a, &b, &format!("entries from {}", String::from_utf8_lossy(&from)))
                    {
                        return Ok(d);
                    }
                    // the next piece starts after the last id of this one
                    let last = Value::parse(&a).ok().and_then(|(v, _)| match v {
                        Value::Array(entries) => entries.last().and_then(|e| match e {
                            Value::Array(p) => p.first().and_then(Value::as_bytes).map(<[u8]>::to_vec),
                            _ => None,
                        }),
                        _ => None,
                    });
                    match last {
                        Some(id) => from = [b"(".as_slice(), &id].concat(),
                        None => break Outcome::Equal,
                    }
                }
            }
            b"hash" | b"set" | b"zset" => {
                let (size, scan, check) = match ty {
                    b"hash" => (&b"HLEN"[..], &b"HSCAN"[..], &b"HMGET"[..]),
                    b"set" => (&b"SCARD"[..], &b"SSCAN"[..], &b"SMISMEMBER"[..]),
                    _ => (&b"ZCARD"[..], &b"ZSCAN"[..], &b"ZMSCORE"[..]),
                };
                let (_, d) = self.sizes(key, size).await?;
                if let Some(d) = d {
                    return Ok(d);
                }
                let src = self.src.owner(key)?;
                let mut cursor = b"0".to_vec();
                loop {
                    let r = self.src.ask(&src, vec![scan, key, &cursor, b"COUNT", chunk]).await?;
                    let (next, items) = scan_reply(&r).map_err(|e| format!("{src}: scan of a key: {e}"))?;
                    if let Some(d) = self.members_match(key, ty, check, &items).await? {
                        return Ok(d);
                    }
                    cursor = next;
                    if cursor == b"0" {
                        break Outcome::Equal;
                    }
                }
            }
            _ => {
                let a = self.src.ask_for(key, vec![b"DUMP", key]).await?;
                let b = self.dst.ask_for(key, vec![b"DUMP", key]).await?;
                same_reply(&a, &b, "the DUMP (a module's type)")
            }
        })
    }

    /// The key's size on both sides (`cmd`: LLEN, HLEN, ...): the source's, and a
    /// difference if they are not equal.
    async fn sizes(&mut self, key: &[u8], cmd: &[u8]) -> Result<(i64, Option<Outcome>), String> {
        let a = int(&self.src.ask_for(key, vec![cmd, key]).await?).unwrap_or(-1);
        let b = int(&self.dst.ask_for(key, vec![cmd, key]).await?).unwrap_or(-1);
        let d =
            (a != b).then(|| Outcome::Differs(Kind::Value, format!("{a} elements on the source, {b} on the target")));
        Ok((a, d))
    }

    /// Whether the target holds the members (and values or scores) of one piece of a
    /// source hash, set or sorted set's scan (`items`: as the scan returned them).
    async fn members_match(
        &mut self,
        key: &[u8],
        ty: &[u8],
        check: &[u8],
        items: &[Vec<u8>],
    ) -> Result<Option<Outcome>, String> {
        let paired = ty != b"set";
        let names: Vec<&[u8]> = if paired {
            items.iter().step_by(2).map(Vec::as_slice).collect()
        } else {
            items.iter().map(Vec::as_slice).collect()
        };
        if names.is_empty() {
            return Ok(None);
        }
        let mut cmd: Vec<&[u8]> = vec![check, key];
        cmd.extend(names.iter().copied());
        let r = self.dst.ask_for(key, cmd).await?;
        let Ok((Value::Array(got), _)) = Value::parse(&r) else {
            return Ok(Some(Outcome::Differs(Kind::Unreadable, String::from_utf8_lossy(&r).trim_end().to_string())));
        };
        for (i, name) in names.iter().enumerate() {
            let theirs = got.get(i);
            let differs = match ty {
                b"set" => theirs.and_then(Value::as_int) != Some(1),
                b"hash" => theirs.and_then(Value::as_bytes) != items.get(2 * i + 1).map(Vec::as_slice),
                _ => {
                    let num = |b: Option<&[u8]>| b.and_then(|b| std::str::from_utf8(b).ok()?.parse::<f64>().ok());
                    let (a, b) = (num(items.get(2 * i + 1).map(Vec::as_slice)), num(theirs.and_then(Value::as_bytes)));
                    a.is_none() || a != b
                }
            };
            if differs {
                let what = match ty {
                    b"hash" => "field",
                    b"set" => "member",
                    _ => "member's score",
                };
                let d = format!("{what} {} differs or is not on the target", crate::protocol::reply::quoted(name));
                return Ok(Some(Outcome::Differs(Kind::Value, d)));
            }
        }
        Ok(None)
    }
}

/// Equal replies are equal contents (both sides answer RESP2).
fn same_reply(a: &[u8], b: &[u8], what: &str) -> Outcome {
    if a == b {
        return Outcome::Equal;
    }
    if let Some(e) = error_text(a).or(error_text(b)) {
        return Outcome::Differs(Kind::Unreadable, String::from_utf8_lossy(e).into_owned());
    }
    Outcome::Differs(Kind::Value, format!("{what} differs"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_replies_and_equal_replies() {
        let (c, items) = scan_reply(b"*2\r\n$2\r\n17\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n").unwrap();
        assert_eq!(c, b"17");
        assert_eq!(items, vec![b"a".to_vec(), b"b".to_vec()]);
        assert!(scan_reply(b"-ERR no\r\n").is_err());
        assert_eq!(same_reply(b"$1\r\nx\r\n", b"$1\r\nx\r\n", "v"), Outcome::Equal);
        assert!(matches!(same_reply(b"$1\r\nx\r\n", b"$1\r\ny\r\n", "v"), Outcome::Differs(Kind::Value, _)));
        assert!(matches!(same_reply(b"-MOVED 1 a:1\r\n", b"$1\r\ny\r\n", "v"), Outcome::Differs(Kind::Unreadable, _)));
    }

    #[test]
    fn a_report_lists_kinds_slots_and_first_keys() {
        let mut r = Report { source_keys: 3, equal: 1, target_keys: 3, ..Report::default() };
        r.by_kind.insert(Kind::Value, 1);
        r.by_kind.insert(Kind::Extra, 1);
        r.by_slot.insert(7, 2);
        r.first.push(Difference {
            key: b"h\x01".to_vec(),
            slot: 7,
            kind: Kind::Value,
            detail: "field \"f\" differs".into(),
        });
        let text = r.render();
        assert!(text.contains("3 source keys compared (1 equal"), "{text}");
        assert!(text.contains(": 2 differences"), "{text}");
        assert!(text.contains("missing 0, extra 1, type 0, value 1, ttl 0, unreadable 0"), "{text}");
        assert!(text.contains("slots with differences: 1: 7 (2)"), "{text}");
        assert!(text.contains("difference: value \"h\\x01\" (slot 7)"), "{text}");
    }
}
