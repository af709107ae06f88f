//! What a restore creates for views, materialized views and replicated tables, on the 26.x
//! engine (decision 64). The bucket's statements are first run as written, to show what they
//! would have run as; then the restore's checks rebuild them (`backup::checks::check_shard`),
//! the statements for this server are taken as the agent takes them (its version and
//! `ignore_empty_sql_security_in_create_view_query`, read with the agent's own query) and run,
//! and what the engine kept (`system.tables.definer`, `create_table_query`) is read back and
//! checked as the agent checks it (`CheckedTable::check_created`).
//!
//! chDB's session is always `default`, so `CURRENT_USER` and an omitted definer come out as
//! `default` here; the agent's session is the operator's account (`clickhouse_operator`),
//! which is what they would be in a restore. Who may then read a view is not run here (nobody
//! logs in to chDB): the clause the engine kept is what decides it. Replicated tables and
//! databases need a Keeper, which chDB has not: their rebuilt statements are parsed
//! (`formatQuery`), not created.

use std::collections::BTreeMap;

use clickhouse_operator::backup::checks::{self, Allow, CheckedShard, Kind, Server};
use clickhouse_operator::clickhouse::lexer::quote_string;
use clickhouse_operator::model::manifest::{FORMAT, ShardManifest, Table};
use clickhouse_operator::model::names;

use crate::support::{build, c1, lay_out, run};

/// The hostile forms of review H-1: each name, and its clause.
const FORMS: &[(&str, &str)] = &[
    (
        "quoted",
        "DEFINER 'clickhouse_operator' SQL SECURITY DEFINER",
    ),
    (
        "no_equals",
        "DEFINER clickhouse_operator SQL SECURITY DEFINER",
    ),
    ("current_user", "DEFINER CURRENT_USER SQL SECURITY DEFINER"),
    ("alone", "SQL SECURITY DEFINER"),
    ("default", "DEFINER = default SQL SECURITY DEFINER"),
];

fn table(name: &str, engine: &str, create: String) -> Table {
    Table {
        database: "restored".into(),
        name: name.into(),
        engine: engine.into(),
        create,
        parts: vec![],
    }
}

/// A manifest holding the bucket's statements: the two tables, a view in each hostile form, a
/// materialized view without a clause and one naming `default`.
fn manifest() -> ShardManifest {
    let mut tables = vec![
        table(
            "events",
            "MergeTree",
            "CREATE TABLE restored.events (batch UInt64) ENGINE = MergeTree ORDER BY batch".into(),
        ),
        table(
            "copy",
            "MergeTree",
            "CREATE TABLE restored.copy (batch UInt64) ENGINE = MergeTree ORDER BY batch".into(),
        ),
    ];
    for (name, clause) in FORMS {
        tables.push(table(
            &format!("v_{name}"),
            "View",
            format!("CREATE VIEW restored.v_{name} {clause} AS SELECT batch FROM restored.events"),
        ));
    }
    tables.push(table(
        "mv_plain",
        "MaterializedView",
        "CREATE MATERIALIZED VIEW restored.mv_plain TO restored.copy AS SELECT batch FROM restored.events"
            .into(),
    ));
    tables.push(table(
        "mv_default",
        "MaterializedView",
        "CREATE MATERIALIZED VIEW restored.mv_default TO restored.copy DEFINER = default SQL SECURITY DEFINER AS SELECT batch FROM restored.events"
            .into(),
    ));
    ShardManifest {
        format: FORMAT,
        backup: "b1".into(),
        shard: 0,
        databases: BTreeMap::from([("restored".into(), "CREATE DATABASE restored".into())]),
        tables,
        ..ShardManifest::default()
    }
}

/// What the agent reads of a server, from chDB's answers to its queries.
fn server_of(version: &str, keeps: &[String]) -> Server {
    Server {
        version: version.parse().unwrap(),
        keeps_empty_sql_security: keeps.first().is_some_and(|v| v == "1"),
    }
}

const KEPT: &str = "SELECT name, definer, create_table_query FROM system.tables \
     WHERE database = 'restored' AND engine IN ('View', 'MaterializedView') ORDER BY name";

