//! Server and Keeper pods: locked down and probed, no ServiceAccount token, the user's pod
//! templates, the serving and spread labels, and placement (replicas of a shard kept apart and
//! spread over the topology).

use super::*;

/// S0-22 / S0-23: server pods carry serving and spread labels; the client Service selects
/// serving, the spread constraint selects spread, the StatefulSet selector neither.
#[test]
fn serving_and_spread_labels_drive_the_client_service_and_the_spread_constraint() {
    let c = cluster(
        json!({"pod": {"topologySpreadKey": "topology.kubernetes.io/zone", "labels": {"team": "a"}}}),
    );
    let d = build(&c, &inputs(replicas(1, 2)));
    let sts = &d.server_statefulsets[0];
    let pod_labels = sts
        .spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    assert_eq!(pod_labels[labels::SERVING], "true");
    assert_eq!(pod_labels[labels::SPREAD], "true");
    assert_eq!(pod_labels[labels::SHARD], "0");
    assert_eq!(pod_labels[labels::REPLICA], "c1-0-0");
    assert_eq!(pod_labels["team"], "a");
    let selector = sts.spec.selector.match_labels.clone().unwrap();
    assert_eq!(
        selector.keys().collect::<Vec<_>>(),
        [labels::CLUSTER, labels::REPLICA]
    );
    let client = d.client_service.unwrap().spec.unwrap();
    assert_eq!(client.selector.unwrap()[labels::SERVING], "true");
    assert_eq!(client.type_.as_deref(), Some("ClusterIP"));
    let spread = &sts
        .spec
        .template
        .spec
        .as_ref()
        .unwrap()
        .topology_spread_constraints
        .as_ref()
        .unwrap()[0];
    assert_eq!(spread.max_skew, 1);
    assert_eq!(spread.when_unsatisfiable, "ScheduleAnyway");
    let sel = spread.label_selector.clone().unwrap().match_labels.unwrap();
    assert_eq!(sel[labels::SPREAD], "true");
    assert!(!sel.contains_key(labels::SERVING));
    let headless = d.headless_service.spec.unwrap();
    assert_eq!(headless.cluster_ip.as_deref(), Some("None"));
    assert_eq!(headless.publish_not_ready_addresses, Some(true));
    assert!(!headless.selector.unwrap().contains_key(labels::SERVING));
    let ports: Vec<_> = headless.ports.unwrap().iter().map(|p| p.port).collect();
    assert_eq!(ports, [8123, 9000, 9009]);
}

