//! The generated configuration files: `remote_servers`, the default profile, the per-replica
//! file, the servers' own endpoint, the cluster domain, shard, replica and `users.d` files,
//! logging and shard weights.

use super::*;

/// remote_servers lists every replica of every shard, by DNS name, in shard order.
#[test]
fn remote_servers_lists_every_replica_of_every_shard() {
    let c = cluster(json!({"shards": 3, "replicas": 2}));
    let d = build(&c, &inputs(replicas(3, 2)));
    let xml = remote_file(&d);
    let doc = parse(&xml);
    let cluster = doc
        .descendants()
        .find(|n| n.has_tag_name("remote_servers"))
        .unwrap()
        .children()
        .find(|n| n.has_tag_name("c1"))
        .unwrap();
    let shards: Vec<Vec<String>> = cluster
        .children()
        .filter(|n| n.has_tag_name("shard"))
        .map(|s| {
            s.descendants()
                .filter(|n| n.has_tag_name("host"))
                .map(|h| h.text().unwrap().to_string())
                .collect()
        })
        .collect();
    assert_eq!(shards.len(), 3);
    for (s, hosts) in shards.iter().enumerate() {
        let want: Vec<_> = replicas(3, 2)
            .into_iter()
            .filter(|r| r.shard == ShardIndex(s as i32))
            .map(|r| format!("{}-0.c1-headless.t1.svc.cluster.local", r.name))
            .collect();
        assert_eq!(hosts, &want);
    }
    // Servers reach each other as the cluster's own account, or as the operator's in a
    // cluster created before that account existed.
    assert!(xml.contains("<user>clickhouse_cluster</user>"), "{xml}");
    assert!(!xml.contains("clickhouse_operator"), "{xml}");
    let mut older = inputs(replicas(3, 2));
    older.cluster_password = None;
    let old = remote_file(&build(&c, &older));
    assert!(old.contains("<user>clickhouse_operator</user>"), "{old}");
    // Keeper nodes are listed in the runtime file.
    let runtime = parse(common_file(&d, RUNTIME_FILE));
    let nodes = runtime
        .descendants()
        .filter(|n| n.has_tag_name("node"))
        .count();
    assert_eq!(nodes, 3);
}

/// Decision 41 (a roll restarts each server promptly): the default profile, the servers' global
/// settings, has `poll_interval` 1 s, so an idle connection to a stopping server (a peer's
/// Distributed pool, a client's pool) holds it for about a second, not ClickHouse's 10 s; the
/// user's own value and the user's other settings of that profile stay, other profiles get
/// nothing. The users file is reloaded at runtime: no pod template changes with it.
#[test]
fn the_default_profile_checks_for_shutdown_every_second_unless_the_user_says_otherwise() {
    let poll = |xml: &str, profile: &str| -> Option<String> {
        let doc = parse(xml);
        let profiles = doc
            .descendants()
            .find(|n| n.has_tag_name("profiles"))
            .expect("profiles");
        let p = profiles.children().find(|n| n.has_tag_name(profile))?;
        p.children()
            .find(|n| n.has_tag_name("poll_interval"))
            .and_then(|n| n.text())
            .map(str::to_string)
    };
    let plain = build(&cluster(json!({})), &inputs(replicas(1, 1)));
    assert_eq!(poll(&users_file(&plain), "default").as_deref(), Some("1"));
    let with_others = cluster(json!({"configuration": {"profiles": {
        "default": {"max_memory_usage": "1000"}, "ro": {"readonly": "1"}}}}));
    let d = build(&with_others, &inputs(replicas(1, 1)));
    let users = users_file(&d);
    assert_eq!(poll(&users, "default").as_deref(), Some("1"));
    assert!(
        users.contains("<max_memory_usage>1000</max_memory_usage>"),
        "{users}"
    );
    assert_eq!(poll(&users, "ro"), None, "{users}");
    let own = cluster(json!({"configuration": {"profiles": {"default": {"poll_interval": "10"}}}}));
    let own = build(&own, &inputs(replicas(1, 1)));
    let users = users_file(&own);
    assert_eq!(poll(&users, "default").as_deref(), Some("10"));
    assert_eq!(users.matches("<poll_interval>").count(), 1, "{users}");
    assert_eq!(
        templates(&own),
        templates(&plain),
        "poll_interval restarts no pod"
    );
}

