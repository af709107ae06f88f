//! The server StatefulSet of one replica (MultiSTS, S0-10: one StatefulSet per replica,
//! `replicas: 1`), and the pod pieces server and Keeper pods share.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec, StatefulSetUpdateStrategy};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMapProjection, Container, ContainerPort, EmptyDirVolumeSource,
    EnvFromSource, EnvVar, EnvVarSource, HTTPGetAction, KeyToPath, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PodAffinityTerm, PodAntiAffinity, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, ProjectedVolumeSource, SeccompProfile, SecretEnvSource,
    SecretKeySelector, SecretProjection, SecretVolumeSource, SecurityContext,
    TopologySpreadConstraint, Volume, VolumeMount, VolumeProjection, VolumeResourceRequirements,
    WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::hash::PodHashes;
use super::labels;
use super::{BuildError, Cluster, ReplicaSpec, names};
use crate::api::{AntiAffinity, PodIds, PodSecurity, PodSettings, StorageSpec, UpdateStrategy};
use crate::util::quantity;

/// uid and gid of the `clickhouse` user in the official images.
pub const CLICKHOUSE_UID: i64 = 101;
/// Name of the main server container.
pub const SERVER_CONTAINER: &str = "clickhouse";
pub use super::names::DATA_VOLUME;
/// Default `startupSeconds` of a server.
pub const SERVER_STARTUP_SECONDS: i32 = 120;

/// Pod security: non-root as the images' `clickhouse` user, fsGroup for the volumes, seccomp
/// RuntimeDefault; with `spec.podSecurity.ids: Platform` the ids are the platform's.
fn pod_security(security: &PodSecurity) -> PodSecurityContext {
    let fixed = (security.ids == PodIds::Fixed).then_some(CLICKHOUSE_UID);
    PodSecurityContext {
        run_as_user: fixed,
        run_as_group: fixed,
        run_as_non_root: Some(true),
        fs_group: fixed,
        fs_group_change_policy: fixed.map(|_| "OnRootMismatch".into()),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..SeccompProfile::default()
        }),
        ..PodSecurityContext::default()
    }
}

/// Container security: no privilege escalation, no capabilities but `keep`, read-only root
/// filesystem (the writable paths are volumes).
pub(crate) fn container_security(keep: &[&str]) -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: (!keep.is_empty()).then(|| keep.iter().map(|c| c.to_string()).collect()),
        }),
        ..SecurityContext::default()
    }
}

pub(crate) fn port(name: &str, port: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.into()),
        container_port: port,
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    }
}

pub(crate) fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        ..VolumeMount::default()
    }
}

pub(crate) fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    }
}

/// `envFrom` of the environment Secret, if any.
pub(crate) fn env_from(pod: &PodSettings) -> Option<Vec<EnvFromSource>> {
    pod.env_secret.as_ref().map(|name| {
        vec![EnvFromSource {
            secret_ref: Some(SecretEnvSource {
                name: name.clone(),
                optional: Some(false),
            }),
            ..EnvFromSource::default()
        }]
    })
}

/// `env`, or `None` when empty (so the applied object has no empty list).
pub(crate) fn env(vars: Vec<EnvVar>) -> Option<Vec<EnvVar>> {
    (!vars.is_empty()).then_some(vars)
}

/// A topology spread over `key` (maxSkew 1, ScheduleAnyway) among pods matching `selector`.
fn spread(
    key: Option<&String>,
    selectors: Vec<BTreeMap<String, String>>,
) -> Option<Vec<TopologySpreadConstraint>> {
    key.map(|key| {
        selectors
            .into_iter()
            .map(|selector| TopologySpreadConstraint {
                max_skew: 1,
                topology_key: key.clone(),
                when_unsatisfiable: "ScheduleAnyway".into(),
                label_selector: Some(LabelSelector {
                    match_labels: Some(selector),
                    ..LabelSelector::default()
                }),
                ..TopologySpreadConstraint::default()
            })
            .collect()
    })
}

