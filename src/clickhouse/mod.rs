//! The SQL side of the operator: an HTTP client per replica, the server version and what it
//! can do, pure SQL builders, schema migration on scale-out (S1-01…S1-27) and the replica
//! operations of scale-in and rollouts (S0-21…S0-30).
//!
//! - [`client`]: [`Client`] talks to one replica over HTTP; errors keep ClickHouse's code;
//!   [`ClientConfig::for_replica`] is how any client reaches a cluster's server.
//! - [`keeper`]: a small ZooKeeper-protocol client of one Keeper member (its membership).
//! - [`lexer`]: tokens of statements the operator did not write (restores), and summaries of
//!   statements that hold no string literal (errors and logs).
//! - [`version`]: [`Version`] and the one table of [`version::CAPABILITIES`].
//! - [`sql`]: every statement, built from typed names, per version.
//! - [`schemer`]: [`schemer::migrate_new_host`] copies the schema onto a new host.
//! - [`metrics`]: what the metrics exporter asks each server.
//! - [`replica`]: sync before scale-in, drops on the leaving replica, Keeper clean-up from a
//!   survivor, and the catch-up check of rollouts.

pub mod backup;
pub mod client;
pub mod keeper;
pub mod lexer;
pub mod metrics;
pub mod replica;
pub mod schemer;
pub mod sql;

/// The server versions and what each can do live below every layer (`crate::version`).
pub use crate::version::{self, Capability, Version};
pub use client::{
    Client, ClientConfig, Connections, Credentials, Endpoint, Error, ErrorCode, QueryOptions,
    ReplicaAddress, RetryPolicy, Tls,
};
