//! Criterion benchmarks of the hot-path pieces: request framing (ours against
//! redis-protocol's decoder), reply boundary scanning, slot computation, command-table
//! lookup, and MGET split + merge. Run: `cargo bench --bench hot_path`.

use bytes::{Bytes, BytesMut};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;

use heatshield::command::CommandTable;
use heatshield::path::merge::merge_mget;
use heatshield::path::route::split_by_slot;
use heatshield::protocol::reply::ReplyScanner;
use heatshield::protocol::request::{Limits, Next, Request, RequestReader};
use heatshield::upstream::cluster::slot;

fn pipeline_batch(n: usize) -> Vec<u8> {
    let mut v = Vec::new();
    for i in 0..n {
        let key = format!("key:{i:012}");
        let r = if i % 2 == 0 {
            Request::from_args(&[b"SET".as_slice(), key.as_bytes(), &[b'x'; 100]])
        } else {
            Request::from_args(&[b"GET".as_slice(), key.as_bytes()])
        };
        v.extend_from_slice(r.raw());
    }
    v
}

fn framing(c: &mut Criterion) {
    let batch = pipeline_batch(100);
    let mut g = c.benchmark_group("frame_100_pipelined");
    g.throughput(Throughput::Elements(100));
    g.bench_function("heatshield_reader", |b| {
        let mut reader = RequestReader::new(Limits::default());
        b.iter(|| {
            let mut buf = BytesMut::from(&batch[..]);
            let mut n = 0;
            while let Ok(Next::Request(r)) = reader.next(&mut buf) {
                n += r.argc();
            }
            black_box(n)
        })
    });
    g.bench_function("redis_protocol_decode", |b| {
        b.iter(|| {
            let mut pos = 0;
            let mut n = 0;
            while let Ok(Some((f, used))) = redis_protocol::resp2::decode::decode(&batch[pos..]) {
                pos += used;
                n += matches!(f, redis_protocol::resp2::types::OwnedFrame::Array(_)) as usize;
            }
            black_box(n)
        })
    });
    g.finish();

    // A 5.8 MB MSET arriving in 16 KiB reads: resumable parsing against re-parsing.
    let mut args: Vec<Vec<u8>> = vec![b"MSET".to_vec()];
    for i in 0..50_000 {
        args.push(format!("key:{i}").into_bytes());
        args.push(vec![b'v'; 100]);
    }
    let big = Request::from_args(&args).raw().to_vec();
    let mut g = c.benchmark_group("frame_5MB_mset_in_16KiB_reads");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(big.len() as u64));
    g.bench_function("heatshield_reader", |b| {
        b.iter(|| {
            let mut reader = RequestReader::new(Limits::default());
            let mut buf = BytesMut::new();
            let mut got = 0;
            for chunk in big.chunks(16 * 1024) {
                buf.extend_from_slice(chunk);
                if let Ok(Next::Request(r)) = reader.next(&mut buf) {
                    got = r.argc();
                }
            }
            assert_eq!(got, 100_001);
        })
    });
    g.bench_function("redis_protocol_decode", |b| {
        b.iter(|| {
            let mut buf = Vec::new();
            let mut got = false;
            for chunk in big.chunks(16 * 1024) {
                buf.extend_from_slice(chunk);
                if let Ok(Some(_)) = redis_protocol::resp2::decode::decode(&buf) {
                    got = true;
                }
            }
            assert!(got);
        })
    });
    g.finish();
}

fn replies(c: &mut Criterion) {
    let mut batch = Vec::new();
    for i in 0..100 {
        if i % 2 == 0 {
            batch.extend_from_slice(b"+OK\r\n");
        } else {
            batch.extend_from_slice(b"$100\r\n");
            batch.extend_from_slice(&[b'x'; 100]);
            batch.extend_from_slice(b"\r\n");
        }
    }
    let mut g = c.benchmark_group("scan_100_replies");
    g.throughput(Throughput::Elements(100));
    g.bench_function("heatshield_scanner", |b| {
        b.iter(|| {
            let mut s = ReplyScanner::new();
            let mut pos = 0;
            while let Ok(Some(n)) = s.scan(&batch[pos..]) {
                pos += n;
            }
            black_box(pos)
        })
    });
    g.finish();
}

