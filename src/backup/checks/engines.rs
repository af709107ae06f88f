//! What an engine clause of a restored statement may say about Keeper and about other tables:
//! a `Replicated…MergeTree` table and a `Replicated` database get the cluster's own Keeper path
//! for their name, whatever the bucket wrote; a `Buffer` flushes only into a table of the
//! backup.
//!
//! ClickHouse takes a replicated table's Keeper path and replica name from its first two engine
//! arguments when both are literals (or constant expressions, which it evaluates to literals),
//! and otherwise from the server's `default_replica_path`/`default_replica_name`
//! (`registerStorageMergeTree.cpp`). Under the server's `zookeeper/root` (an external Keeper:
//! the cluster's own root) or on the cluster's own ensemble, a path from the bucket could still
//! name another table's replication group, its replicas' folder or the distributed DDL queue;
//! a path the restore writes itself cannot.

use std::collections::BTreeSet;

use super::{StatementRule, depth0};
use crate::clickhouse::lexer::Token;

/// Where a restored replicated table keeps its replication group in Keeper: one per shard and
/// table (`{shard}` is the shard macro every server of the cluster has), with each replica
/// under its own `{replica}` macro.
pub fn table_path(database: &str, table: &str) -> String {
    format!(
        "/clickhouse/tables/{{shard}}/{}/{}",
        segment(database),
        segment(table)
    )
}

/// Where a restored `Replicated` database keeps its DDL log in Keeper (one for the cluster;
/// each replica under `{shard}` and `{replica}`).
pub fn database_path(database: &str) -> String {
    format!("/clickhouse/databases/{}", segment(database))
}

/// A name as one Keeper path segment: `[A-Za-z0-9_.-]` kept, every other byte `%XX` (so no
/// `/`, no `{macro}`), and a name of dots only escaped whole (no `.` or `..` segment).
fn segment(name: &str) -> String {
    if name.bytes().all(|b| b == b'.') {
        return "%2E".repeat(name.len());
    }
    crate::model::manifest::escape(name)
}

/// The first `ENGINE [=] Name [(…)]` at bracket depth 0: the name, and the indexes of the
/// brackets around its arguments.
struct Engine {
    name: String,
    args: Option<(usize, usize)>,
}

fn engine(tokens: &[Token]) -> Result<Option<Engine>, StatementRule> {
    let d0 = depth0(tokens)?;
    let Some(at) = (0..tokens.len()).find(|&i| d0[i] && tokens[i].is_word("ENGINE")) else {
        return Ok(None);
    };
    let mut j = at + 1;
    if tokens.get(j).is_some_and(|t| t.is("=")) {
        j += 1;
    }
    let Some(name) = tokens.get(j).and_then(Token::name) else {
        return Ok(None);
    };
    let args = if tokens.get(j + 1).is_some_and(|t| t.is("(")) {
        Some((j + 1, closing(tokens, j + 1)?))
    } else {
        None
    };
    Ok(Some(Engine {
        name: name.to_string(),
        args,
    }))
}

/// The index of the bracket that closes the one at `open`.
fn closing(tokens: &[Token], open: usize) -> Result<usize, StatementRule> {
    let mut depth = 0i32;
    for (i, t) in tokens.iter().enumerate().skip(open) {
        if t.is("(") || t.is("[") {
            depth += 1;
        } else if t.is(")") || t.is("]") {
            depth -= 1;
            if depth == 0 {
                return Ok(i);
            }
        }
    }
    Err(StatementRule::Lex(
        crate::clickhouse::lexer::LexError::Unterminated("bracket", 0),
    ))
}

/// The arguments between the brackets at `open` and `close`, as index ranges split at the
/// commas of their own depth.
fn arguments(tokens: &[Token], open: usize, close: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    if close == open + 1 {
        return out;
    }
    let mut depth = 0i32;
    let mut start = open + 1;
    for (i, t) in tokens.iter().enumerate().take(close).skip(open + 1) {
        if t.is("(") || t.is("[") {
            depth += 1;
        } else if t.is(")") || t.is("]") {
            depth -= 1;
        } else if depth == 0 && t.is(",") {
            out.push((start, i));
            start = i + 1;
        }
    }
    out.push((start, close));
    out
}

