//! The cluster's shape and references: counts, Keeper's size, names, shard weights, the client
//! Service, an external Keeper, the resource's version.

use super::*;

#[test]
fn defaults_are_valid_and_redundant() {
    let s = spec();
    assert_eq!(s.shards, 1);
    assert_eq!(s.replicas, 2);
    assert_eq!(s.keeper.replicas, 3);
    assert_eq!(s.pod_disruption_budget.max_unavailable, 1);
    assert_eq!(s.update_strategy, UpdateStrategy::SmartUpdate);
    assert!(!s.pause);
    assert!(s.client_service.enabled);
    let (errors, warnings) = validate("c1", &s);
    assert!(errors.is_empty(), "{errors:?}");
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[test]
fn counts_are_checked() {
    let mut s = spec();
    s.shards = -1;
    s.replicas = 0;
    s.pod_disruption_budget.max_unavailable = 0;
    let f = fields("c1", &s);
    assert!(f.contains(&"spec.shards".to_string()));
    assert!(f.contains(&"spec.replicas".to_string()));
    assert!(f.contains(&"spec.podDisruptionBudget.maxUnavailable".to_string()));
}

/// Review M-2 (decision 68): shards and replicas are bounded from above by the operator's
/// `MAX_SHARDS`/`MAX_REPLICAS` (default 256 and 16), which an installation may lower or raise
/// up to the CRD's ceilings; the error names the field and the setting. External Keeper
/// members are bounded in number.
#[test]
fn shards_and_replicas_are_bounded_by_the_operators_limits() {
    let mut s = spec();
    s.shards = 257;
    s.replicas = 17;
    let (errors, _) = validate("c1", &s);
    let said = format!("{errors:?}");
    assert!(
        said.contains("spec.shards")
            && said.contains("at most 256 (this operator's MAX_SHARDS), got 257"),
        "{said}"
    );
    assert!(
        said.contains("spec.replicas")
            && said.contains("at most 16 (this operator's MAX_REPLICAS), got 17"),
        "{said}"
    );
    s.shards = 1_000_000;
    assert!(fields("c1", &s).contains(&"spec.shards".to_string()));
    // raised: accepted
    let raised = Limits::from_lookup(|k| match k {
        "MAX_SHARDS" => Some("1024".into()),
        "MAX_REPLICAS" => Some(" 32 ".into()),
        _ => None,
    })
    .unwrap();
    s.shards = 1024;
    s.replicas = 32;
    let (errors, _) = validate_with("c1", &s, &raised);
    assert!(errors.is_empty(), "{errors:?}");
    // lowered: refused at the lower bound
    let lowered = Limits {
        max_shards: 2,
        max_replicas: 2,
    };
    s.shards = 3;
    s.replicas = 2;
    let (errors, _) = validate_with("c1", &s, &lowered);
    assert_eq!(
        errors.iter().map(|e| e.field.as_str()).collect::<Vec<_>>(),
        ["spec.shards"]
    );
    // beyond the CRD's ceiling, zero or not a number: the operator does not start
    for bad in ["1025", "0", "-1", "many"] {
        let e = Limits::from_lookup(|k| (k == "MAX_SHARDS").then(|| bad.to_string())).unwrap_err();
        assert!(e.contains("MAX_SHARDS") && e.contains("1 to 1024"), "{e}");
    }
    let e = Limits::from_lookup(|k| (k == "MAX_REPLICAS").then(|| "33".to_string())).unwrap_err();
    assert!(e.contains("MAX_REPLICAS") && e.contains("1 to 32"), "{e}");
    assert_eq!(Limits::from_lookup(|_| None).unwrap(), Limits::default());
    // external Keeper members
    let mut s = spec();
    s.keeper.replicas = 0;
    s.keeper.external = Some(ExternalKeeper {
        nodes: (0..17)
            .map(|i| KeeperNode {
                host: format!("zk-{i}"),
                port: 2181,
            })
            .collect(),
        ..ExternalKeeper::default()
    });
    let said = format!("{:?}", validate("c1", &s).0);
    assert!(
        said.contains("spec.keeper.external.nodes") && said.contains("at most 16"),
        "{said}"
    );
}

/// Decision 55: no shard is a Keeper-only cluster, valid with an ensemble of its own only.
#[test]
fn a_cluster_of_no_shard_is_keeper_only_and_needs_its_own_ensemble() {
    let mut s = spec();
    s.shards = 0;
    s.keeper.replicas = 3;
    let (errors, _) = validate("k1", &s);
    assert!(errors.is_empty(), "{errors:?}");
    s.keeper.replicas = 0;
    let (errors, _) = validate("k1", &s);
    let said = format!("{errors:?}");
    assert!(
        said.contains("spec.shards") && said.contains("Keeper-only"),
        "{said}"
    );
    s.keeper.external = Some(
        serde_json::from_value(serde_json::json!({"nodes": [{"host": "zk", "port": 2181}]}))
            .unwrap(),
    );
    assert!(fields("k1", &s).contains(&"spec.shards".to_string()));
}

/// S2-10 / S2-14: an even Keeper ensemble is refused with a message naming the field.
#[test]
fn keeper_must_be_zero_or_odd() {
    for (k, ok) in [
        (0, true),
        (1, true),
        (2, false),
        (3, true),
        (4, false),
        (5, true),
        (7, true),
        (9, false),
        (-1, false),
    ] {
        let mut s = spec();
        s.replicas = 1;
        s.keeper.replicas = k;
        let (errors, _) = validate("c1", &s);
        assert_eq!(errors.is_empty(), ok, "keeper {k}: {errors:?}");
        if !ok {
            assert_eq!(errors[0].field, "spec.keeper.replicas");
            assert!(errors[0].message.contains("odd"));
        }
    }
    let mut s = spec();
    s.keeper.replicas = 0;
    let (errors, _) = validate("c1", &s);
    assert!(errors[0].message.contains("need Keeper"), "{errors:?}");
}

/// Decision 16: single copies are allowed but reported.
#[test]
fn single_replica_or_keeper_is_a_warning_not_an_error() {
    let mut s = spec();
    s.replicas = 1;
    s.keeper.replicas = 1;
    let (errors, warnings) = validate("c1", &s);
    assert!(errors.is_empty());
    assert_eq!(warnings.len(), 2);
}

#[test]
fn names_and_references_are_checked() {
    let s = spec();
    assert!(fields("C1", &s).contains(&"metadata.name".to_string()));
    assert!(fields("1c", &s).contains(&"metadata.name".to_string()));
    assert!(fields(&"a".repeat(41), &s).contains(&"metadata.name".to_string()));
    assert!(fields(&"a".repeat(40), &s).is_empty());
    let mut s = spec();
    s.users = Some(UsersSpec {
        secret_name: "Bad_Name".into(),
        profile: None,
        ..UsersSpec::default()
    });
    s.tls.enabled = true;
    s.storage.data.size = "lots".into();
    s.pod
        .labels
        .insert("clickhouse.com/shard".into(), "x".into());
    s.pod.labels.insert("team".into(), "a b".into());
    s.configuration
        .files
        .insert("../etc/passwd".into(), String::new());
    s.configuration
        .settings
        .insert("logger/".into(), String::new());
    let f = fields("c1", &s);
    for want in [
        "spec.users.secretName",
        "spec.tls.serverCertSecret",
        "spec.storage.size",
        "spec.pod.labels",
        "spec.configuration.files",
        "spec.configuration.settings",
    ] {
        assert!(f.contains(&want.to_string()), "{want} missing in {f:?}");
    }
    assert_eq!(f.iter().filter(|x| *x == "spec.pod.labels").count(), 2);
    // A referenced Secret cannot be one the operator generates (it would be overwritten).
    let mut s = spec();
    s.users = Some(UsersSpec {
        secret_name: "c1-users".into(),
        profile: None,
        ..UsersSpec::default()
    });
    s.pod.env_secret = Some("c1-operator".into());
    let f = fields("c1", &s);
    assert!(f.contains(&"spec.users.secretName".to_string()), "{f:?}");
    assert!(f.contains(&"spec.pod.envSecret".to_string()), "{f:?}");
}

/// S2-10: the client Service's options must fit its type, its networks be CIDRs and
/// its labels not the operator's.
#[test]
fn client_service_options_fit_its_type() {
    use crate::api::{ClientServiceType, ExternalTrafficPolicy};
    let mut s = spec();
    s.client_service.external_traffic_policy = Some(ExternalTrafficPolicy::Local);
    assert_eq!(
        fields("c1", &s),
        vec!["spec.clientService.externalTrafficPolicy".to_string()]
    );
    s.client_service.r#type = ClientServiceType::NodePort;
    assert!(fields("c1", &s).is_empty());
    s.client_service.load_balancer_source_ranges = vec!["10.0.0.0/8".into()];
    assert_eq!(
        fields("c1", &s),
        vec!["spec.clientService.loadBalancerSourceRanges".to_string()]
    );
    s.client_service.r#type = ClientServiceType::LoadBalancer;
    assert!(fields("c1", &s).is_empty());
    s.client_service.load_balancer_source_ranges = vec!["ten/8".into()];
    assert_eq!(
        fields("c1", &s),
        vec!["spec.clientService.loadBalancerSourceRanges".to_string()]
    );
    s.client_service.load_balancer_source_ranges.clear();
    s.client_service
        .labels
        .insert("clickhouse.com/cluster".into(), "x".into());
    assert_eq!(
        fields("c1", &s),
        vec!["spec.clientService.labels".to_string()]
    );
    s.client_service.labels.clear();
    s.client_service.labels.insert("team".into(), "db".into());
    assert!(fields("c1", &s).is_empty());
}

/// Decision 28: an external Keeper needs no own members, either nodes or a cluster reference,
/// and an absolute root path; with it, several replicas need no Keeper of their own.
#[test]
fn an_external_keeper_is_checked_with_its_field() {
    use crate::api::{ExternalKeeper, KeeperClusterRef, KeeperNode};
    let mut s = spec();
    s.replicas = 2;
    s.keeper.replicas = 0;
    assert_eq!(fields("c1", &s), vec!["spec.keeper.replicas".to_string()]);
    s.keeper.external = Some(ExternalKeeper {
        nodes: vec![KeeperNode {
            host: "zk-0.zk".into(),
            port: 2181,
        }],
        ..ExternalKeeper::default()
    });
    assert!(fields("c1", &s).is_empty());
    s.keeper.replicas = 3;
    assert_eq!(fields("c1", &s), vec!["spec.keeper.replicas".to_string()]);
    s.keeper.replicas = 0;
    let x = s.keeper.external.as_mut().unwrap();
    x.cluster_ref = Some(KeeperClusterRef {
        name: "other".into(),
        namespace: None,
    });
    assert_eq!(fields("c1", &s), vec!["spec.keeper.external".to_string()]);
    let x = s.keeper.external.as_mut().unwrap();
    x.nodes.clear();
    assert!(fields("c1", &s).is_empty());
    for (root, ok) in [
        ("/ch/prod", true),
        ("ch/prod", false),
        ("/ch/", false),
        ("/", false),
        ("/ch/../x", false),
        ("/ch prod", false),
    ] {
        s.keeper.external.as_mut().unwrap().root = Some(root.into());
        assert_eq!(
            fields("c1", &s).is_empty(),
            ok,
            "{root}: {:?}",
            fields("c1", &s)
        );
    }
}

/// Shard weights name a shard of the cluster by its index, and weigh 1 to 1000 (0 would take
/// the shard out of the cluster's queries).
#[test]
fn shard_weights_name_an_existing_shard_and_weigh_1_to_1000() {
    let mut s = spec();
    s.shards = 2;
    s.shard_weights = BTreeMap::from([
        ("0".to_string(), 0),
        ("1".to_string(), 1000),
        ("2".to_string(), 1),
        ("01".to_string(), 1),
        ("x".to_string(), 1001),
    ]);
    let (errors, _) = validate("c1", &s);
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.shardWeights[0]",
            "spec.shardWeights[01]",
            "spec.shardWeights[2]",
            "spec.shardWeights[x]",
            "spec.shardWeights[x]",
        ]
    );
    s.shard_weights = BTreeMap::from([("1".to_string(), 3)]);
    assert!(validate("c1", &s).0.is_empty());
}

/// S2-25: a resource newer than the operator is refused with a message to upgrade.
#[test]
fn newer_cr_version_is_refused() {
    let mut s = spec();
    s.cr_version = Some(OPERATOR_VERSION.into());
    assert!(fields("c1", &s).is_empty());
    s.cr_version = Some("99.0.0".into());
    let (errors, _) = validate("c1", &s);
    assert_eq!(errors[0].field, "spec.crVersion");
    assert!(errors[0].message.contains("upgrade the operator"));
    s.cr_version = Some("x.y".into());
    assert_eq!(fields("c1", &s), vec!["spec.crVersion".to_string()]);
}

/// Decision 56: troubleshooting needs a shell in the server image.
#[test]
fn troubleshooting_is_refused_with_a_distroless_server_image() {
    let mut s = spec();
    s.troubleshoot = true;
    assert!(!fields("c1", &s).contains(&"spec.troubleshoot".to_string()));
    s.image = "clickhouse/clickhouse-server:25.8-distroless".into();
    assert!(fields("c1", &s).contains(&"spec.troubleshoot".to_string()));
}
