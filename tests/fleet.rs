//! A fleet of heatshields (docs/fleet.md): three instances with one `fleet.name` in front
//! of one real 3+3 cluster divide a per-key rule between them. Clients spread 70/20/10
//! over the instances hammer one key; what the fleet admits over 5 s windows is the
//! rule's rate within ±10%, and again within 3 s after the busiest instance is killed
//! with SIGKILL, whose membership then expires from the fleet's keys, and again when one
//! of the other two stops (SIGTERM) and leaves the last one alone.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::client::{Conn, V};
use common::{Proxy, RedisCluster, Shared, config_file};

static CLUSTER: Shared<RedisCluster> = Shared::new();
static VALKEY: Shared<RedisCluster> = Shared::new();
/// One [`follow_on`] at a time: each runs nine clients as fast as they go and checks every
/// one-second window, which two at once on a two-core machine can starve.
static MOVERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn cluster() -> Arc<RedisCluster> {
    CLUSTER.get(RedisCluster::start)
}

/// Requests admitted (not THROTTLED), by 10 ms since the start.
struct Admitted {
    start: Instant,
    buckets: Vec<AtomicU64>,
}

impl Admitted {
    fn new(secs: usize) -> Arc<Admitted> {
        Arc::new(Admitted { start: Instant::now(), buckets: (0..secs * 100).map(|_| AtomicU64::new(0)).collect() })
    }

    fn add(&self, n: u64) {
        let i = (self.start.elapsed().as_millis() / 10) as usize;
        if let Some(b) = self.buckets.get(i) {
            b.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Admitted per second over [from, to) seconds since the start.
    fn rate(&self, from: f64, to: f64) -> f64 {
        let (a, b) = ((from * 100.0).round() as usize, (to * 100.0).round() as usize);
        let n: u64 = self.buckets[a..b].iter().map(|x| x.load(Ordering::Relaxed)).sum();
        n as f64 / (to - from)
    }
}

/// A client hammering `key` through `port`: 15 pipelined INCRs every 50 ms (300/s) until
/// `stop`, or until its heatshield goes away.
fn hammer(port: u16, key: String, admitted: Arc<Admitted>, stop: Arc<AtomicBool>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let Ok(mut c) = Conn::try_connect(port) else { return };
        let batch: Vec<u8> = (0..15).flat_map(|_| common::client::encode(&["INCR", &key])).collect();
        let mut next = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            if c.try_send_raw(&batch).is_err() {
                return;
            }
            let mut ok = 0;
            for _ in 0..15 {
                match c.try_read_full() {
                    Ok(r) if r.v.err().is_some_and(|e| e.starts_with("THROTTLED")) => {}
                    Ok(r) if r.v.is_err() => panic!("unexpected error {:?}", r.v),
                    Ok(_) => ok += 1,
                    Err(_) => return,
                }
            }
            admitted.add(ok);
            next += Duration::from_millis(50);
            if let Some(d) = next.checked_duration_since(Instant::now()) {
                thread::sleep(d);
            }
        }
    })
}

fn rule_field(c: &mut Conn, rule: &str, field: &str) -> V {
    let list = c.cmd(&["PROXY", "RATELIMIT", "LIST"]);
    let r = list.items().iter().find(|r| r.get("name") == Some(V::s(rule))).expect("the rule is listed").clone();
    r.get(field).unwrap_or_else(|| panic!("no {field} in {r:?}"))
}

