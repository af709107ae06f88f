//! Replica operations of scale-in (S0-25, S0-27, decision 2) and of rollouts
//! (S2-29 "Synced"):
//!
//! 1. [`sync_shard`] on the shard's backup replica: `SYSTEM SYNC REPLICA` every replicated
//!    table (`LIGHTWEIGHT` from 23.4), each with a deadline (S0-25, S1-21).
//! 2. [`drop_leaving_objects`] on the leaving replica while it still runs: its dictionaries,
//!    MergeTree tables and views, then its Replicated databases (S1-17…S1-19). Dropping a
//!    replicated table removes the replica's own node under `<zk_path>/replicas`.
//! 3. [`drop_replica_metadata`] from a survivor: `SYSTEM DROP REPLICA` / `SYSTEM DROP DATABASE
//!    REPLICA` for whatever the leaving replica left in Keeper (S0-27, S1-20), where the
//!    server has them; a "replica is active" refusal is retried and, if it persists,
//!    returned as a retryable error. When the replica's whole shard is gone,
//!    [`drop_shard_replica_metadata`] does it from a server of another shard, by the paths the
//!    shard's tables had.
//! 4. [`replication_lag`] on a restarted replica: read-only tables, queue and delay.

use std::collections::BTreeMap;
use std::time::Duration;

use super::client::{Client, Error, QueryOptions, Row};
use super::sql::{self, ClusterName, DatabaseName, ReplicaMacro, ShardMacro, TableName};
use super::version::{Capability, Version};

/// A replicated table on one server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicatedTable {
    /// The table.
    pub table: TableName,
    /// Its Keeper path (macros expanded).
    pub zookeeper_path: String,
    /// This server's replica name in that path.
    pub replica: ReplicaMacro,
}

/// The replicated tables of a server (`system.replicas`).
pub async fn replicated_tables(client: &Client) -> Result<Vec<ReplicatedTable>, Error> {
    let q = sql::replicated_tables();
    let rows = client.query(q, &QueryOptions::new().retry(true)).await?;
    rows.decode(client.endpoint(), q, |r| {
        Ok(ReplicatedTable {
            table: TableName::new(r.str("database")?, r.str("table")?),
            zookeeper_path: r.str("zookeeper_path")?.to_string(),
            replica: ReplicaMacro(r.str("replica_name")?.to_string()),
        })
    })
}

/// Runs `SYSTEM SYNC REPLICA` for every replicated table of `backup` (the shard's backup
/// replica), one after the other, each bounded by `timeout` (server side through
/// `receive_timeout`, client side through the HTTP timeout). The first failure or timeout
/// ends it: the caller deletes nothing then (S0-25). Returns the tables synced.
pub async fn sync_shard(backup: &Client, timeout: Duration) -> Result<Vec<TableName>, Error> {
    let version = backup.version().await?;
    let tables = replicated_tables(backup).await?;
    let secs = timeout.as_secs().max(1);
    let options = QueryOptions::new()
        .setting("receive_timeout", secs)
        .timeout(timeout + Duration::from_secs(5));
    let mut synced = Vec::with_capacity(tables.len());
    for t in tables {
        backup
            .exec(&sql::sync_replica(version, &t.table), &options)
            .await?;
        synced.push(t.table);
    }
    Ok(synced)
}

/// What [`drop_leaving_objects`] dropped on the leaving replica, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DroppedObjects {
    /// `DROP DICTIONARY` (none below 19.17: no DDL dictionaries).
    pub dictionaries: Vec<TableName>,
    /// `DROP TABLE … [SYNC]`: MergeTree tables and views.
    pub tables: Vec<TableName>,
    /// `DROP DATABASE … [SYNC]`: Replicated databases.
    pub databases: Vec<DatabaseName>,
}

