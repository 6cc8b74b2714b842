//! `heatshield migrate shadow | dual-write | off | cutover | rollback | finish | status`:
//! the phases a running heatshield drives (`PROXY MIGRATION <phase>`), asked of it from
//! the command line, waiting for a cutover, rollback or finish to end.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::protocol::Request;
use crate::protocol::reply::Value;

/// A connection to a running heatshield.
struct Running {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Running {
    fn ask(&mut self, args: &[&str]) -> Result<Vec<u8>, String> {
        self.s.write_all(Request::from_args(args).raw()).map_err(|e| e.to_string())?;
        loop {
            if let Ok((_, n)) = Value::parse(&self.buf) {
                return Ok(self.buf.drain(..n).collect());
            }
            let mut chunk = [0u8; 16 * 1024];
            match self.s.read(&mut chunk) {
                Ok(0) => return Err("the connection closed".into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// `PROXY MIGRATION STATUS` as (field, value) pairs.
    fn status(&mut self) -> Result<Vec<(String, String)>, String> {
        let r = self.ask(&["PROXY", "MIGRATION", "STATUS"])?;
        let text = |v: &Value| v.as_bytes().map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
        match Value::parse(&r) {
            Ok((Value::Map(m), _)) => Ok(m.iter().map(|(k, v)| (text(k), text(v))).collect()),
            Ok((Value::Array(v), _)) => {
                Ok(v.chunks(2).map(|p| (text(&p[0]), p.get(1).map(text).unwrap_or_default())).collect())
            }
            _ => Err(String::from_utf8_lossy(&r).trim_end().to_string()),
        }
    }
}

/// Asks the heatshield at `addr` (after `AUTH`, when given) for `phase` (`STATUS`,
/// `SHADOW`, `DUAL-WRITE`, `OFF`, `CUTOVER`, `ROLLBACK`, `FINISH`); for the last three,
/// waits up to `wait` for their end. Returns what to print and whether it succeeded, or
/// why the heatshield could not be asked.
pub fn run(addr: &str, auth: Option<(&str, &str)>, phase: &str, wait: Duration) -> Result<(String, bool), String> {
    {
        let s = TcpStream::connect(addr).map_err(|e| format!("{addr}: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
        let mut c = Running { s, buf: Vec::new() };
        if let Some((user, password)) = auth {
            let r = c.ask(&["AUTH", user, password])?;
            if let Some(e) = crate::protocol::reply::error_text(&r) {
                return Err(String::from_utf8_lossy(e).into_owned());
            }
        }
        let show = |fields: &[(String, String)]| fields.iter().map(|(k, v)| format!("{k}: {v}\n")).collect::<String>();
        if phase == "STATUS" {
            return Ok((show(&c.status()?), true));
        }
        let r = c.ask(&["PROXY", "MIGRATION", phase])?;
        if let Some(e) = crate::protocol::reply::error_text(&r) {
            return Ok((String::from_utf8_lossy(e).into_owned(), false));
        }
        if !matches!(phase, "CUTOVER" | "ROLLBACK" | "FINISH") {
            return Ok((format!("phase: {}\n", field(&c.status()?, "phase")), true));
        }
        let end = Instant::now() + wait;
        loop {
            let st = c.status()?;
            let result = field(&st, "switch_result");
            if result != "running" && !result.is_empty() {
                let ok = !result.contains("failed");
                return Ok((
                    format!("{result}\nphase: {}\nserving: {}\n", field(&st, "phase"), field(&st, "serving")),
                    ok,
                ));
            }
            if Instant::now() >= end {
                return Err(format!("still running after {} s (PROXY MIGRATION STATUS)", wait.as_secs()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn field(fields: &[(String, String)], name: &str) -> String {
    fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()).unwrap_or_default()
}
