//! Existing server StatefulSets (S0-17, S2-26…S2-34): fields other than the pod template (the
//! scale on pause and resume, labels, …) are written at once; a changed pod template is written
//! when the replica's turn comes in the Smart Update order ([`crate::plan::rollout`]), and a pod
//! left on an old revision is restarted. Nothing rolls while paused, while TLS is switched, or
//! while a volume grows.

use std::collections::BTreeSet;

use k8s_openapi::jiff::SignedDuration;
use serde_json::Value;

use super::{Pass, json_of, object_current, template_covers, with_claims_of, with_template_of};
use crate::api::{ReplicaName, ShardIndex, UpdateStrategy};
use crate::model::names;
use crate::plan::FailureReason;
use crate::plan::facts::{Kind, Mode};
use crate::plan::rollout::{self, Member, RolloutGates, RolloutPlan};
use crate::plan::step::Step;

/// How long a restarted replica may take to catch up with replication (S2-32), unless
/// `spec.catchUpSeconds` says otherwise.
pub const CATCH_UP_DEADLINE: SignedDuration = SignedDuration::from_secs(7200);

/// The catch-up deadline of a spec (S2-32).
pub fn catch_up_deadline(catch_up_seconds: Option<i64>) -> SignedDuration {
    catch_up_seconds.map_or(CATCH_UP_DEADLINE, SignedDuration::from_secs)
}

/// `2 hours`, `90 min`, `45 s`.
fn human(d: SignedDuration) -> String {
    let s = d.as_secs();
    match s {
        s if s >= 3600 && s % 3600 == 0 => {
            let h = s / 3600;
            format!("{h} hour{}", if h == 1 { "" } else { "s" })
        }
        s if s >= 60 && s % 60 == 0 => format!("{} min", s / 60),
        s => format!("{s} s"),
    }
}

/// A server StatefulSet that exists: the desired object (with the claim templates it has,
/// which cannot change in place) and the observed one.
struct Existing {
    name: ReplicaName,
    desired: Value,
    observed: Value,
}

pub fn plan(pass: &mut Pass) {
    let existing = existing(pass);
    pass.members = existing.iter().map(|e| member(pass, e)).collect();
    let decision = decide(pass);
    for e in &existing {
        write(pass, e, &decision);
    }
    for n in &decision.exclude_pods {
        pass.emit(Step::SetServing {
            replica: n.clone(),
            pod: names::replica_pod(n),
            serving: false,
        });
    }
    // A pod taken out of traffic for a restart that is not needed any more (the change was
    // reverted) goes back in.
    let back: Vec<ReplicaName> = pass
        .members
        .iter()
        .filter(|m| m.ready && !m.serving && !m.template_outdated && !m.pod_outdated && m.settled)
        .map(|m| m.name.clone())
        .collect();
    for n in back {
        pass.emit(Step::SetServing {
            pod: names::replica_pod(&n),
            replica: n,
            serving: true,
        });
    }
    for n in &decision.restart_pods {
        let pod = names::replica_pod(n);
        if pass.input.facts.server(n).pod.terminating {
            // deleted by an earlier pass and still stopping: not deleted (nor announced) again
            pass.waits
                .push(format!("{pod} is stopping for its restart"));
            continue;
        }
        pass.emit(Step::RestartPod {
            statefulset: n.to_string(),
            pod: pod.clone(),
            uid: pass.input.facts.server(n).pod.uid.clone(),
            // out of traffic already, or taken out just before by this pass
            serving: pass.input.facts.server(n).pod.serving && !decision.exclude_pods.contains(n),
        });
        pass.event(
            "RestartPod",
            "Rollout",
            format!("restarting {pod} on the new revision"),
        );
    }
    pass.waits.extend(decision.waiting.iter().cloned());
    if let Some(f) = decision.failure {
        // A replica that runs but lags is not a broken pod: once it catches up the rollout
        // goes on, which no Kubernetes event announces (the pass re-checks as usual).
        let lagging_only = pass
            .members
            .iter()
            .filter(|m| m.failing.is_some())
            .all(|m| pass.input.facts.server(&m.name).pod.failing.is_none());
        let reason = if lagging_only {
            FailureReason::CatchUpTimeout
        } else {
            FailureReason::RolloutFailed
        };
        pass.fail(reason, f);
    } else if !decision.write_templates.is_empty()
        || !decision.restart_pods.is_empty()
        || !decision.exclude_pods.is_empty()
    {
        let rolled: Vec<ReplicaName> = decision
            .write_templates
            .iter()
            .chain(&decision.exclude_pods)
            .chain(&decision.restart_pods)
            .cloned()
            .collect();
        pass.waits
            .push(format!("rolling out: {}", rolled.join(", ")));
    }
}

/// The server StatefulSets this phase looks after: those that exist, are not being deleted
/// and whose storage is not being grown.
fn existing(pass: &Pass) -> Vec<Existing> {
    pass.built
        .desired
        .server_statefulsets
        .iter()
        .filter_map(|d| {
            let name = ReplicaName::from(d.metadata.name.clone()?);
            let f = pass.input.facts.server(&name);
            if f.deleting || pass.gates.storage_busy.iter().any(|s| name == *s) {
                return None;
            }
            let observed = f.statefulset.clone()?;
            let desired = with_claims_of(json_of(d), &observed);
            Some(Existing {
                name,
                desired,
                observed,
            })
        })
        .collect()
}