/// Decision 61 (review H-1, 1-3): run as written, the bucket's views run as the operator
/// (a quoted name, no `=`, `CURRENT_USER`, `SQL SECURITY DEFINER` alone: the creator) or as
/// `default`, and a refreshable view's definer is its creator; rebuilt by the restore, every
/// view is `SQL SECURITY INVOKER` with no definer and every materialized view has no definer
/// (the engine keeps its clause empty: `ignore_empty_sql_security_in_create_view_query` is on),
/// exactly what the agent then checks.
#[test]
fn the_buckets_views_would_run_as_the_operator_and_rebuilt_ones_run_as_their_readers() {
    let (c, mut i) = c1(serde_json::json!({}));
    i.server_version = Some("26.9.2.1".parse().unwrap());
    let d = build(&c, &i);
    let layout = lay_out("restores", &d, "c1-0-0", "");
    let m = manifest();
    // the bucket's statements as written (chDB's `:memory:` state ends with each run)
    let mut queries: Vec<String> = vec![
        "CREATE DATABASE restored".into(),
        "SELECT version()".into(),
        checks::KEEPS_EMPTY_SQL_SECURITY.into(),
    ];
    queries.extend(m.tables.iter().map(|t| t.create.clone()));
    queries.push(
        "CREATE MATERIALIZED VIEW restored.refresh REFRESH EVERY 1 HOUR APPEND TO restored.copy EMPTY AS SELECT batch FROM restored.events".into(),
    );
    queries.push(KEPT.into());
    let refs: Vec<&str> = queries.iter().map(String::as_str).collect();
    let r = run(&layout, &refs);
    for (n, q) in refs.iter().enumerate().take(refs.len() - 1) {
        assert!(r.results[n].is_ok(), "{q}: {:?}", r.results[n]);
    }
    let server = server_of(&r.rows(1)[0], &r.rows(2));
    assert!(
        server.keeps_empty_sql_security,
        "26.9 keeps it on by default"
    );
    let definers: Vec<(String, String)> = r
        .rows(refs.len() - 1)
        .iter()
        .map(|row| {
            let mut f = row.split('\t');
            (f.next().unwrap().into(), f.next().unwrap().into())
        })
        .collect();
    let op = names::OPERATOR_USER;
    assert_eq!(
        definers,
        [
            ("mv_default", "default"),
            ("mv_plain", ""),
            ("refresh", "default"),
            ("v_alone", "default"),
            ("v_current_user", "default"),
            ("v_default", "default"),
            ("v_no_equals", op),
            ("v_quoted", op),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string())),
        "what the bucket's statements run as ({op} for CURRENT_USER and an omitted definer in a restore)"
    );
    // rebuilt by the restore, for this server
    let checked: CheckedShard = checks::check_shard(&m, "b1", 0, Allow::default()).unwrap();
    let mut queries: Vec<String> = Vec::new();
    queries.extend(
        checked
            .statements_for(&server)
            .unwrap()
            .into_iter()
            .map(str::to_string),
    );
    queries.push(KEPT.into());
    let refs: Vec<&str> = queries.iter().map(String::as_str).collect();
    let r = run(&layout, &refs);
    for (n, q) in refs.iter().enumerate() {
        assert!(r.results[n].is_ok(), "{q}: {:?}", r.results[n]);
    }
    let kept = r.rows(refs.len() - 1);
    assert_eq!(kept.len(), FORMS.len() + 2, "{kept:#?}");
    for row in &kept {
        let f: Vec<&str> = row.splitn(3, '\t').collect();
        let (name, definer, create) = (f[0], f[1], f[2]);
        assert_eq!(definer, "", "{name}: {create}");
        let t = checked.tables.iter().find(|t| t.name == name).unwrap();
        match t.kind {
            Kind::View => assert!(
                create.contains(" SQL SECURITY INVOKER AS SELECT"),
                "{create}"
            ),
            _ => assert!(!create.contains("SQL SECURITY"), "{create}"),
        }
        assert_eq!(t.check_created(&server, create), Ok(()), "{name}");
    }
}

/// Decision 61 (review H-1, 2): on a server whose `ignore_empty_sql_security_in_create_view_query`
/// is off, a materialized view created without a clause gets the creator as its definer (the
/// operator, in a restore): the agent reads the setting with its own query, and the restore
/// refuses such a view there, naming it; views are still rebuilt `SQL SECURITY INVOKER`.
#[test]
fn with_empty_clauses_filled_in_a_materialized_view_would_run_as_its_creator_and_is_refused() {
    let (c, mut i) = c1(serde_json::json!({}));
    i.server_version = Some("26.9.2.1".parse().unwrap());
    let d = build(&c, &i);
    let layout = lay_out(
        "restores-filled",
        &d,
        "c1-0-0",
        "<ignore_empty_sql_security_in_create_view_query>0</ignore_empty_sql_security_in_create_view_query>",
    );
    let r = run(
        &layout,
        &[
            "SELECT version()",
            checks::KEEPS_EMPTY_SQL_SECURITY,
            "CREATE DATABASE restored",
            "CREATE TABLE restored.events (batch UInt64) ENGINE = MergeTree ORDER BY batch",
            "CREATE TABLE restored.copy (batch UInt64) ENGINE = MergeTree ORDER BY batch",
            "CREATE MATERIALIZED VIEW restored.mv_plain TO restored.copy AS SELECT batch FROM restored.events",
            KEPT,
        ],
    );
    let server = server_of(&r.rows(0)[0], &r.rows(1));
    assert!(!server.keeps_empty_sql_security);
    assert_eq!(
        r.rows(6),
        [
            "mv_plain\tdefault\tCREATE MATERIALIZED VIEW restored.mv_plain TO restored.copy (`batch` UInt64) DEFINER = default SQL SECURITY DEFINER AS SELECT batch FROM restored.events"
        ]
    );
    let checked = checks::check_shard(&manifest(), "b1", 0, Allow::default()).unwrap();
    let refused = checked.statements_for(&server).unwrap_err();
    assert!(
        matches!(&refused, checks::Refusal::MaterializedViewDefiner { object, .. } if object == "`restored`.`mv_default`" || object == "`restored`.`mv_plain`"),
        "{refused}"
    );
    let views: Vec<&str> = checked
        .tables
        .iter()
        .filter(|t| t.kind == Kind::View)
        .map(|t| t.statement_for(&server).unwrap())
        .collect();
    // the engine would fill INVOKER in here by itself; the restore writes it anyway
    assert!(
        views
            .iter()
            .all(|v| v.contains(" SQL SECURITY INVOKER AS SELECT"))
    );
    let mut queries = vec![
        "CREATE DATABASE restored",
        "CREATE TABLE restored.events (batch UInt64) ENGINE = MergeTree ORDER BY batch",
    ];
    queries.extend(views.iter().copied());
    queries.push(KEPT);
    let r = run(&layout, &queries);
    for row in r.rows(queries.len() - 1) {
        assert!(
            row.contains("\t\tCREATE VIEW") && row.contains(" SQL SECURITY INVOKER AS SELECT"),
            "{row}"
        );
    }
}

