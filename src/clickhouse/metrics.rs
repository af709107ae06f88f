//! The statements the metrics exporter sends each server, as its read-only account (the 26.x
//! engine runs them under that account's grants in `tests/modern_config/accounts.rs`).

/// Current figures.
pub const METRICS: &str = "SELECT metric, toFloat64(value) AS v FROM system.metrics";
/// Counters.
pub const EVENTS: &str = "SELECT event, toFloat64(value) AS v FROM system.events";
/// Figures computed in the background.
pub const ASYNCHRONOUS_METRICS: &str =
    "SELECT metric, toFloat64(value) AS v FROM system.asynchronous_metrics";
/// Replication health per table.
pub const REPLICAS: &str = "SELECT database, table, toFloat64(is_readonly) AS ro, \
    toFloat64(is_session_expired) AS expired, toFloat64(queue_size) AS queue, \
    toFloat64(absolute_delay) AS delay FROM system.replicas";
/// Active parts per table and the most in one partition.
pub const PARTS: &str = "SELECT database, table, toFloat64(sum(c)) AS parts, \
    toFloat64(max(c)) AS most FROM (SELECT database, table, partition_id, count() AS c \
    FROM system.parts WHERE active GROUP BY database, table, partition_id) \
    GROUP BY database, table";
/// Space per disk (19.15 and later).
pub const DISKS: &str = "SELECT name, toFloat64(free_space) AS free, toFloat64(total_space) AS total \
     FROM system.disks";
/// Every statement, in the order sent.
pub const ALL: [&str; 6] = [
    METRICS,
    EVENTS,
    ASYNCHRONOUS_METRICS,
    REPLICAS,
    PARTS,
    DISKS,
];
