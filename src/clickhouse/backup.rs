//! The statements of backups and restores, per server version. Servers without `BACKUP`
//! (18.16, the one the tests run) are backed up part by part: `ALTER TABLE … FREEZE` makes a
//! hard-linked snapshot under `shadow/`, which the backup agent uploads; a restore downloads
//! parts into the table's `detached/` folder and attaches them.

use super::client::{Client, Error, QueryOptions};
use super::sql::{SYSTEM_DATABASES, ident, literal};

/// A database as the server lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Database {
    pub name: String,
    pub engine: String,
}

/// A table as the server lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub database: String,
    pub name: String,
    pub engine: String,
    /// The statement that creates it, as stored (macros unexpanded).
    pub create: String,
    /// Its data folder on the server (`…/data/<db>/<table>/`).
    pub data_path: String,
}

impl Table {
    /// A MergeTree-family table: its data lives in parts that can be frozen and attached.
    pub fn has_parts(&self) -> bool {
        self.engine.ends_with("MergeTree")
    }
}

fn not_system() -> String {
    SYSTEM_DATABASES
        .iter()
        .map(|d| literal(d))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every database but the system ones.
pub fn list_databases_sql() -> String {
    format!(
        "SELECT name, engine FROM system.databases WHERE name NOT IN ({}) ORDER BY name",
        not_system()
    )
}

/// Every table of the non-system databases (temporary ones excluded).
pub fn list_tables_sql() -> String {
    format!(
        "SELECT database, name, engine, create_table_query AS create, data_path FROM system.tables \
         WHERE database NOT IN ({}) AND NOT is_temporary ORDER BY database, name",
        not_system()
    )
}

/// `CREATE DATABASE IF NOT EXISTS`, with its engine unless it is the server's default kind.
pub fn create_database_sql(db: &Database) -> String {
    match db.engine.as_str() {
        "Ordinary" | "Atomic" | "" => format!("CREATE DATABASE IF NOT EXISTS {}", ident(&db.name)),
        engine => format!(
            "CREATE DATABASE IF NOT EXISTS {} ENGINE = {engine}",
            ident(&db.name)
        ),
    }
}

/// A hard-linked snapshot of every part of a table under the server's `shadow/` folder.
pub fn freeze_sql(database: &str, table: &str) -> String {
    format!("ALTER TABLE {}.{} FREEZE", ident(database), ident(table))
}

/// Attaches a part placed in the table's `detached/` folder (replicated: the other replicas
/// fetch it).
pub fn attach_part_sql(database: &str, table: &str, part: &str) -> String {
    format!(
        "ALTER TABLE {}.{} ATTACH PART {}",
        ident(database),
        ident(table),
        literal(part)
    )
}

/// Rows of a table.
pub fn count_sql(database: &str, table: &str) -> String {
    format!(
        "SELECT count() AS n FROM {}.{}",
        ident(database),
        ident(table)
    )
}

/// Order in which a restore creates tables: tables holding data first, then the tables over
/// them (Distributed, Merge, Buffer, …), views, materialized views last.
pub fn create_rank(engine: &str) -> u8 {
    match engine {
        e if e.ends_with("MergeTree") => 0,
        "View" => 2,
        "MaterializedView" => 3,
        _ => 1,
    }
}

/// Where a server with `BACKUP` (22.8 and later) writes one shard's backup itself:
/// `S3('<url>', '<access key>', '<secret key>')`. Such servers hide the secret key in their
/// logs and `system.backups`.
pub fn s3_target(url: &str, access_key_id: &str, secret_access_key: &str) -> String {
    format!(
        "S3({}, {}, {})",
        literal(url),
        literal(access_key_id),
        literal(secret_access_key)
    )
}

/// `S3(<collection>, '<folder>')`: the bucket and keys of named collection `collection` of the
/// server's configuration, and a folder in it; no key in the statement. The name is the
/// operator's own (`chop_s3_<hex>`), written as an identifier.
pub fn s3_collection_target(collection: &str, folder: &str) -> String {
    let plain = collection
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    let name = if plain && !collection.is_empty() {
        collection.to_string()
    } else {
        ident(collection)
    };
    format!("S3({name}, {})", literal(folder))
}

/// The server's own backup of whole databases to `target`, incremental on `base` (another
/// `S3(…)` target) when given, started in the background (`ASYNC`: the statement returns the
/// backup's `id` and `status` at once; [`backup_status_sql`] follows it).
pub fn backup_sql(databases: &[String], target: &str, base: Option<&str>) -> String {
    let what = databases
        .iter()
        .map(|d| format!("DATABASE {}", ident(d)))
        .collect::<Vec<_>>()
        .join(", ");
    let settings = base
        .map(|b| format!(" SETTINGS base_backup = {b}"))
        .unwrap_or_default();
    format!("BACKUP {what} TO {target}{settings} ASYNC")
}

/// The progress of a backup or restore started with `ASYNC`.
pub fn backup_status_sql(id: &str) -> String {
    format!(
        "SELECT status, error, total_size, num_files FROM system.backups WHERE id = {}",
        literal(id)
    )
}

/// The server's own restore of the data of whole databases from `source` into the tables the
/// backup agent created beforehand from checked statements: `create_table = 0` and
/// `create_database = 0` (the server's "must exist"), so no statement written in the backup's
/// own metadata runs. Tables that already hold rows are refused unless `into_non_empty`.
pub fn restore_sql(databases: &[String], source: &str, into_non_empty: bool) -> String {
    let what = databases
        .iter()
        .map(|d| format!("DATABASE {}", ident(d)))
        .collect::<Vec<_>>()
        .join(", ");
    let non_empty = if into_non_empty {
        ", allow_non_empty_tables = true"
    } else {
        ""
    };
    format!(
        "RESTORE {what} FROM {source} SETTINGS create_table = 0, create_database = 0{non_empty} ASYNC"
    )
}

/// Every statement of backups and restores in its modern form, for a parser to check (the
/// test servers are 18.16: see `tests/modern_sql.rs`).
pub fn modern_examples() -> Vec<String> {
    let t = s3_target("http://s3:8333/b/ns/c1/backups/b2/shard-0/", "AK", "S'K");
    let base = s3_target("http://s3:8333/b/ns/c1/backups/b1/shard-0/", "AK", "S'K");
    let dbs = vec!["default".to_string(), "my db".to_string()];
    vec![
        backup_sql(&dbs, &t, None),
        backup_sql(&dbs, &t, Some(&base)),
        backup_sql(
            &dbs,
            &s3_collection_target("chop_s3_0123456789abcdef", "ns/c1/backups/b2/shard-0/"),
            Some(&s3_collection_target(
                "chop_s3_0123456789abcdef",
                "ns/c1/backups/b1/shard-0/",
            )),
        ),
        restore_sql(
            &dbs,
            &s3_collection_target("chop_s3_0123456789abcdef", "ns/c1/backups/b2/shard-0/"),
            false,
        ),
        backup_status_sql("5f5a1c1e-0c55-4d5c-9e3a-7f6b0a9d4c21"),
        restore_sql(&dbs, &t, false),
        restore_sql(&dbs, &t, true),
    ]
}

pub async fn databases(c: &Client) -> Result<Vec<Database>, Error> {
    let rows = c.query(&list_databases_sql(), &QueryOptions::new()).await?;
    rows.decode(c.endpoint(), "system.databases", |r| {
        Ok(Database {
            name: r.str("name")?.to_string(),
            engine: r.str("engine")?.to_string(),
        })
    })
}

pub async fn tables(c: &Client) -> Result<Vec<Table>, Error> {
    let rows = c.query(&list_tables_sql(), &QueryOptions::new()).await?;
    rows.decode(c.endpoint(), "system.tables", |r| {
        Ok(Table {
            database: r.str("database")?.to_string(),
            name: r.str("name")?.to_string(),
            engine: r.str("engine")?.to_string(),
            create: r.str("create")?.to_string(),
            data_path: r.str("data_path")?.to_string(),
        })
    })
}

pub async fn count(c: &Client, database: &str, table: &str) -> Result<u64, Error> {
    let rows = c
        .query(&count_sql(database, table), &QueryOptions::new())
        .await?;
    let n = rows.decode(c.endpoint(), "count", |r| r.u64("n"))?;
    Ok(n.first().copied().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backup_statements_quote_their_names() {
        assert_eq!(freeze_sql("d`b", "t"), "ALTER TABLE `d\\`b`.`t` FREEZE");
        assert_eq!(
            attach_part_sql("db", "t", "all_1_1_0"),
            "ALTER TABLE `db`.`t` ATTACH PART 'all_1_1_0'"
        );
        assert_eq!(
            create_database_sql(&Database {
                name: "db".into(),
                engine: "Ordinary".into()
            }),
            "CREATE DATABASE IF NOT EXISTS `db`"
        );
    }

    #[test]
    fn modern_backups_are_written_by_the_server_to_s3() {
        let t = s3_target("http://s3/b/x/", "AK", "S'K");
        assert_eq!(t, "S3('http://s3/b/x/', 'AK', 'S\\'K')");
        assert_eq!(
            backup_sql(&["db".into()], &t, Some("S3('base')")),
            format!("BACKUP DATABASE `db` TO {t} SETTINGS base_backup = S3('base') ASYNC")
        );
        assert_eq!(
            restore_sql(&["db".into(), "e".into()], &t, true),
            format!(
                "RESTORE DATABASE `db`, DATABASE `e` FROM {t} SETTINGS create_table = 0, create_database = 0, allow_non_empty_tables = true ASYNC"
            )
        );
    }
}
