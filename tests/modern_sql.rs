//! The statements the operator sends only to servers newer than the test servers (18.16),
//! checked by a current ClickHouse parser: chDB 4.4 (ClickHouse as a Python module, installed from
//! PyPI by `hack/chdb.sh`) runs `SELECT formatQuery('…')` on each, which parses a statement
//! without running it. This proves the syntax only; what these statements do is proven nowhere
//! here (no current server can run on this machine).

use std::io::Write;
use std::process::{Command, Stdio};

use clickhouse_operator::clickhouse::sql::{
    self, ClusterName, DatabaseName, ReplicaMacro, ShardMacro, Source, TableName,
};
use clickhouse_operator::clickhouse::version::CAPABILITIES;
use clickhouse_operator::clickhouse::{Version, backup};

mod chdb;
use chdb::chdb_python;

/// For each statement: `Ok(formatted)` or `Err(parser error)`.
fn parse_all(statements: &[String]) -> Vec<Result<String, String>> {
    const SCRIPT: &str = r#"
import json, sys, chdb
out = []
for s in json.load(sys.stdin):
    lit = "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"
    try:
        out.append({"ok": str(chdb.query("SELECT formatQuery(" + lit + ")", "TSVRaw")).strip()})
    except Exception as e:
        out.append({"err": str(e).splitlines()[0]})
print(json.dumps(out))
"#;
    let mut child = Command::new(chdb_python())
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run chDB");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(statements).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "chDB's script failed");
    let v: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    v.into_iter()
        .map(|r| match r.get("ok") {
            Some(s) => Ok(s.as_str().unwrap_or_default().to_string()),
            None => Err(r["err"].as_str().unwrap_or_default().to_string()),
        })
        .collect()
}

/// Every statement the SQL builders produce for `v` (with names that need quoting).
fn statements_for(v: Version) -> Vec<String> {
    let cluster = ClusterName("c1".into());
    let table = TableName::new("my db", "ev`ents");
    let db = DatabaseName("my db".into());
    let replica = ReplicaMacro("c1-0-3".into());
    let mut statements = vec![
        sql::sync_replica(v, &table),
        sql::drop_table(v, &table),
        sql::drop_database(v, &db),
        sql::discover_databases(v, Source::AllReplicas(&cluster)),
        sql::discover_tables(v, Source::AllReplicas(&cluster)),
    ];
    statements.extend(sql::discover_functions(v, Source::AllReplicas(&cluster)));
    statements.extend(sql::discover_dictionaries(v));
    statements.extend(sql::drop_replica(v, &replica, &table));
    statements.extend(sql::drop_replica_from_path(
        v,
        &replica,
        "/clickhouse/tables/3/my db/ev'ents",
    ));
    statements.push(sql::replicated_engines().to_string());
    statements.push(sql::table_uuid(&table));
    statements.push(sql::macros().to_string());
    statements.extend(sql::drop_database_replica(
        v,
        &ShardMacro("0".into()),
        &replica,
        &db,
    ));
    statements
}

/// docs/testing.md, "What is proven on which ClickHouse": every statement the builders produce for
/// every version row of `clickhouse::version::CAPABILITIES` at or above 22 (and a current 25.8),
/// plus the backup and restore statements (`BACKUP … TO S3(…) ASYNC` with and without
/// `base_backup`, `system.backups`, `RESTORE … FROM S3(…)`), parses on a current ClickHouse and
/// round-trips (formatting the formatted statement gives it back); a statement with a syntax error
/// is refused, so the check can fail. Replica removal and schema copy are covered through
/// `SYSTEM SYNC REPLICA … LIGHTWEIGHT`, `SYSTEM DROP [DATABASE] REPLICA`, `DROP … SYNC` and
/// discovery through `clusterAllReplicas`.
#[test]
fn modern_statements_parse_and_round_trip_on_a_current_clickhouse() {
    let mut versions: Vec<Version> = CAPABILITIES
        .iter()
        .map(|(_, v)| *v)
        .filter(|v| *v >= Version::new(22, 0))
        .chain([Version::new(25, 8)])
        .collect();
    versions.sort();
    versions.dedup();
    let mut statements: Vec<String> = backup::modern_examples();
    for v in &versions {
        for s in statements_for(*v) {
            if !statements.contains(&s) {
                statements.push(s);
            }
        }
    }
    println!("{} statements for versions {versions:?}", statements.len());
    let broken = "BACKUP DATABASE `db` TO S3('http://s3/b/', 'a', 's' SETTINGS ASYNC".to_string();
    statements.push(broken.clone());
    let results = parse_all(&statements);
    let (last, checked) = results.split_last().unwrap();
    assert!(last.is_err(), "the broken statement was accepted: {broken}");
    let failed: Vec<String> = statements
        .iter()
        .zip(checked)
        .filter_map(|(s, r)| r.as_ref().err().map(|e| format!("{s}\n  → {e}")))
        .collect();
    assert!(failed.is_empty(), "refused by chDB:\n{}", failed.join("\n"));
    assert_eq!(checked.len(), statements.len() - 1);
    let formatted: Vec<String> = checked.iter().map(|r| r.clone().unwrap()).collect();
    let again = parse_all(&formatted);
    for ((s, f), g) in statements.iter().zip(&formatted).zip(&again) {
        println!("ok: {s}\n  ≡ {f}");
        assert_eq!(g.as_ref(), Ok(f), "does not round-trip: {s}");
    }
}