fn slots_and_table(c: &mut Criterion) {
    c.bench_function("slot/plain_16B_key", |b| b.iter(|| slot(black_box(b"key:000000012345"))));
    c.bench_function("slot/hash_tag_key", |b| b.iter(|| slot(black_box(b"order:{user:42}:list"))));
    let t = CommandTable::new();
    let mut g = c.benchmark_group("command_lookup");
    for name in ["GET", "get", "ZRANGEBYSCORE", "client"] {
        g.bench_with_input(BenchmarkId::from_parameter(name), name, |b, n| {
            b.iter(|| t.get(black_box(n.as_bytes())).is_some())
        });
    }
    g.finish();
}

fn mget_split_merge(c: &mut Criterion) {
    let keys: Vec<String> = (0..10).map(|i| format!("key:{i:012}")).collect();
    let mut args = vec!["MGET".to_string()];
    args.extend(keys.iter().cloned());
    let req = Request::from_args(&args);
    c.bench_function("mget10/split_by_slot", |b| b.iter(|| black_box(split_by_slot(&req, 1).len())));
    let groups = split_by_slot(&req, 1);
    let replies: Vec<Bytes> = groups
        .iter()
        .map(|g| {
            let mut r = BytesMut::new();
            heatshield::protocol::request::write_array_header(&mut r, g.positions.len());
            for _ in &g.positions {
                heatshield::protocol::request::write_bulk(&mut r, &[b'v'; 100]);
            }
            r.freeze()
        })
        .collect();
    let positions: Vec<_> = groups.iter().map(|g| g.positions.clone()).collect();
    c.bench_function("mget10/merge", |b| {
        let mut out = BytesMut::with_capacity(4096);
        b.iter(|| {
            out.clear();
            merge_mget(&replies, &positions, 10, &[], &mut out).unwrap();
            black_box(out.len())
        })
    });
}

criterion_group!(benches, framing, replies, slots_and_table, mget_split_merge, ratelimit_check, hot_key_cache);
criterion_main!(benches);

fn ratelimit_check(c: &mut Criterion) {
    use heatshield::services::ratelimit::{CommandsSpec, Limiter, RuleConfig, compile};
    let t = CommandTable::new();
    let get = t.get(b"GET").unwrap();
    // a rule that matches every key but never refuses: the cost every request pays
    let rules = compile(
        &[RuleConfig {
            name: "all".into(),
            pattern: "*".into(),
            commands: CommandsSpec::Kind("all".into()),
            rate: 1e9,
            burst: 1_000_000_000,
            scope: "per-key".into(),
            count_cached: false,
        }],
        &t,
    )
    .unwrap();
    let l = Limiter::new(rules, 1_000_000, std::time::Duration::from_secs(10));
    // a session's handle, as the proxy's request path uses
    let mut v = l.view();
    let keys: Vec<Vec<u8>> = (0..10_000).map(|i| format!("key:{i:012}").into_bytes()).collect();
    let mut i = 0;
    // the session passes the time the request was read; no clock read per check
    let now = std::time::Instant::now();
    c.bench_function("ratelimit/check_per_key_rule_10k_keys", |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            black_box(l.check_in(&mut v, get, [keys[i].as_slice()].into_iter(), now, false).is_ok())
        })
    });
    c.bench_function("ratelimit/check_per_key_rule_1_key", |b| {
        b.iter(|| black_box(l.check_in(&mut v, get, [keys[0].as_slice()].into_iter(), now, false).is_ok()))
    });
    // 100k keys in a random order (what redis-benchmark -r 100000 sends): the check
    // alone, and in batches of 16 whose budgets are prefetched first, as the session does
    // for pipelined requests. Keys are written into a buffer first, as they would sit in
    // the session's read buffer.
    fn key(n: u64, out: &mut [u8; 16]) {
        out[..4].copy_from_slice(b"key:");
        let mut n = n;
        for d in out[4..].iter_mut().rev() {
            *d = b'0' + (n % 10) as u8;
            n /= 10;
        }
    }
    let mut x = 88172645463325252u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % 100_000
    };
    let mut k = [0u8; 16];
    for _ in 0..1_000_000 {
        key(next(), &mut k);
        let _ = l.check_in(&mut v, get, [&k[..]].into_iter(), now, false);
    }
    c.bench_function("ratelimit/keygen_only_100k_random_keys", |b| {
        b.iter(|| {
            key(next(), &mut k);
            black_box(&k);
        })
    });
    c.bench_function("ratelimit/check_per_key_rule_100k_random_keys", |b| {
        b.iter(|| {
            key(next(), &mut k);
            black_box(l.check_in(&mut v, get, [&k[..]].into_iter(), now, false).is_ok())
        })
    });
    let mut batch = [[0u8; 16]; 16];
    c.bench_function("ratelimit/batch_of_16_prefetched_100k_random_keys", |b| {
        b.iter(|| {
            for k in batch.iter_mut() {
                key(next(), k);
            }
            let mut hashes = [0u64; 16];
            l.prefetch(batch.iter().map(|k| &k[..]), &mut hashes);
            for (k, h) in batch.iter().zip(hashes) {
                v.expect(&k[..], h);
                black_box(l.check_in(&mut v, get, [&k[..]].into_iter(), now, false).is_ok());
            }
            v.forget();
        })
    });
    let none = Limiter::new(vec![], 1, std::time::Duration::from_secs(10));
    let mut v = none.view();
    c.bench_function("ratelimit/check_no_rules", |b| {
        b.iter(|| black_box(none.check_in(&mut v, get, [b"k".as_slice()].into_iter(), now, false).is_ok()))
    });
}

