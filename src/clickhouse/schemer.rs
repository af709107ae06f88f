//! Schema migration on scale-out (S1-01…S1-15, S1-24…S1-27).
//!
//! A new replica gets, from the other replicas of its shard, the databases, tables, views,
//! dictionaries and user-defined functions they have (the "replicated" batch); then, from the
//! other replicas of the cluster, the Distributed tables and the local tables they point to
//! (the "distributed" batch, which is all a new shard gets under `DistributedTablesOnly`).
//! `schemaPolicy` decides which batches run ([`should_create_replicated`],
//! [`should_create_distributed`]). Every statement is `CREATE … IF NOT EXISTS`, so the
//! migration is re-entrant (S1-27), and both batches are attempted even if the other fails
//! (S1-06).
//!
//! Order (decision 11): functions, databases, tables, then views, materialized views and
//! dictionaries in dependency order; Distributed tables (and views over them) come in the
//! distributed batch, after all of these.
//!
//! Discovery reads `system.*` tables: cluster-wide through `clusterAllReplicas` with
//! `skip_unavailable_shards = 1` where the version has it (S1-09, S1-15), otherwise (18.16,
//! decision 17) each source replica directly, skipping those that do not answer as long as
//! one does.

use std::collections::{BTreeMap, BTreeSet};

use crate::api::schema_policy::{ReplicaPolicy, SchemaPolicy, ShardPolicy};

use super::client::{Client, Error, QueryOptions, Rows};
use super::sql::{self, ClusterName, DatabaseName, Source, TableName};
use super::version::{Capability, Version};

/// S1-07 then S1-08: does a new host get the replicated objects?
///
/// `hosts` counts every host of the cluster and `shard_replicas` every replica of the new
/// host's shard, the new host included in both.
pub fn should_create_replicated(policy: SchemaPolicy, hosts: usize, shard_replicas: usize) -> bool {
    if policy.shard == ShardPolicy::All && hosts >= 2 {
        return true;
    }
    if policy.replica == ReplicaPolicy::None {
        return false;
    }
    shard_replicas > 1
}

/// S1-13: does a new host get the distributed objects (Distributed tables and their local
/// tables)? `hosts` counts every host of the cluster, the new one included.
pub fn should_create_distributed(policy: SchemaPolicy, hosts: usize) -> bool {
    policy.shard != ShardPolicy::None && hosts > 1
}

/// What kind of object a statement creates; also its rank in the order of decision 11.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKind {
    /// A SQL user-defined function.
    Function,
    /// A database.
    Database,
    /// A table with storage (MergeTree family, Memory, …).
    Table,
    /// A dictionary.
    Dictionary,
    /// A plain (or live/window) view.
    View,
    /// A materialized view.
    MaterializedView,
    /// A Distributed table.
    Distributed,
}

impl ObjectKind {
    fn of_table(engine: &str, create_query: &str) -> ObjectKind {
        match engine {
            "Distributed" => ObjectKind::Distributed,
            "MaterializedView" => ObjectKind::MaterializedView,
            "View" | "LiveView" | "WindowView" => ObjectKind::View,
            "Dictionary"
                if create_query
                    .trim_start()
                    .to_ascii_uppercase()
                    .starts_with("CREATE DICTIONARY") =>
            {
                ObjectKind::Dictionary
            }
            _ => ObjectKind::Table,
        }
    }
}

/// The name of a created object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectName {
    /// A function.
    Function(String),
    /// A database.
    Database(DatabaseName),
    /// A table, view or dictionary.
    Table(TableName),
}

/// One object to create and the statement that creates it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchemaObject {
    /// What it is.
    pub kind: ObjectKind,
    /// Its name.
    pub name: ObjectName,
    /// `CREATE … IF NOT EXISTS …`.
    pub statement: String,
    /// Tables it needs to exist first.
    pub depends_on: Vec<TableName>,
}

/// A database as a source replica reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveredDatabase {
    /// Its name.
    pub name: DatabaseName,
    /// The engine clause to recreate it with (`engine_full` from 22.12, else `engine`).
    pub engine: String,
}

impl DiscoveredDatabase {
    /// The engine's name without arguments: `Replicated('/p', …)` → `Replicated`.
    pub fn engine_name(&self) -> &str {
        self.engine.split('(').next().unwrap_or_default().trim()
    }
}

/// A table, view or dictionary as a source replica reports it (`system.tables`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveredTable {
    /// Its name.
    pub name: TableName,
    /// `engine`.
    pub engine: String,
    /// `engine_full` (for Distributed tables: their target).
    pub engine_full: String,
    /// `create_table_query`.
    pub create_query: String,
    /// The objects that depend on this one (`dependencies_database`/`dependencies_table`:
    /// the materialized views reading from it).
    pub dependents: Vec<TableName>,
}

/// A user-defined function as a source replica reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveredFunction {
    /// Its name.
    pub name: String,
    /// `create_query`.
    pub create_query: String,
}

