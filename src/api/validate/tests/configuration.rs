//! The configuration: settings and files (plain, from Secrets, per shard and per replica),
//! disks and storage policies, what the operator owns, logging, system logs, the metrics port.

use super::*;

/// Decision 34: settings and files from Secret keys follow the rules of `settings` and
/// `files`, name valid Secrets and keys that are not the operator's own, overlap nothing
/// else, and the environment variables they use are the operator's.
#[test]
fn secret_settings_and_files_are_checked_like_their_plain_kin() {
    let with = |configuration: serde_json::Value, pod: serde_json::Value| {
        let s: ClickHouseClusterSpec =
            serde_json::from_value(serde_json::json!({"configuration": configuration, "pod": pod}))
                .unwrap();
        validate("c1", &s).0
    };
    let key = serde_json::json!({"name": "s3", "key": "secret"});
    let ok = with(
        serde_json::json!({"secretSettings": {"storage_configuration/disks/s3/secret_access_key": key},
            "secretFiles": {"s3.xml": key, "users.d/bi.xml": key}}),
        serde_json::json!({}),
    );
    assert!(ok.is_empty(), "{ok:?}");
    for (configuration, pod, field, words) in [
        (
            serde_json::json!({"secretSettings": {"tcp_port": key}}),
            serde_json::json!({}),
            "spec.configuration.secretSettings.tcp_port",
            "set by the operator",
        ),
        (
            serde_json::json!({"secretSettings": {"a//b": key}}),
            serde_json::json!({}),
            "spec.configuration.secretSettings",
            "element path",
        ),
        (
            serde_json::json!({"secretSettings": {"logger": key}, "settings": {"logger/level": "debug"}}),
            serde_json::json!({}),
            "spec.configuration.secretSettings.logger",
            "also set",
        ),
        (
            serde_json::json!({"secretFiles": {"../x.xml": key}}),
            serde_json::json!({}),
            "spec.configuration.secretFiles",
            "plain file name",
        ),
        (
            serde_json::json!({"secretFiles": {"00-operator-users.xml": key}}),
            serde_json::json!({}),
            "spec.configuration.secretFiles",
            "reserved",
        ),
        (
            serde_json::json!({"secretFiles": {"a.xml": key}, "files": {"a.xml": "<clickhouse/>"}}),
            serde_json::json!({}),
            "spec.configuration.secretFiles",
            "hide",
        ),
        (
            serde_json::json!({"secretFiles": {"a.xml": {"name": "c1-operator", "key": "password"}}}),
            serde_json::json!({}),
            "spec.configuration.secretFiles",
            "generates",
        ),
        (
            serde_json::json!({"secretSettings": {"timezone": {"name": "Bad_Name", "key": "k"}}}),
            serde_json::json!({}),
            "spec.configuration.secretSettings",
            "not a valid Secret name",
        ),
        (
            serde_json::json!({"secretSettings": {"timezone": {"name": "s", "key": "../k"}}}),
            serde_json::json!({}),
            "spec.configuration.secretSettings",
            "not a valid Secret key",
        ),
        (
            serde_json::json!({}),
            serde_json::json!({"env": [{"name": "CLICKHOUSE_SECRET_SETTING_0", "value": "x"}]}),
            "spec.pod.env",
            "reserved",
        ),
    ] {
        let errors = with(configuration.clone(), pod);
        assert_error(&errors, &configuration, field, words);
    }
}

