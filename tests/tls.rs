//! TLS on both sides, with real parts: heatshield's TLS listener reached by redis-cli
//! `--tls`, redis-py `ssl=True` and a rustls client (with and without client
//! certificates, certificates rotated under 100 open connections); and heatshield in
//! front of Redis 7.0.15 servers that speak TLS (`tls-port`, `tls-cluster yes`,
//! `tls-replication yes`, client certificates required), through failover and a slot
//! migration, with every connection it makes checked to be on a TLS port. The
//! certificates are the test's own (tests/common/tls.rs).

mod common;

use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::client::{Conn, V};
use common::redis::TLS_PORT_AUTO;
use common::tls::{Issued, Pki, TlsConn, write_atomically};
use common::{
    Proxy, RedisCluster, RedisServer, RedisStandalone, SlotOwners, cmd_text, config_file, free_port, key_slot,
};

/// The `[tls]` section of a listener on `port` with `cert`, plus `more` lines.
fn listener_conf(port: u16, cert: &Issued, more: &str) -> String {
    format!(
        "[tls]\nlisten = \"127.0.0.1:{port}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n{more}\n",
        cert.cert.display(),
        cert.key.display()
    )
}

/// redis-cli over TLS to 127.0.0.1:`port`: its output, or its error text.
fn redis_cli_tls(port: u16, ca: &Issued, client: Option<&Issued>, args: &[&str]) -> (bool, String) {
    let mut c = Command::new("redis-cli");
    c.args(["-h", "127.0.0.1", "-p", &port.to_string(), "--tls", "--cacert"]).arg(&ca.cert);
    if let Some(cl) = client {
        c.arg("--cert").arg(&cl.cert).arg("--key").arg(&cl.key);
    }
    let out = c.args(args).output().expect("run redis-cli");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success() && !text.contains("Error"), text.trim().to_string())
}

/// The CA as an `Issued` whose `cert` is its file (for redis-cli's `--cacert`).
fn ca_of(pki: &Pki) -> Issued {
    Issued { cert: pki.ca(), key: pki.ca() }
}

fn metric(proxy: &Proxy, series: &str) -> f64 {
    common::http::scrape_series(&proxy.metrics_addr().unwrap(), series).unwrap_or(0.0)
}

