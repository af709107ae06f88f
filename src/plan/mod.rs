//! PURE: the decisions of a reconcile pass. `decide` takes the resource and what was observed
//! and returns a `Plan`: the status to report, the events to publish, and whether the pass
//! failed. It performs no I/O, so every rule here is tested with plain data.

pub mod backup;
pub mod facts;
pub mod fleet;
pub mod pass;
pub mod replicas;
pub mod report;
pub mod rollout;
pub mod scale_in;
pub mod status;
pub mod step;
pub mod storage_classes;
pub mod upgrade;

use crate::api::{
    ClickHouseCluster, ClickHouseClusterStatus, ClusterState, SchemaPolicy,
    validate::{self, FieldError},
};
use k8s_openapi::jiff::Timestamp;

/// Another ClickHouseCluster in the same namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sibling {
    pub name: String,
    pub created: Option<Timestamp>,
}

/// What a pass observed.
#[derive(Clone, Debug, Default)]
pub struct World {
    /// Every ClickHouseCluster of the namespace, this one included.
    pub clusters_in_namespace: Vec<Sibling>,
    /// The cluster's objects, pods and inputs.
    pub observed: facts::Observed,
    /// The operator's bounds of a cluster's size (`MAX_SHARDS`, `MAX_REPLICAS`).
    pub limits: validate::Limits,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

/// An event to publish on the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedEvent {
    pub kind: EventType,
    pub reason: &'static str,
    pub action: &'static str,
    pub message: String,
}

/// Why a pass failed: the metric label and the start of the failed condition's message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureReason {
    /// Another ClickHouseCluster owns the namespace (decision 18).
    NamespaceConflict,
    /// The spec is invalid; the message names the field.
    InvalidSpec,
    /// A Secret the spec names does not exist.
    MissingSecret,
    /// A generated credential that must not change (ClickHouse's Keeper identity) was changed
    /// or removed.
    CredentialChangeRefused,
    /// `spec.shards` shrank without the data-loss annotation.
    ShardRemovalRefused,
    /// A replica named by `clickhouse.com/replace-replicas` cannot be replaced (decision 54).
    ReplacementRefused,
    /// A storage change that cannot be applied (a shrink, or growth without volume scaling).
    StorageChangeRefused,
    /// A replica on its new revision cannot start (S2-31).
    RolloutFailed,
    /// A restarted replica did not catch up with replication within the deadline (S2-32); the
    /// rollout goes on by itself once it does.
    CatchUpTimeout,
    /// The Kubernetes API refused or failed a request.
    KubernetesApi,
    /// An object of the cluster's name exists and is not the cluster's.
    NameConflict,
    /// A ClickHouse server answered with an error.
    ClickHouse,
    /// A replica the step needs has no running pod.
    ReplicaUnreachable,
    /// The external Keeper (`spec.keeper.external`) cannot be reached or refused a request.
    Keeper,
    /// The operator built something it cannot use (a bug).
    Internal,
}

impl FailureReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::NamespaceConflict => "NamespaceConflict",
            FailureReason::InvalidSpec => "InvalidSpec",
            FailureReason::MissingSecret => "MissingSecret",
            FailureReason::CredentialChangeRefused => "CredentialChangeRefused",
            FailureReason::ShardRemovalRefused => "ShardRemovalRefused",
            FailureReason::ReplacementRefused => "ReplacementRefused",
            FailureReason::StorageChangeRefused => "StorageChangeRefused",
            FailureReason::RolloutFailed => "RolloutFailed",
            FailureReason::CatchUpTimeout => "CatchUpTimeout",
            FailureReason::KubernetesApi => "KubernetesApi",
            FailureReason::NameConflict => "NameConflict",
            FailureReason::ClickHouse => "ClickHouse",
            FailureReason::ReplicaUnreachable => "ReplicaUnreachable",
            FailureReason::Keeper => "Keeper",
            FailureReason::Internal => "Internal",
        }
    }
}

impl std::fmt::Display for FailureReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a pass failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub reason: FailureReason,
    pub message: String,
}