/// The topology over which pods are kept apart.
pub const HOSTNAME_KEY: &str = "kubernetes.io/hostname";

/// The user's affinity plus the anti-affinity that keeps pods matching `apart` (the replicas of
/// one shard, the Keeper members) on different nodes ([`PodSettings::anti_affinity`]).
fn affinity(pod: &PodSettings, apart: BTreeMap<String, String>) -> Option<Affinity> {
    let term = PodAffinityTerm {
        label_selector: Some(LabelSelector {
            match_labels: Some(apart),
            ..LabelSelector::default()
        }),
        topology_key: HOSTNAME_KEY.into(),
        ..PodAffinityTerm::default()
    };
    let mode = pod.anti_affinity.unwrap_or_default();
    if mode == AntiAffinity::None {
        return pod.affinity.clone();
    }
    let mut a = pod.affinity.clone().unwrap_or_default();
    let anti = a
        .pod_anti_affinity
        .get_or_insert_with(PodAntiAffinity::default);
    match mode {
        AntiAffinity::Required => anti
            .required_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .push(term),
        _ => anti
            .preferred_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .push(WeightedPodAffinityTerm {
                weight: DEFAULT_APART_WEIGHT,
                pod_affinity_term: term,
            }),
    }
    Some(a)
}

/// Weight of the default (preferred) anti-affinity term.
pub const DEFAULT_APART_WEIGHT: i32 = 100;

/// A pod spec: `main`, then the user's sidecars; `volumes`; the locked-down
/// [`pod_security`]; the user's affinity, tolerations and node selector; the spread over the
/// user's topology key among the pods matching each of `spread_selectors` (for servers: their
/// shard's, so that a shard does not sit in one zone; for Keeper: the members); no service
/// links, and no
/// ServiceAccount token (ClickHouse and Keeper never call the Kubernetes API; decision 32).
pub(crate) fn pod_spec(
    pod: &PodSettings,
    security: &PodSecurity,
    main: Container,
    volumes: Vec<Volume>,
    spread_selectors: Vec<BTreeMap<String, String>>,
    apart: BTreeMap<String, String>,
) -> PodSpec {
    let mut containers = vec![main];
    containers.extend(pod.sidecars.iter().cloned());
    PodSpec {
        containers,
        volumes: Some(volumes),
        security_context: Some(pod_security(security)),
        affinity: affinity(pod, apart),
        tolerations: (!pod.tolerations.is_empty()).then(|| pod.tolerations.clone()),
        node_selector: (!pod.node_selector.is_empty()).then(|| pod.node_selector.clone()),
        topology_spread_constraints: spread(pod.topology_spread_key.as_ref(), spread_selectors),
        enable_service_links: Some(false),
        automount_service_account_token: Some(false),
        ..PodSpec::default()
    }
}

/// The data volume claim template from a storage spec.
pub(crate) fn data_claim(
    storage: &StorageSpec,
    field: &'static str,
    labels: BTreeMap<String, String>,
) -> Result<PersistentVolumeClaim, BuildError> {
    claim(
        DATA_VOLUME,
        &storage.size,
        storage.storage_class_name.as_ref(),
        field,
        storage,
        labels,
    )
}

