//! The server Services: the headless Service every replica's DNS name comes from, and the
//! client Service that selects the serving replicas (its address is the status `host`).

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::labels::{self, Component};
use super::statefulset::server_ports;
use super::{Cluster, names};
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
/// `spec.clientService.enabled` is false.
pub fn client(c: &Cluster<'_>) -> Option<Service> {
    let cs = &c.spec.client_service;
    if !cs.enabled {
        return None;
    }
    let ports = server_ports(c)
        .into_iter()
        .filter(|(n, _)| !n.starts_with("interserver"))
        .map(|(n, p)| service_port(n, p))
        .collect();
    let mut metadata = c.meta(
        names::client_service(c.name),
        labels::common(c.name, Component::Server),
    );
    if !cs.annotations.is_empty() {
        metadata.annotations = Some(cs.annotations.clone());
    }
    Some(Service {
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
            selector: Some(labels::serving_selector(c.name)),
            ports: Some(ports),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    })
}
