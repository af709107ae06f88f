//! PURE: the decisions of backups and restores (decision 26), the same shape as a cluster's:
//! the controller observes ([`Shard`], [`Agent`], the cluster, Ready pods), [`take::decide`]
//! or [`restore::decide`] says what to do next ([`Plan`]: the status if every step goes well,
//! the events, the [`Step`]s), the controller executes the steps and a pure `report` turns
//! what they found ([`Outcome`]) into the status written. Nothing here performs I/O, so every
//! rule is tested with plain data, and the state machines are simulated pass by pass with
//! operator restarts in between (`tests.rs`).
//!
//! - [`destination`]: which bucket and which credentials a backup or restore may use;
//! - [`take`]: taking a backup, `New → Starting → Running → Succeeded | Failed`;
//! - [`restore`]: `New → Running → Succeeded | Failed`;
//! - [`schedule`]: when a schedule's backup is due, and what its retention removes.

pub mod destination;
pub mod restore;
pub mod schedule;
pub mod take;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;

use crate::api::S3Destination;
use crate::model::job::{AgentJob, Mode, Placement, Report, server_changed};
use crate::model::manifest::Manifest;
use crate::plan::PlannedEvent;

/// How long a new backup or restore waits for a Ready backup replica in every shard before it
/// fails.
pub const WAIT_FOR_REPLICAS: Duration = Duration::from_secs(600);

/// How long an agent's pod may fail to start (image, configuration, scheduling) before its
/// backup or restore fails.
pub const AGENT_START_GRACE: i64 = 120;

/// How soon a pass looks again while agents run (their Jobs' changes trigger passes too).
pub const FOLLOW: Duration = Duration::from_secs(5);

/// Why a backup or restore failed: the status's `reason` and the metric's label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureReason {
    /// The cluster was deleted while the backup or restore ran.
    ClusterDeleted,
    /// The cluster is paused: nothing runs.
    ClusterPaused,
    /// No destination, one the cluster does not name, or an invalid one.
    Destination,
    /// The destination's Secret is missing, does not opt in, lacks a key or is the cluster's own.
    Credentials,
    /// The bucket refused, does not exist or does not answer.
    Bucket,
    /// No Ready backup replica in some shard within [`WAIT_FOR_REPLICAS`].
    NoBackupReplica,
    /// A shard's backup replica was removed from the cluster while it ran.
    ReplicaRemoved,
    /// A shard's server pod was deleted, replaced or restarted under its agent.
    ServerChanged,
    /// An agent's pod could not start within [`AGENT_START_GRACE`].
    AgentCannotStart,
    /// An agent reported a failure (its message says which).
    AgentFailed,
    /// Restore: the backup failed, is not complete, or is not in the bucket.
    BackupNotUsable,
    /// Restore: the backup's manifest breaks a rule (`backup::checks`).
    ManifestRefused,
    /// Restore: the backup has another number of shards than the cluster.
    ShardCount,
    /// The cluster is Keeper-only (`spec.shards` 0, decision 55): it has no tables.
    KeeperOnly,
}

impl FailureReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::ClusterDeleted => "ClusterDeleted",
            FailureReason::ClusterPaused => "ClusterPaused",
            FailureReason::Destination => "Destination",
            FailureReason::Credentials => "Credentials",
            FailureReason::Bucket => "Bucket",
            FailureReason::NoBackupReplica => "NoBackupReplica",
            FailureReason::ReplicaRemoved => "ReplicaRemoved",
            FailureReason::ServerChanged => "ServerChanged",
            FailureReason::AgentCannotStart => "AgentCannotStart",
            FailureReason::AgentFailed => "AgentFailed",
            FailureReason::BackupNotUsable => "BackupNotUsable",
            FailureReason::ManifestRefused => "ManifestRefused",
            FailureReason::ShardCount => "ShardCount",
            FailureReason::KeeperOnly => "KeeperOnly",
        }
    }

    /// Every reason, for the metric's series and the tests.
    pub const ALL: [FailureReason; 14] = [
        FailureReason::ClusterDeleted,
        FailureReason::ClusterPaused,
        FailureReason::Destination,
        FailureReason::Credentials,
        FailureReason::Bucket,
        FailureReason::NoBackupReplica,
        FailureReason::ReplicaRemoved,
        FailureReason::ServerChanged,
        FailureReason::AgentCannotStart,
        FailureReason::AgentFailed,
        FailureReason::BackupNotUsable,
        FailureReason::ManifestRefused,
        FailureReason::ShardCount,
        FailureReason::KeeperOnly,
    ];
}

