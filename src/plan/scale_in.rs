//! PURE: removing condemned replicas, the steps of S0-21…S0-30 with decisions 2 and 3:
//! out of traffic and topology spread → wait until every StatefulSet is Ready → sync the shard
//! on its backup replica → drop the leaving replica's replicated objects on it → delete its
//! StatefulSet → drop its Keeper metadata from a survivor → label its PVCs; only then does its
//! map entry go. The last completed step is kept in the entry, so every step resumes after a
//! crash, and nothing later runs before an earlier step succeeded.

use std::collections::BTreeMap;

use crate::api::{ReplicaName, ReplicaState, ReplicaStatus, ScaleInStep, ShardIndex};

/// One step of removing a replica, as the executor runs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScaleInAction {
    /// Remove the client-Service and topology-spread labels from its pod (no restart).
    LeaveTraffic { replica: ReplicaName },
    /// `SYSTEM SYNC REPLICA` for the shard's replicated tables on the backup replica; `None`
    /// when the whole shard is removed (nothing to sync to).
    SyncShard {
        replica: ReplicaName,
        backup: Option<ReplicaName>,
    },
    /// `DROP … SYNC` of its replicated tables, views and dictionaries, on itself.
    DropObjects { replica: ReplicaName },
    /// Delete its StatefulSet and per-replica ConfigMap.
    DeleteStatefulSet { replica: ReplicaName },
    /// `SYSTEM DROP REPLICA` (and `DROP DATABASE REPLICA`) from every surviving Ready replica
    /// of its shard; when its whole shard goes, from a Ready replica of another shard (`others`,
    /// tried in order), by the shard's Keeper paths.
    DropKeeperMetadata {
        replica: ReplicaName,
        shard: ShardIndex,
        survivors: Vec<ReplicaName>,
        others: Vec<ReplicaName>,
    },
    /// Label its PVCs `clickhouse.com/delete-pvc` and remove its map entry.
    LabelPvcsAndForget { replica: ReplicaName },
}

impl ScaleInAction {
    pub fn replica(&self) -> &str {
        match self {
            ScaleInAction::LeaveTraffic { replica }
            | ScaleInAction::SyncShard { replica, .. }
            | ScaleInAction::DropObjects { replica }
            | ScaleInAction::DeleteStatefulSet { replica }
            | ScaleInAction::DropKeeperMetadata { replica, .. }
            | ScaleInAction::LabelPvcsAndForget { replica } => replica,
        }
    }

    /// The step recorded once this action succeeded (`None` for the last one: the entry goes).
    pub fn completes(&self) -> Option<ScaleInStep> {
        match self {
            ScaleInAction::LeaveTraffic { .. } => Some(ScaleInStep::OutOfTraffic),
            ScaleInAction::SyncShard { .. } => Some(ScaleInStep::Synced),
            ScaleInAction::DropObjects { .. } => Some(ScaleInStep::TablesDropped),
            ScaleInAction::DeleteStatefulSet { .. } => Some(ScaleInStep::Deleted),
            ScaleInAction::DropKeeperMetadata { .. } => Some(ScaleInStep::KeeperCleaned),
            ScaleInAction::LabelPvcsAndForget { .. } => None,
        }
    }
}

/// What the scale-in does in this pass: per condemned replica, the remaining steps in order
/// (the executor stops a replica's chain at its first failure), and why it waits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScaleInPlan {
    pub chains: Vec<Vec<ScaleInAction>>,
    pub waiting: Vec<String>,
    /// It waits on something no watched object announces (the client Service's
    /// EndpointSlices): the next pass should come soon.
    pub recheck_soon: bool,
}