/// S2-10: `replicaFiles` keys are replica names of this cluster and their files follow
/// the rules of `shardFiles`, without hiding a common or a shard file.
#[test]
fn replica_files_are_checked_with_the_field_named() {
    let of = |files: serde_json::Value| {
        let mut s = spec();
        s.configuration = serde_json::from_value(files).unwrap();
        validate("c1", &s).0
    };
    let good = of(serde_json::json!({"replicaFiles": {"c1-0-7": {"a.xml": "<clickhouse/>"}}}));
    assert!(good.is_empty(), "{good:?}");
    for (files, field, words) in [
        (
            serde_json::json!({"replicaFiles": {"c2-0-7": {"a.xml": ""}}}),
            "spec.configuration.replicaFiles[c2-0-7]",
            "not a replica name",
        ),
        (
            serde_json::json!({"replicaFiles": {"c1-0-x": {"a.xml": ""}}}),
            "spec.configuration.replicaFiles[c1-0-x]",
            "not a replica name",
        ),
        (
            serde_json::json!({"replicaFiles": {"c1-0-1": {"../a.xml": ""}}}),
            "spec.configuration.replicaFiles[c1-0-1]",
            "plain file name",
        ),
        (
            serde_json::json!({"replicaFiles": {"c1-0-1": {"00-operator-x.xml": ""}}}),
            "spec.configuration.replicaFiles[c1-0-1]",
            "reserved",
        ),
        (
            serde_json::json!({"files": {"a.xml": ""}, "replicaFiles": {"c1-0-1": {"a.xml": ""}}}),
            "spec.configuration.replicaFiles[c1-0-1]",
            "hide",
        ),
        (
            serde_json::json!({"shardFiles": {"0": {"b.xml": ""}}, "replicaFiles": {"c1-0-1": {"b.xml": ""}}}),
            "spec.configuration.replicaFiles[c1-0-1]",
            "hide",
        ),
    ] {
        assert_error(&of(files.clone()), &files, field, words);
    }
}

/// S2-10: disks, policies and the log volume are checked with the field named: disk
/// names (DNS-safe, not `default`, unique), sizes, a policy's volumes and their disks
/// (declared ones or `default`, each in one volume), the move factor, PVC labels.
#[test]
fn disks_and_storage_policies_are_checked_with_the_field_named() {
    let of = |storage: serde_json::Value| {
        let mut s = spec();
        s.storage = serde_json::from_value(storage).unwrap();
        validate("c1", &s).0
    };
    let good = of(serde_json::json!({
        "disks": [{"name": "cold", "size": "10Gi"}, {"name": "ssd-2", "size": "1Gi"}],
        "policies": {"tiered": {"moveFactor": 0.1, "volumes": [
            {"name": "hot", "disks": ["default", "ssd-2"], "maxDataPartSize": "1Gi"},
            {"name": "cold", "disks": ["cold"]}]}},
        "logs": {"size": "1Gi"}, "labels": {"team": "a"}}));
    assert!(good.is_empty(), "{good:?}");
    let cases = [
        (
            serde_json::json!({"disks": [{"name": "Cold", "size": "1Gi"}]}),
            "spec.storage.disks",
            "lower-case",
        ),
        (
            serde_json::json!({"disks": [{"name": "default", "size": "1Gi"}]}),
            "spec.storage.disks",
            "data volume",
        ),
        (
            serde_json::json!({"disks": [{"name": "a", "size": "1Gi"}, {"name": "a", "size": "1Gi"}]}),
            "spec.storage.disks",
            "twice",
        ),
        (
            serde_json::json!({"disks": [{"name": "a", "size": "lots"}]}),
            "spec.storage.disks[a].size",
            "quantity",
        ),
        (
            serde_json::json!({"logs": {"size": "0"}}),
            "spec.storage.logs.size",
            "larger than 0",
        ),
        (
            serde_json::json!({"policies": {"p": {"volumes": [{"name": "v", "disks": ["nope"]}]}}}),
            "spec.storage.policies.p.volumes[v].disks",
            "neither",
        ),
        (
            serde_json::json!({"disks": [{"name": "a", "size": "1Gi"}], "policies": {"p": {"volumes": [{"name": "v", "disks": ["a"]}, {"name": "w", "disks": ["a"]}]}}}),
            "spec.storage.policies.p.volumes[w].disks",
            "more than one volume",
        ),
        (
            serde_json::json!({"policies": {"p": {"volumes": []}}}),
            "spec.storage.policies.p",
            "at least one volume",
        ),
        (
            serde_json::json!({"policies": {"p": {"moveFactor": 1.5, "volumes": [{"name": "v", "disks": ["default"]}]}}}),
            "spec.storage.policies.p.moveFactor",
            "between 0 and 1",
        ),
        (
            serde_json::json!({"policies": {"p-1": {"volumes": [{"name": "v", "disks": ["default"]}]}}}),
            "spec.storage.policies",
            "letters, digits and '_'",
        ),
        (
            serde_json::json!({"policies": {"p": {"volumes": [{"name": "v", "disks": ["default"], "maxDataPartSize": "big"}]}}}),
            "spec.storage.policies.p.volumes[v].maxDataPartSize",
            "quantity",
        ),
        (
            serde_json::json!({"labels": {"bad key!": "x"}}),
            "spec.storage.labels",
            "not a valid label",
        ),
    ];
    for (storage, field, words) in cases {
        assert_error(&of(storage.clone()), &storage, field, words);
    }
}

