//! NetworkPolicies of a cluster (decision 27), unless `spec.networkPolicy.enabled` is false: who
//! may reach which port of its pods. Egress is not restricted.
//!
//! - `<cluster>-server` selects the server pods: every port from the cluster's own server pods
//!   (replication, Distributed queries, `ON CLUSTER`); the client ports (HTTP, native, their TLS
//!   variants, the servers' metrics port) from the operator, its exporter and the backup agents,
//!   and from `spec.networkPolicy.clients` (everyone when that is empty). The interserver ports
//!   are reachable from the servers only.
//! - `<cluster>-keeper` selects the Keeper pods: every port from the other members (raft); the
//!   client port from the cluster's server pods, the operator and its exporter only.
//!
//! The operator's own pods are found by `OPERATOR_POD_SELECTOR` in the operator's namespace
//! (the chart sets both; they also select its exporter); without it, by the operator's networks
//! (`OPERATOR_NETWORKS`) as IP blocks.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::labels::{self, Component};
use super::statefulset::server_ports;
use super::{Cluster, Inputs, names};

/// Label of the backup agents' pods (their Jobs run beside the backup replicas).
pub const BACKUP_AGENT_NAME: &str = "clickhouse-backup-agent";

/// Where the operator's pods are: a namespace and the labels its pods (and its exporter's)
/// carry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OperatorPods {
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
}

fn selector(labels: BTreeMap<String, String>) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels),
        ..LabelSelector::default()
    }
}

fn pods(labels: BTreeMap<String, String>) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        pod_selector: Some(selector(labels)),
        ..NetworkPolicyPeer::default()
    }
}

fn ports(list: &[i32]) -> Option<Vec<NetworkPolicyPort>> {
    Some(
        list.iter()
            .map(|p| NetworkPolicyPort {
                port: Some(IntOrString::Int(*p)),
                protocol: Some("TCP".into()),
                ..NetworkPolicyPort::default()
            })
            .collect(),
    )
}

/// The operator (and its exporter): its pods by selector, or its networks as IP blocks.
pub fn operator_peers(inputs: &Inputs) -> Vec<NetworkPolicyPeer> {
    match &inputs.operator_pods {
        Some(op) => vec![NetworkPolicyPeer {
            namespace_selector: Some(selector(BTreeMap::from([(
                "kubernetes.io/metadata.name".to_string(),
                op.namespace.clone(),
            )]))),
            pod_selector: Some(selector(op.labels.clone())),
            ..NetworkPolicyPeer::default()
        }],
        None => inputs
            .operator_networks
            .iter()
            .map(|n| NetworkPolicyPeer {
                ip_block: Some(IPBlock {
                    cidr: n.clone(),
                    except: None,
                }),
                ..NetworkPolicyPeer::default()
            })
            .collect(),
    }
}

fn policy(
    c: &Cluster<'_>,
    name: String,
    component: Component,
    ingress: Vec<NetworkPolicyIngressRule>,
) -> NetworkPolicy {
    NetworkPolicy {
        metadata: c.meta(name, labels::common(c.name, component)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(selector(labels::component_selector(c.name, component))),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(ingress),
            ..NetworkPolicySpec::default()
        }),
    }
}

/// The cluster's NetworkPolicies: the servers', and Keeper's when it has members; none when
/// switched off.
pub fn policies(c: &Cluster<'_>, inputs: &Inputs) -> Vec<NetworkPolicy> {
    let spec = &c.spec.network_policy;
    if !spec.enabled {
        return Vec::new();
    }
    let servers = || pods(labels::component_selector(c.name, Component::Server));
    let client_ports: Vec<i32> = server_ports(c)
        .into_iter()
        .filter(|(n, _)| !n.starts_with("interserver"))
        .map(|(_, p)| p)
        .collect();
    let mut operator = operator_peers(inputs);
    operator.push(pods(BTreeMap::from([(
        labels::NAME.to_string(),
        BACKUP_AGENT_NAME.to_string(),
    )])));
    let mut out = Vec::new();
    // a Keeper-only cluster (decision 55) has no server to let anyone reach
    if c.spec.shards > 0 {
        out.push(policy(
            c,
            names::server_network_policy(c.name),
            Component::Server,
            vec![
                NetworkPolicyIngressRule {
                    from: Some(vec![servers()]),
                    ports: None,
                },
                NetworkPolicyIngressRule {
                    from: Some(operator),
                    ports: ports(&client_ports),
                },
                NetworkPolicyIngressRule {
                    // empty: from everyone
                    from: (!spec.clients.is_empty()).then(|| spec.clients.clone()),
                    ports: ports(&client_ports),
                },
            ],
        ));
    }
    if c.keeper_members > 0 {
        let mut clients = vec![servers()];
        clients.extend(operator_peers(inputs));
        // the servers of clusters that use this cluster's Keeper, in the namespaces it allows
        // (decision 38): the pod labels alone can be set by anyone who may create a pod
        for ns in &c.spec.keeper.allowed_namespaces {
            clients.push(NetworkPolicyPeer {
                namespace_selector: Some(selector(BTreeMap::from([(
                    "kubernetes.io/metadata.name".to_string(),
                    ns.clone(),
                )]))),
                pod_selector: Some(selector(BTreeMap::from([
                    (labels::KEEPER_OF_CLUSTER.to_string(), c.name.to_string()),
                    (
                        labels::KEEPER_OF_NAMESPACE.to_string(),
                        c.namespace.to_string(),
                    ),
                ]))),
                ..NetworkPolicyPeer::default()
            });
        }
        out.push(policy(
            c,
            names::keeper_network_policy(c.name),
            Component::Keeper,
            vec![
                NetworkPolicyIngressRule {
                    from: Some(vec![pods(labels::component_selector(
                        c.name,
                        Component::Keeper,
                    ))]),
                    ports: None,
                },
                NetworkPolicyIngressRule {
                    from: Some(clients),
                    ports: ports(if c.spec.keeper.tls {
                        &[names::KEEPER_CLIENT_PORT, names::KEEPER_SECURE_CLIENT_PORT]
                    } else {
                        &[names::KEEPER_CLIENT_PORT]
                    }),
                },
            ],
        ));
    }
    out
}
