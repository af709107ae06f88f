//! Integration tests of `clickhouse_operator::clickhouse` against real servers: Debian's
//! ClickHouse 18.16 and ZooKeeper 3.8, started by `clickhouse/harness.rs` on loopback
//! addresses.
//!
//! What 18.16 cannot run, and is therefore proven by the exact-SQL unit tests in
//! `src/clickhouse/sql.rs` instead (decision 17): `SYSTEM SYNC REPLICA … LIGHTWEIGHT`,
//! `SYSTEM DROP REPLICA`, `SYSTEM DROP DATABASE REPLICA`, `DROP … SYNC`, `clusterAllReplicas`
//! discovery with `skip_unavailable_shards`, `engine_full` for databases, table UUIDs,
//! `CREATE FUNCTION`, DDL dictionaries and Replicated databases — 18.16 answers a syntax
//! error or "Unknown table function" (see
//! `modern_statements_are_refused_by_18_16_so_the_fallbacks_are_chosen`). The "replica is
//! active" refusal of `SYSTEM DROP REPLICA` cannot occur on 18.16 for the same reason; its
//! classification is unit-tested in `src/clickhouse/client.rs`.

#[path = "clickhouse/harness.rs"]
mod harness;

use std::collections::BTreeSet;
use std::time::Duration;

use clickhouse_operator::api::schema_policy::{ReplicaPolicy, SchemaPolicy, ShardPolicy};
use clickhouse_operator::clickhouse::client::{Client, ErrorCode, QueryOptions};
use clickhouse_operator::clickhouse::replica::{self, LeavingReplica};
use clickhouse_operator::clickhouse::schemer::{self, MigrationSources, ObjectName, Topology};
use clickhouse_operator::clickhouse::sql::{self, ClusterName, ReplicaMacro, ShardMacro};
use clickhouse_operator::clickhouse::version::Version;

use harness::{Harness, exec_all, scalar, user_tables};

/// Tests share two cores: one cluster at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

fn cluster() -> ClusterName {
    ClusterName(harness::CLUSTER.into())
}