/// What one pass decided: the status to write, the steps to take, the events to publish.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub status: ClickHouseClusterStatus,
    pub events: Vec<PlannedEvent>,
    /// What to do, in order.
    pub steps: Vec<step::Step>,
    /// The phase that planned each action.
    pub phases: Vec<pass::Phase>,
    /// Replicas whose replication lag must be read before deciding again.
    pub lag_checks: Vec<crate::api::ReplicaName>,
    /// Observe and decide again right after acting.
    pub again: bool,
    /// Set when the pass failed: the operator retries with backoff.
    pub failure: Option<Failure>,
    /// False when the resource must not be reconciled at all (a second cluster in a namespace).
    pub manage: bool,
    /// The server replicas the rollout looked at: what `plan` needs to show the whole rollout
    /// order with the rollout's own decision function.
    pub members: Vec<rollout::Member>,
    /// The pass waits for the servers to get somewhere no Kubernetes event announces (loading
    /// the new remote_servers, Distributed queries reaching every shard): pass again in
    /// [`crate::runtime::backoff::SERVER_RECHECK`], not at the idle re-check.
    pub recheck_soon: bool,
}

impl Plan {
    /// A pass that does nothing but report `failure`.
    fn refused(
        status: ClickHouseClusterStatus,
        events: Vec<PlannedEvent>,
        failure: Failure,
        manage: bool,
    ) -> Plan {
        Plan {
            status,
            events,
            failure: Some(failure),
            manage,
            ..Plan::default()
        }
    }
}

/// The cluster that owns a namespace: the oldest by creation time, then by name (decision 18).
pub fn namespace_owner(clusters: &[Sibling]) -> Option<&Sibling> {
    clusters
        .iter()
        .min_by(|a, b| match (&a.created, &b.created) {
            (Some(x), Some(y)) => x.cmp(y).then_with(|| a.name.cmp(&b.name)),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => a.name.cmp(&b.name),
        })
}

