//! The Keeper ensemble: ONE StatefulSet `<cluster>-keeper` with `spec.keeper.replicas` pods.
//!
//! One StatefulSet rather than one per member: Keeper members are interchangeable and addressed
//! by ordinal (raft id = ordinal + 1), so the ordinal identity a StatefulSet gives is exactly
//! what raft needs, and scaling by one member is a replica count change plus a config reload
//! (Keeper reconfigures its raft membership when `raft_configuration` changes). Pods start in
//! parallel (a quorum needs a majority up at once). The StatefulSet is `OnDelete`: the operator
//! rolls the members itself, followers first and the leader last, each only once the one before
//! has rejoined as a synced follower (`plan::pass::keeper`), where the native RollingUpdate would
//! roll through every intermediate revision of rapid changes and never asks who leads. The
//! budget keeps voluntary disruptions within quorum.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec, StatefulSetUpdateStrategy};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, EnvVar, ExecAction, PodTemplateSpec, Probe,
    Service, ServiceSpec, TCPSocketAction, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::config::keeper::{SERVER_ID_ENV, keeper_file};
use super::hash::keeper_hashes;
use super::labels::{self, Component};
use super::pdb::budget;
use super::service::service_port;
use super::statefulset::{
    DATA_VOLUME, container_security, data_claim, empty_dir, env, env_from, mount, pod_annotations,
    pod_spec, port,
};
use super::{BuildError, Cluster, KeeperObjects, SecretData, names};

/// Name of the Keeper container.
pub const KEEPER_CONTAINER: &str = "keeper";

/// The container command: derives the raft id from the pod's ordinal (the last `-` part of
/// the host name's first label, so that `setHostnameAsFQDN` changes nothing) and starts the
/// image's entrypoint.
pub fn keeper_command() -> Vec<String> {
    vec![
        "/bin/bash".into(),
        "-c".into(),
        format!(
            "h=${{HOSTNAME%%.*}}; export {SERVER_ID_ENV}=$(( ${{h##*-}} + 1 )); exec /entrypoint.sh"
        ),
    ]
}

/// The variable the Keeper image's entrypoint reads its data directory from. Unset, the
/// entrypoint creates `/var/lib/clickhouse/coordination` inside the image's root filesystem,
/// which the pod makes read-only: that works only where the runtime turns the image's
/// `VOLUME` into a writable mount (containerd, Docker) and fails on CRI-O and OpenShift. Set
/// to the data volume, the entrypoint creates the very folders the configuration names there.
pub const DATA_DIR_ENV: &str = "CLICKHOUSE_DATA_DIR";

/// Environment variables of the Keeper container that the operator sets or the image's
/// entrypoint would act on against the operator's configuration: refused in
/// `spec.keeper.pod.env` and as keys of `spec.keeper.pod.envSecret`.
pub const RESERVED_ENV: &[&str] = crate::api::KEEPER_RESERVED_ENV;

/// Voluntary disruptions Keeper tolerates: `(n-1)/2`, so a majority always stays up. For one
/// member this is 0: a drain waits rather than stop every insert of the cluster; a user who
/// wants drains to proceed runs three members (decision 16 already reports one as unsafe).
pub fn max_unavailable(members: i32) -> i32 {
    ((members - 1) / 2).max(0)
}

/// The Keeper ConfigMap `<cluster>-keeper` with [`names::KEEPER_CONFIG_FILE`].
pub fn config_map(c: &Cluster<'_>) -> ConfigMap {
    ConfigMap {
        metadata: c.meta(
            names::keeper(c.name),
            labels::common(c.name, Component::Keeper),
        ),
        data: Some(BTreeMap::from([(
            names::KEEPER_CONFIG_FILE.to_string(),
            keeper_file(c, c.keeper_members),
        )])),
        ..ConfigMap::default()
    }
}