/// Drops the leaving replica's dictionaries, MergeTree tables and views, then its Replicated
/// databases, on the leaving replica itself (decision 2, S1-16…S1-19). Idempotent (`IF
/// EXISTS`); each statement retried.
pub async fn drop_leaving_objects(leaving: &Client) -> Result<DroppedObjects, Error> {
    let version = leaving.version().await?;
    let retry = QueryOptions::new().retry(true);
    let mut dropped = DroppedObjects::default();
    if let Some(q) = sql::discover_dictionaries(version) {
        let rows = leaving.query(&q, &retry).await?;
        for d in rows.decode(leaving.endpoint(), &q, table_name)? {
            leaving.exec(&sql::drop_dictionary(&d), &retry).await?;
            dropped.dictionaries.push(d);
        }
    }
    let q = sql::discover_droppable_tables();
    let rows = leaving.query(&q, &retry).await?;
    let mut tables = rows.decode(leaving.endpoint(), &q, table_name)?;
    // Views and materialized views first, so no view outlives its source mid-way.
    let views = list_views(leaving).await?;
    tables.sort_by_key(|t| !views.contains(t));
    for t in tables {
        leaving.exec(&sql::drop_table(version, &t), &retry).await?;
        dropped.tables.push(t);
    }
    let q = sql::discover_replicated_databases();
    let rows = leaving.query(q, &retry).await?;
    for d in rows.decode(leaving.endpoint(), q, |r| {
        Ok(DatabaseName(r.str("name")?.to_string()))
    })? {
        leaving
            .exec(&sql::drop_database(version, &d), &retry)
            .await?;
        dropped.databases.push(d);
    }
    Ok(dropped)
}

fn table_name(r: &Row<'_>) -> Result<TableName, String> {
    Ok(TableName::new(r.str("database")?, r.str("name")?))
}

async fn list_views(client: &Client) -> Result<Vec<TableName>, Error> {
    let q = "SELECT database, name FROM system.tables WHERE engine LIKE '%View%'";
    let rows = client.query(q, &QueryOptions::new().retry(true)).await?;
    rows.decode(client.endpoint(), q, table_name)
}

/// "No node" (Keeper) or "does not exist": what was to be removed or read is not there.
fn is_absent(e: &Error) -> bool {
    match e {
        Error::Server { message, .. } => {
            message.contains("No node")
                || message.contains("does not exist")
                || message.contains("doesn't exist")
        }
        _ => false,
    }
}

/// The replica that left, as Keeper knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeavingReplica {
    /// Its `{shard}` macro (for Replicated databases: `shard|replica`).
    pub shard: ShardMacro,
    /// Its `{replica}` macro.
    pub replica: ReplicaMacro,
}

/// What [`drop_replica_metadata`] found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeeperCleanup {
    /// Tables whose Keeper node of the leaving replica was dropped with `SYSTEM DROP REPLICA`.
    pub dropped: Vec<TableName>,
    /// Replicated databases whose replica was dropped with `SYSTEM DROP DATABASE REPLICA`.
    pub dropped_database_replicas: Vec<DatabaseName>,
    /// Tables that still list the leaving replica in Keeper and that this server version
    /// cannot clean (no `SYSTEM DROP REPLICA`): to be reported in a status condition
    /// (decision 2), never written to Keeper directly.
    pub left_behind: Vec<TableName>,
    /// The Keeper node of the leaving replica for each table of `left_behind`.
    pub left_paths: Vec<String>,
}

impl KeeperCleanup {
    /// Whether nothing of the leaving replica is left in Keeper.
    pub fn is_clean(&self) -> bool {
        self.left_behind.is_empty()
    }
}

/// From a surviving replica of the same shard: removes the leaving replica's Keeper metadata
/// for every replicated table where it is still registered (read through `system.zookeeper`,
/// so the statement only runs where needed and the step is idempotent), and its replica of
/// every Replicated database (S0-27, S1-20). A "replica is active" refusal is retried by the
/// client's policy and then returned (retryable): the leaving server must stop first.
pub async fn drop_replica_metadata(
    survivor: &Client,
    leaving: &LeavingReplica,
) -> Result<KeeperCleanup, Error> {
    let version: Version = survivor.version().await?;
    let retry = QueryOptions::new().retry(true);
    let mut cleanup = KeeperCleanup::default();
    for t in replicated_tables(survivor).await? {
        let path = format!("{}/replicas", t.zookeeper_path.trim_end_matches('/'));
        if !keeper_children(survivor, &path)
            .await?
            .contains(&leaving.replica.0)
        {
            continue;
        }
        match sql::drop_replica(version, &leaving.replica, &t.table) {
            Some(statement) => {
                tracing::info!(endpoint = %survivor.endpoint(), replica = %leaving.replica.0, table = %t.table, "Drop replica");
                survivor.exec(&statement, &retry).await?;
                cleanup.dropped.push(t.table);
            }
            None => {
                cleanup
                    .left_paths
                    .push(format!("{path}/{}", leaving.replica.0));
                cleanup.left_behind.push(t.table);
            }
        }
    }
    drop_database_replicas(survivor, version, leaving, &mut cleanup).await?;
    Ok(cleanup)
}

