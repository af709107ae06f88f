//! The `ClickHouseRestore` resource (decision 13): one restore of a backup into a cluster with
//! the same number of shards.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::S3Destination;

/// One restore of a backup into a ClickHouseCluster with as many shards. Its spec cannot
/// change.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "clickhouse.com",
    version = "v1alpha1",
    kind = "ClickHouseRestore",
    namespaced,
    shortname = "chr",
    status = "ClickHouseRestoreStatus",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterName"}"#,
    printcolumn = r#"{"name":"Backup","type":"string","jsonPath":".spec.backupName"}"#,
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Downloaded","type":"integer","jsonPath":".status.bytesDownloaded"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ClickHouseRestoreSpec {
    /// The ClickHouseCluster (same namespace) to restore into; it must have as many shards as
    /// the backup.
    pub cluster_name: String,
    /// The backup: the name of a ClickHouseBackup, or, with `destination`, the name the backup
    /// has in that bucket (a backup of a cluster that no longer exists).
    pub backup_name: String,
    /// Where the backup is (default: the ClickHouseBackup's destination, else the cluster's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<S3Destination>,
    /// Restore into tables that already hold rows (the backup's rows are added to theirs);
    /// default: such tables are refused.
    #[serde(default)]
    pub into_non_empty_tables: bool,
    /// Restore tables, views and dictionaries that reach outside the cluster (engines such as
    /// `URL`, `S3`, `MySQL`, `Kafka`; table functions such as `url()`, `remote()`; dictionary
    /// sources). Default: a backup holding one is refused before anything is restored, since
    /// its definitions come from the bucket.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_external_sources: bool,
}

/// What the restore did so far.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClickHouseRestoreStatus {
    /// `New`, `Running`, `Succeeded` or `Failed`.
    #[serde(default)]
    pub state: RestoreState,
    /// When the restore started (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    /// When it succeeded or failed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<String>,
    /// What happens now, or why the restore failed and what to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Why it failed, as one word (`Bucket`, `Credentials`, `ReplicaRemoved`, `AgentFailed`, …);
    /// the label of `clickhouse_operator_backup_failures_total`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Per shard: the replica the parts were attached on (replication copies them to the
    /// others) and what it did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardRestoreStatus>,
    /// Bytes downloaded from the bucket, all shards.
    #[serde(default)]
    pub bytes_downloaded: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShardRestoreStatus {
    /// The shard's index.
    pub shard: i32,
    /// The replica the shard's parts were attached on.
    pub replica: String,
    /// Parts of this shard attached.
    #[serde(default)]
    pub parts_attached: u64,
    /// Bytes of this shard downloaded.
    #[serde(default)]
    pub bytes_downloaded: u64,
    /// Done (the shard's restore agent finished).
    #[serde(default)]
    pub done: bool,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RestoreState {
    #[default]
    New,
    Running,
    Succeeded,
    Failed,
}
