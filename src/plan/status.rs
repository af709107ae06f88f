//! PURE: building the status of a pass, with Kubernetes-style conditions whose transition time
//! only moves when their status changes.

use k8s_openapi::jiff::Timestamp;

use super::{Failure, FailureReason};
use crate::api::{
    ClickHouseClusterStatus, ClusterState, Condition, KeeperMember, MEMBERS_VERSION, Members,
    ServerMember, validate::Warning,
};

pub const RECONCILE_SUCCEEDED: &str = "ReconcileSucceeded";
pub const SPEC_VALID: &str = "SpecValid";
/// Every server pod of a cluster that ran is down, or its Keeper has no serving member (S2-12).
pub const FULL_CRASH: &str = "FullCrash";
pub const REDUNDANT: &str = "Redundant";
/// A removed replica's Keeper metadata could not be dropped (decision 2): the condition, and the
/// Warning event of the same reason, name the nodes left. It stays as the record of them.
pub const KEEPER_METADATA_LEFT: &str = "KeeperMetadataLeft";
/// `spec.suspend` (decision 50): `True` while the operator keeps its hands off the cluster.
pub const SUSPENDED: &str = "Suspended";
/// `spec.troubleshoot` (decision 56): `True` while the servers run under the troubleshooting
/// shell, with their probes off.
pub const TROUBLESHOOT: &str = "Troubleshoot";
/// The reason of the failed-pass condition (S2-36).
pub const ERROR_RECONCILE: &str = "ErrorReconcile";

/// Sets condition `type_`; keeps its transition time when its status does not change.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) {
    let status = if status { "True" } else { "False" };
    let time = conditions
        .iter()
        .find(|c| c.r#type == type_ && c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.to_string());
    conditions.retain(|c| c.r#type != type_);
    conditions.push(Condition {
        r#type: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        last_transition_time: Some(time),
        observed_generation: generation,
    });
    conditions.sort_by(|a, b| a.r#type.cmp(&b.r#type));
}

/// The status after a failed pass: state `error`, the cause in `message` and in a condition
/// with reason `ErrorReconcile`. Everything else observed before is kept.
pub fn failed(
    old: &ClickHouseClusterStatus,
    generation: Option<i64>,
    failure: &Failure,
    now: Timestamp,
) -> ClickHouseClusterStatus {
    let mut s = old.clone();
    s.state = ClusterState::Error;
    s.message = Some(failure.message.clone());
    s.observed_generation = generation;
    set_condition(
        &mut s.conditions,
        RECONCILE_SUCCEEDED,
        false,
        ERROR_RECONCILE,
        &format!("{}: {}", failure.reason.as_str(), failure.message),
        generation,
        now,
    );
    if failure.reason == FailureReason::InvalidSpec {
        set_condition(
            &mut s.conditions,
            SPEC_VALID,
            false,
            "InvalidSpec",
            &failure.message,
            generation,
            now,
        );
    }
    s
}

/// `status.members` of cluster `cluster` with status `s` (S0-12: the public part other
/// components read instead of the replica map): the servers of its replicas that are
/// `Pending` or `Ready`, and its own Keeper members (`keeper.size` of the status, which the pass
/// took from the spec with the operator's defaults); none while the cluster stops.
pub fn members(cluster: &str, s: &ClickHouseClusterStatus) -> Members {
    use crate::api::ReplicaState;
    use crate::model::names;
    if s.state == ClusterState::Stopping {
        return Members {
            version: MEMBERS_VERSION,
            ..Members::default()
        };
    }
    Members {
        version: MEMBERS_VERSION,
        servers: s
            .replica_state_map
            .iter()
            .filter(|(_, r)| matches!(r.state, ReplicaState::Pending | ReplicaState::Ready))
            .map(|(replica, r)| ServerMember {
                shard: r.shard.get(),
                replica: replica.to_string(),
                pod: names::replica_pod(replica),
            })
            .collect(),
        keeper: (0..s.keeper.size.max(0))
            .map(|i| KeeperMember {
                pod: format!("{}-{i}", names::keeper(cluster)),
            })
            .collect(),
    }
}

/// The condition about the cluster's reach outside Kubernetes (decision 40).
pub const EXPOSURE: &str = "PlainTextExposure";

/// Sets the `PlainTextExposure` condition: `True` while the client Service reaches outside the
/// cluster (`NodePort`, `LoadBalancer`) without TLS, so that passwords and data cross other
/// networks in clear. Returns the message when it has just become `True` (a Warning event).
pub fn exposure(
    s: &mut ClickHouseClusterStatus,
    spec: &crate::api::ClickHouseClusterSpec,
    generation: Option<i64>,
    now: Timestamp,
) -> Option<String> {
    use crate::api::ClientServiceType;
    let svc = &spec.client_service;
    let outside = svc.enabled
        && matches!(
            svc.r#type,
            ClientServiceType::NodePort | ClientServiceType::LoadBalancer
        );
    let plain = outside && !spec.tls.enabled;
    let was = s
        .conditions
        .iter()
        .any(|c| c.r#type == EXPOSURE && c.status == "True");
    let message = format!(
        "the client Service is a {:?} without spec.tls: passwords and data reach it in clear from outside the Kubernetes cluster",
        svc.r#type
    );
    set_condition(
        &mut s.conditions,
        EXPOSURE,
        plain,
        if plain {
            "ClientServiceWithoutTls"
        } else {
            "NoPlainTextExposure"
        },
        if plain { &message } else { "" },
        generation,
        now,
    );
    (plain && !was).then_some(message)
}

/// Sets the `Redundant` condition from the validation warnings (decision 16).
pub fn redundancy(
    s: &mut ClickHouseClusterStatus,
    warnings: &[Warning],
    generation: Option<i64>,
    now: Timestamp,
) {
    if warnings.is_empty() {
        set_condition(
            &mut s.conditions,
            REDUNDANT,
            true,
            "Redundant",
            "",
            generation,
            now,
        );
    } else {
        let message = warnings
            .iter()
            .map(|w| w.0.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        set_condition(
            &mut s.conditions,
            REDUNDANT,
            false,
            "NoRedundancy",
            &message,
            generation,
            now,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_when_the_status_changes() {
        let t1: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let t2: Timestamp = "2026-01-02T00:00:00Z".parse().unwrap();
        let t3: Timestamp = "2026-01-03T00:00:00Z".parse().unwrap();
        let mut c = Vec::new();
        set_condition(&mut c, "X", true, "R", "", Some(1), t1);
        set_condition(&mut c, "X", true, "R2", "m", Some(2), t2);
        assert_eq!(c.len(), 1);
        assert_eq!(
            c[0].last_transition_time.as_deref(),
            Some("2026-01-01T00:00:00Z")
        );
        assert_eq!(c[0].reason, "R2");
        set_condition(&mut c, "X", false, "R", "", Some(2), t3);
        assert_eq!(
            c[0].last_transition_time.as_deref(),
            Some("2026-01-03T00:00:00Z")
        );
        assert_eq!(c[0].status, "False");
    }
}
