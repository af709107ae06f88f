//! Storage: the data PVC's name, further disks, storage policies and a log volume, and the
//! labels of Keeper's PVCs.

use super::*;

/// The PVC Kubernetes creates for a replica (`<claim template>-<sts>-<ordinal>`) is the one
/// [`names::data_pvc`] names, which scale-in labels and storage growth resizes.
#[test]
fn a_replicas_data_pvc_is_named_by_data_pvc() {
    let c = cluster(json!({"shards": 2}));
    let d = build(&c, &inputs(replicas(2, 2)));
    for sts in &d.server_statefulsets {
        let name = sts.metadata.name.clone().unwrap();
        let templates = sts.spec.volume_claim_templates.clone().unwrap();
        let claims: Vec<String> = templates
            .iter()
            .map(|t| format!("{}-{name}-0", t.metadata.name.clone().unwrap()))
            .collect();
        assert_eq!(claims, [names::data_pvc(&name)]);
    }
}

/// docs/configuration.md, "Storage": further disks, storage policies and a log volume: a claim
/// template and a mount per disk (`disk-<name>` at `/var/lib/clickhouse-disks/<name>`), the log
/// volume's claim instead of scratch space, `storage_configuration` with the disks at their mount
/// paths and the policies' volumes in the spec's order; PVC labels and annotations on every claim
/// template under the operator's labels. Without them the objects are the same as before.
#[test]
fn disks_policies_and_a_log_volume_become_claims_mounts_and_storage_configuration() {
    let plain = build(&cluster(json!({})), &inputs(replicas(1, 1)));
    let c = cluster(json!({"storage": {
        "size": "10Gi",
        "labels": {"team": "analytics", "app.kubernetes.io/instance": "mine"},
        "annotations": {"example.com/tier": "hot"},
        "disks": [{"name": "cold", "size": "100Gi", "storageClassName": "hdd"},
                  {"name": "jbod2", "size": "10Gi"}],
        "policies": {"tiered": {"moveFactor": 0.2, "volumes": [
            {"name": "hot", "disks": ["default", "jbod2"], "maxDataPartSize": "1Gi"},
            {"name": "cold", "disks": ["cold"]}]}},
        "logs": {"size": "2Gi"}
    }}));
    let d = build(&c, &inputs(replicas(1, 1)));
    let sts = &d.server_statefulsets[0];
    let claims = sts.spec.volume_claim_templates.as_ref().unwrap();
    let names: Vec<_> = claims
        .iter()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["data", "disk-cold", "disk-jbod2", "logs"]);
    for claim in claims {
        let l = claim.metadata.labels.as_ref().unwrap();
        assert_eq!(l["team"], "analytics");
        assert_eq!(l[labels::CLUSTER], "c1", "the operator's labels win");
        assert_ne!(
            l["app.kubernetes.io/instance"], "mine",
            "the operator's labels win"
        );
        assert_eq!(
            claim.metadata.annotations.as_ref().unwrap()["example.com/tier"],
            "hot"
        );
    }
    let class = |i: usize| claims[i].spec.as_ref().unwrap().storage_class_name.clone();
    assert_eq!(class(1).as_deref(), Some("hdd"));
    assert_eq!(class(2), None);
    let pod = sts.spec.template.spec.as_ref().unwrap();
    let mounts = pod.containers[0].volume_mounts.as_ref().unwrap();
    let at = |v: &str| {
        mounts
            .iter()
            .find(|m| m.name == v)
            .map(|m| m.mount_path.clone())
    };
    assert_eq!(
        at("disk-cold").as_deref(),
        Some("/var/lib/clickhouse-disks/cold")
    );
    assert_eq!(
        at("disk-jbod2").as_deref(),
        Some("/var/lib/clickhouse-disks/jbod2")
    );
    assert_eq!(at("logs").as_deref(), Some(names::SERVER_LOG_PATH));
    let volumes = pod.volumes.as_ref().unwrap();
    assert!(
        !volumes.iter().any(|v| v.name == "logs"),
        "the log volume is the claim, not scratch space"
    );
    let server = common_file(&d, SERVER_FILE);
    let storage = &server[server.find("<storage_configuration>").expect(server)..];
    for expected in [
        "<cold>\n                <path>/var/lib/clickhouse-disks/cold/</path>",
        "<jbod2>\n                <path>/var/lib/clickhouse-disks/jbod2/</path>",
        "<tiered>\n                <volumes>\n                    <hot>\n                        <disk>default</disk>\n                        <disk>jbod2</disk>\n                        <max_data_part_size_bytes>1073741824</max_data_part_size_bytes>\n                    </hot>\n                    <cold>\n                        <disk>cold</disk>\n                    </cold>\n                </volumes>\n                <move_factor>0.2</move_factor>",
    ] {
        assert!(storage.contains(expected), "{expected}\nin\n{storage}");
    }
    // without any of it: one claim, scratch space for logs, no storage_configuration
    let sts0 = &plain.server_statefulsets[0];
    assert_eq!(sts0.spec.volume_claim_templates.as_ref().unwrap().len(), 1);
    assert!(
        sts0.spec
            .template
            .spec
            .as_ref()
            .unwrap()
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .any(|v| v.name == "logs" && v.empty_dir.is_some())
    );
    assert!(!common_file(&plain, SERVER_FILE).contains("storage_configuration"));
    let claim0 = &sts0.spec.volume_claim_templates.as_ref().unwrap()[0];
    assert!(claim0.metadata.annotations.is_none());
}

/// docs/configuration.md, "Storage": the Keeper's PVC labels and annotations come from
/// `spec.keeper.storage`.
#[test]
fn keeper_pvcs_carry_the_labels_of_keeper_storage() {
    let c = cluster(json!({"keeper": {"storage": {"size": "1Gi", "labels": {"team": "k"}}}}));
    let d = build(&c, &inputs(replicas(1, 1)));
    let k = d.keeper.unwrap();
    let claim = &k.statefulset.spec.volume_claim_templates.as_ref().unwrap()[0];
    assert_eq!(claim.metadata.labels.as_ref().unwrap()["team"], "k");
}