/// A failure: why, and what the user reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub reason: FailureReason,
    pub message: String,
}

impl Failure {
    pub fn new(reason: FailureReason, message: impl Into<String>) -> Failure {
        Failure {
            reason,
            message: message.into(),
        }
    }
}

/// Where one shard's agent stands, as observed.
#[derive(Clone, Debug, PartialEq)]
pub enum Agent {
    /// No Job yet.
    Missing,
    /// Its pod is starting or at work.
    Running,
    /// Its pod cannot start, past [`AGENT_START_GRACE`]: why.
    Stuck(String),
    /// Its server pod was deleted, replaced or restarted before it finished: how.
    ServerChanged(String),
    /// It succeeded, with its report.
    Done(Report),
    /// It failed: its report's error, or what is known.
    Failed(String),
}

/// One shard's agent as a Job, its pods and the server pod it was started beside show it.
pub fn agent(job: Option<&Job>, pods: &[Pod], server: Option<&Pod>, now: Timestamp) -> Agent {
    let Some(job) = job else {
        return Agent::Missing;
    };
    if let Some(why) = server_changed(job, server) {
        return Agent::ServerChanged(why);
    }
    let st = job.status.clone().unwrap_or_default();
    let succeeded = st.succeeded.unwrap_or(0) > 0;
    if succeeded || st.failed.unwrap_or(0) > 0 {
        let message = pods.iter().find_map(termination_message);
        return match outcome(message.as_deref()) {
            Ok(r) if succeeded => Agent::Done(r),
            Ok(_) => Agent::Failed("its Job failed".into()),
            Err(e) => Agent::Failed(e),
        };
    }
    match pods.iter().find_map(|p| stuck(p, now)) {
        Some(why) => Agent::Stuck(why),
        None => Agent::Running,
    }
}

/// The termination message of an agent's container.
fn termination_message(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find_map(|c| c.state.as_ref()?.terminated.as_ref()?.message.clone())
}

/// The report an agent left in its pod's termination message (or the message itself).
pub fn outcome(message: Option<&str>) -> Result<Report, String> {
    let Some(m) = message.map(str::trim).filter(|m| !m.is_empty()) else {
        return Err("the agent ended without a report".into());
    };
    match serde_json::from_str::<Report>(m) {
        Ok(r) if r.ok => Ok(r),
        Ok(r) => Err(r.error.unwrap_or_else(|| "the agent failed".into())),
        // not JSON: the tail of its log (FallbackToLogsOnError)
        Err(_) => Err(m.lines().last().unwrap_or(m).to_string()),
    }
}

/// Why an agent's pod cannot start, once it has failed to for [`AGENT_START_GRACE`] seconds:
/// an image that cannot be pulled, a configuration the kubelet refuses (a missing Secret key),
/// or no node for it.
pub fn stuck(pod: &Pod, now: Timestamp) -> Option<String> {
    let created = pod.metadata.creation_timestamp.as_ref()?.0;
    if now.duration_since(created).as_secs() < AGENT_START_GRACE {
        return None;
    }
    let status = pod.status.as_ref()?;
    let waiting = status.container_statuses.iter().flatten().find_map(|c| {
        let w = c.state.as_ref()?.waiting.as_ref()?;
        let reason = w.reason.clone().unwrap_or_default();
        matches!(
            reason.as_str(),
            "ErrImagePull"
                | "ImagePullBackOff"
                | "InvalidImageName"
                | "CreateContainerConfigError"
                | "CreateContainerError"
        )
        .then(|| format!("{reason}: {}", w.message.clone().unwrap_or_default()))
    });
    let unschedulable = || {
        status.conditions.iter().flatten().find_map(|c| {
            (c.type_ == "PodScheduled" && c.status == "False").then(|| {
                format!(
                    "{}: {}",
                    c.reason.clone().unwrap_or_default(),
                    c.message.clone().unwrap_or_default()
                )
            })
        })
    };
    waiting.or_else(unschedulable)
}

