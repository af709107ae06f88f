//! PURE: the status and events after the executor ran a pass's plan: what the executor did (a
//! replica Ready after its schema copy, a scale-in step done, a failed step) added to the status
//! the pass planned (S2-14…S2-19).

use k8s_openapi::jiff::Timestamp;

use super::scale_in;
use super::status::{self, set_condition};
use super::step::{Outcome, Step};
use super::{EventType, Plan, PlannedEvent};
use crate::api::{ClickHouseClusterStatus, ClusterState, ReplicaState};

/// The status and events after the executor ran `plan`: steps done change the map (a replica
/// whose schema was copied is Ready, a scale-in step is recorded), and a failed step fails
/// the pass.
pub fn report(
    plan: &Plan,
    outcome: &Outcome,
    generation: Option<i64>,
    now: Timestamp,
) -> (ClickHouseClusterStatus, Vec<PlannedEvent>) {
    let mut status = plan.status.clone();
    let mut events = plan.events.clone();
    events.extend(outcome.events.iter().cloned());
    // decision 2: metadata a scale-in could not drop from Keeper is said in a condition
    if let Some(left) = outcome
        .events
        .iter()
        .rfind(|e| e.reason == status::KEEPER_METADATA_LEFT)
    {
        set_condition(
            &mut status.conditions,
            status::KEEPER_METADATA_LEFT,
            true,
            "NoDropReplica",
            &left.message,
            generation,
            now,
        );
    }
    for &i in &outcome.done {
        match plan.steps.get(i) {
            Some(Step::MigrateSchema { replica, .. }) => {
                if let Some(r) = status.replica_state_map.get_mut(replica) {
                    r.state = ReplicaState::Ready;
                }
            }
            Some(Step::ScaleIn(a)) => scale_in::record(&mut status.replica_state_map, a),
            Some(Step::EnsureKeeperRoot { root }) => status.keeper_root = Some(root.clone()),
            _ => {}
        }
    }
    if !outcome.waiting.is_empty() && status.state == ClusterState::Initializing {
        let mut message: Vec<String> = status.message.iter().cloned().collect();
        message.extend(outcome.waiting.iter().cloned());
        status.message = Some(message.join("; "));
    }
    if let Some(f) = &outcome.failure {
        status = status::failed(&status, generation, f, now);
        events.push(PlannedEvent {
            kind: EventType::Warning,
            reason: "ReconcileFailed",
            action: "Reconcile",
            message: f.message.clone(),
        });
    } else if plan.failure.is_none() {
        for condition in [status::RECONCILE_SUCCEEDED, status::SPEC_VALID] {
            set_condition(
                &mut status.conditions,
                condition,
                true,
                condition,
                "",
                generation,
                now,
            );
        }
    }
    (status, events)
}
