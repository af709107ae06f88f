//! PURE: the steps a plan asks the executor to run, and what the executor reports back.

use serde_json::Value;

use super::facts::Kind;
use super::scale_in::ScaleInAction;
use super::{Failure, PlannedEvent};
use crate::api::{ReplicaName, ShardIndex};

/// One step of the executor.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Create `<cluster>-operator` with a new random password.
    CreateOperatorSecret,
    /// Make the cluster the owner of `<cluster>-operator` again: a Secret kept from a deleted
    /// cluster of the same name whose volumes were retained, handed to those volumes at its
    /// deletion (decision 30).
    AdoptOperatorSecret,
    /// Add a random password for the metrics exporter's account to an `<cluster>-operator`
    /// made before it existed (unless the Secret changed since it was observed).
    AddExporterPassword,
    /// Publish the exporter's password and the cluster's CA where the exporter reads them
    /// (`EXPORTER_CREDENTIALS_SECRET`, decision 36).
    PublishExporterCredentials,
    /// Server-side apply of a built object; `create` when the object was not observed, so that
    /// an existing object that is not the cluster's is never taken over.
    Apply {
        kind: Kind,
        name: String,
        object: Value,
        create: bool,
    },
    /// Delete a StatefulSet and leave its pod running (orphan): the first half of changing a
    /// field a StatefulSet cannot change, data kept (invariant 1). A later pass creates it
    /// again once it is gone, and the new StatefulSet adopts the pod.
    OrphanStatefulSet { name: String },
    /// Grow a PVC in place.
    ResizePvc { name: String, size: String },
    /// Add the labels and annotations of `spec.storage` to an existing PVC (a merge patch: a
    /// key removed from the spec stays on the PVC).
    LabelPvc {
        name: String,
        labels: std::collections::BTreeMap<String, String>,
        annotations: std::collections::BTreeMap<String, String>,
    },
    /// Take a replica's pod out of the client Service before its restart, so that the other
    /// replicas can fetch its last parts while nothing new is written to it (`serving: false`);
    /// or put it back when it is not restarted after all, say a reverted change (`true`).
    SetServing {
        replica: ReplicaName,
        pod: String,
        serving: bool,
    },
    /// Take a pod out of traffic (when it was observed `serving`) and delete it, only if it is
    /// still the pod `uid` that was observed on an old revision; its StatefulSet (a server
    /// replica's or Keeper's) recreates it on the new one.
    RestartPod {
        statefulset: String,
        pod: String,
        uid: Option<String>,
        serving: bool,
    },
    /// Copy the schema onto a new replica; once done, the replica is Ready.
    MigrateSchema {
        replica: ReplicaName,
        shard: ShardIndex,
    },
    /// One step of removing a condemned replica.
    ScaleIn(ScaleInAction),
    /// Delete an owned object that is no longer wanted.
    Delete { kind: Kind, name: String },
    /// Make a server resolve the cluster's host names again (`SYSTEM DROP DNS CACHE`).
    DropDnsCache { replica: ReplicaName },
    /// Make a server's replicated tables open their Keeper session again now (`SYSTEM
    /// RESTART REPLICA`, decision 45): tables (database, table) read-only only because the
    /// session they had expired, while Keeper answers.
    RestartReplicatedTables {
        replica: ReplicaName,
        tables: Vec<(String, String)>,
    },
    /// Create the cluster's root path in its external Keeper (`spec.keeper.external`), each
    /// missing level of it, before the servers start (ClickHouse refuses a root that does not
    /// exist); once done, `status.keeperRoot` records it.
    EnsureKeeperRoot { root: String },
}