/// Every generated XML file parses, with and without TLS, settings, profiles and Keeper.
#[test]
fn every_generated_xml_parses() {
    for spec in [
        json!({}),
        json!({"replicas": 1, "keeper": {"replicas": 0}}),
        json!({"tls": {"enabled": true, "required": true, "serverCertSecret": "t", "caSecret": "ca"},
               "configuration": {"settings": {"logger/level": "debug", "a/b/c": "x & <y>"},
                                 "profiles": {"ro": {"readonly": "1"}},
                                 "quotas": {"q": {"duration": "60"}}},
               "users": {"secretName": "u", "profile": "ro"}}),
    ] {
        let c = cluster(spec);
        let d = build(&c, &inputs(replicas(2, 2)));
        for (name, xml) in d.common_config.data.as_ref().unwrap() {
            let doc = parse(xml);
            assert_eq!(doc.root_element().tag_name().name(), "clickhouse", "{name}");
        }
        for cm in &d.replica_configs {
            parse(&cm.data.as_ref().unwrap()[REPLICA_FILE]);
        }
        parse(&users_file(&d));
        if let Some(k) = &d.keeper {
            parse(&k.config.data.as_ref().unwrap()[names::KEEPER_CONFIG_FILE]);
        }
    }
}

/// The per-replica file has the macros and the replica's own DNS name as interserver host.
#[test]
fn replica_config_has_macros_and_interserver_host() {
    let c = cluster(json!({"shards": 2}));
    let d = build(&c, &inputs(replicas(2, 2)));
    let cm = &d.replica_configs[3];
    assert_eq!(cm.metadata.name.as_deref(), Some("c1-1-3"));
    let xml = &cm.data.as_ref().unwrap()[REPLICA_FILE];
    let doc = parse(xml);
    let text = |tag: &str| {
        doc.descendants()
            .find(|n| n.has_tag_name(tag))
            .and_then(|n| n.text())
            .unwrap()
            .to_string()
    };
    assert_eq!(text("cluster"), "c1");
    assert_eq!(text("shard"), "1");
    assert_eq!(text("replica"), "c1-1-3");
    assert_eq!(
        text("interserver_http_host"),
        "c1-1-3-0.c1-headless.t1.svc.cluster.local"
    );
}

/// docs/monitoring.md, "The servers' own endpoint": the servers' own Prometheus endpoint is off by
/// default (nothing generated, so no existing pod template changes); on, the server file has the
/// `prometheus` section on its port and every server container declares that port as `prometheus`,
/// and the change restarts.
#[test]
fn the_servers_own_prometheus_endpoint_is_generated_only_when_asked() {
    let off = cluster(serde_json::json!({"shards": 1, "replicas": 2}));
    let on = cluster(
        serde_json::json!({"shards": 1, "replicas": 2, "serverMetrics": {"enabled": true}}),
    );
    let i = inputs(replicas(1, 2));
    let (d_off, d_on) = (build(&off, &i), build(&on, &i));
    assert!(!common_file(&d_off, SERVER_FILE).contains("<prometheus>"));
    let doc = parse(common_file(&d_on, SERVER_FILE));
    let p = doc
        .descendants()
        .find(|n| n.has_tag_name("prometheus"))
        .expect("a prometheus section");
    let leaf = |name: &str| {
        p.children()
            .find(|n| n.has_tag_name(name))
            .and_then(|n| n.text())
            .map(str::to_string)
    };
    assert_eq!(leaf("port").as_deref(), Some("9363"));
    assert_eq!(leaf("endpoint").as_deref(), Some("/metrics"));
    for t in templates(&d_on) {
        let ports = t.spec.as_ref().unwrap().containers[0]
            .ports
            .clone()
            .unwrap();
        assert!(
            ports
                .iter()
                .any(|p| p.name.as_deref() == Some("prometheus") && p.container_port == 9363),
            "{ports:?}"
        );
    }
    for t in templates(&d_off) {
        let ports = t.spec.as_ref().unwrap().containers[0]
            .ports
            .clone()
            .unwrap();
        assert!(
            ports
                .iter()
                .all(|p| p.name.as_deref() != Some("prometheus"))
        );
    }
    let ch = crate::model::changes::classify(&off.spec, &on.spec);
    assert!(ch.server.needs(crate::model::changes::Need::RollingRestart));
}