/// The schema found on the source replicas.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceSchema {
    /// Non-system databases.
    pub databases: Vec<DiscoveredDatabase>,
    /// Non-system tables, views and dictionaries (no `.inner` tables).
    pub tables: Vec<DiscoveredTable>,
    /// SQL user-defined functions.
    pub functions: Vec<DiscoveredFunction>,
}

/// The database engines whose tables are copied one by one (S1-11); tables of `Replicated`
/// databases are created by the database itself.
const COPIED_DATABASE_ENGINES: &[&str] = &["Ordinary", "Atomic", "Memory", "Lazy"];

/// The table objects of the schema that are copied one by one (S1-11), and the names of the
/// Distributed tables together with everything that depends on one, transitively.
fn table_objects(schema: &SourceSchema) -> (Vec<SchemaObject>, BTreeSet<TableName>) {
    let copied: BTreeSet<&DatabaseName> = schema
        .databases
        .iter()
        .filter(|d| COPIED_DATABASE_ENGINES.contains(&d.engine_name()))
        .map(|d| &d.name)
        .collect();
    let objects: Vec<SchemaObject> = schema
        .tables
        .iter()
        .filter(|t| copied.contains(&t.name.database))
        .filter_map(|t| table_object(t, schema))
        .collect();
    let mut distributed: BTreeSet<TableName> = objects
        .iter()
        .filter(|o| o.kind == ObjectKind::Distributed)
        .filter_map(|o| table_of(&o.name).cloned())
        .collect();
    loop {
        let more: Vec<TableName> = objects
            .iter()
            .filter_map(|o| table_of(&o.name).map(|t| (t, o)))
            .filter(|(t, o)| {
                !distributed.contains(*t) && o.depends_on.iter().any(|d| distributed.contains(d))
            })
            .map(|(t, _)| t.clone())
            .collect();
        if more.is_empty() {
            return (objects, distributed);
        }
        distributed.extend(more);
    }
}

fn table_of(name: &ObjectName) -> Option<&TableName> {
    match name {
        ObjectName::Table(t) => Some(t),
        _ => None,
    }
}

/// The replicated batch (S1-04, S1-09, S1-11, S1-12): the functions, databases, tables,
/// views and dictionaries of the sources, ordered; Distributed tables and what depends on
/// them are left to the distributed batch, which `schemaPolicy.shard` governs.
pub fn replicated_objects(schema: &SourceSchema) -> Vec<SchemaObject> {
    let mut objects = Vec::new();
    for f in &schema.functions {
        if let Some(statement) = sql::create_if_not_exists(&f.create_query) {
            objects.push(SchemaObject {
                kind: ObjectKind::Function,
                name: ObjectName::Function(f.name.clone()),
                statement,
                depends_on: Vec::new(),
            });
        }
    }
    objects.extend(schema.databases.iter().map(database_object));
    let (tables, distributed) = table_objects(schema);
    objects.extend(
        tables
            .into_iter()
            .filter(|o| table_of(&o.name).is_some_and(|t| !distributed.contains(t))),
    );
    order(objects)
}

/// The distributed batch (S1-03, S1-14, S1-25): every Distributed table of the sources, the
/// local table it points to, and the databases of both, ordered local before Distributed.
/// With `with_dependents` (the replicated batch ran too) the views over Distributed tables
/// follow them.
pub fn distributed_objects(schema: &SourceSchema, with_dependents: bool) -> Vec<SchemaObject> {
    let (tables, distributed) = table_objects(schema);
    let mut wanted: BTreeSet<TableName> = BTreeSet::new();
    for o in tables.iter().filter(|o| o.kind == ObjectKind::Distributed) {
        wanted.extend(table_of(&o.name).cloned());
        wanted.extend(o.depends_on.iter().cloned());
    }
    if with_dependents {
        wanted.extend(distributed);
    }
    let databases: BTreeSet<&DatabaseName> = wanted.iter().map(|t| &t.database).collect();
    let mut objects: Vec<SchemaObject> = schema
        .databases
        .iter()
        .filter(|d| databases.contains(&d.name))
        .map(database_object)
        .collect();
    objects.extend(
        tables
            .into_iter()
            .filter(|o| table_of(&o.name).is_some_and(|t| wanted.contains(t))),
    );
    order(objects)
}

fn database_object(d: &DiscoveredDatabase) -> SchemaObject {
    SchemaObject {
        kind: ObjectKind::Database,
        name: ObjectName::Database(d.name.clone()),
        statement: sql::create_database(&d.name, &d.engine),
        depends_on: Vec::new(),
    }
}

