//! The error texts heatshield writes itself, in one table, so each is spelled once (where heatshield answers as a single Redis would, the text is Redis's
//! own). Texts carry no leading `-`: the reply writer adds it, or [`resp`] for a raw
//! error reply. Errors from a backend are not here: they pass through as Redis sent them.
//! A leaf module: it imports nothing of heatshield.

/// `PROXY MIGRATION DUAL-WRITE` without a target.
pub const NO_MIGRATION_TARGET: &str = "ERR no [migration] target is configured (docs/migration.md)";
pub const MIGRATION_CUT_OVER: &str =
    "ERR migration: cut over, the source is kept up to date by copies back to it: PROXY MIGRATION ROLLBACK first";
pub const MIGRATION_FINISHED: &str =
    "ERR migration: finished; the target serves for good (set [backend] to it and remove [migration])";
pub const MIGRATION_NOT_DUAL: &str =
    "ERR migration: turn dual-write on (and backfill and verify) before the target serves";

pub const NOAUTH: &str = "NOAUTH Authentication required.";
pub const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";
/// A transaction's command in another slot than the transaction's earlier keys.
pub const CROSSSLOT_TX: &str = "CROSSSLOT Keys in request don't hash to the same slot (a transaction's keys must share one slot; transactions.cross_slot = \"per-node\" runs it as one transaction per slot)";
pub const NESTED_MULTI: &str = "ERR MULTI calls can not be nested";
pub const EXECABORT: &str = "EXECABORT Transaction discarded because of previous errors.";
/// A key under heatshield's own prefix (`command::RESERVED_PREFIX`, the fleet's keys).
pub const RESERVED_KEY: &str = "ERR heatshield: keys starting with '{heatshield:' are heatshield's own (docs/fleet.md)";
pub const EXEC_WITHOUT_MULTI: &str = "ERR EXEC without MULTI";
pub const WATCH_IN_MULTI: &str = "ERR WATCH inside MULTI is not allowed";
/// Redis's refusal of a `no-multi` command (SAVE, SHUTDOWN, ...) inside MULTI.
pub const NO_MULTI: &str = "ERR Command not allowed inside a transaction";
pub const DISCARD_WITHOUT_MULTI: &str = "ERR DISCARD without MULTI";
pub const NO_SLOT_MAP: &str = "CLUSTERDOWN heatshield has no slot map yet";
pub const INVALID_CURSOR: &str = "ERR invalid cursor";
pub const INVALID_SLOT: &str = "ERR Invalid slot";
pub const LOCK_SERVICE_DOWN: &str = "ERR heatshield: the lock service is not running";
pub const MAX_CLIENTS: &str = "ERR max number of clients reached";
pub const SYNTAX: &str = "ERR syntax error";
pub const NOT_AN_INTEGER: &str = "ERR value is not an integer or out of range";
pub const UNBLOCKED: &str = "UNBLOCKED client unblocked via CLIENT UNBLOCK";
pub const NO_SUCH_CLIENT: &str = "ERR No such client";
pub const CLIENT_ID_POSITIVE: &str = "ERR client-id should be greater than 0";
pub const INVALID_CLIENT_ID: &str = "ERR Invalid client ID";
pub const UNBLOCK_REASON: &str = "ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR";

// Redis's own texts, for the commands heatshield answers itself (local).
pub const DELUSER_DEFAULT: &str = "ERR The 'default' user cannot be removed";
pub const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";
pub const AUTH_WITHOUT_PASSWORD: &str = "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?";
pub const CLIENT_NAME_CHARS: &str = "ERR Client names cannot contain spaces, newlines or special characters.";
pub const LIB_INFO_CHARS: &str = "ERR lib-name and lib-ver cannot contain spaces, newlines or special characters.";
pub const NOPROTO: &str = "NOPROTO unsupported protocol version";
pub const PROTO_NOT_AN_INTEGER: &str = "ERR Protocol version is not an integer or out of range";
pub const HELLO_NOAUTH: &str = "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time";
/// SELECT of a database other than 0 (Redis's text, and why).
pub const DB_OUT_OF_RANGE: &str = "ERR DB index is out of range (heatshield serves database 0 only)";
/// Redis's own text, where the masters have several databases.
pub const DB_INDEX_OUT_OF_RANGE: &str = "ERR DB index is out of range";

