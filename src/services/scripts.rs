//! The Lua scripts heatshield has seen go by (`EVAL`, `EVAL_RO`, `SCRIPT LOAD`), by SHA1,
//! and the function libraries loaded through it (`FUNCTION LOAD`), by name.
//!
//! Redis caches a script on the node that ran it; behind the proxy that is one master of
//! several, and a flush or a failover can empty a master's cache. With the bodies kept
//! here, an `EVALSHA` that meets `NOSCRIPT` where its keys live is sent again as `EVAL`
//! (once, unseen by the client, see [`crate::path::pending`]), and `SCRIPT EXISTS` answers 1
//! for a script heatshield can run. Likewise an `FCALL` that meets `Function not found`
//! (a master that joined later, or whose functions were flushed behind heatshield's back)
//! has the library that registers the function loaded there first, then runs again.
//! Bounded by bytes ([`MAX_BYTES`] each); the least recently used go first (moka).

use bytes::Bytes;

use crate::protocol::Request;

/// Bytes of script bodies kept, at most (each body also counts [`ENTRY_OVERHEAD`]).
pub const MAX_BYTES: u64 = 8 * 1024 * 1024;
const ENTRY_OVERHEAD: u32 = 64;

pub struct Scripts {
    bodies: moka::sync::Cache<[u8; 20], Bytes>,
    /// Function libraries: name -> code.
    libraries: moka::sync::Cache<Bytes, Bytes>,
}

impl Default for Scripts {
    fn default() -> Self {
        Scripts {
            bodies: moka::sync::Cache::builder()
                .max_capacity(MAX_BYTES)
                .weigher(|_, b: &Bytes| (b.len() as u32).saturating_add(ENTRY_OVERHEAD))
                .build(),
            libraries: moka::sync::Cache::builder()
                .max_capacity(MAX_BYTES)
                .weigher(|k: &Bytes, b: &Bytes| (k.len() as u32).saturating_add(b.len() as u32 + ENTRY_OVERHEAD))
                .build(),
        }
    }
}

impl Scripts {
    /// Notes the body of an `EVAL` / `EVAL_RO` / `SCRIPT LOAD` (`SCRIPT FLUSH` forgets them
    /// all), and the libraries of
    /// `FUNCTION LOAD` / `DELETE` / `FLUSH` (`name` is the command's name as the command
    /// table spells it); other commands are ignored.
    pub fn note(&self, name: &str, req: &Request) {
        let at = match name {
            "EVAL" | "EVAL_RO" => 1,
            "SCRIPT|LOAD" => 2,
            // every master's cache is emptied: as on one Redis, EVALSHA says NOSCRIPT now
            "SCRIPT|FLUSH" => {
                crate::upstream::cluster::scripts_flushed();
                return self.bodies.invalidate_all();
            }
            "FUNCTION|LOAD" | "FUNCTION|DELETE" | "FUNCTION|FLUSH" => return self.note_library(name, req),
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

    fn note_library(&self, name: &str, req: &Request) {
        match name {
            "FUNCTION|FLUSH" => self.libraries.invalidate_all(),
            "FUNCTION|DELETE" if req.argc() == 3 => self.libraries.invalidate(req.arg(2)),
            "FUNCTION|LOAD" if req.argc() >= 3 => {
                let code = req.arg(req.argc() - 1);
                let replace = req.argc() == 4 && req.arg(2).eq_ignore_ascii_case(b"REPLACE");
                let Some(lib) = library_name(code) else { return };
                // without REPLACE, Redis keeps the library it has (the load fails)
                if replace || !self.libraries.contains_key(lib) {
                    self.libraries.insert(Bytes::copy_from_slice(lib), Bytes::copy_from_slice(code));
                }
            }
            _ => {}
        }
    }

    /// For an `FCALL` / `FCALL_RO` of a function a master does not have: `FUNCTION LOAD
    /// REPLACE` of the library heatshield saw register it (its code names the function in
    /// quotes), if any.
    pub fn function_load(&self, data: &[u8]) -> Option<Bytes> {
        let req = Request::parse(data)?;
        let name = req.arg(0);
        if req.argc() < 3 || !(name.eq_ignore_ascii_case(b"FCALL") || name.eq_ignore_ascii_case(b"FCALL_RO")) {
            return None;
        }
        let f = req.arg(1);
        let quoted = |q: u8| {
            let mut v = Vec::with_capacity(f.len() + 2);
            v.push(q);
            v.extend_from_slice(f);
            v.push(q);
            v
        };
        let (single, double) = (quoted(b'\''), quoted(b'"'));
        // linear in the code's length whatever the name (a naive window search is not)
        let has = |code: &[u8], n: &[u8]| memchr::memmem::find(code, n).is_some();
        let (_, code) = self.libraries.iter().find(|(_, code)| has(code, &single) || has(code, &double))?;
        Some(Request::from_args(&[&b"FUNCTION"[..], b"LOAD", b"REPLACE", &code]).raw().clone())
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

/// The library name in a function library's first line (`#!lua name=mylib`).
fn library_name(code: &[u8]) -> Option<&[u8]> {
    let first = code.split(|&c| c == b'\n').next()?;
    if !first.starts_with(b"#!") {
        return None;
    }
    first.split(|c| c.is_ascii_whitespace()).find_map(|w| w.strip_prefix(b"name=")).filter(|n| !n.is_empty())
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

    #[test]
    fn function_libraries_serve_fcall() {
        let s = Scripts::default();
        let lib = "#!lua name=mylib\nredis.register_function('f1', function() return 1 end)\n\
                   redis.register_function{function_name=\"f2\", callback=function() return 2 end}";
        let fcall = |f: &str| Request::from_args(&["FCALL", f, "0"]).raw().clone();
        assert_eq!(s.function_load(&fcall("f1")), None);
        s.note("FUNCTION|LOAD", &Request::from_args(&["FUNCTION", "LOAD", lib]));
        let load = Request::from_args(&["FUNCTION", "LOAD", "REPLACE", lib]).raw().clone();
        assert_eq!(s.function_load(&fcall("f1")), Some(load.clone()));
        assert_eq!(s.function_load(&fcall("f2")), Some(load));
        assert_eq!(s.function_load(&fcall("f")), None, "a name only part of another's");
        assert_eq!(s.function_load(Request::from_args(&["GET", "f1"]).raw()), None);
        // without REPLACE a second load of the library fails in Redis: the first is kept
        s.note("FUNCTION|LOAD", &Request::from_args(&["FUNCTION", "LOAD", "#!lua name=mylib\nreturn"]));
        assert!(s.function_load(&fcall("f1")).is_some());
        s.note("FUNCTION|DELETE", &Request::from_args(&["FUNCTION", "DELETE", "mylib"]));
        assert_eq!(s.function_load(&fcall("f1")), None);
        s.note("FUNCTION|LOAD", &Request::from_args(&["FUNCTION", "LOAD", "REPLACE", lib]));
        s.note("FUNCTION|FLUSH", &Request::from_args(&["FUNCTION", "FLUSH"]));
        s.libraries.run_pending_tasks();
        assert_eq!(s.function_load(&fcall("f1")), None);
        assert_eq!(library_name(b"#!lua name=x y=z\nbody"), Some(&b"x"[..]));
        assert_eq!(library_name(b"no shebang"), None);
    }
}