impl Step {
    pub fn describe(&self) -> String {
        match self {
            Step::CreateOperatorSecret => "create the operator's credentials Secret".into(),
            Step::AdoptOperatorSecret => {
                "take over the credentials Secret kept with the retained volumes".into()
            }
            Step::AddExporterPassword => {
                "add the exporter's password to the operator's credentials Secret".into()
            }
            Step::PublishExporterCredentials => {
                "publish the exporter's credentials for the exporter".into()
            }
            Step::Apply { kind, name, .. } => format!("apply {} {name}", kind.as_str()),
            Step::OrphanStatefulSet { name } => {
                format!("delete StatefulSet {name}, its pod kept, to create it again")
            }
            Step::ResizePvc { name, size } => format!("resize PVC {name} to {size}"),
            Step::LabelPvc { name, .. } => {
                format!("set the labels and annotations of spec.storage on PVC {name}")
            }
            Step::SetServing { pod, serving, .. } => {
                format!(
                    "put pod {pod} {} traffic",
                    if *serving { "back in" } else { "out of" }
                )
            }
            Step::RestartPod { pod, .. } => format!("restart pod {pod}"),
            Step::MigrateSchema { replica, .. } => format!("copy the schema onto {replica}"),
            Step::ScaleIn(a) => format!("scale-in: {a:?}"),
            Step::Delete { kind, name } => format!("delete {} {name}", kind.as_str()),
            Step::DropDnsCache { replica } => format!("drop the DNS cache of {replica}"),
            Step::RestartReplicatedTables { replica, tables } => format!(
                "reopen the Keeper session of {} read-only table(s) on {replica}",
                tables.len()
            ),
            Step::EnsureKeeperRoot { root } => {
                format!("create the root {root} in the external Keeper")
            }
        }
    }

    /// Why the plan asks for the step, in a few words: the operator's log names it beside
    /// each step it ran (the log trail).
    pub fn why(&self) -> &'static str {
        match self {
            Step::CreateOperatorSecret => "the cluster has no credentials yet",
            Step::AdoptOperatorSecret => "the cluster was created again on retained volumes",
            Step::AddExporterPassword => "the Secret was made before the exporter's account",
            Step::PublishExporterCredentials => "the exporter reads the cluster's credentials",
            Step::Apply { create: true, .. } => "the object is missing",
            Step::Apply { create: false, .. } => "the object differs from what the spec asks",
            Step::OrphanStatefulSet { .. } => "a field a StatefulSet cannot change changed",
            Step::ResizePvc { .. } => "spec.storage asks for more space",
            Step::LabelPvc { .. } => "spec.storage asks for these labels and annotations",
            Step::SetServing { serving: false, .. } => "its replica restarts next",
            Step::SetServing { serving: true, .. } => "its replica is not restarted after all",
            Step::RestartPod { .. } => "the pod runs an old revision",
            Step::MigrateSchema { .. } => "a new replica needs the shard's tables",
            Step::ScaleIn(_) => "the replica is condemned (scale-in)",
            Step::Delete { .. } => "the spec no longer asks for it",
            Step::DropDnsCache { .. } => "a host's address may have changed",
            Step::RestartReplicatedTables { .. } => {
                "their Keeper session expired and Keeper answers again"
            }
            Step::EnsureKeeperRoot { .. } => "the external Keeper has no root for the cluster",
        }
    }

    /// The step writes to the Kubernetes API (the others run SQL only).
    pub fn writes_kubernetes(&self) -> bool {
        use super::scale_in::ScaleInAction as S;
        match self {
            Step::MigrateSchema { .. }
            | Step::DropDnsCache { .. }
            | Step::RestartReplicatedTables { .. }
            | Step::EnsureKeeperRoot { .. } => false,
            Step::ScaleIn(a) => matches!(
                a,
                S::LeaveTraffic { .. } | S::DeleteStatefulSet { .. } | S::LabelPvcsAndForget { .. }
            ),
            _ => true,
        }
    }

    /// The step changes what `status.replicaStateMap` records once it succeeded: the executor
    /// records it in the cluster the pass's later steps read, and the pass's status write
    /// stores it (a crash before that write repeats the step; every step is idempotent).
    pub fn records_progress(&self) -> bool {
        matches!(
            self,
            Step::MigrateSchema { .. } | Step::ScaleIn(_) | Step::EnsureKeeperRoot { .. }
        )
    }
}

/// What the executor did with a plan.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Indexes of the plan's actions that succeeded, in the order they ran.
    pub done: Vec<usize>,
    /// What the steps found, to publish (how many tables were synced, …).
    pub events: Vec<PlannedEvent>,
    /// Steps started or checked but not finished (a shard still syncing): why the pass waits.
    pub waiting: Vec<String>,
    /// The first step that failed, and why.
    pub failure: Option<Failure>,
}
