//! Storage: growth resizes the PVCs, an added disk recreates the StatefulSets, PVC labels reach
//! existing claims, for the servers and Keeper.

use super::*;

/// S2-13: a data volume grows in place: the PVC first, then the StatefulSet is deleted with
/// its pod kept and created again once it is gone; no pod restarts, and a PVC still resizing
/// holds the rollout back.
#[test]
fn storage_growth_resizes_the_pvc_and_recreates_the_statefulset_keeping_the_pod() {
    use k8s_openapi::api::core::v1::{
        PersistentVolumeClaim, PersistentVolumeClaimCondition, PersistentVolumeClaimSpec,
        PersistentVolumeClaimStatus, VolumeResourceRequirements,
    };
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 1,
        "storage": {"size": "1Gi"}, "storageScaling": {"enableVolumeScaling": true}}));
    sim.converge(20);
    let replica = sim.map().keys().next().unwrap().clone();
    let pvc = model::names::data_pvc(&replica);
    sim.obs.pvcs.insert(
        pvc.clone(),
        PersistentVolumeClaim {
            spec: Some(PersistentVolumeClaimSpec {
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([(
                        "storage".to_string(),
                        Quantity("1Gi".into()),
                    )])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    let pod_before = sim.obs.pods[&format!("{replica}-0")].clone();
    sim.cluster.spec.storage.data.size = "2Gi".into();
    let p = sim.plan();
    let described: Vec<String> = p.steps.iter().map(Step::describe).collect();
    let resize = described
        .iter()
        .position(|d| d.starts_with("resize PVC"))
        .expect("resize");
    let orphan = described
        .iter()
        .position(|d| d.starts_with(&format!("delete StatefulSet {replica}")))
        .expect("orphan");
    assert!(resize < orphan, "{described:?}");
    assert!(p.again);
    sim.act(&p);
    assert_eq!(
        sim.obs.pods[&format!("{replica}-0")],
        pod_before,
        "the pod is kept"
    );
    // The PVC now reports the volume being expanded: nothing rolls meanwhile.
    sim.obs.pvcs.get_mut(&pvc).unwrap().status = Some(PersistentVolumeClaimStatus {
        conditions: Some(vec![PersistentVolumeClaimCondition {
            type_: "Resizing".into(),
            status: "True".into(),
            ..Default::default()
        }]),
        ..Default::default()
    });
    let p = sim.plan();
    assert!(p.steps.iter().any(|a| matches!(a, Step::Apply { kind: Kind::StatefulSet, name, create: true, .. } if *name == replica)), "{:?}", p.steps);
    sim.act(&p);
    let p = sim.plan();
    assert!(
        p.status
            .message
            .as_deref()
            .unwrap_or("")
            .contains(&format!("PVC {pvc} is being resized")),
        "{:?}",
        p.status.message
    );
    assert_ne!(p.status.state, ClusterState::Ready);
    sim.obs.pvcs.get_mut(&pvc).unwrap().status = None;
    sim.log.clear();
    sim.converge(20);
    assert!(
        !sim.log.iter().any(|l| l.starts_with("restart")),
        "{:?}",
        sim.log
    );
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// The claim templates of an observed StatefulSet, by name.
fn claim_names(sim: &Sim, sts: &str) -> Vec<String> {
    sim.obs.statefulsets[sts]
        .spec
        .volume_claim_templates
        .iter()
        .flatten()
        .map(|t| t.metadata.name.clone().unwrap())
        .collect()
}

/// docs/configuration.md, "Storage": a disk added to a running cluster recreates each StatefulSet
/// with the new claim template (pods kept), then restarts every server exactly once, one replica of
/// a shard at a time, to mount it; each replica ends with a `disk-<name>` PVC. Removing the disk
/// again is refused with the field named, and nothing is deleted or restarted.
#[test]
fn an_added_disk_recreates_the_statefulsets_and_restarts_each_server_once() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
    sim.converge(20);
    let replicas: Vec<String> = sim.map().keys().map(|k| k.to_string()).collect();
    sim.log.clear();
    sim.cluster.spec.storage = serde_json::from_value(serde_json::json!({
        "size": "10Gi",
        "disks": [{"name": "cold", "size": "20Gi"}],
        "policies": {"tiered": {"volumes": [
            {"name": "hot", "disks": ["default"]}, {"name": "cold", "disks": ["cold"]}]}}
    }))
    .unwrap();
    let p = sim.plan();
    for r in &replicas {
        assert!(
            p.steps
                .iter()
                .any(|a| matches!(a, Step::OrphanStatefulSet { name } if name == r)),
            "{:?}",
            p.steps
        );
    }
    assert!(
        !p.steps.iter().any(|a| matches!(a, Step::RestartPod { .. })),
        "no restart while the StatefulSets are recreated: {:?}",
        p.steps
    );
    sim.converge(40);
    for r in &replicas {
        assert_eq!(claim_names(&sim, r), ["data", "disk-cold"]);
        assert!(sim.obs.pvcs.contains_key(&format!("disk-cold-{r}-0")));
    }
    let restarts = server_restarts(&sim.log);
    assert_eq!(
        restarts.len(),
        2,
        "every server restarts once: {:?}",
        sim.log
    );
    assert_eq!(sim.state(), ClusterState::Ready);

    sim.log.clear();
    sim.cluster.spec.storage.disks.clear();
    sim.cluster.spec.storage.policies.clear();
    let p = sim.plan();
    assert!(
        !p.steps.iter().any(|a| matches!(
            a,
            Step::OrphanStatefulSet { .. } | Step::RestartPod { .. } | Step::Delete { .. }
        )),
        "{:?}",
        p.steps
    );
    let message = p.status.message.clone().unwrap_or_default();
    assert!(
        message.contains("spec.storage.disks[cold]") && message.contains("cannot be removed"),
        "{message}"
    );
}

/// docs/configuration.md, "Storage": PVC labels and annotations from `spec.storage` reach the claim
/// templates (the StatefulSets recreated, no pod restarted) and the existing PVCs (patched); an
/// idle pass after that writes nothing.
#[test]
fn pvc_labels_reach_existing_pvcs_without_a_restart() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 1}));
    sim.converge(20);
    let replica = sim.map().keys().next().unwrap().clone();
    let pvc = model::names::data_pvc(&replica);
    assert!(sim.obs.pvcs.contains_key(&pvc));
    sim.log.clear();
    sim.cluster
        .spec
        .storage
        .data
        .labels
        .insert("team".into(), "analytics".into());
    sim.cluster
        .spec
        .storage
        .data
        .annotations
        .insert("backup.example.com/skip".into(), "true".into());
    sim.converge(20);
    let m = &sim.obs.pvcs[&pvc].metadata;
    assert_eq!(m.labels.as_ref().unwrap()["team"], "analytics");
    assert_eq!(
        m.annotations.as_ref().unwrap()["backup.example.com/skip"],
        "true"
    );
    let template = &sim.obs.statefulsets[replica.as_str()]
        .spec
        .volume_claim_templates
        .as_ref()
        .unwrap()[0];
    assert_eq!(
        template.metadata.labels.as_ref().unwrap()["team"],
        "analytics"
    );
    assert!(server_restarts(&sim.log).is_empty(), "{:?}", sim.log);
    assert!(
        sim.log
            .iter()
            .any(|l| l.starts_with(&format!("delete StatefulSet {replica}")))
    );
    let p = sim.plan_caught_up();
    assert!(p.steps.is_empty(), "{:?}", p.steps);
}

