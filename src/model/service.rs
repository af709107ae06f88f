//! The server Services: the headless Service every replica's DNS name comes from, and the
//! client Service that selects the serving replicas (its address is the status `host`).

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::labels::{self, Component};
use super::statefulset::server_ports;
use super::{Cluster, ReplicaSpec, names};
use crate::api::ClientServiceType;

pub(crate) fn service_port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        port,
        target_port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".into()),
        ..ServicePort::default()
    }
}

/// `<cluster>-headless`: every server pod, ready or not (replicas must find each other while
/// starting), on every port the servers listen on.
pub fn headless(c: &Cluster<'_>) -> Service {
    Service {
        metadata: c.meta(
            names::headless_service(c.name),
            labels::common(c.name, Component::Server),
        ),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(labels::component_selector(c.name, Component::Server)),
            ports: Some(
                server_ports(c)
                    .into_iter()
                    .map(|(n, p)| service_port(n, p))
                    .collect(),
            ),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// `<cluster>`: the serving server pods (label `clickhouse.com/serving=true`), on the client
/// ports (HTTP and native, plain unless `tls.required`, secure with TLS). `None` when
/// `spec.clientService.enabled` is false or the cluster is Keeper-only.
pub fn client(c: &Cluster<'_>) -> Option<Service> {
    if !c.spec.serves_clients() {
        return None;
    }
    Some(client_like(
        c,
        names::client_service(c.name),
        labels::serving_selector(c.name),
    ))
}

/// `<replica>-client` for every replica in `replicas`, when `spec.clientService.perReplica`:
/// like the client Service, but selecting that replica's pod only.
pub fn per_replica(c: &Cluster<'_>, replicas: &[ReplicaSpec]) -> Vec<Service> {
    let cs = &c.spec.client_service;
    if !cs.enabled || !cs.per_replica {
        return Vec::new();
    }
    replicas
        .iter()
        .map(|r| {
            client_like(
                c,
                names::replica_client_service(&r.name),
                labels::replica_selector(c.name, &r.name),
            )
        })
        .collect()
}

/// A client Service named `name` selecting `selector`, with `spec.clientService`'s type,
/// labels, annotations, source ranges and traffic policy, on the client ports.
fn client_like(
    c: &Cluster<'_>,
    name: String,
    selector: std::collections::BTreeMap<String, String>,
) -> Service {
    let cs = &c.spec.client_service;
    let ports = server_ports(c)
        .into_iter()
        .filter(|(n, _)| !n.starts_with("interserver"))
        .map(|(n, p)| service_port(n, p))
        .collect();
    let mut service_labels = cs.labels.clone();
    service_labels.extend(labels::common(c.name, Component::Server));
    let mut metadata = c.meta(name, service_labels);
    if !cs.annotations.is_empty() {
        metadata.annotations = Some(cs.annotations.clone());
    }
    let external = cs.r#type != ClientServiceType::ClusterIP;
    Service {
        metadata,
        spec: Some(ServiceSpec {
            type_: Some(
                match cs.r#type {
                    ClientServiceType::ClusterIP => "ClusterIP",
                    ClientServiceType::NodePort => "NodePort",
                    ClientServiceType::LoadBalancer => "LoadBalancer",
                }
                .into(),
            ),
            selector: Some(selector),
            ports: Some(ports),
            load_balancer_source_ranges: (cs.r#type == ClientServiceType::LoadBalancer
                && !cs.load_balancer_source_ranges.is_empty())
            .then(|| cs.load_balancer_source_ranges.clone()),
            external_traffic_policy: cs
                .external_traffic_policy
                .filter(|_| external)
                .map(|p| format!("{p:?}")),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}
