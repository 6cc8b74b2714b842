//! Glob patterns as Redis matches them (`KEYS`, `CONFIG GET`): `*`, `?`, `[abc]`, `[^a-z]`
//! and `\` escapes. Used for `PROXY CONFIG GET` and, later, key-pattern rules.

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
    use super::matches;

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
