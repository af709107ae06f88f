//! clickhouse-operator: keeps ClickHouse clusters on Kubernetes in the state their
//! `ClickHouseCluster` resources declare.
//!
//! Every reconcile is observe → decide (pure) → act → report; see `controller` and `plan`.

pub mod api;
pub mod backup;
pub mod clickhouse;
pub mod controller;
pub mod conventions;
pub mod exporter;
pub mod model;
pub mod plan;
pub mod runtime;
#[cfg(test)]
pub(crate) mod testing;
pub mod util;
pub mod version;
