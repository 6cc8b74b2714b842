//! The services a request may use on its way, each owning its state and knowing nothing
//! of sessions or routes; each imports only what lies below `services` and the ones
//! listed before it:
//!
//! - [`colocate`]: key colocation rules, the rewrite of key names on the way in and back
//!   on the way out;
//! - [`acl`]: ACL users and their rules (passwords, commands by name and category,
//!   keys, channels), in Redis's syntax;
//! - [`stats`]: slow log, big-key log, HOTKEYS sessions, per-command statistics;
//! - [`ratelimit`]: per-key rate limits (rules, GCRA budgets, tracked-key cap);
//! - [`fleet`]: heatshields of one fleet dividing the rate-limit rules between them,
//!   through the cluster they serve;
//! - [`cache`]: hot-key detection and the never-stale hot-key cache, and the keys
//!   tracking clients read (CLIENT TRACKING's invalidations);
//! - [`locks`]: distributed-lock commands (Lua scripts, parked waiters, KEEPALIVE);
//! - [`scripts`]: the Lua script bodies seen (EVAL, SCRIPT LOAD), for EVALSHA anywhere;
//! - [`pubsub`]: subscribers, the shared backend subscriptions that serve them, message
//!   fan-out;
//! - [`wait`]: WAIT and WAITAOF, asked of the masters a client wrote to;
//! - [`reads`]: read policies, which reads go to a master's replicas and to which;
//! - [`audit`]: the audit log (logins, administrative and dangerous commands, reloads);
//! - [`migration`]: moving the data to another cluster (its configuration; `verify`).

pub mod acl;
pub mod audit;
pub mod cache;
pub mod colocate;
pub mod fleet;
pub mod locks;
pub mod migration;
pub mod pubsub;
pub mod ratelimit;
pub mod reads;
pub mod scripts;
pub mod stats;
pub mod wait;