#[test]
fn tls_listener_serves_redis_cli_redis_py_and_plain_clients_beside_it() {
    let redis = RedisStandalone::start();
    let pki = Pki::new("heatshield test CA");
    let cert = pki.issue_local("heatshield");
    let tls_port = free_port();
    let (_d, conf) = config_file(&listener_conf(tls_port, &cert, ""));
    let proxy = Proxy::start_standalone(&redis, &["--config", &conf]);
    let ca = ca_of(&pki);

    // redis-cli --tls
    assert_eq!(redis_cli_tls(tls_port, &ca, None, &["SET", "tls:k", "v1"]), (true, "OK".into()));
    assert_eq!(redis_cli_tls(tls_port, &ca, None, &["GET", "tls:k"]), (true, "v1".into()));
    let (_, port) = redis_cli_tls(tls_port, &ca, None, &["CONFIG", "GET", "tls-port"]);
    assert_eq!(port, format!("tls-port\n{tls_port}"), "CONFIG GET tls-port is heatshield's");
    // the plain listener beside it serves the same data
    let mut plain = Conn::connect(proxy.port());
    assert_eq!(plain.cmd(&["GET", "tls:k"]), V::s("v1"));

    // redis-py with ssl=True, pipelined and not
    let script = r#"
import sys, redis
r = redis.Redis(host="127.0.0.1", port=int(sys.argv[1]), ssl=True, ssl_ca_certs=sys.argv[2])
assert r.ping()
p = r.pipeline(transaction=False)
for i in range(200):
    p.incr("tls:py:ctr")
res = p.execute()
assert res == list(range(1, 201)), res
big = "x" * 300000
r.set("tls:py:big", big)
assert r.get("tls:py:big") == big.encode()
with r.pipeline(transaction=True) as t:
    t.set("tls:py:a", "1").incr("tls:py:a")
    assert t.execute() == [True, 2]
print("ok", r.get("tls:k").decode())
"#;
    let out = Command::new("python3")
        .args(["-c", script, &tls_port.to_string(), pki.ca().to_str().unwrap()])
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "redis-py over TLS failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok v1");
    assert_eq!(plain.cmd(&["GET", "tls:py:ctr"]), V::s("200"));

    // a rustls client sees heatshield's certificate, and a 1 MB reply whole
    let mut t = TlsConn::connect(tls_port, &pki.ca(), None).expect("TLS connect");
    assert_eq!(t.server_cert(), cert.der());
    let value = "y".repeat(1 << 20);
    assert_eq!(t.cmd(&["SET", "tls:big", &value]).unwrap(), V::ok());
    let pipelined: Vec<Vec<Vec<u8>>> = (0..50).map(|_| common::client::args(&["GET", "tls:big"])).collect();
    for r in t.pipeline(&pipelined).unwrap() {
        assert_eq!(r, V::s(&value));
    }

    // a plain-text client on the TLS port gets no reply, and is counted
    let before = metric(&proxy, "heatshield_tls_handshakes_failed_total");
    let mut wrong = Conn::connect(tls_port);
    wrong.send_raw(b"*1\r\n$4\r\nPING\r\n");
    let (bytes, _) = wrong.read_until_close(Duration::from_secs(5));
    assert!(!bytes.starts_with(b"+PONG"), "plain text answered on the TLS port: {bytes:?}");
    common::wait_until(Duration::from_secs(5), "the failed handshake counted", || {
        metric(&proxy, "heatshield_tls_handshakes_failed_total") > before
    });
    // and a TLS client on the plain port fails its handshake
    assert!(TlsConn::connect(proxy.port(), &pki.ca(), None).is_err());
    // a client that trusts another CA refuses heatshield
    let other = Pki::new("another CA");
    assert!(TlsConn::connect(tls_port, &other.ca(), None).is_err());
}

#[test]
fn client_certificates_required_or_optional() {
    let redis = RedisStandalone::start();
    let pki = Pki::new("heatshield test CA");
    let cert = pki.issue_local("heatshield");
    let client = pki.issue("app-client", &["app.example"]);
    let strangers = Pki::new("a stranger's CA");
    let stranger = strangers.issue("stranger", &["app.example"]);
    let ca = ca_of(&pki);
    // a TLS 1.3 client learns of a refused certificate at its first read
    let works = |port: u16, who: Option<&Issued>| {
        TlsConn::connect(port, &pki.ca(), who).and_then(|mut c| c.cmd(&["PING"])).is_ok_and(|v| v == V::s("PONG"))
    };

    // required (a CA given, auth_clients left unset: Redis's default, "yes")
    let port = free_port();
    let ca_line = format!("ca_cert_file = \"{}\"", pki.ca().display());
    let (_d, conf) = config_file(&listener_conf(port, &cert, &ca_line));
    let proxy = Proxy::start_standalone(&redis, &["--config", &conf]);
    assert!(works(port, Some(&client)), "a client with a certificate of the CA is served");
    assert!(!works(port, None), "a client without a certificate is refused");
    assert!(!works(port, Some(&stranger)), "a certificate of another CA is refused");
    assert_eq!(redis_cli_tls(port, &ca, Some(&client), &["PING"]), (true, "PONG".into()));
    let (ok, text) = redis_cli_tls(port, &ca, None, &["PING"]);
    assert!(!ok, "redis-cli without a certificate was served: {text}");
    assert!(metric(&proxy, "heatshield_tls_handshakes_failed_total") >= 3.0);
    let (_, auth) = redis_cli_tls(port, &ca, Some(&client), &["CONFIG", "GET", "tls-auth-clients"]);
    assert_eq!(auth, "tls-auth-clients\nyes");

    // optional: verified when given
    let port = free_port();
    let more = format!("{ca_line}\nauth_clients = \"optional\"");
    let (_d2, conf) = config_file(&listener_conf(port, &cert, &more));
    let _proxy = Proxy::start_standalone(&redis, &["--config", &conf]);
    assert!(works(port, None), "optional: a client without a certificate is served");
    assert!(works(port, Some(&client)));
    assert!(!works(port, Some(&stranger)), "optional: a certificate given is still verified");
}

