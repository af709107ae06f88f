//! Keeper: its members and budget, the four-letter words it answers, an external Keeper, its
//! coordination settings and the Keeper client's settings of the servers.

use super::*;

/// Keeper: one StatefulSet, raft ids ordinal + 1 with every member's DNS name, a budget that
/// keeps a majority (n=1 gives 0), the id computed from the hostname.
#[test]
fn keeper_lists_every_member_and_its_budget_keeps_quorum() {
    for (n, max) in [(1, 0), (3, 1), (5, 2), (7, 3)] {
        let c = cluster(json!({"keeper": {"replicas": n}}));
        let d = build(&c, &inputs(replicas(1, 2)));
        let k = d.keeper.unwrap();
        assert_eq!(k.statefulset.spec.replicas, Some(n));
        assert_eq!(
            k.statefulset.spec.pod_management_policy.as_deref(),
            Some("Parallel")
        );
        let pdb = k.pdb.spec.unwrap().max_unavailable.unwrap();
        assert_eq!(
            pdb,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(max),
            "n={n}"
        );
        let xml = &k.config.data.as_ref().unwrap()[names::KEEPER_CONFIG_FILE];
        let doc = parse(xml);
        let servers: Vec<(String, String, String)> = doc
            .descendants()
            .filter(|x| x.has_tag_name("server"))
            .map(|s| {
                let t = |tag| {
                    s.children()
                        .find(|x| x.has_tag_name(tag))
                        .unwrap()
                        .text()
                        .unwrap()
                        .to_string()
                };
                (t("id"), t("hostname"), t("port"))
            })
            .collect();
        let want: Vec<_> = (0..n)
            .map(|i| {
                (
                    (i + 1).to_string(),
                    format!("c1-keeper-{i}.c1-keeper-headless.t1.svc.cluster.local"),
                    "9234".to_string(),
                )
            })
            .collect();
        assert_eq!(servers, want);
        let id = doc
            .descendants()
            .find(|x| x.has_tag_name("server_id"))
            .unwrap();
        assert_eq!(id.attribute("from_env"), Some("KEEPER_SERVER_ID"));
        let container = &k
            .statefulset
            .spec
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0];
        assert_eq!(
            container.command.clone().unwrap(),
            [
                "/bin/bash",
                "-c",
                "h=${HOSTNAME%%.*}; export KEEPER_SERVER_ID=$(( ${h##*-} + 1 )); exec /entrypoint.sh"
            ]
        );
        // decision 42: the image's entrypoint creates its folders on the data volume
        let data_dir = container
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "CLICKHOUSE_DATA_DIR")
            .and_then(|e| e.value.clone());
        assert_eq!(data_dir.as_deref(), Some(names::KEEPER_DATA_PATH));
        let mounts: Vec<_> = container
            .volume_mounts
            .clone()
            .unwrap()
            .into_iter()
            .map(|m| m.mount_path)
            .collect();
        assert!(mounts.contains(&"/etc/clickhouse-keeper".to_string()));
        assert!(mounts.contains(&"/var/lib/clickhouse-keeper".to_string()));
        let headless = k.headless_service.spec.unwrap();
        assert_eq!(headless.publish_not_ready_addresses, Some(true));
        assert_eq!(k.client_service.metadata.name.as_deref(), Some("c1-keeper"));
    }
    let c = cluster(json!({"replicas": 1, "keeper": {"replicas": 0}}));
    let d = build(&c, &inputs(replicas(1, 1)));
    assert!(d.keeper.is_none());
    assert!(!common_file(&d, RUNTIME_FILE).contains("<zookeeper"));
}

