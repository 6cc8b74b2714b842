//! Glob patterns as Redis matches them (`KEYS`, `CONFIG GET`): `*`, `?`, `[abc]`, `[^a-z]`
//! and `\` escapes. Used for `PROXY CONFIG GET`, cache pins and rate-limit rules; a
//! [`Pattern`] is a glob prepared for matching on the request path.

/// A case-sensitive glob, with the common shapes (`*`, `prefix*`, a plain key) matched
/// without the general matcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    Any,
    /// A `prefix*` of at most 8 bytes: the prefix as a little-endian word and its length,
    /// compared in one load instead of a `memcmp` call.
    Short(u64, u8),
    Prefix(Vec<u8>),
    Exact(Vec<u8>),
    Glob(Vec<u8>),
}

impl Pattern {
    pub fn new(pat: &[u8]) -> Pattern {
        let special = |b: &u8| matches!(b, b'*' | b'?' | b'[' | b'\\');
        let body = pat.strip_suffix(b"*").unwrap_or(pat);
        if !body.iter().any(special) {
            return match (body.is_empty(), body.len() < pat.len()) {
                (true, true) => Pattern::Any,
                (false, true) if body.len() <= 8 => Pattern::Short(word(body, body.len()), body.len() as u8),
                (false, true) => Pattern::Prefix(body.to_vec()),
                _ => Pattern::Exact(pat.to_vec()),
            };
        }
        Pattern::Glob(pat.to_vec())
    }

    #[inline]
    pub fn matches(&self, s: &[u8]) -> bool {
        match self {
            Pattern::Any => true,
            Pattern::Short(w, n) => s.len() >= *n as usize && word(s, *n as usize) == *w,
            Pattern::Prefix(p) => s.starts_with(p),
            Pattern::Exact(p) => s == &p[..],
            Pattern::Glob(p) => matches(p, s, false),
        }
    }
}

/// The first `n` (at most 8, at most `s.len()`) bytes of `s` as a little-endian word,
/// zero above them.
#[inline(always)]
fn word(s: &[u8], n: usize) -> u64 {
    let w = match s.first_chunk::<8>() {
        Some(c) => u64::from_le_bytes(*c),
        None => {
            let mut b = [0u8; 8];
            b[..s.len()].copy_from_slice(s);
            u64::from_le_bytes(b)
        }
    };
    if n >= 8 { w } else { w & ((1u64 << (n * 8)) - 1) }
}

/// The bytes a key matched by some pattern of a set may start with: a quick look that
/// lets the request path skip a feature's patterns for keys none of them can match (a
/// yes may be wrong, a no is not). A pattern that starts with `*`, `?`, `[` or `\\`
/// (or is empty) may match a key starting with anything, the empty key too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FirstBytes {
    bits: [u64; 4],
    /// Some pattern may match the empty key.
    empty: bool,
}

impl FirstBytes {
    /// The first bytes of keys `pats` may match.
    pub fn of<'p>(pats: impl IntoIterator<Item = &'p [u8]>) -> FirstBytes {
        let mut f = FirstBytes::default();
        for p in pats {
            match p.first() {
                Some(&b) if !matches!(b, b'*' | b'?' | b'[' | b'\\') => f.bits[b as usize >> 6] |= 1 << (b & 63),
                _ => {
                    f.bits = [u64::MAX; 4];
                    f.empty = true;
                }
            }
        }
        f
    }

    /// The 256 bits, as four words (bit `b` of word `b / 64`: a key may start with byte `b`).
    pub fn words(&self) -> [u64; 4] {
        self.bits
    }

    /// Whether some pattern may match `key`.
    #[inline]
    pub fn may_match(&self, key: &[u8]) -> bool {
        match key.first() {
            Some(&b) => self.bits[b as usize >> 6] & (1 << (b & 63)) != 0,
            None => self.empty,
        }
    }
}

/// Which features' key patterns may match a key, by the key's first byte: one load
/// answers, for every feature at once, what each feature's [`FirstBytes`] would (the
/// request path's "is some rule about this key?", asked once per request in admission,
/// `crate::path::policy`). A bit set may be wrong, a bit clear is not. A key starting
/// with `{` has the bit of every feature with a pattern: it may be a stored name the
/// client sent itself, which features see under its client name
/// (`crate::services::colocate`). Each feature
/// writes its own bit ([`KeyFeatures::set`]) when its patterns change.
#[derive(Debug)]
pub struct KeyFeatures {
    by_first: [std::sync::atomic::AtomicU8; 256],
    empty: std::sync::atomic::AtomicU8,
    /// The features with some pattern (0: no key needs a look).
    some: std::sync::atomic::AtomicU8,
}

/// The features of [`KeyFeatures`], one bit each.
pub mod feature {
    /// A rate-limit rule (`crate::services::ratelimit`).
    pub const RATE: u8 = 1;
    /// A read policy other than the master (`crate::services::reads`).
    pub const READS: u8 = 2;
}

