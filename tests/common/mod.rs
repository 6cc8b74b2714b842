//! Shared integration-test harness for heatshield.
//!
//! It owns every external process an integration test needs and guarantees they are torn
//! down again, and it holds the one Redis client the tests speak RESP with:
//!
//! * [`ports`] – [`free_port`]: ports in `20000..=29999` on `127.0.0.1`, never twice per
//!   process, with the cluster-bus port `P + 10000` free too.
//! * [`redis`] – [`RedisServer`], [`RedisStandalone`], [`RedisCluster`] (3 masters, 3
//!   replicas, topology queries, `kill`, `wait_ok`), and the `INFO` helpers.
//! * [`proxy`] – [`Proxy`], the `heatshield` binary built by cargo (with its own metrics
//!   port), [`run_bin`], [`config_file`].
//! * [`client`] – the RESP2/RESP3 client: [`Conn`](client::Conn), replies as
//!   [`V`](client::V) / [`Reply`](client::Reply), one-shot [`cmd`] / [`cmd_text`].
//! * [`http`] – [`http_get`] for `/metrics` and the Prometheus API.
//! * [`slots`] – [`crc16`] / [`key_slot`], `CLUSTER SLOTS`, [`SlotOwners`].
//! * [`fixtures`] – [`Shared`], [`ClusterEnv`], [`shared_traffic`] / [`exclusive_traffic`].
//! * [`process`] – [`wait_until`] and the child-process plumbing of the above.
//!
//! Every process is killed with SIGKILL (and reaped) on `Drop`. If the drop happens while
//! the test thread is panicking, the tail of the process log is printed to stderr so
//! failures are diagnosable from `cargo test` output.

#![allow(dead_code)]

pub mod client;
pub mod fixtures;
pub mod http;
pub mod ports;
pub mod process;
pub mod proxy;
pub mod redis;
pub mod slots;
pub mod tls;

// Not every test binary uses every name.
#[allow(unused_imports)]
pub use self::{
    client::{Resp, cmd, cmd_text, parse_resp, try_cmd},
    fixtures::{ClusterEnv, DiffEnv, Shared, exclusive_traffic, shared_traffic},
    http::{http_get, try_http_get},
    ports::free_port,
    process::wait_until,
    proxy::{Proxy, config_file, run_bin},
    redis::{RedisCluster, RedisServer, RedisStandalone, cmdstat_calls, info_field},
    slots::{SLOTS, SlotOwners, crc16, key_slot},
};