/// A claim template named `name` of `size` in `class`, with the labels and annotations of
/// `storage` under the operator's `labels` (which win).
fn claim(
    name: &str,
    size: &str,
    class: Option<&String>,
    field: &'static str,
    storage: &StorageSpec,
    labels: BTreeMap<String, String>,
) -> Result<PersistentVolumeClaim, BuildError> {
    if quantity::parse_bytes(size).is_none() {
        return Err(BuildError::InvalidQuantity {
            field,
            value: size.to_string(),
        });
    }
    let mut all_labels = storage.labels.clone();
    all_labels.extend(labels);
    Ok(PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(all_labels),
            annotations: (!storage.annotations.is_empty()).then(|| storage.annotations.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: class.cloned(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(size.to_string()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    })
}

/// The claim templates of a server replica: the data volume, one per disk of
/// `spec.storage.disks`, and the log volume when `spec.storage.logs` is set.
fn server_claims(
    c: &Cluster<'_>,
    r: &ReplicaSpec,
) -> Result<Vec<PersistentVolumeClaim>, BuildError> {
    let storage = &c.spec.storage;
    let labels = labels::replica(c.name, r);
    let mut claims = vec![data_claim(
        &storage.data,
        "spec.storage.size",
        labels.clone(),
    )?];
    for d in &storage.disks {
        claims.push(claim(
            &names::disk_claim(&d.name),
            &d.size,
            d.storage_class_name.as_ref(),
            "spec.storage.disks[].size",
            &storage.data,
            labels.clone(),
        )?);
    }
    if let Some(l) = &storage.logs {
        claims.push(claim(
            names::LOGS_CLAIM,
            &l.size,
            l.storage_class_name.as_ref(),
            "spec.storage.logs.size",
            &storage.data,
            labels,
        )?);
    }
    Ok(claims)
}

/// Pod-template annotations: the user's, then the hashes (ours win).
pub(crate) fn pod_annotations(pod: &PodSettings, hashes: &PodHashes) -> BTreeMap<String, String> {
    let mut a = pod.annotations.clone();
    a.extend(hashes.annotations());
    a
}

fn http_probe(path: &str, port: i32, https: bool) -> HTTPGetAction {
    HTTPGetAction {
        path: Some(path.into()),
        port: IntOrString::Int(port),
        scheme: Some(if https { "HTTPS" } else { "HTTP" }.into()),
        ..HTTPGetAction::default()
    }
}

/// The server container's ports: plain ones unless `tls.required`, secure ones with TLS.
pub fn server_ports(c: &Cluster<'_>) -> Vec<(&'static str, i32)> {
    let tls = &c.spec.tls;
    let mut ports = Vec::new();
    if !(tls.enabled && tls.required) {
        ports.extend([
            ("http", names::HTTP_PORT),
            ("tcp", names::TCP_PORT),
            ("interserver", names::INTERSERVER_HTTP_PORT),
        ]);
    }
    if tls.enabled {
        ports.extend([
            ("https", names::HTTPS_PORT),
            ("tcp-secure", names::TCP_SECURE_PORT),
        ]);
        if tls.required {
            ports.push(("interserver-tls", names::INTERSERVER_HTTPS_PORT));
        }
    }
    if c.spec.server_metrics.enabled {
        ports.push(("prometheus", c.spec.server_metrics.port));
    }
    ports.extend(protocol_ports(c));
    ports
}

/// The ports of `spec.protocols` that are on.
pub fn protocol_ports(c: &Cluster<'_>) -> Vec<(&'static str, i32)> {
    let p = &c.spec.protocols;
    [
        (p.mysql, "mysql", names::MYSQL_PORT),
        (p.postgresql, "postgresql", names::POSTGRESQL_PORT),
        (p.grpc, "grpc", names::GRPC_PORT),
    ]
    .into_iter()
    .filter(|(on, _, _)| *on)
    .map(|(_, n, port)| (n, port))
    .collect()
}

/// The StatefulSet of replica `r`: `replicas` 1 (0 while paused), `OnDelete` under SmartUpdate
/// and OnDelete, `RollingUpdate` under RollingUpdate (S2-26, S2-33, S2-34).
pub fn server(
    c: &Cluster<'_>,
    r: &ReplicaSpec,
    hashes: &PodHashes,
    secret_files: &[&'static str],
) -> Result<StatefulSet, BuildError> {
    let spec = c.spec;
    Ok(StatefulSet {
        metadata: c.meta(r.name.to_string(), labels::replica(c.name, r)),
        spec: StatefulSetSpec {
            replicas: Some(if spec.pause { 0 } else { 1 }),
            service_name: Some(names::headless_service(c.name)),
            selector: LabelSelector {
                match_labels: Some(labels::replica_selector(c.name, &r.name)),
                ..LabelSelector::default()
            },
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some(
                    match spec.update_strategy {
                        UpdateStrategy::SmartUpdate | UpdateStrategy::OnDelete => "OnDelete",
                        UpdateStrategy::RollingUpdate => "RollingUpdate",
                    }
                    .into(),
                ),
                ..StatefulSetUpdateStrategy::default()
            }),
            template: server_pod(c, r, &with_shard_files(c, r, hashes), secret_files)?,
            volume_claim_templates: Some(server_claims(c, r)?),
            ..StatefulSetSpec::default()
        },
        ..StatefulSet::default()
    })
}

/// The pod template of replica `r`: the server container and the user's pod settings
/// ([`pod_spec`]), spread among the cluster's serving pods, a minute to shut down; the user's
/// annotations plus the input hashes ([`pod_annotations`]).
fn server_pod(
    c: &Cluster<'_>,
    r: &ReplicaSpec,
    hashes: &PodHashes,
    secret_files: &[&'static str],
) -> Result<PodTemplateSpec, BuildError> {
    let pod = &c.spec.pod;
    let (mounts, volumes) = server_volumes(c, r, secret_files);
    let generated = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some({
                let mut l = labels::server_pod(c.name, r, &pod.labels);
                if let Some(x) = c
                    .spec
                    .keeper
                    .external
                    .as_ref()
                    .and_then(|x| x.cluster_ref.as_ref())
                {
                    l.insert(labels::KEEPER_OF_CLUSTER.into(), x.name.clone());
                    l.insert(
                        labels::KEEPER_OF_NAMESPACE.into(),
                        x.namespace
                            .clone()
                            .unwrap_or_else(|| c.namespace.to_string()),
                    );
                }
                l
            }),
            annotations: Some(pod_annotations(pod, hashes)),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            termination_grace_period_seconds: Some(60),
            service_account_name: server_web_identity(c).map(|w| w.service_account_name.clone()),
            ..pod_spec(
                pod,
                &c.spec.pod_security,
                server_container(c, mounts),
                volumes,
                // one spread per topology key: the API server refuses two with the same key and
                // `whenUnsatisfiable`, and the shard's is the one that keeps a zone's loss from
                // taking a whole shard (decision 28)
                vec![labels::shard_spread_selector(c.name, r.shard)],
                labels::shard_selector(c.name, r.shard),
            )
        }),
    };
    with_template(generated, pod, "spec.pod.template", SERVER_CONTAINER)
}