/// Pods run as non-root with a read-only root filesystem, seccomp RuntimeDefault, writable
/// volumes where ClickHouse writes, and /ping probes.
#[test]
fn server_pods_are_locked_down_and_probed_on_ping() {
    let c = cluster(json!({"storage": {"size": "20Gi", "storageClassName": "fast"}}));
    let d = build(&c, &inputs(replicas(1, 1)));
    let sts = &d.server_statefulsets[0];
    let pod = sts.spec.template.spec.clone().unwrap();
    let psc = pod.security_context.unwrap();
    assert_eq!(
        (psc.run_as_user, psc.fs_group, psc.run_as_non_root),
        (Some(101), Some(101), Some(true))
    );
    assert_eq!(psc.seccomp_profile.unwrap().type_, "RuntimeDefault");
    let main = &pod.containers[0];
    let csc = main.security_context.clone().unwrap();
    assert_eq!(csc.allow_privilege_escalation, Some(false));
    assert_eq!(csc.read_only_root_filesystem, Some(true));
    let mounts: BTreeMap<_, _> = main
        .volume_mounts
        .clone()
        .unwrap()
        .into_iter()
        .map(|m| (m.mount_path, m.name))
        .collect();
    for path in [
        "/var/lib/clickhouse",
        "/var/log/clickhouse-server",
        "/tmp",
        "/etc/clickhouse-server/config.d",
        "/etc/clickhouse-server/users.d",
    ] {
        assert!(mounts.contains_key(path), "{path}");
    }
    for probe in [
        main.readiness_probe.clone().unwrap(),
        main.liveness_probe.clone().unwrap(),
        main.startup_probe.clone().unwrap(),
    ] {
        let get = probe.http_get.unwrap();
        assert_eq!(get.path.as_deref(), Some("/ping"));
        assert_eq!(
            get.port,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(8123)
        );
    }
    // A server loading many parts after a restart is not killed before `startupSeconds`
    // (default 120 s); one stuck at start-up is restarted then, not after a long delay.
    let startup = main.startup_probe.clone().unwrap();
    assert_eq!(
        startup.period_seconds.unwrap() * startup.failure_threshold.unwrap(),
        120
    );
    assert_eq!(
        main.liveness_probe.clone().unwrap().initial_delay_seconds,
        None
    );
    let vct = &sts.spec.volume_claim_templates.clone().unwrap()[0];
    assert_eq!(vct.metadata.name.as_deref(), Some("data"));
    let vspec = vct.spec.clone().unwrap();
    assert_eq!(vspec.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(
        vspec.resources.unwrap().requests.unwrap()["storage"].0,
        "20Gi"
    );
    // config.d combines the common and the replica ConfigMaps; users.d the users Secret.
    let projected: Vec<String> = pod
        .volumes
        .unwrap()
        .into_iter()
        .filter_map(|v| v.projected)
        .flat_map(|p| p.sources.unwrap())
        .map(|s| {
            s.config_map
                .map(|c| c.name)
                .or(s.secret.map(|s| s.name))
                .unwrap()
        })
        .collect();
    // config.d: common, replica, remote_servers, interserver credentials and the Keeper
    // identity from the users Secret; users.d: users.
    assert_eq!(
        projected,
        [
            "c1-common",
            "c1-0-0",
            "c1-users",
            "c1-users",
            "c1-users",
            "c1-users"
        ]
    );
}

/// Decisions 28, 32, 34 and 42, and invariant 9: ClickHouse and Keeper pods mount no ServiceAccount
/// token, keep a shard's replicas (the Keeper members) apart and mount their credentials 0440,
/// Keeper's entrypoint is told its data directory and its command survives `setHostnameAsFQDN`; a
/// StatefulSet written by an operator version that did not say so (its template lacks all of it,
/// the API server's default 0644 on its volumes, its template hash taken without them) is not
/// rolled for them, while a real change still is.
#[test]
fn pods_mount_no_token_and_an_older_template_without_the_field_is_not_rolled_for_it() {
    use crate::model::changes::pod_template_changed;
    let c = cluster(json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 3}}));
    let d = build(&c, &inputs(replicas(1, 2)));
    let keeper = d.keeper.as_ref().unwrap().statefulset.clone();
    let mut all: Vec<StatefulSet> = d.server_statefulsets.clone();
    all.push(keeper);
    for sts in &all {
        let spec = sts.spec.template.spec.as_ref().unwrap();
        assert_eq!(spec.automount_service_account_token, Some(false));
        let desired = serde_json::to_value(sts).unwrap();
        // as a previous version wrote it: no such field, no default anti-affinity (decision 28),
        // hash over what it had
        let mut older = desired.clone();
        let older_spec = older["spec"]["template"]["spec"].as_object_mut().unwrap();
        older_spec.remove("automountServiceAccountToken");
        assert!(
            older_spec.remove("affinity").is_some(),
            "the default anti-affinity is in the template"
        );
        // nor a mode on the volumes of credentials (decision 34): the hash was taken without
        // it, and the API server wrote its default 0644
        let mut modes = 0;
        for v in older["spec"]["template"]["spec"]["volumes"]
            .as_array_mut()
            .unwrap()
        {
            for kind in ["secret", "projected"] {
                if let Some(m) = v.get_mut(kind).and_then(|s| s.as_object_mut())
                    && m.remove("defaultMode").is_some()
                {
                    modes += 1;
                }
            }
        }
        assert!(modes > 0 || sts.metadata.name.as_deref().unwrap().contains("keeper"));
        // nor the main container's log-on-error termination message (decision 30): the API server
        // wrote its default `File`
        let main = &mut older["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(
            main.as_object_mut()
                .unwrap()
                .remove("terminationMessagePolicy"),
            Some(json!(crate::model::LOG_ON_ERROR)),
            "the main container ends with its log's tail"
        );
        // nor Keeper's data directory variable and host-name-safe command (decision 42)
        if main["name"] == crate::model::keeper::KEEPER_CONTAINER {
            let m = main.as_object_mut().unwrap();
            m.insert(
                "command".into(),
                json!([
                    "/bin/bash",
                    "-c",
                    "export KEEPER_SERVER_ID=$(( ${HOSTNAME##*-} + 1 )); exec /entrypoint.sh"
                ]),
            );
            let env = m["env"].as_array_mut().unwrap();
            env.retain(|e| e["name"] != "CLICKHOUSE_DATA_DIR");
            assert!(env.is_empty(), "no other variable: {env:?}");
            m.remove("env");
            // and its default startup budget of 60 s, 30 checks 2 s apart (decision 67)
            m.insert(
                "startupProbe".into(),
                json!({"tcpSocket": {"port": 9181}, "periodSeconds": 2, "failureThreshold": 30}),
            );
        }
        older["metadata"]["annotations"][labels::TEMPLATE_HASH] =
            serde_json::Value::String(hash::json_hash(&older["spec"]["template"]));
        older["spec"]["template"]["spec"]["containers"][0]["terminationMessagePolicy"] =
            json!("File");
        for v in older["spec"]["template"]["spec"]["volumes"]
            .as_array_mut()
            .unwrap()
        {
            for kind in ["secret", "projected"] {
                if let Some(m) = v.get_mut(kind).and_then(|s| s.as_object_mut()) {
                    m.insert("defaultMode".into(), json!(0o644));
                }
            }
        }
        assert!(
            !pod_template_changed(&older, &desired),
            "{} would restart on an operator upgrade",
            sts.metadata.name.as_deref().unwrap()
        );
        assert_a_real_change_rolls(&older, &desired);
    }
}