// Redis's own texts for the keys of a request (command table).
pub const NUMKEYS_NEGATIVE: &str = "ERR Number of keys can't be negative";
pub const NUMKEYS_TOO_MANY: &str = "ERR Number of keys can't be greater than number of args";
pub const NUMKEYS_ZERO: &str = "ERR numkeys should be greater than 0";
pub const UNBALANCED_STREAMS: &str =
    "ERR Unbalanced 'xread' list of streams: for each stream key an ID or '$' must be specified.";

// heatshield's admin commands (PROXY ..., docs/admin.md).
pub const ADMIN_DISABLED: &str = "ERR PROXY commands are disabled (admin.enabled = false)";
pub const ADMIN_WRONGPASS: &str = "WRONGPASS invalid admin password";
pub const ADMIN_NO_PASSWORD: &str = "ERR PROXY AUTH called without admin.password configured";
pub const CONFIG_NOPERM: &str = "NOPERM CONFIG SET, RESETSTAT and REWRITE change every master: they need admin.password set and PROXY AUTH <password> first";
pub const ADMIN_NOPERM: &str = "NOPERM PROXY commands need PROXY AUTH <password> first";
pub const COUNT_AT_LEAST_MINUS_ONE: &str = "ERR count should be greater than or equal to -1";
pub const COUNT_POSITIVE: &str = "ERR count must be a positive integer";
pub const RATE_AND_BURST: &str = "ERR rate must be a number and burst an integer";

// heatshield's lock commands (docs/locks.md).
pub const LOCK_SCRIPT_REPLY: &str = "ERR heatshield: unexpected reply from the lock script";
/// A lock command's script met NOSCRIPT (the node's script cache was emptied unseen by
/// heatshield) and a later command of the client on the same key ran meanwhile: nothing
/// ran, and sending it again now would reorder the two (docs/design/ordering.md).
pub const LOCK_SCRIPT_UNLOADED: &str = "TRYAGAIN heatshield: the lock script was not loaded on the node and a later command on its key ran first; nothing ran";

// CLIENT TRACKING / CLIENT CACHING (Redis's texts)
pub const REDIRECT_ONE: &str = "ERR A client can only redirect to a single other client";
pub const REDIRECT_GONE: &str = "ERR The client ID you want redirect to does not exist";
pub const PREFIX_NEEDS_BCAST: &str = "ERR PREFIX option requires BCAST mode to be enabled";
pub const BCAST_SWITCH: &str = "ERR You can't switch BCAST mode on/off before disabling tracking for this client, and then re-enabling it with a different mode.";
pub const OPT_WITH_BCAST: &str = "ERR OPTIN and OPTOUT are not compatible with BCAST";
pub const OPTIN_AND_OPTOUT: &str = "ERR You can't specify both OPTIN mode and OPTOUT mode";
pub const OPT_SWITCH: &str = "ERR You can't switch OPTIN/OPTOUT mode before disabling tracking for this client, and then re-enabling it with a different mode.";
pub const CACHING_NOT_OPT: &str =
    "ERR CLIENT CACHING can be called only when the client is in tracking mode with OPTIN or OPTOUT mode enabled";
pub const CACHING_YES_NOT_OPTIN: &str = "ERR CLIENT CACHING YES is only valid when tracking is enabled in OPTIN mode.";
pub const CACHING_NO_NOT_OPTOUT: &str = "ERR CLIENT CACHING NO is only valid when tracking is enabled in OPTOUT mode.";

// HOTKEYS (Redis 8.6's texts)
pub const HOTKEYS_RUNNING: &str = "ERR hotkey tracking session in progress, stop tracking first";
pub const HOTKEYS_STARTED: &str = "ERR hotkey tracking session already in progress";
pub const HOTKEYS_METRICS_REQUIRED: &str = "ERR METRICS parameter is required";
pub const HOTKEYS_COUNTS_DIFFER: &str = "ERR METRICS count does not match number of metric types provided";
pub const HOTKEYS_NO_METRIC: &str = "ERR METRICS no valid metrics passed. Supported: CPU|NET";
pub const HOTKEYS_SLOTS_TWICE: &str = "ERR SLOTS parameter already specified";
pub const HOTKEYS_FEW_SLOTS: &str = "ERR not enough slot numbers provided";
pub const HOTKEYS_BAD_SLOT: &str = "ERR Invalid or out of range slot";
pub const HOTKEYS_SLOT_TWICE: &str = "ERR duplicate slot number";

