//! predixy's shape: one event loop owns every socket. A client's readable event parses its
//! requests into the nodes' write buffers; a node's readable event scans replies into the
//! clients' write buffers; after each batch of events the dirty buffers are written.
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

const LISTENER: Token = Token(usize::MAX);
const NODE0: usize = 1 << 20;

struct Client {
    s: TcpStream,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    /// replies not yet in order: (seq, bytes) of requests after `base`
    slots: VecDeque<Option<Vec<u8>>>,
    base: u64,
    next: u64,
    dirty: bool,
    gone: bool,
}

struct Node {
    s: TcpStream,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    fifo: VecDeque<(usize, u64)>,
    dirty: bool,
}

fn main() {
    let (seed, listen) = shapes::args();
    let (addrs, table) = shapes::slot_map(&seed);
    let mut poll = Poll::new().unwrap();
    let mut nodes: Vec<Node> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let s = std::net::TcpStream::connect(a).unwrap();
            s.set_nodelay(true).unwrap();
            s.set_nonblocking(true).unwrap();
            let mut s = TcpStream::from_std(s);
            poll.registry().register(&mut s, Token(NODE0 + i), Interest::READABLE | Interest::WRITABLE).unwrap();
            Node {
                s,
                rbuf: Vec::with_capacity(64 * 1024),
                wbuf: Vec::with_capacity(64 * 1024),
                fifo: VecDeque::new(),
                dirty: false,
            }
        })
        .collect();
    let mut l = TcpListener::bind(listen.parse().unwrap()).unwrap();
    poll.registry().register(&mut l, LISTENER, Interest::READABLE).unwrap();
    let mut clients: Vec<Option<Client>> = Vec::new();
    let mut events = Events::with_capacity(1024);
    let mut dirty_nodes: Vec<usize> = Vec::new();
    let mut dirty_clients: Vec<usize> = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        if let Err(e) = poll.poll(&mut events, None) {
            assert_eq!(e.kind(), ErrorKind::Interrupted);
            continue;
        }
        for ev in events.iter() {
            let t = ev.token();
            if t == LISTENER {
                while let Ok((mut s, _)) = l.accept() {
                    s.set_nodelay(true).unwrap();
                    let id = clients.len();
                    poll.registry().register(&mut s, Token(id), Interest::READABLE | Interest::WRITABLE).unwrap();
                    clients.push(Some(Client {
                        s,
                        rbuf: Vec::with_capacity(16 * 1024),
                        wbuf: Vec::new(),
                        slots: VecDeque::new(),
                        base: 0,
                        next: 0,
                        dirty: false,
                        gone: false,
                    }));
                }
            } else if t.0 >= NODE0 {
                let ni = t.0 - NODE0;
                let n = &mut nodes[ni];
                if ev.is_writable() && !n.wbuf.is_empty() && !n.dirty {
                    n.dirty = true;
                    dirty_nodes.push(ni);
                }
                if !ev.is_readable() {
                    continue;
                }
                loop {
                    match n.s.read(&mut chunk) {
                        Ok(0) => panic!("node closed"),
                        Ok(k) => n.rbuf.extend_from_slice(&chunk[..k]),
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) => panic!("{e}"),
                    }
                }
                let mut at = 0;
                while let Some(len) = shapes::scan(&n.rbuf[at..]) {
                    let (ci, seq) = n.fifo.pop_front().unwrap();
                    let b = &n.rbuf[at..at + len];
                    at += len;
                    let Some(c) = clients[ci].as_mut() else { continue };
                    let i = (seq - c.base) as usize;
                    if i == 0 {
                        c.wbuf.extend_from_slice(b);
                        c.slots.pop_front();
                        c.base += 1;
                        while let Some(Some(_)) = c.slots.front() {
                            c.wbuf.extend_from_slice(&c.slots.pop_front().unwrap().unwrap());
                            c.base += 1;
                        }
                        if !c.dirty {
                            c.dirty = true;
                            dirty_clients.push(ci);
                        }
                    } else {
                        c.slots[i] = Some(b.to_vec());
                    }
                }
                n.rbuf.drain(..at);
            } else {
                let ci = t.0;
                let Some(c) = clients[ci].as_mut() else { continue };
                if ev.is_writable() && !c.wbuf.is_empty() && !c.dirty {
                    c.dirty = true;
                    dirty_clients.push(ci);
                }
                if !ev.is_readable() {
                    continue;
                }
                loop {
                    match c.s.read(&mut chunk) {
                        Ok(0) => {
                            c.gone = true;
                            break;
                        }
                        Ok(k) => c.rbuf.extend_from_slice(&chunk[..k]),
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(_) => {
                            c.gone = true;
                            break;
                        }
                    }
                }
                let mut at = 0;
                while let Some((len, slot)) = shapes::request(&c.rbuf[at..]) {
                    let ni = slot.map_or(0, |s| table[s as usize] as usize);
                    let n = &mut nodes[ni];
                    n.wbuf.extend_from_slice(&c.rbuf[at..at + len]);
                    n.fifo.push_back((ci, c.next));
                    c.slots.push_back(None);
                    c.next += 1;
                    at += len;
                    if !n.dirty {
                        n.dirty = true;
                        dirty_nodes.push(ni);
                    }
                }
                c.rbuf.drain(..at);
                if c.gone {
                    poll.registry().deregister(&mut c.s).ok();
                    clients[ci] = None;
                }
            }
        }
        for ni in dirty_nodes.drain(..) {
            let n = &mut nodes[ni];
            n.dirty = false;
            match n.s.write(&n.wbuf) {
                Ok(k) => {
                    n.wbuf.drain(..k);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        for ci in dirty_clients.drain(..) {
            let Some(c) = clients[ci].as_mut() else { continue };
            c.dirty = false;
            match c.s.write(&c.wbuf) {
                Ok(k) => {
                    c.wbuf.drain(..k);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => {
                    poll.registry().deregister(&mut c.s).ok();
                    clients[ci] = None;
                }
            }
        }
    }
}