/// A replica a backup or restore runs on, as the cluster's replica map has it now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InMap {
    /// In the map and not leaving.
    Present,
    /// Condemned (scale-in), or gone from the map.
    Leaving,
}

/// One shard of a running backup or restore, as observed.
#[derive(Clone, Debug, PartialEq)]
pub struct Shard {
    pub replica: InMap,
    /// The replica's pod, where its agent would run: `None` when the pod is gone.
    pub placement: Option<Placement>,
    pub agent: Agent,
}

/// What one recorded shard that is not done yet asks of the pass.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Next {
    /// Create its agent beside this pod.
    Create(Box<Placement>),
    /// Its agent is at work.
    Wait,
    /// Its agent succeeded.
    Done(Report),
    /// The backup or restore fails.
    Fail(Failure),
}

/// What shard `n`, recorded on `replica`, asks of a pass of a backup (`Mode::Backup`) or a
/// restore: a replica that left, a server that changed, an agent that cannot start or failed
/// each fail it with its reason.
pub(crate) fn next(mode: Mode, n: i32, replica: &str, shard: &Shard) -> Next {
    let (what, after) = match mode {
        Mode::Backup => (
            "backup replica",
            "nothing of this backup counts, the next backup starts afresh",
        ),
        Mode::Restore => (
            "replica",
            "some parts may be attached already: drop the restored tables and restore again",
        ),
    };
    let during = match mode {
        Mode::Backup => "the backup",
        Mode::Restore => "the restore",
    };
    let on = |reason, why: String| {
        Next::Fail(Failure::new(
            reason,
            format!("shard {n} on {replica}: {why}"),
        ))
    };
    if shard.replica == InMap::Leaving {
        let next = match mode {
            Mode::Backup => "; the next backup runs on the shard's new backup replica",
            Mode::Restore => "",
        };
        return Next::Fail(Failure::new(
            FailureReason::ReplicaRemoved,
            format!("{what} {replica} of shard {n} was removed during {during}{next}"),
        ));
    }
    match &shard.agent {
        Agent::Missing => match &shard.placement {
            Some(p) => Next::Create(Box::new(p.clone())),
            None => Next::Fail(Failure::new(
                FailureReason::ServerChanged,
                format!("the pod of {what} {replica} of shard {n} is gone"),
            )),
        },
        Agent::Running => Next::Wait,
        Agent::Done(r) => Next::Done(r.clone()),
        Agent::Stuck(why) => on(
            FailureReason::AgentCannotStart,
            format!(
                "the agent cannot start ({why}); check the operator's OPERATOR_IMAGE and the destination's Secret"
            ),
        ),
        Agent::ServerChanged(why) => on(
            FailureReason::ServerChanged,
            format!("the {what} failed during {during}: {why}; {after}"),
        ),
        Agent::Failed(why) => on(FailureReason::AgentFailed, why.clone()),
    }
}

/// What a pass does, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Backup `New`: the bucket answers with the Secret's keys; then the newest of
    /// `candidates` (earlier backups in the same place, newest first) whose manifest is in the
    /// bucket becomes the base.
    CheckBucket {
        destination: S3Destination,
        candidates: Vec<String>,
    },
    /// Restore `New`: the backup's `manifest.json`, read and checked.
    ReadManifest {
        destination: S3Destination,
        backup: String,
    },
    /// One shard's agent Job.
    CreateAgent(Box<AgentJob>),
    /// Backup: its `manifest.json`, written once every shard's manifest is (a write that fails
    /// fails the pass, which is retried: the status is written only after it).
    WriteManifest {
        destination: S3Destination,
        manifest: Manifest,
    },
}