/// `hashes` plus the hash of the replica's shard files, when its shard has any, and of its own
/// files, when it has any (so that only those pods restart when they change).
fn with_shard_files(c: &Cluster<'_>, r: &ReplicaSpec, hashes: &PodHashes) -> PodHashes {
    let files = super::config::server::shard_files(c, r.shard);
    let mut h = hashes.clone();
    if !files.is_empty() {
        h.insert(
            labels::SHARD_FILES_HASH,
            super::hash::json_hash(&serde_json::to_value(files).expect("strings serialise")),
        );
    }
    let own = super::config::server::replica_files(c, &r.name);
    if !own.is_empty() {
        h.insert(
            labels::REPLICA_FILES_HASH,
            super::hash::json_hash(&serde_json::to_value(own).expect("strings serialise")),
        );
    }
    h
}

/// `generated` with the user's `pod.template` merged over it ([`super::pod_template`]).
pub(crate) fn with_template(
    generated: PodTemplateSpec,
    pod: &PodSettings,
    field: &str,
    main: &str,
) -> Result<PodTemplateSpec, BuildError> {
    match &pod.template {
        Some(t) => super::pod_template::merge(generated, t, field, main),
        None => Ok(generated),
    }
}

/// The server container: the image's entrypoint told not to set up users, the user's
/// environment, [`server_ports`], and `/ping` probes on the HTTP port (HTTPS when only secure
/// ports are open).
fn server_container(c: &Cluster<'_>, mounts: Vec<VolumeMount>) -> Container {
    let spec = c.spec;
    let pod = &spec.pod;
    let (probe_port, https) = if spec.tls.enabled && spec.tls.required {
        (names::HTTPS_PORT, true)
    } else {
        (names::HTTP_PORT, false)
    };
    let mut env_vars = vec![EnvVar {
        // The official image's entrypoint must not write users.d (a read-only projection):
        // the operator manages the users.
        name: "CLICKHOUSE_SKIP_USER_SETUP".into(),
        value: Some("1".into()),
        ..EnvVar::default()
    }];
    env_vars.extend(web_identity_env(c));
    env_vars.extend(pod.env.iter().cloned());
    // `spec.configuration.secretSettings`, as `SECRET_SETTINGS_FILE` reads them
    env_vars.extend(
        spec.configuration
            .secret_settings
            .values()
            .enumerate()
            .map(|(i, key)| EnvVar {
                name: names::secret_setting_env(i),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: key.name.clone(),
                        key: key.key.clone(),
                        optional: Some(false),
                    }),
                    ..EnvVarSource::default()
                }),
                ..EnvVar::default()
            }),
    );
    let mut container = Container {
        name: SERVER_CONTAINER.into(),
        image: Some(spec.image.clone()),
        ports: Some(
            server_ports(c)
                .into_iter()
                .map(|(n, p)| port(n, p))
                .collect(),
        ),
        env: env(env_vars),
        env_from: env_from(pod),
        resources: pod.resources.clone(),
        volume_mounts: Some(mounts),
        readiness_probe: Some(Probe {
            http_get: Some(http_probe("/ping", probe_port, https)),
            period_seconds: Some(5),
            timeout_seconds: Some(3),
            failure_threshold: Some(3),
            ..Probe::default()
        }),
        // A server may take `startupSeconds` to load its tables; a server stuck at start-up is
        // restarted then, not after a long liveness delay.
        startup_probe: Some(Probe {
            http_get: Some(http_probe("/ping", probe_port, https)),
            period_seconds: Some(2),
            timeout_seconds: Some(2),
            failure_threshold: Some(pod.startup_failure_threshold(SERVER_STARTUP_SECONDS)),
            ..Probe::default()
        }),
        liveness_probe: Some(Probe {
            http_get: Some(http_probe("/ping", probe_port, https)),
            period_seconds: Some(10),
            timeout_seconds: Some(5),
            failure_threshold: Some(6),
            ..Probe::default()
        }),
        security_context: Some(container_security(
            if spec.pod_security.clickhouse_capabilities {
                crate::api::CLICKHOUSE_CAPABILITIES
            } else {
                &[]
            },
        )),
        termination_message_policy: Some(super::LOG_ON_ERROR.into()),
        ..Container::default()
    };
    if spec.troubleshoot {
        container.command = Some(
            ["/bin/bash", "-c", TROUBLESHOOT_SCRIPT]
                .map(String::from)
                .to_vec(),
        );
        container.liveness_probe = None;
        container.startup_probe = None;
    }
    container
}

