//! Pure SQL builders: every statement the operator sends is built here, from typed names,
//! for a given server [`Version`]. Identifiers are backquoted and string literals quoted, both
//! with backslash escapes (checked on 18.16: `` `x\`y` `` and `'it\'s'` round-trip).
//!
//! The unit tests pin the exact text of each statement, modern and 18.16 forms alike; the
//! modern forms cannot run on the 18.16 test server (see `tests/clickhouse/clients.rs`).

use std::fmt;

use super::version::{Capability, Version};

/// Databases that belong to the server and are never copied or dropped.
pub const SYSTEM_DATABASES: &[&str] = &["system", "information_schema", "INFORMATION_SCHEMA"];

/// Quotes an identifier with backquotes, escaping `\` and `` ` ``.
pub fn ident(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('`');
    for c in name.chars() {
        if c == '`' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('`');
    out
}

/// Quotes a string literal with single quotes, escaping `\` and `'`.
pub fn literal(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('\'');
    for c in value.chars() {
        if c == '\'' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('\'');
    out
}

/// A database name as ClickHouse reports it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DatabaseName(pub String);

impl fmt::Display for DatabaseName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&ident(&self.0))
    }
}

/// A table, view or dictionary: database and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TableName {
    /// The database the object is in.
    pub database: DatabaseName,
    /// The object's own name.
    pub name: String,
}

impl TableName {
    /// `database.name`, both unquoted.
    pub fn new(database: &str, name: &str) -> TableName {
        TableName {
            database: DatabaseName(database.to_string()),
            name: name.to_string(),
        }
    }
}

/// Displays as the quoted, qualified name `` `db`.`t` ``.
impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.database, ident(&self.name))
    }
}

/// A cluster name from `remote_servers`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClusterName(pub String);

/// A replica's name as in its `{replica}` macro (the name in Keeper under `<zk_path>/replicas`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReplicaMacro(pub String);

/// A shard's name as in its `{shard}` macro.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardMacro(pub String);

/// Where a discovery query reads a system table from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source<'a> {
    /// The server the query is sent to (on 18.16 every source replica is asked directly).
    Local,
    /// Every replica of the cluster through `clusterAllReplicas` (S1-09), with
    /// `skip_unavailable_shards = 1` (S1-15).
    AllReplicas(&'a ClusterName),
}

impl Source<'_> {
    fn table(&self, system_table: &str) -> String {
        match self {
            Source::Local => format!("system.{system_table}"),
            Source::AllReplicas(c) => {
                format!(
                    "clusterAllReplicas({}, system.{system_table})",
                    literal(&c.0)
                )
            }
        }
    }

    fn settings(&self, extra: &[&str]) -> String {
        let mut s: Vec<&str> = Vec::new();
        if matches!(self, Source::AllReplicas(_)) {
            s.push("skip_unavailable_shards = 1");
        }
        s.extend_from_slice(extra);
        if s.is_empty() {
            String::new()
        } else {
            format!(" SETTINGS {}", s.join(", "))
        }
    }
}

fn system_databases_list() -> String {
    SYSTEM_DATABASES
        .iter()
        .map(|d| literal(d))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `SELECT version()`.
pub fn select_version() -> &'static str {
    "SELECT version()"
}

/// The databases to copy: name and the engine clause to recreate it with
/// (`engine_full` from 22.12, `engine` below; S1-09, S1-10).
pub fn discover_databases(version: Version, from: Source<'_>) -> String {
    let engine = if version.supports(Capability::DatabaseEngineFull) {
        "engine_full"
    } else {
        "engine"
    };
    format!(
        "SELECT DISTINCT name, {engine} AS engine FROM {} WHERE name NOT IN ({}) ORDER BY name{}",
        from.table("databases"),
        system_databases_list(),
        from.settings(&[])
    )
}