/// The fixture of an existing shard: ReplicatedMergeTree tables in two databases, a view, a
/// materialized view, an unreferenced MergeTree table, and a Distributed table over a local
/// table in another database (S1-14's `db2.t_local`). Created on each server: `ON CLUSTER`
/// cannot run on loopback addresses.
async fn create_fixture(clients: &[&Client]) {
    for sql in [
        "CREATE DATABASE IF NOT EXISTS db1",
        "CREATE DATABASE IF NOT EXISTS db2",
        "CREATE TABLE IF NOT EXISTS db1.events (d Date DEFAULT today(), id UInt64, s String) \
         ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/db1/events', '{replica}') \
         PARTITION BY toYYYYMM(d) ORDER BY id",
        "CREATE VIEW IF NOT EXISTS db1.v AS SELECT id, s FROM db1.events",
        "CREATE MATERIALIZED VIEW IF NOT EXISTS db1.mv ENGINE = MergeTree ORDER BY id \
         AS SELECT id FROM db1.events",
        "CREATE TABLE IF NOT EXISTS db1.unreferenced (x UInt8) ENGINE = MergeTree ORDER BY x",
        "CREATE TABLE IF NOT EXISTS db2.t_local (id UInt64, shard String) \
         ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/db2/t_local', '{replica}') ORDER BY id",
        "CREATE TABLE IF NOT EXISTS db1.dist AS db2.t_local \
         ENGINE = Distributed(c1, db2, t_local, rand())",
    ] {
        exec_all(clients, sql).await;
    }
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

const ALL: &[&str] = &[
    "db1.dist",
    "db1.events",
    "db1.mv",
    "db1.unreferenced",
    "db1.v",
    "db2.t_local",
];
const DISTRIBUTED_ONLY: &[&str] = &["db1.dist", "db2.t_local"];
const REPLICATED_ONLY: &[&str] = &[
    "db1.events",
    "db1.mv",
    "db1.unreferenced",
    "db1.v",
    "db2.t_local",
];

/// S1-01, S1-04, S1-11, S1-27, S0-20: a third replica gets the same tables as the first
/// (compare `system.tables`), replicated objects before distributed ones, and a row inserted on
/// replica 1 is read on replica 3 through ZooKeeper.
#[tokio::test]
async fn added_replica_gets_the_shards_tables_and_replicates() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::new(1, &[(1, "r1"), (1, "r2"), (1, "r3")]);
    h.start("r1");
    h.start("r2");
    let (r1, r2) = (h.client("r1"), h.client("r2"));
    create_fixture(&[&r1, &r2]).await;
    exec_all(
        &[&r1],
        "INSERT INTO db1.events (id, s) VALUES (1, 'before')",
    )
    .await;

    h.start("r3");
    let r3 = h.client("r3");
    let peers = [r1.clone(), r2.clone()];
    let c = cluster();
    let sources = MigrationSources {
        cluster: &c,
        shard_peers: &peers,
        other_shards: &[],
    };
    let topology = Topology {
        hosts: 3,
        shard_replicas: 3,
    };
    let outcome = schemer::migrate_new_host(&r3, sources, SchemaPolicy::default(), topology)
        .await
        .unwrap_or_else(|e| panic!("{e}: {:?}", e.outcome));

    assert_eq!(user_tables(&r3).await, user_tables(&r1).await);
    assert_eq!(user_tables(&r3).await, set(ALL));

    // S1-04: every replicated-batch object precedes every distributed-batch object.
    let replicated = outcome.replicated.as_ref().map(|b| b.created.len());
    let created = outcome.created();
    assert_eq!(created.len(), replicated.unwrap_or(0) + 1, "{created:?}");
    assert_eq!(
        created.last(),
        Some(&&ObjectName::Table(sql::TableName::new("db1", "dist")))
    );
    // Decision 11: databases before tables, the view and MV after their source.
    let pos = |n: &str| {
        created
            .iter()
            .position(|o| matches!(o, ObjectName::Table(t) if format!("{}.{}", t.database.0, t.name) == n))
            .unwrap_or(usize::MAX)
    };
    assert!(pos("db1.events") < pos("db1.v") && pos("db1.events") < pos("db1.mv"));
    assert!(matches!(created[0], ObjectName::Database(_)));

    // Real replication: the row written before, and a row written on r1 now.
    exec_all(&[&r1], "INSERT INTO db1.events (id, s) VALUES (2, 'after')").await;
    replica::sync_shard(&r3, SYNC_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(scalar(&r3, "SELECT count() AS v FROM db1.events").await, 2);
    assert_eq!(
        scalar(&r3, "SELECT count() AS v FROM db1.v WHERE s = 'after'").await,
        1
    );
    // S2-29: the new replica has caught up.
    let lag = replica::replication_lag(&r3)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(lag.is_synced(), "{lag:?}");
    assert_eq!(lag.tables.len(), 2);

    // S1-27: running it again is harmless.
    schemer::migrate_new_host(&r3, sources, SchemaPolicy::default(), topology)
        .await
        .unwrap_or_else(|e| panic!("second run: {e}"));
    assert_eq!(user_tables(&r3).await, set(ALL));

    // S1-02 / S1-05: the DDL arrived over HTTP (interface 2) and each CREATE has IF NOT EXISTS.
    exec_all(&[&r3], "SYSTEM FLUSH LOGS").await;
    assert!(
        scalar(
            &r3,
            "SELECT count() AS v FROM system.query_log WHERE type = 1 AND interface = 2 \
             AND query LIKE 'CREATE TABLE IF NOT EXISTS%'"
        )
        .await
            >= 4
    );
    assert_eq!(
        scalar(
            &r3,
            "SELECT count() AS v FROM system.query_log WHERE type = 1 AND query LIKE 'CREATE%' \
             AND (interface != 2 OR query NOT LIKE '%IF NOT EXISTS%')"
        )
        .await,
        0
    );
}

/// S1-03, S1-14, S1-23: a new shard gets the Distributed table and the local table it points to
/// (in another database), and a query through the Distributed table counts the rows of both
/// shards.
#[tokio::test]
async fn new_shard_gets_distributed_and_local_table_and_counts_both_shards() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::new(2, &[(1, "r1"), (1, "r2"), (2, "s2r1")]);
    h.start("r1");
    h.start("r2");
    let (r1, r2) = (h.client("r1"), h.client("r2"));
    create_fixture(&[&r1, &r2]).await;
    exec_all(
        &[&r1],
        "INSERT INTO db2.t_local VALUES (1, 'one'), (2, 'one'), (3, 'one')",
    )
    .await;

    h.start("s2r1");
    let s2 = h.client("s2r1");
    let shard1 = [r1.clone(), r2.clone()];
    let c = cluster();
    let sources = MigrationSources {
        cluster: &c,
        shard_peers: &[],
        other_shards: &shard1,
    };
    let policy = SchemaPolicy {
        replica: ReplicaPolicy::All,
        shard: ShardPolicy::DistributedTablesOnly,
    };
    let topology = Topology {
        hosts: 3,
        shard_replicas: 1,
    };
    let outcome = schemer::migrate_new_host(&s2, sources, policy, topology)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(outcome.replicated.is_none());
    assert_eq!(user_tables(&s2).await, set(DISTRIBUTED_ONLY));
    // S1-03: databases, then the local table, then the Distributed table.
    let kinds: Vec<String> = outcome
        .created()
        .iter()
        .map(|o| match o {
            ObjectName::Database(d) => format!("db {}", d.0),
            ObjectName::Table(t) => format!("{}.{}", t.database.0, t.name),
            ObjectName::Function(f) => f.clone(),
        })
        .collect();
    assert_eq!(kinds, ["db db1", "db db2", "db2.t_local", "db1.dist"]);

    exec_all(
        &[&s2],
        "INSERT INTO db2.t_local VALUES (10, 'two'), (11, 'two')",
    )
    .await;
    for c in [&r1, &s2] {
        assert_eq!(
            scalar(c, "SELECT count() AS v FROM db1.dist").await,
            5,
            "through the Distributed table on {}",
            c.endpoint()
        );
        assert_eq!(
            scalar(c, "SELECT uniqExact(shard) AS v FROM db1.dist").await,
            2
        );
    }

    // S1-23: the shard removed again. Its only host drops its objects (no survivor in the
    // shard can run SYSTEM DROP REPLICA, and 18.16 has none): nothing of the shard's table
    // is left in ZooKeeper, and shard 1 still answers through its
    // Distributed table (the topology still lists shard 2, hence skip_unavailable_shards).
    let dropped = replica::drop_leaving_objects(&s2)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(dropped.tables.len(), 1, "{dropped:?}");
    h.kill("s2r1");
    // 18.16 removes the whole table path with its last replica.
    assert_eq!(
        keeper_replicas(&r1, "/clickhouse/tables/1/db2").await,
        ["t_local"]
    );
    assert!(
        keeper_replicas(&r1, "/clickhouse/tables/2/db2")
            .await
            .is_empty()
    );
    let rows = r1
        .query(
            "SELECT count() AS v FROM db1.dist",
            &QueryOptions::new()
                .setting("skip_unavailable_shards", 1)
                .setting("connect_timeout", 1)
                .setting("connect_timeout_with_failover_ms", 100)
                .setting("connections_with_failover_max_tries", 1),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(rows.iter().next().map(|r| r.u64("v")), Some(Ok(3)));
}

/// S1-07, S1-08, S1-13, S1-25: each schemaPolicy value creates exactly what it promises, on a
/// new shard host and on a new replica host; the target is wiped between cases (dropping its
/// databases also unregisters its replicas).
#[tokio::test]
async fn each_schema_policy_creates_exactly_what_it_promises() {
    use ReplicaPolicy as R;
    use ShardPolicy as S;
    let _serial = SERIAL.lock().await;
    let mut h = Harness::new(3, &[(1, "r1"), (1, "r2"), (1, "r3"), (2, "s2r1")]);
    for n in ["r1", "r2", "r3", "s2r1"] {
        h.start(n);
    }
    let (r1, r2, r3, s2) = (
        h.client("r1"),
        h.client("r2"),
        h.client("r3"),
        h.client("s2r1"),
    );
    create_fixture(&[&r1, &r2]).await;
    let shard1 = [r1.clone(), r2.clone()];
    let c = cluster();

    // (target, policy, expected objects)
    let new_shard = [
        (R::All, S::All, ALL),
        (R::None, S::All, ALL), // S1-07: shard All wins over replica None
        (R::All, S::DistributedTablesOnly, DISTRIBUTED_ONLY),
        (R::None, S::DistributedTablesOnly, DISTRIBUTED_ONLY),
        (R::All, S::None, &[][..]), // S1-08: no source in a one-replica shard; S1-13
        (R::None, S::None, &[][..]),
    ];
    for (replica, shard, want) in new_shard {
        let policy = SchemaPolicy { replica, shard };
        let sources = MigrationSources {
            cluster: &c,
            shard_peers: &[],
            other_shards: &shard1,
        };
        let topology = Topology {
            hosts: 4,
            shard_replicas: 1,
        };
        schemer::migrate_new_host(&s2, sources, policy, topology)
            .await
            .unwrap_or_else(|e| panic!("{policy:?}: {e}"));
        assert_eq!(user_tables(&s2).await, set(want), "new shard, {policy:?}");
        wipe(&s2).await;
    }

    let new_replica = [
        (R::All, S::All, ALL),
        (R::All, S::None, REPLICATED_ONLY),
        (R::All, S::DistributedTablesOnly, ALL),
        (R::None, S::DistributedTablesOnly, DISTRIBUTED_ONLY),
        (R::None, S::All, ALL),
        (R::None, S::None, &[][..]), // S1-08
    ];
    for (replica, shard, want) in new_replica {
        let policy = SchemaPolicy { replica, shard };
        let sources = MigrationSources {
            cluster: &c,
            shard_peers: &shard1,
            other_shards: &[],
        };
        let topology = Topology {
            hosts: 4,
            shard_replicas: 3,
        };
        schemer::migrate_new_host(&r3, sources, policy, topology)
            .await
            .unwrap_or_else(|e| panic!("{policy:?}: {e}"));
        assert_eq!(user_tables(&r3).await, set(want), "new replica, {policy:?}");
        wipe(&r3).await;
    }
}

async fn wipe(c: &Client) {
    exec_all(&[c], "DROP DATABASE IF EXISTS db1").await;
    exec_all(&[c], "DROP DATABASE IF EXISTS db2").await;
}

async fn keeper_replicas(c: &Client, path: &str) -> Vec<String> {
    replica::keeper_children(c, path)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// S0-25, S1-16…S1-21, S0-27 (18.16 fallback, decision 2) and invariant 8: rows written on the
/// leaving replica reach the backup replica through the sync; after its objects are dropped on
/// it, its node under each table's Keeper path is gone; a replica added under a new name works,
/// and a replica that vanished without the flow is reported as left behind (18.16 cannot drop
/// it) and makes its old name fail with `REPLICA_ALREADY_EXISTS`, which is why names are never
/// reused.
#[tokio::test]
async fn removed_replica_leaves_nothing_in_keeper_and_a_new_replica_works() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::new(4, &[(1, "r1"), (1, "r2"), (1, "r3"), (1, "r4")]);
    for n in ["r1", "r2", "r3"] {
        h.start(n);
    }
    let (r1, r2, r3) = (h.client("r1"), h.client("r2"), h.client("r3"));
    create_fixture(&[&r1, &r2, &r3]).await;
    // Rows written on the leaving replica just before the scale-in (S0-25).
    exec_all(
        &[&r3],
        "INSERT INTO db1.events (id, s) VALUES (7, 'on r3'), (8, 'on r3')",
    )
    .await;

    // Step 3 on the backup replica r1: SYSTEM SYNC REPLICA (plain form on 18.16).
    let synced = replica::sync_shard(&r1, SYNC_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(synced.len(), 2, "{synced:?}");
    assert_eq!(
        scalar(&r1, "SELECT count() AS v FROM db1.events WHERE s = 'on r3'").await,
        2
    );

    // Decision 2: drop the leaving replica's objects on it while it runs.
    let dropped = replica::drop_leaving_objects(&r3)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let dropped_names: BTreeSet<String> = dropped
        .tables
        .iter()
        .map(|t| format!("{}.{}", t.database.0, t.name))
        .collect();
    // S1-18: MergeTree tables and views, the Distributed table left alone.
    assert_eq!(
        dropped_names,
        set(&[
            "db1.events",
            "db1.mv",
            "db1.unreferenced",
            "db1.v",
            "db2.t_local"
        ])
    );
    assert!(dropped.dictionaries.is_empty() && dropped.databases.is_empty());
    h.kill("r3");

    let events = "/clickhouse/tables/1/db1/events/replicas";
    let local = "/clickhouse/tables/1/db2/t_local/replicas";
    assert_eq!(keeper_replicas(&r1, events).await, ["r1", "r2"]);
    assert_eq!(keeper_replicas(&r1, local).await, ["r1", "r2"]);
    // Step 5 from a survivor: nothing left to drop, nothing left behind.
    let leaving = LeavingReplica {
        shard: ShardMacro("1".into()),
        replica: ReplicaMacro("r3".into()),
    };
    let cleanup = replica::drop_replica_metadata(&r1, &leaving)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        cleanup.is_clean() && cleanup.dropped.is_empty(),
        "{cleanup:?}"
    );

    // A replica added under a new name: no REPLICA_ALREADY_EXISTS, data replicated.
    h.start("r4");
    let r4 = h.client("r4");
    let peers = [r1.clone(), r2.clone()];
    let c = cluster();
    let sources = MigrationSources {
        cluster: &c,
        shard_peers: &peers,
        other_shards: &[],
    };
    let topology = Topology {
        hosts: 3,
        shard_replicas: 3,
    };
    schemer::migrate_new_host(&r4, sources, SchemaPolicy::default(), topology)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    replica::sync_shard(&r4, SYNC_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(scalar(&r4, "SELECT count() AS v FROM db1.events").await, 2);
    assert_eq!(keeper_replicas(&r1, events).await, ["r1", "r2", "r4"]);

    // A replica that vanished without the flow (r2 killed): 18.16 cannot drop it from a
    // survivor, so it is reported as left behind for a status condition (decision 2) …
    h.kill("r2");
    let gone = LeavingReplica {
        shard: ShardMacro("1".into()),
        replica: ReplicaMacro("r2".into()),
    };
    let cleanup = replica::drop_replica_metadata(&r1, &gone)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!cleanup.is_clean());
    assert_eq!(cleanup.left_behind.len(), 2, "{cleanup:?}");
    // … and its old name cannot be reused: ClickHouse's own code comes back classified.
    h.restart_fresh("r2");
    let r2 = h.client("r2");
    let peers = [r1.clone(), r4.clone()];
    let sources = MigrationSources {
        cluster: &c,
        shard_peers: &peers,
        other_shards: &[],
    };
    let err = schemer::migrate_new_host(&r2, sources, SchemaPolicy::default(), topology)
        .await
        .err()
        .unwrap_or_else(|| panic!("reusing a stale replica name must fail on 18.16"));
    let codes: Vec<Option<ErrorCode>> = err
        .outcome
        .replicated
        .iter()
        .flat_map(|b| b.failed.iter().map(|f| f.error.code()))
        .collect();
    assert!(
        codes.contains(&Some(ErrorCode::REPLICA_ALREADY_EXISTS)),
        "{codes:?}: {err}"
    );
    assert!(
        err.outcome
            .replicated
            .iter()
            .flat_map(|b| &b.failed)
            .all(|f| !f.error.is_retryable())
    );
    // S1-06: the distributed batch still ran.
    assert!(err.outcome.distributed.is_some());
    assert!(user_tables(&r2).await.contains("db1.dist"));
}

/// Decision 17: the modern statements are refused by 18.16 (which is why they are covered by
/// exact-SQL unit tests only), and the statements chosen for the detected version run.
#[tokio::test]
async fn modern_statements_are_refused_by_18_16_so_the_fallbacks_are_chosen() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::new(5, &[(1, "r1")]);
    h.start("r1");
    let r1 = h.client("r1");
    create_fixture(&[&r1]).await;

    let version = r1.version().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((version.major, version.minor), (18, 16));
    let modern: Version = "24.8.4.13".parse().unwrap_or_else(|e| panic!("{e}"));
    let events = sql::TableName::new("db1", "events");
    let c = cluster();
    let refused = [
        (sql::sync_replica(modern, &events), ErrorCode::SYNTAX_ERROR),
        (
            sql::drop_replica(modern, &ReplicaMacro("rX".into()), &events).unwrap_or_default(),
            ErrorCode::SYNTAX_ERROR,
        ),
        (
            sql::drop_table(modern, &sql::TableName::new("db1", "v")),
            ErrorCode::SYNTAX_ERROR,
        ),
        (
            sql::discover_databases(modern, sql::Source::AllReplicas(&c)),
            // Unknown table function clusterAllReplicas.
            ErrorCode(46),
        ),
        (
            sql::discover_databases(modern, sql::Source::Local),
            // system.databases has no engine_full: missing column.
            ErrorCode(47),
        ),
    ];
    for (statement, code) in refused {
        let err = r1
            .exec(&statement, &QueryOptions::new())
            .await
            .err()
            .unwrap_or_else(|| panic!("18.16 ran {statement}"));
        assert_eq!(err.code(), Some(code), "{statement}: {err}");
        assert!(!err.is_retryable());
    }
    // The forms chosen for 18.16 run.
    for statement in [
        sql::sync_replica(version, &events),
        sql::discover_databases(version, sql::Source::Local),
        sql::discover_tables(version, sql::Source::Local),
        sql::drop_table(version, &sql::TableName::new("db1", "v")),
    ] {
        r1.exec(&statement, &QueryOptions::new())
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    assert_eq!(
        sql::drop_replica(version, &ReplicaMacro("rX".into()), &events),
        None
    );
    assert_eq!(sql::discover_functions(version, sql::Source::Local), None);

    // Wrong credentials are a classified, non-retryable error; so is a dead endpoint with a
    // short timeout a retryable transport error.
    let mut wrong = clickhouse_operator::clickhouse::ClientConfig::new(
        r1.endpoint().clone(),
        clickhouse_operator::clickhouse::Credentials {
            user: harness::USER.into(),
            password: "wrong".into(),
        },
    );
    wrong.timeout = Duration::from_secs(2);
    let err = Client::new(wrong.clone())
        .unwrap_or_else(|e| panic!("{e}"))
        .exec("SELECT 1", &QueryOptions::new())
        .await
        .err()
        .unwrap_or_else(|| panic!("wrong password accepted"));
    assert_eq!(err.code(), Some(ErrorCode::WRONG_PASSWORD), "{err}");
    assert!(!err.is_retryable());
    h.kill("r1");
    let err = r1
        .exec(
            "SELECT 1",
            &QueryOptions::new().timeout(Duration::from_secs(2)),
        )
        .await
        .err()
        .unwrap_or_else(|| panic!("a killed server answered"));
    assert!(err.is_retryable(), "{err}");
}

/// S1-05: a statement that fails for a reason that passes (here: the server is not up yet,
/// as a pod that just became Ready may still refuse) is retried with backoff and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddl_is_retried_until_the_server_answers() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::new(6, &[(1, "r1")]);
    let r1 = h.client("r1");
    let pending = tokio::spawn(async move {
        r1.exec(
            "CREATE DATABASE IF NOT EXISTS retried",
            &QueryOptions::new().retry(true),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The first attempts are refused: nothing listens yet.
    assert!(!pending.is_finished());
    h.start("r1");
    pending
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("not retried until success: {e}"));
    assert_eq!(
        scalar(
            &h.client("r1"),
            "SELECT count() AS v FROM system.databases WHERE name = 'retried'"
        )
        .await,
        1
    );
}

/// The client's HTTPS with a custom CA: a server whose certificate the CA signed is
/// reached; a client trusting another CA refuses the same server; an unusable CA is a
/// configuration error, not a panic.
#[tokio::test]
async fn https_with_the_clusters_ca_is_verified() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::with_tls(7, &[(1, "r1")]);
    h.start("r1");
    let r1 = h.client("r1");
    let version = r1.version().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((version.major, version.minor), (18, 16));

    let other = Harness::with_tls(8, &[(1, "x")]);
    let mut config = clickhouse_operator::clickhouse::ClientConfig::new(
        r1.endpoint().clone(),
        clickhouse_operator::clickhouse::Credentials {
            user: harness::USER.into(),
            password: harness::PASSWORD.into(),
        },
    );
    config.tls_ca_pem = other.ca_pem().map(<[u8]>::to_vec);
    config.timeout = Duration::from_secs(5);
    let err = Client::new(config.clone())
        .unwrap_or_else(|e| panic!("{e}"))
        .exec("SELECT 1", &QueryOptions::new())
        .await
        .err()
        .unwrap_or_else(|| panic!("a certificate of another CA was accepted"));
    assert!(
        matches!(
            err,
            clickhouse_operator::clickhouse::Error::Transport { .. }
        ),
        "{err}"
    );

    config.tls_ca_pem = Some(b"not a certificate".to_vec());
    assert!(matches!(
        Client::new(config),
        Err(clickhouse_operator::clickhouse::Error::Config { .. })
    ));
}

/// SECURITY.md, "What the operator protects": a server whose certificate names only a DNS name (as
/// cert-manager issues them) is reached by address and verified by that name; verifying it against
/// its address, as a client without the name does, fails the handshake with an error that names the
/// endpoint and the certificate. Without a CA the client still talks HTTPS (unverified), never
/// plain HTTP.
#[tokio::test]
async fn https_verifies_the_server_by_its_dns_name() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::with_tls_names(7, &[(1, "r1")]);
    h.start("r1");
    let by_address = h.client("r1");
    let mut config = clickhouse_operator::clickhouse::ClientConfig::new(
        by_address.endpoint().clone(),
        clickhouse_operator::clickhouse::Credentials {
            user: harness::USER.into(),
            password: harness::PASSWORD.into(),
        },
    );
    config.tls_ca_pem = h.ca_pem().map(<[u8]>::to_vec);
    config.timeout = Duration::from_secs(5);
    let err = Client::new(config.clone())
        .unwrap_or_else(|e| panic!("{e}"))
        .exec("SELECT 1", &QueryOptions::new())
        .await
        .err()
        .unwrap_or_else(|| panic!("a certificate for another name was accepted"));
    println!("verified against the address: {err}");
    assert!(
        matches!(
            err,
            clickhouse_operator::clickhouse::Error::Transport { .. }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains(&by_address.endpoint().to_string()),
        "{err}"
    );
    config.tls_server_name = Some(Harness::tls_name("r1"));
    let by_name = Client::new(config.clone()).unwrap_or_else(|e| panic!("{e}"));
    let version = by_name.version().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((version.major, version.minor), (18, 16));
    // TLS without a CA: still HTTPS (the secure port speaks nothing else), not verified
    config.tls_ca_pem = None;
    config.tls_server_name = None;
    config.tls_unverified = true;
    let unverified = Client::new(config).unwrap_or_else(|e| panic!("{e}"));
    unverified
        .exec("SELECT 1", &QueryOptions::new())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Decision 25: the operator's own ZooKeeper-protocol client against a real ZooKeeper 3.8:
/// nodes are created, listed and read; a missing node is `None`; a server that publishes no
/// membership (standalone) says so instead of failing; a refused `reconfig` is an error with
/// the server's code, and a closed port an error, never a panic.
#[tokio::test]
async fn keeper_client_speaks_the_zookeeper_protocol_to_a_real_server() {
    use clickhouse_operator::clickhouse::keeper::{self, Session};
    let _serial = SERIAL.lock().await;
    let h = Harness::new(8, &[]);
    let addr = h.zookeeper();
    // `ruok` is answered a moment before sessions are accepted
    let started = std::time::Instant::now();
    let mut s = loop {
        match Session::connect(addr, Duration::from_secs(5)).await {
            Ok(s) => break s,
            Err(e) if started.elapsed() < Duration::from_secs(20) => {
                eprintln!("not yet: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    let open = [keeper::AclEntry::world(keeper::perms::ALL)];
    assert_eq!(s.create("/chop", b"v1", &open).await.unwrap(), "/chop");
    let again = s.create("/chop", b"v2", &open).await.unwrap_err();
    assert_eq!(again.code(), Some(keeper::NODE_EXISTS), "{again}");
    s.create("/chop/a", b"", &open).await.unwrap();
    s.create("/chop/b", b"", &open).await.unwrap();
    let mut children = s.children("/chop").await.unwrap();
    children.sort();
    assert_eq!(children, ["a", "b"]);
    assert_eq!(s.get("/chop").await.unwrap().as_deref(), Some(&b"v1"[..]));
    assert_eq!(s.get("/chop/none").await.unwrap(), None);
    assert_eq!(s.members().await.unwrap(), None);
    let refused = s.reconfig(&[], &[1]).await.unwrap_err();
    assert!(refused.code().is_some(), "{refused}");
    s.close().await;

    // Decision 38: the ACLs of an external root, as a real ZooKeeper applies them. The root
    // belongs to its cluster's digest identity; the level above lets everyone create and
    // delete children, nobody change its ACL.
    let (own, shared) =
        clickhouse_operator::controller::cluster::keeper_root::acls(Some("clickhouse:tenant-pw"));
    let mut tenant = Session::connect(addr, Duration::from_secs(5))
        .await
        .unwrap();
    tenant
        .add_digest_auth("clickhouse:tenant-pw")
        .await
        .unwrap();
    tenant.create("/shared", b"", &shared).await.unwrap();
    tenant.create("/shared/t1", b"", &own).await.unwrap();
    tenant
        .create("/shared/t1/replicas", b"", &own)
        .await
        .unwrap();
    assert_eq!(tenant.acl("/shared/t1").await.unwrap(), own);
    let mut other = Session::connect(addr, Duration::from_secs(5))
        .await
        .unwrap();
    other.add_digest_auth("clickhouse:other-pw").await.unwrap();
    let no_auth = other
        .create("/shared/t1/planted", b"", &open)
        .await
        .unwrap_err();
    assert_eq!(
        no_auth.code(),
        Some(-102),
        "another identity cannot write under the root: {no_auth}"
    );
    assert!(other.children("/shared/t1").await.is_err(), "nor list it");
    other.create("/shared/t2", b"", &own).await.unwrap();
    assert!(
        other.set_acl("/shared", &open).await.is_err(),
        "nobody opens the shared level again"
    );
    let live = other.delete("/shared/t1").await.unwrap_err();
    assert!(live.code().is_some(), "a root with children stays: {live}");
    other.close().await;
    tenant.delete("/shared/t1/replicas").await.unwrap();
    tenant.delete("/shared/t1").await.unwrap();
    tenant.close().await;
    let closed = std::net::SocketAddr::new(addr.ip(), 1);
    assert!(
        Session::connect(closed, Duration::from_secs(2))
            .await
            .is_err()
    );
}
