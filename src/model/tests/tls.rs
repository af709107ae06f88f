//! TLS: the servers' secure ports, and Keeper's client and raft traffic.

use super::*;

/// With TLS the secure ports are served and used between replicas; `required` drops the plain
/// ones and probes over HTTPS.
#[test]
fn tls_serves_secure_ports_and_required_drops_plain_ones() {
    let c = cluster(json!({"tls": {"enabled": true, "serverCertSecret": "tls"}}));
    let d = build(&c, &inputs(replicas(1, 1)));
    let ports: Vec<_> = d
        .client_service
        .clone()
        .unwrap()
        .spec
        .unwrap()
        .ports
        .unwrap()
        .iter()
        .map(|p| p.port)
        .collect();
    assert_eq!(ports, [8123, 9000, 8443, 9440]);
    let remote = remote_file(&d);
    assert!(remote.contains("<port>9440</port>") && remote.contains("<secure>1</secure>"));
    assert!(common_file(&d, SERVER_FILE).contains("/etc/clickhouse-server/tls/tls.crt"));
    let c = cluster(json!({"tls": {"enabled": true, "required": true, "serverCertSecret": "tls"}}));
    let d = build(&c, &inputs(replicas(1, 1)));
    let ports: Vec<_> = d
        .client_service
        .clone()
        .unwrap()
        .spec
        .unwrap()
        .ports
        .unwrap()
        .iter()
        .map(|p| p.port)
        .collect();
    assert_eq!(ports, [8443, 9440]);
    let probe = d.server_statefulsets[0]
        .spec
        .template
        .spec
        .clone()
        .unwrap()
        .containers[0]
        .readiness_probe
        .clone()
        .unwrap()
        .http_get
        .unwrap();
    assert_eq!(
        (probe.port.clone(), probe.scheme.as_deref()),
        (
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(8443),
            Some("HTTPS")
        )
    );
    let c = cluster(json!({"clientService": {"enabled": false}}));
    assert!(build(&c, &inputs(replicas(1, 1))).client_service.is_none());
}

/// docs/security.md, "What a cluster gets": `spec.keeper.tls` (configuration only: the ZooKeeper
/// stand-in refuses it): Keeper serves a secure client port besides the plain one (its probes, the
/// operator's own sessions and clusters on `keeper.external.clusterRef` use that), raft over TLS,
/// an `openSSL` with the cluster's certificate verified against its CA, both mounted into the
/// members; the servers reach every member on the secure port; the Keeper NetworkPolicy admits it;
/// a new certificate restarts the members (its hash is in their template). Without it none of this
/// is there.
#[test]
fn keeper_tls_secures_client_and_raft_traffic_with_the_clusters_certificate() {
    let tls = json!({"enabled": true, "serverCertSecret": "c1-tls", "caSecret": "c1-ca"});
    let c = cluster(json!({"keeper": {"replicas": 3, "tls": true}, "tls": tls}));
    let d = build(&c, &inputs(replicas(1, 2)));
    let k = d.keeper.as_ref().unwrap();
    let xml = &k.config.data.as_ref().unwrap()[names::KEEPER_CONFIG_FILE];
    for want in [
        "<tcp_port>9181</tcp_port>",
        "<tcp_port_secure>9281</tcp_port_secure>",
        "<raft_configuration>\n            <secure>true</secure>",
        "<certificateFile>/etc/clickhouse-keeper/tls/tls.crt</certificateFile>",
        "<privateKeyFile>/etc/clickhouse-keeper/tls/tls.key</privateKeyFile>",
        "<caConfig>/etc/clickhouse-keeper/ca/ca.crt</caConfig>",
        "<verificationMode>relaxed</verificationMode>",
        "<name>RejectCertificateHandler</name>",
    ] {
        assert!(xml.contains(want), "{want} not in\n{xml}");
    }
    let pod = k.statefulset.spec.template.spec.as_ref().unwrap();
    let volumes: Vec<(String, Option<String>)> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| {
            (
                v.name.clone(),
                v.secret.as_ref().and_then(|s| s.secret_name.clone()),
            )
        })
        .collect();
    assert!(volumes.contains(&("tls".into(), Some("c1-tls".into()))));
    assert!(volumes.contains(&("ca".into(), Some("c1-ca".into()))));
    let container = &pod.containers[0];
    let mounts: Vec<&str> = container
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert!(mounts.contains(&names::KEEPER_TLS_PATH) && mounts.contains(&names::KEEPER_CA_PATH));
    assert!(
        container
            .ports
            .iter()
            .flatten()
            .any(|p| p.container_port == names::KEEPER_SECURE_CLIENT_PORT)
    );
    let annotations = k
        .statefulset
        .spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .clone()
        .unwrap();
    assert!(
        annotations.contains_key(labels::TLS_SECRET_HASH),
        "{annotations:?}"
    );
    let runtime = &d.common_config.data.as_ref().unwrap()[config::server::RUNTIME_FILE];
    assert_eq!(runtime.matches("<port>9281</port>").count(), 3, "{runtime}");
    assert_eq!(
        runtime.matches("<secure>1</secure>").count(),
        3,
        "{runtime}"
    );
    let policy = serde_json::to_value(
        d.network_policies
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some("c1-keeper"))
            .unwrap(),
    )
    .unwrap();
    assert!(policy.to_string().contains("9281"), "{policy}");

    // without it: nothing of the above, in the same cluster with TLS
    let plain = cluster(json!({"keeper": {"replicas": 3}, "tls": tls}));
    let d = build(&plain, &inputs(replicas(1, 2)));
    let k = d.keeper.as_ref().unwrap();
    let xml = &k.config.data.as_ref().unwrap()[names::KEEPER_CONFIG_FILE];
    assert!(!xml.contains("secure") && !xml.contains("openSSL"), "{xml}");
    let runtime = &d.common_config.data.as_ref().unwrap()[config::server::RUNTIME_FILE];
    assert!(
        !runtime.contains("9281") && !runtime.contains("<secure>"),
        "{runtime}"
    );
    let template = k.statefulset.spec.template.metadata.as_ref().unwrap();
    assert!(
        !template
            .annotations
            .as_ref()
            .unwrap()
            .contains_key(labels::TLS_SECRET_HASH)
    );
}
