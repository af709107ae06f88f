//! PURE: the Job that runs the backup agent for one shard (decision 26): on the node of the
//! shard's backup replica, with that replica's data volume mounted where the server has it, as
//! the server's user, in the operator's own image. Nothing is added to the server pods, so
//! taking a backup restarts no pod and a new operator version changes no server pod template.
//! The Job's environment is what the agent (`backup::agent`) is told; its [`Report`], in the
//! container's termination message, is what it answers.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext,
    PodSpec, PodTemplateSpec, SecretKeySelector, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use serde::{Deserialize, Serialize};

use crate::api::{AgentPodSettings, S3Destination};
use crate::model::names;
use crate::model::statefulset::{SERVER_CONTAINER, WEB_IDENTITY_VOLUME, web_identity_volume};
use crate::util::web_identity as sts;

/// What the agent reports when it ends (as JSON, in its termination message).
#[derive(Serialize, Deserialize, Debug, Default, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub parts_uploaded: u64,
    pub bytes_uploaded: u64,
    pub parts_reused: u64,
    pub bytes_reused: u64,
    /// Restore: parts attached on the backup replica, and their bytes downloaded.
    pub parts_attached: u64,
    #[serde(default)]
    pub bytes_downloaded: u64,
}

/// Label of every Job and pod of a backup or restore: the resource's name.
pub const BACKUP_LABEL: &str = "clickhouse.com/backup";
/// Name of the agent's container.
pub const AGENT_CONTAINER: &str = "agent";
/// Annotation of an agent Job: the uid of the backup replica's pod it was started beside.
pub const SERVER_POD_UID: &str = "clickhouse.com/server-pod-uid";
/// Annotation of an agent Job: the server container's restart count when it was started.
pub const SERVER_RESTARTS: &str = "clickhouse.com/server-restarts";

/// What the agent does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Backup,
    Restore,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Backup => "backup",
            Mode::Restore => "restore",
        }
    }
}

/// Everything one shard's Job needs.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentJob {
    pub mode: Mode,
    /// The ClickHouseBackup (or restore) it belongs to, its owner.
    pub owner: OwnerReference,
    pub namespace: String,
    pub cluster: String,
    /// The cluster's DNS domain (`spec.clusterDomain`).
    pub cluster_domain: String,
    /// The backup written (backup) or read (restore).
    pub backup: String,
    pub shard: i32,
    /// The shard's backup replica, where every statement and file access runs.
    pub replica: String,
    /// The shard's other replicas (restore: the schema is created there too).
    pub peers: Vec<String>,
    /// Where and as whom the agent runs: beside the backup replica's pod.
    pub placement: Placement,
    pub image: String,
    pub destination: S3Destination,
    pub prefix: String,
    pub base: Option<String>,
    pub tables: Vec<String>,
    pub into_non_empty: bool,
    /// Backup: the further disks of the replica (`spec.storage.disks`), mounted where the
    /// server has them, so that the parts a freeze snapshots on them are read too.
    pub disks: Vec<String>,
    /// Restore: tables, views and dictionaries reaching outside the cluster are allowed.
    pub allow_external: bool,
    /// The cluster's settings of agent pods (`spec.backup.agent`).
    pub pod: AgentPodSettings,
    /// How the agent talks to the servers, as the operator does.
    pub tls: AgentTls,
}

/// How the agent talks to the servers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum AgentTls {
    /// Plain HTTP (the cluster has no TLS).
    #[default]
    Off,
    /// HTTPS, the certificate not verified (TLS without a CA: encrypted, not authenticated).
    Unverified,
    /// HTTPS, verified by host name with `ca.crt` of this Secret.
    Verified { ca_secret: String },
}

impl AgentJob {
    /// How the agent talks to `cluster`'s servers.
    pub fn tls_of(cluster: &crate::api::ClickHouseCluster) -> AgentTls {
        let tls = &cluster.spec.tls;
        match (&tls.enabled, &tls.ca_secret) {
            (false, _) => AgentTls::Off,
            (true, None) => AgentTls::Unverified,
            (true, Some(ca)) => AgentTls::Verified {
                ca_secret: ca.clone(),
            },
        }
    }
}