/// `tls.auth_clients_user` (Valkey's `tls-auth-clients-user`): a verified certificate
/// whose common name (or first URI, with "URI") names an enabled user logs the client in
/// as that user without AUTH; a disabled or unknown user, or no such field, leaves it
/// the default user's (here one with a password: NOAUTH until AUTH). A reload that turns
/// the user off closes its certificate connections, as it closes its AUTH ones.
#[test]
fn a_client_certificate_names_the_clients_user() {
    let redis = RedisStandalone::start();
    let pki = Pki::new("heatshield test CA");
    let cert = pki.issue_local("heatshield");
    let (alice, bob, carol) = (pki.issue("alice", &[]), pki.issue("bob", &[]), pki.issue("carol", &[]));
    let app = pki.issue_uri("app", "spiffe://heatshield.test/app");
    let ca = ca_of(&pki);
    let users = |alice_on: &str| {
        format!(
            "[server]\nusers = [\"default on resetpass >defpw\", \"alice {alice_on} >alicepw ~a:* +@all\", \
             \"bob off >bobpw allkeys +@all\", \"app on nopass ~app:* +get +acl|whoami +ping\", \"spiffe://heatshield.test/app on nopass ~u:* +@all\"]\n"
        )
    };
    let tls = |port: u16, field: &str| {
        listener_conf(
            port,
            &cert,
            &format!("ca_cert_file = \"{}\"\nauth_clients_user = \"{field}\"", pki.ca().display()),
        )
    };
    let port = free_port();
    let audit_dir = tempfile::tempdir().unwrap();
    let audit = audit_dir.path().join("audit.jsonl");
    let users = |on: &str| format!("{}[audit]\nfile = \"{}\"\n\n", users(on), audit.display());
    let (_d, conf) = config_file(&(users("on") + &tls(port, "CN")));
    let proxy = Proxy::start_standalone(&redis, &["--config", &conf]);
    let whoami = |c: &mut TlsConn| c.cmd(&["ACL", "WHOAMI"]).unwrap();

    // alice: her user, her rules, her name in CLIENT LIST, without AUTH
    let mut a = TlsConn::connect(port, &pki.ca(), Some(&alice)).unwrap();
    assert_eq!(whoami(&mut a), V::s("alice"));
    assert_eq!(a.cmd(&["SET", "a:1", "x"]).unwrap(), V::ok());
    let refused = a.cmd(&["SET", "b:1", "x"]).unwrap();
    assert!(refused.err().is_some_and(|e| e.starts_with("NOPERM")), "{refused:?}");
    let list = a.cmd(&["CLIENT", "LIST"]).unwrap().text();
    assert!(list.lines().any(|l| l.contains(" user=alice ")), "{list}");
    assert_eq!(redis_cli_tls(port, &ca, Some(&alice), &["ACL", "WHOAMI"]), (true, "alice".into()));
    // bob is off, carol unknown: the default user, who needs its password
    for who in [&bob, &carol] {
        let mut c = TlsConn::connect(port, &pki.ca(), Some(who)).unwrap();
        assert_eq!(whoami(&mut c), V::Err("NOAUTH Authentication required.".into()));
        assert_eq!(c.cmd(&["AUTH", "defpw"]).unwrap(), V::ok());
        assert_eq!(whoami(&mut c), V::s("default"));
    }
    // with CN, the URI certificate is its common name's user, "app"
    let mut u = TlsConn::connect(port, &pki.ca(), Some(&app)).unwrap();
    assert_eq!(whoami(&mut u), V::s("app"));
    let counted = |result: &str| metric(&proxy, &format!("heatshield_tls_cert_logins_total{{result=\"{result}\"}}"));
    assert_eq!((counted("user"), counted("disabled"), counted("unknown")), (3.0, 1.0, 1.0));
    // the audit log has each certificate login (docs/audit.md)
    let deadline = Instant::now() + Duration::from_secs(10);
    let logins = loop {
        let text = std::fs::read_to_string(&audit).unwrap_or_default();
        let found: Vec<(String, String, String)> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|r| r["via"] == "certificate")
            .map(|r| {
                (
                    r["user"].as_str().unwrap_or("").into(),
                    r["result"].as_str().unwrap_or("").into(),
                    r["reason"].as_str().unwrap_or("").into(),
                )
            })
            .collect();
        if found.len() >= 5 || Instant::now() > deadline {
            break found;
        }
        thread::sleep(Duration::from_millis(50));
    };
    let want = |u: &str, res: &str, why: &str| (u.to_string(), res.to_string(), why.to_string());
    for w in [
        want("alice", "ok", ""),
        want("bob", "failed", "disabled"),
        want("carol", "failed", "unknown"),
        want("app", "ok", ""),
    ] {
        assert!(logins.contains(&w), "{w:?} not in {logins:?}");
    }

    // a reload that turns alice off closes her certificate connection; a new one is the
    // default user's
    write_atomically(std::path::Path::new(&conf), (users("off") + &tls(port, "CN")).as_bytes());
    proxy.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.cmd(&["PING"]).is_ok() {
        assert!(Instant::now() < deadline, "alice's certificate connection still open after the reload");
        thread::sleep(Duration::from_millis(50));
    }
    let mut again = TlsConn::connect(port, &pki.ca(), Some(&alice)).unwrap();
    assert_eq!(whoami(&mut again), V::Err("NOAUTH Authentication required.".into()));
    assert_eq!(whoami(&mut u), V::s("app"), "other certificate users stay");

    // URI: the first URI subject alternative name, whole; a certificate without one is
    // the default user's
    let port = free_port();
    let (_d2, conf) = config_file(&(users("on") + &tls(port, "URI")));
    let proxy = Proxy::start_standalone(&redis, &["--config", &conf]);
    let mut u = TlsConn::connect(port, &pki.ca(), Some(&app)).unwrap();
    assert_eq!(whoami(&mut u), V::s("spiffe://heatshield.test/app"));
    assert_eq!(u.cmd(&["SET", "u:1", "x"]).unwrap(), V::ok());
    let mut a = TlsConn::connect(port, &pki.ca(), Some(&alice)).unwrap();
    assert_eq!(whoami(&mut a), V::Err("NOAUTH Authentication required.".into()));
    assert_eq!(metric(&proxy, "heatshield_tls_cert_logins_total{result=\"no_field\"}"), 1.0);

    // the setting is checked: a name it does not know, and no client certificates asked for
    for (more, problem) in [
        (format!("ca_cert_file = \"{}\"\nauth_clients_user = \"OU\"", pki.ca().display()), "is none of"),
        ("auth_clients_user = \"CN\"".to_string(), "needs client certificates"),
    ] {
        let (_d3, bad) = config_file(&listener_conf(free_port(), &cert, &more));
        let (code, out, err) = common::run_bin(&["--check", "--config", &bad]);
        let text = out + &err;
        assert!(code != 0 && text.contains("tls.auth_clients_user") && text.contains(problem), "{text}");
    }
}

