//! Views and materialized views of a restore, rebuilt from their parts as ClickHouse's
//! `ParserCreateViewQuery` reads them (decision 64).
//!
//! After the name come, for a materialized view, `REFRESH …`, then `TO [db.]table` or
//! `TO INNER UUID '…'`, then the column list (and an alias list), then the inner table's
//! `ENGINE …` and `POPULATE`/`EMPTY`, then the `DEFINER`/`SQL SECURITY` clause, `COMMENT '…'`,
//! `AS` and the query. The clause may also stand before `MATERIALIZED`/`VIEW`, which a restore
//! refuses with any statement that does not start `CREATE [MATERIALIZED] VIEW`.
//!
//! A restore keeps no `DEFINER` and no `SQL SECURITY` of the bucket, in whatever form the
//! parser takes it (`DEFINER = name`, `DEFINER name`, a quoted name or a string, `CURRENT_USER`,
//! `SQL SECURITY DEFINER` alone, either order), and names every `TO` target with its database.

use std::collections::BTreeSet;

use super::{StatementRule, depth0, engines, object, qualified};
use crate::clickhouse::lexer::{Token, render};

/// A `DEFINER`/`SQL SECURITY` clause as ClickHouse's `ParserSQLSecurity` reads it:
/// `DEFINER [=] {CURRENT_USER | name [@ host]}` (a name bare, quoted or a string literal) and
/// `SQL SECURITY {DEFINER | INVOKER | NONE}`, each at most once, in either order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Security {
    /// The definer as written (`CURRENT_USER` for the keyword).
    pub definer: Option<String>,
    /// `DEFINER`, `INVOKER` or `NONE`.
    pub kind: Option<String>,
    /// The index after the clause.
    pub end: usize,
}

impl Security {
    /// What the clause says, as `SHOW CREATE` would put it.
    pub fn describe(&self) -> String {
        let mut out = Vec::new();
        if let Some(d) = &self.definer {
            out.push(format!("DEFINER = {d}"));
        }
        if let Some(k) = &self.kind {
            out.push(format!("SQL SECURITY {k}"));
        }
        out.join(" ")
    }
}

/// The clause starting at `start`, if one does; `Err` where it starts but does not parse.
pub fn security_at(tokens: &[Token], start: usize) -> Result<Option<Security>, StatementRule> {
    let bad = || StatementRule::Clause("a DEFINER or SQL SECURITY clause that does not parse");
    let mut i = start;
    let (mut definer, mut kind) = (None, None);
    loop {
        if definer.is_none() && tokens.get(i).is_some_and(|t| t.is_word("DEFINER")) {
            i += 1;
            if tokens.get(i).is_some_and(|t| t.is("=")) {
                i += 1;
            }
            let user = match tokens.get(i) {
                Some(Token::Word(w) | Token::Quoted(w) | Token::Str(w)) => w.clone(),
                _ => return Err(bad()),
            };
            i += 1;
            if tokens.get(i).is_some_and(|t| t.is("@")) {
                match tokens.get(i + 1) {
                    Some(Token::Word(_) | Token::Quoted(_) | Token::Str(_)) => i += 2,
                    _ => return Err(bad()),
                }
            }
            definer = Some(user);
            continue;
        }
        if kind.is_none()
            && tokens.get(i).is_some_and(|t| t.is_word("SQL"))
            && tokens.get(i + 1).is_some_and(|t| t.is_word("SECURITY"))
        {
            let k = ["DEFINER", "INVOKER", "NONE"]
                .into_iter()
                .find(|k| tokens.get(i + 2).is_some_and(|t| t.is_word(k)))
                .ok_or_else(bad)?;
            kind = Some(k.to_string());
            i += 3;
            continue;
        }
        break;
    }
    Ok((i > start).then_some(Security {
        definer,
        kind,
        end: i,
    }))
}

fn starts_security(tokens: &[Token], i: usize) -> bool {
    tokens[i].is_word("DEFINER")
        || (tokens[i].is_word("SQL") && tokens.get(i + 1).is_some_and(|t| t.is_word("SECURITY")))
}

/// The clauses of a view's statement before its `AS`, and its query.
fn split(body: &[Token]) -> Result<(&[Token], &[Token]), StatementRule> {
    let d0 = depth0(body)?;
    let at = (0..body.len())
        .find(|&i| d0[i] && body[i].is_word("AS"))
        .ok_or(StatementRule::Clause("no AS SELECT"))?;
    Ok((&body[..at], &body[at + 1..]))
}

/// The `DEFINER`/`SQL SECURITY` clause of a view's statement as a server wrote it back
/// (`system.tables.create_table_query`), if it has one.
pub fn security_of(statement: &str) -> Result<Option<Security>, StatementRule> {
    let tokens = crate::clickhouse::lexer::tokenize(statement).map_err(StatementRule::Lex)?;
    let (head, _) = split(&tokens)?;
    let d0 = depth0(head)?;
    match (0..head.len()).find(|&i| d0[i] && starts_security(head, i)) {
        Some(i) => security_at(head, i),
        None => Ok(None),
    }
}