/// The Keeper StatefulSet: `spec.keeper.replicas` members (0 while paused), started in
/// parallel, `OnDelete` (the operator rolls them one at a time).
pub fn statefulset(
    c: &Cluster<'_>,
    secrets: &BTreeMap<String, SecretData>,
) -> Result<StatefulSet, BuildError> {
    let k = &c.spec.keeper;
    let selector = labels::component_selector(c.name, Component::Keeper);
    Ok(StatefulSet {
        metadata: c.meta(
            names::keeper(c.name),
            labels::common(c.name, Component::Keeper),
        ),
        spec: StatefulSetSpec {
            replicas: Some(if c.spec.pause { 0 } else { c.keeper_pods }),
            service_name: Some(names::keeper_headless_service(c.name)),
            pod_management_policy: Some("Parallel".into()),
            selector: LabelSelector {
                match_labels: Some(selector.clone()),
                ..LabelSelector::default()
            },
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("OnDelete".into()),
                ..StatefulSetUpdateStrategy::default()
            }),
            template: keeper_pod(c, secrets, selector)?,
            volume_claim_templates: Some(vec![data_claim(
                &k.storage,
                "spec.keeper.storage.size",
                labels::common(c.name, Component::Keeper),
            )?]),
            ..StatefulSetSpec::default()
        },
        ..StatefulSet::default()
    })
}

/// The Keeper pod template: the Keeper container and the user's pod settings
/// ([`pod_spec`]) with the Keeper ConfigMap and scratch space for logs and `/tmp`, spread
/// among pods matching `selector`; the user's annotations plus the input hashes.
fn keeper_pod(
    c: &Cluster<'_>,
    secrets: &BTreeMap<String, SecretData>,
    selector: BTreeMap<String, String>,
) -> Result<PodTemplateSpec, BuildError> {
    let pod = &c.spec.keeper.pod;
    let mut pod_labels = pod.labels.clone();
    pod_labels.extend(labels::common(c.name, Component::Keeper));
    let mut volumes = vec![
        Volume {
            name: "config".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: names::keeper(c.name),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
        empty_dir("logs"),
        empty_dir("tmp"),
    ];
    volumes.extend(
        keeper_tls_secrets(c)
            .into_iter()
            .map(|(volume, secret, _)| Volume {
                name: volume.into(),
                secret: Some(k8s_openapi::api::core::v1::SecretVolumeSource {
                    secret_name: Some(secret.to_string()),
                    default_mode: Some(super::SECRET_FILE_MODE),
                    ..Default::default()
                }),
                ..Volume::default()
            }),
    );
    let generated = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(pod_labels),
            annotations: Some(pod_annotations(pod, &keeper_hashes(c, secrets))),
            ..ObjectMeta::default()
        }),
        spec: Some(pod_spec(
            pod,
            &c.spec.pod_security,
            keeper_container(c),
            volumes,
            vec![selector.clone()],
            selector,
        )),
    };
    super::statefulset::with_template(generated, pod, "spec.keeper.pod.template", KEEPER_CONTAINER)
}

/// With `spec.keeper.tls`: the volumes of the cluster's certificate and CA Secrets, and where
/// Keeper reads them.
fn keeper_tls_secrets<'a>(c: &'a Cluster<'_>) -> Vec<(&'static str, &'a str, &'static str)> {
    if !c.spec.keeper.tls {
        return Vec::new();
    }
    let tls = &c.spec.tls;
    [
        ("tls", &tls.server_cert_secret, names::KEEPER_TLS_PATH),
        ("ca", &tls.ca_secret, names::KEEPER_CA_PATH),
    ]
    .into_iter()
    .filter_map(|(v, s, p)| Some((v, s.as_deref()?, p)))
    .collect()
}

/// The Keeper container: [`keeper_command`], the client and raft ports, the user's
/// environment; ready once it serves with a quorum, alive while its client port answers.
/// Default `startupSeconds` of a Keeper member.
pub const KEEPER_STARTUP_SECONDS: i32 = crate::api::DEFAULT_KEEPER_STARTUP_SECONDS;