/// SECURITY.md, "What the operator protects": the settings the operator writes itself are
/// refused with the field named, nested keys too; other keys, `logger/level` among them, are
/// accepted.
#[test]
fn settings_the_operator_owns_are_refused() {
    let mut s = spec();
    for key in [
        "tcp_port",
        "listen_host",
        "remote_servers/c1/shard",
        "zookeeper/node/host",
        "zookeeper/root",
        "zookeeper/identity",
        "zookeeper/implementation",
        "zookeeper",
        "macros/replica",
        "path",
        "logger/log",
    ] {
        s.configuration.settings = BTreeMap::from([(key.to_string(), "x".to_string())]);
        assert_eq!(
            fields("c1", &s),
            vec![format!("spec.configuration.settings.{key}")],
            "{key}"
        );
    }
    for key in [
        "max_concurrent_queries",
        "logger/level",
        "pathological",
        "merge_tree/parts_to_throw_insert",
        // the Keeper client's own settings are the user's (docs/reference/api.md)
        "zookeeper/session_timeout_ms",
        "zookeeper/operation_timeout_ms",
    ] {
        s.configuration.settings = BTreeMap::from([(key.to_string(), "1".to_string())]);
        assert!(fields("c1", &s).is_empty(), "{key}");
    }
    // … with a Keeper only, and not from a Secret (they would not reach the servers)
    s.configuration.settings =
        BTreeMap::from([("zookeeper/session_timeout_ms".to_string(), "1".to_string())]);
    s.keeper.replicas = 0;
    s.replicas = 1;
    assert_eq!(fields("c1", &s), ["spec.configuration.settings"]);
    let mut s = spec();
    s.configuration.secret_settings = BTreeMap::from([(
        "zookeeper/session_timeout_ms".to_string(),
        crate::api::SecretKeyRef {
            name: "s".into(),
            key: "k".into(),
        },
    )]);
    assert_eq!(
        fields("c1", &s),
        ["spec.configuration.secretSettings.zookeeper/session_timeout_ms"]
    );
}

/// `spec.logging`: its values are checked, and the settings it replaces are refused beside
/// it but still taken alone (the earlier way, kept working).
#[test]
fn logging_values_are_checked_and_the_settings_it_replaces_refused_beside_it() {
    let mut s = spec();
    s.logging = crate::api::LoggingSpec {
        level: Some("verbose".into()),
        format: Some(crate::api::LogFormat::Json),
        size: Some("1T".into()),
        count: Some(0),
        files: Some(false),
    };
    s.storage.logs = serde_json::from_value(serde_json::json!({"size": "1Gi"})).unwrap();
    s.configuration
        .settings
        .insert("logger/formatting/type".into(), "json".into());
    s.configuration
        .settings
        .insert("logger/level".into(), "debug".into());
    let (errors, _) = validate("c1", &s);
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.logging.level",
            "spec.logging.size",
            "spec.logging.count",
            "spec.logging.files",
            "spec.configuration.settings.logger/formatting/type",
            "spec.configuration.settings.logger/level",
        ]
    );
    s.logging = crate::api::LoggingSpec {
        level: Some("debug".into()),
        size: Some("500M".into()),
        count: Some(10),
        ..Default::default()
    };
    s.configuration.settings.remove("logger/level");
    assert!(
        validate("c1", &s).0.is_empty(),
        "{:?}",
        validate("c1", &s).0
    );
    // the settings alone, as before spec.logging existed
    s.logging = Default::default();
    s.configuration
        .settings
        .insert("logger/level".into(), "debug".into());
    assert!(validate("c1", &s).0.is_empty());
}

