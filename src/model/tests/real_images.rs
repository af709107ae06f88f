//! Decision 42: the pods start on the real `clickhouse/clickhouse-server` and
//! `clickhouse/clickhouse-keeper` images on every runtime (docs/running-on-real-clusters.md).

use super::*;
use crate::model::config::keeper::{STARTUP_TIMEOUT, keeper_restart_part, startup_timeout_ms};

fn keeper_container(d: &Desired) -> k8s_openapi::api::core::v1::Container {
    d.keeper
        .as_ref()
        .unwrap()
        .statefulset
        .spec
        .template
        .spec
        .clone()
        .unwrap()
        .containers[0]
        .clone()
}

fn keeper_setting(d: &Desired, name: &str) -> Option<String> {
    let file = &d.keeper.as_ref().unwrap().config.data.as_ref().unwrap()[names::KEEPER_CONFIG_FILE];
    parse(file)
        .descendants()
        .find(|n| n.has_tag_name(name))
        .and_then(|n| n.text())
        .map(str::to_string)
}

/// Item 1: the Keeper image's entrypoint creates `$CLICKHOUSE_DATA_DIR/coordination/…` and
/// refuses to start when it cannot. Unset, that is `/var/lib/clickhouse` inside the read-only
/// root filesystem, writable only where the runtime mounts the image's VOLUME (containerd), not
/// on CRI-O. The variable names the data volume, the very folder the configuration's `path`,
/// log and snapshot storage are on.
#[test]
fn keepers_entrypoint_creates_its_folders_on_the_data_volume() {
    let c = cluster(json!({"keeper": {"replicas": 3}}));
    let d = build(&c, &inputs(replicas(1, 2)));
    let k = keeper_container(&d);
    let env: BTreeMap<String, Option<String>> = k
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone()))
        .collect();
    assert_eq!(
        env.get(crate::model::keeper::DATA_DIR_ENV),
        Some(&Some(names::KEEPER_DATA_PATH.to_string()))
    );
    let data_mount = k
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == crate::model::statefulset::DATA_VOLUME)
        .unwrap();
    assert_eq!(data_mount.mount_path, names::KEEPER_DATA_PATH);
    for setting in ["log_storage_path", "snapshot_storage_path"] {
        let path = keeper_setting(&d, setting).unwrap();
        assert!(
            path.starts_with(&format!("{}/coordination/", names::KEEPER_DATA_PATH)),
            "{setting}: {path}"
        );
    }
    assert_eq!(
        keeper_setting(&d, "path").as_deref(),
        Some(names::KEEPER_DATA_PATH)
    );
}

/// Item 2: Keeper opens its client port only with a quorum or after its `startup_timeout`;
/// the startup probe checks that port. The operator's timeout is half the probe's budget, so a
/// member waiting for its peers opens the port before the probe gives up; the user's own
/// timeout wins; the timeout restarts nothing when it first appears (invariant 9: it is not
/// part of what is hashed into the pod template).
#[test]
fn keepers_startup_timeout_ends_within_the_startup_probes_budget() {
    for (spec, budget_s) in [
        (json!({"keeper": {"replicas": 3}}), 60),
        (
            json!({"keeper": {"replicas": 3, "pod": {"startupSeconds": 200}}}),
            200,
        ),
    ] {
        let c = cluster(spec);
        let d = build(&c, &inputs(replicas(1, 1)));
        let probe = keeper_container(&d).startup_probe.unwrap();
        let probe_budget_ms =
            i64::from(probe.period_seconds.unwrap() * probe.failure_threshold.unwrap()) * 1000;
        assert!(probe_budget_ms >= budget_s * 1000, "{probe_budget_ms}");
        let timeout: i64 = keeper_setting(&d, STARTUP_TIMEOUT)
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(timeout, budget_s * 1000 / 2);
        assert!(
            timeout + 10_000 <= probe_budget_ms,
            "the port opens at least 10 s before the probe gives up: {timeout} ms of {probe_budget_ms} ms"
        );
        let model = Cluster::new(&c).unwrap();
        assert_eq!(startup_timeout_ms(&model), timeout);
        assert!(!keeper_restart_part(&model).contains(STARTUP_TIMEOUT));
    }
    let own = cluster(json!({"keeper": {"replicas": 3, "settings": {"startup_timeout": "20000"}}}));
    let d = build(&own, &inputs(replicas(1, 1)));
    assert_eq!(
        keeper_setting(&d, STARTUP_TIMEOUT).as_deref(),
        Some("20000")
    );
    let file = &d.keeper.as_ref().unwrap().config.data.as_ref().unwrap()[names::KEEPER_CONFIG_FILE];
    assert_eq!(file.matches("<startup_timeout>").count(), 1, "{file}");
}