impl Default for KeyFeatures {
    fn default() -> KeyFeatures {
        KeyFeatures {
            by_first: std::array::from_fn(|_| Default::default()),
            empty: Default::default(),
            some: Default::default(),
        }
    }
}

impl KeyFeatures {
    /// Sets `bit` for the keys `first` says some pattern may match, and clears it for
    /// the others.
    pub fn set(&self, bit: u8, first: &FirstBytes) {
        use std::sync::atomic::Ordering::Release;
        let some = *first != FirstBytes::default();
        for (b, a) in self.by_first.iter().enumerate() {
            // ('{' may start a stored name, which the feature sees under its client name)
            let may = if b == b'{' as usize { some } else { first.bits[b >> 6] & (1 << (b & 63)) != 0 };
            match may {
                true => a.fetch_or(bit, Release),
                false => a.fetch_and(!bit, Release),
            };
        }
        match first.empty {
            true => self.empty.fetch_or(bit, Release),
            false => self.empty.fetch_and(!bit, Release),
        };
        match some {
            true => self.some.fetch_or(bit, Release),
            false => self.some.fetch_and(!bit, Release),
        };
    }

    /// The features with some pattern now (0: [`KeyFeatures::of`] is 0 for every key).
    #[inline(always)]
    pub fn some(&self) -> u8 {
        self.some.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The features some pattern of which may match `key`.
    #[inline(always)]
    pub fn of(&self, key: &[u8]) -> u8 {
        use std::sync::atomic::Ordering::Acquire;
        match key.first() {
            Some(&b) => self.by_first[b as usize].load(Acquire),
            None => self.empty.load(Acquire),
        }
    }
}

impl FirstBytes {
    /// Any key at all (a default that applies to every key).
    pub fn all() -> FirstBytes {
        FirstBytes { bits: [u64::MAX; 4], empty: true }
    }
}

/// Whether `s` matches `pat`; `nocase` folds ASCII case.
pub fn matches(pat: &[u8], s: &[u8], nocase: bool) -> bool {
    let eq = |a: u8, b: u8| if nocase { a.eq_ignore_ascii_case(&b) } else { a == b };
    let (mut p, mut i) = (0usize, 0usize);
    // where to resume after the last '*': (pattern position after it, string position)
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        let mut matched = false;
        let mut next_p = p;
        if p < pat.len() {
            match pat[p] {
                b'*' => {
                    while p < pat.len() && pat[p] == b'*' {
                        p += 1;
                    }
                    if p == pat.len() {
                        return true;
                    }
                    star = Some((p, i));
                    continue;
                }
                b'?' => {
                    matched = true;
                    next_p = p + 1;
                }
                b'[' => {
                    let mut q = p + 1;
                    let not = q < pat.len() && pat[q] == b'^';
                    if not {
                        q += 1;
                    }
                    let mut hit = false;
                    while q < pat.len() && pat[q] != b']' {
                        if pat[q] == b'\\' && q + 1 < pat.len() {
                            q += 1;
                            hit |= eq(pat[q], s[i]);
                            q += 1;
                        } else if q + 2 < pat.len() && pat[q + 1] == b'-' && pat[q + 2] != b']' {
                            let (mut lo, mut hi) = (pat[q], pat[q + 2]);
                            if lo > hi {
                                std::mem::swap(&mut lo, &mut hi);
                            }
                            let c = s[i];
                            hit |= (lo..=hi).contains(&c)
                                || (nocase && (lo..=hi).contains(&c.to_ascii_lowercase()))
                                || (nocase && (lo..=hi).contains(&c.to_ascii_uppercase()));
                            q += 3;
                        } else {
                            hit |= eq(pat[q], s[i]);
                            q += 1;
                        }
                    }
                    matched = hit != not;
                    next_p = (q + 1).min(pat.len());
                }
                b'\\' if p + 1 < pat.len() => {
                    matched = eq(pat[p + 1], s[i]);
                    next_p = p + 2;
                }
                c => {
                    matched = eq(c, s[i]);
                    next_p = p + 1;
                }
            }
        }
        if matched {
            p = next_p;
            i += 1;
        } else if let Some((sp, si)) = star {
            // let the last '*' swallow one more character
            p = sp;
            i = si + 1;
            star = Some((sp, si + 1));
        } else {
            return false;
        }
    }
    while p < pat.len() && pat[p] == b'*' {
        p += 1;
    }
    p == pat.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_features_answer_for_each_feature() {
        let f = KeyFeatures::default();
        assert_eq!((f.some(), f.of(b"hot:1"), f.of(b""), f.of(b"{t}x")), (0, 0, 0, 0));
        f.set(feature::RATE, &FirstBytes::of([&b"hot:*"[..], b"stock:*"]));
        f.set(feature::READS, &FirstBytes::of([&b"feed:*"[..], b"stock:*"]));
        assert_eq!(f.some(), feature::RATE | feature::READS);
        assert_eq!(f.of(b"hot:1"), feature::RATE);
        assert_eq!(f.of(b"feed:1"), feature::READS);
        assert_eq!(f.of(b"stock:1"), feature::RATE | feature::READS);
        assert_eq!(f.of(b"key:1"), 0);
        assert_eq!(f.of(b""), 0);
        // a stored name: every feature with a pattern looks (under its client name)
        assert_eq!(f.of(b"{rq}rq:1"), feature::RATE | feature::READS);
        // a pattern that may match anything, the empty key too
        f.set(feature::READS, &FirstBytes::all());
        assert_eq!((f.of(b"key:1"), f.of(b"")), (feature::READS, feature::READS));
        // rules gone: the bit is clear everywhere, the other feature's stays
        f.set(feature::READS, &FirstBytes::default());
        assert_eq!(
            (f.some(), f.of(b"feed:1"), f.of(b"stock:1"), f.of(b"{t}x")),
            (feature::RATE, 0, feature::RATE, feature::RATE)
        );
        f.set(feature::RATE, &FirstBytes::default());
        assert_eq!((f.some(), f.of(b"hot:1"), f.of(b"{t}x")), (0, 0, 0));
    }