/// The tables, views and dictionaries to copy, with what ordering needs: engine, engine_full
/// (Distributed targets), the create query (with the table UUID where the version has
/// them) and the dependencies the server knows (materialized views of a source).
pub fn discover_tables(version: Version, from: Source<'_>) -> String {
    let uuid = if version.supports(Capability::TableUuids) {
        vec!["show_table_uuid_in_table_create_query_if_not_nil = 1"]
    } else {
        vec![]
    };
    format!(
        "SELECT DISTINCT database, name, engine, engine_full, create_table_query, \
         dependencies_database, dependencies_table FROM {} \
         WHERE database NOT IN ({}) AND is_temporary = 0 AND create_table_query != '' \
         AND name NOT LIKE '.inner.%' AND name NOT LIKE '.inner_id.%' \
         ORDER BY database, name{}",
        from.table("tables"),
        system_databases_list(),
        from.settings(&uuid)
    )
}

/// The SQL user-defined functions to copy (S1-12); `None` where the version has none.
pub fn discover_functions(version: Version, from: Source<'_>) -> Option<String> {
    version
        .supports(Capability::SqlUserDefinedFunctions)
        .then(|| {
            format!(
                "SELECT DISTINCT name, create_query FROM {} WHERE origin = 'SQLUserDefined' \
                 ORDER BY name{}",
                from.table("functions"),
                from.settings(&[])
            )
        })
}

/// `CREATE DATABASE IF NOT EXISTS db ENGINE = <engine>`; `engine` is the clause the server
/// itself reported (`Ordinary`, `Atomic`, `Replicated('/p', '{shard}', '{replica}')`).
pub fn create_database(database: &DatabaseName, engine: &str) -> String {
    if engine.trim().is_empty() {
        format!("CREATE DATABASE IF NOT EXISTS {database}")
    } else {
        format!(
            "CREATE DATABASE IF NOT EXISTS {database} ENGINE = {}",
            engine.trim()
        )
    }
}

/// The object kinds whose `CREATE` is rewritten to `CREATE … IF NOT EXISTS` (S1-11, S1-12).
const CREATE_KINDS: &[&str] = &[
    "TABLE",
    "MATERIALIZED VIEW",
    "LIVE VIEW",
    "WINDOW VIEW",
    "VIEW",
    "DICTIONARY",
    "FUNCTION",
];

/// Rewrites a `create_table_query` / `create_query` to `CREATE <kind> IF NOT EXISTS …`, the
/// work Altinity does with `replaceRegexpOne` (S1-11). Idempotent; `None` for text that is
/// not a CREATE of a known kind (never sent then).
pub fn create_if_not_exists(create_query: &str) -> Option<String> {
    let q = create_query.trim();
    let rest = strip_keyword(q, "CREATE")?;
    let rest = rest.trim_start();
    for kind in CREATE_KINDS {
        let words: Vec<&str> = kind.split(' ').collect();
        let mut tail = rest;
        let mut ok = true;
        for w in &words {
            match strip_keyword(tail.trim_start(), w) {
                Some(t) => tail = t,
                None => {
                    ok = false;
                    break;
                }
            }
        }
        if !ok {
            continue;
        }
        let tail = tail.trim_start();
        let tail = strip_keyword(tail, "IF")
            .and_then(|t| strip_keyword(t.trim_start(), "NOT"))
            .and_then(|t| strip_keyword(t.trim_start(), "EXISTS"))
            .map_or(tail, str::trim_start);
        return Some(format!("CREATE {kind} IF NOT EXISTS {tail}"));
    }
    None
}

/// `s` without its leading keyword `kw` (case-insensitive, followed by a non-identifier char).
fn strip_keyword<'a>(s: &'a str, kw: &str) -> Option<&'a str> {
    let head = s.get(..kw.len())?;
    if !head.eq_ignore_ascii_case(kw) {
        return None;
    }
    let rest = &s[kw.len()..];
    match rest.chars().next() {
        Some(c) if c.is_ascii_alphanumeric() || c == '_' => None,
        _ => Some(rest),
    }
}

/// `SYSTEM SYNC REPLICA db.t [LIGHTWEIGHT]` (S0-25; plain form below 23.4, decision 17).
pub fn sync_replica(version: Version, table: &TableName) -> String {
    if version.supports(Capability::SyncReplicaLightweight) {
        format!("SYSTEM SYNC REPLICA {table} LIGHTWEIGHT")
    } else {
        format!("SYSTEM SYNC REPLICA {table}")
    }
}

