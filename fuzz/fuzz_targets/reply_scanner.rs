//! Fuzzes the backend reply scanner and decoder: no panic on any input, and when the
//! scanner finds a complete reply, feeding the same bytes one at a time finds the same end.
#![no_main]

use heatshield::protocol::reply::{ReplyScanner, Value, reply_len};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let whole = reply_len(data);
    if let Ok(Some(n)) = whole {
        let mut s = ReplyScanner::new();
        let mut found = None;
        for i in 1..=n {
            if let Ok(Some(m)) = s.scan(&data[..i]) {
                found = Some(m);
                break;
            }
        }
        assert_eq!(found, Some(n));
        let _ = Value::parse(&data[..n]);
    }
});
