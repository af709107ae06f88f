//! The Keeper identity and an external Keeper: a changed identity or root is refused, the root
//! is made before any server starts, another namespace's Keeper only with its consent.

use super::*;

/// Decision 27: the servers' Keeper identity never changes once they have it (their znodes carry
/// an ACL for it). A Keeper password changed or removed in `<cluster>-operator` is refused with
/// the key and the Secret named and nothing is written; the previous value back heals it.
#[test]
fn a_changed_or_removed_keeper_identity_is_refused_and_nothing_is_written() {
    use crate::model::config::server::keeper_identity_text;
    use crate::plan::FailureReason;
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
    let first = model::Password("first".into());
    sim.obs.inputs.keeper_password = Some(first.clone());
    sim.converge(20);
    sim.obs.keeper_identity_in_use = Some(keeper_identity_text(&first));
    assert_eq!(
        sim.converge(5),
        0,
        "the identity in use is the one asked for"
    );
    for changed in [Some(model::Password("second".into())), None] {
        sim.obs.inputs.keeper_password = changed;
        let p = sim.plan_caught_up();
        let f = p.failure.as_ref().expect("refused");
        assert_eq!(f.reason, FailureReason::CredentialChangeRefused);
        assert!(
            f.message.contains("keeper-password") && f.message.contains("c1-operator"),
            "{}",
            f.message
        );
        assert!(p.steps.is_empty(), "nothing written: {:?}", p.steps);
    }
    sim.obs.inputs.keeper_password = Some(first);
    let p = sim.plan_caught_up();
    assert!(p.failure.is_none() && p.steps.is_empty(), "{:?}", p.failure);
}

/// Decision 28: with an external Keeper, the first pass creates the cluster's root in it and no
/// server; the servers come once the root is recorded, and the cluster converges with no
/// Keeper of its own.
#[test]
fn an_external_keeper_gets_the_root_before_any_server_starts() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2,
        "keeper": {"replicas": 0, "external": {"nodes": [{"host": "zk-0.zk", "port": 2181}]}}}));
    let p = sim.plan();
    assert!(
        p.steps.contains(&Step::EnsureKeeperRoot {
            root: "/clickhouse-operator/t1/c1".into()
        }),
        "{:?}",
        p.steps
    );
    assert!(
        statefulsets_applied(&p).is_empty(),
        "no server before the root: {:?}",
        p.steps
    );
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready, "{:?}", sim.cluster.status);
    let status = sim.cluster.status.clone().unwrap();
    assert_eq!(
        status.keeper_root.as_deref(),
        Some("/clickhouse-operator/t1/c1")
    );
    assert!(!sim.obs.statefulsets.contains_key("c1-keeper"));
    assert_eq!(sim.obs.statefulsets.len(), 2);
    let p = sim.plan();
    assert!(p.steps.is_empty(), "{:?}", p.steps);
}

/// Decision 28: once the servers keep their data under an external Keeper's root, a spec naming
/// another root is refused with both named, and nothing is written.
#[test]
fn a_changed_external_keeper_root_is_refused_and_nothing_is_written() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2,
        "keeper": {"replicas": 0, "external": {"nodes": [{"host": "zk-0.zk"}], "root": "/a"}}}));
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready, "{:?}", sim.cluster.status);
    sim.cluster.spec.keeper.external.as_mut().unwrap().root = Some("/b".into());
    sim.cluster.metadata.generation = Some(2);
    let p = sim.plan();
    assert!(p.steps.is_empty(), "{:?}", p.steps);
    let f = p.failure.expect("refused");
    assert_eq!(f.reason, crate::plan::FailureReason::InvalidSpec);
    assert!(
        f.message.contains("/a") && f.message.contains("/b"),
        "{}",
        f.message
    );
}