/// CLIENT TRACKING ... PREFIX: `p` overlaps `q`, one of the client's prefixes already
/// (`existing`) or another of those given.
pub fn prefix_overlaps(p: &[u8], q: &[u8], existing: bool) -> String {
    let which = if existing { "an existing" } else { "another provided" };
    format!(
        "ERR Prefix '{}' overlaps with {which} prefix '{}'. Prefixes for a single client must not overlap.",
        String::from_utf8_lossy(p),
        String::from_utf8_lossy(q)
    )
}

/// WAIT / WAITAOF: a master could not be asked.
pub fn wait_failed(whom: &str, why: &str) -> String {
    format!("ERR heatshield: WAIT could not ask {whom}: {why}")
}

/// Refused while heatshield stops.
pub const STOPPING: &str = "ERR heatshield is stopping";

/// Redis's refusal of a command on a RESP2 connection with subscriptions.
pub fn not_while_subscribed(lower: &str) -> String {
    format!(
        "ERR Can't execute '{lower}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context"
    )
}

/// CONFIG SET that only some masters took.
pub fn applied_on_some(ok: usize, of: usize, not_on: &str) -> String {
    format!("ERR heatshield: applied on {ok} of {of} masters; not on {not_on}")
}

/// Redis 7.0's text for a zero `numkeys` of the sorted-set commands that take several keys.
pub fn at_least_one_key(name: &str) -> &'static str {
    match name {
        "ZUNION" => "ERR at least 1 input key is needed for 'zunion' command",
        "ZINTER" => "ERR at least 1 input key is needed for 'zinter' command",
        "ZDIFF" => "ERR at least 1 input key is needed for 'zdiff' command",
        "ZINTERCARD" => "ERR at least 1 input key is needed for 'zintercard' command",
        "ZUNIONSTORE" => "ERR at least 1 input key is needed for 'zunionstore' command",
        "ZINTERSTORE" => "ERR at least 1 input key is needed for 'zinterstore' command",
        _ => "ERR at least 1 input key is needed for 'zdiffstore' command",
    }
}

/// HOTKEYS START METRICS ... CPU CPU.
pub fn hotkeys_metric_twice(name: &str) -> String {
    format!("ERR METRICS {name} defined more than once!")
}

/// `text` as a RESP error reply (`-text\r\n`).
pub fn resp(text: &str) -> bytes::Bytes {
    bytes::Bytes::from(format!("-{text}\r\n"))
}

pub fn slot_not_served(slot: u16) -> String {
    format!("CLUSTERDOWN Hash slot {slot} not served")
}

/// A read under a `replica` policy with no replica in sync for its slot.
pub fn no_replica(slot: u16) -> String {
    format!("ERR no replica in sync serves slot {slot} (read_from = \"replica\")")
}

/// A key whose name the colocation rules the fleet is switching to change, while the
/// fleet switches (docs/fleet.md, "Changing colocation rules in a running fleet").
pub fn fleet_switching(key: &[u8]) -> String {
    format!(
        "TRYAGAIN heatshield: the fleet is switching the colocation rules that name '{}'; try again shortly (PROXY FLEET)",
        String::from_utf8_lossy(key)
    )
}

/// A key this instance's colocation rules store under another name than its fleet's
/// (docs/fleet.md, "One fleet, one set of names"): another instance serves it.
pub fn fleet_names_differ(key: &[u8]) -> String {
    format!(
        "TRYAGAIN heatshield: this instance's colocation rules store '{}' under another name than its fleet's; use another instance (PROXY FLEET)",
        String::from_utf8_lossy(key)
    )
}

/// A command heatshield refuses on purpose (`why` may be empty).
pub fn unsupported(name: &str, why: &str) -> String {
    if why.is_empty() {
        format!("ERR heatshield does not support '{name}'")
    } else {
        format!("ERR heatshield does not support '{name}': {why}")
    }
}

/// `ERR <text>`, for problems a parser describes itself (a rule, an option).
pub fn err(text: &str) -> String {
    format!("ERR {text}")
}

/// Redis's text for an unknown subcommand (`sub` as the client sent it, `of` the command
/// whose HELP lists the subcommands).
pub fn unknown_subcommand(sub: &str, of: &str) -> String {
    format!("ERR unknown subcommand '{sub}'. Try {of} HELP.")
}

