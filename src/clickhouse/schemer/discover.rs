//! Reading the schema of the source replicas (S1-09, S1-15, decision 17).

use super::objects::{DiscoveredDatabase, DiscoveredFunction, DiscoveredTable, SourceSchema};
use crate::clickhouse::client::{Client, Error, QueryOptions};
use crate::clickhouse::sql::{self, ClusterName, DatabaseName, Source, TableName};
use crate::clickhouse::version::{Capability, Version};

/// Which batch a discovery serves: the replicated one reads the given replicas themselves
/// (the shard's peers); the distributed one may read the whole cluster at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DiscoveryScope {
    Replicated,
    Distributed,
}

/// Reads the schema of `sources`. Databases (S1-09) and, for the distributed batch, tables
/// too go through `clusterAllReplicas` where the first answering source has it; everything
/// else is read from each source directly and merged (first occurrence wins). Sources that
/// do not answer are skipped as long as one does (the direct equivalent of
/// `skip_unavailable_shards`).
pub(super) async fn discover(
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
        part.databases = rows.decode(source.endpoint(), "discovery of system.databases", |r| {
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
        part.tables = rows.decode(source.endpoint(), "discovery of system.tables", |r| {
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
        part.functions = rows.decode(source.endpoint(), "discovery of system.functions", |r| {
            Ok(DiscoveredFunction {
                name: r.str("name")?.to_string(),
                create_query: r.str("create_query")?.to_string(),
            })
        })?;
    }
    Ok((part, cluster_wide))
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