/// The backup replica pod's node and security contexts: the agent runs on that node, as the
/// server's user (it reads and writes the server's files).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Placement {
    pub node: Option<String>,
    pub pod_security: Option<PodSecurityContext>,
    pub container_security: Option<SecurityContext>,
    /// The server pod's uid and its server container's restart count: a Job whose server
    /// changed under it is not trusted (see [`server_changed`]).
    pub server: Option<(String, i32)>,
}

impl Placement {
    /// Beside `server`, the backup replica's pod.
    pub fn beside(server: &Pod) -> Placement {
        let spec = server.spec.clone().unwrap_or_default();
        Placement {
            node: spec.node_name.clone(),
            pod_security: spec.security_context.clone(),
            // the server's, without capabilities it may keep (`clickhouseCapabilities`): the
            // agent copies files and needs none
            container_security: spec
                .containers
                .first()
                .and_then(|c| c.security_context.clone())
                .map(|mut s| {
                    if let Some(caps) = &mut s.capabilities {
                        caps.add = None;
                    }
                    s
                }),
            server: server
                .metadata
                .uid
                .clone()
                .map(|uid| (uid, server_restarts(server))),
        }
    }
}

/// The restart count of the server container of `pod`.
fn server_restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.name == SERVER_CONTAINER)
        .map(|c| c.restart_count)
        .sum()
}

/// Why the server an agent Job was started beside is no longer the one it worked with: its pod
/// gone, replaced, being deleted, or its server restarted. A backup whose server changed under it
/// is not trusted, even when its agent reports success (S0-04, decision 26: a backup replica that
/// dies mid-backup fails the backup).
pub fn server_changed(job: &Job, server: Option<&Pod>) -> Option<String> {
    let annotations = job.metadata.annotations.as_ref()?;
    let uid = annotations.get(SERVER_POD_UID)?;
    let restarts: i32 = annotations.get(SERVER_RESTARTS)?.parse().ok()?;
    let Some(pod) = server else {
        return Some("its pod is gone".into());
    };
    if pod.metadata.uid.as_ref() != Some(uid) {
        return Some("its pod was replaced".into());
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return Some("its pod is being deleted".into());
    }
    let now = server_restarts(pod);
    (now != restarts).then(|| format!("its server restarted ({restarts} → {now} restarts)"))
}

/// `<owner>-<mode>-shard-<n>`, within a DNS label.
pub fn job_name(owner: &str, mode: Mode, shard: i32) -> String {
    let suffix = format!("-{}-{shard}", mode.as_str());
    let keep = 63 - suffix.len();
    let head: String = owner.chars().take(keep).collect();
    format!("{}{suffix}", head.trim_end_matches('-'))
}

fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..EnvVar::default()
    }
}