/// The hot-key cache: what sampling costs every read, and a cache hit from 1 and 4
/// threads at once (moka's sync cache, LRU policy, as the proxy configures it).
fn hot_key_cache(c: &mut Criterion) {
    use heatshield::protocol::Proto;
    use heatshield::services::cache::{CacheConfig, HotCache};
    use heatshield::upstream::backend::BackendOptions;
    use heatshield::upstream::cluster::{Backing, Cluster};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    let t = CommandTable::new();
    let cache = Arc::new(HotCache::new(&CacheConfig::default(), &t, Default::default()));
    let keys: Vec<Vec<u8>> = (0..100_000).map(|i| format!("item:{i}").into_bytes()).collect();
    let mut i = 0;
    c.bench_function("cache/sample_read_1_in_8", |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            cache.sample(black_box(&keys[i]));
        })
    });
    // the part every unsampled read pays
    let rare = HotCache::new(&CacheConfig { sample_every: 1_000_000, ..Default::default() }, &t, Default::default());
    c.bench_function("cache/sample_read_unsampled", |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            rare.sample(black_box(&keys[i]));
        })
    });

    let opts = BackendOptions {
        connect_timeout: Duration::from_secs(1),
        command_timeout: Duration::from_secs(1),
        username: None,
        password: None,
        resp3: false,
        latency_sample_every: 8,
        tracking: None,
        dedicated: false,
        dedicated_max: 16,
        dedicated_idle: 4,
        tls: None,
        readonly: false,
        flush_delay: Duration::ZERO,
    };
    // no connection is made: the pool only names the node that owns the slot
    let cluster = Cluster::new(Backing::Standalone { addr: "127.0.0.1:1".into() }, opts, 1, 1);
    let owner = cluster.topology().master_for_slot(0).unwrap().clone();
    let get = t.get(b"GET").unwrap().id;
    let value = Bytes::from(format!("$100\r\n{}\r\n", "x".repeat(100)));
    let hot: Vec<Vec<u8>> = (0..64).map(|i| format!("hot:{i}").into_bytes()).collect();
    for k in &hot {
        cache.prime(k, get, Proto::Resp2, &[k], value.clone(), &owner);
    }
    let reqs: Vec<Request> = hot.iter().map(|k| Request::from_args(&[b"GET".as_slice(), k])).collect();
    let mut j = 0;
    let now = Instant::now();
    c.bench_function("cache/hit_1_thread", |b| {
        b.iter(|| {
            j = (j + 1) % reqs.len();
            black_box(cache.lookup(get, Proto::Resp2, 0, &reqs[j], &hot[j], &owner, now).is_some())
        })
    });
    // one key read by 4 threads at once: the contended case of a single hot key
    c.bench_function("cache/hit_4_threads_one_key", |b| {
        b.iter_custom(|iters| {
            let per = iters.div_ceil(4);
            let start = Instant::now();
            std::thread::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| {
                        for _ in 0..per {
                            black_box(cache.lookup(get, Proto::Resp2, 0, &reqs[0], &hot[0], &owner, now).is_some());
                        }
                    });
                }
            });
            // wall time per lookup, all threads together (on 2 cores, 2 run at a time)
            start.elapsed()
        })
    });
}
