//! `system.clusters`, the macros and the Keeper members: the example cluster, a replica missing
//! from `remote_servers`, shard weights.

use serde::Deserialize;

use clickhouse_operator::api::ClickHouseCluster;
use clickhouse_operator::model::names;

use crate::support::{
    C1_HOSTS, CLUSTERS, UID, build, c1, check_clusters, inputs, lay_out, replicas, run,
};

/// docs/testing.md: the example cluster of `deploy/examples/cluster.yaml` (2 shards × 2 replicas,
/// 3 Keeper members, its users Secret) loads on ClickHouse 26.x as replica `demo-1-3`:
/// `system.clusters` lists exactly the 2 × 2 pods of `demo` (the image's example cluster is
/// replaced), the macros and `interserver_http_host` are the replica's, the default profile's
/// `max_memory_usage` is in effect, the Secret's user exists with its profile, and a
/// ReplicatedMergeTree table expands the macros and tries exactly the three Keeper members.
#[test]
fn example_cluster_loads_with_its_clusters_macros_profile_and_keeper_nodes() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/examples/cluster.yaml"
    ))
    .unwrap();
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde_yaml::Value::deserialize(d).unwrap())
        .collect();
    let mut c: ClickHouseCluster = serde_yaml::from_value(docs[0].clone()).unwrap();
    c.metadata.uid = Some(UID.into());
    let secret = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("Secret"))
        .expect("the example has a users Secret");
    assert_eq!(
        c.spec.users.as_ref().map(|u| u.secret_name.as_str()),
        secret["metadata"]["name"].as_str()
    );
    let users: Vec<(String, String)> = secret["stringData"]
        .as_mapping()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().unwrap().to_string(),
                v.as_str().unwrap().to_string(),
            )
        })
        .collect();
    let users: Vec<(&str, &str)> = users
        .iter()
        .map(|(u, p)| (u.as_str(), p.as_str()))
        .collect();
    assert_eq!((c.spec.shards, c.spec.replicas), (2, 2));
    let d = build(&c, &inputs(replicas("demo", 2, 2), &users));
    let layout = lay_out("example", &d, "demo-1-3", "");
    let r = run(
        &layout,
        &[
            CLUSTERS,
            "SELECT macro, substitution FROM system.macros ORDER BY macro",
            "SELECT getMacro('cluster'), getMacro('shard'), getMacro('replica')",
            "SELECT value FROM system.server_settings WHERE name = 'interserver_http_host'",
            "SELECT getSetting('max_memory_usage')",
            "SELECT name, auth_type FROM system.users WHERE name = 'analyst'",
            "SELECT user_name, inherit_profile FROM system.settings_profile_elements \
             WHERE user_name = 'analyst'",
            "CREATE TABLE rmt (x Int32) ENGINE = ReplicatedMergeTree('/t/{cluster}/{shard}', \
             '{replica}') ORDER BY x",
        ],
    );
    check_clusters(
        &r.rows(0),
        "demo",
        &[
            &[
                "demo-0-0-0.demo-headless.demo.svc.cluster.local",
                "demo-0-1-0.demo-headless.demo.svc.cluster.local",
            ],
            &[
                "demo-1-2-0.demo-headless.demo.svc.cluster.local",
                "demo-1-3-0.demo-headless.demo.svc.cluster.local",
            ],
        ],
        names::TCP_PORT,
    )
    .unwrap();
    assert_eq!(
        r.rows(1),
        ["cluster\tdemo", "replica\tdemo-1-3", "shard\t1"]
    );
    assert_eq!(r.rows(2), ["demo\t1\tdemo-1-3"]);
    assert_eq!(
        r.rows(3),
        ["demo-1-3-0.demo-headless.demo.svc.cluster.local"]
    );
    assert_eq!(r.rows(4), ["10000000000"]);
    assert_eq!(r.rows(5), ["analyst\t['sha256_password']"]);
    assert_eq!(r.rows(6), ["analyst\tdefault"]);
    // The macros expand (a missing one fails with NO_ELEMENTS_IN_CONFIG) and ZooKeeper is
    // configured (without it: NO_ZOOKEEPER); the pods' Keeper hosts do not resolve here.
    let e = r.error(7);
    assert!(
        e.contains("Cannot use any of provided ZooKeeper nodes"),
        "{e}"
    );
    for i in 0..3 {
        let host = format!(
            "Cannot use ZooKeeper host demo-keeper-{i}.demo-keeper-headless.demo.svc.cluster.local:{}",
            names::KEEPER_CLIENT_PORT
        );
        assert!(r.log.contains(&host), "the log does not name {host}");
    }
    assert!(!r.log.contains("demo-keeper-3"), "a fourth Keeper node");
}

/// docs/testing.md: the `system.clusters` check notices a generated `remote_servers` file that
/// lacks one replica of the spec (here `c1-1-3`, removed from the file after generation).
#[test]
fn a_replica_missing_from_remote_servers_is_noticed() {
    let (c, i) = c1(serde_json::json!({}));
    let d = build(&c, &i);
    let layout = lay_out("missing-replica", &d, "c1-0-0", "");
    let host = C1_HOSTS[1][1];
    layout.rewrite(&layout.config_d(names::REMOTE_SERVERS_FILE), |s| {
        let at = s.find(host).expect("the replica is in remote_servers");
        let start = s[..at].rfind("<replica>").unwrap();
        let end = at + s[at..].find("</replica>").unwrap() + "</replica>".len();
        format!("{}{}", &s[..start], &s[end..])
    });
    let r = run(&layout, &[CLUSTERS]);
    let rows = r.rows(0);
    assert_eq!(rows.len(), 3, "{rows:?}");
    let e = check_clusters(&rows, "c1", &C1_HOSTS, names::TCP_PORT)
        .expect_err("a missing replica went unnoticed");
    assert!(e.contains(host), "{e}");
}

/// `spec.shardWeights` on ClickHouse 26.x: `system.clusters` has each shard's weight, the
/// named one's and 1 for the others.
#[test]
fn shard_weights_are_the_clusters_weights() {
    let (c, i) = c1(serde_json::json!({"shardWeights": {"1": 3}}));
    let d = build(&c, &i);
    let layout = lay_out("shard-weights", &d, "c1-0-0", "");
    let r = run(
        &layout,
        &[
            CLUSTERS,
            "SELECT DISTINCT shard_num, shard_weight FROM system.clusters \
             WHERE cluster = 'c1' ORDER BY shard_num",
        ],
    );
    check_clusters(&r.rows(0), "c1", &C1_HOSTS, names::TCP_PORT).unwrap();
    assert_eq!(r.rows(1), ["1\t1", "2\t3"]);
}