impl Step {
    /// The step in a few words: the fault-injection hook and the logs name it so.
    pub fn describe(&self) -> String {
        match self {
            Step::CheckBucket { .. } => "check the bucket".into(),
            Step::ReadManifest { backup, .. } => format!("read the manifest of {backup}"),
            Step::CreateAgent(job) => format!("create the agent of shard {}", job.shard),
            Step::WriteManifest { manifest, .. } => {
                format!("write the manifest of {}", manifest.backup)
            }
        }
    }
}

/// What the steps found. (Once a backup or restore is over, the controller removes its agent
/// Jobs after writing its status: no step.)
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// A step found the destination unusable (credentials, bucket, manifest): the resource
    /// fails with this.
    pub refused: Option<Failure>,
    /// `CheckBucket`: the base chosen.
    pub base: Option<String>,
    /// `ReadManifest`: the manifest, which passed `backup::checks::check_manifest`.
    pub manifest: Option<Manifest>,
}

/// What a pass does and says.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan<S> {
    /// The status once every step went well.
    pub status: S,
    pub events: Vec<PlannedEvent>,
    pub steps: Vec<Step>,
    /// When to look again; `None`: at the next change.
    pub requeue: Option<Duration>,
    /// Set when this pass fails the resource.
    pub failure: Option<Failure>,
}

impl<S> Plan<S> {
    fn new(status: S) -> Plan<S> {
        Plan {
            status,
            events: Vec::new(),
            steps: Vec::new(),
            requeue: None,
            failure: None,
        }
    }

    fn event(
        &mut self,
        kind: crate::plan::EventType,
        reason: &'static str,
        action: &'static str,
        message: String,
    ) {
        self.events.push(PlannedEvent {
            kind,
            reason,
            action,
            message,
        });
    }

    /// The pass fails the resource with `failure`: a warning (`reason`, `action`) says why and
    /// is the only event, no step runs and nothing is looked at again. The status's own fields
    /// are the caller's.
    fn failed(&mut self, reason: &'static str, action: &'static str, failure: Failure) {
        self.events.clear();
        self.event(
            crate::plan::EventType::Warning,
            reason,
            action,
            failure.message.clone(),
        );
        self.steps.clear();
        self.requeue = None;
        self.failure = Some(failure);
    }
}

/// The controller owner reference to the backup or restore of kind `kind` (its `metadata`), on
/// the agents' Jobs.
fn owner(kind: &str, metadata: &ObjectMeta) -> OwnerReference {
    OwnerReference {
        api_version: "clickhouse.com/v1alpha1".into(),
        kind: kind.into(),
        name: metadata.name.clone().unwrap_or_default(),
        uid: metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The failure of a backup or restore (created as `metadata` says) that waited for a Ready
/// backup replica longer than [`WAIT_FOR_REPLICAS`], `message` saying what it waited for;
/// `None` while it may wait on.
fn gave_up_waiting(metadata: &ObjectMeta, now: Timestamp, message: &str) -> Option<Failure> {
    let waited = metadata
        .creation_timestamp
        .as_ref()
        .map(|t| now.duration_since(t.0).as_secs())
        .unwrap_or(0);
    (waited as u64 > WAIT_FOR_REPLICAS.as_secs()).then(|| {
        Failure::new(
            FailureReason::NoBackupReplica,
            format!("{message} for {waited} s: giving up"),
        )
    })
}

/// `s3://<bucket>/<prefix>/<key>`, as messages name what is in a bucket.
pub fn s3_url(d: &S3Destination, prefix: &str, key: &str) -> String {
    let prefix = prefix.trim_matches('/');
    if prefix.is_empty() {
        format!("s3://{}/{key}", d.bucket)
    } else {
        format!("s3://{}/{prefix}/{key}", d.bucket)
    }
}

#[cfg(test)]
mod tests;