    use super::{FirstBytes, Pattern, matches};

    #[test]
    fn first_bytes_never_rule_out_a_key_a_pattern_matches() {
        let pats = ["stock:*", "k*", "\\*x", "h[ae]llo", "?x", "", "*", "x\\*"];
        let strs = ["", "stock:1", "k", "key", "*x", "hello", "ax", "x*", "y", "zz"];
        for p in pats {
            let f = FirstBytes::of([p.as_bytes()]);
            for s in strs {
                if matches(p.as_bytes(), s.as_bytes(), false) {
                    assert!(f.may_match(s.as_bytes()), "{p:?} on {s:?}");
                }
            }
        }
        let f = FirstBytes::of([&b"stock:*"[..], b"hot:*"]);
        assert!(f.may_match(b"stock:1") && f.may_match(b"hot:1") && f.may_match(b"h"));
        assert!(!f.may_match(b"key:1") && !f.may_match(b"") && !f.may_match(b"Stock:1"));
        assert!(!FirstBytes::of([]).may_match(b"a"));
    }

    #[test]
    fn prepared_patterns_agree_with_the_matcher() {
        let pats = [
            "*",
            "stock:*",
            "stock:42",
            "",
            "a*b*c",
            "h?llo",
            "h[ae]llo",
            "\\*x",
            "x\\*",
            "**",
            "k*",
            "abcdefgh*",
            "abcdefghi*",
            "ab*",
        ];
        let strs = [
            "",
            "stock:",
            "stock:42",
            "stocks:42",
            "axxbyyc",
            "hello",
            "hallo",
            "*x",
            "x*",
            "x",
            "k",
            "key",
            "a",
            "ab",
            "abcdefg",
            "abcdefgh",
            "abcdefghi",
            "abcdefghij",
            "abcdefgX",
            "Ab",
        ];
        for p in pats {
            let c = Pattern::new(p.as_bytes());
            for s in strs {
                assert_eq!(c.matches(s.as_bytes()), matches(p.as_bytes(), s.as_bytes(), false), "{p:?} on {s:?}");
            }
        }
        assert_eq!(Pattern::new(b"*"), Pattern::Any);
        assert!(matches!(Pattern::new(b"stock:*"), Pattern::Short(_, 6)));
        assert!(matches!(Pattern::new(b"abcdefgh*"), Pattern::Short(_, 8)));
        assert_eq!(Pattern::new(b"abcdefghi*"), Pattern::Prefix(b"abcdefghi".to_vec()));
        assert_eq!(Pattern::new(b"x\\*"), Pattern::Glob(b"x\\*".to_vec()));
    }

    #[test]
    fn like_redis() {
        let m = |p: &str, s: &str| matches(p.as_bytes(), s.as_bytes(), false);
        assert!(m("*", ""));
        assert!(m("*", "anything"));
        assert!(m("stock:*", "stock:42"));
        assert!(!m("stock:*", "stocks:42"));
        assert!(m("h?llo", "hello"));
        assert!(!m("h?llo", "hllo"));
        assert!(m("h[ae]llo", "hallo"));
        assert!(!m("h[^e]llo", "hello"));
        assert!(m("h[a-b]llo", "hbllo"));
        assert!(m("a*b*c", "axxbyyc"));
        assert!(!m("a*b*c", "axxbyy"));
        assert!(m("\\*x", "*x"));
        assert!(!m("\\*x", "ax"));
        assert!(m("admin.*", "admin.slowlog_max_len"));
        assert!(m("*slowlog*", "admin.slowlog_max_len"));
        assert!(matches(b"GET", b"get", true));
    }
}
