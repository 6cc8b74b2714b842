//! The rate limiter's memory bound (docs/ratelimit.md, "Memory"): 500,000 distinct keys
//! read through a per-key rule capped at 250,000 tracked keys (a quarter of the default,
//! so the suite spends 10 s here rather than 40: the table's size and the bound scale
//! with the cap). The tracked-key count stops at the cap, and the proxy's resident memory
//! grows by less than the documented bound of 64 bytes per tracked key.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Proxy, RedisStandalone, http_get, wait_until};

const KEYS: usize = 500_000;
const CAP: u64 = 250_000;
const BOUND_PER_KEY: u64 = 64;

fn rss_bytes(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 =
        s.lines().find(|l| l.starts_with("VmRSS:")).unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

fn tracked(metrics: &str) -> Option<u64> {
    let (_, text) = http_get(metrics, "/metrics");
    text.lines()
        .find(|l| l.starts_with("heatshield_ratelimit_tracked_keys "))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
}

#[test]
fn twice_the_cap_in_keys_stays_within_the_cap_and_the_memory_bound() {
    let redis = RedisStandalone::start();
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("heatshield.toml");
    // a per-key rule on every key that never refuses during the test, and whose budgets
    // stay in debt for 100 s after one request (a budget full again may be given to
    // another key, so a rule whose budgets refill at once would never fill the table);
    // budgets are not reclaimed during the test; one worker so RSS is one process's doing
    std::fs::write(
        &conf,
        "[ratelimit]\nidle_reclaim_ms = 3600000\nmax_tracked_keys = 250000\n[[ratelimit.rules]]\nname = \"all\"\npattern = \"*\"\nrate = 0.01\nburst = 1000000\n",
    )
    .unwrap();
    let proxy = Proxy::start_standalone(&redis, &["--config", conf.to_str().unwrap(), "--threads", "1"]);
    let metrics = proxy.metrics_addr().expect("metrics address");
    let mut s = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // warm up the process (buffers, connections) before the baseline
    let mut send = |from: usize, to: usize| {
        let mut out = Vec::with_capacity((to - from) * 40);
        for i in from..to {
            let key = format!("m:{i:010}");
            out.extend_from_slice(format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len()).as_bytes());
        }
        s.write_all(&out).unwrap();
        // every reply is a nil: `$-1\r\n`
        let mut buf = vec![0u8; (to - from) * 5];
        s.read_exact(&mut buf).unwrap();
        assert!(buf.chunks(5).all(|c| c == b"$-1\r\n"), "unexpected reply among {}..{}", from, to);
    };
    send(0, 1000);
    wait_until(Duration::from_secs(5), "tracked-key gauge", || tracked(&metrics) == Some(1000));
    let before = rss_bytes(proxy.pid());
    let mut at_cap_rss = 0;
    for start in (1000..KEYS).step_by(2000) {
        send(start, (start + 2000).min(KEYS));
        if start < CAP as usize && start + 2000 >= CAP as usize {
            at_cap_rss = rss_bytes(proxy.pid());
        }
    }
    wait_until(Duration::from_secs(5), "tracked-key gauge at the cap", || tracked(&metrics) == Some(CAP));
    let after = rss_bytes(proxy.pid());
    let grew = after.saturating_sub(before);
    println!(
        "{KEYS} distinct keys: tracked {CAP} (the cap); RSS {} MB before, {} MB at the cap, {} MB after: {} bytes per tracked key",
        before >> 20,
        at_cap_rss >> 20,
        after >> 20,
        grew / CAP
    );
    assert!(grew <= CAP * BOUND_PER_KEY, "memory grew {grew} bytes for {CAP} tracked keys");
    // the keys past the cap added no budgets (new keys share the rule's budget at the
    // cap; budgets for them would take about 9 MB, and a doubled table 8 MB more)
    assert!(after <= at_cap_rss + (4 << 20), "memory kept growing past the cap: {at_cap_rss} -> {after}");
}