fn keeper_container(c: &Cluster<'_>) -> Container {
    let k = &c.spec.keeper;
    let pod = &k.pod;
    Container {
        name: KEEPER_CONTAINER.into(),
        image: Some(k.image.clone()),
        command: Some(keeper_command()),
        ports: Some({
            let mut ports = vec![
                port("client", names::KEEPER_CLIENT_PORT),
                port("raft", names::KEEPER_RAFT_PORT),
            ];
            if k.tls {
                ports.push(port("client-tls", names::KEEPER_SECURE_CLIENT_PORT));
            }
            ports
        }),
        env: env(std::iter::once(EnvVar {
            name: DATA_DIR_ENV.into(),
            value: Some(names::KEEPER_DATA_PATH.into()),
            ..EnvVar::default()
        })
        .chain(pod.env.iter().cloned())
        .collect()),
        env_from: env_from(pod),
        resources: pod.resources.clone(),
        volume_mounts: Some(
            [
                mount(DATA_VOLUME, names::KEEPER_DATA_PATH),
                mount("config", names::KEEPER_CONFIG_PATH),
                mount("logs", names::KEEPER_LOG_PATH),
                mount("tmp", "/tmp"),
            ]
            .into_iter()
            .chain(
                keeper_tls_secrets(c)
                    .into_iter()
                    .map(|(volume, _, path)| mount(volume, path)),
            )
            .collect(),
        ),
        // Ready means serving: a member answers `srvr` with its Mode only once the ensemble
        // has a quorum (listening alone is not enough: servers that meet a Keeper without
        // quorum fail their first requests).
        readiness_probe: Some(Probe {
            exec: Some(ExecAction {
                command: Some(vec![
                    "/bin/bash".into(),
                    "-c".into(),
                    format!(
                        "exec 3<>/dev/tcp/127.0.0.1/{port} && printf srvr >&3 && grep -q '^Mode: ' <&3",
                        port = names::KEEPER_CLIENT_PORT
                    ),
                ]),
            }),
            period_seconds: Some(2),
            timeout_seconds: Some(3),
            failure_threshold: Some(3),
            ..Probe::default()
        }),
        startup_probe: Some(startup_probe(k)),
        liveness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(names::KEEPER_CLIENT_PORT),
                ..TCPSocketAction::default()
            }),
            period_seconds: Some(10),
            failure_threshold: Some(6),
            ..Probe::default()
        }),
        security_context: Some(container_security(&[])),
        termination_message_policy: Some(super::LOG_ON_ERROR.into()),
        ..Container::default()
    }
}

/// The startup probe: the client port within [`crate::api::KeeperSpec::startup_seconds`],
/// checked every 2 s for a budget `startupSeconds` sets, else every
/// [`crate::api::KEEPER_DEFAULT_STARTUP_PERIOD`] s.
pub fn startup_probe(k: &crate::api::KeeperSpec) -> Probe {
    let budget = k.startup_seconds();
    let period = if k.pod.startup_seconds.is_some() {
        2
    } else {
        crate::api::KEEPER_DEFAULT_STARTUP_PERIOD
    };
    Probe {
        tcp_socket: Some(TCPSocketAction {
            port: IntOrString::Int(names::KEEPER_CLIENT_PORT),
            ..TCPSocketAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(if period == 2 {
            k.pod.startup_failure_threshold(KEEPER_STARTUP_SECONDS)
        } else {
            (budget + period - 1) / period
        }),
        ..Probe::default()
    }
}

/// Every Keeper object, or `None` when `spec.keeper.replicas` is 0.
pub fn objects(
    c: &Cluster<'_>,
    secrets: &BTreeMap<String, SecretData>,
) -> Result<Option<KeeperObjects>, BuildError> {
    let n = c.keeper_members;
    if n <= 0 {
        return Ok(None);
    }
    let selector = labels::component_selector(c.name, Component::Keeper);
    let meta = |name| c.meta(name, labels::common(c.name, Component::Keeper));
    Ok(Some(KeeperObjects {
        config: config_map(c),
        statefulset: statefulset(c, secrets)?,
        headless_service: Service {
            metadata: meta(names::keeper_headless_service(c.name)),
            spec: Some(ServiceSpec {
                cluster_ip: Some("None".into()),
                publish_not_ready_addresses: Some(true),
                selector: Some(selector.clone()),
                ports: Some({
                    let mut ports = vec![
                        service_port("client", names::KEEPER_CLIENT_PORT),
                        service_port("raft", names::KEEPER_RAFT_PORT),
                    ];
                    if c.spec.keeper.tls {
                        ports.push(service_port("client-tls", names::KEEPER_SECURE_CLIENT_PORT));
                    }
                    ports
                }),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        },
        client_service: Service {
            metadata: meta(names::keeper(c.name)),
            spec: Some(ServiceSpec {
                selector: Some(selector.clone()),
                ports: Some(vec![service_port("client", names::KEEPER_CLIENT_PORT)]),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        },
        pdb: budget(
            c,
            names::keeper(c.name),
            Component::Keeper,
            selector,
            max_unavailable(n),
        ),
    }))
}
