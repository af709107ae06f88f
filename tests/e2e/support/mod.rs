//! The test harness: one real local Kubernetes (hack/local-cluster.sh) per test binary, started
//! on first use and stopped when the process exits (also after failed or panicking tests); the
//! CRDs installed; a fresh namespace per test; the operator run in-process per test, watching only
//! that namespace.
//!
//! `CHOP_KUBECONFIG=path` makes the tests use an already running cluster instead;
//! `CHOP_E2E_NODES=N` gives that cluster N nodes (`hack/test.sh` asks for 3; its
//! NetworkPolicies are not enforced).
//!
//! Tests about nodes (drain, a node that stops, zones, NetworkPolicies across nodes) ask for
//! [`multi_node_client`]: a second local Kubernetes of [`MULTI_NODES`] nodes (node-1..node-3 in
//! zone-a..zone-c), started on first use beside the main cluster and stopped with it
//! (`CHOP_MULTI_NODE_DIR=DIR` uses one already started with
//! `LOCAL_CLUSTER_NODES=3 hack/local-cluster.sh up DIR`). On it: [`node_stop`] and
//! [`node_start`] stop and start a node's agent (its pods stop; the Node goes NotReady within
//! about 10 s, tainted unreachable, its pods not ready; started again, the pods run again),
//! [`multi_node_kubectl`] runs kubectl 1.37 (`drain`, `cordon`, `uncordon`: drain evicts
//! through the eviction API, honouring PodDisruptionBudgets), and NetworkPolicies are enforced
//! by the node agents (pod to pod and through ClusterIPs; traffic from the machine, where the
//! in-process operator runs, always reaches the pods, as a node reaches its own pods).

use std::path::Path;
use std::time::Duration;

mod clusters;
pub mod guarantees;
mod local_kubernetes;
mod logs;
mod operator;
mod pods;
mod scenario;
mod sql;

pub use clusters::*;
pub use local_kubernetes::*;
pub use logs::*;
pub use operator::*;
pub use pods::*;
pub use scenario::*;
pub use sql::*;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Polls `probe` every 250 ms until it returns `Some`, or panics after `timeout` naming `what`.
pub async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
