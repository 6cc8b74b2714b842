//! `HOTKEYS` (Redis 8.6): a tracking session of the keys that cost the most, answered by
//! heatshield for the whole cluster as it serves it (docs/commands.md).
//!
//! A server counts the CPU time and network bytes of its own commands; heatshield sees
//! every command to every master, and counts, per key (a command's first key), the bytes
//! of the request and of its reply (`NET`) and the microseconds from reading the command to
//! its reply being ready (`CPU`: the nearest heatshield can see to the masters' CPU time,
//! waiting included). `total-cpu-time-user-ms` / `-sys-ms` are heatshield's own process
//! CPU over the session. The top keys are kept in a HeavyKeeper sketch (the crate the hot-key
//! detector uses), `COUNT` of them. Nothing is counted while no session is active: the
//! request path pays one atomic load.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use heavykeeper::TopK;
use parking_lot::Mutex;

use crate::protocol::encode::Writer;
use crate::protocol::{Proto, Request};

/// The sketch's width and depth (as the hot-key detector's), and its decay.
const WIDTH: usize = 2048;
const DEPTH: usize = 4;
const DECAY: f64 = 0.9;

/// The session, if one was started and not reset.
#[derive(Default)]
pub struct Hotkeys {
    /// A session is counting (read on the request path).
    active: AtomicBool,
    /// Commands seen by the active session (the sampling counter).
    seen: AtomicU64,
    session: Mutex<Option<Box<Session>>>,
}

struct Session {
    active: bool,
    cpu: Option<TopK<Vec<u8>>>,
    net: Option<TopK<Vec<u8>>>,
    count: usize,
    sample: u64,
    /// Selected slots (none: all).
    slots: Vec<u16>,
    started: Instant,
    started_unix_ms: u64,
    /// When it ends by itself (DURATION).
    until: Option<Instant>,
    /// How long it counted, once stopped.
    lasted: Option<Duration>,
    cpu_at_start: (f64, f64),
    all_us: u64,
    all_net: u64,
    selected_us: u64,
    selected_net: u64,
    sampled_us: u64,
    sampled_net: u64,
    /// Bytes counted for NET (every sampled command in the selected slots).
    total_net: u64,
}

/// The metrics `HOTKEYS START METRICS` asks for.
const CPU: u8 = 1;
const NET: u8 = 2;