/// Waits until every one of `proxies` counts them all as the members of `rule`'s fleet.
fn formed(proxies: &[Proxy], rule: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    for p in proxies {
        let mut c = Conn::connect(p.port());
        while rule_field(&mut c, rule, "fleet_members") != V::Int(proxies.len() as i64) {
            assert!(Instant::now() < deadline, "the fleet of {} did not form", proxies.len());
            thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn three_instances_admit_the_rules_rate_and_a_killed_one_lets_go() {
    let cluster = cluster();
    const RATE: f64 = 400.0;
    let (_dir, path) = config_file(
        "[fleet]\nname = \"t3\"\n\n[[ratelimit.rules]]\nname = \"hot\"\npattern = \"fleet:*\"\nrate = 400\nburst = 40\n",
    );
    let proxies: Vec<Proxy> = (0..3).map(|_| Proxy::start_cluster(&cluster, &["--config", &path])).collect();
    let admitted = Admitted::new(60);
    let stop = Arc::new(AtomicBool::new(false));
    let key = "fleet:hot".to_string();
    // 7, 2 and 1 clients: 2,100, 600 and 300 requests/s for a rule of 400/s
    let mut threads = vec![];
    for (i, n) in [7, 2, 1].into_iter().enumerate() {
        for _ in 0..n {
            threads.push(hammer(proxies[i].port(), key.clone(), admitted.clone(), stop.clone()));
        }
    }
    // 2 s of warm-up, then two windows of 5 s
    thread::sleep(Duration::from_secs(12));
    let mut c2 = Conn::connect(proxies[1].port());
    assert_eq!(rule_field(&mut c2, "hot", "fleet_members"), V::Int(3));
    assert_eq!(rule_field(&mut c2, "hot", "watched_keys"), V::Int(1));
    let share: f64 = rule_field(&mut c2, "hot", "share").text().parse().unwrap();
    assert!((share - 1.0 / 3.0).abs() < 0.01, "keys without a lease get 1/N: {share}");
    for (from, to) in [(2.0, 7.0), (7.0, 12.0)] {
        let r = admitted.rate(from, to);
        eprintln!("3 instances, {from}-{to} s: {r:.0}/s admitted ({:.3} of the rule)", r / RATE);
        assert!((r / RATE - 1.0).abs() <= 0.10, "{from}-{to} s: {r:.0}/s admitted for a rule of {RATE}/s");
    }
    // SIGKILL the instance with 70% of the clients: the other two take the rule's rate
    // within 3 s
    let (reports_key, members_key) = ("{heatshield:t3}:reports", "{heatshield:t3}:members");
    let mut direct = Conn::connect(cluster.master_for_key(members_key.as_bytes()));
    assert_eq!(direct.cmd(&["ZCARD", members_key]), V::Int(3));
    proxies[0].signal("KILL");
    let killed = admitted.start.elapsed().as_secs_f64();
    thread::sleep(Duration::from_secs(9));
    let seconds: Vec<String> =
        (0..5).map(|i| format!("{:.0}", admitted.rate(killed + i as f64, killed + i as f64 + 1.0))).collect();
    eprintln!("admitted per second after the kill: {}", seconds.join(" "));
    let r = admitted.rate(killed + 3.0, killed + 8.0);
    eprintln!("2 instances, 3-8 s after the kill: {r:.0}/s ({:.3})", r / RATE);
    assert!((r / RATE - 1.0).abs() <= 0.10, "after the kill: {r:.0}/s admitted for a rule of {RATE}/s");
    // the dead instance's membership and report expired from the fleet's keys
    assert_eq!(direct.cmd(&["ZCARD", members_key]), V::Int(2));
    assert_eq!(direct.cmd(&["HLEN", reports_key]), V::Int(2));
    assert_eq!(rule_field(&mut c2, "hot", "fleet_members"), V::Int(2));
    // one that stops cleanly leaves at once: the last one holds the whole rule
    proxies[2].signal("TERM");
    assert_eq!(proxies[2].wait_exit(Duration::from_secs(10)), Some(0));
    let left = admitted.start.elapsed().as_secs_f64();
    assert_eq!(direct.cmd(&["ZCARD", members_key]), V::Int(1), "{}", proxies[2].log());
    thread::sleep(Duration::from_secs(7));
    let r = admitted.rate(left + 1.0, left + 6.0);
    eprintln!("1 instance, 1-6 s after the other left: {r:.0}/s ({:.3})", r / RATE);
    assert!((r / RATE - 1.0).abs() <= 0.10, "alone: {r:.0}/s admitted for a rule of {RATE}/s");
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
}

#[test]
fn alone_an_instance_keeps_the_whole_rule_and_says_so() {
    let cluster = cluster();
    let (_dir, path) = config_file(
        "[fleet]\nname = \"t1\"\n\n[[ratelimit.rules]]\nname = \"one\"\npattern = \"fleet1:*\"\nrate = 1\nburst = 10\n",
    );
    let p = Proxy::start_cluster(&cluster, &["--config", &path]);
    let mut c = Conn::connect(p.port());
    assert_eq!(rule_field(&mut c, "one", "fleet_members"), V::Int(1));
    assert_eq!(rule_field(&mut c, "one", "share"), V::s("1.0000"));
    // the burst of 10 is this instance's whole
    let mut ok = 0;
    for _ in 0..20 {
        if !c.cmd(&["INCR", "fleet1:k"]).is_err() {
            ok += 1;
        }
    }
    assert!((10..=12).contains(&ok), "{ok} admitted of a burst of 10 at 1/s");
    // the fleet's keys are heatshield's own: no client reads or forges them
    let own = "ERR heatshield: keys starting with '{heatshield:' are heatshield's own (docs/fleet.md)";
    for cmd in [
        vec!["HGETALL", "{heatshield:t1}:reports"],
        vec!["HSET", "{heatshield:t1}:reports", "forged", "r x 1"],
        vec!["DEL", "fleet1:k", "{heatshield:t1}:members"],
        vec!["EVAL", "return 1", "1", "{heatshield:t1}:members"],
    ] {
        assert_eq!(c.cmd(&cmd), V::Err(own.into()), "{cmd:?}");
    }
    assert_eq!(c.cmd(&["MULTI"]), V::ok());
    assert_eq!(c.cmd(&["ZADD", "{heatshield:t1}:members", "1", "x"]), V::Err(own.into()));
    assert!(c.cmd(&["EXEC"]).err().is_some_and(|e| e.starts_with("EXECABORT")));
    let mut direct = Conn::connect(cluster.master_for_key(b"{heatshield:t1}:reports"));
    assert_eq!(direct.cmd(&["HLEN", "{heatshield:t1}:reports"]), V::Int(1), "only this instance's report");
    let (_, body) = common::http::http_get(&p.metrics_addr().unwrap(), "/metrics");
    assert!(body.contains("heatshield_fleet_members 1"), "{body}");
    assert!(body.contains("heatshield_ratelimit_share{rule=\"one\"} 1"), "{body}");
}

/// 20 redis-py clients (retrying on connection errors, as configured in production), each
/// INCRementing a counter of its own through one of `ports` (a comma-separated list),
/// until `stop` exists; prints
/// `client ACKED FAILED` per client.
const WRITERS: &str = r#"
import os, sys, threading, redis
from redis.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError
ports = [int(p) for p in sys.argv[1].split(",")]
prefix, stop = sys.argv[2], sys.argv[3]
acked, failed = [0] * 20, [0] * 20
def work(i):
    r = redis.Redis(host="127.0.0.1", port=ports[i % len(ports)], socket_timeout=10,
                    retry=Retry(ExponentialBackoff(cap=0.5, base=0.01), 30),
                    retry_on_error=[ConnectionError, TimeoutError])
    # (a test that failed has removed the directory: stop too)
    while os.path.isdir(os.path.dirname(stop)) and not os.path.exists(stop):
        try:
            r.incr(f"{prefix}{i}")
            acked[i] += 1
        except Exception as e:
            failed[i] += 1
            print("error", i, repr(e), flush=True)
threads = [threading.Thread(target=work, args=(i,)) for i in range(20)]
for t in threads: t.start()
for t in threads: t.join()
for i in range(20): print("client", i, acked[i], failed[i], flush=True)
"#;

/// HAProxy (Debian's `haproxy`, installed by scripts/ensure-deps.sh) in TCP mode on
/// `front`, balancing over `servers` (client port, metrics port) with health checks on
/// `/ready` every 100 ms, as docker/haproxy/haproxy.cfg does every second.
struct Haproxy {
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl Haproxy {
    fn start(front: u16, servers: &[(u16, String)]) -> Haproxy {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = format!(
            "global\n  maxconn 2000\ndefaults\n  mode tcp\n  timeout connect 1s\n  timeout client 60s\n  \
             timeout server 60s\n  timeout check 500ms\n  retries 3\n  option redispatch\n\
             frontend redis\n  bind 127.0.0.1:{front}\n  default_backend hs\n\
             backend hs\n  balance roundrobin\n  option httpchk GET /ready\n  http-check expect status 200\n"
        );
        for (i, (port, metrics)) in servers.iter().enumerate() {
            let mport = metrics.rsplit_once(':').unwrap().1;
            cfg += &format!("  server h{i} 127.0.0.1:{port} check port {mport} inter 100 fall 2 rise 2\n");
        }
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, cfg).unwrap();
        let bin = ["haproxy", "/usr/sbin/haproxy"]
            .into_iter()
            .find(|b| std::process::Command::new(b).arg("-v").output().is_ok_and(|o| o.status.success()))
            .expect("haproxy is required for this test: run scripts/ensure-deps.sh");
        let child = std::process::Command::new(bin)
            .args(["-db", "-f", path.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !Conn::try_connect(front).is_ok_and(|mut c| c.cmd(&["PING"]) == V::s("PONG")) {
            assert!(Instant::now() < deadline, "haproxy does not serve on {front}");
            thread::sleep(Duration::from_millis(50));
        }
        Haproxy { child, _dir: dir }
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn refused(port: u16) -> bool {
    let a = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    std::net::TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_err()
}

#[test]
fn a_rolling_restart_under_writing_clients_loses_nothing() {
    let cluster = cluster();
    let (_dir, path) =
        config_file("[server]\ndrain_grace_ms = 600\nshutdown_timeout_ms = 3000\n\n[fleet]\nname = \"roll\"\n");
    let seeds = cluster.seeds();
    let olds: Vec<Proxy> = (0..3).map(|_| Proxy::start_cluster(&cluster, &["--config", &path])).collect();
    let ports: Vec<u16> = olds.iter().map(|p| p.port()).collect();
    let metrics: Vec<String> = olds.iter().map(|p| p.metrics_addr().unwrap()).collect();
    let front = common::free_port();
    let servers: Vec<(u16, String)> = ports.iter().copied().zip(metrics.iter().cloned()).collect();
    let _haproxy = Haproxy::start(front, &servers);
    let work = tempfile::tempdir().unwrap();
    let stop = work.path().join("stop");
    let prefix = "roll:{w}:";
    let writers = std::process::Command::new("python3")
        .args(["-c", WRITERS, &front.to_string(), prefix, stop.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 with redis (scripts/ensure-deps.sh)");
    thread::sleep(Duration::from_secs(2));
    // One by one. The first and the last in place with --takeover (with 1 and 3 workers
    // where the old had 2): their port never refuses a connection. The second as a load
    // balancer sees a pod go: SIGTERM, /ready 503 while it still accepts for the grace,
    // then its listener closes, it exits, and a new one starts on the port.
    let mut news = vec![];
    let listens: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let restart_args = |i: usize| -> Vec<&str> {
        vec!["--cluster", &seeds, "--config", &path, "--listen", &listens[i], "--metrics", &metrics[i]]
    };
    for (i, old) in olds.iter().enumerate() {
        if i == 1 {
            old.signal("TERM");
            let t = Instant::now();
            let mut unready = None;
            let mut closed = None;
            while closed.is_none() {
                if unready.is_none() && common::http::try_http_get(&metrics[i], "/ready").is_ok_and(|r| r.0 == 503) {
                    unready = Some(t.elapsed());
                }
                if refused(ports[i]) {
                    closed = Some(t.elapsed());
                }
                assert!(t.elapsed() < Duration::from_secs(5), "the listener did not close");
                thread::sleep(Duration::from_millis(5));
            }
            let (unready, closed) = (unready.expect("/ready never answered 503"), closed.unwrap());
            eprintln!("SIGTERM: /ready 503 after {unready:?}, listener closed after {closed:?}");
            assert!(unready < closed && closed >= Duration::from_millis(550), "{unready:?} {closed:?}");
            assert_eq!(old.wait_exit(Duration::from_secs(10)), Some(0), "{}", old.log());
            news.push(Proxy::start(&[&restart_args(i)[..], &[]].concat()));
        } else {
            let probing = Arc::new(AtomicBool::new(true));
            let prober = {
                let (probing, port) = (probing.clone(), ports[i]);
                thread::spawn(move || {
                    let (mut tries, mut refusals) = (0, 0);
                    while probing.load(Ordering::Relaxed) {
                        tries += 1;
                        refusals += u32::from(refused(port));
                        thread::sleep(Duration::from_millis(2));
                    }
                    (tries, refusals)
                })
            };
            let threads = if i == 0 { "1" } else { "3" };
            news.push(Proxy::start(&[&restart_args(i)[..], &["--threads", threads, "--takeover"]].concat()));
            assert_eq!(old.wait_exit(Duration::from_secs(10)), Some(0), "{}", old.log());
            assert!(old.log().contains("listeners handed to a new heatshield"), "{}", old.log());
            probing.store(false, Ordering::Relaxed);
            let (tries, refusals) = prober.join().unwrap();
            eprintln!("--takeover of instance {i}: {refusals} of {tries} connections refused");
            assert_eq!(refusals, 0, "the port refused connections during the takeover");
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while common::http::try_http_get(&metrics[i], "/ready").map_or(true, |r| r.0 != 200) {
            assert!(Instant::now() < deadline, "the new instance {i} is not ready");
            thread::sleep(Duration::from_millis(20));
        }
        thread::sleep(Duration::from_secs(1));
    }
    std::fs::write(&stop, b"").unwrap();
    let out = writers.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let mut direct = Conn::connect(cluster.master_for_key(prefix.as_bytes()));
    let (mut acked_all, mut extra) = (0, 0);
    for line in text.lines().filter(|l| l.starts_with("client ")) {
        let f: Vec<i64> = line.split(' ').skip(1).map(|x| x.parse().unwrap()).collect();
        let (i, acked, failed) = (f[0], f[1], f[2]);
        assert_eq!(failed, 0, "client {i}: {failed} writes failed\n{text}");
        let stored = direct.cmd(&["GET", &format!("{prefix}{i}")]).text().parse::<i64>().unwrap();
        assert!(stored >= acked, "client {i}: {acked} increments acknowledged, {stored} stored");
        acked_all += acked;
        extra += stored - acked;
    }
    assert_eq!(text.lines().filter(|l| l.starts_with("client ")).count(), 20, "{text}");
    assert!(acked_all > 1000, "only {acked_all} writes in the restart");
    eprintln!("rolling restart: {acked_all} acknowledged increments, 0 failed, {extra} applied twice by a retry");
}

#[test]
fn when_the_fleets_master_does_not_answer_each_instance_keeps_its_last_part() {
    // a cluster of its own: the pause stops every client of that master, and the other
    // tests' keys may live there
    let cluster = RedisCluster::start();
    const RATE: f64 = 400.0;
    let (_dir, path) = config_file(
        "[backend]\ncommand_timeout_ms = 1000\n\n[fleet]\nname = \"stall\"\n\n\
         [[ratelimit.rules]]\nname = \"hot\"\npattern = \"stall:*\"\nrate = 400\nburst = 40\n",
    );
    let fleet_master = cluster.master_for_key(b"{heatshield:stall}:members");
    // the hammered key lives on another master, which keeps answering
    let key =
        (0..).map(|i| format!("stall:k{i}")).find(|k| cluster.master_for_key(k.as_bytes()) != fleet_master).unwrap();
    let proxies: Vec<Proxy> = (0..2).map(|_| Proxy::start_cluster(&cluster, &["--config", &path])).collect();
    let admitted = Admitted::new(30);
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = vec![];
    for p in &proxies {
        for _ in 0..2 {
            threads.push(hammer(p.port(), key.clone(), admitted.clone(), stop.clone()));
        }
    }
    thread::sleep(Duration::from_secs(4));
    let before = admitted.rate(2.0, 4.0);
    // the fleet's master stops answering clients for 5 s (no failover: the cluster bus
    // still runs)
    let mut direct = Conn::connect(fleet_master);
    assert_eq!(direct.cmd(&["CLIENT", "PAUSE", "5000", "ALL"]), V::ok());
    let paused = admitted.start.elapsed().as_secs_f64();
    thread::sleep(Duration::from_secs(4));
    let during = admitted.rate(paused + 1.0, paused + 4.0);
    let (_, m) = common::http::http_get(&proxies[0].metrics_addr().unwrap(), "/metrics");
    let age: f64 = m
        .lines()
        .find_map(|l| l.strip_prefix("heatshield_fleet_sync_age_seconds "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sync age in\n{m}"));
    thread::sleep(Duration::from_secs(3));
    let mut c = Conn::connect(proxies[0].port());
    assert_eq!(rule_field(&mut c, "hot", "fleet_members"), V::Int(2), "the fleet is seen again after the pause");
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let (_, m) = common::http::http_get(&proxies[0].metrics_addr().unwrap(), "/metrics");
    eprintln!("fleet master paused: {before:.0}/s before, {during:.0}/s during; sync age {age:.1} s during the pause");
    assert!((before / RATE - 1.0).abs() <= 0.10, "before the pause: {before:.0}/s");
    assert!((during / RATE - 1.0).abs() <= 0.10, "during the pause: {during:.0}/s, not the rule's {RATE}/s");
    assert!(age >= 2.0, "heatshield_fleet_sync_age_seconds {age} while the fleet's master was paused 3 s");
    assert!(m.contains("heatshield_fleet_syncs_total{result=\"error\"}"), "{m}");
}

/// While a key becomes watched, no member takes the whole rate from the fleet's bucket
/// while another still draws on its part (docs/fleet.md, "While the fleet changes over"):
/// two members sync every 100 ms, the third every second (a busy machine's late syncs, made
/// deterministic). Four clients on each hammer a fresh key (3,600/s for a rule of 1,000/s,
/// burst 50). In every one-second window of the first 6 s, the fleet admits at most 1.1 x the
/// rule plus one burst (plus a request per member, and 2% for the milliseconds between a
/// request's admission and its batch's replies being counted). With a change-over of two
/// fast intervals (before the reports said who watches the key), the two fast members
/// took the bucket's whole rate while the late one still drew on its third: 1,207 and
/// 1,211 in that second against 1,175 (1,038 and 1,050 now).
#[test]
fn a_member_that_syncs_late_lets_no_window_over_the_bound_while_a_key_becomes_watched() {
    let _one = MOVERS.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = cluster();
    const RATE: f64 = 1000.0;
    let rule = "[[ratelimit.rules]]\nname = \"hot\"\npattern = \"late:*\"\nrate = 1000\nburst = 50\n";
    let (_d1, fast) = config_file(&format!("[fleet]\nname = \"late\"\nsync_interval_ms = 100\n\n{rule}"));
    let (_d2, slow) =
        config_file(&format!("[fleet]\nname = \"late\"\nsync_interval_ms = 1000\nmember_ttl_ms = 3000\n\n{rule}"));
    let proxies: Vec<Proxy> =
        [&fast, &fast, &slow].iter().map(|p| Proxy::start_cluster(&cluster, &["--config", p])).collect();
    formed(&proxies, "hot");
    let admitted = Admitted::new(10);
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = proxies
        .iter()
        .flat_map(|p| [p.port(); 4])
        .map(|port| hammer(port, "late:k".to_string(), admitted.clone(), stop.clone()))
        .collect();
    thread::sleep(Duration::from_secs(6));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let bound = 1.1 * RATE * 1.02 + 50.0 + 3.0;
    let (mut worst, mut at) = (0.0, 0.0);
    for i in 0..500 {
        let from = i as f64 / 100.0;
        let n = admitted.rate(from, from + 1.0);
        if n > worst {
            (worst, at) = (n, from);
        }
    }
    let seconds: Vec<String> = (0..6).map(|i| format!("{:.0}", admitted.rate(i as f64, i as f64 + 1.0))).collect();
    eprintln!("admitted per second: {}; the most in one second: {worst:.0} from {at:.2} s", seconds.join(" "));
    assert!(worst <= bound, "{worst:.0} admitted in the second from {at:.2} s; the bound is {bound:.0}");
    let after: f64 = (1..6).map(|i| admitted.rate(i as f64, i as f64 + 1.0)).sum::<f64>() / 5.0;
    assert!(after >= 0.8 * RATE, "{after:.0}/s admitted from the second second on, for a rule of {RATE}/s");
    let mut direct = Conn::connect(cluster.master_for_key(b"late:k"));
    assert_eq!(direct.cmd(&["DEL", "late:k"]), V::Int(1));
}

/// The fleet's master stops answering just after a key became watched, before every
/// member watches it (docs/fleet.md, "When the fleet's master does not answer"): the
/// members that watch it draw on their shares of its demand, the one that does not yet
/// (it syncs every 3 s) on the rule's 1/N. Without the stricter part for a key not every
/// member marked, those added up to more than the rule for the whole pause: 422/s for a
/// rule of 400/s with this demand (six clients at one instance, one at each other), in
/// two runs; 272/s now. (In the fault harness, with its rule of 100/s: 1.28 x.)
#[test]
fn a_fleet_master_pause_before_every_member_watches_a_key_keeps_the_rule() {
    let _one = MOVERS.lock().unwrap_or_else(|e| e.into_inner());
    // a cluster of its own: the pause stops every client of that master
    let cluster = RedisCluster::start();
    const RATE: f64 = 400.0;
    let rule = "[[ratelimit.rules]]\nname = \"hot\"\npattern = \"early:*\"\nrate = 400\nburst = 40\n";
    let base = "[backend]\ncommand_timeout_ms = 1000\n\n[fleet]\nname = \"early\"\n";
    let (_d1, fast) = config_file(&format!("{base}sync_interval_ms = 100\n\n{rule}"));
    let (_d2, slow) = config_file(&format!("{base}sync_interval_ms = 3000\nmember_ttl_ms = 8000\n\n{rule}"));
    let fleet_master = cluster.master_for_key(b"{heatshield:early}:members");
    let key =
        (0..).map(|i| format!("early:k{i}")).find(|k| cluster.master_for_key(k.as_bytes()) != fleet_master).unwrap();
    let proxies: Vec<Proxy> =
        [&fast, &fast, &slow].iter().map(|p| Proxy::start_cluster(&cluster, &["--config", p])).collect();
    formed(&proxies, "hot");
    // the slow member has just synced: its next sync is 3 s away
    thread::sleep(Duration::from_millis(3200));
    let admitted = Admitted::new(12);
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = [(0, 6), (1, 1), (2, 1)]
        .iter()
        .flat_map(|&(i, n)| std::iter::repeat_n(proxies[i].port(), n))
        .map(|port| hammer(port, key.clone(), admitted.clone(), stop.clone()))
        .collect();
    // the fast members watch the key within a few syncs; then the pause
    thread::sleep(Duration::from_millis(600));
    let mut direct = Conn::connect(fleet_master);
    assert_eq!(direct.cmd(&["CLIENT", "PAUSE", "2500", "ALL"]), V::ok());
    let paused = admitted.start.elapsed().as_secs_f64();
    thread::sleep(Duration::from_millis(2600));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let during = admitted.rate(paused + 0.5, paused + 2.5);
    eprintln!(
        "the fleet's master paused before every member watched the key: {during:.0}/s admitted ({:.2} of the rule)",
        during / RATE
    );
    assert!(during <= RATE, "{during:.0}/s admitted while the fleet's master was paused, for a rule of {RATE}/s");
    assert!(during >= 0.5 * RATE, "{during:.0}/s admitted: the parts were not drawn on");
}

/// One fleet, one set of names: three instances, the third started with colocation
/// rules the other two do not have. It says so (not ready, with the reason; the metric;
/// `PROXY FLEET` on every member names it) and refuses the keys it would store under
/// another name (TRYAGAIN), the other two stay ready; its users differing too is reported
/// but not a reason to stop. Once its file has the fleet's rules and is reloaded, it is
/// ready again and serves the fleet's names.
#[test]
fn an_instance_whose_colocation_rules_differ_from_the_fleets_is_not_ready() {
    let cluster = cluster();
    let fleet = "[fleet]\nname = \"names\"\nsync_interval_ms = 200\n";
    let agreed = format!("{fleet}\n[[colocate]]\nname = \"rq\"\nkeys = [\"rq:*\"]\ntag = \"rq\"\n");
    let (_d1, same) = config_file(&agreed);
    let odd_text = format!(
        "{fleet}\n[server]\nusers = [\"odd on >pw ~* +@all\"]\n\n[[colocate]]\nname = \"rq\"\nkeys = [\"rq:*\"]\ntag = \"queue\"\n"
    );
    let (_d2, odd) = config_file(&odd_text);
    let a = Proxy::start_cluster(&cluster, &["--config", &same]);
    let b = Proxy::start_cluster(&cluster, &["--config", &same]);
    let c = Proxy::start_cluster(&cluster, &["--config", &odd]);
    let ready = |p: &Proxy| common::http::http_get(&p.metrics_addr().unwrap(), "/ready");
    common::wait_until(Duration::from_secs(10), "the odd instance not ready", || ready(&c).0 == 503);
    let (_, why) = ready(&c);
    assert!(why.contains("colocation rules differ from the fleet's"), "{why}");
    assert_eq!(ready(&a).0, 200);
    assert_eq!(ready(&b).0, 200);
    let (_, metrics) = common::http::http_get(&c.metrics_addr().unwrap(), "/metrics");
    assert!(metrics.contains("heatshield_fleet_differs{what=\"colocate\"} 1"), "{metrics}");
    assert!(metrics.contains("heatshield_fleet_differs{what=\"users\"} 1"), "{metrics}");
    assert!(c.log().contains("colocation rules differ from the fleet's"));
    // PROXY FLEET, on a member that agrees (once it synced since the odd one joined):
    // three members, the odd one named
    let fleet_view = |p: &Proxy| Conn::connect(p.port()).cmd(&["PROXY", "FLEET"]);
    common::wait_until(Duration::from_secs(5), "three members", || {
        fleet_view(&a).get("members").is_some_and(|m| m.items().len() == 3)
    });
    let view = fleet_view(&a);
    assert_eq!(view.get("name"), Some(V::s("names")));
    assert_eq!(view.get("differs"), Some(V::Arr(vec![])));
    let members = view.get("members").unwrap();
    assert_eq!(members.items().len(), 3, "{view:?}");
    let odd_pid = c.pid().to_string();
    for m in members.items() {
        let differs = m.get("differs").unwrap();
        if m.get("pid") == Some(V::s(&odd_pid)) {
            assert_eq!(differs, V::Arr(vec![V::s("colocate"), V::s("users")]), "{m:?}");
        } else {
            assert_eq!(differs, V::Arr(vec![]), "{m:?}");
        }
    }
    let on_odd = Conn::connect(c.port()).cmd(&["PROXY", "FLEET"]);
    assert_eq!(on_odd.get("differs"), Some(V::Arr(vec![V::s("colocate"), V::s("users")])));
    assert!(on_odd.get("ready").unwrap().text().starts_with("no: colocation rules differ"));
    // meanwhile it serves no key its rules store under another name than the fleet's:
    // refused alone and inside MULTI, nothing written under its name; other keys served
    let mut oc = Conn::connect(c.port());
    let refused = oc.cmd(&["SET", "rq:x", "odd"]);
    assert!(refused.err().is_some_and(|e| e.starts_with("TRYAGAIN") && e.contains("'rq:x'")), "{refused:?}");
    assert_eq!(oc.cmd(&["MULTI"]), V::ok());
    assert!(oc.cmd(&["SET", "rq:y", "odd"]).err().is_some_and(|e| e.starts_with("TRYAGAIN")));
    assert!(oc.cmd(&["EXEC"]).err().is_some_and(|e| e.starts_with("EXECABORT")));
    assert_eq!(oc.cmd(&["SET", "plain:x", "odd"]), V::ok());
    let queue_master = cluster.master_for_key(b"queue");
    assert_eq!(common::cmd(queue_master, &["EXISTS", "{queue}rq:x", "{queue}rq:y"]), V::Int(0));
    let mut ac = Conn::connect(a.port());
    assert_eq!(ac.cmd(&["SET", "rq:x", "fleet"]), V::ok());
    assert_eq!(ac.cmd(&["GET", "plain:x"]), V::s("odd"));
    // the fleet's rules in its file, reloaded: ready again
    std::fs::write(&odd, &agreed).unwrap();
    assert!(!Conn::connect(c.port()).cmd(&["PROXY", "CONFIG", "RELOAD"]).is_err());
    common::wait_until(Duration::from_secs(10), "the instance ready again", || ready(&c).0 == 200);
    let on_odd = Conn::connect(c.port()).cmd(&["PROXY", "FLEET"]);
    assert_eq!(on_odd.get("differs"), Some(V::Arr(vec![])), "{on_odd:?}");
    // and serves the fleet's names: what another member wrote
    assert_eq!(Conn::connect(c.port()).cmd(&["GET", "rq:x"]), V::s("fleet"));
}

/// A client of [`follow`]: `per` pipelined INCRs every 50 ms of one of `keys`
/// (in turn), through the instance `at[me]` names (an index into `ports`), reconnecting
/// when it changes; until `stop`. Counts what was admitted and, separately, every
/// acknowledged INCR of each key.
#[allow(clippy::too_many_arguments)]
fn mover(
    me: usize,
    per: usize,
    ports: Arc<Vec<u16>>,
    at: Arc<Vec<AtomicU64>>,
    keys: Arc<Vec<String>>,
    admitted: Arc<Admitted>,
    acked: Arc<Vec<AtomicU64>>,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut conn: Option<(usize, Conn)> = None;
        // (the clients' batches spread over the 50 ms, as independent clients' are)
        let mut next = Instant::now() + Duration::from_micros(me as u64 * 50_000 / 9);
        thread::sleep(next - Instant::now());
        // (each client's keys at random: xorshift)
        let mut k = (me as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        while !stop.load(Ordering::Relaxed) {
            let want = at[me].load(Ordering::Relaxed) as usize;
            if conn.as_ref().is_none_or(|(i, _)| *i != want) {
                conn = Conn::try_connect(ports[want]).ok().map(|c| (want, c));
            }
            let Some((_, c)) = conn.as_mut() else {
                thread::sleep(Duration::from_millis(10));
                continue;
            };
            let batch: Vec<usize> = (0..per)
                .map(|_| {
                    k ^= k << 13;
                    k ^= k >> 7;
                    k ^= k << 17;
                    (k % keys.len() as u64) as usize
                })
                .collect();
            let data: Vec<u8> = batch.iter().flat_map(|&i| common::client::encode(&["INCR", &keys[i]])).collect();
            if c.try_send_raw(&data).is_err() {
                conn = None;
                continue;
            }
            let mut ok = 0;
            for &i in &batch {
                match c.try_read_full() {
                    Ok(r) if r.v.err().is_some_and(|e| e.starts_with("THROTTLED")) => {}
                    Ok(r) if r.v.is_err() => panic!("unexpected error {:?}", r.v),
                    Ok(_) => {
                        ok += 1;
                        acked[i].fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => break,
                }
            }
            admitted.add(ok);
            next += Duration::from_millis(50);
            match next.checked_duration_since(Instant::now()) {
                Some(d) => thread::sleep(d),
                None => next = Instant::now(),
            }
        }
    })
}

/// Nine clients moved between three instances of one fleet as `plan` says (clients per
/// instance, and for how long), with a rule of `rate` a second (burst `burst`) per key
/// over `keys` keys (each client sending `per` INCRs every 50 ms), the first instance SIGKILLed after the plan (its clients gone
/// before); checks, per one-second window (at 10 ms steps), what the fleet admitted of
/// `rate × keys`: from one second after each move until the next, 0.9 to 1.1 (the first
/// phase from its third second: its keys become watched); in every window, at most 1.1
/// plus one burst a key; after the kill, from
/// `member_ttl_ms` + 1 s on, 0.9 to 1.1 again. Then each key's counter on Redis equals its
/// acknowledged INCRs. Prints the per-second series.
fn follow(name: &str, keys: usize, per: usize, rate: f64, burst: u64, plan: &[([usize; 3], f64)]) {
    follow_on(cluster(), name, keys, per, rate, burst, plan)
}

/// [`follow`] in front of `cluster`.
fn follow_on(
    cluster: Arc<RedisCluster>,
    name: &str,
    keys: usize,
    per: usize,
    rate: f64,
    burst: u64,
    plan: &[([usize; 3], f64)],
) {
    let _one = MOVERS.lock().unwrap_or_else(|e| e.into_inner());
    let (_dir, path) = config_file(&format!(
        "[fleet]\nname = \"{name}\"\n\n[[ratelimit.rules]]\nname = \"hot\"\npattern = \"{name}:*\"\nrate = {rate}\nburst = {burst}\n"
    ));
    let proxies: Vec<Proxy> = (0..3).map(|_| Proxy::start_cluster(&cluster, &["--config", &path])).collect();
    let ports = Arc::new(proxies.iter().map(|p| p.port()).collect::<Vec<_>>());
    // the clients come once every instance knows the fleet has three
    for p in &proxies {
        let mut c = Conn::connect(p.port());
        let t = Instant::now();
        while rule_field(&mut c, "hot", "fleet_members") != V::Int(3) {
            assert!(t.elapsed() < Duration::from_secs(10), "the fleet never had three members");
            thread::sleep(Duration::from_millis(50));
        }
    }
    let names = Arc::new((0..keys).map(|i| format!("{name}:{i}")).collect::<Vec<_>>());
    let total = rate * keys as f64;
    let secs: f64 = plan.iter().map(|(_, d)| d).sum::<f64>() + 8.0;
    let admitted = Admitted::new(secs as usize + 2);
    let acked = Arc::new((0..keys).map(|_| AtomicU64::new(0)).collect::<Vec<_>>());
    let at = Arc::new((0..9).map(|_| AtomicU64::new(0)).collect::<Vec<_>>());
    let stop = Arc::new(AtomicBool::new(false));
    let place = |spread: [usize; 3]| {
        let mut c = 0;
        for (i, n) in spread.into_iter().enumerate() {
            for _ in 0..n {
                at[c].store(i as u64, Ordering::Relaxed);
                c += 1;
            }
        }
        assert_eq!(c, 9);
    };
    place(plan[0].0);
    let threads: Vec<_> = (0..9)
        .map(|i| mover(i, per, ports.clone(), at.clone(), names.clone(), admitted.clone(), acked.clone(), stop.clone()))
        .collect();
    // (time, whether windows from one second after it until the next are checked)
    let mut moves: Vec<f64> = vec![];
    let t0 = admitted.start;
    for (i, (spread, d)) in plan.iter().enumerate() {
        if i > 0 {
            place(*spread);
        }
        moves.push(t0.elapsed().as_secs_f64());
        thread::sleep(Duration::from_secs_f64(*d));
    }
    // the first instance's clients go to the others, then it is killed
    place([0, 6, 3]);
    thread::sleep(Duration::from_millis(300));
    proxies[0].signal("KILL");
    let killed = t0.elapsed().as_secs_f64();
    thread::sleep(Duration::from_secs(7));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let end = t0.elapsed().as_secs_f64();
    let series: Vec<String> =
        (0..end as usize).map(|s| format!("{:.2}", admitted.rate(s as f64, s as f64 + 1.0) / total)).collect();
    eprintln!("{name}: admitted per second ÷ rule, moves at {moves:.1?}, kill at {killed:.1}: {}", series.join(" "));
    let window = |from: f64| admitted.rate(from, from + 1.0) / total;
    // (a window starts in the 10 ms that hold its time)
    let step = |t: f64| (t * 100.0).floor() / 100.0;
    // What the buckets can hold at each 10 ms step, in seconds of the rule: they start
    // full, gain the rule's rate, lose what is admitted, and hold at most one burst. A
    // second when the fleet admitted less than the rule (a loaded machine's late asks, a
    // change-over) leaves that much in the buckets, and a GCRA bucket rightly admits it
    // later on top of the rate: the 0.9-1.1 check's top is 1.1 plus what they hold.
    let cap = burst as f64 / rate;
    let mut held = vec![cap; admitted.buckets.len() + 1];
    for i in 0..admitted.buckets.len() {
        let used = admitted.buckets[i].load(Ordering::Relaxed) as f64 / total;
        held[i + 1] = (held[i] + 0.01 - used).clamp(0.0, cap);
    }
    let held_at = |t: f64| held[((t * 100.0).round() as usize).min(held.len() - 1)];
    let in_bounds = |w: f64, r: f64| r >= 0.9 && r <= 1.1 + held_at(w);
    let mut bad = vec![];
    // the first phase is the warm-up (the key becomes watched, and is held to this
    // instance's part for a sync interval more while the others may not watch it yet:
    // docs/fleet.md): checked in its last second
    for (i, &m) in moves.iter().enumerate() {
        let until = moves.get(i + 1).copied().unwrap_or(killed - 0.3);
        let mut w = step(m + if i == 0 { plan[0].1 - 1.0 } else { 1.0 });
        while w + 1.0 <= until + 0.01 {
            let r = window(w);
            if !in_bounds(w, r) {
                bad.push(format!(
                    "{r:.3} in [{w:.2}, {:.2}) after the move at {m:.1} (the buckets held {:.3})",
                    w + 1.0,
                    held_at(w)
                ));
            }
            w += 0.01;
        }
    }
    let ttl = 1.5;
    let mut w = step(killed + ttl + 1.0);
    while w + 1.0 <= end - 0.2 {
        let r = window(w);
        if !in_bounds(w, r) {
            bad.push(format!(
                "{r:.3} in [{w:.2}, {:.2}) after the kill at {killed:.1} (the buckets held {:.3})",
                w + 1.0,
                held_at(w)
            ));
        }
        w += 0.01;
    }
    let most = 1.1 + burst as f64 / rate;
    let mut w = 0.0;
    while w + 1.0 <= end - 0.2 {
        let r = window(w);
        if r > most {
            bad.push(format!("{r:.3} in [{w:.2}, {:.2}), over {most:.2}", w + 1.0));
        }
        w += 0.01;
    }
    assert!(bad.is_empty(), "{name}: windows out of bounds:\n{}", bad.join("\n"));
    // nothing lost or doubled
    let mut direct: std::collections::HashMap<u16, Conn> = std::collections::HashMap::new();
    for (i, k) in names.iter().enumerate() {
        let want = acked[i].load(Ordering::Relaxed) as i64;
        let port = cluster.master_for_key(k.as_bytes());
        let c = direct.entry(port).or_insert_with(|| Conn::connect(port));
        let got = match c.cmd(&["GET", k]) {
            V::Nil => 0,
            v => v.text().parse::<i64>().unwrap(),
        };
        assert_eq!(got, want, "{k}: the counter against the acknowledged INCRs");
    }
}

/// The phases of issue 49, then a shift every 2 s for 10 s.
const MOVES: [([usize; 3], f64); 8] = [
    ([6, 2, 1], 4.0),
    ([0, 0, 9], 3.0),
    ([6, 3, 0], 3.0),
    ([9, 0, 0], 2.0),
    ([0, 9, 0], 2.0),
    ([3, 3, 3], 2.0),
    ([0, 1, 8], 2.0),
    ([5, 0, 4], 2.0),
];

#[test]
fn a_hot_keys_budget_follows_its_clients_between_instances() {
    // nine clients of 300 INCRs a second: 6.75 times the rule
    follow("mv1", 1, 15, 400.0, 40, &MOVES);
}

#[test]
fn on_valkey_a_hot_keys_budget_follows_its_clients_too() {
    // the buckets' script on Valkey 9.1's Lua and clock: the issue's first phases, then
    // the kill
    let valkey = VALKEY.get(|| RedisCluster::start_valkey(&[]));
    follow_on(valkey, "mvv", 1, 15, 400.0, 40, &MOVES[..4]);
}

#[test]
fn a_thousand_keys_budgets_follow_their_clients_between_instances() {
    // nine clients of 900 INCRs a second over the keys: 4 times the rule. (A burst of a
    // request or two would not do: with requests coming at random, one bucket of burst 1
    // admits 0.8 of its rate, alone or in a fleet.)
    // (the first six moves of the hot key's plan: every instance gains and loses clients;
    // the first phase a second longer: a thousand keys' change-over took past the third
    // second on a loaded 2-core machine, 0.89 of the rule in it)
    let mut plan = MOVES[..6].to_vec();
    plan[0].1 = 5.0;
    follow("mvk", 1000, 45, 2.0, 4, &plan);
}

/// Issue 49: a colocation rule added to a fleet of three, instance by instance
/// (`[[colocate_next]]`, then a reload of each), while a client of each instance INCRs a
/// key of the rule as fast as it goes. Watched on the cluster directly: once the key's new
/// name holds a value, its old name never changes again (no instance wrote it after
/// another wrote the new one); the two together hold every acknowledged INCR; the keys
/// were refused (TRYAGAIN) only while the fleet switched. Then a file caught up (the
/// rule under `[[colocate]]`) changes nothing.
#[test]
fn a_colocation_rule_rolled_out_instance_by_instance_never_writes_a_key_under_two_names() {
    let cluster = cluster();
    let before = "[fleet]\nname = \"roll\"\nsync_interval_ms = 200\nmember_ttl_ms = 1000\n".to_string();
    let rule = "name = \"ro\"\nkeys = [\"ro:*\"]\ntag = \"ro\"\n";
    let staged = format!("{before}\n[[colocate_next]]\n{rule}");
    let caught_up = format!("{before}\n[[colocate]]\n{rule}");
    let files: Vec<(tempfile::TempDir, String)> = (0..3).map(|_| config_file(&before)).collect();
    let proxies: Vec<Proxy> = files.iter().map(|(_, f)| Proxy::start_cluster(&cluster, &["--config", f])).collect();
    let fleet_of = |p: &Proxy| Conn::connect(p.port()).cmd(&["PROXY", "FLEET"]);
    common::wait_until(Duration::from_secs(10), "three members", || {
        proxies.iter().all(|p| fleet_of(p).get("members").is_some_and(|m| m.items().len() == 3))
    });
    let (old_name, new_name) = ("ro:n", "{ro}ro:n");
    let (old_at, new_at) = (cluster.master_for_key(old_name.as_bytes()), cluster.master_for_key(b"ro"));
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    // (first and last refusal, ms since the start)
    let refused = Arc::new((AtomicU64::new(u64::MAX), AtomicU64::new(0), AtomicU64::new(0)));
    let writers: Vec<_> = proxies
        .iter()
        .map(|p| {
            let (port, stop, acked, refused) = (p.port(), stop.clone(), acked.clone(), refused.clone());
            thread::spawn(move || {
                let mut c = Conn::connect(port);
                while !stop.load(Ordering::Relaxed) {
                    match c.cmd(&["INCR", "ro:n"]) {
                        V::Int(_) => {
                            acked.fetch_add(1, Ordering::Relaxed);
                        }
                        V::Err(e) if e.starts_with("TRYAGAIN") => {
                            assert!(e.contains("switching the colocation rules that name 'ro:n'"), "{e}");
                            let ms = start.elapsed().as_millis() as u64;
                            refused.0.fetch_min(ms, Ordering::Relaxed);
                            refused.1.fetch_max(ms, Ordering::Relaxed);
                            refused.2.fetch_add(1, Ordering::Relaxed);
                            thread::sleep(Duration::from_millis(5));
                        }
                        other => panic!("INCR through {port}: {other:?}"),
                    }
                }
            })
        })
        .collect();
    // the watcher: the old name, then the new one, straight from their masters
    let watcher = {
        let stop = stop.clone();
        thread::spawn(move || {
            let (mut o, mut n) = (Conn::connect(old_at), Conn::connect(new_at));
            let int = |v: V| match v {
                V::Nil => 0,
                v => v.text().parse::<u64>().unwrap(),
            };
            // the old name's value read after the new name was first seen written
            let mut settled: Option<u64> = None;
            let mut seen_new = false;
            let mut samples = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let old = int(o.cmd(&["GET", old_name]));
                if seen_new {
                    match settled {
                        None => settled = Some(old),
                        Some(s) => assert_eq!(old, s, "the old name written after the new one was"),
                    }
                }
                seen_new |= int(n.cmd(&["GET", new_name])) > 0;
                samples += 1;
                thread::sleep(Duration::from_millis(2));
            }
            (seen_new, settled.is_some(), samples)
        })
    };
    thread::sleep(Duration::from_millis(800));
    // the rule rolled out one instance at a time
    for (i, (_, f)) in files.iter().enumerate() {
        std::fs::write(f, &staged).unwrap();
        let r = Conn::connect(proxies[i].port()).cmd(&["PROXY", "CONFIG", "RELOAD"]);
        assert!(!r.is_err(), "{r:?}");
        thread::sleep(Duration::from_millis(700));
    }
    let digest = |p: &Proxy| fleet_of(p).get("digests").and_then(|d| d.get("colocate"));
    let next = fleet_of(&proxies[0]).get("digests").and_then(|d| d.get("colocate_next")).unwrap();
    assert_ne!(next, V::s(""));
    common::wait_until(Duration::from_secs(10), "every instance switched", || {
        proxies.iter().all(|p| digest(p) == Some(next.clone()))
    });
    let switched_ms = start.elapsed().as_millis() as u64;
    thread::sleep(Duration::from_millis(800));
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    let (seen_new, settled, samples) = watcher.join().unwrap();
    assert!(seen_new && settled, "the watcher saw the new name written ({samples} samples)");
    let int = |port: u16, k: &str| match common::cmd(port, &["GET", k]) {
        V::Nil => 0,
        v => v.text().parse::<u64>().unwrap(),
    };
    let (old, new) = (int(old_at, old_name), int(new_at, new_name));
    assert!(old > 0 && new > 0, "writes before and after the switch: {old} and {new}");
    assert_eq!(old + new, acked.load(Ordering::Relaxed), "the two names hold every acknowledged INCR");
    let (first, last, n) =
        (refused.0.load(Ordering::Relaxed), refused.1.load(Ordering::Relaxed), refused.2.load(Ordering::Relaxed));
    eprintln!(
        "roll: {old} INCRs under the old name, {new} under the new one; {n} refused from {first} ms to {last} ms, every instance switched by {switched_ms} ms"
    );
    assert!(last <= switched_ms + 100, "refused after the switch: until {last} ms, switched at {switched_ms} ms");
    // every instance ready throughout, and served the rest: the new name through each
    for p in &proxies {
        assert!(fleet_of(p).get("ready").is_some_and(|r| r == V::s("yes")));
        assert_eq!(Conn::connect(p.port()).cmd(&["GET", "ro:n"]), V::s(new.to_string()));
    }
    // a file caught up: the rule under [[colocate]], no next rules; nothing changes
    std::fs::write(&files[0].1, &caught_up).unwrap();
    assert!(!Conn::connect(proxies[0].port()).cmd(&["PROXY", "CONFIG", "RELOAD"]).is_err());
    thread::sleep(Duration::from_millis(600));
    assert_eq!(digest(&proxies[0]), Some(next));
    assert_eq!(Conn::connect(proxies[0].port()).cmd(&["INCR", "ro:n"]), V::Int(new as i64 + 1));
}

/// The fleet's bucket script (`TOKENS`, docs/fleet.md) on the servers themselves, Redis
/// 7.0.15 and Valkey 9.1: a bucket starts empty, fills at the rule's rate up to its burst
/// and gives what an ask wants within that; an ask that empties it first (the one that
/// ends a change-over, so that what the bucket gathered meanwhile does not follow the
/// parts' burst) gets nothing and is told to wait an interval, and the bucket fills again.
#[test]
fn the_buckets_script_starts_empty_fills_gives_and_empties() {
    let redis = common::redis::RedisServer::standalone(&[]);
    let valkey = common::redis::RedisServer::standalone_of(&common::redis::valkey_server_required(), &[]);
    for port in [redis.port(), valkey.port()] {
        let mut c = Conn::connect(port);
        // a rule of 100/s with a burst of 20: an interval of 10 ms, a tolerance of 200 ms
        let ask = |c: &mut Conn, want: u64, burn: bool| -> (i64, i64) {
            let r = c.cmd(&[
                "EVAL",
                heatshield::services::fleet::TOKENS,
                "1",
                "{f}:bucket",
                "10000.000",
                "200000.000",
                &want.to_string(),
                if burn { "1" } else { "0" },
            ]);
            let v = r.items();
            (v[0].int(), v[1].int())
        };
        let (n, wait) = ask(&mut c, 5, false);
        assert_eq!(n, 0, "a new bucket is empty");
        assert!(wait > 0 && wait <= 10_000, "one token an interval away: {wait} µs");
        thread::sleep(Duration::from_millis(400));
        assert_eq!(ask(&mut c, 5, false).0, 5, "filled: what is asked");
        let n = ask(&mut c, 100, false).0;
        assert!((15..=17).contains(&n), "within the burst: the rest of it (and a refill's token or two), {n}");
        thread::sleep(Duration::from_millis(400));
        let (n, wait) = ask(&mut c, 5, true);
        let emptied = Instant::now();
        assert_eq!(n, 0, "emptied first: nothing");
        assert_eq!(wait, 10_000, "the next token an interval away");
        thread::sleep(Duration::from_millis(50));
        let n = ask(&mut c, 100, false).0;
        let ms = emptied.elapsed().as_millis() as i64;
        assert!(
            n >= 4 && n <= (ms / 10 + 1).min(19),
            "refilled at the rate only: {n} tokens {ms} ms after it was emptied"
        );
        thread::sleep(Duration::from_millis(400));
        assert_eq!(ask(&mut c, 100, false).0, 20, "full again: the burst");
    }
}
