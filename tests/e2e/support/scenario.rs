//! The prologue most end-to-end tests share: a namespace of their own, the operator watching
//! it, and often one cluster `c1` waited for until `ready`.

use clickhouse_operator::api::ClickHouseCluster;
use kube::Client;

use super::{Operator, client, create_cluster, namespace, start_operator, wait_ready};

/// A test's setting: its client, its namespace and the in-process operator watching it (no
/// leader election). Taken apart where it is made:
/// `let Scenario { client, ns, op } = Scenario::start("kills").await;`.
pub struct Scenario {
    pub client: Client,
    pub ns: String,
    pub op: Operator,
}

impl Scenario {
    /// A namespace named after `prefix` and an operator watching it.
    pub async fn start(prefix: &str) -> Scenario {
        let client = client().await;
        let ns = namespace(&client, prefix).await;
        let op = start_operator(&client, &ns, false).await;
        Scenario { client, ns, op }
    }

    /// [`Scenario::start`], then cluster `c1` created with `spec` and waited for until its
    /// status is `ready` for generation 1; the cluster as it was then.
    pub async fn ready(prefix: &str, spec: serde_json::Value) -> (Scenario, ClickHouseCluster) {
        let s = Scenario::start(prefix).await;
        create_cluster(&s.client, &s.ns, "c1", spec).await;
        let c1 = wait_ready(&s.client, &s.ns, "c1", 1).await;
        (s, c1)
    }
}
