//! Module commands through heatshield (docs/commands.md): a 3+3 Redis 7.0 cluster with a
//! real module loaded (RediSearch 1.2, Debian's redis-redisearch, installed by
//! scripts/ensure-deps.sh). heatshield's generated table has no FT.* command: they are
//! learned from the masters' COMMAND and routed by their key specs (the index name), so
//! through heatshield they answer as on the index's master; a document the module rewrites
//! is never read stale from the hot-key cache; COMMAND describes them.

mod common;

use common::client::{Conn, V};
use common::{Proxy, RedisCluster, config_file};

const MODULE: &str = "/usr/lib/redis/modules/redisearch.so";

const CONFIG: &str = r#"
[cache]
pin = ["{mod}*"]
"#;

/// Runs `steps` with `@I` replaced by `index` and `@D` by `doc`, each on `c`.
fn run(c: &mut Conn, steps: &[&[&str]], index: &str, doc: &str) -> Vec<V> {
    steps
        .iter()
        .map(|s| c.cmd(&s.iter().map(|a| a.replace("@I", index).replace("@D", doc)).collect::<Vec<_>>()))
        .collect()
}

#[test]
fn module_commands_are_learned_and_routed_by_their_key_specs() {
    assert!(
        std::path::Path::new(MODULE).exists(),
        "{MODULE} is missing: scripts/ensure-deps.sh installs the redis-redisearch package"
    );
    let cluster = RedisCluster::start_with(&[&format!("loadmodule {MODULE}")]);
    let (_conf, path) = config_file(CONFIG);
    let proxy = Proxy::start_cluster(&cluster, &["--config", &path]);
    let mut through = Conn::connect(proxy.port());
    let steps: &[&[&str]] = &[
        &["FT.CREATE", "@I", "SCHEMA", "title", "TEXT", "price", "NUMERIC"],
        &["FT.ADD", "@I", "@D:1", "1.0", "FIELDS", "title", "red apple", "price", "3"],
        &["FT.ADD", "@I", "@D:2", "1.0", "FIELDS", "title", "green apple", "price", "5"],
        &["FT.ADD", "@I", "@D:3", "1.0", "FIELDS", "title", "red pear", "price", "7"],
        &["FT.SEARCH", "@I", "red", "NOCONTENT", "SORTBY", "price"],
        &["FT.SEARCH", "@I", "@price:[4 10]", "NOCONTENT", "SORTBY", "price"],
        &["FT.DEL", "@I", "@D:2"],
        &["FT.SEARCH", "@I", "apple", "NOCONTENT"],
        &["FT.CREATE", "@I", "SCHEMA", "title", "TEXT"],
        &["FT.SEARCH"],
    ];
    // (several index names, so several masters serve them; each pair in one slot)
    for tag in ["a", "b", "c", "d", "e", "f"] {
        let (mine, theirs) = (format!("{{ft{tag}}}p"), format!("{{ft{tag}}}d"));
        let owner = cluster.master_for_key(format!("{{ft{tag}}}").as_bytes());
        let got = run(&mut through, steps, &mine, &format!("{{ft{tag}}}pdoc"));
        let want = run(&mut Conn::connect(owner), steps, &theirs, &format!("{{ft{tag}}}ddoc"));
        // (document ids differ by the run's prefix)
        let got = format!("{got:?}").replace("pdoc", "Xdoc");
        let want = format!("{want:?}").replace("ddoc", "Xdoc");
        assert_eq!(got, want, "{{ft{tag}}}: through heatshield, then on the master");
        assert!(!got.contains("heatshield"), "{got}");
    }

    // a document the module rewrites (FT.ADD ... REPLACE) is never read stale from the
    // hot-key cache: the master's own invalidation reaches it
    assert_eq!(through.cmd(&["FT.CREATE", "{mod}idx", "SCHEMA", "title", "TEXT"]), V::ok());
    let mut stale = Vec::new();
    for round in 0..30 {
        let title = format!("title {round}");
        let r = through.cmd(&["FT.ADD", "{mod}idx", "{mod}doc", "1.0", "REPLACE", "FIELDS", "title", &title]);
        assert_eq!(r, V::ok());
        for _ in 0..3 {
            let h = through.cmd(&["HGET", "{mod}doc", "title"]);
            if h != V::s(&title) {
                stale.push(format!("round {round}: {h:?}"));
            }
        }
    }
    assert!(stale.is_empty(), "{} stale reads: {stale:?}", stale.len());
    let hits = through.cmd(&["PROXY", "CACHE", "STATS"]).get("hits").map(|v| v.int()).unwrap_or(0);
    assert!(hits >= 30, "the cache answered {hits} reads: the test tested nothing");

    // COMMAND describes them, and PROXY INFO counts them among the learned
    let ask = ["COMMAND", "INFO", "ft.search", "ft.add"];
    let info = through.cmd(&ask);
    assert_eq!(info, common::cmd(cluster.masters()[0], &ask));
    assert_eq!(info.items()[0].items()[0], V::s("FT.SEARCH"), "{info:?}");
    let text = through.cmd(&["PROXY", "INFO"]).text();
    let added = common::info_field(&text, "commands_added").unwrap_or_default();
    for name in ["ft.create", "ft.add", "ft.search", "ft.del"] {
        assert!(added.split(' ').any(|n| n == name), "{name} not in commands_added: {added}");
    }
}