fn table_object(t: &DiscoveredTable, schema: &SourceSchema) -> Option<SchemaObject> {
    let statement = sql::create_if_not_exists(&t.create_query)?;
    let kind = ObjectKind::of_table(&t.engine, &t.create_query);
    let mut depends_on: BTreeSet<TableName> = BTreeSet::new();
    depends_on.extend(engine_target(t));
    for other in &schema.tables {
        if other.name == t.name {
            continue;
        }
        if other.dependents.contains(&t.name) {
            depends_on.insert(other.name.clone());
        }
        if matches!(
            kind,
            ObjectKind::View | ObjectKind::MaterializedView | ObjectKind::Dictionary
        ) && mentions(&t.create_query, &other.name, &t.name.database)
        {
            depends_on.insert(other.name.clone());
        }
    }
    Some(SchemaObject {
        kind,
        name: ObjectName::Table(t.name.clone()),
        statement,
        depends_on: depends_on.into_iter().collect(),
    })
}

/// The local table a Distributed table points to, from its `engine_full`
/// (`Distributed(cluster, db, table[, sharding_key[, policy]])`, arguments bare, quoted or
/// backquoted; S1-14). `None` for anything else, or a target database given as an
/// expression.
pub fn distributed_target(t: &DiscoveredTable) -> Option<TableName> {
    let parts = engine_args(&t.engine_full, "Distributed")?;
    qualified(parts.get(1)?, parts.get(2)?)
}

/// The table an engine reads from, for ordering: a Distributed table's local table, a
/// Buffer table's destination (`Buffer(db, table, …)`), a Dictionary-engine table's
/// dictionary (`Dictionary(db.dict)` or `Dictionary(dict)` in its own database).
pub fn engine_target(t: &DiscoveredTable) -> Option<TableName> {
    match t.engine.as_str() {
        "Distributed" => distributed_target(t),
        "Buffer" => {
            let parts = engine_args(&t.engine_full, "Buffer")?;
            qualified(parts.first()?, parts.get(1)?)
        }
        "Dictionary" => {
            let parts = engine_args(&t.engine_full, "Dictionary")?;
            let name =
                unquote(parts.first()?).or_else(|| Some(parts.first()?.trim().replace('`', "")))?;
            match name.split_once('.') {
                Some((db, dict)) => qualified(db, dict),
                None => qualified(&t.name.database.0, &name),
            }
        }
        _ => None,
    }
}

fn engine_args(engine_full: &str, engine: &str) -> Option<Vec<String>> {
    let args = engine_full.trim().strip_prefix(engine)?.trim_start();
    split_args(args.strip_prefix('(')?)
}

fn qualified(database: &str, table: &str) -> Option<TableName> {
    let database = unquote(database)?;
    let table = unquote(table)?;
    (!database.is_empty() && !table.is_empty()).then(|| TableName::new(&database, &table))
}

/// Splits the top-level, comma-separated arguments up to the closing parenthesis.
fn split_args(s: &str) -> Option<Vec<String>> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if let Some(q) = quote {
            current.push(c);
            if c == '\\' {
                current.extend(chars.next());
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '\'' | '`' | '"' => {
                quote = Some(c);
                current.push(c);
            }
            '(' => {
                depth += 1;
                current.push(c);
            }
            ')' if depth == 0 => {
                parts.push(current.trim().to_string());
                return Some(parts);
            }
            ')' => {
                depth -= 1;
                current.push(c);
            }
            ',' if depth == 0 => parts.push(std::mem::take(&mut current).trim().to_string()),
            _ => current.push(c),
        }
    }
    None
}

/// A bare, `'quoted'`, `` `backquoted` `` or `"double-quoted"` name; `None` for expressions.
fn unquote(arg: &str) -> Option<String> {
    let arg = arg.trim();
    let first = arg.chars().next()?;
    if matches!(first, '\'' | '`' | '"') {
        let body = arg.strip_prefix(first)?.strip_suffix(first)?;
        let mut out = String::new();
        let mut chars = body.chars();
        while let Some(c) = chars.next() {
            if c == '\\' {
                out.extend(chars.next());
            } else {
                out.push(c);
            }
        }
        return Some(out);
    }
    arg.chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_')
        .then(|| arg.to_string())
}

/// Whether `query` refers to `table`: qualified in any quoting, or bare when it is in
/// `own_database`. A false positive only adds an ordering edge.
fn mentions(query: &str, table: &TableName, own_database: &DatabaseName) -> bool {
    let db = &table.database.0;
    let name = &table.name;
    let dbs = [db.clone(), sql::ident(db)];
    let names = [name.clone(), sql::ident(name)];
    let mut needles: Vec<String> = Vec::new();
    for d in &dbs {
        for n in &names {
            needles.push(format!("{d}.{n}"));
        }
    }
    if &table.database == own_database {
        needles.extend(names.iter().cloned());
    }
    needles.iter().any(|n| contains_token(query, n))
}

