//! The two batches: which objects each one creates, in decision 11 order.

use std::collections::{BTreeMap, BTreeSet};

use super::objects::{
    DiscoveredDatabase, DiscoveredTable, ObjectKind, ObjectName, SchemaObject, SourceSchema,
};
use super::references::{engine_target, mentions};
use crate::clickhouse::sql::{self, DatabaseName, TableName};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clickhouse::schemer::fixtures::{dist, names, schema};

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
}
