//! The Lua scripts heatshield has seen go by (`EVAL`, `EVAL_RO`, `SCRIPT LOAD`), by SHA1.
//!
//! Redis caches a script on the node that ran it; behind the proxy that is one master of
//! several, and a flush or a failover can empty a master's cache. With the bodies kept
//! here, an `EVALSHA` that meets `NOSCRIPT` where its keys live is sent again as `EVAL`
//! (once, unseen by the client, see [`crate::pending`]), and `SCRIPT EXISTS` answers 1
//! for a script heatshield can run. Bounded by bytes ([`MAX_BYTES`]); the least recently
//! used bodies go first (moka).

use bytes::Bytes;

use crate::protocol::Request;

/// Bytes of script bodies kept, at most (each body also counts [`ENTRY_OVERHEAD`]).
pub const MAX_BYTES: u64 = 8 * 1024 * 1024;
const ENTRY_OVERHEAD: u32 = 64;

pub struct Scripts {
    bodies: moka::sync::Cache<[u8; 20], Bytes>,
}

impl Default for Scripts {
    fn default() -> Self {
        Scripts {
            bodies: moka::sync::Cache::builder()
                .max_capacity(MAX_BYTES)
                .weigher(|_, b: &Bytes| (b.len() as u32).saturating_add(ENTRY_OVERHEAD))
                .build(),
        }
    }
}

impl Scripts {
    /// Notes the body of an `EVAL` / `EVAL_RO` / `SCRIPT LOAD` (`name` is the command's
    /// name as the command table spells it); other commands are ignored.
    pub fn note(&self, name: &str, req: &Request) {
        let at = match name {
            "EVAL" | "EVAL_RO" => 1,
            "SCRIPT|LOAD" => 2,
            _ => return,
        };
        if req.argc() <= at {
            return;
        }
        let sha = sha1_smol::Sha1::from(req.arg(at)).digest().bytes();
        if !self.bodies.contains_key(&sha) {
            // a copy: a slice of the request would keep the client's whole read buffer
            // alive, and the byte bound counts only the body
            self.bodies.insert(sha, Bytes::copy_from_slice(req.arg(at)));
        }
    }

    /// Whether heatshield can run the script with this (hex) SHA1.
    pub fn knows(&self, sha_hex: &[u8]) -> bool {
        decode(sha_hex).is_some_and(|sha| self.bodies.contains_key(&sha))
    }

    /// `EVALSHA sha ...` (or `EVALSHA_RO`) as `EVAL body ...` (`EVAL_RO`), if the body is
    /// known.
    pub fn eval_form(&self, data: &[u8]) -> Option<Bytes> {
        let req = Request::parse(data)?;
        let eval: &[u8] = match req.arg(0) {
            n if n.eq_ignore_ascii_case(b"EVALSHA") => b"EVAL",
            n if n.eq_ignore_ascii_case(b"EVALSHA_RO") => b"EVAL_RO",
            _ => return None,
        };
        if req.argc() < 3 {
            return None;
        }
        let body = self.bodies.get(&decode(req.arg(1))?)?;
        let mut a: Vec<&[u8]> = vec![eval, &body];
        a.extend(req.args().skip(2));
        Some(Request::from_args(&a).raw().clone())
    }
}

/// A 40-digit hex SHA1 (either case, as Redis accepts it) as bytes.
fn decode(hex: &[u8]) -> Option<[u8; 20]> {
    if hex.len() != 40 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; 20];
    for (i, pair) in hex.chunks(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eval_bodies_serve_evalsha() {
        let s = Scripts::default();
        let body = "return ARGV[1]";
        let sha = sha1_smol::Sha1::from(body).digest().to_string();
        assert!(!s.knows(sha.as_bytes()));
        assert_eq!(s.eval_form(Request::from_args(&["EVALSHA", &sha, "0", "x"]).raw()), None);
        let eval = Request::from_args(&["EVAL", body, "0", "x"]);
        s.note("EVAL", &eval);
        assert!(s.knows(sha.as_bytes()));
        // kept as a copy, not a slice of the client's buffer
        let kept = s.bodies.get(&decode(sha.as_bytes()).unwrap()).unwrap();
        assert!(!eval.raw().as_ptr_range().contains(&kept.as_ptr()));
        assert!(s.knows(sha.to_uppercase().as_bytes()));
        let e = s.eval_form(Request::from_args(&["evalsha", &sha, "1", "k", "v"]).raw()).unwrap();
        assert_eq!(e, Request::from_args(&["EVAL", body, "1", "k", "v"]).raw().clone());
        let ro = s.eval_form(Request::from_args(&["EVALSHA_RO", &sha, "0"]).raw()).unwrap();
        assert_eq!(ro, Request::from_args(&["EVAL_RO", body, "0"]).raw().clone());
        // SCRIPT LOAD's body, not its subcommand
        s.note("SCRIPT|LOAD", &Request::from_args(&["SCRIPT", "LOAD", "return 2"]));
        assert!(s.knows(sha1_smol::Sha1::from("return 2").digest().to_string().as_bytes()));
        assert!(!s.knows(b"not-a-sha"));
    }
}