fn range_err(n: Option<i64>, lo: i64, hi: i64, text: &str) -> Result<i64, String> {
    match n {
        Some(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => Err(crate::errors::err(text)),
    }
}

fn int(b: &[u8]) -> Option<i64> {
    std::str::from_utf8(b).ok()?.parse().ok()
}

impl Hotkeys {
    /// Counts one answered command: `key` its first key (if any), `slot` that key's
    /// slot, `bytes` its request and reply, `took` its time in heatshield.
    #[inline]
    pub fn observe(&self, key: Option<&[u8]>, bytes: u64, took: Duration) {
        if !self.active() {
            return;
        }
        self.count(key, bytes, took);
    }

    /// A session is counting (the request path asks before it gathers what to count).
    #[inline]
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    #[cold]
    fn count(&self, key: Option<&[u8]>, bytes: u64, took: Duration) {
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        let mut s = self.session.lock();
        let Some(s) = s.as_mut().filter(|s| s.active) else { return };
        if s.until.is_some_and(|u| Instant::now() >= u) {
            s.stop();
            self.active.store(false, Ordering::Relaxed);
            return;
        }
        let us = took.as_micros() as u64;
        s.all_us += us;
        s.all_net += bytes;
        let selected =
            s.slots.is_empty() || key.is_some_and(|k| s.slots.contains(&crate::upstream::cluster::slot::slot(k)));
        if !selected {
            return;
        }
        s.selected_us += us;
        s.selected_net += bytes;
        if !n.is_multiple_of(s.sample) {
            return;
        }
        s.sampled_us += us;
        s.sampled_net += bytes;
        s.total_net += bytes;
        let Some(key) = key else { return };
        if let Some(t) = &mut s.cpu {
            t.add(key, us.max(1));
        }
        if let Some(t) = &mut s.net {
            t.add(key, bytes);
        }
    }

    /// `HOTKEYS ...`: the reply, written with `w`.
    pub fn command(&self, req: &Request, w: &mut Writer) {
        let sub = req.arg(1).to_ascii_uppercase();
        let two = req.argc() == 2;
        match sub.as_slice() {
            b"START" => match self.start(req) {
                Ok(()) => w.ok(),
                Err(e) => w.error(&e),
            },
            b"STOP" if two => {
                let mut s = self.session.lock();
                match s.as_mut().filter(|s| s.active) {
                    Some(s) => {
                        s.stop();
                        self.active.store(false, Ordering::Relaxed);
                        w.ok();
                    }
                    None => w.nil(),
                }
            }
            b"RESET" if two => {
                let mut s = self.session.lock();
                if s.as_ref().is_some_and(|s| s.active && s.until.is_none_or(|u| Instant::now() < u)) {
                    w.error(crate::errors::HOTKEYS_RUNNING);
                } else {
                    *s = None;
                    self.active.store(false, Ordering::Relaxed);
                    w.ok();
                }
            }
            b"GET" if two => {
                let mut s = self.session.lock();
                match s.as_mut() {
                    None => w.nil(),
                    Some(s) => {
                        if s.active && s.until.is_some_and(|u| Instant::now() >= u) {
                            s.stop();
                            self.active.store(false, Ordering::Relaxed);
                        }
                        s.write(w);
                    }
                }
            }
            b"HELP" if two => {
                let lines = [
                    "HOTKEYS <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                    "START METRICS <count> [CPU] [NET] [COUNT <k>] [DURATION <seconds>] [SAMPLE <ratio>] [SLOTS <count> <slot> ...]",
                    "    Start a session (heatshield counts what it serves, for every master).",
                    "STOP",
                    "    Stop the session, keeping what it counted.",
                    "GET",
                    "    What the session counted.",
                    "RESET",
                    "    Forget a stopped session.",
                    "HELP",
                    "    Print this help.",
                ];
                w.lines(&lines);
            }
            // (a known subcommand with arguments it takes none of)
            b"STOP" | b"RESET" | b"GET" | b"HELP" => {
                let name = String::from_utf8_lossy(&sub).to_ascii_lowercase();
                w.error(&crate::errors::wrong_arity(&format!("hotkeys|{name}")))
            }
            _ => {
                let name = String::from_utf8_lossy(req.arg(1));
                w.error(&crate::errors::unknown_subcommand(&name, "HOTKEYS"))
            }
        }
    }

    fn start(&self, req: &Request) -> Result<(), String> {
        let mut current = self.session.lock();
        if current.as_ref().is_some_and(|s| s.active && s.until.is_none_or(|u| Instant::now() < u)) {
            return Err(crate::errors::HOTKEYS_STARTED.into());
        }
        let args: Vec<&[u8]> = req.args().skip(2).collect();
        if args.len() < 2 || !args[0].eq_ignore_ascii_case(b"METRICS") {
            return Err(crate::errors::HOTKEYS_METRICS_REQUIRED.into());
        }
        let n = range_err(int(args[1]), 1, 2, "METRICS count must be > 0 and <= 2")? as usize;
        let mut metrics = 0u8;
        let mut j = 2;
        let mut parsed = 0;
        while j < args.len() && parsed < n {
            let m = if args[j].eq_ignore_ascii_case(b"CPU") {
                CPU
            } else if args[j].eq_ignore_ascii_case(b"NET") {
                NET
            } else {
                0
            };
            if m != 0 && metrics & m != 0 {
                let name = if m == CPU { "CPU" } else { "NET" };
                return Err(crate::errors::hotkeys_metric_twice(name));
            }
            metrics |= m;
            parsed += 1;
            j += 1;
        }
        if parsed != n {
            return Err(crate::errors::HOTKEYS_COUNTS_DIFFER.into());
        }
        if metrics == 0 {
            return Err(crate::errors::HOTKEYS_NO_METRIC.into());
        }
        let (mut count, mut duration, mut sample) = (10usize, 0u64, 1u64);
        let mut slots: Option<Vec<u16>> = None;
        while j < args.len() {
            let more = j + 1 < args.len();
            let word = args[j];
            if more && word.eq_ignore_ascii_case(b"COUNT") {
                count = range_err(int(args[j + 1]), 1, 64, "COUNT must be between 1 and 64")? as usize;
                j += 2;
            } else if more && word.eq_ignore_ascii_case(b"DURATION") {
                duration = range_err(int(args[j + 1]), 1, 1_000_000, "DURATION must be between 1 and 1000000")? as u64;
                j += 2;
            } else if more && word.eq_ignore_ascii_case(b"SAMPLE") {
                sample = range_err(int(args[j + 1]), 1, i32::MAX as i64, "SAMPLE ratio must be positive")? as u64;
                j += 2;
            } else if more && word.eq_ignore_ascii_case(b"SLOTS") {
                if slots.is_some() {
                    return Err(crate::errors::HOTKEYS_SLOTS_TWICE.into());
                }
                let k = range_err(int(args[j + 1]), 1, 16384, "SLOTS count must be between 1 and 16384")? as usize;
                if j + 1 + k >= args.len() {
                    return Err(crate::errors::HOTKEYS_FEW_SLOTS.into());
                }
                let mut list = Vec::with_capacity(k);
                for a in &args[j + 2..j + 2 + k] {
                    let s = int(a).filter(|s| (0..16384).contains(s)).ok_or(crate::errors::HOTKEYS_BAD_SLOT)?;
                    if list.contains(&(s as u16)) {
                        return Err(crate::errors::HOTKEYS_SLOT_TWICE.into());
                    }
                    list.push(s as u16);
                }
                slots = Some(list);
                j += 2 + k;
            } else {
                return Err(crate::errors::SYNTAX.into());
            }
        }
        let sketch = |on: bool| on.then(|| TopK::new(count, WIDTH, DEPTH, DECAY));
        let now = Instant::now();
        let unix_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        *current = Some(Box::new(Session {
            active: true,
            cpu: sketch(metrics & CPU != 0),
            net: sketch(metrics & NET != 0),
            count,
            sample,
            slots: slots.unwrap_or_default(),
            started: now,
            started_unix_ms: unix_ms.as_millis() as u64,
            until: (duration > 0).then(|| now + Duration::from_secs(duration)),
            lasted: None,
            cpu_at_start: super::own_cpu(),
            all_us: 0,
            all_net: 0,
            selected_us: 0,
            selected_net: 0,
            sampled_us: 0,
            sampled_net: 0,
            total_net: 0,
        }));
        self.seen.store(0, Ordering::Relaxed);
        self.active.store(true, Ordering::Relaxed);
        Ok(())
    }
}

impl Session {
    fn stop(&mut self) {
        if self.active {
            self.active = false;
            let end = self.until.map_or_else(Instant::now, |u| u.min(Instant::now()));
            self.lasted = Some(end - self.started);
        }
    }

    /// `HOTKEYS GET`'s reply: one entry (heatshield is one node), its fields and values.
    fn write(&self, w: &mut Writer) {
        let slots = !self.slots.is_empty();
        let sampling = self.sample > 1;
        let lasted = self.lasted.unwrap_or_else(|| self.started.elapsed()).as_millis() as i64;
        let mut fields: Vec<(&str, Field)> = vec![
            ("tracking-active", Field::Int(self.active as i64)),
            ("sample-ratio", Field::Int(self.sample as i64)),
            ("selected-slots", Field::Ranges(ranges(&self.slots))),
        ];
        if sampling && slots {
            fields.push(("sampled-commands-selected-slots-us", Field::Int(self.sampled_us as i64)));
        }
        if slots {
            fields.push(("all-commands-selected-slots-us", Field::Int(self.selected_us as i64)));
        }
        fields.push(("all-commands-all-slots-us", Field::Int(self.all_us as i64)));
        if sampling && slots {
            fields.push(("net-bytes-sampled-commands-selected-slots", Field::Int(self.sampled_net as i64)));
        }
        if slots {
            fields.push(("net-bytes-all-commands-selected-slots", Field::Int(self.selected_net as i64)));
        }
        fields.push(("net-bytes-all-commands-all-slots", Field::Int(self.all_net as i64)));
        fields.push(("collection-start-time-unix-ms", Field::Int(self.started_unix_ms as i64)));
        fields.push(("collection-duration-ms", Field::Int(lasted)));
        if self.cpu.is_some() {
            let (user, sys) = super::own_cpu();
            let ms = |now: f64, then: f64| ((now - then).max(0.0) * 1000.0) as i64;
            fields.push(("total-cpu-time-user-ms", Field::Int(ms(user, self.cpu_at_start.0))));
            fields.push(("total-cpu-time-sys-ms", Field::Int(ms(sys, self.cpu_at_start.1))));
        }
        if self.net.is_some() {
            fields.push(("total-net-bytes", Field::Int(self.total_net as i64)));
        }
        if let Some(t) = &self.cpu {
            fields.push(("by-cpu-time-us", Field::Top(top(t, self.count))));
        }
        if let Some(t) = &self.net {
            fields.push(("by-net-bytes", Field::Top(top(t, self.count))));
        }
        w.array(1);
        if w.proto == Proto::Resp3 {
            w.map(fields.len());
        } else {
            w.array(fields.len() * 2);
        }
        for (name, f) in fields {
            w.bulk(name.as_bytes());
            match f {
                Field::Int(i) => w.int(i),
                Field::Ranges(r) => {
                    w.array(r.len());
                    for (a, b) in r {
                        w.array(2);
                        w.int(a as i64);
                        w.int(b as i64);
                    }
                }
                Field::Top(t) => {
                    w.array(t.len() * 2);
                    for (k, v) in t {
                        w.bulk(&k);
                        w.int(v as i64);
                    }
                }
            }
        }
    }
}

enum Field {
    Int(i64),
    Ranges(Vec<(u16, u16)>),
    Top(Vec<(Vec<u8>, u64)>),
}

/// The selected slots as ranges, in order (none selected: every slot, one range).
fn ranges(slots: &[u16]) -> Vec<(u16, u16)> {
    if slots.is_empty() {
        return vec![(0, 16383)];
    }
    let mut s = slots.to_vec();
    s.sort_unstable();
    let mut out: Vec<(u16, u16)> = Vec::new();
    for x in s {
        match out.last_mut() {
            Some((_, b)) if *b + 1 == x => *b = x,
            _ => out.push((x, x)),
        }
    }
    out
}

/// The sketch's top `k`, largest first.
fn top(t: &TopK<Vec<u8>>, k: usize) -> Vec<(Vec<u8>, u64)> {
    let mut v: Vec<(Vec<u8>, u64)> = t.list().into_iter().map(|n| (n.item, n.count)).filter(|(_, c)| *c > 0).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v.truncate(k);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_given_as_ranges() {
        assert_eq!(ranges(&[]), vec![(0, 16383)]);
        assert_eq!(ranges(&[5, 3, 4, 9]), vec![(3, 5), (9, 9)]);
    }

    #[test]
    fn the_costliest_keys_lead() {
        let h = Hotkeys::default();
        let start = Request::from_args(&["HOTKEYS", "START", "METRICS", "2", "CPU", "NET", "COUNT", "2"]);
        let mut buf = bytes::BytesMut::new();
        h.command(&start, &mut Writer::new(&mut buf, Proto::Resp2));
        assert_eq!(&buf[..], b"+OK\r\n");
        for _ in 0..10 {
            h.observe(Some(b"big"), 1000, Duration::from_micros(5));
        }
        h.observe(Some(b"slow"), 10, Duration::from_micros(900));
        h.observe(Some(b"small"), 10, Duration::from_micros(1));
        h.observe(None, 10, Duration::from_micros(1));
        let s = h.session.lock();
        let s = s.as_ref().unwrap();
        assert_eq!(top(s.net.as_ref().unwrap(), 2)[0], (b"big".to_vec(), 10_000));
        assert_eq!(top(s.cpu.as_ref().unwrap(), 2)[0], (b"slow".to_vec(), 900));
        assert_eq!(s.all_net, 10_030);
    }
}