/// A view or materialized view, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    /// The statement with no `DEFINER` and no `SQL SECURITY`.
    pub plain: String,
    /// A view's statement with `SQL SECURITY INVOKER` (for servers that have the clause).
    pub invoker: Option<String>,
    /// A materialized view with `REFRESH`.
    pub refresh: bool,
    /// The Keeper path the restore gave a materialized view's inner table.
    pub keeper_path: Option<String>,
}

/// Checks and rebuilds a view (`materialized: false`) or materialized view; `body` is what
/// follows its name. A materialized view's `TO` targets (wherever they stand before `AS`,
/// `REFRESH … APPEND TO` included) must be tables of `known`; its inner table's engine follows
/// [`engines::table`]. A view has nothing but its column lists and a comment before `AS`.
pub fn check(
    materialized: bool,
    body: &[Token],
    database: &str,
    name: &str,
    known: &BTreeSet<(&str, &str)>,
) -> Result<View, StatementRule> {
    let (head, query) = split(body)?;
    let d0 = depth0(head)?;
    let mut kept: Vec<Token> = Vec::new();
    let mut security_seen = false;
    let mut target_seen = false;
    let mut refresh = false;
    let mut i = 0;
    while i < head.len() {
        let t = &head[i];
        if !d0[i] {
            kept.push(t.clone());
            i += 1;
            continue;
        }
        if starts_security(head, i) {
            // the bucket's clause is dropped; a second one is not where the parser takes one
            let s = security_at(head, i)?.ok_or(StatementRule::Clause(
                "a DEFINER or SQL SECURITY clause that does not parse",
            ))?;
            if security_seen {
                return Err(StatementRule::Clause("two DEFINER or SQL SECURITY clauses"));
            }
            security_seen = true;
            i = s.end;
            continue;
        }
        if t.is_word("REFRESH") {
            if !materialized {
                return Err(StatementRule::Clause("REFRESH on a view"));
            }
            refresh = true;
        }
        if t.is_word("TO") {
            let next = head.get(i + 1);
            if next.is_some_and(|n| n.is_word("INNER"))
                && head.get(i + 2).is_some_and(|n| n.is_word("UUID"))
                && matches!(head.get(i + 3), Some(Token::Str(_)))
            {
                // the inner table of another server; the server gives this one its own
                i += 4;
                continue;
            }
            if next.is_some_and(|n| n.is_word("VOLUME") || n.is_word("DISK")) {
                // a TTL's move, inside the inner table's engine clause
                kept.push(t.clone());
                i += 1;
                continue;
            }
            if !materialized {
                return Err(StatementRule::Clause("TO on a view"));
            }
            let (db, target, mut after) =
                qualified(head, i + 1).ok_or(StatementRule::NotCreate("materialized view"))?;
            let db = db.unwrap_or_else(|| database.to_string());
            if target_seen {
                return Err(StatementRule::Clause("two TO targets"));
            }
            target_seen = true;
            if !known.contains(&(db.as_str(), target.as_str())) {
                return Err(StatementRule::Target {
                    target: object(&db, &target),
                });
            }
            // a UUID would name the target by itself, whatever its name says
            if head.get(after).is_some_and(|n| n.is_word("UUID"))
                && matches!(head.get(after + 1), Some(Token::Str(_)))
            {
                after += 2;
            }
            // named with its database: an unqualified name would be the session's database's
            kept.extend([
                Token::Word("TO".into()),
                Token::Quoted(db),
                Token::Punct("."),
                Token::Quoted(target),
            ]);
            i = after;
            continue;
        }
        kept.push(t.clone());
        i += 1;
    }
    let mut keeper_path = None;
    if materialized {
        keeper_path = engines::table(&mut kept, database, name, known)?;
    } else {
        view_clauses(&kept)?;
    }
    let kind = if materialized {
        "MATERIALIZED VIEW"
    } else {
        "VIEW"
    };
    let statement = |head: &[Token]| {
        let mut tokens = head.to_vec();
        tokens.push(Token::Word("AS".into()));
        tokens.extend_from_slice(query);
        format!(
            "CREATE {kind} IF NOT EXISTS {} {}",
            object(database, name),
            render(&tokens)
        )
    };
    let invoker = (!materialized).then(|| {
        let d0 = depth0(&kept).unwrap_or_default();
        let at = (0..kept.len())
            .find(|&i| {
                d0.get(i) == Some(&true)
                    && kept[i].is_word("COMMENT")
                    && matches!(kept.get(i + 1), Some(Token::Str(_)))
            })
            .unwrap_or(kept.len());
        let mut head = kept.clone();
        head.splice(
            at..at,
            ["SQL", "SECURITY", "INVOKER"].map(|w| Token::Word(w.into())),
        );
        statement(&head)
    });
    Ok(View {
        plain: statement(&kept),
        invoker,
        refresh,
        keeper_path,
    })
}

/// What a view may have before `AS`: its column list (and an alias list) and a comment.
fn view_clauses(head: &[Token]) -> Result<(), StatementRule> {
    let d0 = depth0(head)?;
    let mut i = 0;
    while i < head.len() {
        if !d0[i] || head[i].is("(") || head[i].is(")") {
            i += 1;
        } else if head[i].is_word("COMMENT") && matches!(head.get(i + 1), Some(Token::Str(_))) {
            i += 2;
        } else {
            return Err(StatementRule::Clause(
                "clauses a view does not take before AS",
            ));
        }
    }
    Ok(())
}
