//! Labels and annotations of the objects a cluster has. The operator's controllers find owned
//! objects by [`CLUSTER`]; selectors use as few labels as possible because StatefulSet
//! selectors are immutable.

use std::collections::BTreeMap;

use super::ReplicaSpec;
use crate::api::ShardIndex;

/// `app.kubernetes.io/name`: [`APP_SERVER`] or [`APP_KEEPER`].
pub const NAME: &str = "app.kubernetes.io/name";
/// `app.kubernetes.io/instance`: the cluster's name.
pub const INSTANCE: &str = "app.kubernetes.io/instance";
/// `app.kubernetes.io/managed-by`: [`MANAGED_BY_VALUE`].
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// `app.kubernetes.io/component`: `server` or `keeper`.
pub const COMPONENT: &str = "app.kubernetes.io/component";
/// The cluster an object belongs to; the operator watches owned objects by this label.
pub const CLUSTER: &str = "clickhouse.com/cluster";
/// On the server pods of a cluster that uses another cluster's Keeper
/// (`spec.keeper.external.clusterRef`): that cluster's name and namespace, which its Keeper
/// NetworkPolicy admits.
pub const KEEPER_OF_CLUSTER: &str = "clickhouse.com/keeper-of-cluster";
pub const KEEPER_OF_NAMESPACE: &str = "clickhouse.com/keeper-of-namespace";
/// The shard of a server pod.
pub const SHARD: &str = "clickhouse.com/shard";
/// The replica (StatefulSet name) of a server pod.
pub const REPLICA: &str = "clickhouse.com/replica";
/// Present (`true`) on server pods that receive client traffic: the client Service selects it,
/// and the operator removes it from a pod to take the pod out of traffic (decision 20, S0-22).
pub const SERVING: &str = "clickhouse.com/serving";
/// Present (`true`) on server pods that count in the topology spread; removed from condemned
/// pods (S0-23).
pub const SPREAD: &str = "clickhouse.com/spread";
/// Value of [`MANAGED_BY`].
pub const MANAGED_BY_VALUE: &str = "clickhouse-operator";
/// Value of [`NAME`] on server objects.
pub const APP_SERVER: &str = "clickhouse";
/// Value of [`NAME`] on Keeper objects.
pub const APP_KEEPER: &str = "clickhouse-keeper";
/// The labels that put a pod in traffic and in the topology spread; a condemned replica's pod
/// loses them first (decision 20).
pub const TRAFFIC: [&str; 2] = [SERVING, SPREAD];
/// Value of [`SERVING`] and [`SPREAD`] when present.
pub const TRUE: &str = "true";

/// Pod-template annotation: hash of the configuration that needs a restart to take effect.
pub const CONFIG_HASH: &str = "clickhouse.com/config-hash";
/// Hash of a shard's own configuration files (`spec.configuration.shardFiles`), on the pods of
/// that shard when it has any.
pub const SHARD_FILES_HASH: &str = "clickhouse.com/shard-files-hash";
/// Pod-template annotation: hash of the replica's own files (`configuration.replicaFiles`).
pub const REPLICA_FILES_HASH: &str = "clickhouse.com/replica-files-hash";
/// Annotation of every built object: a hash of what the operator wants in it, so that a field
/// it stops setting (a node selector removed, a ConfigMap key gone) is noticed too (decision 22).
pub const OBJECT_HASH: &str = "clickhouse.com/object-hash";
/// Annotation of a StatefulSet (not of its pod template): a hash of the pod template it was
/// written with; a template that differs only by a removed field differs here.
pub const TEMPLATE_HASH: &str = "clickhouse.com/template-hash";
/// Pod-template annotation: hash of the server certificate Secret's data.
pub const TLS_SECRET_HASH: &str = "clickhouse.com/tls-secret-hash";
/// Pod-template annotation: hash of the CA Secret's data.
pub const CA_SECRET_HASH: &str = "clickhouse.com/ca-secret-hash";
/// Annotation of the users Secret: the networks the operator's account accepts logins from, as
/// the running operator set them (`OPERATOR_NETWORKS`), comma-separated; `plan` reads them.
pub const OPERATOR_NETWORKS: &str = "clickhouse.com/operator-networks";
/// Annotation of the users Secret: where the operator's pods are (`<namespace>/<key=value,…>`),
/// as the running operator set it (`OPERATOR_POD_SELECTOR`); `plan` reads it.
pub const OPERATOR_PODS: &str = "clickhouse.com/operator-pods";
/// Pod-template annotation: hash of the replication password (`interserver_http_credentials`).
pub const INTERSERVER_HASH: &str = "clickhouse.com/interserver-hash";
/// Pod-template annotation: hash of the Secret keys `configuration.secretSettings` and the
/// `config.d` files of `configuration.secretFiles` name, with their values.
pub const SECRET_CONFIG_HASH: &str = "clickhouse.com/secret-config-hash";
/// Annotation of a ClickHouseCluster: a timestamp (RFC 3339) that asks for one rolling restart
/// of the servers per value (decision 51), as `kubectl rollout restart` does for a Deployment.
pub const RESTART_AT: &str = "clickhouse.com/restart-at";
/// Pod-template annotation: the last [`RESTART_AT`] asked for (`status.restartedAt`).
pub const RESTARTED_AT: &str = "clickhouse.com/restarted-at";
/// The [`RESTART_AT`] annotation of `c`, normalised, if it is a timestamp; `Err` with its value
/// cut short when it is not one.
pub fn restart_at(c: &crate::api::ClickHouseCluster) -> Option<Result<String, String>> {
    let v = c.metadata.annotations.as_ref()?.get(RESTART_AT)?;
    Some(
        v.trim()
            .parse::<k8s_openapi::jiff::Timestamp>()
            .map(|t| t.to_string())
            .map_err(|_| v.chars().take(40).collect()),
    )
}
/// Pod-template annotation: hash of `spec.systemLogs` when it is set (decision 49); the file
/// itself is not hashed, since it follows the server version too.
pub const SYSTEM_LOGS_HASH: &str = "clickhouse.com/system-logs-hash";
/// Pod-template annotation: hash of the environment Secret's data (`pod.envSecret`).
pub const ENV_SECRET_HASH: &str = "clickhouse.com/env-secret-hash";