/// Review H-1, 4 and 5: the statements the restore writes for a replicated table, a
/// materialized view's replicated inner table, a `Replicated` database and a `Buffer` parse on
/// the 26.x engine with the cluster's own Keeper path in place of the bucket's (the `Buffer`
/// also runs); a refreshable view or a `Buffer` into another database is refused before that.
#[test]
fn rebuilt_keeper_paths_and_buffers_are_what_the_engine_reads() {
    let mut m = manifest();
    m.databases.insert(
        "restored".into(),
        "CREATE DATABASE restored ENGINE = Replicated('/clickhouse/databases/prod', 'x', 'y')"
            .into(),
    );
    m.tables = vec![
        table(
            "events",
            "ReplicatedMergeTree",
            "CREATE TABLE restored.events (batch UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/task_queue/ddl', 'evil') ORDER BY batch".into(),
        ),
        table(
            "mv",
            "MaterializedView",
            "CREATE MATERIALIZED VIEW restored.mv (batch UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/0/prod/orders', 'evil') ORDER BY batch AS SELECT batch FROM restored.events".into(),
        ),
        table(
            "buf",
            "Buffer",
            "CREATE TABLE restored.buf (batch UInt64) ENGINE = Buffer(restored, events, 1, 10, 100, 10000, 1000000, 10000000, 100000000)".into(),
        ),
    ];
    let checked = checks::check_shard(&m, "b1", 0, Allow::default()).unwrap();
    let server = Server {
        version: "26.9".parse().unwrap(),
        keeps_empty_sql_security: true,
    };
    let statements = checked.statements_for(&server).unwrap();
    let formatted: Vec<String> = statements
        .iter()
        .map(|s| format!("SELECT formatQuery({})", quote_string(s)))
        .collect();
    let (c, mut i) = c1(serde_json::json!({}));
    i.server_version = Some("26.9.2.1".parse().unwrap());
    let layout = lay_out("restores-keeper", &build(&c, &i), "c1-0-0", "");
    let buffer = *statements.iter().find(|s| s.contains("Buffer")).unwrap();
    let mut queries: Vec<&str> = formatted.iter().map(String::as_str).collect();
    queries.extend([
        "CREATE DATABASE restored",
        "CREATE TABLE restored.events (batch UInt64) ENGINE = MergeTree ORDER BY batch",
        buffer,
        "INSERT INTO restored.buf VALUES (7)",
        "SELECT batch FROM restored.buf",
    ]);
    let r = run(&layout, &queries);
    let parsed: Vec<String> = (0..formatted.len()).map(|n| r.rows(n).join("\n")).collect();
    let of = |what: &str| {
        parsed
            .iter()
            .find(|p| p.contains(what))
            .unwrap_or_else(|| panic!("no {what} in {parsed:#?}"))
    };
    assert!(
        of("CREATE DATABASE").contains(
            "ENGINE = Replicated('/clickhouse/databases/restored', '{shard}', '{replica}')"
        ),
        "{parsed:#?}"
    );
    assert!(
        of("restored.events").contains(
            "ReplicatedMergeTree('/clickhouse/tables/{shard}/restored/events', '{replica}')"
        ),
        "{parsed:#?}"
    );
    assert!(
        of("MATERIALIZED VIEW")
            .contains("ReplicatedMergeTree('/clickhouse/tables/{shard}/restored/mv', '{replica}')"),
        "{parsed:#?}"
    );
    assert!(
        of("restored.buf").contains("Buffer(restored, events,"),
        "{parsed:#?}"
    );
    for p in &parsed {
        assert!(
            !p.contains("prod") && !p.contains("task_queue") && !p.contains("evil"),
            "{p}"
        );
    }
    assert_eq!(r.rows(queries.len() - 1), ["7"]);
}