#[test]
fn tls_listener_alone() {
    let redis = RedisStandalone::start();
    let pki = Pki::new("heatshield test CA");
    let cert = pki.issue_local("heatshield");
    let port = free_port();
    let (_d, conf) = config_file(&listener_conf(port, &cert, ""));
    let proxy = Proxy::start_standalone(&redis, &["--config", &conf, "--listen", "off"]);
    let mut t = TlsConn::connect(port, &pki.ca(), None).expect("TLS connect");
    assert_eq!(t.cmd(&["SET", "alone", "1"]).unwrap(), V::ok());
    assert_eq!(
        t.cmd(&["CONFIG", "GET", "*port"]).unwrap().pairs().into_iter().find(|(k, _)| k.text() == "port").unwrap().1,
        V::s("0"),
        "no plain port"
    );
    assert!(Conn::try_connect(proxy.port()).is_err(), "nothing listens on the plain port");
    // --listen off without a TLS listener is refused with the key named
    let out = common::run_bin(&["--standalone", &redis.addr(), "--listen", "off", "--check"]);
    assert!(out.0 != 0 && out.2.contains("server.listen"), "{out:?}");
}

#[test]
fn certificates_rotate_under_a_hundred_open_connections() {
    let redis = RedisStandalone::start();
    let pki = Pki::new("heatshield test CA");
    let first = pki.issue_local("heatshield");
    let port = free_port();
    let (_d, conf) = config_file(&listener_conf(port, &first, ""));
    let proxy = Proxy::start_standalone(&redis, &["--config", &conf]);
    let first_der = first.der();

    let mut open: Vec<TlsConn> = (0..100)
        .map(|i| {
            let mut c = TlsConn::connect(port, &pki.ca(), None).expect("connect");
            assert_eq!(c.cmd(&["SET", &format!("rot:{i}"), "before"]).unwrap(), V::ok());
            c
        })
        .collect();
    assert!(open.iter().all(|c| c.server_cert() == first_der));

    // the files change on disk: new connections get the new certificate, within seconds
    let second = pki.issue_local("heatshield");
    let second_der = second.der();
    assert_ne!(first_der, second_der);
    let t0 = Instant::now();
    common::wait_until(Duration::from_secs(10), "the new certificate served", || {
        TlsConn::connect(port, &pki.ca(), None).is_ok_and(|c| c.server_cert() == second_der)
    });
    eprintln!("new certificate served {:?} after the files changed", t0.elapsed());
    // the hundred connections made before are all still served
    for (i, c) in open.iter_mut().enumerate() {
        assert_eq!(c.cmd(&["GET", &format!("rot:{i}")]).unwrap(), V::s("before"), "connection {i}");
        assert_eq!(c.cmd(&["SET", &format!("rot:{i}"), "after"]).unwrap(), V::ok());
    }
    assert!(metric(&proxy, "heatshield_tls_reloads_total") >= 1.0);

    // a broken key file is refused: the certificate in use stays
    write_atomically(&second.key, b"-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n");
    proxy.signal("HUP");
    common::wait_until(Duration::from_secs(10), "the broken files reported", || {
        proxy.log().contains("certificates not reloaded")
    });
    let c = TlsConn::connect(port, &pki.ca(), None).expect("still served");
    assert_eq!(c.server_cert(), second_der);
    drop(open);
}

