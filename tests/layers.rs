//! The layering src/lib.rs promises: "every module imports only from the modules listed
//! before it". The list is read from lib.rs's own doc comment, each module's files
//! (`src/<name>.rs`, `src/<name>/**.rs`) are searched for `crate::<other>`, and an import
//! of a module listed later (or not listed at all) fails the test, naming the file. The
//! same holds inside each folder, in the order its `mod.rs` lists its rooms.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");

/// The modules in the order lib.rs's doc comment lists them (each `[`name`]`).
fn listed() -> Vec<String> {
    let lib = std::fs::read_to_string(format!("{SRC}/lib.rs")).unwrap();
    let mut out = Vec::new();
    for line in lib.lines().take_while(|l| l.starts_with("//!")) {
        let mut rest = line;
        while let Some(at) = rest.find("[`") {
            let after = &rest[at + 2..];
            let Some(end) = after.find("`]") else { break };
            out.push(after[..end].to_string());
            rest = &after[end + 2..];
        }
    }
    out
}

/// The modules lib.rs declares (`pub mod x;` / `mod x;`).
fn declared() -> Vec<String> {
    let lib = std::fs::read_to_string(format!("{SRC}/lib.rs")).unwrap();
    lib.lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod ").or_else(|| l.trim().strip_prefix("mod ")))
        .map(|l| l.trim_end_matches(';').to_string())
        .collect()
}

fn files(module: &str) -> Vec<PathBuf> {
    files_in(Path::new(SRC), module)
}

/// The files of room `name` of folder `folder`: `name.rs`, and every `.rs` under `name/`.
fn files_in(folder: &Path, name: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let file = folder.join(format!("{name}.rs"));
    if file.exists() {
        out.push(file);
    }
    let mut dirs = vec![folder.join(name)];
    while let Some(d) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out
}

/// The `crate::<name>` references of a file's code (comments and test modules left out).
fn imports(text: &str) -> Vec<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or(text);
    let mut out = Vec::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or("");
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            let name: String = rest[at + 7..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                out.push(name);
            }
            rest = &rest[at + 7..];
        }
        // `use crate::{a, b::c}` groups
        if let Some(at) = line.find("crate::{") {
            let group = &line[at + 8..];
            for part in group.split([',', '}']) {
                let name: String = part.trim().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
        }
    }
    out
}

#[test]
fn every_module_imports_only_from_modules_listed_before_it() {
    let order = listed();
    let declared = declared();
    let place: HashMap<&str, usize> = order.iter().enumerate().map(|(i, m)| (m.as_str(), i)).collect();
    let mut problems = Vec::new();
    for m in &declared {
        if !place.contains_key(m.as_str()) {
            problems.push(format!("{m}: declared in lib.rs but not in its list"));
        }
    }
    for m in &order {
        if !declared.contains(m) {
            problems.push(format!("{m}: listed in lib.rs but not declared"));
        }
    }
    for (i, m) in order.iter().enumerate() {
        for f in files(m) {
            let text = std::fs::read_to_string(&f).unwrap();
            for used in imports(&text) {
                match place.get(used.as_str()) {
                    Some(&j) if j <= i => {}
                    Some(_) => problems.push(format!(
                        "{}: {m} imports {used}, listed after it",
                        f.strip_prefix(SRC).unwrap().display()
                    )),
                    None if declared.contains(&used) => {}
                    None => {}
                }
            }
        }
    }
    assert!(order.len() >= 15, "lib.rs lists only {} floors: {order:?}", order.len());
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}

/// The rooms a folder's `mod.rs` lists in its doc comment (each `[`name`]`) that it
/// declares, in that order, and every room it declares.
fn rooms(folder: &Path) -> Option<(Vec<String>, Vec<String>)> {
    let text = std::fs::read_to_string(folder.join("mod.rs")).ok()?;
    let declared: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            ["pub mod ", "pub(crate) mod ", "pub(super) mod ", "mod "].iter().find_map(|p| l.strip_prefix(p))
        })
        .filter(|l| l.ends_with(';'))
        .map(|l| l.trim_end_matches(';').to_string())
        .collect();
    let mut listed = Vec::new();
    for line in text.lines().take_while(|l| l.starts_with("//!")) {
        let mut rest = line;
        while let Some(at) = rest.find("[`") {
            let after = &rest[at + 2..];
            let Some(end) = after.find("`]") else { break };
            let name = after[..end].to_string();
            if declared.contains(&name) && !listed.contains(&name) {
                listed.push(name);
            }
            rest = &after[end + 2..];
        }
    }
    Some((listed, declared))
}

/// Inside each folder of src/, a room imports only the rooms its `mod.rs` lists before
/// it (`crate::<folder>::<room>` or `super::<room>`), and every room is listed.
#[test]
fn inside_a_folder_each_room_imports_only_the_ones_listed_before_it() {
    let mut problems = Vec::new();
    let mut folders = 0;
    for top in listed() {
        let folder = Path::new(SRC).join(&top);
        let Some((order, declared)) = rooms(&folder) else { continue };
        folders += 1;
        for d in &declared {
            if !order.contains(d) {
                problems.push(format!("{top}/{d}: declared in {top}/mod.rs but not in its list"));
            }
        }
        for (i, room) in order.iter().enumerate() {
            for f in files_in(&folder, room) {
                let text = std::fs::read_to_string(&f).unwrap();
                let code = text.split("#[cfg(test)]").next().unwrap_or(&text);
                let in_room = f.parent() == Some(folder.as_path());
                for (j, other) in order.iter().enumerate().filter(|(j, _)| *j > i) {
                    let full = format!("crate::{top}::{other}");
                    let sibling = format!("super::{other}");
                    let uses = code.lines().map(|l| l.split("//").next().unwrap_or("")).any(|l| {
                        l.contains(&full)
                            || (in_room && (l.contains(&format!("{sibling}::")) || l.contains(&format!("{sibling};"))))
                    });
                    if uses {
                        problems.push(format!(
                            "{}: {top}/{room} imports {top}/{other}, listed after it ({j} > {i})",
                            f.strip_prefix(SRC).unwrap().display()
                        ));
                    }
                }
            }
        }
    }
    assert!(folders >= 6, "only {folders} folders with rooms");
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}

/// docs/architecture.md's table names every module lib.rs lists, and no other.
#[test]
fn the_architecture_table_names_every_module() {
    let order = listed();
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/architecture.md")).unwrap();
    let mut named = Vec::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').collect();
        if cells.len() < 4 || cells[1].trim().parse::<u32>().is_err() {
            continue;
        }
        let mut rest = cells[2];
        while let Some(at) = rest.find('`') {
            let after = &rest[at + 1..];
            let Some(end) = after.find('`') else { break };
            named.push(after[..end].trim_end_matches('/').to_string());
            rest = &after[end + 1..];
        }
    }
    let missing: Vec<&String> = order.iter().filter(|m| !named.contains(m)).collect();
    let unknown: Vec<&String> = named.iter().filter(|n| !order.contains(n)).collect();
    assert!(missing.is_empty() && unknown.is_empty(), "not in the table: {missing:?}; not in lib.rs: {unknown:?}");
}
