//! Ports, names and prefixes that the resource types, the builders and the servers agree on,
//! below every layer: the API's validation checks a spec against them without reaching up into
//! the builders that use them.

/// HTTP interface of a ClickHouse server (`/ping`, SQL over HTTP).
pub const HTTP_PORT: i32 = 8123;
/// Native TCP interface of a ClickHouse server.
pub const TCP_PORT: i32 = 9000;
/// Interserver HTTP port: replicas fetch parts from each other here.
pub const INTERSERVER_HTTP_PORT: i32 = 9009;
/// HTTPS interface, served when `spec.tls.enabled`.
pub const HTTPS_PORT: i32 = 8443;
/// Native TCP interface over TLS, served when `spec.tls.enabled`.
pub const TCP_SECURE_PORT: i32 = 9440;
/// The MySQL wire protocol (`spec.protocols.mysql`), the images' default port.
pub const MYSQL_PORT: i32 = 9004;
/// The PostgreSQL wire protocol (`spec.protocols.postgresql`), the images' default port.
pub const POSTGRESQL_PORT: i32 = 9005;
/// gRPC (`spec.protocols.grpc`), the port of ClickHouse's example configuration.
pub const GRPC_PORT: i32 = 9100;
/// Interserver HTTPS port, used instead of 9009 when `spec.tls.required`.
pub const INTERSERVER_HTTPS_PORT: i32 = 9010;
/// See [`secret_setting_env`]; `spec.pod.env` cannot name such a variable.
pub const SECRET_SETTING_ENV_PREFIX: &str = "CLICKHOUSE_SECRET_SETTING_";
/// The cluster domain unless `spec.clusterDomain` names another.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";
/// Prefix of the files the operator generates; user files may not use it.
pub const OPERATOR_FILE_PREFIX: &str = "00-operator-";
/// Quota given to every generated user.
pub const DEFAULT_QUOTA: &str = "default";

/// The tables that get `ttlDays` by default: the system logs the images' `config.xml` turns on
/// in every version from 21.1, each with an `event_date` column.
pub const DEFAULT_TABLES: &[&str] = &[
    "query_log",
    "query_thread_log",
    "part_log",
    "trace_log",
    "metric_log",
    "asynchronous_metric_log",
];

/// Further tables with an `event_date` column that `spec.systemLogs.tables` may name (and so
/// turn on where the image has them off). `opentelemetry_span_log` is not one: the images
/// configure it with an `engine`, beside which ClickHouse refuses a `ttl`.
pub const OPTIONAL_TABLES: &[&str] = &[
    "text_log",
    "query_views_log",
    "processors_profile_log",
    "session_log",
    "zookeeper_log",
    "asynchronous_insert_log",
    "backup_log",
    "blob_storage_log",
    "error_log",
    "query_metric_log",
    "crash_log",
];

/// Whether `spec.systemLogs.tables` may name `table`.
pub fn is_known(table: &str) -> bool {
    DEFAULT_TABLES.contains(&table) || OPTIONAL_TABLES.contains(&table)
}

/// Whether `name` can be an XML element name as ClickHouse config uses them: a letter or `_`
/// first, then letters, digits, `_`, `-` and `.`.
pub fn is_element_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}