// ---------------------------------------------------------------------------------------
// TLS to the backends
// ---------------------------------------------------------------------------------------

/// The lines of a Redis server speaking TLS with `node`'s certificate, requiring client
/// certificates of `pki`'s CA.
fn node_tls_lines(pki: &Pki, node: &Issued) -> Vec<String> {
    vec![
        TLS_PORT_AUTO.to_string(),
        format!("tls-cert-file {}", node.cert.display()),
        format!("tls-key-file {}", node.key.display()),
        format!("tls-ca-cert-file {}", pki.ca().display()),
        "tls-auth-clients yes".into(),
        "tls-cluster yes".into(),
        "tls-replication yes".into(),
    ]
}

/// `[backend]` TLS lines for heatshield: the CA, and a client certificate unless `None`.
fn backend_tls_conf(pki: &Pki, client: Option<&Issued>, more: &str) -> String {
    let mut s = format!("[backend]\ntls = true\ntls_ca_cert_file = \"{}\"\n", pki.ca().display());
    if let Some(c) = client {
        s += &format!("tls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n", c.cert.display(), c.key.display());
    }
    s + more + "\n"
}

/// Every client of the node on `port` (asked on its plain port): `(laddr port, name,
/// cmd)`; not a replica's own link to its master (flag M), which Redis lists too.
fn clients_of(port: u16) -> Vec<(u16, String, String)> {
    cmd_text(port, &["CLIENT", "LIST"])
        .lines()
        .filter(|l| !l.split(' ').any(|f| f.strip_prefix("flags=").is_some_and(|f| f.contains('M'))))
        .map(|l| {
            let field = |k: &str| l.split(' ').find_map(|f| f.strip_prefix(&format!("{k}="))).unwrap_or("").to_string();
            let laddr = field("laddr");
            let lport = laddr.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).unwrap_or(0);
            (lport, field("name"), field("cmd"))
        })
        .collect()
}

