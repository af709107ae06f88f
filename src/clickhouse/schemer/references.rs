//! What a table reads from, for the order of creation: the table its engine points to (the
//! engine's arguments parsed), and the tables a view or dictionary query names.

use super::objects::DiscoveredTable;
use crate::clickhouse::sql::{self, DatabaseName, TableName};

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
pub(super) fn mentions(query: &str, table: &TableName, own_database: &DatabaseName) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clickhouse::schemer::fixtures::{dist, names, table};
    use crate::clickhouse::schemer::{DiscoveredDatabase, SourceSchema, replicated_objects};

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