fn describe_errors(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Decides one pass over `cluster`. `now` stamps changed conditions.
pub fn decide(cluster: &ClickHouseCluster, world: &World, now: Timestamp) -> Plan {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let old = cluster.status.clone().unwrap_or_default();
    let generation = cluster.metadata.generation;

    // One ClickHouseCluster per namespace: a newer one is refused and left alone.
    if let Some(owner) = namespace_owner(&world.clusters_in_namespace)
        && owner.name != name
    {
        return namespace_conflict(cluster, &owner.name, &old, now);
    }
    // Hands off (decision 50): nothing is planned, the pods run on as they are.
    if cluster.spec.suspend {
        return suspended(&old, generation, now);
    }
    let Valid {
        policy,
        warnings,
        restart_at,
        mut events,
    } = match validated(cluster, &name, &old, &world.limits, now) {
        Ok(valid) => valid,
        Err(refused) => return *refused,
    };

    // decision 59: the storage classes the operator's defaults gave the cluster, for its life
    let pin = storage_classes::pinned(cluster, &world.observed);
    let pass = pass::plan_pass(
        &storage_classes::with_classes(cluster, pin.classes()),
        &world.observed,
        now,
    );
    let mut status = pass.status;
    status.default_storage_classes = pin.record();
    if let Some(at) = restart_at {
        // decision 51: the templates built in this pass carry it; recorded so that they keep
        // it once the annotation is gone
        status.restarted_at = Some(at);
    }
    status.schema_policy = Some(policy.effective());
    if pass.failure.is_none() {
        status::redundancy(&mut status, &warnings, generation, now);
        if let Some(message) = status::exposure(&mut status, &cluster.spec, generation, now) {
            events.push(PlannedEvent {
                kind: EventType::Warning,
                reason: "PlainTextExposure",
                action: "Validate",
                message,
            });
        }
    }
    events.extend(pass.events);
    mode_conditions(&mut status, cluster, &old, now);
    if old.state != status.state {
        events.push(PlannedEvent {
            kind: if status.state == ClusterState::Error {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: "StateChanged",
            action: "Report",
            message: format!("state {} → {}", old.state, status.state),
        });
    }
    Plan {
        status,
        events,
        ..pass
    }
}

/// The pass of a cluster refused because `owner` manages its namespace already.
fn namespace_conflict(
    cluster: &ClickHouseCluster,
    owner: &str,
    old: &ClickHouseClusterStatus,
    now: Timestamp,
) -> Plan {
    let namespace = cluster.metadata.namespace.clone().unwrap_or_default();
    let message = format!(
        "namespace {namespace} is already managed by ClickHouseCluster {owner}: only one ClickHouseCluster per namespace is supported; delete this one or move it to its own namespace",
    );
    let failure = Failure {
        reason: FailureReason::NamespaceConflict,
        message: message.clone(),
    };
    let status = status::failed(old, cluster.metadata.generation, &failure, now);
    let mut events = Vec::new();
    if old.message.as_deref() != Some(message.as_str()) {
        events.push(PlannedEvent {
            kind: EventType::Warning,
            reason: "NamespaceConflict",
            action: "Refuse",
            message,
        });
    }
    Plan::refused(status, events, failure, false)
}

/// The pass of a suspended cluster: it only says so.
fn suspended(old: &ClickHouseClusterStatus, generation: Option<i64>, now: Timestamp) -> Plan {
    let message = "spec.suspend is true: the operator changes nothing of this cluster and \
                   its pods keep running as they are; set it to false to resume";
    let mut status = old.clone();
    status.state = ClusterState::Suspended;
    status.message = Some(message.into());
    status.observed_generation = generation;
    status::set_condition(
        &mut status.conditions,
        status::SUSPENDED,
        true,
        "Suspended",
        message,
        generation,
        now,
    );
    let mut events = Vec::new();
    if old.state != ClusterState::Suspended {
        events.push(PlannedEvent {
            kind: EventType::Normal,
            reason: "Suspended",
            action: "Suspend",
            message: message.into(),
        });
    }
    Plan {
        status,
        events,
        manage: true,
        ..Plan::default()
    }
}

/// What a valid spec gives the pass.
struct Valid {
    policy: SchemaPolicy,
    warnings: Vec<validate::Warning>,
    /// The restart asked for by annotation, when there is one.
    restart_at: Option<String>,
    /// The events of the schema policy's replaced values.
    events: Vec<PlannedEvent>,
}

/// Validates and defaults the spec; an invalid one gives the refused pass that says why.
fn validated(
    cluster: &ClickHouseCluster,
    name: &str,
    old: &ClickHouseClusterStatus,
    limits: &validate::Limits,
    now: Timestamp,
) -> Result<Valid, Box<Plan>> {
    let generation = cluster.metadata.generation;
    let mut events = Vec::new();
    let (policy, replaced) = SchemaPolicy::normalise(&cluster.spec.schema_policy);
    let (mut errors, warnings) = validate::validate_with(name, &cluster.spec, limits);
    let restart_at = crate::model::labels::restart_at(cluster);
    if let Some(Err(value)) = &restart_at {
        errors.push(validate::FieldError {
            field: format!("metadata.annotations[{}]", crate::model::labels::RESTART_AT),
            message: format!(
                "{value:?} is not a timestamp such as 2026-12-04T18:00:00Z (date -u +%FT%TZ)"
            ),
        });
    }
    if old.schema_policy.as_ref() != Some(&policy.effective())
        || old.observed_generation != generation
    {
        for r in &replaced {
            events.push(PlannedEvent {
                kind: EventType::Warning,
                reason: "SchemaPolicyReplaced",
                action: "Normalise",
                message: r.to_string(),
            });
        }
    }
    if !errors.is_empty() {
        let failure = Failure {
            reason: FailureReason::InvalidSpec,
            message: format!("invalid spec: {}", describe_errors(&errors)),
        };
        if old.message.as_deref() != Some(failure.message.as_str()) {
            events.push(PlannedEvent {
                kind: EventType::Warning,
                reason: "InvalidSpec",
                action: "Validate",
                message: failure.message.clone(),
            });
        }
        let mut status = status::failed(old, generation, &failure, now);
        status.schema_policy = Some(policy.effective());
        return Err(Box::new(Plan::refused(status, events, failure, true)));
    }
    Ok(Valid {
        policy,
        warnings,
        restart_at: restart_at.and_then(Result::ok),
        events,
    })
}

/// The conditions of the cluster's modes: troubleshooting (decision 56: said while on, and
/// once when turned off) and a suspension that ended.
fn mode_conditions(
    status: &mut ClickHouseClusterStatus,
    cluster: &ClickHouseCluster,
    old: &ClickHouseClusterStatus,
    now: Timestamp,
) {
    let generation = cluster.metadata.generation;
    if cluster.spec.troubleshoot {
        status::set_condition(
            &mut status.conditions,
            status::TROUBLESHOOT,
            true,
            "TroubleshootMode",
            "spec.troubleshoot: the servers run under a shell that keeps the container up when clickhouse-server stops (its exit status is in the container's log), with no liveness or startup probe; set it to false once repaired",
            generation,
            now,
        );
    } else if old
        .conditions
        .iter()
        .any(|c| c.r#type == status::TROUBLESHOOT)
    {
        status::set_condition(
            &mut status.conditions,
            status::TROUBLESHOOT,
            false,
            "Off",
            "spec.troubleshoot is false: the servers run as usual",
            generation,
            now,
        );
    }
    if old.conditions.iter().any(|c| c.r#type == status::SUSPENDED) {
        status::set_condition(
            &mut status.conditions,
            status::SUSPENDED,
            false,
            "Resumed",
            "spec.suspend is false: the operator manages the cluster",
            generation,
            now,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{cluster, cluster_named, now};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn sib(name: &str, created: &str) -> Sibling {
        Sibling {
            name: name.into(),
            created: Some(created.parse().unwrap()),
        }
    }

    /// A world in which the operator's credentials exist and nothing else does yet.
    fn world() -> World {
        let mut w = World::default();
        w.observed.operator_secret_present = true;
        w
    }

    /// S2-43, decision 51: the annotation `clickhouse.com/restart-at` is recorded in the status
    /// (normalised), kept there once the annotation is gone, and an annotation that is no
    /// timestamp is refused naming it, nothing planned.
    #[test]
    fn a_restart_annotation_is_recorded_kept_and_checked() {
        use crate::model::labels::RESTART_AT;
        let mut c = cluster(serde_json::json!({}));
        c.metadata.annotations = Some(
            [(
                RESTART_AT.to_string(),
                "2026-12-04T18:00:00+00:00".to_string(),
            )]
            .into(),
        );
        let plan = decide(&c, &world(), now());
        assert_eq!(
            plan.status.restarted_at.as_deref(),
            Some("2026-12-04T18:00:00Z")
        );
        c.status = Some(plan.status);
        c.metadata.annotations = None;
        let plan = decide(&c, &world(), now());
        assert_eq!(
            plan.status.restarted_at.as_deref(),
            Some("2026-12-04T18:00:00Z")
        );
        c.metadata.annotations =
            Some([(RESTART_AT.to_string(), "yesterday; rm -rf /".to_string())].into());
        let plan = decide(&c, &world(), now());
        assert!(plan.steps.is_empty());
        let failure = plan.failure.unwrap();
        assert_eq!(failure.reason, FailureReason::InvalidSpec);
        assert!(
            failure
                .message
                .contains("metadata.annotations[clickhouse.com/restart-at]"),
            "{}",
            failure.message
        );
    }

    /// S2-42, decision 50: a suspended cluster gets no action at all (here its first pass,
    /// which would create everything), the state `suspended`, the condition and one event;
    /// resumed, the condition turns `False` and the pass plans again.
    #[test]
    fn a_suspended_cluster_gets_no_action_and_says_so_until_resumed() {
        let mut c = cluster(serde_json::json!({"suspend": true}));
        let plan = decide(&c, &world(), now());
        assert!(plan.steps.is_empty(), "{:?}", plan.steps);
        assert!(plan.failure.is_none());
        assert_eq!(plan.status.state, ClusterState::Suspended);
        let cond = plan
            .status
            .conditions
            .iter()
            .find(|c| c.r#type == status::SUSPENDED)
            .unwrap();
        assert_eq!(
            (cond.status.as_str(), cond.reason.as_str()),
            ("True", "Suspended")
        );
        assert_eq!(
            plan.events.iter().map(|e| e.reason).collect::<Vec<_>>(),
            ["Suspended"]
        );
        // the next pass says nothing new
        c.status = Some(plan.status.clone());
        assert!(decide(&c, &world(), now()).events.is_empty());
        // even an invalid spec changes nothing while suspended
        c.spec.shards = 0;
        assert!(decide(&c, &world(), now()).steps.is_empty());
        c.spec.shards = 1;
        c.spec.suspend = false;
        let resumed = decide(&c, &world(), now());
        assert!(!resumed.steps.is_empty());
        assert_ne!(resumed.status.state, ClusterState::Suspended);
        let cond = resumed
            .status
            .conditions
            .iter()
            .find(|c| c.r#type == status::SUSPENDED)
            .unwrap();
        assert_eq!(
            (cond.status.as_str(), cond.reason.as_str()),
            ("False", "Resumed")
        );
    }

    /// S0-07 / decision 18: the oldest cluster owns the namespace; ties go to the name.
    #[test]
    fn oldest_cluster_owns_the_namespace() {
        let a = sib("b-old", "2026-01-01T00:00:00Z");
        let b = sib("a-new", "2026-02-01T00:00:00Z");
        assert_eq!(
            namespace_owner(&[b.clone(), a.clone()]).unwrap().name,
            "b-old"
        );
        let tie1 = sib("zeta", "2026-01-01T00:00:00Z");
        let tie2 = sib("alpha", "2026-01-01T00:00:00Z");
        assert_eq!(namespace_owner(&[tie1, tie2]).unwrap().name, "alpha");
        assert!(namespace_owner(&[]).is_none());
    }

    /// S0-07: the newcomer gets error, a condition and a Warning event, and is not managed.
    #[test]
    fn second_cluster_in_a_namespace_is_refused_and_left_alone() {
        let c2 = cluster_named("c2", serde_json::json!({}));
        let world = World {
            clusters_in_namespace: vec![
                sib("c1", "2025-12-01T00:00:00Z"),
                sib("c2", "2026-01-01T00:00:00Z"),
            ],
            ..world()
        };
        let plan = decide(&c2, &world, now());
        assert!(!plan.manage);
        assert_eq!(plan.status.state, ClusterState::Error);
        assert!(
            plan.status
                .message
                .as_deref()
                .unwrap()
                .contains("ClickHouseCluster c1")
        );
        let cond = plan
            .status
            .conditions
            .iter()
            .find(|c| c.r#type == "ReconcileSucceeded")
            .unwrap();
        assert_eq!(cond.reason, "ErrorReconcile");
        assert_eq!(plan.events[0].reason, "NamespaceConflict");
        assert_eq!(plan.events[0].kind, EventType::Warning);
        // The owner itself is managed.
        let c1 = cluster(serde_json::json!({}));
        let mut c1 = c1;
        c1.metadata.creation_timestamp = Some(Time("2025-12-01T00:00:00Z".parse().unwrap()));
        assert!(decide(&c1, &world, now()).manage);
    }

    /// Review M-2 (decision 68): a cluster of a million shards is refused before anything is
    /// planned, quickly, with an error status, a `ReconcileSucceeded=False` condition and a
    /// Warning Event naming the field and the operator's setting; the same spec passes under a
    /// `MAX_SHARDS` raised for it.
    #[test]
    fn a_spec_beyond_the_operators_limits_is_refused_before_planning() {
        let c = cluster(serde_json::json!({"shards": 1_000_000, "replicas": 2}));
        let started = std::time::Instant::now();
        let plan = decide(&c, &world(), now());
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        let f = plan.failure.as_ref().unwrap();
        assert_eq!(f.reason, FailureReason::InvalidSpec);
        assert!(
            f.message.contains(
                "spec.shards: must be at most 256 (this operator's MAX_SHARDS), got 1000000"
            ),
            "{}",
            f.message
        );
        assert!(plan.steps.is_empty());
        assert_eq!(plan.status.state, ClusterState::Error);
        assert!(plan.status.replica_state_map.is_empty());
        let cond = plan
            .status
            .conditions
            .iter()
            .find(|c| c.r#type == "ReconcileSucceeded")
            .unwrap();
        assert_eq!(cond.status, "False");
        assert!(cond.message.contains("MAX_SHARDS"), "{}", cond.message);
        assert!(
            plan.events
                .iter()
                .any(|e| e.reason == "InvalidSpec" && e.message.contains("MAX_SHARDS"))
        );
        let c = cluster(serde_json::json!({"shards": 300, "replicas": 1}));
        assert!(decide(&c, &world(), now()).failure.is_some());
        let mut raised = world();
        raised.limits.max_shards = 300;
        let plan = decide(&c, &raised, now());
        assert!(plan.failure.is_none(), "{:?}", plan.failure);
    }

    /// S2-10 / S2-36: an invalid spec is an error naming the field, with reason ErrorReconcile.
    #[test]
    fn invalid_spec_is_reported_with_the_field() {
        let c = cluster(serde_json::json!({"keeper": {"replicas": 2}}));
        let plan = decide(&c, &world(), now());
        let f = plan.failure.as_ref().unwrap();
        assert_eq!(f.reason, FailureReason::InvalidSpec);
        assert!(f.message.contains("spec.keeper.replicas"), "{}", f.message);
        assert_eq!(plan.status.state, ClusterState::Error);
        assert_eq!(plan.status.message.as_deref(), Some(f.message.as_str()));
        assert_eq!(plan.status.observed_generation, Some(1));
        let cond = plan
            .status
            .conditions
            .iter()
            .find(|c| c.r#type == "ReconcileSucceeded")
            .unwrap();
        assert_eq!(
            (cond.status.as_str(), cond.reason.as_str()),
            ("False", "ErrorReconcile")
        );
        assert_eq!(
            plan.events
                .iter()
                .filter(|e| e.reason == "InvalidSpec")
                .count(),
            1
        );
        // The same failure again publishes no second event.
        let mut again = c.clone();
        again.status = Some(plan.status.clone());
        let plan2 = decide(&again, &world(), now());
        assert!(plan2.events.iter().all(|e| e.reason != "InvalidSpec"));
        // Fixing the spec clears the error (S2-36).
        again.spec.keeper.replicas = 3;
        again.metadata.generation = Some(2);
        let plan3 = decide(&again, &world(), now());
        assert!(plan3.failure.is_none());
        assert_ne!(plan3.status.state, ClusterState::Error);
        // The pass ran without a failure.
        let (status3, _) = report::report(
            &plan3,
            &step::Outcome::default(),
            again.metadata.generation,
            now(),
        );
        let cond = status3
            .conditions
            .iter()
            .find(|c| c.r#type == "ReconcileSucceeded")
            .unwrap();
        assert_eq!(cond.status, "True");
        assert_eq!(plan3.status.observed_generation, Some(2));
    }

    /// Decision 2: Keeper metadata a scale-in could not drop (no `SYSTEM DROP REPLICA`) is said
    /// in condition `KeeperMetadataLeft`, with the nodes left, beside the Warning event, and the
    /// condition stays in later passes.
    #[test]
    fn keeper_metadata_left_behind_sets_a_condition_that_stays() {
        let c = cluster(serde_json::json!({}));
        let plan = decide(&c, &world(), now());
        let left = PlannedEvent {
            kind: EventType::Warning,
            reason: status::KEEPER_METADATA_LEFT,
            action: "ScaleIn",
            message: "c1-0-1 left …: at /clickhouse/tables/0/default/events/replicas/c1-0-1".into(),
        };
        let outcome = step::Outcome {
            events: vec![left],
            ..step::Outcome::default()
        };
        let (status1, events) = report::report(&plan, &outcome, Some(1), now());
        let find = |s: &crate::api::ClickHouseClusterStatus| {
            s.conditions
                .iter()
                .find(|c| c.r#type == "KeeperMetadataLeft")
                .map(|c| (c.status.clone(), c.message.clone()))
        };
        let (state, message) = find(&status1).expect("the condition");
        assert_eq!(state, "True");
        assert!(message.contains("/replicas/c1-0-1"), "{message}");
        assert!(events.iter().any(|e| e.reason == "KeeperMetadataLeft"));
        let mut again = c.clone();
        again.status = Some(status1);
        let plan2 = decide(&again, &world(), now());
        let (status2, _) = report::report(&plan2, &step::Outcome::default(), Some(1), now());
        assert_eq!(find(&status2).map(|c| c.0).as_deref(), Some("True"));
    }

    /// Decision 10: an unknown schemaPolicy value is used as All, with a Warning event, once.
    #[test]
    fn unknown_schema_policy_gives_one_warning_event() {
        let c = cluster(
            serde_json::json!({"schemaPolicy": {"replica": "bogus", "shard": "distributedtablesonly"}}),
        );
        let plan = decide(&c, &world(), now());
        assert!(plan.failure.is_none(), "{:?}", plan.failure);
        let sp = plan.status.schema_policy.clone().unwrap();
        assert_eq!(
            (sp.replica.as_str(), sp.shard.as_str()),
            ("All", "DistributedTablesOnly")
        );
        let warned: Vec<_> = plan
            .events
            .iter()
            .filter(|e| e.reason == "SchemaPolicyReplaced")
            .collect();
        assert_eq!(warned.len(), 1);
        assert!(warned[0].message.contains("bogus"));
        let mut again = c.clone();
        again.status = Some(plan.status);
        assert!(
            decide(&again, &world(), now())
                .events
                .iter()
                .all(|e| e.reason != "SchemaPolicyReplaced")
        );
    }

    /// Decision 16: no redundancy is reported by a condition, not an error.
    #[test]
    fn single_replica_is_reported_by_a_condition() {
        let c = cluster(serde_json::json!({"replicas": 1, "keeper": {"replicas": 1}}));
        let plan = decide(&c, &world(), now());
        assert!(plan.failure.is_none(), "{:?}", plan.failure);
        let cond = plan
            .status
            .conditions
            .iter()
            .find(|c| c.r#type == "Redundant")
            .unwrap();
        assert_eq!(cond.status, "False");
        assert!(cond.message.contains("single copy"));
    }

    /// Decision 40: a LoadBalancer or NodePort client Service without TLS is allowed, and
    /// said once: a `PlainTextExposure` condition and one Warning event when it starts.
    #[test]
    fn a_client_service_outside_the_cluster_without_tls_draws_a_warning_once() {
        let c = cluster(serde_json::json!({"clientService": {"type": "LoadBalancer"}}));
        let plan = decide(&c, &world(), now());
        assert!(plan.failure.is_none());
        let cond = plan
            .status
            .conditions
            .iter()
            .find(|c| c.r#type == "PlainTextExposure")
            .unwrap();
        assert_eq!(cond.status, "True");
        let warned: Vec<_> = plan
            .events
            .iter()
            .filter(|e| e.reason == "PlainTextExposure")
            .collect();
        assert_eq!(warned.len(), 1);
        assert!(warned[0].message.contains("LoadBalancer without spec.tls"));
        let mut again = c.clone();
        again.status = Some(plan.status.clone());
        let plan2 = decide(&again, &world(), now());
        assert!(
            plan2.events.iter().all(|e| e.reason != "PlainTextExposure"),
            "said once"
        );
        let internal = cluster(serde_json::json!({}));
        let p = decide(&internal, &world(), now());
        let cond = p
            .status
            .conditions
            .iter()
            .find(|c| c.r#type == "PlainTextExposure")
            .unwrap();
        assert_eq!(cond.status, "False");
        assert!(p.events.iter().all(|e| e.reason != "PlainTextExposure"));
    }

    /// Unchanged input gives an unchanged status: the pass then writes nothing.
    #[test]
    fn a_second_pass_over_the_same_world_changes_nothing() {
        // The first pass adds the replicas to the map (a change); from then on, over the
        // same world, the status is a fixed point and nothing new is said.
        let c = cluster(serde_json::json!({}));
        let first = decide(&c, &world(), now());
        let mut again = c.clone();
        again.status = Some(first.status.clone());
        let plan = decide(&again, &world(), now());
        again.status = Some(plan.status.clone());
        let later: Timestamp = "2026-11-30T01:00:00Z".parse().unwrap();
        let plan2 = decide(&again, &world(), later);
        assert_eq!(plan2.status, plan.status);
        assert!(plan2.events.is_empty(), "{:?}", plan2.events);
    }
}