/// On every live node: no connection on its plain port but the harness's own `CLIENT
/// LIST`; returns how many connections its TLS port has.
fn only_tls_connections(cluster: &RedisCluster) -> usize {
    let mut tls = 0;
    for port in cluster.live_ports() {
        let t = cluster.tls_port_of(port);
        for (lport, name, cmd) in clients_of(port) {
            if lport == port {
                assert_eq!(
                    cmd, "client|list",
                    "a plain connection to {port} (name {name:?}) that is not the harness's"
                );
            } else {
                assert_eq!(lport, t, "a connection to neither port of {port}");
                tls += 1;
            }
        }
    }
    tls
}

#[test]
fn a_tls_cluster_through_failover_and_migration() {
    let pki = Pki::new("cluster CA");
    let node_cert = pki.issue_local("redis-node");
    let lines = node_tls_lines(&pki, &node_cert);
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let cluster = RedisCluster::start_with(&lines);
    let client = pki.issue("heatshield-backend", &["heatshield.example"]);
    let (_d, conf) =
        config_file(&backend_tls_conf(&pki, Some(&client), "[cache]\nwindow_ms = 200\nhot_threshold = 20\n"));
    let seeds = cluster.tls_seeds();
    let proxy = Proxy::start(&["--cluster", &seeds, "--config", &conf]);
    let mut c = Conn::connect(proxy.port());

    // plain requests, split multi-key commands, a transaction, WATCH, scripts
    for i in 0..300 {
        assert_eq!(c.cmd(&["SET", &format!("tk:{i}"), &format!("v{i}")]), V::ok());
    }
    let keys: Vec<String> = (0..300).map(|i| format!("tk:{i}")).collect();
    let mut mget = vec!["MGET".to_string()];
    mget.extend(keys.iter().cloned());
    let got = c.cmd(&mget);
    assert_eq!(got.items().len(), 300);
    assert!(got.items().iter().enumerate().all(|(i, v)| *v == V::s(format!("v{i}"))));
    assert_eq!(c.cmd(&["MULTI"]), V::ok());
    c.cmd(&["INCR", "{tx}:a"]);
    c.cmd(&["INCR", "{tx}:a"]);
    assert_eq!(c.cmd(&["EXEC"]), V::Arr(vec![V::Int(1), V::Int(2)]));
    assert_eq!(c.cmd(&["WATCH", "{tx}:a"]), V::ok());
    assert_eq!(c.cmd(&["MULTI"]), V::ok());
    c.cmd(&["SET", "{tx}:a", "w"]);
    assert_eq!(c.cmd(&["EXEC"]), V::Arr(vec![V::ok()]));
    assert_eq!(c.cmd(&["EVAL", "return redis.call('GET', KEYS[1])", "1", "tk:7"]), V::s("v7"));
    // a blocking command (a dedicated connection) served by a push from another client
    let port = proxy.port();
    let pusher = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        Conn::connect(port).cmd(&["RPUSH", "tq", "job"])
    });
    assert_eq!(c.cmd(&["BLPOP", "tq", "5"]), V::strs(&["tq", "job"]));
    pusher.join().unwrap();
    // pub/sub (the hub's connections) and WAIT (connections of its own)
    let mut sub = Conn::connect(proxy.port());
    sub.cmd(&["SUBSCRIBE", "tch"]);
    sub.cmd(&["SSUBSCRIBE", "{tk}sch"]);
    common::wait_until(Duration::from_secs(5), "the subscription reaches the cluster", || {
        c.cmd(&["PUBLISH", "tch", "hello"]).int() >= 1
    });
    assert_eq!(sub.read_reply(), V::strs(&["message", "tch", "hello"]));
    assert_eq!(c.cmd(&["SPUBLISH", "{tk}sch", "s-hello"]), V::Int(1));
    assert_eq!(sub.read_reply(), V::strs(&["smessage", "{tk}sch", "s-hello"]));
    assert_eq!(c.cmd(&["SET", "tk:w", "1"]), V::ok());
    assert!(c.cmd(&["WAIT", "1", "2000"]).int() >= 1, "a replica acknowledged over TLS replication");
    // the hot-key cache (its invalidation connections) is never stale
    for round in 0..5 {
        for _ in 0..40 {
            assert_eq!(c.cmd(&["GET", "tk:hot"]), if round == 0 { V::Nil } else { V::s(format!("r{round}")) });
        }
        assert_eq!(c.cmd(&["SET", "tk:hot", &format!("r{}", round + 1)]), V::ok());
    }
    let tls = only_tls_connections(&cluster);
    assert!(tls >= 6, "heatshield's connections are on the TLS ports ({tls})");
    let nodes = cmd_text(proxy.port(), &["PROXY", "NODES"]);
    assert!(!nodes.contains("error="), "{nodes}");
    let tls_ports: Vec<u16> = cluster.nodes().iter().map(|n| n.tls_port()).collect();
    for line in nodes.lines() {
        let port: u16 = line.split(' ').next().and_then(|a| a.rsplit_once(':')).unwrap().1.parse().unwrap();
        assert!(tls_ports.contains(&port), "PROXY NODES names only TLS ports: {nodes}");
    }

    // --- a slot moves (MIGRATE between the nodes goes over TLS too) ---
    let owners = SlotOwners::read(&cluster);
    let tag = "{tmig}";
    let slot = key_slot(tag.as_bytes());
    let src = owners.of_slot(slot);
    let dst = *owners.masters().iter().find(|&&m| m != src).unwrap();
    let (src_id, dst_id) = (cluster.node_id(src), cluster.node_id(dst));
    let mk = |i: usize| format!("{tag}:{i}");
    for i in 0..20 {
        assert_eq!(c.cmd(&["SET", &mk(i), &format!("m{i}")]), V::ok());
    }
    let s = slot.to_string();
    assert_eq!(cmd_text(dst, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &src_id]), "OK");
    assert_eq!(cmd_text(src, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &dst_id]), "OK");
    let dst_tls = cluster.tls_port_of(dst).to_string();
    let half: Vec<String> = (0..10).map(mk).collect();
    let mut migrate = vec!["MIGRATE", "127.0.0.1", dst_tls.as_str(), "", "0", "5000", "KEYS"];
    migrate.extend(half.iter().map(String::as_str));
    assert_eq!(cmd_text(src, &migrate), "OK");
    for i in 0..20 {
        assert_eq!(c.cmd(&["GET", &mk(i)]), V::s(format!("m{i}")), "mid-migration (ASK to a TLS port)");
    }
    let rest: Vec<String> = (10..20).map(mk).collect();
    let mut migrate = vec!["MIGRATE", "127.0.0.1", dst_tls.as_str(), "", "0", "5000", "KEYS"];
    migrate.extend(rest.iter().map(String::as_str));
    assert_eq!(cmd_text(src, &migrate), "OK");
    for m in owners.masters() {
        assert_eq!(cmd_text(m, &["CLUSTER", "SETSLOT", &s, "NODE", &dst_id]), "OK");
    }
    for i in 0..20 {
        assert_eq!(c.cmd(&["GET", &mk(i)]), V::s(format!("m{i}")), "after the migration (MOVED to a TLS port)");
    }
    assert_eq!(c.cmd(&["SET", &mk(0), "moved"]), V::ok());
    assert_eq!(cmd_text(dst, &["GET", &mk(0)]), "moved");

    // --- a master dies: its replica takes over, over TLS ---
    let victim = owners.of_key(b"tk:1");
    cluster.kill(victim);
    cluster.wait_ok(Duration::from_secs(30));
    let t0 = Instant::now();
    common::wait_until(Duration::from_secs(20), "writes to the failed master's slots succeed", || {
        c.cmd(&["SET", "tk:1", "after-failover"]) == V::ok()
    });
    eprintln!("writes resumed {:?} after the cluster converged", t0.elapsed());
    let got = c.cmd(&mget);
    let missing = got.items().iter().enumerate().filter(|(i, v)| *i != 1 && **v != V::s(format!("v{i}"))).count();
    assert_eq!(missing, 0, "every key written before the failover is read back");
    let tls = only_tls_connections(&cluster);
    assert!(tls >= 5, "after the failover, still only TLS connections ({tls})");
}

