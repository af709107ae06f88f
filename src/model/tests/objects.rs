//! The objects a spec gives: the StatefulSets and their names, labels and owner, the shard
//! budgets, pause and the update strategy, consistent for any set of replicas; input that
//! cannot be built is an error.

use super::*;

/// S0-10 / S0-11: 3 shards × 2 replicas give 6 StatefulSets with distinct names that are
/// stable across builds, each with one pod.
#[test]
fn three_shards_by_two_replicas_give_six_statefulsets_with_distinct_stable_names() {
    let c = cluster(json!({"shards": 3, "replicas": 2}));
    let i = inputs(replicas(3, 2));
    let d = build(&c, &i);
    let names: Vec<_> = d
        .server_statefulsets
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        names,
        ["c1-0-0", "c1-0-1", "c1-1-2", "c1-1-3", "c1-2-4", "c1-2-5"]
    );
    for s in &d.server_statefulsets {
        assert_eq!(s.spec.replicas, Some(1));
        assert_eq!(s.spec.service_name.as_deref(), Some("c1-headless"));
    }
    let again = build(&c, &i);
    assert_eq!(again.server_statefulsets, d.server_statefulsets);
    assert_eq!(again.common_config, d.common_config);
    assert_eq!(d.replica_configs.len(), 6);
    assert_eq!(d.shard_pdbs.len(), 3);
}

/// S0-01: every object carries the standard labels and a controller owner reference to the
/// cluster.
#[test]
fn every_object_has_the_labels_and_an_owner_reference() {
    let c = cluster(json!({}));
    let d = build(&c, &inputs(replicas(1, 2)));
    let k = d.keeper.clone().unwrap();
    let metas = [
        vec![
            d.common_config.metadata.clone(),
            d.users_secret.metadata.clone(),
            d.headless_service.metadata.clone(),
            d.client_service.clone().unwrap().metadata,
            k.config.metadata,
            k.statefulset.metadata,
            k.headless_service.metadata,
            k.client_service.metadata,
            k.pdb.metadata,
            secret::operator_secret(
                &Cluster::new(&c).unwrap(),
                &secret::Generated {
                    operator: Password("x".into()),
                    interserver: Password("y".into()),
                    keeper: Password("z".into()),
                    cluster: Password("w".into()),
                    cluster_secret: Password("v".into()),
                    exporter: Password("u".into()),
                },
            )
            .metadata,
        ],
        d.replica_configs
            .iter()
            .map(|x| x.metadata.clone())
            .collect(),
        d.server_statefulsets
            .iter()
            .map(|x| x.metadata.clone())
            .collect(),
        d.shard_pdbs.iter().map(|x| x.metadata.clone()).collect(),
    ]
    .concat();
    for m in metas {
        let name = m.name.clone().unwrap();
        let l = m.labels.unwrap();
        for key in [
            labels::NAME,
            labels::INSTANCE,
            labels::MANAGED_BY,
            labels::COMPONENT,
        ] {
            assert!(l.contains_key(key), "{name} lacks {key}");
        }
        assert_eq!(l[labels::CLUSTER], "c1", "{name}");
        assert_eq!(m.namespace.as_deref(), Some("t1"));
        let owners = m.owner_references.unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].uid, uid("c1"));
        assert_eq!(owners[0].kind, "ClickHouseCluster");
        assert_eq!(owners[0].controller, Some(true));
    }
}

/// S0-10 / S2-21: pause sets every server and Keeper StatefulSet to 0 replicas.
#[test]
fn pause_scales_every_statefulset_to_zero() {
    let c = cluster(json!({"pause": true, "shards": 2}));
    let d = build(&c, &inputs(replicas(2, 2)));
    assert!(
        d.server_statefulsets
            .iter()
            .all(|s| s.spec.replicas == Some(0))
    );
    assert_eq!(d.keeper.unwrap().statefulset.spec.replicas, Some(0));
}

/// S2-26 / S2-33 / S2-34: SmartUpdate and OnDelete give OnDelete; RollingUpdate gives
/// RollingUpdate. Keeper is always `OnDelete`: the operator rolls its members (decision 31).
#[test]
fn update_strategy_maps_to_the_statefulset_strategy() {
    for (strategy, want) in [
        ("SmartUpdate", "OnDelete"),
        ("OnDelete", "OnDelete"),
        ("RollingUpdate", "RollingUpdate"),
    ] {
        let c = cluster(json!({"updateStrategy": strategy}));
        let d = build(&c, &inputs(replicas(1, 1)));
        let get = |s: &StatefulSet| s.spec.update_strategy.clone().unwrap().type_.unwrap();
        assert_eq!(get(&d.server_statefulsets[0]), want, "{strategy}");
        assert_eq!(get(&d.keeper.unwrap().statefulset), "OnDelete");
    }
}

/// S0-18: one budget per shard with the spec's maxUnavailable, selecting that shard's pods.
#[test]
fn each_shard_gets_a_pdb_with_the_specs_max_unavailable() {
    let c =
        cluster(json!({"shards": 2, "replicas": 5, "podDisruptionBudget": {"maxUnavailable": 2}}));
    let d = build(&c, &inputs(replicas(2, 5)));
    for (s, p) in d.shard_pdbs.iter().enumerate() {
        assert_eq!(
            p.metadata.name.as_deref(),
            Some(format!("c1-shard-{s}").as_str())
        );
        let spec = p.spec.clone().unwrap();
        assert_eq!(
            spec.max_unavailable,
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(2))
        );
        let sel = spec.selector.unwrap().match_labels.unwrap();
        assert_eq!(sel[labels::SHARD], s.to_string());
        assert_eq!(sel[labels::COMPONENT], "server");
    }
}

