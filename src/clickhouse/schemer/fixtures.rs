//! Source schemas for the tests of the batches and of the references.

use super::objects::{
    DiscoveredDatabase, DiscoveredFunction, DiscoveredTable, ObjectName, SchemaObject, SourceSchema,
};
use crate::clickhouse::sql::{DatabaseName, TableName};

pub(super) fn table(
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

pub(super) fn dist(db: &str, name: &str, engine_full: &str) -> DiscoveredTable {
    table(
        db,
        name,
        "Distributed",
        engine_full,
        &format!("CREATE TABLE {db}.{name} (x UInt8) ENGINE = {engine_full}"),
    )
}

pub(super) fn schema() -> SourceSchema {
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
                engine: "Replicated('/clickhouse/databases/rdb', '{shard}', '{replica}')".into(),
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

pub(super) fn names(objects: &[SchemaObject]) -> Vec<String> {
    objects
        .iter()
        .map(|o| match &o.name {
            ObjectName::Function(f) => format!("fn {f}"),
            ObjectName::Database(d) => format!("db {}", d.0),
            ObjectName::Table(t) => format!("{}.{}", t.database.0, t.name),
        })
        .collect()
}
