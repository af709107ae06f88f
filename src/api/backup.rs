//! The `ClickHouseBackup` resource: one backup of one cluster, taken on its backup replica.

use kube::CustomResource;

use super::S3Destination;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One backup of a ClickHouseCluster to an S3-compatible bucket, every shard on its backup
/// replica. Its spec cannot change, but for `deletionPolicy`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "clickhouse.com",
    version = "v1alpha1",
    kind = "ClickHouseBackup",
    namespaced,
    shortname = "chb",
    status = "ClickHouseBackupStatus",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterName"}"#,
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Uploaded","type":"integer","jsonPath":".status.bytesUploaded"}"#,
    printcolumn = r#"{"name":"Reused","type":"integer","jsonPath":".status.bytesReused"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ClickHouseBackupSpec {
    /// The ClickHouseCluster (in the same namespace) to back up.
    pub cluster_name: String,
    /// Where the backup goes (default: the cluster's `spec.backup.destination`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<S3Destination>,
    /// What to back up: databases (`db`) or tables (`db.table`); every database but the
    /// system ones when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tables: Vec<String>,
    /// Upload only the parts that the latest successful backup of the same cluster to the same
    /// destination does not hold (parts never change, so the rest is referenced); default:
    /// every part.
    #[serde(default)]
    pub incremental: bool,
    /// What deleting this ClickHouseBackup does to its data in the bucket: `Retain` (default)
    /// keeps it (a backup of a deleted cluster stays restorable); `Delete` removes it first,
    /// except the parts other backups in the same place reference, and waits while a backup
    /// that builds on this one runs.
    #[serde(default, skip_serializing_if = "DeletionPolicy::is_retain")]
    pub deletion_policy: DeletionPolicy,
}

/// What deleting a ClickHouseBackup does to its data.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DeletionPolicy {
    #[default]
    Retain,
    Delete,
}

impl DeletionPolicy {
    pub fn is_retain(&self) -> bool {
        *self == DeletionPolicy::Retain
    }
}

/// What the backup did so far.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClickHouseBackupStatus {
    /// `New`, `Starting`, `Running`, `Succeeded` or `Failed`.
    #[serde(default)]
    pub state: BackupState,
    /// When the backup started (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    /// When it succeeded or failed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<String>,
    /// What happens now, or why the backup failed and what to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Why it failed, as one word (`Bucket`, `Credentials`, `ReplicaRemoved`, `AgentFailed`, …);
    /// the label of `clickhouse_operator_backup_failures_total`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Per shard: the replica the backup ran on and what it moved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardBackupStatus>,
    /// Where the backup was written (its destination, prefix written out), recorded when it
    /// starts: where a `Delete` policy removes it from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<S3Destination>,
    /// The backup this one builds on (incremental).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// `s3://bucket/key` of the manifest, written last: a backup without it is not complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<String>,
    /// Bytes uploaded by this backup, all shards.
    #[serde(default)]
    pub bytes_uploaded: u64,
    /// Bytes this backup references from earlier ones instead of uploading them.
    #[serde(default)]
    pub bytes_reused: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShardBackupStatus {
    /// The shard's index.
    pub shard: i32,
    /// The shard's backup replica, where every statement and file read of this shard ran.
    pub replica: String,
    /// Parts of this shard uploaded.
    #[serde(default)]
    pub parts_uploaded: u64,
    /// Bytes of this shard uploaded.
    #[serde(default)]
    pub bytes_uploaded: u64,
    /// Parts of this shard referenced from earlier backups instead of uploaded.
    #[serde(default)]
    pub parts_reused: u64,
    /// Bytes of this shard referenced from earlier backups instead of uploaded.
    #[serde(default)]
    pub bytes_reused: u64,
    /// Done (the shard's manifest is written).
    #[serde(default)]
    pub done: bool,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum BackupState {
    #[default]
    New,
    Starting,
    Running,
    Succeeded,
    Failed,
}

impl BackupState {
    /// Starting or Running: a rollout waits while any backup of the cluster is in flight.
    pub fn in_flight(self) -> bool {
        matches!(self, BackupState::Starting | BackupState::Running)
    }
}
