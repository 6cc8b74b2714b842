//! Hot-key detection: a HeavyKeeper top-k sketch fed with 1 in N read keys, read out at
//! the end of every window, with hysteresis so a key near the threshold does not flap.
//!
//! A key becomes hot at the end of the first window in which its estimated read rate
//! (sampled count × N / window length) reaches the threshold, and stops being hot after
//! `cool_windows` windows in a row below half the threshold. The sketch starts empty each
//! window, so the estimate is the rate over the last window.

use std::collections::HashMap;
use std::time::Duration;

use heavykeeper::TopK;

/// Sketch width per row; with depth 4 this is 512 KiB, enough that the top keys of a
/// skewed workload rarely share a bucket.
const WIDTH: usize = 8192;
const DEPTH: usize = 4;
const DECAY: f64 = 0.9;

/// Detection settings.
#[derive(Debug, Clone, Copy)]
pub struct DetectorConfig {
    /// One read in this many is sampled.
    pub sample_every: u32,
    /// Reads per second at which a key becomes hot.
    pub threshold: f64,
    /// Windows below half the threshold before a hot key cools.
    pub cool_windows: u32,
    /// Candidates tracked per window (and so hot keys at most).
    pub max_hot_keys: usize,
}

/// A hot key's state.
#[derive(Debug, Clone, Copy)]
pub struct HotState {
    /// Estimated reads per second over the last window.
    pub rate: f64,
    /// Consecutive windows below half the threshold.
    cold: u32,
}

/// What changed at the end of a window.
#[derive(Debug, Default)]
pub struct Changes {
    pub became_hot: Vec<Vec<u8>>,
    pub cooled: Vec<Vec<u8>>,
}

/// The sketch and the hot set.
pub struct Detector {
    cfg: DetectorConfig,
    sketch: TopK<Vec<u8>>,
    hot: HashMap<Vec<u8>, HotState>,
}

impl Detector {
    pub fn new(cfg: DetectorConfig) -> Detector {
        Detector { sketch: new_sketch(cfg.max_hot_keys), hot: HashMap::new(), cfg }
    }

    /// New thresholds (a reload): from the end of the current window.
    pub fn retune(&mut self, threshold: f64, cool_windows: u32, max_hot_keys: usize) {
        self.cfg.threshold = threshold;
        self.cfg.cool_windows = cool_windows;
        self.cfg.max_hot_keys = max_hot_keys;
    }

    /// Counts one sampled read of `key`.
    #[inline]
    pub fn record(&mut self, key: &[u8]) {
        self.sketch.add(key, 1);
    }

    /// Ends a window that lasted `elapsed`: estimates rates, updates the hot set, and
    /// starts the next window with an empty sketch.
    pub fn roll(&mut self, elapsed: Duration) -> Changes {
        let secs = elapsed.as_secs_f64().max(1e-3);
        let scale = self.cfg.sample_every as f64 / secs;
        let sketch = std::mem::replace(&mut self.sketch, new_sketch(self.cfg.max_hot_keys));
        let rates: HashMap<Vec<u8>, f64> =
            sketch.list().into_iter().map(|n| (n.item, n.count as f64 * scale)).collect();
        let mut changes = Changes::default();
        self.hot.retain(|key, st| {
            st.rate = rates.get(key).copied().unwrap_or(0.0);
            if st.rate < self.cfg.threshold / 2.0 {
                st.cold += 1;
                if st.cold >= self.cfg.cool_windows {
                    changes.cooled.push(key.clone());
                    return false;
                }
            } else {
                st.cold = 0;
            }
            true
        });
        for (key, rate) in rates {
            if rate >= self.cfg.threshold && !self.hot.contains_key(&key) && self.hot.len() < self.cfg.max_hot_keys {
                changes.became_hot.push(key.clone());
                self.hot.insert(key, HotState { rate, cold: 0 });
            }
        }
        changes
    }

    /// The hot keys and their estimated rates.
    pub fn hot(&self) -> impl Iterator<Item = (&Vec<u8>, &HotState)> {
        self.hot.iter()
    }

    /// Forgets every hot key (returns them).
    pub fn clear(&mut self) -> Vec<Vec<u8>> {
        self.sketch = new_sketch(self.cfg.max_hot_keys);
        self.hot.drain().map(|(k, _)| k).collect()
    }
}

fn new_sketch(k: usize) -> TopK<Vec<u8>> {
    TopK::new(k.max(1), WIDTH, DEPTH, DECAY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> DetectorConfig {
        DetectorConfig { sample_every: 1, threshold: 100.0, cool_windows: 3, max_hot_keys: 64 }
    }

    #[test]
    fn hot_after_one_window_and_cools_with_hysteresis() {
        let mut d = Detector::new(cfg());
        let sec = Duration::from_secs(1);
        for _ in 0..150 {
            d.record(b"hot");
        }
        for _ in 0..20 {
            d.record(b"cold");
        }
        let c = d.roll(sec);
        assert_eq!(c.became_hot, vec![b"hot".to_vec()]);
        // 60/s is below the threshold but above half of it: stays hot
        for _ in 0..5 {
            for _ in 0..60 {
                d.record(b"hot");
            }
            let c = d.roll(sec);
            assert!(c.cooled.is_empty() && c.became_hot.is_empty());
        }
        // below half for three windows: cools on the third
        for w in 0..3 {
            for _ in 0..10 {
                d.record(b"hot");
            }
            let c = d.roll(sec);
            assert_eq!(c.cooled.len(), (w == 2) as usize, "window {w}");
        }
        assert_eq!(d.hot().count(), 0);
    }
}