/// Item 3: `podSecurity.ids: Platform` leaves uid, gid and fsGroup to the platform (OpenShift's
/// `restricted-v2` refuses a fixed uid) and keeps everything else of the lock-down; `Fixed` (the
/// default) is the images' `clickhouse` user.
#[test]
fn platform_ids_leave_uid_gid_and_fs_group_to_the_platform() {
    let ids = |spec: serde_json::Value| {
        let d = build(&cluster(spec), &inputs(replicas(1, 1)));
        let mut out = Vec::new();
        let keeper = d
            .keeper
            .as_ref()
            .map(|k| k.statefulset.spec.template.clone());
        for t in templates(&d).into_iter().chain(keeper) {
            let spec = t.spec.unwrap();
            let p = spec.security_context.unwrap();
            let main = spec.containers[0].security_context.clone().unwrap();
            assert_eq!(p.run_as_non_root, Some(true));
            assert_eq!(p.seccomp_profile.unwrap().type_, "RuntimeDefault");
            assert_eq!(main.read_only_root_filesystem, Some(true));
            assert_eq!(main.allow_privilege_escalation, Some(false));
            assert_eq!(main.run_as_user, None);
            out.push((
                p.run_as_user,
                p.run_as_group,
                p.fs_group,
                p.fs_group_change_policy,
            ));
        }
        out
    };
    let fixed = ids(json!({"keeper": {"replicas": 1}}));
    assert_eq!(fixed.len(), 2);
    for i in fixed {
        assert_eq!(
            i,
            (
                Some(101),
                Some(101),
                Some(101),
                Some("OnRootMismatch".into())
            )
        );
    }
    let platform = ids(json!({"keeper": {"replicas": 1}, "podSecurity": {"ids": "Platform"}}));
    assert_eq!(platform.len(), 2);
    for i in platform {
        assert_eq!(i, (None, None, None, None));
    }
}

/// Item 6: every capability is dropped unless `podSecurity.clickhouseCapabilities` keeps the
/// three ClickHouse uses, in the server container only.
#[test]
fn clickhouse_capabilities_are_kept_only_when_asked_and_only_by_the_servers() {
    let caps = |spec: serde_json::Value| {
        let d = build(&cluster(spec), &inputs(replicas(1, 1)));
        let server = templates(&d)[0].spec.clone().unwrap().containers[0]
            .security_context
            .clone()
            .unwrap()
            .capabilities
            .unwrap();
        let keeper = keeper_container(&d)
            .security_context
            .unwrap()
            .capabilities
            .unwrap();
        (server, keeper)
    };
    let (server, keeper) = caps(json!({"keeper": {"replicas": 1}}));
    assert_eq!(server.drop, Some(vec!["ALL".to_string()]));
    assert_eq!(server.add, None);
    assert_eq!(keeper.add, None);
    let (server, keeper) =
        caps(json!({"keeper": {"replicas": 1}, "podSecurity": {"clickhouseCapabilities": true}}));
    assert_eq!(server.drop, Some(vec!["ALL".to_string()]));
    assert_eq!(
        server.add,
        Some(vec![
            "IPC_LOCK".into(),
            "SYS_NICE".into(),
            "NET_ADMIN".into()
        ])
    );
    assert_eq!(keeper.add, None);
}

/// Item 5: the images' `config.xml` opens the MySQL (9004) and PostgreSQL (9005) protocols on
/// every address; a reloaded file of the common ConfigMap closes both (with or without TLS),
/// so `tls.required` leaves no plaintext listener, and a setting of the user reopens one.
#[test]
fn the_images_mysql_and_postgresql_ports_are_closed() {
    use crate::model::config::server::{CLOSED_PORTS_FILE, Effect, common_files};
    for spec in [
        json!({}),
        json!({"tls": {"enabled": true, "required": true, "serverCertSecret": "tls", "caSecret": "ca"}}),
    ] {
        let c = cluster(spec);
        let d = build(&c, &inputs(replicas(1, 1)));
        let file = common_file(&d, CLOSED_PORTS_FILE);
        let doc = parse(file);
        let removed: Vec<&str> = doc
            .root_element()
            .children()
            .filter(|n| n.is_element() && n.attribute("remove") == Some("remove"))
            .map(|n| n.tag_name().name())
            .collect();
        assert_eq!(removed, ["mysql_port", "postgresql_port"]);
        let files = common_files(&Cluster::new(&c).unwrap()).unwrap();
        let closed = files.iter().find(|f| f.name == CLOSED_PORTS_FILE).unwrap();
        assert_eq!(
            closed.effect,
            Effect::Reload,
            "an operator upgrade restarts nothing for it"
        );
        // the user's settings merge after it
        assert!(
            files
                .iter()
                .any(|f| f.name.as_str() > CLOSED_PORTS_FILE && f.name == RUNTIME_FILE)
        );
    }
}

