//! Hot-key detection accuracy (docs/cache.md): a Zipf(1.1) workload over 100,000 keys is
//! replayed through the same sampling and detection code the proxy runs
//! (`HotCache::sample`, one read in 8, and `HotCache::roll` at each window end). After
//! two 1-second windows the detected hot set must match the keys whose true read rate
//! reached the threshold with precision and recall of at least 0.9.
//!
//! No Redis is involved: the detector sees keys only, and replaying in-process lets the
//! workload run at 400,000 reads/s, more than this machine can push through a proxy.

use std::collections::HashSet;
use std::time::Duration;

use heatshield::command::CommandTable;
use heatshield::services::cache::{CacheConfig, HotCache};

const KEYS: usize = 100_000;
const READS_PER_WINDOW: usize = 400_000;
const THRESHOLD: f64 = 1_000.0;

/// xorshift64*: a small deterministic generator (the test must not depend on luck).
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Cumulative Zipf(s) weights over ranks 1..=n.
fn zipf_cdf(n: usize, s: f64) -> Vec<f64> {
    let mut acc = 0.0;
    let mut cdf: Vec<f64> = (1..=n)
        .map(|r| {
            acc += 1.0 / (r as f64).powf(s);
            acc
        })
        .collect();
    for c in &mut cdf {
        *c /= acc;
    }
    cdf
}

fn key(rank: usize) -> String {
    format!("item:{rank}")
}

/// One replay: two windows of the workload, then (precision, recall, truly hot, detected).
fn replay(seed: u64, cdf: &[f64], keys: &[String]) -> (f64, f64, usize, usize) {
    let cfg = CacheConfig { hot_threshold: THRESHOLD, ..Default::default() };
    let cache = HotCache::new(&cfg, &CommandTable::new(), Default::default());
    let mut rng = Rng(seed);
    for _ in 0..2 {
        for _ in 0..READS_PER_WINDOW {
            let u = rng.next_f64();
            let rank = cdf.partition_point(|&c| c < u).min(KEYS - 1);
            cache.sample(keys[rank].as_bytes());
        }
        cache.roll(Duration::from_secs(1));
    }
    // true hot keys: the workload reads them at THRESHOLD per second or more
    let want: HashSet<&str> = (0..KEYS)
        .filter(|&i| (cdf[i] - if i > 0 { cdf[i - 1] } else { 0.0 }) * READS_PER_WINDOW as f64 >= THRESHOLD)
        .map(|i| keys[i].as_str())
        .collect();
    let got: Vec<String> =
        cache.hot_keys(10_000).into_iter().map(|(k, _, _)| String::from_utf8(k.to_vec()).unwrap()).collect();
    let got: HashSet<&str> = got.iter().map(|s| s.as_str()).collect();
    let both = want.intersection(&got).count() as f64;
    (both / got.len().max(1) as f64, both / want.len().max(1) as f64, want.len(), got.len())
}

#[test]
fn zipf_hot_set_precision_and_recall() {
    let cdf = zipf_cdf(KEYS, 1.1);
    let keys: Vec<String> = (1..=KEYS).map(key).collect();
    let seeds = [0x9E37_79B9_7F4A_7C15u64, 7932, 15851, 23770, 31689];
    let (mut psum, mut rsum) = (0.0, 0.0);
    for seed in seeds {
        let (p, r, want, got) = replay(seed, &cdf, &keys);
        println!(
            "Zipf(1.1), {KEYS} keys, {READS_PER_WINDOW} reads/s, default sampling (1 in 8), seed {seed}: {want} truly hot, {got} detected after 2 windows, precision {p:.3}, recall {r:.3}"
        );
        assert!(want >= 20, "the workload should have a real hot set, has {want}");
        // a single replay may land a near-threshold key or two either side by sampling noise
        assert!(p >= 0.85 && r >= 0.85, "seed {seed}: precision {p:.3}, recall {r:.3}");
        psum += p;
        rsum += r;
    }
    let (p, r) = (psum / seeds.len() as f64, rsum / seeds.len() as f64);
    println!("mean over {} replays: precision {p:.3}, recall {r:.3}", seeds.len());
    assert!(p >= 0.9 && r >= 0.9, "mean precision {p:.3}, recall {r:.3}");
}
