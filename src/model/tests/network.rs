//! What reaches the servers: the client and per-replica Services, the protocols served and
//! the NetworkPolicies.

use super::*;

/// docs/configuration.md: the client Service carries the user's labels, source ranges and traffic
/// policy; with `perReplica`, every replica gets `<replica>-client` selecting its pod only.
#[test]
fn client_service_options_and_per_replica_services() {
    let c = cluster(json!({"clientService": {"type": "LoadBalancer",
        "labels": {"team": "db"}, "annotations": {"lb": "internal"},
        "loadBalancerSourceRanges": ["10.0.0.0/8"], "externalTrafficPolicy": "Local",
        "perReplica": true}}));
    let d = build(&c, &inputs(replicas(2, 2)));
    let client = d.client_service.as_ref().unwrap();
    let mut all = vec![client.clone()];
    all.extend(d.replica_services.iter().cloned());
    assert_eq!(all.len(), 5);
    for s in &all {
        let labels = s.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["team"], "db");
        assert_eq!(labels["clickhouse.com/cluster"], "c1");
        assert_eq!(s.metadata.annotations.as_ref().unwrap()["lb"], "internal");
        let spec = s.spec.as_ref().unwrap();
        assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
        assert_eq!(
            spec.load_balancer_source_ranges.as_ref().unwrap(),
            &["10.0.0.0/8"]
        );
        assert_eq!(spec.external_traffic_policy.as_deref(), Some("Local"));
    }
    let names: Vec<String> = d
        .replica_services
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "c1-0-0-client",
            "c1-0-1-client",
            "c1-1-2-client",
            "c1-1-3-client"
        ]
    );
    let selector = d.replica_services[1]
        .spec
        .as_ref()
        .unwrap()
        .selector
        .as_ref()
        .unwrap();
    assert_eq!(selector, &labels::replica_selector("c1", "c1-0-1"));
    // off by default
    let d = build(&cluster(json!({})), &inputs(replicas(1, 2)));
    assert!(d.replica_services.is_empty());
    let spec = d.client_service.unwrap().spec.unwrap();
    assert_eq!(spec.external_traffic_policy, None);
    assert_eq!(spec.load_balancer_source_ranges, None);
}

/// `spec.protocols`: each protocol that is on is served (its port in the startup file, its
/// port no longer closed), declared on the container, published by the headless and client
/// Services and allowed as a client port by the NetworkPolicy; gRPC takes TLS with the server
/// certificate when `spec.tls` is on; servers known to be older than a protocol refuse it.
#[test]
fn protocols_are_served_declared_published_and_allowed() {
    let i = inputs(replicas(1, 1));
    let plain = build(&cluster(json!({})), &i);
    assert!(common_file(&plain, config::server::CLOSED_PORTS_FILE).contains("<mysql_port remove"));
    let d = build(
        &cluster(json!({"protocols": {"mysql": true, "postgresql": true, "grpc": true}})),
        &i,
    );
    let server = common_file(&d, SERVER_FILE);
    for want in [
        "<mysql_port>9004</mysql_port>",
        "<postgresql_port>9005</postgresql_port>",
        "<grpc_port>9100</grpc_port>",
    ] {
        assert!(server.contains(want), "{want}: {server}");
    }
    assert!(!server.contains("enable_ssl"), "{server}");
    let closed = common_file(&d, config::server::CLOSED_PORTS_FILE);
    assert!(
        !closed.contains("mysql_port") && !closed.contains("postgresql_port"),
        "{closed}"
    );
    let sts = serde_json::to_value(&d.server_statefulsets[0]).unwrap();
    let container_ports: Vec<i64> = sts["spec"]["template"]["spec"]["containers"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["containerPort"].as_i64().unwrap())
        .collect();
    let service_ports = |s: &k8s_openapi::api::core::v1::Service| -> Vec<i32> {
        s.spec
            .as_ref()
            .unwrap()
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| p.port)
            .collect()
    };
    let client = service_ports(d.client_service.as_ref().unwrap());
    let headless = service_ports(&d.headless_service);
    let policy = serde_json::to_string(&d.network_policies[0]).unwrap();
    for port in [9004, 9005, 9100] {
        assert!(
            container_ports.contains(&i64::from(port)),
            "{container_ports:?}"
        );
        assert!(client.contains(&port), "{client:?}");
        assert!(headless.contains(&port), "{headless:?}");
        assert!(policy.contains(&format!("\"port\":{port}")), "{policy}");
    }
    // gRPC with TLS
    let tls = build(
        &cluster(json!({"protocols": {"grpc": true},
            "tls": {"enabled": true, "serverCertSecret": "c1-tls"}})),
        &i,
    );
    let server = common_file(&tls, SERVER_FILE);
    assert!(
        server.contains("<enable_ssl>1</enable_ssl>")
            && server.contains("<ssl_cert_file>/etc/clickhouse-server/tls/tls.crt</ssl_cert_file>"),
        "{server}"
    );
    // servers known to be older
    let mut old = inputs(replicas(1, 1));
    old.server_version = Some("18.16.1".parse().unwrap());
    let c = cluster(json!({"protocols": {"mysql": true}}));
    let e = desired(&Cluster::new(&c).unwrap(), &old).unwrap_err();
    assert_eq!(
        e.to_string(),
        "spec.protocols.mysql: needs ClickHouse 20.1.0.0 or later: the servers run 18.16.1.0"
    );
}