fn contains_token(haystack: &str, needle: &str) -> bool {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.';
    haystack.match_indices(needle).any(|(i, m)| {
        let before = haystack[..i].chars().next_back();
        let after = haystack[i + m.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(|c| is_ident(c) && c != '.')
    })
}

/// Orders objects per decision 11: by dependency, ties by kind rank (functions, databases,
/// tables, dictionaries, views, materialized views, Distributed) and then name. Objects in a
/// dependency cycle keep their rank order at the end. Duplicates (same name) are dropped.
pub fn order(objects: Vec<SchemaObject>) -> Vec<SchemaObject> {
    let mut unique: BTreeMap<ObjectName, SchemaObject> = BTreeMap::new();
    for o in objects {
        unique.entry(o.name.clone()).or_insert(o);
    }
    let mut pending: Vec<SchemaObject> = unique.into_values().collect();
    pending.sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
    let mut done: BTreeSet<ObjectName> = BTreeSet::new();
    let mut out = Vec::with_capacity(pending.len());
    loop {
        let present: BTreeSet<ObjectName> = pending.iter().map(|o| o.name.clone()).collect();
        let ready = pending.iter().position(|o| {
            let db_ready = match &o.name {
                ObjectName::Table(t) => {
                    let db = ObjectName::Database(t.database.clone());
                    !present.contains(&db) || done.contains(&db)
                }
                _ => true,
            };
            db_ready
                && o.depends_on.iter().all(|d| {
                    let n = ObjectName::Table(d.clone());
                    !present.contains(&n) || done.contains(&n)
                })
        });
        match ready {
            Some(i) => {
                let o = pending.remove(i);
                done.insert(o.name.clone());
                out.push(o);
            }
            None => {
                out.append(&mut pending);
                return out;
            }
        }
    }
}

/// The replicas a new host copies its schema from.
#[derive(Clone, Copy, Debug)]
pub struct MigrationSources<'a> {
    /// The cluster (`remote_servers`) name, for `clusterAllReplicas`.
    pub cluster: &'a ClusterName,
    /// The other replicas of the new host's shard.
    pub shard_peers: &'a [Client],
    /// The replicas of the other shards.
    pub other_shards: &'a [Client],
}

/// Where the new host stands in the cluster, for the policy decisions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Topology {
    /// Hosts of the cluster, the new one included.
    pub hosts: usize,
    /// Replicas of the new host's shard, the new one included.
    pub shard_replicas: usize,
}

/// A statement that failed on the new host, after its retries.
#[derive(Debug)]
pub struct FailedStatement {
    /// The object it should have created.
    pub object: ObjectName,
    /// Why.
    pub error: Error,
}

/// What one batch did.
#[derive(Debug, Default)]
pub struct BatchOutcome {
    /// Objects created (or found existing: `IF NOT EXISTS`), in execution order.
    pub created: Vec<ObjectName>,
    /// Statements that failed; the others still ran.
    pub failed: Vec<FailedStatement>,
    /// Discovery failed: no statement ran.
    pub discovery: Option<Error>,
}

impl BatchOutcome {
    /// Whether everything in the batch succeeded.
    pub fn is_ok(&self) -> bool {
        self.failed.is_empty() && self.discovery.is_none()
    }
}

/// What a migration did: both batches, each attempted whatever the other did (S1-06).
#[derive(Debug, Default)]
pub struct MigrationOutcome {
    /// `None`: the policy said no replicated objects (S1-07/08).
    pub replicated: Option<BatchOutcome>,
    /// `None`: the policy said no distributed objects (S1-13).
    pub distributed: Option<BatchOutcome>,
}

/// A migration in which something failed; it keeps what was created.
#[derive(Debug, thiserror::Error)]
#[error("schema migration failed: {summary}")]
pub struct MigrationError {
    /// Everything that happened.
    pub outcome: MigrationOutcome,
    /// The first failure, for the status message.
    pub summary: String,
}

impl MigrationOutcome {
    /// Every object created, replicated batch first.
    pub fn created(&self) -> Vec<&ObjectName> {
        [&self.replicated, &self.distributed]
            .into_iter()
            .flatten()
            .flat_map(|b| b.created.iter())
            .collect()
    }

    fn first_failure(&self) -> Option<String> {
        [&self.replicated, &self.distributed]
            .into_iter()
            .flatten()
            .find_map(|b| {
                b.discovery
                    .as_ref()
                    .map(|e| format!("discovery: {e}"))
                    .or_else(|| b.failed.first().map(|f| f.error.to_string()))
            })
    }
}