/// Decision 29: a restore runs a backup's statements only as the operator's lexer rebuilds
/// them from their tokens (`backup::checks`). Modern `CREATE` statements of every kind a backup
/// holds (codecs, TTLs, lambdas, array and tuple access, negative enum values, `DEFINER`,
/// projections, indexes, JSON and Map types, settings) mean the same after the rebuild: a
/// current ClickHouse formats the rebuilt text exactly as it formats the original, so the checks
/// that passed on the tokens passed on what runs.
#[test]
fn statements_rebuilt_from_tokens_mean_what_the_backup_said() {
    use clickhouse_operator::clickhouse::lexer::{render, tokenize};
    let originals = [
        "CREATE TABLE default.events (`batch` UInt64, `id` UInt64 CODEC(Delta(8), ZSTD(3)), `payload` String DEFAULT concat('a\\'b', toString(id)), `tags` Array(LowCardinality(String)), `first` String MATERIALIZED tags[1], `t` Tuple(a UInt8, b String), `a` UInt8 ALIAS t.1, `e` Enum8('neg' = -1, 'pos' = 1), `m` Map(String, UInt64), INDEX ix payload TYPE bloom_filter(0.01) GRANULARITY 4, PROJECTION p (SELECT batch, count() GROUP BY batch)) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/events', '{replica}') PARTITION BY batch ORDER BY (batch, id) TTL toDateTime(batch) + toIntervalDay(30) SETTINGS index_granularity = 8192, storage_policy = 'tiered'",
        "CREATE TABLE default.dist (`batch` UInt64) ENGINE = Distributed('c1', 'default', 'events', rand())",
        "CREATE VIEW default.v (`n` UInt64) DEFINER = analyst SQL SECURITY DEFINER AS SELECT count() AS n FROM default.events WHERE arrayExists(x -> (x = 'a'), tags) AND (id > 0.5e-3) AND (e = 'neg')",
        "CREATE MATERIALIZED VIEW default.mv TO default.totals (`batch` UInt64, `c` UInt64) AS SELECT batch, count() AS c FROM default.events GROUP BY batch",
        "CREATE TABLE default.j (`doc` JSON, `d` DateTime64(3, 'UTC') DEFAULT now64(3), `x` Nullable(Decimal(10, 2)) COMMENT 'it''s') ENGINE = MergeTree ORDER BY tuple() COMMENT 'a /* not a comment */ table'",
        "CREATE DATABASE IF NOT EXISTS `my db` ENGINE = Replicated('/clickhouse/databases/my db', '{shard}', '{replica}')",
    ];
    let rebuilt: Vec<String> = originals
        .iter()
        .map(|s| render(&tokenize(s).expect("lexed")))
        .collect();
    let mut all: Vec<String> = originals.iter().map(|s| s.to_string()).collect();
    all.extend(rebuilt.iter().cloned());
    let formatted = parse_all(&all);
    let (before, after) = formatted.split_at(originals.len());
    for ((o, r), (b, a)) in originals.iter().zip(&rebuilt).zip(before.iter().zip(after)) {
        println!("{o}\n  rebuilt: {r}");
        let b = b
            .as_ref()
            .unwrap_or_else(|e| panic!("the original does not parse: {e}\n{o}"));
        assert_eq!(
            a.as_ref(),
            Ok(b),
            "the rebuilt statement means something else:\n{r}"
        );
    }
}