/// A subcommand Redis checks the arguments of itself, given too many (`ACL CAT a b`).
pub fn subcommand_arity(sub: &str, of: &str) -> String {
    format!("ERR unknown subcommand or wrong number of arguments for '{sub}'. Try {of} HELP.")
}

/// Redis's text for an unknown command (`args`: the first arguments, quoted).
pub fn unknown_command(name: &str, args: &str) -> String {
    format!("ERR unknown command '{name}', with args beginning with: {args}")
}

pub fn unrecognized_option(opt: &str) -> String {
    format!("ERR Unrecognized option '{opt}'")
}

pub fn hello_syntax(opt: &str) -> String {
    format!("ERR Syntax error in HELLO option '{opt}'")
}

pub fn invalid_rule(problems: &[String]) -> String {
    format!("ERR invalid rule: {}", problems.join("; "))
}

/// A value `PROXY CONFIG SET` refuses for `key` (`why`: what it must be).
pub fn config_value(value: &str, key: &str, why: &str) -> String {
    format!("ERR Invalid argument '{value}' for PROXY CONFIG SET '{key}': {why}")
}

/// `PROXY CONFIG RELOAD` of a file with problems (nothing changed), or without a file.
pub fn config_rejected(why: &str) -> String {
    let why: String = why.chars().map(|c| if c == '\r' || c == '\n' { ' ' } else { c }).collect();
    format!("ERR heatshield: configuration not reloaded, nothing changed: {why}")
}

pub fn config_not_live(key: &str, live: &[&str]) -> String {
    format!(
        "ERR '{key}' cannot be changed while heatshield runs (live settings: {}); edit the configuration file and restart",
        live.join(", ")
    )
}

pub fn config_unknown(key: &str) -> String {
    format!("ERR Unknown option or number of arguments for PROXY CONFIG SET - '{key}'")
}

/// A lock argument that must be positive (`what`: `ttl-ms`), or not negative (`timeout-ms`).
pub fn lock_invalid(what: &str, name: &str, must: &str) -> String {
    format!("ERR invalid {what} in '{name}' command: {must}")
}

pub fn not_owner(key: &[u8], owner: &[u8]) -> String {
    format!("NOTOWNER lock '{}' is not held by '{}'", String::from_utf8_lossy(key), String::from_utf8_lossy(owner))
}

/// A command that cannot be part of a transaction through heatshield (it is answered by
/// heatshield itself, or spans every master).
pub fn not_in_transaction(name: &str) -> String {
    format!("ERR heatshield cannot run '{name}' inside MULTI")
}

/// A SUBSCRIBE that would take the proxy past `limits.max_subscriptions`.
pub fn too_many_subscriptions(limit: usize) -> String {
    format!("ERR heatshield: subscriptions are at limits.max_subscriptions ({limit})")
}

pub fn transaction_too_large(limit: usize) -> String {
    format!("ERR heatshield: the transaction is over limits.max_inflight_request_bytes ({limit} bytes)")
}

/// Redis's arity error (`name` in lower case, as Redis writes it).
/// A command an ACL user may not run.
pub fn noperm_command(lower_name: &str) -> String {
    format!("NOPERM this user has no permissions to run the '{lower_name}' command")
}
/// A key an ACL user may not touch.
pub const NOPERM_KEY: &str = "NOPERM this user has no permissions to access one of the keys used as arguments";
/// A channel an ACL user may not use.
pub const NOPERM_CHANNEL: &str = "NOPERM this user has no permissions to access one of the channels used as arguments";

/// `ACL CAT` of a category that does not exist.
pub fn unknown_category(name: &[u8]) -> String {
    format!("ERR Unknown category '{}'", String::from_utf8_lossy(name))
}

pub fn wrong_arity(name: &str) -> String {
    format!("ERR wrong number of arguments for '{name}' command")
}

pub fn flush_disabled(name: &str) -> String {
    format!(
        "ERR {name} is disabled in heatshield (it would empty every master); set server.allow_flush = true to enable it"
    )
}

pub fn node_unreachable(addr: &str) -> String {
    format!("CLUSTERDOWN heatshield cannot reach node {addr}")
}

/// A request without a reply from its backend (lost connection, timeout).
pub fn backend_failed(why: &dyn std::fmt::Display) -> String {
    format!("ERR heatshield: {why}")
}