/// The server container's command under `spec.troubleshoot` (decision 56): the image's
/// entrypoint as usual, and when the server stops, its exit status in the log and a sleep
/// that keeps the container up; a stop signal stops the server and the shell.
pub const TROUBLESHOOT_SCRIPT: &str = "trap 'kill -TERM $server 2>/dev/null; wait $server; exit 0' TERM INT; \
/entrypoint.sh & server=$!; wait $server; status=$?; \
echo \"clickhouse-server exited with status $status; the container stays up for troubleshooting (spec.troubleshoot)\" >&2; \
sleep infinity & wait $!";

/// The server container's mounts and the pod's volumes: the data claim, `config.d` (the
/// common and the replica's ConfigMap plus `remote_servers` from the users Secret), `users.d`
/// (from the users Secret), scratch space for logs and `/tmp`, and with TLS the certificate
/// and CA Secrets that are set.
fn server_volumes(
    c: &Cluster<'_>,
    r: &ReplicaSpec,
    secret_files: &[&'static str],
) -> (Vec<VolumeMount>, Vec<Volume>) {
    let tls = &c.spec.tls;
    let mut mounts = vec![
        mount(DATA_VOLUME, names::SERVER_DATA_PATH),
        mount("config-d", names::SERVER_CONFIG_D_PATH),
        mount("users-d", names::SERVER_USERS_D_PATH),
        mount(names::LOGS_CLAIM, names::SERVER_LOG_PATH),
        mount("tmp", "/tmp"),
    ];
    mounts.extend(c.spec.storage.disks.iter().map(|d| {
        mount(
            &names::disk_claim(&d.name),
            names::disk_path(&d.name).trim_end_matches('/'),
        )
    }));
    let mut volumes = vec![
        projected(
            "config-d",
            vec![
                config_map_projection(names::common_config(c.name)),
                config_map_projection(names::replica_config(&r.name)),
                secret_file_projection(names::users_secret(c.name), names::REMOTE_SERVERS_FILE),
            ]
            .into_iter()
            .chain(
                secret_files
                    .iter()
                    .map(|f| secret_file_projection(names::users_secret(c.name), f)),
            )
            .chain(
                c.spec
                    .configuration
                    .secret_config_d_files()
                    .map(|(file, key)| secret_key_projection(key.name.clone(), &key.key, file)),
            )
            .collect(),
        ),
        projected(
            "users-d",
            std::iter::once(secret_file_projection(
                names::users_secret(c.name),
                names::USERS_FILE,
            ))
            .chain(c.spec.configuration.users_d_files().map(|(file, _)| {
                secret_key_projection(names::users_secret(c.name), &names::users_d_key(file), file)
            }))
            .chain(
                c.spec
                    .configuration
                    .secret_users_d_files()
                    .map(|(file, key)| secret_key_projection(key.name.clone(), &key.key, file)),
            )
            .collect(),
        ),
        empty_dir(names::LOGS_CLAIM),
        empty_dir("tmp"),
    ];
    if c.spec.storage.logs.is_some() {
        // the claim template of that name is the volume
        volumes.retain(|v| v.name != names::LOGS_CLAIM);
    }
    if tls.enabled {
        for (volume, secret, path) in [
            ("tls", &tls.server_cert_secret, names::SERVER_TLS_PATH),
            ("ca", &tls.ca_secret, names::SERVER_CA_PATH),
        ] {
            if let Some(secret) = secret {
                mounts.push(mount(volume, path));
                volumes.push(Volume {
                    name: volume.into(),
                    secret: Some(SecretVolumeSource {
                        secret_name: Some(secret.clone()),
                        default_mode: Some(super::SECRET_FILE_MODE),
                        ..SecretVolumeSource::default()
                    }),
                    ..Volume::default()
                });
            }
        }
    }
    if let Some(w) = server_web_identity(c) {
        mounts.push(VolumeMount {
            read_only: Some(true),
            ..mount(WEB_IDENTITY_VOLUME, crate::util::web_identity::TOKEN_DIR)
        });
        volumes.push(web_identity_volume(w));
    }
    (mounts, volumes)
}

/// The role the servers hold (decision 43): that of `spec.backup.destination`'s `webIdentity`.
/// A server that writes backups itself (23.8+) reads it from its environment through the named
/// collection with `use_environment_credentials`; its pods run under the ServiceAccount with the
/// token projected where the AWS SDKs look for it.
pub(crate) fn server_web_identity<'a>(c: &Cluster<'a>) -> Option<&'a crate::api::WebIdentity> {
    c.spec.backup.destination.as_ref()?.web_identity.as_ref()
}