/// Decision 27 and invariant 9: Keeper members answer only the four-letter words the probe and the
/// exporter use; the list is in the configuration but not in the pod template's hash, so an
/// ensemble an older operator created is not restarted for it.
#[test]
fn keeper_answers_few_four_letter_words_without_a_restart_for_them() {
    use crate::model::config::keeper::{FOUR_LETTER_WORDS, keeper_file, keeper_restart_part};
    let c = cluster(json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 3}}));
    let d = build(&c, &inputs(replicas(1, 1)));
    let k = d.keeper.as_ref().unwrap();
    let file = &k.config.data.as_ref().unwrap()[names::KEEPER_CONFIG_FILE];
    let doc = parse(file);
    let words = doc
        .descendants()
        .find(|n| n.has_tag_name("four_letter_word_white_list"))
        .and_then(|n| n.text());
    assert_eq!(words, Some(FOUR_LETTER_WORDS));
    assert_eq!(FOUR_LETTER_WORDS, "ruok,srvr,mntr");
    let model = Cluster::new(&c).unwrap();
    assert!(keeper_file(&model, 3).contains("four_letter_word_white_list"));
    assert!(!keeper_restart_part(&model).contains("four_letter_word_white_list"));
    // the readiness probe asks `srvr`, which is on the list
    let probe = serde_json::to_string(&k.statefulset.spec.template).unwrap();
    assert!(probe.contains("printf srvr"), "{probe}");
}

/// Decision 28: an external Keeper: the servers list its nodes (or the referenced cluster's Keeper
/// Service) under the cluster's root, keep their Keeper identity, carry the labels the other
/// cluster's Keeper NetworkPolicy admits, and the cluster has no Keeper objects of its own.
#[test]
fn an_external_keeper_is_listed_under_the_clusters_root() {
    let c = cluster(
        json!({"replicas": 2, "keeper": {"replicas": 0, "external": {
        "nodes": [{"host": "zk-0.zk", "port": 2181}, {"host": "10.0.0.7"}], "root": "/ch/prod"}}}),
    );
    let d = build(&c, &inputs(replicas(1, 2)));
    assert!(d.keeper.is_none());
    let runtime = common_file(&d, RUNTIME_FILE);
    let doc = parse(runtime);
    let zk = doc
        .descendants()
        .find(|n| n.has_tag_name("zookeeper"))
        .unwrap();
    let hosts: Vec<&str> = zk
        .descendants()
        .filter(|n| n.has_tag_name("host"))
        .filter_map(|n| n.text())
        .collect();
    assert_eq!(hosts, ["zk-0.zk", "10.0.0.7"]);
    let root = zk.children().find(|n| n.has_tag_name("root")).unwrap();
    assert_eq!(root.text(), Some("/ch/prod"));
    let identity = d.users_secret.data.as_ref().unwrap()[names::KEEPER_IDENTITY_FILE]
        .0
        .clone();
    assert!(String::from_utf8(identity).unwrap().contains("<identity "));

    let c = cluster(
        json!({"replicas": 2, "keeper": {"replicas": 0, "external": {
        "clusterRef": {"name": "shared", "namespace": "infra"}}}}),
    );
    let d = build(&c, &inputs(replicas(1, 2)));
    let runtime = common_file(&d, RUNTIME_FILE);
    assert!(
        runtime.contains("<host>shared-keeper.infra.svc.cluster.local</host>"),
        "{runtime}"
    );
    assert!(runtime.contains("<port>9181</port>"), "{runtime}");
    assert!(
        runtime.contains("<root>/clickhouse-operator/t1/c1</root>"),
        "{runtime}"
    );
    let t = &templates(&d)[0];
    let l = t.metadata.as_ref().unwrap().labels.as_ref().unwrap();
    assert_eq!(l[labels::KEEPER_OF_CLUSTER], "shared");
    assert_eq!(l[labels::KEEPER_OF_NAMESPACE], "infra");
}

