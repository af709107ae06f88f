//! The pods: upgrades and their sources, images Keeper cannot run, reserved environment
//! variables, Keeper's startup timeout.

use super::*;

/// S2-24: `upgradeOptions` is off by default with the default schedule; when on, it needs
/// a known `apply`, a valid cron and exactly one version source.
#[test]
fn upgrade_options_are_checked() {
    let mut s = spec();
    assert_eq!(s.upgrade_options.apply, "Disabled");
    assert_eq!(s.upgrade_options.schedule, "0 4 * * *");
    assert!(fields("c1", &s).is_empty());
    s.upgrade_options.apply = "Recommended".into();
    assert_eq!(
        fields("c1", &s),
        vec!["spec.upgradeOptions.versionSource".to_string()]
    );
    s.upgrade_options.version_source = Some(VersionSource {
        url: Some("https://versions.example/clickhouse.json".into()),
        config_map: Some(ConfigMapKey {
            name: "v".into(),
            key: None,
        }),
        insecure: false,
    });
    assert_eq!(
        fields("c1", &s),
        vec!["spec.upgradeOptions.versionSource".to_string()]
    );
    s.upgrade_options
        .version_source
        .as_mut()
        .unwrap()
        .config_map = None;
    assert!(fields("c1", &s).is_empty());
    s.upgrade_options.version_source.as_mut().unwrap().url = Some("ftp://x".into());
    s.upgrade_options.schedule = "0 4 * *".into();
    assert_eq!(
        fields("c1", &s),
        vec![
            "spec.upgradeOptions.schedule".to_string(),
            "spec.upgradeOptions.versionSource.url".to_string()
        ]
    );
    s.upgrade_options.apply = "soon".into();
    assert_eq!(
        fields("c1", &s),
        vec!["spec.upgradeOptions.apply".to_string()]
    );
}

/// Decision 37: a plain-HTTP version source only with `insecure`; allowed repositories
/// are repositories, not images.
#[test]
fn an_upgrade_source_is_https_and_repositories_carry_no_tag() {
    let mut s = spec();
    s.upgrade_options.apply = "Latest".into();
    s.upgrade_options.version_source = Some(VersionSource {
        url: Some("http://versions.internal/ch.json".into()),
        ..VersionSource::default()
    });
    s.upgrade_options.allowed_repositories = vec![
        "mirror.example:5000/ch/server".into(),
        "mirror.example/ch/server:25.3".into(),
        "x@sha256:abc".into(),
    ];
    assert_eq!(
        fields("c1", &s),
        vec![
            "spec.upgradeOptions.versionSource.url".to_string(),
            "spec.upgradeOptions.allowedRepositories[1]".to_string(),
            "spec.upgradeOptions.allowedRepositories[2]".to_string(),
        ]
    );
    s.upgrade_options.version_source.as_mut().unwrap().insecure = true;
    s.upgrade_options.allowed_repositories.truncate(1);
    assert!(fields("c1", &s).is_empty());
}

/// Decision 42: a `-distroless` Keeper image has no shell, which the Keeper pod's command and
/// readiness probe need: refused with the reason. A distroless server image is fine (no
/// command, HTTP probes), and an external Keeper's image is not used.
#[test]
fn a_distroless_keeper_image_is_refused_with_the_reason() {
    let mut s = spec();
    for image in [
        "clickhouse/clickhouse-keeper:26.1-distroless",
        "registry.example:5000/ch/clickhouse-keeper:26.1.2.3-distroless@sha256:abc",
    ] {
        s.keeper.image = image.into();
        let (errors, _) = validate("c1", &s);
        assert_error(
            &errors,
            &serde_json::json!(image),
            "spec.keeper.image",
            "no shell",
        );
    }
    for image in [
        "clickhouse/clickhouse-keeper:26.1",
        "clickhouse/clickhouse-keeper:26.1-alpine",
        "registry.example:5000/distroless/clickhouse-keeper:26.1",
    ] {
        s.keeper.image = image.into();
        assert!(fields("c1", &s).is_empty(), "{image}");
    }
    s.keeper.image = "clickhouse/clickhouse-keeper:26.1".into();
    s.image = "clickhouse/clickhouse-server:26.1-distroless".into();
    assert!(fields("c1", &s).is_empty());
}

