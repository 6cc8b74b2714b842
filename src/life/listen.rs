//! The listening sockets of one heatshield: the clients' (plain and TLS, one or more per
//! worker, SO_REUSEPORT) and the HTTP port's, either bound here or, with `--takeover`,
//! received from the heatshield serving them through its handoff socket (docs/fleet.md).

use std::path::PathBuf;

use tracing::{error, info, warn};

use crate::config::Config;
use crate::front::{handoff, server};

/// What [`listen`] made: each worker's listeners, the HTTP port's, and what to offer a
/// heatshield started with `--takeover` (the handoff path, the addresses, copies of the
/// sockets).
pub struct Bound {
    pub listeners: Vec<server::Listeners>,
    pub http: Option<tokio::net::TcpListener>,
    pub offer: Option<(PathBuf, handoff::Addresses, handoff::Sockets)>,
    /// After a takeover: to tell the old heatshield that this one serves.
    pub confirm: Option<handoff::Confirm>,
}

/// Binds the clients' ports and the HTTP port, or, with `--takeover`, receives them from
/// the heatshield serving them; None after logging why it cannot.
pub async fn listen(config: &Config, workers: usize) -> Option<Bound> {
    let addrs = handoff::Addresses {
        plain: Some(config.server.listen.clone()).filter(|l| l != "off"),
        tls: config.tls.listen.clone(),
        http: Some(config.metrics.listen.clone()).filter(|l| l != "off"),
    };
    let path =
        handoff::path(&config.server.handoff_socket, addrs.plain.as_deref().or(addrs.tls.as_deref()).unwrap_or("none"));
    let mut got = handoff::Sockets::default();
    let mut received = false;
    let mut confirm = None;
    if config.server.takeover {
        match &path {
            Some(p) => match handoff::receive(p, &addrs) {
                Ok(Some((s, c))) => {
                    info!(path = %p.display(), plain = s.plain.len(), tls = s.tls.len(), "took over the listeners of the heatshield serving them");
                    got = s;
                    received = true;
                    confirm = Some(c);
                }
                Ok(None) => {
                    info!(path = %p.display(), "--takeover: no heatshield answers at the handoff socket; binding as usual")
                }
                Err(e) => {
                    error!(path = %p.display(), error = %e, "--takeover failed");
                    return None;
                }
            },
            None => warn!("--takeover with server.handoff_socket = \"off\": binding as usual"),
        }
    }
    let given = |s: Vec<std::net::TcpListener>| if received { Some(s) } else { None };
    let takeover = config.server.takeover;
    let plain = spread(given(std::mem::take(&mut got.plain)), addrs.plain.as_deref(), workers, takeover)?;
    let tls = spread(given(std::mem::take(&mut got.tls)), addrs.tls.as_deref(), workers, takeover)?;
    // Before anything binds a metric handle: handles made earlier would stay no-ops.
    let http = match config.metrics_addr() {
        Some(addr) => {
            if let Err(e) = crate::metrics::install() {
                error!(error = %e, "cannot record metrics");
                return None;
            }
            let l = match got.http.take() {
                Some(l) => tokio::net::TcpListener::from_std(l),
                None => tokio::net::TcpListener::bind(addr).await,
            };
            match l {
                Ok(l) => Some(l),
                Err(e) => {
                    error!(listen = %addr, error = %e, "cannot serve metrics");
                    return None;
                }
            }
        }
        None => None,
    };
    // copies of every socket, for the next heatshield
    let dup = |ls: &[Vec<std::net::TcpListener>]| ls.iter().flatten().filter_map(|l| l.try_clone().ok()).collect();
    let dups = handoff::Sockets {
        plain: dup(&plain),
        tls: dup(&tls),
        http: http.as_ref().and_then(|l| {
            use std::os::fd::AsFd;
            l.as_fd().try_clone_to_owned().ok().map(std::net::TcpListener::from)
        }),
    };
    let listeners = plain.into_iter().zip(tls).map(|(plain, tls)| server::Listeners { plain, tls }).collect();
    Some(Bound { listeners, http, offer: path.map(|p| (p, addrs, dups)), confirm })
}

