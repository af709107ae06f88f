//! Fixtures the unit tests share: a sample cluster, the replicas and inputs the builders take,
//! and the time a simulated pass runs at.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::api::{ClickHouseCluster, ClickHouseClusterSpec};
use crate::model::{Inputs, Password, ReplicaSpec};

/// A spec from its JSON form.
pub fn spec(v: serde_json::Value) -> ClickHouseClusterSpec {
    serde_json::from_value(v).unwrap()
}

/// The uid of the cluster [`cluster_named`] gives for `name`.
pub fn uid(name: &str) -> String {
    format!("uid-{name}")
}

/// The sample cluster `c1` (see [`cluster_named`]).
pub fn cluster(spec: serde_json::Value) -> ClickHouseCluster {
    cluster_named("c1", spec)
}

/// Cluster `name` with the spec `spec` (JSON) in namespace `t1`, as the API server returns a
/// created one: its [`uid`], generation 1, created on 2026-01-01.
pub fn cluster_named(name: &str, spec: serde_json::Value) -> ClickHouseCluster {
    let mut c = ClickHouseCluster::new(name, self::spec(spec));
    c.metadata.namespace = Some("t1".into());
    c.metadata.uid = Some(uid(name));
    c.metadata.generation = Some(1);
    c.metadata.creation_timestamp = Some(Time("2026-01-01T00:00:00Z".parse().unwrap()));
    c
}

/// The time a test pass runs at.
pub fn now() -> Timestamp {
    "2026-11-30T00:00:00Z".parse().unwrap()
}

/// Replicas of `shards` × `per_shard` of cluster `c1`, creation indexes in shard order.
pub fn replicas(shards: i32, per_shard: i64) -> Vec<ReplicaSpec> {
    (0..shards)
        .flat_map(|s| {
            (0..per_shard)
                .map(move |i| ReplicaSpec::new("c1", s.into(), i64::from(s) * per_shard + i))
        })
        .collect()
}

/// What a pass gives the builders for `replicas`: every generated password, two users of the
/// users Secret (`alice`, `bob`), the operator's networks, no server version known yet.
pub fn inputs(replicas: Vec<ReplicaSpec>) -> Inputs {
    Inputs {
        replicas,
        listed: None,
        leaving: Vec::new(),
        secrets: BTreeMap::new(),
        user_passwords: BTreeMap::from([
            ("alice".to_string(), Password("alice-secret-pw".into())),
            ("bob".to_string(), Password("bob-secret-pw".into())),
        ]),
        operator_password: Password("operator-secret-pw".into()),
        interserver_password: Some(Password("interserver-secret-pw".into())),
        keeper_password: Some(Password("keeper-secret-pw".into())),
        operator_networks: vec!["10.244.0.0/16".into()],
        operator_pods: None,
        cluster_password: Some(Password("c1uster-pw".into())),
        cluster_secret: Some(Password("c1uster-secret".into())),
        server_version: None,
        exporter_password: Some(Password("exporter-secret-pw".into())),
        backup_collections: Vec::new(),
    }
}
