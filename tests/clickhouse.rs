//! Integration tests of `clickhouse_operator::clickhouse` against real servers: Debian's
//! ClickHouse 18.16 and ZooKeeper 3.8, started by `clickhouse/harness.rs` on loopback
//! addresses.
//!
//! What 18.16 cannot run, and is therefore proven by the exact-SQL unit tests in
//! `src/clickhouse/sql.rs` instead (decision 17): `SYSTEM SYNC REPLICA … LIGHTWEIGHT`,
//! `SYSTEM DROP REPLICA`, `SYSTEM DROP DATABASE REPLICA`, `DROP … SYNC`, `clusterAllReplicas`
//! discovery with `skip_unavailable_shards`, `engine_full` for databases, table UUIDs,
//! `CREATE FUNCTION`, DDL dictionaries and Replicated databases — 18.16 answers a syntax
//! error or "Unknown table function" (see
//! `modern_statements_are_refused_by_18_16_so_the_fallbacks_are_chosen` in
//! `clickhouse/clients.rs`). The "replica is active" refusal of `SYSTEM DROP REPLICA` cannot
//! occur on 18.16 for the same reason; its classification is unit-tested in
//! `src/clickhouse/client.rs`.
//!
//! Where things are: `clickhouse/harness.rs` starts the servers and has what the tests share (one
//! cluster at a time, the fixture of an existing shard); `clickhouse/replicas.rs` has the tests of
//! what a joining replica or shard gets and what a leaving one leaves behind;
//! `clickhouse/clients.rs` those of the operator's clients (the statements per version, retries,
//! HTTPS, the ZooKeeper protocol).

#[path = "clickhouse/harness.rs"]
mod harness;

#[path = "clickhouse/clients.rs"]
mod clients;
#[path = "clickhouse/replicas.rs"]
mod replicas;