/// Each worker's listeners for `addr` (none when `addr` is unset): the `received` ones
/// (a takeover's) spread over the workers, one bound beside them for a worker left
/// without; or, with nothing received, `workers` freshly bound. None after logging why
/// (an address in use names `--takeover` unless `takeover` was asked already).
pub fn spread(
    received: Option<Vec<std::net::TcpListener>>,
    addr: Option<&str>,
    workers: usize,
    takeover: bool,
) -> Option<Vec<Vec<std::net::TcpListener>>> {
    let mut out: Vec<Vec<std::net::TcpListener>> = (0..workers).map(|_| vec![]).collect();
    let Some(addr) = addr else { return Some(out) };
    let fail = |e: std::io::Error| {
        let hint = if e.kind() == std::io::ErrorKind::AddrInUse && !takeover {
            " (a heatshield serving it? start the new one with --takeover)"
        } else {
            ""
        };
        error!(listen = %addr, error = %e, "cannot listen{hint}");
    };
    let Some(given) = received else {
        for (i, l) in server::bind(addr, workers).map_err(fail).ok()?.into_iter().enumerate() {
            out[i % workers].push(l);
        }
        return Some(out);
    };
    for (i, l) in given.into_iter().enumerate() {
        out[i % workers].push(l);
    }
    let at: std::net::SocketAddr = addr.parse().ok()?;
    for w in out.iter_mut().filter(|w| w.is_empty()) {
        w.push(server::bind_beside(at).map_err(fail).ok()?);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_addr() -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    }

    fn port(l: &std::net::TcpListener) -> u16 {
        l.local_addr().unwrap().port()
    }

    #[test]
    fn without_an_address_every_worker_has_none() {
        let out = spread(None, None, 3, false).unwrap();
        assert_eq!(out.len(), 3);
        assert!(out.iter().all(|w| w.is_empty()));
    }

    #[test]
    fn bound_here_one_listener_per_worker_on_one_port() {
        let addr = free_addr();
        let out = spread(None, Some(&addr), 3, false).unwrap();
        assert!(out.iter().all(|w| w.len() == 1));
        let ports: Vec<u16> = out.iter().flatten().map(port).collect();
        assert!(ports.iter().all(|p| addr.ends_with(&format!(":{p}"))), "{ports:?} {addr}");
    }

    #[test]
    fn received_listeners_spread_and_a_worker_left_without_binds_beside_them() {
        let addr = free_addr();
        let taken = server::bind(&addr, 1).unwrap();
        let out = spread(Some(taken), Some(&addr), 3, true).unwrap();
        assert_eq!(out.iter().map(Vec::len).collect::<Vec<_>>(), vec![1, 1, 1]);
        assert!(out.iter().flatten().all(|l| addr.ends_with(&format!(":{}", port(l)))));
    }

    #[test]
    fn more_received_than_workers_all_kept() {
        let addr = free_addr();
        let taken = server::bind(&addr, 4).unwrap();
        let out = spread(Some(taken), Some(&addr), 2, true).unwrap();
        assert_eq!(out.iter().map(Vec::len).collect::<Vec<_>>(), vec![2, 2]);
    }

    #[test]
    fn an_address_in_use_is_refused() {
        // held without SO_REUSEPORT: nobody may bind beside it
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap().to_string();
        assert!(spread(None, Some(&addr), 1, false).is_none());
        assert!(spread(None, Some("not an address"), 1, false).is_none());
    }

    #[tokio::test]
    async fn takeover_with_nobody_serving_binds_as_usual() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::default();
        config.server.listen = free_addr();
        config.metrics.listen = "off".into();
        config.server.takeover = true;
        config.server.handoff_socket = dir.path().join("handoff.sock").display().to_string();
        let bound = listen(&config, 2).await.expect("bound");
        assert_eq!(bound.listeners.len(), 2);
        assert!(bound.listeners.iter().all(|l| l.plain.len() == 1 && l.tls.is_empty()));
        assert!(bound.confirm.is_none() && bound.http.is_none());
        let (path, _, dups) = bound.offer.expect("an offer for the next one");
        assert_eq!(path, dir.path().join("handoff.sock"));
        assert_eq!(dups.plain.len(), 2);
    }
}
