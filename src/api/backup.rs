//! The `ClickHouseBackup` resource: one backup of one cluster, taken on its backup replica.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ClickHouseBackupSpec {
    /// The ClickHouseCluster (in the same namespace) to back up.
    pub cluster_name: String,
    /// ClickHouse's `BACKUP … TO` destination, e.g. `Disk('backups', 'b1')` or `S3('…')`.
    pub destination: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClickHouseBackupStatus {
    #[serde(default)]
    pub state: BackupState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The replica the backup ran on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
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