/// The variables ClickHouse's S3 client reads for web identity (`AWS_DEFAULT_REGION` makes its
/// STS endpoint; it always asks the region's AWS STS over HTTPS, whatever `stsEndpoint` says).
fn web_identity_env(c: &Cluster<'_>) -> Vec<EnvVar> {
    let Some(w) = server_web_identity(c) else {
        return Vec::new();
    };
    let region = c
        .spec
        .backup
        .destination
        .as_ref()
        .map(|d| d.region().to_string())
        .unwrap_or_default();
    [
        ("AWS_ROLE_ARN", w.role_arn.clone()),
        (
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            format!(
                "{}/{}",
                crate::util::web_identity::TOKEN_DIR,
                crate::util::web_identity::TOKEN_FILE
            ),
        ),
        (
            "AWS_ROLE_SESSION_NAME",
            crate::util::web_identity::session_name(&format!("clickhouse-{}", c.name)),
        ),
        ("AWS_DEFAULT_REGION", region),
    ]
    .into_iter()
    .map(|(name, value)| EnvVar {
        name: name.into(),
        value: Some(value),
        ..EnvVar::default()
    })
    .collect()
}

/// A projected volume of `sources`.
fn projected(name: &str, sources: Vec<VolumeProjection>) -> Volume {
    Volume {
        name: name.into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(sources),
            default_mode: super::SECRET_VOLUMES
                .contains(&name)
                .then_some(super::SECRET_FILE_MODE),
            ..ProjectedVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// Every key of ConfigMap `name`, as files.
fn config_map_projection(name: String) -> VolumeProjection {
    VolumeProjection {
        config_map: Some(ConfigMapProjection {
            name,
            ..ConfigMapProjection::default()
        }),
        ..VolumeProjection::default()
    }
}

/// Key `key` of Secret `name`, as the file `path`.
fn secret_key_projection(name: String, key: &str, path: &str) -> VolumeProjection {
    VolumeProjection {
        secret: Some(SecretProjection {
            name,
            items: Some(vec![KeyToPath {
                key: key.into(),
                path: path.into(),
                ..KeyToPath::default()
            }]),
            ..SecretProjection::default()
        }),
        ..VolumeProjection::default()
    }
}

/// Key `file` of Secret `name`, as the file of that name.
fn secret_file_projection(name: String, file: &str) -> VolumeProjection {
    VolumeProjection {
        secret: Some(SecretProjection {
            name,
            items: Some(vec![KeyToPath {
                key: file.into(),
                path: file.into(),
                ..KeyToPath::default()
            }]),
            ..SecretProjection::default()
        }),
        ..VolumeProjection::default()
    }
}

/// The volume of the ServiceAccount token a pod exchanges for S3 credentials (decision 43).
pub const WEB_IDENTITY_VOLUME: &str = "aws-iam-token";

/// The projected ServiceAccount token with `w`'s audience, renewed by the kubelet, mounted at
/// [`sts::TOKEN_DIR`].
pub fn web_identity_volume(w: &crate::api::WebIdentity) -> Volume {
    use crate::util::web_identity as sts;
    use k8s_openapi::api::core::v1::{
        ProjectedVolumeSource, ServiceAccountTokenProjection, VolumeProjection,
    };
    Volume {
        name: WEB_IDENTITY_VOLUME.into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(vec![VolumeProjection {
                service_account_token: Some(ServiceAccountTokenProjection {
                    audience: Some(w.audience().to_string()),
                    expiration_seconds: Some(sts::TOKEN_SECONDS),
                    path: sts::TOKEN_FILE.into(),
                    ..ServiceAccountTokenProjection::default()
                }),
                ..VolumeProjection::default()
            }]),
            ..ProjectedVolumeSource::default()
        }),
        ..Volume::default()
    }
}
