//! One source for the configuration's documentation: every key of the configuration
//! structs appears in `conf/heatshield.toml` (set or as a commented example), in the
//! README's configuration table, and in `PROXY CONFIG GET *` of a running heatshield, and
//! none of those names a key the structs do not have. (`ratelimit.rules`, `colocate` and
//! `colocate_next` are shown by `PROXY RATELIMIT LIST`, `PROXY COLOCATE LIST` and `PROXY
//! FLEET`, not by `PROXY CONFIG GET`.)

mod common;

use std::collections::BTreeSet;

use common::client::Conn;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The keys the structs have, as `section.key`.
fn struct_keys() -> BTreeSet<String> {
    heatshield::config::entries(&heatshield::config::Config::default()).into_iter().map(|(k, _)| k).collect()
}

/// `section.key` for every `key = ...` or `# key = ...` line under a `[section]` of the
/// shipped file, and `section.table` for a `[[section.table]]` (commented or not), whose
/// own keys belong to the table.
fn conf_keys() -> BTreeSet<String> {
    let text = std::fs::read_to_string(format!("{ROOT}/conf/heatshield.toml")).expect("conf/heatshield.toml");
    let mut out = BTreeSet::new();
    let mut section = String::new();
    for line in text.lines().map(|l| l.trim().trim_start_matches('#').trim()) {
        if let Some(t) = line.strip_prefix("[[").and_then(|l| l.strip_suffix("]]")) {
            out.insert(t.to_string());
            section.clear(); // its keys belong to the table
        } else if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = s.to_string();
        } else if !section.is_empty()
            && let Some((k, _)) = line.split_once('=')
        {
            let k = k.trim();
            if !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                out.insert(format!("{section}.{k}"));
            }
        }
    }
    out
}

/// The keys in the first column of the README's configuration table.
fn readme_keys() -> BTreeSet<String> {
    let text = std::fs::read_to_string(format!("{ROOT}/README.md")).expect("README.md");
    let table = text.split("## Configuration reference").nth(1).expect("a configuration section");
    let table = table.split("\n## ").next().unwrap_or(table);
    let mut out = BTreeSet::new();
    for row in table.lines().filter(|l| l.starts_with("| `")) {
        let first = row.split('|').nth(1).unwrap_or("");
        for name in first.split('`').skip(1).step_by(2) {
            let name = name.trim_start_matches("[[").trim_end_matches("]]");
            out.insert(name.to_string());
        }
    }
    out
}

fn differ(what: &str, have: &BTreeSet<String>, want: &BTreeSet<String>) -> Vec<String> {
    let mut p: Vec<String> = want.difference(have).map(|k| format!("{k}: missing from {what}")).collect();
    p.extend(have.difference(want).map(|k| format!("{k}: in {what} but not a configuration key")));
    p
}

#[test]
fn every_configuration_key_is_documented_and_shown_and_nothing_else_is() {
    let keys = struct_keys();
    assert!(keys.len() > 40, "the structs yielded only {keys:?}");
    let mut problems = differ("conf/heatshield.toml", &conf_keys(), &keys);
    problems.extend(differ("the README's configuration table", &readme_keys(), &keys));

    let server = common::RedisStandalone::start();
    let proxy = common::Proxy::start_standalone(&server, &[]);
    let reply = Conn::connect(proxy.port()).cmd(&["PROXY", "CONFIG", "GET", "*"]);
    let shown: BTreeSet<String> = reply.pairs().into_iter().map(|(k, _)| k.text()).collect();
    assert!(shown.len() > 40, "PROXY CONFIG GET * showed only {shown:?}");
    let mut want = keys.clone();
    want.remove("ratelimit.rules");
    want.remove("colocate");
    want.remove("colocate_next");
    problems.extend(differ("PROXY CONFIG GET *", &shown, &want));
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}
