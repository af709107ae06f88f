//! What a replica or a shard that joins gets (the schema of the shard, by `schemaPolicy`), and
//! what one that leaves leaves behind (nothing in Keeper).

use std::collections::BTreeSet;
use std::time::Duration;

use clickhouse_operator::api::schema_policy::{ReplicaPolicy, SchemaPolicy, ShardPolicy};
use clickhouse_operator::clickhouse::client::{Client, ErrorCode, QueryOptions};
use clickhouse_operator::clickhouse::replica::{self, LeavingReplica};
use clickhouse_operator::clickhouse::schemer::{self, MigrationSources, ObjectName, Topology};
use clickhouse_operator::clickhouse::sql::{self, ReplicaMacro, ShardMacro};

use crate::harness::{Harness, SERIAL, cluster, create_fixture, exec_all, scalar, user_tables};

const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

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

/// S0-27: the only replica of a removed shard gone without dropping its tables: a server of
/// another shard finds its Keeper nodes at the paths the shard's tables had (its own engine
/// clauses with the gone shard's `{shard}`). 18.16 has no `SYSTEM DROP REPLICA … FROM ZKPATH`,
/// so they are named as left behind for the `KeeperMetadataLeft` condition, each a node that is
/// there; a replica Keeper does not list leaves nothing to name.
#[tokio::test]
async fn a_gone_shards_keeper_metadata_is_found_from_another_shard() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::new(2, &[(1, "r1"), (2, "s2r1")]);
    h.start("r1");
    h.start("s2r1");
    let (r1, s2) = (h.client("r1"), h.client("s2r1"));
    create_fixture(&[&r1, &s2]).await;
    h.kill("s2r1");
    let gone = LeavingReplica {
        shard: ShardMacro("2".into()),
        replica: ReplicaMacro("s2r1".into()),
    };
    let cleanup = replica::drop_shard_replica_metadata(&r1, &gone)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(cleanup.dropped.is_empty(), "{cleanup:?}");
    let tables: BTreeSet<String> = cleanup
        .left_behind
        .iter()
        .map(|t| format!("{}.{}", t.database.0, t.name))
        .collect();
    assert_eq!(tables, set(&["db1.events", "db2.t_local"]));
    assert_eq!(
        cleanup.left_paths.iter().cloned().collect::<BTreeSet<_>>(),
        set(&[
            "/clickhouse/tables/2/db1/events/replicas/s2r1",
            "/clickhouse/tables/2/db2/t_local/replicas/s2r1"
        ])
    );
    for path in &cleanup.left_paths {
        let (parent, name) = path.rsplit_once('/').unwrap();
        assert_eq!(
            keeper_replicas(&r1, parent).await,
            [name],
            "{path} is there"
        );
    }
    let never = LeavingReplica {
        shard: ShardMacro("2".into()),
        replica: ReplicaMacro("s2r9".into()),
    };
    let cleanup = replica::drop_shard_replica_metadata(&r1, &never)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        cleanup.is_clean() && cleanup.dropped.is_empty(),
        "{cleanup:?}"
    );
}