/// How many parts this server still has to fetch from `replica` (queued `GET_PART` entries
/// whose source is that replica): none left means the replica can go down without stalling it.
pub fn fetches_from(replica: &ReplicaMacro) -> String {
    format!(
        "SELECT count() AS n FROM system.replication_queue WHERE type = 'GET_PART' AND source_replica = {}",
        literal(&replica.0)
    )
}

/// A server's glance at itself, in one statement (18.16 answers it as 26.x does): how many
/// hosts it lists in the cluster `cluster` of its `remote_servers` (`n`), its version (`v`),
/// and how many of its replicated tables are read-only or have lost their Keeper session
/// (`ro`; a table whose session expired turns read-only when its server next looks).
/// `system.replicas` reads these columns without asking Keeper.
pub fn server_glance(cluster: &ClusterName) -> String {
    format!(
        "SELECT count() AS n, version() AS v, \
         (SELECT count() FROM system.replicas WHERE is_readonly OR is_session_expired) AS ro \
         FROM system.clusters WHERE cluster = {}",
        literal(&cluster.0)
    )
}

/// Queries one replica of every shard of `cluster` through the `cluster` table function, which
/// uses the same connections as the cluster's Distributed tables; counts the shards answering.
pub fn shards_answering(cluster: &ClusterName) -> String {
    format!(
        "SELECT count() AS n FROM cluster({}, system.one)",
        literal(&cluster.0)
    )
}

/// Forgets the addresses a server resolved (decision 17: a pod that comes back with a new
/// address is otherwise unreachable from servers that cache DNS for good).
pub fn drop_dns_cache() -> &'static str {
    "SYSTEM DROP DNS CACHE"
}

/// The replicated tables of a server, with their Keeper path and replica name.
pub fn replicated_tables() -> &'static str {
    "SELECT database, table, zookeeper_path, replica_name FROM system.replicas \
     ORDER BY database, table"
}

/// The replicated tables of a server that are read-only (they have no Keeper session, or
/// Keeper refuses them their nodes), with their Keeper path and whether the session they had
/// expired; at most [`READ_ONLY_TABLES_LISTED`].
pub fn read_only_tables() -> String {
    format!(
        "SELECT database, table, zookeeper_path, is_session_expired FROM system.replicas \
         WHERE is_readonly ORDER BY database, table LIMIT {READ_ONLY_TABLES_LISTED}"
    )
}

/// How many read-only tables one look at a server lists.
pub const READ_ONLY_TABLES_LISTED: usize = 100;

/// Makes a replicated table open its Keeper session again now (decision 45), instead of at its
/// server's next retry.
pub fn restart_replica(table: &TableName) -> String {
    format!("SYSTEM RESTART REPLICA {table}")
}

/// Replication health of every replicated table on a server (S2-29 "Synced").
pub fn replication_status() -> &'static str {
    "SELECT database, table, is_readonly, queue_size, absolute_delay FROM system.replicas \
     ORDER BY database, table"
}

/// The DDL dictionaries of a leaving server (S1-17); `None` below 19.17, where dictionaries
/// come from configuration files and cannot be dropped.
pub fn discover_dictionaries(version: Version) -> Option<String> {
    version.supports(Capability::DdlDictionaries).then(|| {
        format!(
            "SELECT database, name FROM system.dictionaries WHERE database != '' \
             AND database NOT IN ({}) ORDER BY database, name",
            system_databases_list()
        )
    })
}

/// The MergeTree tables and views of a leaving server (S1-18).
pub fn discover_droppable_tables() -> String {
    format!(
        "SELECT database, name FROM system.tables WHERE database NOT IN ({}) \
         AND (engine LIKE '%MergeTree%' OR engine LIKE '%View%') AND is_temporary = 0 \
         AND name NOT LIKE '.inner.%' AND name NOT LIKE '.inner_id.%' ORDER BY database, name",
        system_databases_list()
    )
}