/// Brings a new host's schema up to its cluster's (S1-01): the
/// replicated batch, then the distributed batch, each as the policy allows, each statement
/// retried and logged. Returns what was created, or an error that still carries it.
pub async fn migrate_new_host(
    target: &Client,
    sources: MigrationSources<'_>,
    policy: SchemaPolicy,
    topology: Topology,
) -> Result<MigrationOutcome, MigrationError> {
    let mut outcome = MigrationOutcome::default();
    if should_create_replicated(policy, topology.hosts, topology.shard_replicas) {
        let from = if sources.shard_peers.is_empty() {
            sources.other_shards
        } else {
            sources.shard_peers
        };
        let batch = match discover(from, sources.cluster, DiscoveryScope::Replicated).await {
            Ok(schema) => execute(target, replicated_objects(&schema)).await,
            Err(e) => BatchOutcome {
                discovery: Some(e),
                ..BatchOutcome::default()
            },
        };
        outcome.replicated = Some(batch);
    }
    if should_create_distributed(policy, topology.hosts) {
        let all: Vec<Client> = sources
            .shard_peers
            .iter()
            .chain(sources.other_shards)
            .cloned()
            .collect();
        let batch = match discover(&all, sources.cluster, DiscoveryScope::Distributed).await {
            Ok(schema) => {
                let done: BTreeSet<ObjectName> = outcome
                    .replicated
                    .iter()
                    .flat_map(|b| b.created.iter().cloned())
                    .collect();
                let objects = distributed_objects(&schema, outcome.replicated.is_some())
                    .into_iter()
                    .filter(|o| !done.contains(&o.name))
                    .collect();
                execute(target, objects).await
            }
            Err(e) => BatchOutcome {
                discovery: Some(e),
                ..BatchOutcome::default()
            },
        };
        outcome.distributed = Some(batch);
    }
    match outcome.first_failure() {
        None => Ok(outcome),
        Some(summary) => Err(MigrationError { outcome, summary }),
    }
}

async fn execute(target: &Client, objects: Vec<SchemaObject>) -> BatchOutcome {
    let mut batch = BatchOutcome::default();
    let options = QueryOptions::new().retry(true);
    for o in objects {
        match target.exec(&o.statement, &options).await {
            Ok(()) => {
                tracing::info!(endpoint = %target.endpoint(), object = ?o.name, "schema object created");
                batch.created.push(o.name);
            }
            Err(error) => {
                tracing::warn!(endpoint = %target.endpoint(), object = ?o.name, %error, "schema object not created");
                batch.failed.push(FailedStatement {
                    object: o.name,
                    error,
                });
            }
        }
    }
    batch
}

/// Which batch a discovery serves: the replicated one reads the given replicas themselves
/// (the shard's peers); the distributed one may read the whole cluster at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DiscoveryScope {
    Replicated,
    Distributed,
}

/// Reads the schema of `sources`. Databases (S1-09) and, for the distributed batch, tables
/// too go through `clusterAllReplicas` where the first answering source has it; everything
/// else is read from each source directly and merged (first occurrence wins). Sources that
/// do not answer are skipped as long as one does (the direct equivalent of
/// `skip_unavailable_shards`).
async fn discover(
    sources: &[Client],
    cluster: &ClusterName,
    scope: DiscoveryScope,
) -> Result<SourceSchema, Error> {
    let mut schema = SourceSchema::default();
    let mut last_error = None;
    let mut answered = false;
    let mut cluster_wide_done = false;
    for source in sources {
        match discover_one(source, cluster, scope, cluster_wide_done).await {
            Ok((part, cluster_wide)) => {
                answered = true;
                cluster_wide_done |= cluster_wide;
                merge(&mut schema, part);
            }
            Err(e) => {
                tracing::warn!(endpoint = %source.endpoint(), error = %e, "schema source skipped");
                last_error = Some(e);
            }
        }
    }
    match (answered, last_error) {
        (false, Some(e)) => Err(e),
        _ => Ok(schema),
    }
}

/// One source's part; `.1` tells whether it already covered the whole cluster.
async fn discover_one(
    source: &Client,
    cluster: &ClusterName,
    scope: DiscoveryScope,
    cluster_wide_done: bool,
) -> Result<(SourceSchema, bool), Error> {
    let version: Version = source.version().await?;
    let cluster_wide = version.supports(Capability::ClusterAllReplicas);
    let wide = if cluster_wide {
        Source::AllReplicas(cluster)
    } else {
        Source::Local
    };
    let options = QueryOptions::new().retry(true);
    let mut part = SourceSchema::default();
    if !(cluster_wide && cluster_wide_done) {
        let rows = source
            .query(&sql::discover_databases(version, wide), &options)
            .await?;
        part.databases = decode(source, &rows, "system.databases", |r| {
            Ok(DiscoveredDatabase {
                name: DatabaseName(r.str("name")?.to_string()),
                engine: r.str("engine")?.to_string(),
            })
        })?;
    }
    let table_source = match scope {
        DiscoveryScope::Distributed => wide,
        DiscoveryScope::Replicated => Source::Local,
    };
    if !(matches!(table_source, Source::AllReplicas(_)) && cluster_wide_done) {
        let rows = source
            .query(&sql::discover_tables(version, table_source), &options)
            .await?;
        part.tables = decode(source, &rows, "system.tables", |r| {
            let deps_db = r.strings("dependencies_database")?;
            let deps_t = r.strings("dependencies_table")?;
            Ok(DiscoveredTable {
                name: TableName::new(r.str("database")?, r.str("name")?),
                engine: r.str("engine")?.to_string(),
                engine_full: r.str("engine_full")?.to_string(),
                create_query: r.str("create_table_query")?.to_string(),
                dependents: deps_db
                    .iter()
                    .zip(&deps_t)
                    .map(|(d, t)| TableName::new(d, t))
                    .collect(),
            })
        })?;
    }
    if scope == DiscoveryScope::Replicated
        && let Some(q) = sql::discover_functions(version, Source::Local)
    {
        let rows = source.query(&q, &options).await?;
        part.functions = decode(source, &rows, "system.functions", |r| {
            Ok(DiscoveredFunction {
                name: r.str("name")?.to_string(),
                create_query: r.str("create_query")?.to_string(),
            })
        })?;
    }
    Ok((part, cluster_wide))
}