/// Item 5: a key of an environment Secret that the image's entrypoint acts on (it would write
/// `users.d`, a read-only projection, and exit) or that the operator sets stops the build with
/// the Secret and key named; other keys are fine.
#[test]
fn an_environment_secret_with_a_reserved_key_is_refused_with_its_name() {
    let c = cluster(
        json!({"pod": {"envSecret": "env"}, "keeper": {"replicas": 1, "pod": {"envSecret": "kenv"}}}),
    );
    let secret = |keys: &[&str]| -> SecretData {
        keys.iter()
            .map(|k| (k.to_string(), b"x".to_vec()))
            .collect()
    };
    let mut fine = inputs(replicas(1, 1));
    fine.secrets
        .insert("env".into(), secret(&["TZ", "AWS_REGION"]));
    fine.secrets.insert("kenv".into(), secret(&["TZ"]));
    assert!(desired(&Cluster::new(&c).unwrap(), &fine).is_ok());
    for (secret_name, key, field) in [
        ("env", "CLICKHOUSE_PASSWORD", "spec.pod.envSecret"),
        ("env", "CLICKHOUSE_USER", "spec.pod.envSecret"),
        (
            "env",
            "CLICKHOUSE_DEFAULT_ACCESS_MANAGEMENT",
            "spec.pod.envSecret",
        ),
        ("kenv", "KEEPER_SERVER_ID", "spec.keeper.pod.envSecret"),
        ("kenv", "CLICKHOUSE_DATA_DIR", "spec.keeper.pod.envSecret"),
    ] {
        let mut i = fine.clone();
        i.secrets.insert(secret_name.into(), secret(&["TZ", key]));
        let err = desired(&Cluster::new(&c).unwrap(), &i)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with(field), "{err}");
        assert!(err.contains(key) && err.contains(secret_name), "{err}");
    }
}

/// Issue 52 item 5, decision 67: with `startupSeconds` unset the Keeper startup budget is 60 s
/// plus 60 s per GiB of the volume (checked every 5 s) and `startup_timeout` stays 30 s, so a
/// member that loads its state for longer than the 30 s left by the earlier 60 s budget still
/// opens its port in time; a `startupSeconds` the user sets is taken as before. An ensemble
/// written with the earlier default keeps it (no restart on an operator upgrade, invariant 9),
/// a budget the user sets rolls the members, and the earlier default is what the template hash
/// counts.
#[test]
fn keepers_default_startup_budget_grows_with_its_volume() {
    use crate::model::changes::pod_template_changed;
    for (size, budget) in [("1Gi", 120), ("100Mi", 120), ("1500Mi", 180), ("10Gi", 660)] {
        let c = cluster(json!({"keeper": {"replicas": 3, "storage": {"size": size}}}));
        let d = build(&c, &inputs(replicas(1, 1)));
        let probe = keeper_container(&d).startup_probe.unwrap();
        assert_eq!(probe.period_seconds, Some(5), "{size}");
        assert_eq!(
            probe.period_seconds.unwrap() * probe.failure_threshold.unwrap(),
            budget,
            "{size}"
        );
        assert_eq!(
            keeper_setting(&d, STARTUP_TIMEOUT).as_deref(),
            Some("30000")
        );
    }
    let set = cluster(
        json!({"keeper": {"replicas": 3, "storage": {"size": "10Gi"},
                                        "pod": {"startupSeconds": 90}}}),
    );
    let d = build(&set, &inputs(replicas(1, 1)));
    let probe = keeper_container(&d).startup_probe.unwrap();
    assert_eq!(
        (probe.period_seconds, probe.failure_threshold),
        (Some(2), Some(45))
    );
    assert_eq!(
        keeper_setting(&d, STARTUP_TIMEOUT).as_deref(),
        Some("45000")
    );
    // an ensemble of the earlier default: kept; a budget set: rolled
    let now = build(
        &cluster(json!({"keeper": {"replicas": 3}})),
        &inputs(replicas(1, 1)),
    );
    let desired = serde_json::to_value(&now.keeper.as_ref().unwrap().statefulset).unwrap();
    let mut earlier = desired.clone();
    earlier["spec"]["template"]["spec"]["containers"][0]["startupProbe"] =
        json!({"tcpSocket": {"port": 9181}, "periodSeconds": 2, "failureThreshold": 30});
    assert!(!pod_template_changed(&earlier, &desired));
    let rolled = serde_json::to_value(&d.keeper.as_ref().unwrap().statefulset).unwrap();
    assert!(pod_template_changed(&earlier, &rolled));
    let hash_form =
        crate::model::with_deferred_keeper_launch(desired["spec"]["template"].clone(), None);
    assert_eq!(
        hash_form["spec"]["containers"][0]["startupProbe"],
        earlier["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    );
    assert!(crate::model::keeper_launch_held_back(
        &desired["spec"]["template"],
        &earlier["spec"]["template"]
    ));
    assert!(!crate::model::keeper_launch_held_back(
        &desired["spec"]["template"],
        &desired["spec"]["template"]
    ));
}