/// docs/configuration.md, "Storage": `spec.keeper.storage.labels` reach every Keeper member's PVC
/// (patched) and the Keeper's claim template (its StatefulSet recreated, no member restarted).
#[test]
fn keeper_pvc_labels_reach_every_member_without_a_restart() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 1}));
    sim.converge(20);
    let keeper = model::names::keeper("c1");
    let pods_before: Vec<_> = (0..3)
        .map(|i| sim.obs.pods[&format!("{keeper}-{i}")].clone())
        .collect();
    sim.cluster
        .spec
        .keeper
        .storage
        .labels
        .insert("team".into(), "coordination".into());
    sim.converge(20);
    for i in 0..3 {
        let m = &sim.obs.pvcs[&format!("data-{keeper}-{i}")].metadata;
        assert_eq!(
            m.labels.as_ref().unwrap()["team"],
            "coordination",
            "member {i}"
        );
    }
    let template = &sim.obs.statefulsets[&keeper]
        .spec
        .volume_claim_templates
        .as_ref()
        .unwrap()[0];
    assert_eq!(
        template.metadata.labels.as_ref().unwrap()["team"],
        "coordination"
    );
    let pods_after: Vec<_> = (0..3)
        .map(|i| sim.obs.pods[&format!("{keeper}-{i}")].clone())
        .collect();
    assert_eq!(pods_before, pods_after, "no member restarts");
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// The Keeper's volumes grow in place as the servers' do: every member's PVC is resized, the
/// Keeper StatefulSet (whose claim template cannot change) is recreated with its pods kept,
/// and no member restarts.
#[test]
fn keeper_storage_growth_resizes_every_member_pvc_without_a_restart() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 1,
        "storageScaling": {"enableVolumeScaling": true}}));
    sim.converge(20);
    let keeper = model::names::keeper("c1");
    let members: Vec<String> = (0..3).map(|i| format!("data-{keeper}-{i}")).collect();
    for m in &members {
        assert!(sim.obs.pvcs.contains_key(m), "{m}");
    }
    let pods_before: Vec<_> = (0..3)
        .map(|i| sim.obs.pods[&format!("{keeper}-{i}")].clone())
        .collect();
    sim.log.clear();
    sim.cluster.spec.keeper.storage.size = "2Gi".into();
    let p = sim.plan();
    assert!(
        !p.steps.iter().any(
            |a| matches!(a, Step::Apply { kind: Kind::StatefulSet, name, .. } if *name == keeper)
        ),
        "the Keeper StatefulSet is not applied with a changed claim template: {:?}",
        p.steps
    );
    sim.converge(20);
    for m in &members {
        let size = &sim.obs.pvcs[m]
            .spec
            .as_ref()
            .unwrap()
            .resources
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap()["storage"];
        assert_eq!(size.0, "2Gi", "{m}");
    }
    assert!(
        sim.log
            .iter()
            .any(|l| l.starts_with(&format!("delete StatefulSet {keeper}"))),
        "{:?}",
        sim.log
    );
    let pods_after: Vec<_> = (0..3)
        .map(|i| sim.obs.pods[&format!("{keeper}-{i}")].clone())
        .collect();
    assert_eq!(pods_before, pods_after, "no member restarts");
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// The class of each StatefulSet's data claim template: name → class.
fn data_classes(sim: &Sim) -> BTreeMap<String, Option<String>> {
    sim.obs
        .statefulsets
        .iter()
        .map(|(n, s)| {
            let json = serde_json::to_value(s).unwrap();
            let class = crate::plan::facts::claims(&json)["data"].class.clone();
            (n.clone(), class)
        })
        .collect()
}