/// docs/changes.md: Keeper's coordination settings from the spec replace the operator's defaults
/// where they name them and add to them otherwise; without any, the file is as before (so running
/// ensembles keep their hash); a change restarts the members, not the servers.
#[test]
fn keeper_coordination_settings_come_from_the_spec() {
    let coordination = |d: &Desired| -> Vec<(String, String)> {
        let file = d.keeper.as_ref().unwrap().config.data.clone().unwrap()
            [names::KEEPER_CONFIG_FILE]
            .clone();
        let doc = parse(&file);
        doc.descendants()
            .find(|n| n.has_tag_name("coordination_settings"))
            .unwrap()
            .children()
            .filter(|n| n.is_element())
            .map(|n| {
                (
                    n.tag_name().name().to_string(),
                    n.text().unwrap_or_default().to_string(),
                )
            })
            .collect()
    };
    let plain = cluster(json!({"keeper": {"replicas": 3}}));
    let d = build(&plain, &inputs(replicas(1, 1)));
    assert_eq!(
        coordination(&d),
        [
            ("operation_timeout_ms".to_string(), "10000".to_string()),
            ("session_timeout_ms".into(), "30000".into()),
            ("raft_logs_level".into(), "warning".into()),
            // decision 42: half the 60 s startup probe budget
            ("startup_timeout".into(), "30000".into()),
        ]
    );
    let tuned = cluster(json!({"keeper": {"replicas": 3, "settings": {
        "session_timeout_ms": "60000", "snapshot_distance": "50000"}}}));
    let t = build(&tuned, &inputs(replicas(1, 1)));
    let settings = coordination(&t);
    assert_eq!(
        settings,
        [
            ("operation_timeout_ms".to_string(), "10000".to_string()),
            ("session_timeout_ms".into(), "60000".into()),
            ("raft_logs_level".into(), "warning".into()),
            ("snapshot_distance".into(), "50000".into()),
            ("startup_timeout".into(), "30000".into()),
        ]
    );
    let keeper_template =
        |d: &Desired| d.keeper.as_ref().unwrap().statefulset.spec.template.clone();
    assert_ne!(
        keeper_template(&d),
        keeper_template(&t),
        "the members restart"
    );
    assert_eq!(templates(&d), templates(&t), "the servers do not");
}

/// The Keeper client's own settings (`zookeeper/session_timeout_ms`, …), which are the user's
/// (docs/reference/api.md), go inside the operator's `zookeeper` element, after the members, in the
/// file the servers reload (one element: ClickHouse would not merge two of the same name in one
/// file), with an own and an external Keeper alike; no other file has them.
#[test]
fn keeper_client_settings_join_the_operators_zookeeper_element() {
    for keeper in [
        json!({"replicas": 3}),
        json!({"replicas": 0, "external": {"nodes": [{"host": "zk-0", "port": 2181}], "root": "/ch"}}),
    ] {
        let c = cluster(
            json!({"replicas": 2, "keeper": keeper, "configuration": {"settings": {
            "zookeeper/session_timeout_ms": "15000",
            "zookeeper/operation_timeout_ms": "5000",
            "max_concurrent_queries": "100"}}}),
        );
        let d = build(&c, &inputs(replicas(1, 2)));
        let runtime = common_file(&d, RUNTIME_FILE);
        let doc = parse(runtime);
        let zk: Vec<_> = doc
            .root_element()
            .children()
            .filter(|n| n.has_tag_name("zookeeper"))
            .collect();
        assert_eq!(zk.len(), 1, "{runtime}");
        let text = |name: &str| {
            zk[0]
                .children()
                .find(|n| n.has_tag_name(name))
                .and_then(|n| n.text())
                .map(str::to_string)
        };
        assert_eq!(text("session_timeout_ms").as_deref(), Some("15000"));
        assert_eq!(text("operation_timeout_ms").as_deref(), Some("5000"));
        assert!(
            zk[0].children().any(|n| n.has_tag_name("node")),
            "{runtime}"
        );
        assert!(!common_file(&d, SETTINGS_FILE).contains("zookeeper"));
    }
}