/// Decision 27: the NetworkPolicies. `<cluster>-server` selects the server pods: every port from
/// the cluster's servers, the client ports (not the interserver one) from the operator (its
/// pods by selector in its namespace, or its networks without one), the backup agents and the
/// spec's clients (everyone when none). `<cluster>-keeper` selects the Keeper pods: every port
/// from the members, the client port from the servers and the operator only. Switched off:
/// none.
#[test]
fn network_policies_let_in_only_what_each_port_needs() {
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    let c = cluster(
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 3},
        "networkPolicy": {"clients": [{"podSelector": {"matchLabels": {"app": "bi"}}}]}}),
    );
    let mut i = inputs(replicas(1, 2));
    i.operator_pods = Some(crate::model::network_policy::OperatorPods {
        namespace: "ops".into(),
        labels: BTreeMap::from([(
            "app.kubernetes.io/name".into(),
            "clickhouse-operator".into(),
        )]),
    });
    let d = build(&c, &i);
    let by_name: BTreeMap<String, &NetworkPolicy> = d
        .network_policies
        .iter()
        .map(|p| (p.metadata.name.clone().unwrap(), p))
        .collect();
    assert_eq!(
        by_name.keys().collect::<Vec<_>>(),
        ["c1-keeper", "c1-server"]
    );
    let v = |p: &NetworkPolicy| serde_json::to_value(p.spec.as_ref().unwrap()).unwrap();
    let server = v(by_name["c1-server"]);
    assert_eq!(
        server["podSelector"]["matchLabels"],
        json!({"clickhouse.com/cluster": "c1", "app.kubernetes.io/component": "server"})
    );
    assert_eq!(server["policyTypes"], json!(["Ingress"]));
    let rules = server["ingress"].as_array().unwrap();
    assert_eq!(rules.len(), 3);
    // the servers: every port
    assert_eq!(
        rules[0],
        json!({"from": [{"podSelector": {"matchLabels":
            {"clickhouse.com/cluster": "c1", "app.kubernetes.io/component": "server"}}}]})
    );
    let client_ports =
        json!([{"port": 8123, "protocol": "TCP"}, {"port": 9000, "protocol": "TCP"}]);
    // the operator (by its pods) and the backup agents: the client ports
    assert_eq!(rules[1]["ports"], client_ports);
    assert_eq!(
        rules[1]["from"],
        json!([
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
             "podSelector": {"matchLabels": {"app.kubernetes.io/name": "clickhouse-operator"}}},
            {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "clickhouse-backup-agent"}}}
        ])
    );
    // the spec's clients: the client ports
    assert_eq!(rules[2]["ports"], client_ports);
    assert_eq!(
        rules[2]["from"],
        json!([{"podSelector": {"matchLabels": {"app": "bi"}}}])
    );
    let text = server.to_string();
    assert!(
        !text.contains("9009"),
        "the interserver port is the servers' only: {text}"
    );
    let keeper = v(by_name["c1-keeper"]);
    assert_eq!(
        keeper["podSelector"]["matchLabels"],
        json!({"clickhouse.com/cluster": "c1", "app.kubernetes.io/component": "keeper"})
    );
    let rules = keeper["ingress"].as_array().unwrap();
    assert_eq!(
        rules[0]["ports"],
        serde_json::Value::Null,
        "members: every port"
    );
    assert_eq!(
        rules[1]["ports"],
        json!([{"port": 9181, "protocol": "TCP"}])
    );
    let from = rules[1]["from"].as_array().unwrap();
    assert_eq!(
        from.len(),
        2,
        "the servers and the operator: no other namespace unless allowed (decision 38)"
    );
    let mut shared = c.clone();
    shared.spec.keeper.allowed_namespaces = vec!["tenant-a".into()];
    let d_shared = build(&shared, &i);
    let keeper_shared = d_shared
        .network_policies
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("c1-keeper"))
        .map(v)
        .unwrap();
    let from = keeper_shared["ingress"][1]["from"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(from.len(), 3);
    assert_eq!(
        from[2],
        json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "tenant-a"}},
               "podSelector": {"matchLabels": {
            "clickhouse.com/keeper-of-cluster": "c1", "clickhouse.com/keeper-of-namespace": "t1"}}}),
        "only the allowed namespace's servers of clusters that use this Keeper"
    );
    // without the operator's pods: its networks; without clients: everyone on the client ports
    let open = cluster(json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 0}}));
    let d = build(&open, &inputs(replicas(1, 1)));
    assert_eq!(d.network_policies.len(), 1, "no Keeper, no Keeper policy");
    let server = v(&d.network_policies[0]);
    assert_eq!(
        server["ingress"][1]["from"][0],
        json!({"ipBlock": {"cidr": "10.244.0.0/16"}})
    );
    assert_eq!(server["ingress"][2].get("from"), None, "clients: everyone");
    // with TLS required and the servers' metrics endpoint: those ports, not the plain ones
    let tls = cluster(
        json!({"tls": {"enabled": true, "serverCertSecret": "t", "caSecret": "ca", "required": true},
        "serverMetrics": {"enabled": true}}),
    );
    let d = build(&tls, &inputs(replicas(1, 2)));
    let server = v(&d.network_policies[0]);
    assert_eq!(
        server["ingress"][2]["ports"],
        json!([{"port": 8443, "protocol": "TCP"}, {"port": 9440, "protocol": "TCP"}, {"port": 9363, "protocol": "TCP"}])
    );
    // switched off: none
    let off = cluster(json!({"networkPolicy": {"enabled": false}}));
    assert!(
        build(&off, &inputs(replicas(1, 2)))
            .network_policies
            .is_empty()
    );
}