#[test]
fn backend_tls_problems_are_named_never_fallen_back_from() {
    let pki = Pki::new("node CA");
    let node = pki.issue_local("redis-node");
    let client = pki.issue("heatshield-backend", &["heatshield.example"]);
    let lines = node_tls_lines(&pki, &node);
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let server = RedisServer::standalone(&lines);
    let tls_addr = format!("127.0.0.1:{}", server.tls_port());
    let other = Pki::new("another CA");

    // (config, address, what PROXY NODES and the log must say)
    let cases: Vec<(String, String, &str)> = vec![
        ("[backend]\n".to_string(), tls_addr.clone(), "TLS-only port"),
        (backend_tls_conf(&other, Some(&client), ""), tls_addr.clone(), "UnknownIssuer"),
        (
            backend_tls_conf(&pki, Some(&client), "tls_server_name = \"other.example\""),
            tls_addr.clone(),
            "certificate not valid for name",
        ),
        (backend_tls_conf(&pki, None, ""), tls_addr.clone(), "CertificateRequired"),
        (backend_tls_conf(&pki, Some(&client), ""), server.addr(), "a plain-text port?"),
    ];
    // (each case's request waits out its retries, 5 to 8 s: the cases run side by side)
    std::thread::scope(|scope| {
        for (conf_text, addr, says) in cases {
            scope.spawn(move || {
                // (a plain-text port never answers a ClientHello: the handshake ends at the
                // connect timeout, which the request's retries wait out each time)
                let (_d, conf) = config_file(&(conf_text + "connect_timeout_ms = 300\n"));
                let proxy = Proxy::start(&["--standalone", &addr, "--config", &conf]);
                let mut c = Conn::connect(proxy.port());
                let t0 = Instant::now();
                let r = c.cmd(&["GET", "k"]);
                eprintln!("{says}: {r:?} after {:?}", t0.elapsed());
                assert!(r.is_err(), "{says}: a request was answered: {r:?}");
                let nodes = cmd_text(proxy.port(), &["PROXY", "NODES"]);
                assert!(nodes.contains(says), "{says}: PROXY NODES says: {nodes}");
                assert!(proxy.log().contains(says), "{says}: the log does not say it");
            });
        }
    });
    // and with everything right, it works
    let (_d, conf) = config_file(&backend_tls_conf(&pki, Some(&client), ""));
    let proxy = Proxy::start(&["--standalone", &tls_addr, "--config", &conf]);
    let mut c = Conn::connect(proxy.port());
    assert_eq!(c.cmd(&["SET", "k", "v"]), V::ok());
    assert_eq!(cmd_text(server.port(), &["GET", "k"]), "v");
    // so does the server name, when configured and on the certificate
    let named = pki.issue("named-node", &["redis.internal"]);
    let lines = node_tls_lines(&pki, &named);
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let server2 = RedisServer::standalone(&lines);
    let (_d2, conf) = config_file(&backend_tls_conf(&pki, Some(&client), "tls_server_name = \"redis.internal\""));
    let proxy = Proxy::start(&["--standalone", &format!("127.0.0.1:{}", server2.tls_port()), "--config", &conf]);
    assert_eq!(Conn::connect(proxy.port()).cmd(&["SET", "k2", "v2"]), V::ok());
}