/// A single string literal.
fn string(tokens: &[Token], (a, b): (usize, usize)) -> Option<&str> {
    match &tokens[a..b] {
        [Token::Str(s)] => Some(s),
        _ => None,
    }
}

/// A single name or string literal (how `Buffer` names its destination).
fn name_or_string(tokens: &[Token], (a, b): (usize, usize)) -> Option<&str> {
    match &tokens[a..b] {
        [Token::Word(s) | Token::Quoted(s) | Token::Str(s)] => Some(s),
        _ => None,
    }
}

/// A single bare or quoted name (an identifier, which ClickHouse does not evaluate).
fn identifier(tokens: &[Token], (a, b): (usize, usize)) -> bool {
    matches!(&tokens[a..b], [Token::Word(_) | Token::Quoted(_)])
}

/// Applies the engine rules to `tokens`, a table's body or a materialized view's clauses
/// before `AS`, for the object `database`.`table`. A `Replicated…MergeTree` engine whose first
/// two arguments are string literals gets [`table_path`] and `'{replica}'` in their place (the
/// path is returned); one whose arguments ClickHouse would evaluate to a path (an expression, a
/// number) is refused; one without them keeps the server's default. A `Buffer` must flush into
/// a table of `known`, named by a name or a string.
pub fn table(
    tokens: &mut Vec<Token>,
    database: &str,
    table: &str,
    known: &BTreeSet<(&str, &str)>,
) -> Result<Option<String>, StatementRule> {
    let Some(e) = engine(tokens)? else {
        return Ok(None);
    };
    let lower = e.name.to_ascii_lowercase();
    if lower.starts_with("replicated") && lower.ends_with("mergetree") {
        let Some((open, close)) = e.args else {
            return Ok(None);
        };
        let args = arguments(tokens, open, close);
        if args.len() < 2 || identifier(tokens, args[0]) || identifier(tokens, args[1]) {
            // the server's default_replica_path and default_replica_name (the table's own UUID)
            return Ok(None);
        }
        if string(tokens, args[0]).is_none() || string(tokens, args[1]).is_none() {
            return Err(StatementRule::KeeperPath(
                "is not a string literal followed by the replica's: ClickHouse would evaluate it",
            ));
        }
        let path = table_path(database, table);
        let (first, second) = (args[0], args[1]);
        tokens.splice(second.0..second.1, [Token::Str("{replica}".into())]);
        tokens.splice(first.0..first.1, [Token::Str(path.clone())]);
        return Ok(Some(path));
    }
    if lower == "buffer" {
        let args = e
            .args
            .map(|(open, close)| arguments(tokens, open, close))
            .unwrap_or_default();
        let destination = match args.as_slice() {
            [db, t, ..] => name_or_string(tokens, *db).zip(name_or_string(tokens, *t)),
            _ => None,
        };
        return match destination {
            Some((db, t)) if known.contains(&(db, t)) => Ok(None),
            Some((db, t)) => Err(StatementRule::Target {
                target: super::object(db, t),
            }),
            None => Err(StatementRule::Target {
                target: "a destination that is not a database and table name".into(),
            }),
        };
    }
    Ok(None)
}

/// Applies the engine rule of a database: a `Replicated` database with its three string
/// arguments gets [`database_path`], `'{shard}'` and `'{replica}'` in their place; one without
/// arguments keeps the server's defaults; any other arguments are refused.
pub fn database(tokens: &mut Vec<Token>, database: &str) -> Result<(), StatementRule> {
    let Some(e) = engine(tokens)? else {
        return Ok(());
    };
    if !e.name.eq_ignore_ascii_case("Replicated") {
        return Ok(());
    }
    let Some((open, close)) = e.args else {
        return Ok(());
    };
    let args = arguments(tokens, open, close);
    if args.is_empty() {
        return Ok(());
    }
    if args.len() != 3 || args.iter().any(|a| string(tokens, *a).is_none()) {
        return Err(StatementRule::KeeperPath(
            "is not three string literals (path, shard and replica)",
        ));
    }
    tokens.splice(
        open + 1..close,
        [
            Token::Str(database_path(database)),
            Token::Punct(","),
            Token::Str("{shard}".into()),
            Token::Punct(","),
            Token::Str("{replica}".into()),
        ],
    );
    Ok(())
}