fn decode<T>(
    source: &Client,
    rows: &Rows,
    what: &str,
    f: impl Fn(&super::client::Row<'_>) -> Result<T, String>,
) -> Result<Vec<T>, Error> {
    rows.iter()
        .map(|r| f(&r))
        .collect::<Result<Vec<T>, String>>()
        .map_err(|detail| Error::Decode {
            endpoint: source.endpoint().clone(),
            detail,
            statement: format!("discovery of {what}"),
        })
}

fn merge(into: &mut SourceSchema, part: SourceSchema) {
    for d in part.databases {
        if !into.databases.iter().any(|x| x.name == d.name) {
            into.databases.push(d);
        }
    }
    for t in part.tables {
        if !into.tables.iter().any(|x| x.name == t.name) {
            into.tables.push(t);
        }
    }
    for f in part.functions {
        if !into.functions.iter().any(|x| x.name == f.name) {
            into.functions.push(f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(replica: ReplicaPolicy, shard: ShardPolicy) -> SchemaPolicy {
        SchemaPolicy { replica, shard }
    }

    /// S1-07 / S1-08: the replicated-objects decision table, rule 1 first.
    #[test]
    fn replicated_objects_follow_the_policy_table_shard_all_first() {
        use ReplicaPolicy as R;
        use ShardPolicy as S;
        // (replica, shard, hosts, shard_replicas) -> create?
        let cases = [
            // S1-07: shard All and >= 2 hosts: always, even with replica None.
            (R::None, S::All, 2, 1, true),
            (R::None, S::All, 4, 2, true),
            (R::All, S::All, 2, 1, true),
            // S1-07 falls through with 1 host to S1-08.
            (R::All, S::All, 1, 1, false),
            (R::None, S::All, 1, 1, false),
            // S1-08: replica None gives none.
            (R::None, S::None, 4, 2, false),
            (R::None, S::DistributedTablesOnly, 4, 2, false),
            // S1-08: a shard of one replica has no source.
            (R::All, S::None, 4, 1, false),
            (R::All, S::DistributedTablesOnly, 4, 1, false),
            // Otherwise created.
            (R::All, S::None, 3, 3, true),
            (R::All, S::DistributedTablesOnly, 4, 2, true),
        ];
        for (r, s, hosts, shard, want) in cases {
            assert_eq!(
                should_create_replicated(policy(r, s), hosts, shard),
                want,
                "{r:?} {s:?} hosts={hosts} shard={shard}"
            );
        }
    }

    /// S1-13: the distributed-objects decision table.
    #[test]
    fn distributed_objects_need_a_shard_policy_and_two_hosts() {
        use ReplicaPolicy as R;
        use ShardPolicy as S;
        let cases = [
            (R::All, S::None, 4, false),
            (R::None, S::None, 4, false),
            (R::All, S::All, 1, false),
            (R::All, S::DistributedTablesOnly, 1, false),
            (R::All, S::All, 2, true),
            (R::None, S::All, 2, true),
            (R::None, S::DistributedTablesOnly, 3, true),
        ];
        for (r, s, hosts, want) in cases {
            assert_eq!(
                should_create_distributed(policy(r, s), hosts),
                want,
                "{r:?} {s:?} {hosts}"
            );
        }
    }

    fn table(
        db: &str,
        name: &str,
        engine: &str,
        engine_full: &str,
        create: &str,
    ) -> DiscoveredTable {
        DiscoveredTable {
            name: TableName::new(db, name),
            engine: engine.into(),
            engine_full: engine_full.into(),
            create_query: create.into(),
            dependents: Vec::new(),
        }
    }

    fn dist(db: &str, name: &str, engine_full: &str) -> DiscoveredTable {
        table(
            db,
            name,
            "Distributed",
            engine_full,
            &format!("CREATE TABLE {db}.{name} (x UInt8) ENGINE = {engine_full}"),
        )
    }

    /// S1-14: the target database and table, bare or quoted.
    #[test]
    fn distributed_target_is_parsed_from_engine_full() {
        let cases = [
            ("Distributed('c', db2, t, rand())", Some(("db2", "t"))),
            ("Distributed(c, 'db2', 't')", Some(("db2", "t"))),
            (
                "Distributed(c1, db1, events, rand())",
                Some(("db1", "events")),
            ),
            (
                "Distributed(`c`, `my db`, `t\\`x`, cityHash64(a, b), 'policy')",
                Some(("my db", "t`x")),
            ),
            ("Distributed('c', currentDatabase(), 't')", None),
            ("Distributed('c', '', 't')", None),
            ("MergeTree ORDER BY x", None),
            ("Distributed('c', 'db2'", None),
        ];
        for (engine_full, want) in cases {
            let got = distributed_target(&dist("d", "x", engine_full));
            assert_eq!(
                got,
                want.map(|(d, t)| TableName::new(d, t)),
                "{engine_full}"
            );
        }
    }

    /// Non-MergeTree engines that read another table are ordered after it.
    #[test]
    fn engine_targets_of_buffer_and_dictionary_tables() {
        let buffer = table(
            "db",
            "buf",
            "Buffer",
            "Buffer(db, dest, 16, 10, 100, 10000, 1000000, 10000000, 100000000)",
            "CREATE TABLE db.buf (x UInt8) ENGINE = Buffer(db, dest, 16, 10, 100, 10000, 1000000, 10000000, 100000000)",
        );
        assert_eq!(engine_target(&buffer), Some(TableName::new("db", "dest")));
        let dict_table = table(
            "db",
            "dt",
            "Dictionary",
            "Dictionary(other.dict)",
            "CREATE TABLE db.dt (k UInt64) ENGINE = Dictionary(other.dict)",
        );
        assert_eq!(
            engine_target(&dict_table),
            Some(TableName::new("other", "dict"))
        );
        let own = table(
            "db",
            "dt2",
            "Dictionary",
            "Dictionary(dict)",
            "CREATE TABLE db.dt2 (k UInt64) ENGINE = Dictionary(dict)",
        );
        assert_eq!(engine_target(&own), Some(TableName::new("db", "dict")));
        let plain = table(
            "db",
            "m",
            "MergeTree",
            "MergeTree ORDER BY x",
            "CREATE TABLE db.m (x UInt8) ENGINE = MergeTree ORDER BY x",
        );
        assert_eq!(engine_target(&plain), None);

        let dest = table(
            "db",
            "dest",
            "MergeTree",
            "MergeTree ORDER BY x",
            "CREATE TABLE db.dest (x UInt8) ENGINE = MergeTree ORDER BY x",
        );
        let s = SourceSchema {
            databases: vec![DiscoveredDatabase {
                name: DatabaseName("db".into()),
                engine: "Atomic".into(),
            }],
            tables: vec![buffer, dest],
            functions: vec![],
        };
        assert_eq!(
            names(&replicated_objects(&s)),
            ["db db", "db.dest", "db.buf"]
        );
    }

    fn schema() -> SourceSchema {
        let mut events = table(
            "db1",
            "events",
            "ReplicatedMergeTree",
            "ReplicatedMergeTree('/clickhouse/tables/{shard}/db1/events', '{replica}') ORDER BY id",
            "CREATE TABLE db1.events (id UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/db1/events', '{replica}') ORDER BY id",
        );
        events.dependents = vec![TableName::new("db1", "mv")];
        SourceSchema {
            databases: vec![
                DiscoveredDatabase {
                    name: DatabaseName("db1".into()),
                    engine: "Ordinary".into(),
                },
                DiscoveredDatabase {
                    name: DatabaseName("db2".into()),
                    engine: "Atomic".into(),
                },
                DiscoveredDatabase {
                    name: DatabaseName("rdb".into()),
                    engine: "Replicated('/clickhouse/databases/rdb', '{shard}', '{replica}')"
                        .into(),
                },
            ],
            tables: vec![
                dist("db1", "all_events", "Distributed(c1, db1, events, rand())"),
                table(
                    "db1",
                    "mv",
                    "MaterializedView",
                    "MergeTree ORDER BY id",
                    "CREATE MATERIALIZED VIEW db1.mv (id UInt64) ENGINE = MergeTree ORDER BY id AS SELECT id FROM db1.events",
                ),
                table(
                    "db1",
                    "v_over_dist",
                    "View",
                    "",
                    "CREATE VIEW db1.v_over_dist (id UInt64) AS SELECT id FROM all_events",
                ),
                table(
                    "db1",
                    "v",
                    "View",
                    "",
                    "CREATE VIEW db1.v (id UInt64) AS SELECT id FROM `db1`.`events`",
                ),
                events,
                table(
                    "db1",
                    "events_2",
                    "MergeTree",
                    "MergeTree ORDER BY id",
                    "CREATE TABLE db1.events_2 (id UInt64) ENGINE = MergeTree ORDER BY id",
                ),
                table(
                    "db2",
                    "dict",
                    "Dictionary",
                    "",
                    "CREATE DICTIONARY db2.dict (k UInt64, v String) PRIMARY KEY k SOURCE(CLICKHOUSE(TABLE 'lookup' DB 'db2')) LAYOUT(FLAT()) LIFETIME(0)",
                ),
                table(
                    "db2",
                    "lookup",
                    "MergeTree",
                    "MergeTree ORDER BY k",
                    "CREATE TABLE db2.lookup (k UInt64, v String) ENGINE = MergeTree ORDER BY k",
                ),
                table(
                    "rdb",
                    "inside_replicated_db",
                    "ReplicatedMergeTree",
                    "ReplicatedMergeTree ORDER BY x",
                    "CREATE TABLE rdb.inside_replicated_db (x UInt8) ENGINE = ReplicatedMergeTree ORDER BY x",
                ),
            ],
            functions: vec![DiscoveredFunction {
                name: "linear".into(),
                create_query: "CREATE FUNCTION linear AS (x, k, b) -> ((k * x) + b)".into(),
            }],
        }
    }

    fn names(objects: &[SchemaObject]) -> Vec<String> {
        objects
            .iter()
            .map(|o| match &o.name {
                ObjectName::Function(f) => format!("fn {f}"),
                ObjectName::Database(d) => format!("db {}", d.0),
                ObjectName::Table(t) => format!("{}.{}", t.database.0, t.name),
            })
            .collect()
    }

    /// Decision 11, S1-04, S1-11, S1-12: functions, databases, tables, then dependants in
    /// dependency order; Distributed tables and the views over them are left to the
    /// distributed batch, tables of Replicated databases to the database.
    #[test]
    fn decision_11_replicated_batch_order() {
        let objects = replicated_objects(&schema());
        assert_eq!(
            names(&objects),
            [
                "fn linear",
                "db db1",
                "db db2",
                "db rdb",
                "db1.events",
                "db1.events_2",
                "db2.lookup",
                "db2.dict",
                "db1.v",
                "db1.mv",
            ]
        );
        assert!(
            objects
                .iter()
                .all(|o| o.statement.contains("IF NOT EXISTS"))
        );
        assert_eq!(
            objects[3].statement,
            "CREATE DATABASE IF NOT EXISTS `rdb` ENGINE = Replicated('/clickhouse/databases/rdb', '{shard}', '{replica}')"
        );
        assert_eq!(
            objects[0].statement,
            "CREATE FUNCTION IF NOT EXISTS linear AS (x, k, b) -> ((k * x) + b)"
        );
    }

    /// S1-03 / S1-14 / S1-25: the distributed batch is the Distributed tables, their local
    /// tables and databases only, local before Distributed.
    #[test]
    fn distributed_batch_has_only_distributed_tables_and_what_they_need() {
        let mut s = schema();
        s.tables.push(dist(
            "db2",
            "remote_events",
            "Distributed('c1', 'db1', 'events')",
        ));
        let objects = distributed_objects(&s, false);
        assert_eq!(
            names(&objects),
            [
                "db db1",
                "db db2",
                "db1.events",
                "db1.all_events",
                "db2.remote_events"
            ]
        );
        // After a replicated batch, the views over Distributed tables follow them.
        let objects = distributed_objects(&s, true);
        assert_eq!(
            names(&objects),
            [
                "db db1",
                "db db2",
                "db1.events",
                "db1.all_events",
                "db1.v_over_dist",
                "db2.remote_events"
            ]
        );
    }

    #[test]
    fn order_survives_cycles_and_duplicates() {
        let a = SchemaObject {
            kind: ObjectKind::View,
            name: ObjectName::Table(TableName::new("d", "a")),
            statement: "CREATE VIEW IF NOT EXISTS d.a AS SELECT 1".into(),
            depends_on: vec![TableName::new("d", "b")],
        };
        let b = SchemaObject {
            kind: ObjectKind::View,
            name: ObjectName::Table(TableName::new("d", "b")),
            statement: "CREATE VIEW IF NOT EXISTS d.b AS SELECT 1".into(),
            depends_on: vec![TableName::new("d", "a")],
        };
        let out = order(vec![a.clone(), b.clone(), a.clone()]);
        assert_eq!(out, vec![a, b]);
    }

    #[test]
    fn mentions_respects_identifier_boundaries() {
        let own = DatabaseName("db1".into());
        let t = TableName::new("db1", "events");
        assert!(mentions("SELECT * FROM db1.events", &t, &own));
        assert!(mentions("SELECT * FROM `db1`.`events` WHERE 1", &t, &own));
        assert!(mentions("SELECT * FROM events", &t, &own));
        assert!(!mentions("SELECT * FROM db1.events_2", &t, &own));
        assert!(!mentions("SELECT * FROM other.events", &t, &own));
        assert!(!mentions(
            "SELECT * FROM events",
            &t,
            &DatabaseName("db9".into())
        ));
    }
}