/// What heatshield adds to Redis's error when a script touched a key it did not declare
/// (Redis's text stays as it is, in front).
pub const UNDECLARED_KEY_HINT: &str = " (heatshield: a script runs on the master of its declared keys' slot, or of slot 0 when it declares none; declare every key it touches, in one slot)";

/// A script's error reply with [`UNDECLARED_KEY_HINT`] added when Redis refused an
/// undeclared key (a key of another node, or of another slot); `None` otherwise.
pub fn with_undeclared_key_hint(reply: &[u8]) -> Option<Vec<u8>> {
    if reply.first() != Some(&b'-') || !reply.ends_with(b"\r\n") {
        return None;
    }
    let text = &reply[..reply.len() - 2];
    let undeclared = [&b"non local key"[..], b"do not hash to the same slot"]
        .iter()
        .any(|m| memchr::memmem::find(text, m).is_some());
    if !undeclared {
        return None;
    }
    let mut out = Vec::with_capacity(reply.len() + UNDECLARED_KEY_HINT.len());
    out.extend_from_slice(text);
    out.extend_from_slice(UNDECLARED_KEY_HINT.as_bytes());
    out.extend_from_slice(b"\r\n");
    Some(out)
}

/// What [`UNDECLARED_KEY_HINT`] adds for a script whose keys a colocation rule moved
/// (`rule`, the tag they got) or whose `ARGV` holds names a rule covers (`argv`: each
/// argument's place, name and rule).
pub fn undeclared_key_rule_hint(rule: Option<(&str, &str)>, argv: &[(usize, String, String)]) -> String {
    let mut s = String::new();
    if let Some((rule, tag)) = rule {
        s.push_str(&format!(
            " (heatshield: its keys are under colocation rule {rule:?}, stored with the hash tag {{{tag}}}; a name the script makes that no rule gives this tag lives in another slot: docs/colocation.md)"
        ));
    }
    for (i, name, rule) in argv {
        s.push_str(&format!(
            " (heatshield: ARGV[{i}] {name:?} is a key name of colocation rule {rule:?}, stored under that rule's tag)"
        ));
    }
    s
}

/// EXEC refused before it ran (Redis discards the transaction).
pub fn exec_aborted_because(why: &str) -> String {
    format!("EXECABORT Transaction discarded because of: {why}")
}

pub fn merge_failed(what: &str) -> String {
    format!("ERR heatshield could not merge replies: {what}")
}

/// A request that got no reply (nor retry outcome) within the reply deadline.
pub fn expired(ms: u128) -> String {
    format!("ERR heatshield: no reply within {ms} ms")
}

/// Malformed input from a client (the connection closes after it).
pub fn protocol(e: &dyn std::fmt::Display) -> String {
    format!("ERR {e}")
}

/// A node has `backend.dedicated_max_per_node` dedicated connections already.
pub fn no_dedicated(addr: &str, max: usize) -> String {
    format!(
        "ERR heatshield: no dedicated connection free for {addr} (backend.dedicated_max_per_node = {max}); try again later"
    )
}

/// CLIENT LIST / KILL with an unknown TYPE.
pub fn unknown_client_type(t: &str) -> String {
    format!("ERR Unknown client type '{t}'")
}

/// CLIENT KILL USER with a user that does not exist (heatshield has only `default`).
pub fn no_such_user(u: &str) -> String {
    format!("ERR No such user '{u}'")
}

/// `ACL GENPASS` with a bit count out of range.
pub const GENPASS_BITS: &str =
    "ERR ACL GENPASS argument must be the number of bits for the output password, a positive number up to 4096";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn undeclared_key_errors_get_the_hint() {
        let e =
            b"-ERR Script attempted to access a non local key in a cluster node script: abc, on @user_script:1.\r\n";
        let hinted = with_undeclared_key_hint(e).unwrap();
        assert!(hinted.starts_with(&e[..e.len() - 2]), "Redis's text stays in front");
        assert!(hinted.ends_with(format!("{UNDECLARED_KEY_HINT}\r\n").as_bytes()));
        assert!(with_undeclared_key_hint(b"-ERR other\r\n").is_none());
        assert!(with_undeclared_key_hint(b"$13\r\nnon local key\r\n").is_none());
    }
}
