//! Node-level bad days on the local Kubernetes of three nodes in three zones
//! (`support::multi_node_client`), with real 18.16 servers and the Keeper stand-in: a node
//! drained while a client writes, a node's agent stopped for 90 s, and where the scheduler puts
//! the pods (`antiAffinity: Required` with fewer nodes than replicas, `topologySpreadKey` over
//! the zones). The nodes' volumes are local: a pod's PV binds it to its node, so a pod of a
//! drained or stopped node waits for that node (documented in `docs/operations.md`).

use std::collections::BTreeMap;

use clickhouse_operator::plan::facts::pod_ready;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

mod drain_and_stop;
mod network;
mod scheduling;

const SERVERS: &str = "clickhouse.com/cluster=c1,app.kubernetes.io/component=server";

/// Per pod of the cluster: (node, Ready).
async fn placement(pods: &Api<Pod>, selector: &str) -> BTreeMap<String, (String, bool)> {
    pods.list(&ListParams::default().labels(selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            let node = p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            let ready = pod_ready(&p);
            (p.name_any(), (node, ready))
        })
        .collect()
}

/// The shard of a server pod `c1-<shard>-<index>-0`.
fn shard_of(pod: &str) -> String {
    pod.split('-').nth(1).unwrap_or_default().to_string()
}

/// Runs a blocking call (a command) off the test's runtime, where the writer and the samplers
/// run.
async fn off_runtime<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}