/// Decision 28: `spec.clusterDomain` names every host the servers and Keeper know each other by
/// (`remote_servers`, the Keeper nodes, the interserver host, Keeper's raft members).
#[test]
fn the_cluster_domain_names_every_host() {
    let c = cluster(json!({"clusterDomain": "corp.example", "keeper": {"replicas": 3}}));
    let d = build(&c, &inputs(replicas(1, 2)));
    let mut texts = vec![remote_file(&d), common_file(&d, RUNTIME_FILE).to_string()];
    texts.extend(
        d.replica_configs
            .iter()
            .flat_map(|m| m.data.clone().unwrap().into_values()),
    );
    texts.extend(
        d.keeper
            .as_ref()
            .unwrap()
            .config
            .data
            .clone()
            .unwrap()
            .into_values(),
    );
    let all = texts.join("\n");
    assert!(!all.contains("cluster.local"), "{all}");
    assert!(
        all.contains("c1-0-0-0.c1-headless.t1.svc.corp.example"),
        "{all}"
    );
    assert!(
        all.contains("c1-keeper-2.c1-keeper-headless.t1.svc.corp.example"),
        "{all}"
    );
}

/// docs/changes.md: a shard's own configuration files reach that shard's replicas only (their
/// ConfigMaps, projected into `config.d`), and a change restarts only them: the other shard's
/// pod templates are those of a cluster without shard files.
#[test]
fn shard_files_reach_that_shards_replicas_only() {
    let plain = build(
        &cluster(json!({"shards": 2, "replicas": 2})),
        &inputs(replicas(2, 2)),
    );
    let with = build(
        &cluster(
            json!({"shards": 2, "replicas": 2, "configuration": {"shardFiles": {
            "1": {"disks.xml": "<clickhouse><x>1</x></clickhouse>"}}}}),
        ),
        &inputs(replicas(2, 2)),
    );
    for (cm, shard) in with.replica_configs.iter().zip([0, 0, 1, 1]) {
        let data = cm.data.as_ref().unwrap();
        assert_eq!(
            data.contains_key("disks.xml"),
            shard == 1,
            "{:?}",
            cm.metadata.name
        );
        assert!(data.contains_key(REPLICA_FILE));
    }
    let (a, b) = (templates(&plain), templates(&with));
    assert_eq!(a[0], b[0]);
    assert_eq!(a[1], b[1]);
    assert_ne!(a[2], b[2]);
    assert_ne!(a[3], b[3]);
    assert!(annotation(&b[2], labels::SHARD_FILES_HASH).is_some());
}

/// docs/changes.md: a replica's own configuration files (`configuration.replicaFiles`, keyed by the
/// replica's name) reach that replica only (its ConfigMap, projected into `config.d`), and a
/// change restarts only it: every other pod template is that of a cluster without them.
#[test]
fn replica_files_reach_that_replica_only() {
    let plain = build(
        &cluster(json!({"shards": 2, "replicas": 2})),
        &inputs(replicas(2, 2)),
    );
    let with = build(
        &cluster(
            json!({"shards": 2, "replicas": 2, "configuration": {"replicaFiles": {
            "c1-1-3": {"pinned.xml": "<clickhouse><x>1</x></clickhouse>"},
            "c1-9-99": {"gone.xml": "<clickhouse/>"}}}}),
        ),
        &inputs(replicas(2, 2)),
    );
    let names: Vec<String> = with
        .replica_configs
        .iter()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["c1-0-0", "c1-0-1", "c1-1-2", "c1-1-3"]);
    for cm in &with.replica_configs {
        let data = cm.data.as_ref().unwrap();
        let mine = cm.metadata.name.as_deref() == Some("c1-1-3");
        assert_eq!(
            data.contains_key("pinned.xml"),
            mine,
            "{:?}",
            cm.metadata.name
        );
        assert!(!data.contains_key("gone.xml"));
    }
    let (a, b) = (templates(&plain), templates(&with));
    assert_eq!(a[..3], b[..3]);
    assert_ne!(a[3], b[3]);
    assert!(annotation(&b[3], labels::REPLICA_FILES_HASH).is_some());
}