/// Decision 28: `spec.pod.template` and `spec.keeper.pod.template` reach every server and Keeper
/// pod template (an init container, an extra volume mounted into the main container, a pull
/// secret); one that sets what the operator owns is an error naming the field, for the servers
/// and for Keeper alike, and nothing is built.
#[test]
fn pod_templates_reach_the_server_and_keeper_pods_and_owned_fields_are_refused() {
    let template = json!({"spec": {
        "imagePullSecrets": [{"name": "registry"}],
        "initContainers": [{"name": "prepare", "image": "busybox", "command": ["true"]}],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "containers": [{"name": "clickhouse",
            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}]}});
    let mut keeper_template = template.clone();
    keeper_template["spec"]["containers"][0]["name"] = json!("keeper");
    let c = cluster(
        json!({"keeper": {"replicas": 3, "pod": {"template": keeper_template}},
        "pod": {"template": template}}),
    );
    let d = build(&c, &inputs(replicas(2, 2)));
    let keeper = &d.keeper.as_ref().unwrap().statefulset.spec;
    let mut all = templates(&d);
    all.push(keeper.template.clone());
    assert_eq!(all.len(), 5);
    for t in &all {
        let spec = t.spec.as_ref().unwrap();
        assert_eq!(
            spec.image_pull_secrets.as_ref().unwrap()[0].name,
            "registry"
        );
        assert_eq!(spec.init_containers.as_ref().unwrap()[0].name, "prepare");
        let volumes = spec.volumes.as_ref().unwrap();
        assert!(volumes.iter().any(|v| v.name == "scratch"));
        let main = &spec.containers[0];
        assert!(main.image.is_some(), "the main container keeps its image");
        assert!(
            main.volume_mounts
                .as_ref()
                .unwrap()
                .iter()
                .any(|m| m.mount_path == "/scratch")
        );
    }
    for (spec, field) in [
        (
            json!({"pod": {"template": {"spec": {"containers": [{"name": "clickhouse", "image": "x"}]}}}}),
            "spec.pod.template.spec.containers[clickhouse].image",
        ),
        (
            json!({"keeper": {"replicas": 3, "pod": {"template": {"spec": {"volumes": [{"name": "config", "emptyDir": {}}]}}}}}),
            "spec.keeper.pod.template.spec.volumes[config]",
        ),
    ] {
        let c = cluster(spec);
        match desired(&Cluster::new(&c).unwrap(), &inputs(replicas(1, 1))) {
            Err(BuildError::PodTemplate { field: f, .. }) => assert_eq!(f, field),
            other => panic!("not refused: {:?}", other.map(|_| ())),
        }
    }
}