/// The leaving replica's replica of every Replicated database `server` has, dropped from it.
async fn drop_database_replicas(
    server: &Client,
    version: Version,
    leaving: &LeavingReplica,
    cleanup: &mut KeeperCleanup,
) -> Result<(), Error> {
    if !version.supports(Capability::ReplicatedDatabase) {
        return Ok(());
    }
    let retry = QueryOptions::new().retry(true);
    let q = sql::discover_replicated_databases();
    let rows = server.query(q, &retry).await?;
    let databases = rows.decode(server.endpoint(), q, |r| {
        Ok(DatabaseName(r.str("name")?.to_string()))
    })?;
    for d in databases {
        if let Some(statement) =
            sql::drop_database_replica(version, &leaving.shard, &leaving.replica, &d)
        {
            tracing::info!(endpoint = %server.endpoint(), replica = %leaving.replica.0, database = %d, "Drop replica");
            match server.exec(&statement, &retry).await {
                Ok(()) => cleanup.dropped_database_replicas.push(d),
                // Already gone: nothing of it is left, which is the goal.
                Err(e) if is_absent(&e) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// From a server of another shard, when the leaving replica's whole shard is gone: its Keeper
/// metadata for every replicated table that server has, at the path the table has on the
/// leaving shard (the engine clause's path with `{shard}` that shard's, see [`expand_path`]),
/// where Keeper still lists it (read through `system.zookeeper`, so the step is idempotent);
/// and its replica of every Replicated database (S0-27). A table only the leaving shard had is
/// unknown to the other shards and cannot be found this way.
pub async fn drop_shard_replica_metadata(
    other: &Client,
    leaving: &LeavingReplica,
) -> Result<KeeperCleanup, Error> {
    let version: Version = other.version().await?;
    let retry = QueryOptions::new().retry(true);
    let q = sql::macros();
    let macros: BTreeMap<String, String> = other
        .query(q, &retry)
        .await?
        .decode(other.endpoint(), q, |r| {
            Ok((
                r.str("macro")?.to_string(),
                r.str("substitution")?.to_string(),
            ))
        })?
        .into_iter()
        .collect();
    let q = sql::replicated_engines();
    let tables = other
        .query(q, &retry)
        .await?
        .decode(other.endpoint(), q, |r| {
            Ok((
                TableName::new(r.str("database")?, r.str("name")?),
                r.str("engine_full")?.to_string(),
            ))
        })?;
    let mut cleanup = KeeperCleanup::default();
    for (table, engine) in tables {
        let Some(template) = path_template(&engine) else {
            continue;
        };
        let uuid = if template.contains("{uuid}") {
            let q = sql::table_uuid(&table);
            other
                .query(&q, &retry)
                .await?
                .decode(other.endpoint(), &q, |r| Ok(r.str("uuid")?.to_string()))?
                .into_iter()
                .next()
        } else {
            None
        };
        let Some(path) = expand_path(&template, &leaving.shard, &table, uuid.as_deref(), &macros)
        else {
            continue;
        };
        let path = path.trim_end_matches('/');
        let replicas = format!("{path}/replicas");
        if !keeper_children(other, &replicas)
            .await?
            .contains(&leaving.replica.0)
        {
            continue;
        }
        match sql::drop_replica_from_path(version, &leaving.replica, path) {
            Some(statement) => {
                tracing::info!(endpoint = %other.endpoint(), replica = %leaving.replica.0, path, "Drop replica");
                other.exec(&statement, &retry).await?;
                cleanup.dropped.push(table);
            }
            None => {
                cleanup
                    .left_paths
                    .push(format!("{replicas}/{}", leaving.replica.0));
                cleanup.left_behind.push(table);
            }
        }
    }
    drop_database_replicas(other, version, leaving, &mut cleanup).await?;
    Ok(cleanup)
}

/// The Keeper path of a replicated table before its macros are expanded: the first argument of
/// its `Replicated…MergeTree(…)` engine clause (`system.tables.engine_full`); `None` without
/// one (the server's `default_replica_path` then) or where the clause cannot be read.
pub fn path_template(engine_full: &str) -> Option<String> {
    use super::lexer::{Token, tokenize};
    let tokens = tokenize(engine_full).ok()?;
    match tokens.as_slice() {
        [Token::Word(engine), open, Token::Str(path), ..]
            if engine.starts_with("Replicated")
                && engine.ends_with("MergeTree")
                && open.is("(") =>
        {
            Some(path.clone())
        }
        _ => None,
    }
}

/// `template` with its macros expanded as a server of shard `shard` expanded them: `{shard}`
/// that shard's, `{database}`, `{table}` and `{uuid}` the table's, any other as `macros` (a
/// server of another shard) has it. `None` for `{replica}` (a path per replica is no table's
/// shared path) or a macro it cannot expand.
pub fn expand_path(
    template: &str,
    shard: &ShardMacro,
    table: &TableName,
    uuid: Option<&str>,
    macros: &BTreeMap<String, String>,
) -> Option<String> {
    let mut out = String::with_capacity(template.len() + 16);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..].find('}')? + open;
        let name = &rest[open + 1..close];
        let value = match name {
            "shard" => shard.0.as_str(),
            "replica" => return None,
            "database" => table.database.0.as_str(),
            "table" => table.name.as_str(),
            "uuid" => uuid?,
            other => macros.get(other)?.as_str(),
        };
        out.push_str(value);
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    Some(out)
}

/// The children of a Keeper node, read through `system.zookeeper`; empty if it is absent.
pub async fn keeper_children(client: &Client, path: &str) -> Result<Vec<String>, Error> {
    children(client, path, QueryOptions::new().retry(true)).await
}

/// [`keeper_children`] once, without retries.
async fn children_once(client: &Client, path: &str) -> Result<Vec<String>, Error> {
    children(client, path, QueryOptions::new()).await
}

async fn children(
    client: &Client,
    path: &str,
    options: QueryOptions,
) -> Result<Vec<String>, Error> {
    let q = sql::zookeeper_children(path);
    match client.query(&q, &options).await {
        Ok(rows) => rows.decode(client.endpoint(), &q, |r| Ok(r.str("name")?.to_string())),
        Err(e) if is_absent(&e) => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Replication state of one table on one replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableLag {
    /// The table.
    pub table: TableName,
    /// The replica lost its Keeper session or was started without Keeper.
    pub is_readonly: bool,
    /// Entries waiting in the replication queue.
    pub queue_size: u64,
    /// Seconds behind the other replicas.
    pub absolute_delay: u64,
}

/// Replication state of every replicated table on one replica.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicationLag {
    /// One entry per replicated table.
    pub tables: Vec<TableLag>,
}

impl ReplicationLag {
    /// "Synced" (S2-29): no table read-only, none behind (`absolute_delay` 0). The queue may
    /// hold merges, so it is reported but does not count.
    pub fn is_synced(&self) -> bool {
        self.tables
            .iter()
            .all(|t| !t.is_readonly && t.absolute_delay == 0)
    }

    /// The tables that are not synced yet, for the status message.
    pub fn lagging(&self) -> impl Iterator<Item = &TableLag> {
        self.tables
            .iter()
            .filter(|t| t.is_readonly || t.absolute_delay > 0)
    }
}

/// What a server says of itself at a glance (see [`sql::server_glance`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Glance {
    /// How many hosts it lists in the cluster's `remote_servers`.
    pub hosts: u64,
    /// Its version, as it reports it (`18.16.1`, `24.8.4.13`).
    pub version: String,
    /// How many of its replicated tables are read-only.
    pub read_only: u64,
}

/// A server's glance at itself (see [`sql::server_glance`]): one cheap statement, asked of
/// every Ready server on every pass.
pub async fn glance(client: &Client, cluster: &ClusterName) -> Result<Glance, Error> {
    let statement = sql::server_glance(cluster);
    let rows = client.query(&statement, &QueryOptions::new()).await?;
    let found = rows.decode(client.endpoint(), &statement, |r| {
        Ok(Glance {
            hosts: r.u64("n")?,
            version: r.str("v")?.to_string(),
            read_only: r.u64("ro")?,
        })
    })?;
    Ok(found.into_iter().next().unwrap_or_default())
}

/// The column `n` of the first row of a statement's answer.
async fn count(client: &Client, statement: &str) -> Result<u64, Error> {
    let rows = client.query(statement, &QueryOptions::new()).await?;
    let counts = rows.decode(client.endpoint(), statement, |r| r.u64("n"))?;
    Ok(counts.into_iter().next().unwrap_or(0))
}

/// How many shards of `cluster` answer a query sent through this server (see
/// [`sql::shards_answering`]); an error when one does not.
pub async fn shards_answering(client: &Client, cluster: &ClusterName) -> Result<u64, Error> {
    count(client, &sql::shards_answering(cluster)).await
}

/// Why a server is not usable (see [`serving`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unusable {
    /// For the status.
    pub why: String,
    /// Its replicated tables that are read-only because the Keeper session they had expired,
    /// while Keeper answers this server (it read the distributed DDL queue just before): they
    /// wait for nothing but their server's next attempt to open a session (decision 45).
    pub stalled: Vec<TableName>,
}

impl From<String> for Unusable {
    fn from(why: String) -> Self {
        Unusable {
            why,
            stalled: Vec::new(),
        }
    }
}

/// Whether this server is usable (invariant 10): a query through it reaches every shard of
/// `cluster`; with a Keeper (`ddl_path`: the distributed DDL queue's path), Keeper lets it read
/// that queue and none of its replicated tables is read-only. The error says why not, for the
/// status: the query's error, Keeper's answer (`Not authenticated` when the servers do not have
/// the identity the nodes were created for, decision 30), or the read-only table with Keeper's
/// answer for its path; and which read-only tables only wait for a new Keeper session.
pub async fn serving(
    client: &Client,
    cluster: &ClusterName,
    ddl_path: Option<&str>,
) -> Result<(), Unusable> {
    shards_answering(client, cluster).await.map_err(|e| {
        format!(
            "a query through it does not reach every shard: {}",
            short(&e)
        )
    })?;
    let Some(ddl_path) = ddl_path else {
        return Ok(());
    };
    // once, without retries: a pass waits for no server longer than one call
    children_once(client, ddl_path).await.map_err(|e| {
        format!(
            "cannot read the distributed DDL queue in Keeper: {}",
            short(&e)
        )
    })?;
    let q = sql::read_only_tables();
    let rows = client
        .query(&q, &QueryOptions::new())
        .await
        .map_err(|e| format!("system.replicas: {}", short(&e)))?;
    let read_only = rows
        .decode(client.endpoint(), &q, |r| {
            Ok((
                TableName::new(r.str("database")?, r.str("table")?),
                r.str("zookeeper_path")?.to_string(),
                r.u64("is_session_expired")? != 0,
            ))
        })
        .map_err(|e| short(&e))?;
    let Some((table, path, _)) = read_only.first() else {
        return Ok(());
    };
    let why = match children_once(client, path).await {
        Err(e) => format!(
            "replicated table {table} is read-only: Keeper: {}",
            short(&e)
        ),
        Ok(_) => format!("replicated table {table} is read-only"),
    };
    let stalled = read_only
        .iter()
        .filter(|(_, _, expired)| *expired)
        .map(|(t, _, _)| t.clone())
        .collect();
    Err(Unusable { why, stalled })
}

/// `SYSTEM RESTART REPLICA` of each table (decision 45), each within `budget`; the first
/// error ends it.
pub async fn restart_replicas(
    client: &Client,
    tables: &[TableName],
    budget: Duration,
) -> Result<(), String> {
    for table in tables {
        let q = sql::restart_replica(table);
        match tokio::time::timeout(budget, client.exec(&q, &QueryOptions::new())).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(format!("{table}: {}", short(&e))),
            Err(_) => {
                return Err(format!("{table}: no answer within {} s", budget.as_secs()));
            }
        }
    }
    Ok(())
}

/// An error's text up to ClickHouse's stack trace, at most 300 bytes.
fn short(e: &Error) -> String {
    crate::util::text::excerpt(&e.to_string(), 300).to_string()
}

/// How many parts this server still has to fetch from `replica` (see [`sql::fetches_from`]).
pub async fn fetches_from(client: &Client, replica: &ReplicaMacro) -> Result<u64, Error> {
    count(client, &sql::fetches_from(replica)).await
}

/// `SYSTEM DROP DNS CACHE` on this server.
pub async fn drop_dns_cache(client: &Client) -> Result<(), Error> {
    client
        .exec(sql::drop_dns_cache(), &QueryOptions::new())
        .await
}

/// Reads `system.replicas` of a (restarted) replica: the rollout's catch-up check.
pub async fn replication_lag(client: &Client) -> Result<ReplicationLag, Error> {
    let q = sql::replication_status();
    let rows = client.query(q, &QueryOptions::new()).await?;
    let tables = rows.decode(client.endpoint(), q, |r| {
        Ok(TableLag {
            table: TableName::new(r.str("database")?, r.str("table")?),
            is_readonly: r.flag("is_readonly")?,
            queue_size: r.u64("queue_size")?,
            absolute_delay: r.u64("absolute_delay")?,
        })
    })?;
    Ok(ReplicationLag { tables })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lag(readonly: bool, queue: u64, delay: u64) -> TableLag {
        TableLag {
            table: TableName::new("db", "t"),
            is_readonly: readonly,
            queue_size: queue,
            absolute_delay: delay,
        }
    }

    /// S2-29: synced means not read-only and no delay; merges in the queue do not count.
    #[test]
    fn synced_means_writable_and_no_delay() {
        let cases = [
            (vec![], true),
            (vec![lag(false, 0, 0)], true),
            (vec![lag(false, 3, 0)], true),
            (vec![lag(true, 0, 0)], false),
            (vec![lag(false, 0, 12)], false),
            (vec![lag(false, 0, 0), lag(false, 0, 1)], false),
        ];
        for (tables, want) in cases {
            let l = ReplicationLag { tables };
            assert_eq!(l.is_synced(), want, "{l:?}");
            assert_eq!(l.lagging().count() == 0, want);
        }
    }

    /// S0-27: a gone shard's Keeper path from another shard's engine clause: the first
    /// argument, its `{shard}` the gone shard's, the table's own names and UUID, the other
    /// macros the asking server's; nothing for a path per replica or a macro unknown.
    #[test]
    fn a_gone_shards_keeper_path_comes_from_the_engine_clause_of_another_shard() {
        let table = TableName::new("db", "events");
        let shard = ShardMacro("3".into());
        let macros: BTreeMap<String, String> = [("shard", "0"), ("cluster", "c1")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let template = path_template(
            "ReplicatedMergeTree('/clickhouse/{cluster}/tables/{shard}/{database}/{table}', '{replica}') ORDER BY id SETTINGS index_granularity = 8192",
        )
        .unwrap();
        assert_eq!(
            expand_path(&template, &shard, &table, None, &macros).as_deref(),
            Some("/clickhouse/c1/tables/3/db/events")
        );
        let t = path_template(
            "ReplicatedReplacingMergeTree('/t/{uuid}/{shard}', '{replica}', v) ORDER BY id",
        )
        .unwrap();
        assert_eq!(
            expand_path(&t, &shard, &table, None, &macros),
            None,
            "no UUID"
        );
        assert_eq!(
            expand_path(&t, &shard, &table, Some("a-b"), &macros).as_deref(),
            Some("/t/a-b/3")
        );
        // no path of its own (default_replica_path), another engine, a path per replica, an
        // unknown macro, an unterminated one
        assert_eq!(path_template("ReplicatedMergeTree ORDER BY id"), None);
        assert_eq!(path_template("MergeTree ORDER BY id"), None);
        assert_eq!(path_template("Distributed('c1', 'db', 'events')"), None);
        for template in ["/t/{shard}/{replica}", "/t/{layer}/{shard}", "/t/{shard"] {
            assert_eq!(
                expand_path(template, &shard, &table, None, &macros),
                None,
                "{template}"
            );
        }
    }
}