/// Plans the scale-in. `sts_ready(name)` tells whether a replica's StatefulSet exists with its
/// pod Ready; `ready(name)` whether a survivor can run SQL now; `never_ran(name)` whether a
/// replica's pod was never started on a node (say, unschedulable) and none of its volumes was
/// ever bound: such a condemned replica holds no data and no Keeper metadata, and its removal
/// does not wait for it to be Ready, which it may never be (decision 48); nor does the removal
/// of a whole shard (allowed to lose its data) wait for a replica whose pod is gone
/// (`pod_gone`: no pod, or its node lost), whose Keeper metadata a server of another shard
/// then drops or names (decision 76). `routed(name,
/// just_left)` says why the client Service may still route to a replica's pod (`None`: it
/// does not), `just_left` when its pod leaves the Service in this very pass (what was observed
/// predates that): its shard is synced and its tables dropped only once it does not (decision
/// 75).
pub fn plan_scale_in(
    map: &BTreeMap<ReplicaName, ReplicaStatus>,
    sts_ready: impl Fn(&str) -> bool,
    sts_exists: impl Fn(&str) -> bool,
    never_ran: impl Fn(&str) -> bool,
    pod_gone: impl Fn(&str) -> bool,
    routed: impl Fn(&str, bool) -> Option<String>,
) -> ScaleInPlan {
    let mut plan = ScaleInPlan::default();
    let condemned: Vec<(&ReplicaName, &ReplicaStatus)> = map
        .iter()
        .filter(|(_, r)| r.state == ReplicaState::Condemned)
        .collect();
    if condemned.is_empty() {
        return plan;
    }
    // a shard none of whose replicas stays
    let removed_shard = |shard| {
        map.values()
            .all(|r| r.shard != shard || r.state == ReplicaState::Condemned)
    };
    // Step 2: every StatefulSet that still exists, survivors and condemned, must be Ready.
    let unready: Vec<&ReplicaName> = map
        .keys()
        .filter(|n| {
            let r = &map[*n];
            let still_there = r.scale_in_step.is_none_or(|s| s < ScaleInStep::Deleted);
            let condemned = r.state == ReplicaState::Condemned;
            let given_up =
                condemned && (r.released || never_ran(n) || pod_gone(n) && removed_shard(r.shard));
            still_there && sts_exists(n) && !sts_ready(n) && !given_up
                || !condemned && !sts_ready(n)
        })
        .collect();
    for (name, r) in condemned {
        let mut chain = Vec::new();
        let step = r.scale_in_step;
        let survivors: Vec<ReplicaName> = map
            .iter()
            .filter(|(n, s)| {
                s.shard == r.shard && s.state != ReplicaState::Condemned && sts_ready(n)
            })
            .map(|(n, _)| n.clone())
            .collect();
        let backup = map
            .iter()
            .find(|(_, s)| {
                s.shard == r.shard && s.is_backup_pod && s.state != ReplicaState::Condemned
            })
            .map(|(n, _)| n.clone());
        if step.is_none() {
            chain.push(ScaleInAction::LeaveTraffic {
                replica: name.clone(),
            });
        }
        // a replica given up by the user (decision 54) has nothing to sync from and is not
        // asked to drop anything: its pod may never answer again
        if step < Some(ScaleInStep::Synced) && !r.released {
            if !unready.is_empty() {
                plan.waiting.push(format!(
                    "scale-in of {name} waits until every StatefulSet is Ready (not ready: {})",
                    unready
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
                plan.chains.push(chain);
                continue;
            }
            // S0-22: no client reaches its tables once they are dropped
            if let Some(why) = routed(name, step.is_none()) {
                plan.waiting.push(format!(
                    "scale-in of {name} waits until the client Service no longer routes to it: {why}"
                ));
                plan.recheck_soon = true;
                plan.chains.push(chain);
                continue;
            }
            // `None`: the whole shard goes (its removal was allowed), nothing to sync to
            chain.push(ScaleInAction::SyncShard {
                replica: name.clone(),
                backup: backup.clone(),
            });
        }
        if step < Some(ScaleInStep::TablesDropped) && !r.released {
            chain.push(ScaleInAction::DropObjects {
                replica: name.clone(),
            });
        }
        if step < Some(ScaleInStep::Deleted) {
            chain.push(ScaleInAction::DeleteStatefulSet {
                replica: name.clone(),
            });
        }
        if step < Some(ScaleInStep::KeeperCleaned) {
            // the servers of other shards are asked only when no replica of its own is left
            let others: Vec<ReplicaName> = if survivors.is_empty() {
                map.iter()
                    .filter(|(n, s)| {
                        s.shard != r.shard && s.state != ReplicaState::Condemned && sts_ready(n)
                    })
                    .map(|(n, _)| n.clone())
                    .collect()
            } else {
                Vec::new()
            };
            chain.push(ScaleInAction::DropKeeperMetadata {
                replica: name.clone(),
                shard: r.shard,
                survivors: survivors.clone(),
                others,
            });
        }
        chain.push(ScaleInAction::LabelPvcsAndForget {
            replica: name.clone(),
        });
        plan.chains.push(chain);
    }
    plan
}

/// Applies a completed action to the map (the executor calls this after each success).
pub fn record(map: &mut BTreeMap<ReplicaName, ReplicaStatus>, action: &ScaleInAction) {
    match action.completes() {
        Some(step) => {
            if let Some(r) = map.get_mut(action.replica()) {
                r.scale_in_step = Some(step);
            }
        }
        None => {
            map.remove(action.replica());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn map() -> BTreeMap<ReplicaName, ReplicaStatus> {
        let mut m = BTreeMap::new();
        let e = |state, index, backup| ReplicaStatus {
            shard: ShardIndex(0),
            state,
            is_backup_pod: backup,
            index,
            scale_in_step: None,
            released: false,
        };
        m.insert("c1-0-0".into(), e(ReplicaState::Ready, 0, true));
        m.insert("c1-0-1".into(), e(ReplicaState::Condemned, 1, false));
        m.insert("c1-0-2".into(), e(ReplicaState::Condemned, 2, false));
        m
    }

    fn kinds(chain: &[ScaleInAction]) -> Vec<&'static str> {
        chain
            .iter()
            .map(|a| match a {
                ScaleInAction::LeaveTraffic { .. } => "leave",
                ScaleInAction::SyncShard { .. } => "sync",
                ScaleInAction::DropObjects { .. } => "drop-objects",
                ScaleInAction::DeleteStatefulSet { .. } => "delete",
                ScaleInAction::DropKeeperMetadata { .. } => "drop-keeper",
                ScaleInAction::LabelPvcsAndForget { .. } => "label-pvcs",
            })
            .collect()
    }

    /// S0-30 / S1-21: the steps in order, the sync on the shard's backup replica first.
    #[test]
    fn scale_in_steps_run_in_order_with_the_sync_on_the_backup_replica() {
        let p = plan_scale_in(
            &map(),
            |_| true,
            |_| true,
            |_| false,
            |_| false,
            |_, _| None,
        );
        assert_eq!(p.chains.len(), 2);
        assert_eq!(
            kinds(&p.chains[0]),
            [
                "leave",
                "sync",
                "drop-objects",
                "delete",
                "drop-keeper",
                "label-pvcs"
            ]
        );
        match &p.chains[0][1] {
            ScaleInAction::SyncShard { backup, .. } => {
                assert_eq!(backup.as_deref(), Some("c1-0-0"))
            }
            other => panic!("{other:?}"),
        }
        match &p.chains[0][4] {
            ScaleInAction::DropKeeperMetadata { survivors, .. } => {
                assert_eq!(survivors, &["c1-0-0".to_string()])
            }
            other => panic!("{other:?}"),
        }
    }

    /// S0-24: an unready StatefulSet defers everything after leaving traffic, and says which
    /// (on the real API server:
    /// `lifecycle::scale_in_waits_while_a_surviving_replica_is_down_and_completes_once_it_is_back`).
    #[test]
    fn unready_statefulset_defers_the_scale_in() {
        let p = plan_scale_in(
            &map(),
            |n| n != "c1-0-0",
            |_| true,
            |_| false,
            |_| false,
            |_, _| None,
        );
        assert!(p.chains.iter().all(|c| kinds(c) == ["leave"]));
        assert!(p.waiting[0].contains("c1-0-0"), "{:?}", p.waiting);
    }

    /// Decision 48: a condemned replica whose pod never ran (unschedulable, say) is removed
    /// without waiting for it to be Ready; an unready survivor still defers everything.
    #[test]
    fn a_condemned_replica_that_never_ran_does_not_hold_its_own_removal() {
        let condemned = map()
            .iter()
            .find(|(_, r)| r.state == ReplicaState::Condemned)
            .map(|(n, _)| n.clone())
            .unwrap();
        let c = condemned.as_str();
        let p = plan_scale_in(
            &map(),
            |n| n != c,
            |_| true,
            |n| n == c,
            |_| false,
            |_, _| None,
        );
        assert!(p.waiting.is_empty(), "{:?}", p.waiting);
        assert!(kinds(&p.chains[0]).contains(&"sync"), "{:?}", p.chains);
        let p = plan_scale_in(
            &map(),
            |n| n != c && n != "c1-0-0",
            |_| true,
            |n| n == c,
            |_| false,
            |_, _| None,
        );
        assert!(
            p.waiting[0].ends_with("(not ready: c1-0-0)"),
            "{:?}",
            p.waiting
        );
    }

    /// Decision 54: a replica the user gave up (its node lost for good) is removed without
    /// waiting for it, without a sync from it and without asking it to drop anything; its
    /// Keeper metadata is still dropped from a survivor and its volumes labelled; a resumed
    /// removal does not go back to the skipped steps.
    #[test]
    fn a_given_up_replica_is_removed_without_asking_anything_of_it() {
        let mut m = map();
        m.get_mut("c1-0-1").unwrap().released = true;
        let down = |n: &str| n != "c1-0-1";
        let p = plan_scale_in(&m, down, |_| true, |_| false, |_| false, |_, _| None);
        assert_eq!(
            kinds(&p.chains[0]),
            ["leave", "delete", "drop-keeper", "label-pvcs"]
        );
        // nor does it hold the removal of another condemned replica
        assert_eq!(kinds(&p.chains[1]).len(), 6, "{:?}", p.chains[1]);
        assert!(p.waiting.is_empty(), "{:?}", p.waiting);
        // not given up, the same unready replica holds both
        let mut kept = m.clone();
        kept.get_mut("c1-0-1").unwrap().released = false;
        let p = plan_scale_in(&kept, down, |_| true, |_| false, |_| false, |_, _| None);
        assert!(p.chains.iter().all(|c| kinds(c) == ["leave"]));
        m.get_mut("c1-0-1").unwrap().scale_in_step = Some(ScaleInStep::OutOfTraffic);
        let p = plan_scale_in(&m, down, |_| true, |_| false, |_| false, |_, _| None);
        assert_eq!(kinds(&p.chains[0]), ["delete", "drop-keeper", "label-pvcs"]);
    }

    /// Decision 3: a restarted operator resumes after the last recorded step; never deletes
    /// before the sync (S0-25).
    #[test]
    fn resumes_after_the_recorded_step() {
        let mut m = map();
        m.get_mut("c1-0-1").unwrap().scale_in_step = Some(ScaleInStep::Deleted);
        let p = plan_scale_in(
            &m,
            |n| n != "c1-0-1",
            |n| n != "c1-0-1",
            |_| false,
            |_| false,
            |_, _| None,
        );
        assert_eq!(kinds(&p.chains[0]), ["drop-keeper", "label-pvcs"]);
        let mut m = map();
        m.get_mut("c1-0-1").unwrap().scale_in_step = Some(ScaleInStep::OutOfTraffic);
        let p = plan_scale_in(&m, |_| true, |_| true, |_| false, |_| false, |_, _| None);
        assert_eq!(kinds(&p.chains[0])[0], "sync");
    }

    /// Decision 75 (S0-22): the shard is synced and the tables dropped only once the client
    /// Service no longer routes to the leaving pod: never in the pass that takes it out of the
    /// Service (what was observed predates that), and not while a slice still lists it; the
    /// wait says why and asks for a pass soon.
    #[test]
    fn the_tables_are_dropped_only_once_the_client_service_no_longer_routes_to_the_pod() {
        let listed = |n: &str, just_left: bool| {
            (just_left || n == "c1-0-1").then(|| format!("{n} is listed"))
        };
        let p = plan_scale_in(&map(), |_| true, |_| true, |_| false, |_| false, listed);
        for chain in &p.chains {
            assert_eq!(kinds(chain), ["leave"], "{:?}", p.waiting);
        }
        assert!(p.recheck_soon);
        assert!(
            p.waiting[0].contains("client Service no longer routes"),
            "{:?}",
            p.waiting
        );
        let mut m = map();
        for r in m
            .values_mut()
            .filter(|r| r.state == ReplicaState::Condemned)
        {
            r.scale_in_step = Some(ScaleInStep::OutOfTraffic);
        }
        let p = plan_scale_in(&m, |_| true, |_| true, |_| false, |_| false, listed);
        assert_eq!(p.chains.len(), 2);
        assert!(
            p.chains[0].is_empty(),
            "c1-0-1 is still listed: {:?}",
            p.chains[0]
        );
        assert_eq!(
            kinds(&p.chains[1]),
            [
                "sync",
                "drop-objects",
                "delete",
                "drop-keeper",
                "label-pvcs"
            ]
        );
        assert_eq!(p.waiting.len(), 1);
        assert!(p.waiting[0].contains("c1-0-1 is listed"), "{:?}", p.waiting);
        // once past the sync the Service no longer matters (its pod is being emptied)
        m.get_mut("c1-0-1").unwrap().scale_in_step = Some(ScaleInStep::Synced);
        let p = plan_scale_in(&m, |_| true, |_| true, |_| false, |_| false, listed);
        assert_eq!(kinds(&p.chains[0])[0], "drop-objects");
    }

    /// S0-27: the Keeper metadata is dropped from every survivor of the shard; when the whole
    /// shard goes, from the Ready replicas of the other shards.
    #[test]
    fn keeper_metadata_is_dropped_from_every_survivor_or_from_another_shard() {
        let mut m = map();
        m.get_mut("c1-0-2").unwrap().state = ReplicaState::Ready;
        let keeper_step = |p: &ScaleInPlan| {
            p.chains[0]
                .iter()
                .find_map(|a| match a {
                    ScaleInAction::DropKeeperMetadata {
                        survivors, others, ..
                    } => Some((survivors.clone(), others.clone())),
                    _ => None,
                })
                .unwrap()
        };
        let p = plan_scale_in(&m, |_| true, |_| true, |_| false, |_| false, |_, _| None);
        assert_eq!(
            keeper_step(&p),
            (vec!["c1-0-0".into(), "c1-0-2".into()], vec![])
        );
        // the whole shard 1 goes; shard 0 stays, one of its replicas down
        let mut m = BTreeMap::new();
        let e = |shard, state, index| ReplicaStatus {
            shard: ShardIndex(shard),
            state,
            is_backup_pod: true,
            index,
            scale_in_step: None,
            released: false,
        };
        m.insert("c1-0-0".into(), e(0, ReplicaState::Ready, 0));
        m.insert("c1-0-1".into(), e(0, ReplicaState::Ready, 1));
        m.insert("c1-1-2".into(), e(1, ReplicaState::Condemned, 2));
        m.get_mut("c1-0-1").unwrap().is_backup_pod = false;
        let p = plan_scale_in(
            &m,
            |n| n != "c1-0-1",
            |_| true,
            |_| false,
            |_| false,
            |_, _| None,
        );
        assert_eq!(
            kinds(&p.chains[0]),
            ["leave"],
            "c1-0-1 is not ready: {:?}",
            p.waiting
        );
        let mut done = m.clone();
        done.get_mut("c1-1-2").unwrap().scale_in_step = Some(ScaleInStep::Deleted);
        let p = plan_scale_in(
            &done,
            |n| n != "c1-0-1",
            |_| true,
            |_| false,
            |_| false,
            |_, _| None,
        );
        assert_eq!(keeper_step(&p), (vec![], vec!["c1-0-0".into()]));
    }

    /// Decision 76: a whole shard removed does not wait for a replica of it whose pod is gone;
    /// a replica whose shard stays is waited for, gone or not (S0-24).
    #[test]
    fn a_removed_shards_gone_pod_is_not_waited_for() {
        let mut m = map();
        let gone = "c1-1-3";
        m.insert(
            gone.into(),
            ReplicaStatus {
                shard: ShardIndex(1),
                state: ReplicaState::Condemned,
                is_backup_pod: true,
                index: 3,
                scale_in_step: Some(ScaleInStep::OutOfTraffic),
                released: false,
            },
        );
        let p = plan_scale_in(
            &m,
            |n| n != gone,
            |_| true,
            |_| false,
            |n| n == gone,
            |_, _| None,
        );
        assert!(p.waiting.is_empty(), "{:?}", p.waiting);
        assert_eq!(
            kinds(p.chains.last().unwrap()),
            [
                "sync",
                "drop-objects",
                "delete",
                "drop-keeper",
                "label-pvcs"
            ]
        );
        // c1-0-1's shard stays: its gone pod is waited for
        let p = plan_scale_in(
            &m,
            |n| n != "c1-0-1",
            |_| true,
            |_| false,
            |n| n == "c1-0-1",
            |_, _| None,
        );
        assert!(
            p.waiting.iter().all(|w| w.ends_with("(not ready: c1-0-1)")) && p.waiting.len() == 3,
            "{:?}",
            p.waiting
        );
    }

    /// Nothing condemned: nothing to do.
    #[test]
    fn no_condemned_replica_means_no_work() {
        let mut m = map();
        m.retain(|_, r| r.state != ReplicaState::Condemned);
        assert_eq!(
            plan_scale_in(&m, |_| true, |_| true, |_| false, |_| false, |_, _| None),
            ScaleInPlan::default()
        );
    }

    proptest! {
        /// Crash at any step, then resume: running the chains pass after pass, stopping at a
        /// random point each time, always completes, in order, with the sync before the delete.
        #[test]
        fn crash_at_any_step_then_resume(cuts in proptest::collection::vec(0usize..7, 1..20)) {
            let mut m = map();
            let mut log: Vec<(String, &'static str)> = Vec::new();
            for cut in cuts.iter().chain(std::iter::repeat_n(&7, 10)) {
                let p = plan_scale_in(&m, |_| true, |n| m.get(n).is_none_or(|r| r.scale_in_step < Some(ScaleInStep::Deleted)), |_| false, |_| false, |_, _| None);
                for chain in &p.chains {
                    for a in chain.iter().take(*cut) {
                        log.push((a.replica().to_string(), kinds(std::slice::from_ref(a))[0]));
                        record(&mut m, a);
                    }
                }
            }
            prop_assert!(m.values().all(|r| r.state != ReplicaState::Condemned));
            for r in ["c1-0-1", "c1-0-2"] {
                let steps: Vec<&str> = log.iter().filter(|(n, _)| n == r).map(|(_, k)| *k).collect();
                let first = |k: &str| steps.iter().position(|s| *s == k).unwrap();
                prop_assert!(first("sync") < first("delete"));
                prop_assert!(first("delete") < first("label-pvcs"));
                prop_assert_eq!(steps.iter().filter(|s| **s == "delete").count(), 1);
            }
        }

        /// Decision 3 with the status written once per pass: a crash before a pass's status
        /// write loses what the pass recorded, and the next pass runs its steps again (each is
        /// idempotent; a StatefulSet deleted stays deleted). The scale-in still completes, and
        /// for each replica the first delete comes after a sync and before the PVCs are labelled.
        #[test]
        fn crash_before_the_pass_is_recorded_repeats_its_steps_and_still_completes(
            cuts in proptest::collection::vec(0usize..7, 1..20),
            crashes in proptest::collection::vec(any::<bool>(), 1..20),
        ) {
            let mut stored = map();
            let mut deleted = std::collections::BTreeSet::new();
            let mut log: Vec<(String, &'static str)> = Vec::new();
            let passes = cuts
                .iter()
                .zip(crashes.iter().chain(std::iter::repeat(&false)))
                .chain(std::iter::repeat_n((&7, &false), 10));
            for (cut, crash) in passes {
                let p = plan_scale_in(
                    &stored,
                    |n| !deleted.contains(n),
                    |n| !deleted.contains(n),
                    |_| false,
                    |_| false, |_, _| None,
                );
                let mut pass = stored.clone();
                for chain in &p.chains {
                    for a in chain.iter().take(*cut) {
                        let kind = kinds(std::slice::from_ref(a))[0];
                        if kind == "delete" {
                            deleted.insert(a.replica().to_string());
                        }
                        log.push((a.replica().to_string(), kind));
                        record(&mut pass, a);
                    }
                }
                if !crash {
                    stored = pass;
                }
            }
            prop_assert!(stored.values().all(|r| r.state != ReplicaState::Condemned));
            for r in ["c1-0-1", "c1-0-2"] {
                let steps: Vec<&str> = log.iter().filter(|(n, _)| n == r).map(|(_, k)| *k).collect();
                let first = |k: &str| steps.iter().position(|s| *s == k).unwrap();
                prop_assert!(first("sync") < first("delete"));
                prop_assert!(first("delete") < first("label-pvcs"));
            }
        }
    }
}