fn secret_env(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

impl AgentJob {
    pub fn build(&self) -> Job {
        let name = job_name(&self.owner.name, self.mode, self.shard);
        let labels = BTreeMap::from([
            (BACKUP_LABEL.to_string(), self.owner.name.clone()),
            (
                "app.kubernetes.io/name".to_string(),
                "clickhouse-backup-agent".to_string(),
            ),
        ]);
        let (mounts, volumes) = self.volumes();
        let container = Container {
            name: AGENT_CONTAINER.into(),
            image: Some(self.image.clone()),
            args: Some(vec!["backup-agent".into()]),
            env: Some(self.agent_env()),
            resources: self.pod.resources.clone(),
            volume_mounts: Some(mounts),
            security_context: self.placement.container_security.clone(),
            termination_message_policy: Some("FallbackToLogsOnError".into()),
            ..Container::default()
        };
        Job {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(self.namespace.clone()),
                labels: Some(labels.clone()),
                annotations: self.placement.server.as_ref().map(|(uid, restarts)| {
                    BTreeMap::from([
                        (SERVER_POD_UID.to_string(), uid.clone()),
                        (SERVER_RESTARTS.to_string(), restarts.to_string()),
                    ])
                }),
                owner_references: Some(vec![self.owner.clone()]),
                ..ObjectMeta::default()
            },
            spec: Some(JobSpec {
                backoff_limit: Some(0),
                active_deadline_seconds: Some(6 * 3600),
                template: self.pod_template(&labels, container, volumes),
                ..JobSpec::default()
            }),
            ..Job::default()
        }
    }

    /// The agent's environment: what it is to do, where its servers and the bucket are, and
    /// then the user's variables.
    fn agent_env(&self) -> Vec<EnvVar> {
        let hosts: Vec<String> = std::iter::once(&self.replica)
            .chain(&self.peers)
            .map(|r| names::replica_host(&self.cluster, &self.namespace, &self.cluster_domain, r))
            .collect();
        let d = &self.destination;
        let mut envs = vec![
            env("AGENT_MODE", self.mode.as_str()),
            env("BACKUP_NAME", &self.backup),
            env("SHARD", self.shard.to_string()),
            env("REPLICA", &self.replica),
            env("CH_HOSTS", hosts.join(",")),
            env(
                "CH_PORT",
                if self.tls != AgentTls::Off {
                    names::HTTPS_PORT
                } else {
                    names::HTTP_PORT
                }
                .to_string(),
            ),
            env("CH_USER", names::OPERATOR_USER),
            secret_env(
                "CH_PASSWORD",
                &names::operator_secret(&self.cluster),
                names::OPERATOR_PASSWORD_KEY,
            ),
            env("DATA_DIR", names::SERVER_DATA_PATH),
            env("S3_ENDPOINT", &d.endpoint),
            env("S3_BUCKET", &d.bucket),
            env("S3_PREFIX", &self.prefix),
            env("S3_COLLECTION", super::S3Collection::name_of(d)),
            env(
                "S3_REGION",
                d.region.clone().unwrap_or_else(|| "us-east-1".into()),
            ),
        ];
        envs.extend(self.s3_credentials_env());
        match &self.tls {
            AgentTls::Off => {}
            AgentTls::Unverified => envs.push(env("CH_TLS", "unverified")),
            AgentTls::Verified { ca_secret } => {
                envs.push(secret_env("CH_TLS_CA", ca_secret, "ca.crt"));
            }
        }
        if let Some(b) = &self.base {
            envs.push(env("BASE_BACKUP", b));
        }
        if !self.tables.is_empty() {
            envs.push(env("TABLES", self.tables.join(",")));
        }
        if self.into_non_empty {
            envs.push(env("INTO_NON_EMPTY", "true"));
        }
        if self.allow_external {
            envs.push(env("ALLOW_EXTERNAL_SOURCES", "true"));
        }
        if !self.disks.is_empty() {
            let paths: Vec<String> = self.disks.iter().map(|d| names::disk_path(d)).collect();
            envs.push(env("DISK_PATHS", paths.join(",")));
        }
        // the user's variables after the agent's own (validation refuses overriding them)
        envs.extend(
            self.pod
                .env
                .iter()
                .filter(|e| !AgentPodSettings::owns_env(&e.name))
                .cloned(),
        );
        envs
    }

    /// How the agent signs in to the bucket: the destination's keys, or web identity.
    fn s3_credentials_env(&self) -> Vec<EnvVar> {
        let d = &self.destination;
        match &d.web_identity {
            None => vec![
                secret_env("S3_ACCESS_KEY_ID", &d.secret_name, d.access_key_id_key()),
                secret_env(
                    "S3_SECRET_ACCESS_KEY",
                    &d.secret_name,
                    d.secret_access_key_key(),
                ),
            ],
            // decision 43: the variables the AWS SDKs read for web identity, the token projected
            Some(w) => vec![
                env("AWS_ROLE_ARN", &w.role_arn),
                env(
                    "AWS_WEB_IDENTITY_TOKEN_FILE",
                    format!("{}/{}", sts::TOKEN_DIR, sts::TOKEN_FILE),
                ),
                env(
                    "AWS_ROLE_SESSION_NAME",
                    sts::session_name(&format!("{}-{}", self.backup, self.shard)),
                ),
                env("AWS_STS_REGIONAL_ENDPOINTS", "regional"),
                env("AWS_ENDPOINT_URL_STS", w.sts_endpoint(d.region())),
                env("S3_SERVICE_ACCOUNT", &w.service_account_name),
            ],
        }
    }

    /// The agent's mounts and the pod's volumes: the replica's data volume, the web identity
    /// token, and the replica's volumes of extra disks.
    fn volumes(&self) -> (Vec<VolumeMount>, Vec<Volume>) {
        let mut mounts = vec![VolumeMount {
            name: "data".into(),
            mount_path: names::SERVER_DATA_PATH.into(),
            ..VolumeMount::default()
        }];
        let mut volumes = vec![Volume {
            name: "data".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: names::data_pvc(&self.replica),
                read_only: Some(false),
            }),
            ..Volume::default()
        }];
        if let Some(w) = &self.destination.web_identity {
            mounts.push(VolumeMount {
                name: WEB_IDENTITY_VOLUME.into(),
                mount_path: sts::TOKEN_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            });
            volumes.push(web_identity_volume(w));
        }
        for d in &self.disks {
            mounts.push(VolumeMount {
                name: names::disk_claim(d),
                mount_path: names::disk_path(d).trim_end_matches('/').to_string(),
                ..VolumeMount::default()
            });
            volumes.push(Volume {
                name: names::disk_claim(d),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: names::disk_pvc(d, &self.replica),
                    read_only: Some(false),
                }),
                ..Volume::default()
            });
        }
        (mounts, volumes)
    }

    /// The agent's pod, with the Job's `labels` under the user's.
    fn pod_template(
        &self,
        labels: &BTreeMap<String, String>,
        container: Container,
        volumes: Vec<Volume>,
    ) -> PodTemplateSpec {
        // the user's labels, under the operator's own
        let mut pod_labels = self.pod.labels.clone();
        pod_labels.extend(labels.clone());
        PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(pod_labels),
                annotations: (!self.pod.annotations.is_empty())
                    .then(|| self.pod.annotations.clone()),
                ..ObjectMeta::default()
            }),
            spec: Some(PodSpec {
                image_pull_secrets: (!self.pod.image_pull_secrets.is_empty())
                    .then(|| self.pod.image_pull_secrets.clone()),
                tolerations: (!self.pod.tolerations.is_empty())
                    .then(|| self.pod.tolerations.clone()),
                priority_class_name: self.pod.priority_class_name.clone(),
                restart_policy: Some("Never".into()),
                node_name: self.placement.node.clone(),
                service_account_name: self
                    .destination
                    .web_identity
                    .as_ref()
                    .map(|w| w.service_account_name.clone()),
                // the agent needs no Kubernetes API: only the projected STS token
                automount_service_account_token: Some(false),
                security_context: self.placement.pod_security.clone(),
                containers: vec![container],
                volumes: Some(volumes),
                ..PodSpec::default()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> AgentJob {
        AgentJob {
            cluster_domain: "cluster.local".into(),
            mode: Mode::Backup,
            owner: OwnerReference {
                api_version: "clickhouse.com/v1alpha1".into(),
                kind: "ClickHouseBackup".into(),
                name: "nightly".into(),
                uid: "u1".into(),
                controller: Some(true),
                ..OwnerReference::default()
            },
            namespace: "ns".into(),
            cluster: "c1".into(),
            backup: "nightly".into(),
            shard: 1,
            replica: "c1-1-0".into(),
            peers: vec!["c1-1-1".into()],
            placement: Placement {
                node: Some("node-a".into()),
                ..Placement::default()
            },
            image: "example/clickhouse-operator:1".into(),
            destination: S3Destination {
                endpoint: "http://s3:8333".into(),
                bucket: "b1".into(),
                secret_name: "s3-creds".into(),
                ..S3Destination::default()
            },
            prefix: "ns/c1".into(),
            base: None,
            tables: vec![],
            into_non_empty: false,
            disks: vec![],
            allow_external: false,
            pod: AgentPodSettings::default(),
            tls: AgentTls::Off,
        }
    }

    /// Decision 43: with webIdentity the agent runs under the named ServiceAccount with no
    /// Kubernetes API token, its token projected with the destination's audience for an hour at
    /// the path EKS uses, the role and STS endpoint in the variables the AWS SDKs read, and no
    /// static key from any Secret.
    #[test]
    fn a_web_identity_agent_gets_a_projected_token_and_no_static_key() {
        let mut a = job();
        a.destination = S3Destination {
            endpoint: "https://s3.eu-west-1.amazonaws.com".into(),
            bucket: "b1".into(),
            region: Some("eu-west-1".into()),
            web_identity: Some(crate::api::WebIdentity {
                role_arn: "arn:aws:iam::123456789012:role/backups".into(),
                service_account_name: "ch-backups".into(),
                audience: None,
                sts_endpoint: None,
            }),
            ..S3Destination::default()
        };
        let j = a.build();
        let pod = j.spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some("ch-backups"));
        assert_eq!(pod.automount_service_account_token, Some(false));
        let c = &pod.containers[0];
        let envs = c.env.clone().unwrap();
        let get = |n: &str| {
            envs.iter()
                .find(|e| e.name == n)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(
            get("AWS_ROLE_ARN").as_deref(),
            Some("arn:aws:iam::123456789012:role/backups")
        );
        assert_eq!(
            get("AWS_WEB_IDENTITY_TOKEN_FILE").as_deref(),
            Some("/var/run/secrets/eks.amazonaws.com/serviceaccount/token")
        );
        assert_eq!(
            get("AWS_ENDPOINT_URL_STS").as_deref(),
            Some("https://sts.eu-west-1.amazonaws.com")
        );
        assert_eq!(get("AWS_ROLE_SESSION_NAME").as_deref(), Some("nightly-1"));
        assert!(
            envs.iter().all(|e| e
                .value_from
                .as_ref()
                .and_then(|v| v.secret_key_ref.as_ref())
                .is_none_or(|s| s.name != "s3-creds" && !s.key.contains("ccess"))),
            "{envs:?}"
        );
        assert!(
            !envs
                .iter()
                .any(|e| e.name.starts_with("S3_ACCESS") || e.name.starts_with("S3_SECRET"))
        );
        let mount = c
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.name == WEB_IDENTITY_VOLUME)
            .unwrap();
        assert_eq!(
            mount.mount_path,
            "/var/run/secrets/eks.amazonaws.com/serviceaccount"
        );
        assert_eq!(mount.read_only, Some(true));
        let volume = pod
            .volumes
            .unwrap()
            .into_iter()
            .find(|v| v.name == WEB_IDENTITY_VOLUME)
            .unwrap();
        let token = volume.projected.unwrap().sources.unwrap()[0]
            .service_account_token
            .clone()
            .unwrap();
        assert_eq!(token.audience.as_deref(), Some("sts.amazonaws.com"));
        assert_eq!(token.expiration_seconds, Some(3600));
        assert_eq!(token.path, "token");
        // static keys: no ServiceAccount, no token, the Secret's keys
        let plain = job().build().spec.unwrap().template.spec.unwrap();
        assert!(plain.service_account_name.is_none());
        assert!(plain.volumes.unwrap().iter().all(|v| v.projected.is_none()));
        let plain_env = plain.containers[0].env.clone().unwrap();
        assert!(plain_env.iter().any(|e| e.name == "S3_ACCESS_KEY_ID"));
        assert!(!plain_env.iter().any(|e| e.name.starts_with("AWS_")));
    }

    /// Decision 26: with TLS and a CA the agent talks HTTPS to the servers and verifies them with
    /// the CA from its Secret (never inline); without, plain HTTP on the HTTP port.
    #[test]
    fn the_agent_verifies_tls_servers_with_the_clusters_ca() {
        let port = |j: &Job| {
            let envs = j
                .spec
                .as_ref()
                .unwrap()
                .template
                .spec
                .as_ref()
                .unwrap()
                .containers[0]
                .env
                .clone()
                .unwrap();
            let get = |n: &str| envs.iter().find(|e| e.name == n).cloned();
            (
                get("CH_PORT").and_then(|e| e.value),
                get("CH_TLS_CA").and_then(|e| e.value_from?.secret_key_ref),
            )
        };
        let (plain, no_ca) = port(&job().build());
        assert_eq!(plain, Some(names::HTTP_PORT.to_string()));
        assert!(no_ca.is_none());
        let mut a = job();
        a.tls = AgentTls::Verified {
            ca_secret: "c1-ca".into(),
        };
        let (secure, ca) = port(&a.build());
        assert_eq!(secure, Some(names::HTTPS_PORT.to_string()));
        let ca = ca.unwrap();
        assert_eq!((ca.name.as_str(), ca.key.as_str()), ("c1-ca", "ca.crt"));

        let mut cluster: crate::api::ClickHouseCluster =
            serde_json::from_value(serde_json::json!({
                "apiVersion": "clickhouse.com/v1alpha1", "kind": "ClickHouseCluster",
                "metadata": {"name": "c1"}, "spec": {"tls": {"enabled": true, "caSecret": "c1-ca"}}
            }))
            .unwrap();
        assert_eq!(
            AgentJob::tls_of(&cluster),
            AgentTls::Verified {
                ca_secret: "c1-ca".into()
            }
        );
        cluster.spec.tls.ca_secret = None;
        assert_eq!(AgentJob::tls_of(&cluster), AgentTls::Unverified);
        let mut b = job();
        b.tls = AgentTls::Unverified;
        let (port, ca) = port(&b.build());
        assert_eq!(port, Some(names::HTTPS_PORT.to_string()), "never in clear");
        assert!(ca.is_none());
        cluster.spec.tls.enabled = false;
        assert_eq!(AgentJob::tls_of(&cluster), AgentTls::Off);
    }

    /// Decision 26: the agent runs beside the backup replica (its node, its volume), owned by
    /// the backup, never retried by the Job, with every credential from a Secret.
    #[test]
    fn the_agent_job_runs_beside_the_backup_replica_with_secrets_only_by_reference() {
        let j = job().build();
        let spec = j.spec.as_ref().unwrap();
        assert_eq!(spec.backoff_limit, Some(0));
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.node_name.as_deref(), Some("node-a"));
        assert_eq!(
            pod.volumes.as_ref().unwrap()[0]
                .persistent_volume_claim
                .as_ref()
                .unwrap()
                .claim_name,
            names::data_pvc("c1-1-0")
        );
        let envs = pod.containers[0].env.as_ref().unwrap();
        let get = |n: &str| envs.iter().find(|e| e.name == n).unwrap();
        assert!(
            get("CH_HOSTS")
                .value
                .as_ref()
                .unwrap()
                .starts_with("c1-1-0-0.")
        );
        for secret in ["CH_PASSWORD", "S3_ACCESS_KEY_ID", "S3_SECRET_ACCESS_KEY"] {
            assert!(get(secret).value.is_none(), "{secret} is not inline");
            assert!(get(secret).value_from.is_some());
        }
        assert_eq!(
            j.metadata.owner_references.as_ref().unwrap()[0].name,
            "nightly"
        );
        assert_eq!(j.metadata.name.as_deref(), Some("nightly-backup-1"));
    }

    #[test]
    fn job_names_stay_dns_labels() {
        let long = "x".repeat(80);
        let n = job_name(&long, Mode::Restore, 12);
        assert!(n.len() <= 63, "{n}");
        assert!(n.ends_with("-restore-12"));
    }

    fn server_pod(uid: &str, restarts: i32) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c1-1-0-0", "uid": uid},
            "spec": {"nodeName": "node-a", "containers": [{"name": SERVER_CONTAINER}]},
            "status": {"containerStatuses": [
                {"name": SERVER_CONTAINER, "restartCount": restarts, "ready": true,
                 "image": "", "imageID": ""},
                {"name": "sidecar", "restartCount": 7, "ready": true, "image": "", "imageID": ""}
            ]}
        }))
        .unwrap()
    }

    /// S0-04, decision 26: a backup replica that dies mid-backup fails the backup. The Job keeps
    /// the identity of the server it started beside; any change of it is named, a sidecar's
    /// restart is not one.
    #[test]
    fn a_job_knows_when_its_server_was_replaced_restarted_or_deleted() {
        let mut a = job();
        a.placement = Placement::beside(&server_pod("uid-1", 2));
        let j = a.build();
        assert_eq!(
            j.spec
                .as_ref()
                .unwrap()
                .template
                .spec
                .as_ref()
                .unwrap()
                .node_name
                .as_deref(),
            Some("node-a")
        );
        assert_eq!(server_changed(&j, Some(&server_pod("uid-1", 2))), None);
        assert_eq!(server_changed(&j, None).as_deref(), Some("its pod is gone"));
        assert_eq!(
            server_changed(&j, Some(&server_pod("uid-2", 0))).as_deref(),
            Some("its pod was replaced")
        );
        assert_eq!(
            server_changed(&j, Some(&server_pod("uid-1", 3))).as_deref(),
            Some("its server restarted (2 → 3 restarts)")
        );
        let mut deleting = server_pod("uid-1", 2);
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        assert_eq!(
            server_changed(&j, Some(&deleting)).as_deref(),
            Some("its pod is being deleted")
        );
        // a Job written before the identity was recorded is judged by its agent alone
        assert_eq!(server_changed(&job().build(), None), None);
    }

    /// Decision 26: the cluster's agent settings reach the agent's pod (pull secrets, tolerations,
    /// resources, priority class, labels under the operator's own, annotations, environment
    /// after the agent's own), and every variable the builder sets is one the settings cannot.
    #[test]
    fn agent_pods_take_the_clusters_agent_settings() {
        let mut a = job();
        a.pod = serde_json::from_value(serde_json::json!({
            "imagePullSecrets": [{"name": "registry"}],
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoExecute"}],
            "resources": {"limits": {"memory": "512Mi"}},
            "priorityClassName": "backups",
            "env": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}, {"name": "S3_ENDPOINT", "value": "http://evil"}],
            "labels": {"team": "db", "clickhouse.com/backup": "forged"},
            "annotations": {"example.com/a": "b"}
        }))
        .unwrap();
        let j = a.build();
        let template = j.spec.unwrap().template;
        let labels = template.metadata.as_ref().unwrap().labels.clone().unwrap();
        assert_eq!(labels["team"], "db");
        assert_eq!(labels[BACKUP_LABEL], "nightly", "the operator's label wins");
        assert_eq!(
            template.metadata.unwrap().annotations.unwrap()["example.com/a"],
            "b"
        );
        let pod = template.spec.unwrap();
        assert_eq!(pod.image_pull_secrets.unwrap()[0].name, "registry");
        assert_eq!(
            pod.tolerations.unwrap()[0].key.as_deref(),
            Some("dedicated")
        );
        assert_eq!(pod.priority_class_name.as_deref(), Some("backups"));
        let c = &pod.containers[0];
        assert!(
            c.resources
                .as_ref()
                .unwrap()
                .limits
                .as_ref()
                .unwrap()
                .contains_key("memory")
        );
        let envs = c.env.clone().unwrap();
        let endpoint: Vec<_> = envs.iter().filter(|e| e.name == "S3_ENDPOINT").collect();
        assert_eq!(endpoint.len(), 1, "never overridden");
        assert_eq!(endpoint[0].value.as_deref(), Some("http://s3:8333"));
        assert!(envs.iter().any(|e| e.name == "HTTPS_PROXY"));
        let mut full = job();
        full.tls = AgentTls::Verified {
            ca_secret: "ca".into(),
        };
        full.base = Some("b0".into());
        full.tables = vec!["db".into()];
        full.into_non_empty = true;
        full.allow_external = true;
        full.disks = vec!["cold".into()];
        for e in full.build().spec.unwrap().template.spec.unwrap().containers[0]
            .env
            .clone()
            .unwrap()
        {
            assert!(
                AgentPodSettings::owns_env(&e.name),
                "{} is not in OWN_ENV",
                e.name
            );
        }
    }
}