/// The Replicated databases of a server (S1-19).
pub fn discover_replicated_databases() -> &'static str {
    "SELECT name FROM system.databases WHERE engine = 'Replicated' ORDER BY name"
}

/// `DROP DICTIONARY IF EXISTS db.d` (S1-17).
pub fn drop_dictionary(dictionary: &TableName) -> String {
    format!("DROP DICTIONARY IF EXISTS {dictionary}")
}

/// `DROP TABLE IF EXISTS db.t SYNC` (S1-18); without `SYNC` on servers that lack it (18.16
/// answers `Syntax error` to both `SYNC` and `NO DELAY`; its drops are synchronous anyway:
/// the replica's node under `<zk_path>/replicas` is gone when the statement returns).
pub fn drop_table(version: Version, table: &TableName) -> String {
    if version.supports(Capability::DropSync) {
        format!("DROP TABLE IF EXISTS {table} SYNC")
    } else {
        format!("DROP TABLE IF EXISTS {table}")
    }
}

/// `DROP DATABASE IF EXISTS db SYNC` for a Replicated database (S1-19).
pub fn drop_database(version: Version, database: &DatabaseName) -> String {
    if version.supports(Capability::DropSync) {
        format!("DROP DATABASE IF EXISTS {database} SYNC")
    } else {
        format!("DROP DATABASE IF EXISTS {database}")
    }
}

/// `SYSTEM DROP REPLICA 'r' FROM TABLE db.t`, run on a survivor (S0-27, S1-20); `None` where
/// the version lacks it (decision 2: then the leaving replica dropped its own tables).
pub fn drop_replica(version: Version, replica: &ReplicaMacro, table: &TableName) -> Option<String> {
    version.supports(Capability::SystemDropReplica).then(|| {
        format!(
            "SYSTEM DROP REPLICA {} FROM TABLE {table}",
            literal(&replica.0)
        )
    })
}

/// `SYSTEM DROP REPLICA 'r' FROM ZKPATH '<path>'`: for a table of a shard that is gone, by its
/// Keeper path, from a server of another shard (S0-27); `None` where the version lacks it.
pub fn drop_replica_from_path(
    version: Version,
    replica: &ReplicaMacro,
    path: &str,
) -> Option<String> {
    version.supports(Capability::SystemDropReplica).then(|| {
        format!(
            "SYSTEM DROP REPLICA {} FROM ZKPATH {}",
            literal(&replica.0),
            literal(path)
        )
    })
}

/// The replicated MergeTree tables of a server with their engine clause (whose first argument
/// is the Keeper path before the macros are expanded).
pub fn replicated_engines() -> &'static str {
    "SELECT database, name, engine_full FROM system.tables \
     WHERE engine LIKE 'Replicated%MergeTree' ORDER BY database, name"
}

/// The UUID of a table (for a `{uuid}` in its Keeper path).
pub fn table_uuid(table: &TableName) -> String {
    format!(
        "SELECT toString(uuid) AS uuid FROM system.tables WHERE database = {} AND name = {}",
        literal(&table.database.0),
        literal(&table.name)
    )
}

/// A server's macros.
pub fn macros() -> &'static str {
    "SELECT macro, substitution FROM system.macros"
}

/// `SYSTEM DROP DATABASE REPLICA 'shard|replica' FROM DATABASE db` (S1-20); `None` where the
/// version lacks it.
pub fn drop_database_replica(
    version: Version,
    shard: &ShardMacro,
    replica: &ReplicaMacro,
    database: &DatabaseName,
) -> Option<String> {
    version
        .supports(Capability::SystemDropDatabaseReplica)
        .then(|| {
            format!(
                "SYSTEM DROP DATABASE REPLICA {} FROM DATABASE {database}",
                literal(&format!("{}|{}", shard.0, replica.0))
            )
        })
}