fn member(pass: &Pass, e: &Existing) -> Member {
    let entry = pass.map.get(e.name.as_str());
    let pod = &pass.input.facts.server(&e.name).pod;
    let caught_up = pass.input.obs.caught_up.get(e.name.as_str()).copied();
    let deadline = catch_up_deadline(pass.input.spec.catch_up_seconds);
    let failing = pod.failing.clone().or_else(|| {
        let since = pod.ready_since?;
        (caught_up == Some(false) && pass.input.now.duration_since(since) > deadline).then(|| {
            format!(
                "replica {} did not catch up with replication within {}; the rollout stops \
                 until it does (see its system.replicas and system.replication_queue)",
                e.name,
                human(deadline)
            )
        })
    });
    Member {
        name: e.name.clone(),
        shard: entry.map_or(ShardIndex(0), |r| r.shard),
        index: entry.map_or(0, |r| r.index),
        is_backup: entry.is_some_and(|r| r.is_backup_pod),
        template_outdated: !template_covers(&e.observed, &e.desired),
        // known to be on an old revision: a pod whose StatefulSet's status has not caught up
        // yet (just created, just written) is not restarted on a guess; or a pod whose grown
        // volume waits for it to start again (decision 44), restarted as carefully
        pod_outdated: pod.exists
            && (pod.outdated
                || pass
                    .input
                    .facts
                    .server(&e.name)
                    .file_system_waits_for_restart()),
        settled: !pod.exists || pod.current || pod.outdated,
        // Only a Smart Update waits for a restarted replica to catch up (S2-29, S2-33).
        available: pod.ready
            && (pass.input.spec.update_strategy != UpdateStrategy::SmartUpdate
                || caught_up != Some(false)),
        ready: pod.ready,
        serving: pod.serving,
        drained: pass
            .input
            .obs
            .pending_fetches
            .get(e.name.as_str())
            .is_some_and(|n| *n == Some(0)),
        failing,
    }
}

/// Which templates are written and which pods restart in this pass. Replication lag of the
/// Ready replicas of the shards being rolled must be known first.
fn decide(pass: &mut Pass) -> RolloutPlan {
    let outdated = |m: &Member| m.template_outdated || m.pod_outdated;
    // A server StatefulSet deleted with its pod kept, to be created again (new volumes), is no
    // member until it exists again: the rollout waits for it, so that its replica is ordered
    // with the others of its shard (the backup replica last) and not left out
    let recreating: Vec<String> = pass
        .built
        .desired
        .server_statefulsets
        .iter()
        .filter_map(|d| d.metadata.name.clone())
        .filter(|n| {
            let f = pass.input.facts.server(n);
            f.statefulset.is_none() && f.pod.exists
        })
        .collect();
    let active = pass.input.facts.mode == Mode::Running
        && pass.gates.storage_busy.is_empty()
        && recreating.is_empty()
        && pass.members.iter().any(outdated);
    let smart = pass.input.spec.update_strategy == UpdateStrategy::SmartUpdate;
    if !active {
        return RolloutPlan::default();
    }
    let shards: BTreeSet<ShardIndex> = pass
        .members
        .iter()
        .filter(|m| outdated(m))
        .map(|m| m.shard)
        .collect();
    let unknown: Vec<ReplicaName> = pass
        .members
        .iter()
        .filter(|m| {
            shards.contains(&m.shard)
                && m.ready
                && !pass.input.obs.caught_up.contains_key(m.name.as_str())
        })
        .map(|m| m.name.clone())
        .collect();
    if smart && !unknown.is_empty() {
        pass.check_lag(unknown);
    }
    let spec = pass.input.spec;
    let gates = RolloutGates {
        backup_in_flight: pass.input.obs.backup_in_flight.clone(),
        client_service_ready: !spec.client_service.enabled
            || pass
                .input
                .obs
                .objects
                .contains_key(&(Kind::Service, names::client_service(&pass.input.name))),
    };
    rollout::plan_rollout(
        &pass.members,
        spec.update_strategy,
        spec.pod_disruption_budget.max_unavailable,
        &gates,
    )
}

/// Writes one StatefulSet: the whole desired object when its template's turn came; else,
/// when fields other than the template differ, those (with the new template too when it runs
/// no pod, so nothing restarts).
fn write(pass: &mut Pass, e: &Existing, decision: &RolloutPlan) {
    let f = pass.input.facts.server(&e.name);
    let stopped = pass.input.facts.mode.paused() || f.scale == Some(0);
    if pass.input.facts.mode == Mode::SwitchingTls && !stopped {
        return; // the Tls phase stops it
    }
    let starts = f.scale == Some(0) && e.desired["spec"]["replicas"].as_i64().unwrap_or(1) > 0;
    if starts && !pass.gates.servers_may_start {
        // Resuming: servers start only once Keeper serves again, as on a first start.
        pass.waits
            .push(format!("{} starts once Keeper serves", e.name));
        return;
    }
    if decision.write_templates.contains(&e.name) {
        pass.apply(Kind::StatefulSet, e.desired.clone());
        return;
    }
    let rest = with_template_of(&e.desired, &e.observed);
    if !object_current(&e.observed, &rest) {
        let template_outdated = !template_covers(&e.observed, &e.desired);
        pass.emit(Step::Apply {
            kind: Kind::StatefulSet,
            name: e.name.to_string(),
            object: if template_outdated && stopped {
                e.desired.clone()
            } else {
                rest
            },
            create: false,
        });
    }
}
