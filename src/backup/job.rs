//! The Job that runs the backup agent for one shard (decision 26): on the node of the shard's
//! backup replica, with that replica's data volume mounted where the server has it, as the
//! server's user, in the operator's own image. Nothing is added to the server pods, so taking
//! a backup restarts no pod and a new operator version changes no server pod template.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, PersistentVolumeClaimVolumeSource, PodSecurityContext,
    PodSpec, PodTemplateSpec, SecretKeySelector, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::store::{ACCESS_KEY_ID, SECRET_ACCESS_KEY};
use crate::api::S3Destination;
use crate::model::names;

/// Label of every Job and pod of a backup or restore: the resource's name.
pub const BACKUP_LABEL: &str = "clickhouse.com/backup";
/// Name of the agent's container.
pub const AGENT_CONTAINER: &str = "agent";

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
#[derive(Clone, Debug)]
pub struct AgentJob {
    pub mode: Mode,
    /// The ClickHouseBackup (or restore) it belongs to, its owner.
    pub owner: OwnerReference,
    pub namespace: String,
    pub cluster: String,
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
}

/// The backup replica pod's node and security contexts: the agent runs on that node, as the
/// server's user (it reads and writes the server's files).
#[derive(Clone, Debug, Default)]
pub struct Placement {
    pub node: Option<String>,
    pub pod_security: Option<PodSecurityContext>,
    pub container_security: Option<SecurityContext>,
}

impl Placement {
    /// Beside the pod whose spec this is.
    pub fn beside(server: &PodSpec) -> Placement {
        Placement {
            node: server.node_name.clone(),
            pod_security: server.security_context.clone(),
            container_security: server
                .containers
                .first()
                .and_then(|c| c.security_context.clone()),
        }
    }
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
        let hosts: Vec<String> = std::iter::once(&self.replica)
            .chain(&self.peers)
            .map(|r| names::replica_host(&self.cluster, &self.namespace, r))
            .collect();
        let d = &self.destination;
        let mut envs = vec![
            env("AGENT_MODE", self.mode.as_str()),
            env("BACKUP_NAME", &self.backup),
            env("SHARD", self.shard.to_string()),
            env("REPLICA", &self.replica),
            env("CH_HOSTS", hosts.join(",")),
            env("CH_PORT", names::HTTP_PORT.to_string()),
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
            env(
                "S3_REGION",
                d.region.clone().unwrap_or_else(|| "us-east-1".into()),
            ),
            secret_env(
                "S3_ACCESS_KEY_ID",
                &d.secret_name,
                d.access_key_id_key.as_deref().unwrap_or(ACCESS_KEY_ID),
            ),
            secret_env(
                "S3_SECRET_ACCESS_KEY",
                &d.secret_name,
                d.secret_access_key_key
                    .as_deref()
                    .unwrap_or(SECRET_ACCESS_KEY),
            ),
        ];
        if let Some(b) = &self.base {
            envs.push(env("BASE_BACKUP", b));
        }
        if !self.tables.is_empty() {
            envs.push(env("TABLES", self.tables.join(",")));
        }
        if self.into_non_empty {
            envs.push(env("INTO_NON_EMPTY", "true"));
        }
        let container = Container {
            name: AGENT_CONTAINER.into(),
            image: Some(self.image.clone()),
            args: Some(vec!["backup-agent".into()]),
            env: Some(envs),
            volume_mounts: Some(vec![VolumeMount {
                name: "data".into(),
                mount_path: names::SERVER_DATA_PATH.into(),
                ..VolumeMount::default()
            }]),
            security_context: self.placement.container_security.clone(),
            termination_message_policy: Some("FallbackToLogsOnError".into()),
            ..Container::default()
        };
        Job {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(self.namespace.clone()),
                labels: Some(labels.clone()),
                owner_references: Some(vec![self.owner.clone()]),
                ..ObjectMeta::default()
            },
            spec: Some(JobSpec {
                backoff_limit: Some(0),
                active_deadline_seconds: Some(6 * 3600),
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(labels),
                        ..ObjectMeta::default()
                    }),
                    spec: Some(PodSpec {
                        restart_policy: Some("Never".into()),
                        node_name: self.placement.node.clone(),
                        automount_service_account_token: Some(false),
                        security_context: self.placement.pod_security.clone(),
                        containers: vec![container],
                        volumes: Some(vec![Volume {
                            name: "data".into(),
                            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                                claim_name: names::data_pvc(&self.replica),
                                read_only: Some(false),
                            }),
                            ..Volume::default()
                        }]),
                        ..PodSpec::default()
                    }),
                },
                ..JobSpec::default()
            }),
            ..Job::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> AgentJob {
        AgentJob {
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
        }
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
}