/// Decision 38: a cluster on another namespace's cluster's Keeper proceeds only once that
/// cluster lists its namespace in `spec.keeper.allowedNamespaces`, and a new root must lie in
/// its own namespace's folder of that Keeper; a root made before the rule stays.
#[test]
fn another_namespaces_keeper_is_used_only_with_its_consent_and_in_our_folder() {
    use crate::plan::facts::KeeperOwner;
    let spec = |root: Option<&str>| {
        let mut x = serde_json::json!({"clusterRef": {"name": "shared", "namespace": "infra"}});
        if let Some(r) = root {
            x["root"] = r.into();
        }
        serde_json::json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 0, "external": x}})
    };
    for (owner, says) in [
        (
            KeeperOwner::Refuses,
            "add t1 to its spec.keeper.allowedNamespaces",
        ),
        (KeeperOwner::Missing, "infra/shared does not exist"),
    ] {
        let mut sim = Sim::new(spec(None));
        sim.obs.keeper_owner = Some(owner);
        let p = sim.plan();
        assert!(p.steps.is_empty(), "nothing is created: {:?}", p.steps);
        let f = p.failure.expect("refused");
        assert_eq!(f.reason, crate::plan::FailureReason::Keeper);
        assert!(f.message.contains(says), "{}", f.message);
    }
    for root in [
        "/clickhouse",
        "/clickhouse-operator/other-ns/c1",
        "/clickhouse-operator/t1",
    ] {
        let mut sim = Sim::new(spec(Some(root)));
        sim.obs.keeper_owner = Some(KeeperOwner::Allows);
        let p = sim.plan();
        let f = p.failure.unwrap_or_else(|| panic!("{root} refused"));
        assert!(
            f.message
                .contains("must lie below /clickhouse-operator/t1/"),
            "{}",
            f.message
        );
    }
    let mut sim = Sim::new(spec(Some("/clickhouse-operator/t1/analytics")));
    sim.obs.keeper_owner = Some(KeeperOwner::Allows);
    assert!(sim.plan().steps.contains(&Step::EnsureKeeperRoot {
        root: "/clickhouse-operator/t1/analytics".into()
    }));
    // a root made before the rule stays usable
    let mut old = Sim::new(spec(Some("/legacy/root")));
    old.obs.keeper_owner = Some(KeeperOwner::Allows);
    old.cluster
        .status
        .get_or_insert_with(Default::default)
        .keeper_root = Some("/legacy/root".into());
    assert!(old.plan().failure.is_none());
}

/// Decision 71 (review M-4): `keeper.external.nodes` that name another namespace's cluster's
/// Keeper (the observer found a member to be its Service or one of its pods) are held to
/// decision 38 as a `clusterRef` is: refused, with nothing created and the field named, until
/// that cluster lists this namespace in `spec.keeper.allowedNamespaces`, and then only with a
/// root in this namespace's folder. Nodes that are no cluster's Keeper are used as before.
#[test]
fn nodes_that_are_another_namespaces_keeper_need_its_consent_and_our_folder() {
    use crate::plan::facts::KeeperOwner;
    let spec = |root: &str| {
        serde_json::json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 0, "external": {
            "root": root, "nodes": [{"host": "10.96.0.12", "port": 2181}]}}})
    };
    let of = Some(("infra".to_string(), "shared".to_string()));
    let mut sim = Sim::new(spec("/squat/c"));
    sim.obs.keeper_nodes_of = of.clone();
    sim.obs.keeper_owner = Some(KeeperOwner::Refuses);
    let p = sim.plan();
    assert!(p.steps.is_empty(), "nothing is created: {:?}", p.steps);
    let f = p.failure.expect("refused");
    assert_eq!(f.reason, crate::plan::FailureReason::Keeper);
    assert!(
        f.message.starts_with(
            "spec.keeper.external.nodes: name the Keeper of ClickHouseCluster infra/shared"
        ) && f
            .message
            .contains("add t1 to its spec.keeper.allowedNamespaces"),
        "{}",
        f.message
    );
    let mut sim = Sim::new(spec("/squat/c"));
    sim.obs.keeper_nodes_of = of.clone();
    sim.obs.keeper_owner = Some(KeeperOwner::Allows);
    let f = sim.plan().failure.expect("outside the folder: refused");
    assert!(
        f.message
            .contains("must lie below /clickhouse-operator/t1/"),
        "{}",
        f.message
    );
    let mut sim = Sim::new(spec("/clickhouse-operator/t1/c"));
    sim.obs.keeper_nodes_of = of;
    sim.obs.keeper_owner = Some(KeeperOwner::Allows);
    assert!(sim.plan().steps.contains(&Step::EnsureKeeperRoot {
        root: "/clickhouse-operator/t1/c".into()
    }));
    // members that are no cluster's Keeper: the root is the cluster's choice
    let sim = Sim::new(spec("/squat/c"));
    assert!(sim.plan().steps.contains(&Step::EnsureKeeperRoot {
        root: "/squat/c".into()
    }));
}