/// Issue 52 item 2, decision 66: under `podSecurity.ids: Platform` the server images whose
/// `clickhouse su` cannot take OpenShift's group 0 (built before November 2024) are refused
/// with the versions that can, unless the pod template sets a group other than 0; with
/// `Fixed` (uid and gid 101) every tag is fine.
#[test]
fn server_tags_whose_su_refuses_group_zero_are_refused_under_platform_ids() {
    let mut s = spec();
    s.pod_security.ids = crate::api::PodIds::Platform;
    for (tag, ok) in [
        ("24.2", false),
        ("24.8.6.70", false),
        ("24.3.13.40-alpine", false),
        ("24.7", false),
        ("24.10.1.2812", false),
        ("24.8", true),
        // before 24.1: not checked, not refused
        ("23.8", true),
        ("18.16.1", true),
        ("24.3", true),
        ("24.8.7.41", true),
        ("24.3.14.35-alpine", true),
        ("24.11", true),
        ("25.3", true),
        ("latest", true),
        ("24.2-distroless", true),
    ] {
        s.image = format!("clickhouse/clickhouse-server:{tag}");
        let (errors, _) = validate("c1", &s);
        if ok {
            assert!(fields("c1", &s).is_empty(), "{tag}");
        } else {
            assert_error(
                &errors,
                &serde_json::json!(s.image),
                "spec.image",
                "Group 0",
            );
        }
    }
    s.image = "clickhouse/clickhouse-server:24.2".into();
    s.pod.template = Some(serde_json::json!({"spec": {"securityContext": {"runAsGroup": 1000}}}));
    assert!(fields("c1", &s).is_empty());
    s.pod.template = Some(serde_json::json!({"spec": {"securityContext": {"runAsGroup": 0}}}));
    assert_eq!(fields("c1", &s), ["spec.image"]);
    s.pod.template = Some(serde_json::json!({"spec": {"containers": [
        {"name": "clickhouse", "securityContext": {"runAsGroup": 5}}]}}));
    assert!(fields("c1", &s).is_empty());
    s.pod.template = None;
    s.pod_security.ids = crate::api::PodIds::Fixed;
    assert!(fields("c1", &s).is_empty());
}

/// Decision 42: variables the operator sets or the images' entrypoints act on against
/// the operator's configuration are refused in `env`, each with its index.
#[test]
fn reserved_environment_variables_are_refused_with_their_index() {
    let var = |name: &str| k8s_openapi::api::core::v1::EnvVar {
        name: name.into(),
        value: Some("x".into()),
        ..Default::default()
    };
    let mut s = spec();
    s.pod.env = vec![
        var("TZ"),
        var("CLICKHOUSE_PASSWORD"),
        var("CLICKHOUSE_SKIP_USER_SETUP"),
    ];
    s.keeper.pod.env = vec![
        var("CLICKHOUSE_DATA_DIR"),
        var("TZ"),
        var("KEEPER_SERVER_ID"),
    ];
    assert_eq!(
        fields("c1", &s),
        [
            "spec.pod.env[1].name",
            "spec.pod.env[2].name",
            "spec.keeper.pod.env[0].name",
            "spec.keeper.pod.env[2].name",
        ]
    );
    s.pod.env = vec![var("TZ")];
    s.keeper.pod.env = vec![var("TZ")];
    assert!(fields("c1", &s).is_empty());
}

/// Decision 42: Keeper's own `startup_timeout` must end within the startup probe's
/// budget, or the probe would restart a member still waiting for its quorum.
#[test]
fn keepers_startup_timeout_must_end_within_the_probe_budget() {
    let mut s = spec();
    for (timeout, startup_seconds, ok) in [
        ("30000", None, true),
        ("59999", None, true),
        // the default budget of a 1Gi volume: 120 s (decision 67)
        ("119999", None, true),
        ("120000", None, false),
        ("180000", None, false),
        ("30000", Some(60), true),
        ("60000", Some(60), false),
        ("180000", Some(200), true),
        ("0", None, false),
        ("soon", None, false),
    ] {
        s.keeper.settings = BTreeMap::from([("startup_timeout".to_string(), timeout.to_string())]);
        s.keeper.pod.startup_seconds = startup_seconds;
        let errors = fields("c1", &s);
        if ok {
            assert!(
                errors.is_empty(),
                "{timeout} {startup_seconds:?}: {errors:?}"
            );
        } else {
            assert_eq!(
                errors,
                ["spec.keeper.settings.startup_timeout"],
                "{timeout} {startup_seconds:?}"
            );
        }
    }
}