/// User input that cannot become configuration is an error naming the field, never a panic.
#[test]
fn invalid_names_are_errors_not_panics() {
    let c = cluster(json!({"configuration": {"profiles": {"bad name": {"x": "1"}}}}));
    let err = desired(&Cluster::new(&c).unwrap(), &inputs(replicas(1, 1))).unwrap_err();
    assert!(
        err.to_string().contains("spec.configuration.profiles"),
        "{err}"
    );
    let c = cluster(json!({}));
    let mut i = inputs(replicas(1, 1));
    i.user_passwords
        .insert("1user".into(), Password("p".into()));
    let err = desired(&Cluster::new(&c).unwrap(), &i).unwrap_err();
    assert!(matches!(err, BuildError::InvalidName { .. }));
    assert!(!err.to_string().contains("\"p\""));
    let c =
        cluster(json!({"configuration": {"files": {"00-operator-server.xml": "<clickhouse/>"}}}));
    assert!(matches!(
        desired(&Cluster::new(&c).unwrap(), &inputs(replicas(1, 1))),
        Err(BuildError::ReservedFile(_))
    ));
    let mut c = cluster(json!({}));
    c.metadata.uid = None;
    assert_eq!(
        Cluster::new(&c).unwrap_err(),
        BuildError::MissingMetadata("uid")
    );
}

proptest::proptest! {
    /// S0-11 / remote_servers: for any set of replicas, every replica has its own StatefulSet
    /// and ConfigMap of the same name, appears exactly once in remote_servers under its shard,
    /// and every shard that has a replica has a budget.
    #[test]
    fn any_replica_set_is_built_consistently(
        picks in proptest::collection::btree_map(0i64..500, 0i32..5, 1..20)
    ) {
        let reps: Vec<ReplicaSpec> =
            picks.iter().map(|(i, s)| ReplicaSpec::new("c1", ShardIndex(*s), *i)).collect();
        let c = cluster(json!({"shards": 2}));
        let d = build(&c, &inputs(reps.clone()));
        let remote = remote_file(&d);
        let doc = parse(&remote);
        for (r, (sts, cm)) in reps.iter().zip(d.server_statefulsets.iter().zip(&d.replica_configs)) {
            proptest::prop_assert_eq!(sts.metadata.name.as_ref(), Some(&r.name.to_string()));
            proptest::prop_assert_eq!(cm.metadata.name.as_ref(), Some(&r.name.to_string()));
            let host = names::replica_host("c1", "t1", names::DEFAULT_CLUSTER_DOMAIN, &r.name);
            let hits: Vec<_> = doc
                .descendants()
                .filter(|n| n.has_tag_name("host") && n.text() == Some(host.as_str()))
                .collect();
            proptest::prop_assert_eq!(hits.len(), 1);
            // Its shard element holds the replicas of that shard only.
            let shard = hits[0].parent().unwrap().parent().unwrap();
            let shard_hosts: std::collections::BTreeSet<String> = shard
                .descendants()
                .filter(|n| n.has_tag_name("host"))
                .map(|n| n.text().unwrap().to_string())
                .collect();
            let want: std::collections::BTreeSet<String> = reps
                .iter()
                .filter(|o| o.shard == r.shard)
                .map(|o| names::replica_host("c1", "t1", names::DEFAULT_CLUSTER_DOMAIN, &o.name))
                .collect();
            proptest::prop_assert_eq!(shard_hosts, want);
            let pdb = names::shard_pdb("c1", r.shard);
            proptest::prop_assert!(d.shard_pdbs.iter().any(|p| p.metadata.name.as_ref() == Some(&pdb)));
        }
        let distinct: std::collections::BTreeSet<_> =
            d.server_statefulsets.iter().map(|s| s.metadata.name.clone()).collect();
        proptest::prop_assert_eq!(distinct.len(), reps.len());
    }
}

/// Decision 55: a Keeper-only cluster (no shard) gets its ensemble and no server: no server
/// StatefulSet, shard budget, client Service or server NetworkPolicy.
#[test]
fn a_cluster_of_no_shard_builds_its_keeper_and_no_server() {
    let c = cluster(json!({"shards": 0, "keeper": {"replicas": 3}}));
    let d = build(&c, &inputs(Vec::new()));
    assert!(d.server_statefulsets.is_empty() && d.shard_pdbs.is_empty());
    assert!(d.client_service.is_none());
    let k = d.keeper.expect("Keeper's objects");
    assert_eq!(
        serde_json::to_value(&k.statefulset).unwrap()["spec"]["replicas"],
        3
    );
    let policies: Vec<String> = d
        .network_policies
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert_eq!(policies, ["c1-keeper"]);
    // one shard: the servers' objects are there
    let one = build(&cluster(json!({"shards": 1})), &inputs(replicas(1, 2)));
    assert!(one.client_service.is_some() && one.network_policies.len() == 2);
}
