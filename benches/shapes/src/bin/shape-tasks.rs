//! heatshield's shape, minimal: a task per client, a task per node connection, requests
//! handed to the node's task on a channel (which yields once to gather a batch), replies
//! handed back on the client's channel.
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

type ReplyTx = UnboundedSender<(u64, Bytes)>;
struct Req {
    data: Bytes,
    seq: u64,
    to: ReplyTx,
}

fn main() {
    let (seed, listen) = shapes::args();
    let (addrs, table) = shapes::slot_map(&seed);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async move {
        let nodes: Arc<Vec<UnboundedSender<Req>>> = Arc::new(
            addrs
                .iter()
                .map(|a| {
                    let (tx, rx) = unbounded_channel();
                    let s = std::net::TcpStream::connect(a).unwrap();
                    s.set_nonblocking(true).unwrap();
                    s.set_nodelay(true).unwrap();
                    tokio::spawn(node(TcpStream::from_std(s).unwrap(), rx));
                    tx
                })
                .collect(),
        );
        let table = Arc::new(table);
        let l = TcpListener::bind(&listen).await.unwrap();
        loop {
            let (s, _) = l.accept().await.unwrap();
            s.set_nodelay(true).unwrap();
            tokio::spawn(client(s, nodes.clone(), table.clone()));
        }
    });
}

async fn client(mut s: TcpStream, nodes: Arc<Vec<UnboundedSender<Req>>>, table: Arc<Vec<u8>>) {
    let (tx, mut rx) = unbounded_channel::<(u64, Bytes)>();
    let mut rbuf = BytesMut::with_capacity(16 * 1024);
    let mut wbuf = BytesMut::with_capacity(16 * 1024);
    let mut next = 0u64;
    let mut base = 0u64;
    let mut slots: VecDeque<Option<Bytes>> = VecDeque::new();
    loop {
        tokio::select! {
            biased;
            r = rx.recv() => {
                let (seq, b) = r.unwrap();
                slots[(seq - base) as usize] = Some(b);
                while let Some(Some(_)) = slots.front() {
                    wbuf.extend_from_slice(&slots.pop_front().unwrap().unwrap());
                    base += 1;
                }
                while let Ok((seq, b)) = rx.try_recv() {
                    slots[(seq - base) as usize] = Some(b);
                    while let Some(Some(_)) = slots.front() {
                        wbuf.extend_from_slice(&slots.pop_front().unwrap().unwrap());
                        base += 1;
                    }
                }
                if !wbuf.is_empty() {
                    if s.write_all(&wbuf).await.is_err() { return; }
                    wbuf.clear();
                }
            }
            n = s.read_buf(&mut rbuf) => {
                match n { Ok(n) if n > 0 => {}, _ => return }
                while let Some((len, slot)) = shapes::request(&rbuf) {
                    let data = rbuf.split_to(len).freeze();
                    let node = slot.map_or(0, |s| table[s as usize] as usize);
                    slots.push_back(None);
                    nodes[node].send(Req { data, seq: next, to: tx.clone() }).ok();
                    next += 1;
                }
                if rbuf.capacity() - rbuf.len() < 1024 { rbuf.reserve(16 * 1024); }
            }
        }
    }
}

async fn node(s: TcpStream, mut rx: UnboundedReceiver<Req>) {
    let (mut rd, mut wr) = s.into_split();
    let fifo: Mutex<VecDeque<(u64, ReplyTx)>> = Mutex::new(VecDeque::with_capacity(256));
    let writer = async {
        let mut wbuf = BytesMut::with_capacity(64 * 1024);
        while let Some(first) = rx.recv().await {
            tokio::task::yield_now().await;
            {
                let mut f = fifo.lock().unwrap();
                wbuf.extend_from_slice(&first.data);
                f.push_back((first.seq, first.to));
                while let Ok(r) = rx.try_recv() {
                    wbuf.extend_from_slice(&r.data);
                    f.push_back((r.seq, r.to));
                }
            }
            wr.write_all(&wbuf).await.unwrap();
            wbuf.clear();
        }
    };
    let reader = async {
        let mut rbuf = BytesMut::with_capacity(64 * 1024);
        loop {
            if rbuf.capacity() - rbuf.len() < 4096 {
                rbuf.reserve(64 * 1024);
            }
            let n = rd.read_buf(&mut rbuf).await.unwrap();
            assert!(n > 0);
            while let Some(len) = shapes::scan(&rbuf) {
                let b = rbuf.split_to(len).freeze();
                let (seq, to) = fifo.lock().unwrap().pop_front().unwrap();
                to.send((seq, b)).ok();
            }
            let _ = rbuf.remaining();
        }
    };
    tokio::join!(writer, reader);
}