/// Decision 49: `spec.systemLogs` names only known tables (never a path), with at most
/// 36500 days, and a setting that would stop a server beside the operator's `ttl` is
/// refused.
#[test]
fn system_log_tables_and_days_are_checked_and_an_engine_beside_the_ttl_refused() {
    let mut s = spec();
    s.system_logs = Some(crate::api::SystemLogsSpec {
        ttl_days: 40000,
        tables: BTreeMap::from([
            ("../etc/passwd".to_string(), 3),
            ("text_log".to_string(), 50000),
            ("query_log".to_string(), 7),
        ]),
    });
    s.configuration
        .settings
        .insert("query_log/engine".into(), "ENGINE = Log".into());
    s.configuration.settings.insert(
        "opentelemetry_span_log/engine".into(),
        "ENGINE = Log".into(),
    );
    let (errors, _) = validate("c1", &s);
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.systemLogs.ttlDays",
            "spec.systemLogs.tables.../etc/passwd",
            "spec.systemLogs.tables.text_log",
            "spec.configuration.settings.query_log/engine",
        ]
    );
    // the table's own TTL off: its engine is the user's
    s.system_logs = Some(crate::api::SystemLogsSpec {
        ttl_days: 30,
        tables: BTreeMap::from([("query_log".to_string(), 0)]),
    });
    assert!(validate("c1", &s).0.is_empty());
    // unset, the default TTLs count
    s.system_logs = None;
    assert_eq!(validate("c1", &s).0.len(), 1);
}

/// S2-10: the servers' own metrics port must not be one the servers already use.
#[test]
fn the_server_metrics_port_must_be_free() {
    let mut s = spec();
    s.server_metrics.enabled = true;
    assert!(fields("c1", &s).is_empty());
    for port in [8123, 9009, 80] {
        s.server_metrics.port = port;
        assert_eq!(
            fields("c1", &s),
            vec!["spec.serverMetrics.port".to_string()],
            "{port}"
        );
    }
    s.server_metrics.enabled = false;
    assert!(
        fields("c1", &s).is_empty(),
        "a port of a switched-off endpoint is not checked"
    );
}

/// S2-10: shard files are named by a shard index, plain file names, not the operator's
/// and not also common files; Keeper settings are element names.
#[test]
fn shard_files_and_keeper_settings_are_checked() {
    let mut s = spec();
    let file = |name: &str| BTreeMap::from([(name.to_string(), "<clickhouse/>".to_string())]);
    s.configuration
        .shard_files
        .insert("0".into(), file("a.xml"));
    assert!(fields("c1", &s).is_empty());
    for (shard, name) in [
        ("x", "a.xml"),
        ("01", "a.xml"),
        ("0", "sub/a.xml"),
        ("0", "a.txt"),
        ("0", "00-operator-x.xml"),
    ] {
        s.configuration.shard_files = BTreeMap::from([(shard.to_string(), file(name))]);
        assert_eq!(
            fields("c1", &s),
            vec![format!("spec.configuration.shardFiles[{shard}]")],
            "{shard} {name}"
        );
    }
    s.configuration.shard_files = BTreeMap::from([("0".to_string(), file("a.xml"))]);
    s.configuration.files = file("a.xml");
    assert_eq!(
        fields("c1", &s),
        vec!["spec.configuration.shardFiles[0]".to_string()]
    );
    s.configuration.files.clear();
    s.keeper.settings.insert("bad name".into(), "1".into());
    assert_eq!(fields("c1", &s), vec!["spec.keeper.settings".to_string()]);
}