/// docs/changes.md: a `users.d/` file of `configuration.files` is kept in `<cluster>-users` and
/// projected into `users.d` (not in any ConfigMap, as it may hold passwords); the operator's
/// own names stay reserved there too.
#[test]
fn users_d_files_go_to_users_d_through_the_users_secret() {
    let content =
        "<clickhouse><profiles><bi><max_threads>2</max_threads></bi></profiles></clickhouse>";
    let c = cluster(
        json!({"configuration": {"files": {"users.d/bi.xml": content, "a.xml": "<clickhouse/>"}}}),
    );
    let d = build(&c, &inputs(replicas(1, 1)));
    let data = d.users_secret.data.as_ref().unwrap();
    assert_eq!(data[&names::users_d_key("bi.xml")].0, content.as_bytes());
    let common = d.common_config.data.as_ref().unwrap();
    assert!(common.contains_key("a.xml"));
    assert!(
        !common.keys().any(|k| k.contains("bi.xml")),
        "{:?}",
        common.keys()
    );
    let t = serde_json::to_value(&templates(&d)[0]).unwrap();
    let users_d = t["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "users-d")
        .unwrap();
    let items: Vec<(String, String)> = users_d["projected"]["sources"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["secret"]["items"].as_array().cloned().unwrap_or_default())
        .map(|i| {
            (
                i["key"].as_str().unwrap().to_string(),
                i["path"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        items.contains(&("users-d.bi.xml".to_string(), "bi.xml".to_string())),
        "{items:?}"
    );
    let c = cluster(
        json!({"configuration": {"files": {"users.d/00-operator-users.xml": "<clickhouse/>"}}}),
    );
    assert!(matches!(
        desired(&Cluster::new(&c).unwrap(), &inputs(replicas(1, 1))),
        Err(BuildError::ReservedFile(_))
    ));
}

/// `spec.logging`: unset, the logger the operator always wrote (no restart for any running
/// cluster); set, its size, count and JSON format in the startup file and its level in the
/// file the servers reload; files off write empty paths (ClickHouse writes no file then).
#[test]
fn logging_writes_the_logger_with_its_level_in_the_reloaded_file() {
    let i = inputs(replicas(1, 1));
    let plain = build(&cluster(json!({})), &i);
    let server = common_file(&plain, SERVER_FILE);
    assert!(
        server.contains(
            "    <logger>\n        <level>information</level>\n        \
             <log>/var/log/clickhouse-server/clickhouse-server.log</log>\n        \
             <errorlog>/var/log/clickhouse-server/clickhouse-server.err.log</errorlog>\n        \
             <size>100M</size>\n        <count>3</count>\n        <console>1</console>\n    \
             </logger>"
        ),
        "{server}"
    );
    let set = build(
        &cluster(
            json!({"logging": {"level": "debug", "format": "Json", "size": "500M",
            "count": 10, "files": false}}),
        ),
        &i,
    );
    let server = common_file(&set, SERVER_FILE);
    for want in [
        "<log></log>",
        "<errorlog></errorlog>",
        "<size>500M</size>",
        "<count>10</count>",
        "<formatting>\n            <type>json</type>\n        </formatting>",
    ] {
        assert!(server.contains(want), "{want}: {server}");
    }
    let runtime = common_file(&set, RUNTIME_FILE);
    assert!(
        runtime.contains("<logger>\n        <level>debug</level>\n    </logger>"),
        "{runtime}"
    );
    // only the level: the startup file is as without spec.logging
    let level = build(&cluster(json!({"logging": {"level": "trace"}})), &i);
    assert_eq!(
        common_file(&level, SERVER_FILE),
        common_file(&plain, SERVER_FILE)
    );
}

/// `spec.shardWeights`: the named shard's `<weight>` in `remote_servers`; a shard not named
/// gets none (ClickHouse's default 1), so the file of a cluster without weights is unchanged.
#[test]
fn shard_weights_are_written_into_remote_servers() {
    let i = inputs(replicas(2, 1));
    let plain = remote_file(&build(&cluster(json!({"shards": 2})), &i));
    assert!(!plain.contains("<weight>"), "{plain}");
    let weighted = remote_file(&build(
        &cluster(json!({"shards": 2, "shardWeights": {"1": 3}})),
        &i,
    ));
    let shards: Vec<&str> = weighted.split("<shard>").skip(1).collect();
    assert_eq!(shards.len(), 2, "{weighted}");
    assert!(!shards[0].contains("<weight>"), "{weighted}");
    assert!(
        shards[1].trim_start().starts_with("<weight>3</weight>"),
        "{weighted}"
    );
    assert_eq!(
        weighted
            .replace("<weight>3</weight>", "")
            .replace(" ", "")
            .replace("\n", ""),
        plain.replace(" ", "").replace("\n", "")
    );
}