fn classes(server: Option<&str>, keeper: Option<&str>) -> crate::api::StorageClasses {
    crate::api::StorageClasses {
        server: server.map(Into::into),
        keeper: keeper.map(Into::into),
    }
}

/// Decision 59: a new cluster takes the operator's default storage classes (servers' data
/// volumes and disks, Keeper's volume) and keeps them: the status records them, a default
/// changed later changes nothing of it (no step, no refusal) and a shard added afterwards
/// takes the recorded class; a class the cluster names itself wins; a lost status is rebuilt
/// from the volumes.
#[test]
fn default_storage_classes_are_pinned_when_the_volumes_are_made() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 1,
        "keeper": {"replicas": 1},
        "storage": {"size": "1Gi", "disks": [{"name": "cold", "size": "1Gi"}]}}));
    sim.obs.default_storage_classes = classes(Some("fast"), Some("ssd"));
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready);
    let made = data_classes(&sim);
    assert_eq!(made["c1-keeper"].as_deref(), Some("ssd"));
    assert_eq!(made["c1-0-0"].as_deref(), Some("fast"));
    let json = serde_json::to_value(&sim.obs.statefulsets["c1-0-0"]).unwrap();
    assert_eq!(
        crate::plan::facts::claims(&json)["disk-cold"]
            .class
            .as_deref(),
        Some("fast")
    );
    let status = sim.cluster.status.clone().unwrap();
    assert_eq!(
        status.default_storage_classes,
        Some(classes(Some("fast"), Some("ssd")))
    );

    // the default changes: this cluster keeps its classes, a new shard included
    sim.obs.default_storage_classes = classes(Some("slow"), None);
    let p = sim.plan();
    assert!(p.steps.is_empty(), "{:?}", p.steps);
    assert!(p.failure.is_none(), "{:?}", p.failure);
    sim.cluster.spec.shards = 2;
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready);
    assert_eq!(data_classes(&sim)["c1-1-1"].as_deref(), Some("fast"));

    // a lost status: the volumes say it
    sim.cluster.status.as_mut().unwrap().default_storage_classes = None;
    let p = sim.plan();
    assert!(
        p.failure.is_none() && statefulsets_applied(&p).is_empty(),
        "{:?} {:?}",
        p.failure,
        p.steps
    );

    // a class of the cluster's own wins over the default
    let mut own = Sim::new(serde_json::json!({"shards": 1, "replicas": 1,
        "keeper": {"replicas": 1}, "storage": {"size": "1Gi", "storageClassName": "gold"}}));
    own.obs.default_storage_classes = classes(Some("fast"), None);
    own.converge(20);
    let made = data_classes(&own);
    assert_eq!(made["c1-0-0"].as_deref(), Some("gold"));
    assert_eq!(made["c1-keeper"], None);
}

/// Decision 59: a cluster whose volumes were made before the defaults named a class keeps the
/// cluster default class (none named): the new default changes nothing and is not recorded.
#[test]
fn a_default_storage_class_does_not_reach_a_cluster_made_before_it() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2,
        "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}));
    sim.converge(20);
    sim.obs.default_storage_classes = classes(Some("fast"), Some("ssd"));
    let p = sim.plan();
    assert!(p.steps.is_empty(), "{:?}", p.steps);
    assert!(p.failure.is_none(), "{:?}", p.failure);
    assert_eq!(p.status.default_storage_classes, None);
    sim.cluster.spec.shards = 2;
    sim.converge(20);
    assert!(data_classes(&sim).values().all(Option::is_none));
}
