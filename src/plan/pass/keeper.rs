//! The Keeper ensemble (S2-09, decision 14: Keeper first). Its membership changes one member at
//! a time, and only while every current member is Ready, so a change of size never puts quorum
//! at risk. The size chosen for this pass decides the whole desired state (servers list the
//! Keeper members of this step), which is built here; then the Keeper objects are applied.

use super::{Pass, json_of};
use crate::api::ReplicaState;
use crate::model::{self, Cluster, ReplicaSpec, names};
use crate::plan::FailureReason;
use crate::plan::action::Action;
use crate::plan::facts::Kind;

pub fn plan(pass: &mut Pass) {
    pass.keeper_size = size_for_this_pass(pass);
    if !build_desired(pass) {
        return;
    }
    pass.gates.keeper_serving = pass.desired().keeper.is_none()
        || (pass.facts.keeper.size > 0 && pass.facts.keeper.all_ready());
    let Some(k) = &pass.desired().keeper else {
        return;
    };
    let objects = [
        (Kind::ConfigMap, json_of(&k.config)),
        (Kind::Service, json_of(&k.headless_service)),
        (Kind::StatefulSet, json_of(&k.statefulset)),
        (Kind::PodDisruptionBudget, json_of(&k.pdb)),
    ];
    for (kind, object) in objects {
        pass.apply(kind, object);
    }
    repair(pass);
}

/// A member that is not Ready on an old revision (a reverted bad change: unschedulable,
/// crash-looping, an image that cannot be pulled) is replaced at once: it serves nothing, and
/// the StatefulSet's own rolling update never replaces a pod that is not Ready (decision 5).
fn repair(pass: &mut Pass) {
    let keeper = names::keeper(&pass.name);
    let broken: Vec<(String, Option<String>)> = pass
        .facts
        .keeper
        .members
        .values()
        .filter(|m| !m.ready && m.old_revision)
        .map(|m| (m.pod.clone(), m.uid.clone()))
        .collect();
    for (pod, uid) in broken {
        pass.event(
            "RestartPod",
            "Repair",
            format!("replacing Keeper pod {pod}: not Ready on an old revision"),
        );
        pass.emit(Action::RestartPod {
            replica: keeper.clone(),
            pod,
            uid,
        });
    }
}

/// One member closer to `spec.keeper.replicas`, when every current member is Ready.
fn size_for_this_pass(pass: &mut Pass) -> i32 {
    let want = pass.spec.keeper.replicas;
    let k = &pass.facts.keeper;
    if !k.exists || pass.facts.mode.paused() {
        return want;
    }
    let have = k.size;
    let step = if have == 0 || have == want {
        want
    } else if k.all_ready_and_current() {
        have + (want - have).signum()
    } else {
        pass.waits.push(format!(
            "Keeper membership {have} → {want} waits until every member is Ready"
        ));
        have
    };
    if step != want {
        pass.waits.push(format!(
            "Keeper membership {want} reached one member at a time (now {step})"
        ));
    }
    step
}

/// Builds every object of the cluster for this pass: Keeper at `keeper_size`, servers for the
/// non-condemned replicas of the persisted map (a condemned replica is left alone until it is
/// removed), `remote_servers` listing a new replica once its pod has an address
/// ([`model::Inputs::listed`]). False when the spec cannot be built (the pass halts).
fn build_desired(pass: &mut Pass) -> bool {
    let mut stepped = pass.cluster.clone();
    stepped.spec.keeper.replicas = pass.keeper_size;
    let live: Vec<ReplicaSpec> = pass
        .old
        .replica_state_map
        .iter()
        .filter(|(_, r)| r.state != ReplicaState::Condemned)
        .map(|(n, r)| ReplicaSpec {
            name: n.clone(),
            shard: r.shard,
            index: r.index,
        })
        .collect();
    let listed: Vec<ReplicaSpec> = live
        .iter()
        .filter(|r| {
            pass.old.replica_state_map[&r.name].state != ReplicaState::Pending
                || pass.facts.server(&r.name).pod.address.is_some()
        })
        .cloned()
        .collect();
    pass.listed = listed.len() as u64;
    let mut inputs = pass.obs.inputs.clone();
    inputs.listed = Some(listed);
    inputs.replicas = live;
    let built = Cluster::new(&stepped).and_then(|c| model::desired(&c, &inputs));
    match built {
        Ok(d) => {
            for s in &d.server_statefulsets {
                let n = s.metadata.name.clone().unwrap_or_default();
                let current = pass
                    .facts
                    .server(&n)
                    .statefulset
                    .as_ref()
                    .is_some_and(|o| super::template_covers(o, &json_of(s)));
                pass.template_current.insert(n, current);
            }
            pass.desired = Some(d);
            true
        }
        Err(e) => {
            pass.fail_and_halt(FailureReason::InvalidSpec, e.to_string());
            false
        }
    }
}