/// The children of a Keeper node, read through `system.zookeeper`.
pub fn zookeeper_children(path: &str) -> String {
    format!(
        "SELECT name FROM system.zookeeper WHERE path = {} ORDER BY name",
        literal(path)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: Version = Version {
        major: 18,
        minor: 16,
        patch: 1,
        build: 0,
    };
    const NEW: Version = Version {
        major: 24,
        minor: 8,
        patch: 4,
        build: 13,
    };

    fn t(db: &str, name: &str) -> TableName {
        TableName::new(db, name)
    }

    #[test]
    fn identifiers_and_literals_are_quoted_and_escaped() {
        assert_eq!(ident("events"), "`events`");
        assert_eq!(ident("we`ird\\name"), "`we\\`ird\\\\name`");
        assert_eq!(literal("it's"), "'it\\'s'");
        assert_eq!(literal("a\\b"), "'a\\\\b'");
        assert_eq!(literal("1|r3"), "'1|r3'");
        assert_eq!(t("db`1", "t").to_string(), "`db\\`1`.`t`");
        // An injection attempt stays one literal.
        assert_eq!(literal("x'; DROP TABLE t; --"), "'x\\'; DROP TABLE t; --'");
    }

    /// S1-11 / S1-27: every kind becomes CREATE … IF NOT EXISTS, idempotently.
    #[test]
    fn create_queries_are_rewritten_to_if_not_exists() {
        let cases = [
            (
                "CREATE TABLE db1.events ( d Date) ENGINE = ReplicatedMergeTree('/p', '{replica}', d, id, 8192)",
                "CREATE TABLE IF NOT EXISTS db1.events ( d Date) ENGINE = ReplicatedMergeTree('/p', '{replica}', d, id, 8192)",
            ),
            (
                "CREATE TABLE db.t UUID '5d0f…' (x UInt8) ENGINE = MergeTree ORDER BY x",
                "CREATE TABLE IF NOT EXISTS db.t UUID '5d0f…' (x UInt8) ENGINE = MergeTree ORDER BY x",
            ),
            (
                "CREATE VIEW db1.v ( id UInt64) AS SELECT id FROM db1.events ",
                "CREATE VIEW IF NOT EXISTS db1.v ( id UInt64) AS SELECT id FROM db1.events",
            ),
            (
                "CREATE MATERIALIZED VIEW db1.mv ( id UInt64) ENGINE = MergeTree ORDER BY id AS SELECT id FROM db1.ev2",
                "CREATE MATERIALIZED VIEW IF NOT EXISTS db1.mv ( id UInt64) ENGINE = MergeTree ORDER BY id AS SELECT id FROM db1.ev2",
            ),
            (
                "CREATE DICTIONARY db.d (k UInt64, v String) PRIMARY KEY k SOURCE(CLICKHOUSE(TABLE 's')) LAYOUT(FLAT()) LIFETIME(0)",
                "CREATE DICTIONARY IF NOT EXISTS db.d (k UInt64, v String) PRIMARY KEY k SOURCE(CLICKHOUSE(TABLE 's')) LAYOUT(FLAT()) LIFETIME(0)",
            ),
            (
                "CREATE FUNCTION linear AS (x, k, b) -> ((k * x) + b)",
                "CREATE FUNCTION IF NOT EXISTS linear AS (x, k, b) -> ((k * x) + b)",
            ),
            (
                "create table if not exists db.t (x UInt8) ENGINE = Memory",
                "CREATE TABLE IF NOT EXISTS db.t (x UInt8) ENGINE = Memory",
            ),
        ];
        for (given, want) in cases {
            let got = create_if_not_exists(given);
            assert_eq!(got.as_deref(), Some(want), "{given}");
            assert_eq!(
                create_if_not_exists(want).as_deref(),
                Some(want),
                "idempotent"
            );
        }
        for bad in [
            "",
            "ATTACH TABLE t",
            "CREATED TABLE x",
            "CREATE TABLESPACE x",
            "SELECT 1",
        ] {
            assert_eq!(create_if_not_exists(bad), None, "{bad}");
        }
    }

    /// S1-09 / S1-10 / S1-15: databases cluster-wide on modern servers, with engine_full from
    /// 22.12 and skip_unavailable_shards; each replica directly with `engine` on 18.16.
    #[test]
    fn database_discovery_follows_the_server_version() {
        let c = ClusterName("c1".into());
        assert_eq!(
            discover_databases(NEW, Source::AllReplicas(&c)),
            "SELECT DISTINCT name, engine_full AS engine FROM clusterAllReplicas('c1', system.databases) \
             WHERE name NOT IN ('system', 'information_schema', 'INFORMATION_SCHEMA') ORDER BY name \
             SETTINGS skip_unavailable_shards = 1"
        );
        assert_eq!(
            discover_databases(Version::new(22, 11), Source::AllReplicas(&c)),
            "SELECT DISTINCT name, engine AS engine FROM clusterAllReplicas('c1', system.databases) \
             WHERE name NOT IN ('system', 'information_schema', 'INFORMATION_SCHEMA') ORDER BY name \
             SETTINGS skip_unavailable_shards = 1"
        );
        assert_eq!(
            discover_databases(OLD, Source::Local),
            "SELECT DISTINCT name, engine AS engine FROM system.databases \
             WHERE name NOT IN ('system', 'information_schema', 'INFORMATION_SCHEMA') ORDER BY name"
        );
    }

    /// S1-11 / S1-15: table discovery keeps UUIDs where the version has them.
    #[test]
    fn table_discovery_keeps_uuids_where_the_version_has_them() {
        let c = ClusterName("c1".into());
        let cols = "SELECT DISTINCT database, name, engine, engine_full, create_table_query, \
                    dependencies_database, dependencies_table FROM ";
        let filter = " WHERE database NOT IN ('system', 'information_schema', 'INFORMATION_SCHEMA') \
                      AND is_temporary = 0 AND create_table_query != '' AND name NOT LIKE '.inner.%' \
                      AND name NOT LIKE '.inner_id.%' ORDER BY database, name";
        assert_eq!(
            discover_tables(NEW, Source::AllReplicas(&c)),
            format!(
                "{cols}clusterAllReplicas('c1', system.tables){filter} SETTINGS skip_unavailable_shards = 1, \
                 show_table_uuid_in_table_create_query_if_not_nil = 1"
            )
        );
        assert_eq!(
            discover_tables(NEW, Source::Local),
            format!(
                "{cols}system.tables{filter} SETTINGS show_table_uuid_in_table_create_query_if_not_nil = 1"
            )
        );
        assert_eq!(
            discover_tables(OLD, Source::Local),
            format!("{cols}system.tables{filter}")
        );
    }

    /// S1-12: functions only where SQL UDFs exist.
    #[test]
    fn functions_are_discovered_only_where_udfs_exist() {
        let c = ClusterName("c1".into());
        assert_eq!(discover_functions(OLD, Source::Local), None);
        assert_eq!(
            discover_functions(NEW, Source::AllReplicas(&c)).as_deref(),
            Some(
                "SELECT DISTINCT name, create_query FROM clusterAllReplicas('c1', system.functions) \
                 WHERE origin = 'SQLUserDefined' ORDER BY name SETTINGS skip_unavailable_shards = 1"
            )
        );
    }

    #[test]
    fn create_database_uses_the_reported_engine_clause() {
        let db = DatabaseName("db2".into());
        assert_eq!(
            create_database(&db, "Ordinary"),
            "CREATE DATABASE IF NOT EXISTS `db2` ENGINE = Ordinary"
        );
        assert_eq!(
            create_database(
                &db,
                "Replicated('/clickhouse/databases/db2', '{shard}', '{replica}')"
            ),
            "CREATE DATABASE IF NOT EXISTS `db2` ENGINE = Replicated('/clickhouse/databases/db2', '{shard}', '{replica}')"
        );
        assert_eq!(
            create_database(&db, " "),
            "CREATE DATABASE IF NOT EXISTS `db2`"
        );
    }

    /// S0-25 / decision 17: LIGHTWEIGHT where it exists, the plain form on 18.16.
    #[test]
    fn sync_replica_is_lightweight_where_the_version_has_it() {
        let tb = t("db1", "events");
        assert_eq!(
            sync_replica(NEW, &tb),
            "SYSTEM SYNC REPLICA `db1`.`events` LIGHTWEIGHT"
        );
        assert_eq!(sync_replica(OLD, &tb), "SYSTEM SYNC REPLICA `db1`.`events`");
    }

    /// S1-17 / S1-18 / S1-19: the drops of a leaving replica, modern and 18.16 forms.
    #[test]
    fn leaving_replica_drops_wait_with_sync_where_the_version_has_it() {
        assert_eq!(
            drop_dictionary(&t("db", "d")),
            "DROP DICTIONARY IF EXISTS `db`.`d`"
        );
        assert_eq!(
            drop_table(NEW, &t("db1", "v")),
            "DROP TABLE IF EXISTS `db1`.`v` SYNC"
        );
        assert_eq!(
            drop_table(OLD, &t("db1", "v")),
            "DROP TABLE IF EXISTS `db1`.`v`"
        );
        let db = DatabaseName("rdb".into());
        assert_eq!(
            drop_database(NEW, &db),
            "DROP DATABASE IF EXISTS `rdb` SYNC"
        );
        assert_eq!(drop_database(OLD, &db), "DROP DATABASE IF EXISTS `rdb`");
        assert_eq!(discover_dictionaries(OLD), None);
        assert_eq!(
            discover_dictionaries(NEW).as_deref(),
            Some(
                "SELECT database, name FROM system.dictionaries WHERE database != '' AND database NOT IN \
                 ('system', 'information_schema', 'INFORMATION_SCHEMA') ORDER BY database, name"
            )
        );
        assert_eq!(
            discover_droppable_tables(),
            "SELECT database, name FROM system.tables WHERE database NOT IN \
             ('system', 'information_schema', 'INFORMATION_SCHEMA') AND (engine LIKE '%MergeTree%' OR \
             engine LIKE '%View%') AND is_temporary = 0 AND name NOT LIKE '.inner.%' AND name NOT LIKE \
             '.inner_id.%' ORDER BY database, name"
        );
    }

    /// S0-27 / S1-20: Keeper clean-up from a survivor where the version has it.
    #[test]
    fn keeper_cleanup_statements_exist_only_where_the_version_has_them() {
        let r = ReplicaMacro("c1-0-2".into());
        let s = ShardMacro("0".into());
        assert_eq!(
            drop_replica(NEW, &r, &t("db1", "events")).as_deref(),
            Some("SYSTEM DROP REPLICA 'c1-0-2' FROM TABLE `db1`.`events`")
        );
        assert_eq!(drop_replica(OLD, &r, &t("db1", "events")), None);
        assert_eq!(
            drop_database_replica(NEW, &s, &r, &DatabaseName("rdb".into())).as_deref(),
            Some("SYSTEM DROP DATABASE REPLICA '0|c1-0-2' FROM DATABASE `rdb`")
        );
        assert_eq!(
            drop_database_replica(OLD, &s, &r, &DatabaseName("rdb".into())),
            None
        );
        assert_eq!(
            drop_replica(NEW, &ReplicaMacro("x'y".into()), &t("d", "t")).as_deref(),
            Some("SYSTEM DROP REPLICA 'x\\'y' FROM TABLE `d`.`t`")
        );
    }

    #[test]
    fn status_and_keeper_queries() {
        assert_eq!(
            zookeeper_children("/clickhouse/tables/1/db1/events/replicas"),
            "SELECT name FROM system.zookeeper WHERE path = '/clickhouse/tables/1/db1/events/replicas' ORDER BY name"
        );
        assert!(replication_status().contains("absolute_delay"));
        assert_eq!(
            restart_replica(&t("db`1", "t")),
            "SYSTEM RESTART REPLICA `db\\`1`.`t`"
        );
        assert!(read_only_tables().contains("is_session_expired"));
        assert!(replicated_tables().contains("zookeeper_path"));
        // decision 53: a ready cluster's one statement per server sees a lost Keeper session
        let glance = server_glance(&ClusterName("c'1".into()));
        assert!(glance.ends_with("WHERE cluster = 'c\\'1'"), "{glance}");
        assert!(
            glance.contains("WHERE is_readonly OR is_session_expired) AS ro"),
            "{glance}"
        );
    }
}