/// Decision 28: the replicas of one shard, and the Keeper members, are kept on different nodes:
/// preferred by default, required or not at all when the spec says so; the user's own affinity
/// terms stay.
#[test]
fn replicas_of_a_shard_and_keeper_members_are_kept_apart() {
    let anti = |t: &PodTemplateSpec| {
        serde_json::to_value(t.spec.as_ref().unwrap().affinity.as_ref())
            .unwrap()
            .get("podAntiAffinity")
            .cloned()
            .unwrap_or_default()
    };
    let c = cluster(json!({"shards": 2, "replicas": 2, "keeper": {"replicas": 3}}));
    let d = build(&c, &inputs(replicas(2, 2)));
    for (t, shard) in templates(&d).iter().zip([0, 0, 1, 1]) {
        assert_eq!(
            anti(t)["preferredDuringSchedulingIgnoredDuringExecution"],
            json!([{"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {"clickhouse.com/cluster": "c1",
                    "app.kubernetes.io/component": "server", "clickhouse.com/shard": shard.to_string()}}}}])
        );
    }
    let keeper = &d.keeper.as_ref().unwrap().statefulset.spec;
    assert_eq!(
        anti(&keeper.template)["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
            ["labelSelector"]["matchLabels"],
        json!({"clickhouse.com/cluster": "c1", "app.kubernetes.io/component": "keeper"})
    );
    let c = cluster(
        json!({"shards": 1, "replicas": 2, "pod": {"antiAffinity": "Required",
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": {"matchLabels": {"app": "x"}}}]}}},
        "keeper": {"replicas": 1, "pod": {"antiAffinity": "None"}}}),
    );
    let d = build(&c, &inputs(replicas(1, 2)));
    let required =
        anti(&templates(&d)[0])["requiredDuringSchedulingIgnoredDuringExecution"].clone();
    assert_eq!(required.as_array().unwrap().len(), 2, "{required}");
    assert_eq!(required[0]["topologyKey"], "topology.kubernetes.io/zone");
    assert_eq!(required[1]["topologyKey"], "kubernetes.io/hostname");
    let keeper = &d.keeper.as_ref().unwrap().statefulset.spec;
    assert!(keeper.template.spec.as_ref().unwrap().affinity.is_none());
}

/// docs/configuration.md ("Placement") and invariant 9: `topologySpreadKey` spreads each shard's
/// replicas over the topology (a constraint selecting the shard's pods) besides the whole
/// cluster's, so that with two zones no shard sits in one; a StatefulSet written before the shard
/// constraint existed (only the cluster-wide one, its hash taken without the other) is not rolled
/// for it, while a real change still rolls and then writes both. Keeper members get the one spread
/// only.
#[test]
fn each_shard_is_spread_over_the_topology_and_an_older_template_is_not_rolled_for_it() {
    use crate::model::changes::pod_template_changed;
    let zone = "topology.kubernetes.io/zone";
    let c = cluster(json!({"shards": 2, "replicas": 2,
        "pod": {"topologySpreadKey": zone}, "keeper": {"replicas": 3,
            "pod": {"topologySpreadKey": zone}}}));
    let d = build(&c, &inputs(replicas(2, 2)));
    for sts in &d.server_statefulsets {
        let shard = sts
            .spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .as_ref()
            .unwrap()[labels::SHARD]
            .clone();
        let spread = sts
            .spec
            .template
            .spec
            .as_ref()
            .unwrap()
            .topology_spread_constraints
            .clone()
            .unwrap();
        // one spread per topology key (the API server refuses two with the same key and
        // `whenUnsatisfiable`): the shard's own
        assert_eq!(spread.len(), 1, "{spread:?}");
        assert_eq!(spread[0].topology_key, zone);
        assert_eq!(spread[0].max_skew, 1);
        let selector = spread[0]
            .label_selector
            .clone()
            .unwrap()
            .match_labels
            .unwrap();
        assert_eq!(selector.get(labels::SHARD), Some(&shard), "the shard's own");
        assert_eq!(selector[labels::CLUSTER], "c1");

        // a template written when the key spread the cluster's servers instead
        let desired = serde_json::to_value(sts).unwrap();
        let mut older = desired.clone();
        older["spec"]["template"]["spec"]["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"] =
            serde_json::to_value(labels::spread_selector("c1")).unwrap();
        older["metadata"]["annotations"][labels::TEMPLATE_HASH] =
            serde_json::Value::String(template_hash(&older["spec"]["template"]));
        assert!(
            !pod_template_changed(&older, &desired),
            "{} would restart on an operator upgrade",
            sts.metadata.name.as_deref().unwrap()
        );
        assert_a_real_change_rolls(&older, &desired);
    }
    let keeper = d.keeper.as_ref().unwrap();
    let spread = keeper
        .statefulset
        .spec
        .template
        .spec
        .as_ref()
        .unwrap()
        .topology_spread_constraints
        .clone()
        .unwrap();
    assert_eq!(spread.len(), 1);
}

/// Decision 56: under `troubleshoot` the server container runs the image's entrypoint under a
/// shell that stays up when it stops, without liveness and startup probes, readiness kept;
/// without it, no command (the image's entrypoint) and every probe.
#[test]
fn troubleshooting_keeps_the_server_container_up_without_liveness_and_startup_probes() {
    let main = |spec: serde_json::Value| {
        let d = build(&cluster(spec), &inputs(replicas(1, 1)));
        let pod = d.server_statefulsets[0].spec.template.spec.clone().unwrap();
        pod.containers[0].clone()
    };
    let on = main(json!({"troubleshoot": true}));
    let command = on.command.clone().unwrap();
    assert_eq!(command[..2], ["/bin/bash", "-c"]);
    assert!(
        command[2].contains("/entrypoint.sh & server=$!"),
        "{command:?}"
    );
    assert!(command[2].contains("sleep infinity"), "{command:?}");
    assert!(command[2].starts_with("trap "), "{command:?}");
    assert!(on.liveness_probe.is_none() && on.startup_probe.is_none());
    assert!(on.readiness_probe.is_some());
    let off = main(json!({}));
    assert!(off.command.is_none());
    assert!(off.liveness_probe.is_some() && off.startup_probe.is_some());
}