/// The two components of a cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Component {
    /// ClickHouse server replicas.
    Server,
    /// The ClickHouse Keeper ensemble.
    Keeper,
}

impl Component {
    /// Value of [`COMPONENT`].
    pub fn as_str(self) -> &'static str {
        match self {
            Component::Server => "server",
            Component::Keeper => "keeper",
        }
    }

    fn app(self) -> &'static str {
        match self {
            Component::Server => APP_SERVER,
            Component::Keeper => APP_KEEPER,
        }
    }
}

/// Labels of every object of `component`.
pub fn common(cluster: &str, component: Component) -> BTreeMap<String, String> {
    [
        (NAME, component.app()),
        (INSTANCE, cluster),
        (MANAGED_BY, MANAGED_BY_VALUE),
        (COMPONENT, component.as_str()),
        (CLUSTER, cluster),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Label that hands a PVC to the PVC cleaner.
pub const DELETE_PVC: &str = "clickhouse.com/delete-pvc";

/// Labels of a replica's objects (StatefulSet, ConfigMap, PVC): common plus shard and replica.
pub fn replica(cluster: &str, r: &ReplicaSpec) -> BTreeMap<String, String> {
    let mut l = common(cluster, Component::Server);
    l.insert(SHARD.into(), r.shard.to_string());
    l.insert(REPLICA.into(), r.name.to_string());
    l
}

/// Labels of a replica's pod template: the replica's labels, [`SERVING`] and [`SPREAD`], and the
/// user's pod labels (the API refuses reserved prefixes, and ours win anyway).
pub fn server_pod(
    cluster: &str,
    r: &ReplicaSpec,
    user: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut l = user.clone();
    l.extend(replica(cluster, r));
    l.insert(SERVING.into(), TRUE.into());
    l.insert(SPREAD.into(), TRUE.into());
    l
}

/// Selector of a replica StatefulSet: cluster and replica only (immutable, so minimal).
pub fn replica_selector(cluster: &str, replica: &str) -> BTreeMap<String, String> {
    pairs(&[(CLUSTER, cluster), (REPLICA, replica)])
}

/// Selector of every pod of `component`.
pub fn component_selector(cluster: &str, component: Component) -> BTreeMap<String, String> {
    pairs(&[(CLUSTER, cluster), (COMPONENT, component.as_str())])
}

/// Selector of the server pods of one shard (its PodDisruptionBudget).
pub fn shard_selector(cluster: &str, shard: ShardIndex) -> BTreeMap<String, String> {
    let mut l = component_selector(cluster, Component::Server);
    l.insert(SHARD.into(), shard.to_string());
    l
}

/// Selector of the client Service: server pods that are serving.
pub fn serving_selector(cluster: &str) -> BTreeMap<String, String> {
    let mut l = component_selector(cluster, Component::Server);
    l.insert(SERVING.into(), TRUE.into());
    l
}

/// Label selector of the server topology spread: pods that still count in the spread.
pub fn spread_selector(cluster: &str) -> BTreeMap<String, String> {
    let mut l = component_selector(cluster, Component::Server);
    l.insert(SPREAD.into(), TRUE.into());
    l
}

/// Label selector of the per-shard topology spread: the shard's pods that still count in it.
pub fn shard_spread_selector(cluster: &str, shard: ShardIndex) -> BTreeMap<String, String> {
    let mut l = shard_selector(cluster, shard);
    l.insert(SPREAD.into(), TRUE.into());
    l
}

fn pairs(p: &[(&str, &str)]) -> BTreeMap<String, String> {
    p.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
