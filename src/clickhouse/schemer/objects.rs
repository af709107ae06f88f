//! What the sources have (as `system.*` reports it) and what the new host gets (one
//! [`SchemaObject`] per `CREATE … IF NOT EXISTS`).

use crate::clickhouse::sql::{DatabaseName, TableName};

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
    pub(super) fn of_table(engine: &str, create_query: &str) -> ObjectKind {
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
