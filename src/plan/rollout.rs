//! PURE: which replicas to update or restart next when their pod template changed (the Smart
//! Update of S2-26…S2-34, the rolling reconciliation of S0-17, decisions 5, 6 and 8).
//!
//! Within a shard at most `maxUnavailable` replicas are down at once, counting the ones that
//! are already unready; the newest replica goes first and the shard's backup replica last.
//! A canary goes first: until one replica of the whole cluster is available on the new
//! template, only one replica of the cluster is rolled; then the shards roll in parallel, so
//! a bad change costs one host. A replica that is not Ready and not on the desired template is
//! repaired at once, whatever the budget: that cannot lower availability, and it is how
//! reverting a bad change heals (decision 5). A healthy replica leaves traffic and is drained
//! before its pod is deleted (decision 21). A StatefulSet's template is written only when
//! it is that replica's turn, so the new configuration never reaches a pod before its turn.

use crate::api::{ReplicaName, ShardIndex, UpdateStrategy};

/// One non-condemned replica whose StatefulSet exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub name: ReplicaName,
    pub shard: ShardIndex,
    pub index: i64,
    pub is_backup: bool,
    /// The StatefulSet's pod template differs from the desired one.
    pub template_outdated: bool,
    /// The pod runs an older revision than its StatefulSet's current one.
    pub pod_outdated: bool,
    /// The StatefulSet controller has seen the StatefulSet's last write (or there is no pod
    /// to compare): until then whether the pod is outdated is not known, so a replica whose
    /// template was just written is neither proven on it nor out of the rollout.
    pub settled: bool,
    /// The pod exists, is Ready, and has caught up with replication.
    pub available: bool,
    /// The pod is Ready (it may still be catching up).
    pub ready: bool,
    /// The pod is in the client Service's traffic.
    pub serving: bool,
    /// The other replicas of its shard have nothing left to fetch from it.
    pub drained: bool,
    /// Why the pod cannot start, when it cannot (CrashLoopBackOff, ErrImagePull,
    /// ImagePullBackOff, unschedulable for more than 2 minutes, catch-up deadline passed).
    pub failing: Option<String>,
}

impl Member {
    fn outdated(&self) -> bool {
        self.template_outdated || self.pod_outdated
    }

    /// On the new template but not (yet) available on it: being rolled.
    fn in_flight(&self) -> bool {
        !self.template_outdated && (self.pod_outdated || !self.available || !self.settled)
    }

    /// Available on the new template, as far as the StatefulSet controller has seen it.
    fn proven(&self) -> bool {
        !self.outdated() && self.available && self.settled
    }
}

/// What the rollout does in this pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RolloutPlan {
    /// StatefulSets whose template is written now.
    pub write_templates: Vec<ReplicaName>,
    /// Replicas whose pods are taken out of traffic now, to be restarted once their shard
    /// fetched their parts.
    pub exclude_pods: Vec<ReplicaName>,
    /// Replicas whose pods are deleted now so that they come back on the new revision
    /// (SmartUpdate).
    pub restart_pods: Vec<ReplicaName>,
    /// Why the rollout waits, if it does.
    pub waiting: Vec<String>,
    /// Set when the rollout must stop: a restarted pod cannot start.
    pub failure: Option<String>,
}

/// Conditions outside the replicas that hold back a Smart Update.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RolloutGates {
    /// A ClickHouseBackup of the cluster is Starting or Running (S2-27).
    pub backup_in_flight: Option<String>,
    /// The client Service exists (S2-30).
    pub client_service_ready: bool,
}

/// How many replicas of the whole cluster may still start rolling in this pass before one is
/// proven on the new template: `None` once one is (no limit but the shards' budgets).
fn canary_slots(members: &[Member]) -> Option<usize> {
    let proven = members.iter().any(Member::proven);
    let rolling = members.iter().any(Member::in_flight);
    match (proven, rolling) {
        (true, _) => None,
        (false, true) => Some(0),
        (false, false) => Some(1),
    }
}

/// The canary's slots: template writes ([`canary_slots`]) and restarts of replicas already
/// on the new template ([`restart_canary_slots`]).
struct Canary {
    writes: Option<usize>,
    restarts: Option<usize>,
}

/// How many replicas already on the new template but on an old pod (their StatefulSets
/// recreated) may start their restart in this pass before one is proven on the new
/// template: one while none has started (left traffic or restarted), then none until one is
/// proven, then no limit but the shards' budgets.
fn restart_canary_slots(members: &[Member]) -> Option<usize> {
    let proven = members.iter().any(Member::proven);
    let started = members
        .iter()
        .any(|m| m.in_flight() && (!m.serving || !m.pod_outdated));
    match (proven, started) {
        (true, _) => None,
        (false, true) => Some(0),
        (false, false) => Some(1),
    }
}

/// Plans the rollout over `members` (all shards).
pub fn plan_rollout(
    members: &[Member],
    strategy: UpdateStrategy,
    max_unavailable: i32,
    gates: &RolloutGates,
) -> RolloutPlan {
    let mut plan = RolloutPlan::default();
    if strategy == UpdateStrategy::OnDelete {
        // Specs are updated, nothing is restarted (S2-34).
        plan.write_templates = members
            .iter()
            .filter(|m| m.template_outdated)
            .map(|m| m.name.clone())
            .collect();
        return plan;
    }
    let mut shards: Vec<ShardIndex> = members.iter().map(|m| m.shard).collect();
    shards.sort();
    shards.dedup();
    let mut canary = Canary {
        writes: canary_slots(members),
        restarts: restart_canary_slots(members),
    };
    for shard in shards {
        let mut group: Vec<&Member> = members.iter().filter(|m| m.shard == shard).collect();
        // Newest first, the backup replica last (decision 6).
        group.sort_by_key(|m| (m.is_backup, std::cmp::Reverse(m.index)));
        if group.iter().any(|m| m.outdated()) {
            plan_shard(
                &mut plan,
                shard,
                &group,
                strategy,
                max_unavailable,
                gates,
                &mut canary,
            );
        }
    }
    plan
}

/// Another replica of `m`'s shard is available (so `m` can leave traffic).
fn others_available(group: &[&Member], m: &Member) -> bool {
    group.iter().any(|o| o.name != m.name && o.available)
}

fn plan_shard(
    plan: &mut RolloutPlan,
    shard: ShardIndex,
    group: &[&Member],
    strategy: UpdateStrategy,
    max_unavailable: i32,
    gates: &RolloutGates,
    canary: &mut Canary,
) {
    let rollout = ShardRollout {
        shard,
        group,
        smart: strategy == UpdateStrategy::SmartUpdate,
        max_unavailable,
        gates,
    };
    let smart = rollout.smart;
    // A pod of the new revision that cannot start stops the rollout (S2-31; end to end:
    // faults::reverting_bad_server_changes_heals_under_write_load); a failing pod of an old
    // revision is replaced below.
    if smart && let Some(m) = group.iter().find(|m| !m.outdated() && m.failing.is_some()) {
        plan.failure = Some(format!(
            "rollout stopped: {} {}",
            m.name,
            m.failing.as_deref().unwrap_or_default()
        ));
        return;
    }
    let backup = rollout.backup();
    for m in group
        .iter()
        .filter(|m| rollout.read_by_backup(m) && !m.ready && m.outdated())
    {
        plan.waiting.push(format!(
            "shard {shard}: {} is not Ready; backup {backup} reads from it, so it is restarted once the backup is over",
            m.name
        ));
    }
    // Repair: not Ready and not on the desired template (decision 5). A full crash of the
    // shard is the same case for every replica (S2-12, decision 14).
    let repaired: Vec<&&Member> = group
        .iter()
        .filter(|m| m.template_outdated && !m.ready && !rollout.read_by_backup(m))
        .collect();
    plan.write_templates
        .extend(repaired.iter().map(|m| m.name.clone()));
    if group.iter().all(|m| !m.ready) {
        for m in group.iter().filter(|m| {
            !m.template_outdated && m.pod_outdated && smart && !rollout.read_by_backup(m)
        }) {
            plan.restart_pods.push(m.name.clone());
        }
        return;
    }
    // Replicas being rolled: on the new template but not yet available on it.
    let in_flight: Vec<&&Member> = group.iter().filter(|m| m.in_flight()).collect();
    rollout.restart_in_flight(plan, &in_flight, canary);
    rollout.write_templates(plan, in_flight.len(), repaired.len(), canary);
}

/// The rollout of one shard: its replicas in the order they roll, and what the rollout may do.
struct ShardRollout<'a> {
    shard: ShardIndex,
    group: &'a [&'a Member],
    /// A Smart Update.
    smart: bool,
    max_unavailable: i32,
    gates: &'a RolloutGates,
}

impl ShardRollout<'_> {
    /// S2-27: the shard's backup replica, which a running backup reads from, is not restarted
    /// while the backup runs, not even to repair it (a readiness probe that failed once under
    /// load would otherwise end the backup); the backup ends (or fails) first.
    fn read_by_backup(&self, m: &Member) -> bool {
        self.smart && m.is_backup && self.gates.backup_in_flight.is_some()
    }

    /// The backup that runs, for messages.
    fn backup(&self) -> &str {
        self.gates.backup_in_flight.as_deref().unwrap_or_default()
    }

    /// Restarts the replicas `in_flight` whose pods are still old (a Smart Update), each out of
    /// traffic and drained first, `max_unavailable` at a time; says what the others wait for.
    fn restart_in_flight(
        &self,
        plan: &mut RolloutPlan,
        in_flight: &[&&Member],
        canary: &mut Canary,
    ) {
        let (shard, group, max_unavailable) = (self.shard, self.group, self.max_unavailable);
        // Several replicas of a shard can be on the new template at once without a template
        // write by this rollout (their StatefulSets recreated for a new volume): the healthy
        // ones still go out of traffic and restart `max_unavailable` at a time, in the group's
        // order, counting the ones already restarted and not yet available again.
        let mut taken = in_flight
            .iter()
            .filter(|m| !m.pod_outdated && !m.available)
            .count();
        for m in in_flight {
            if m.pod_outdated && self.smart {
                let others_available = others_available(group, m);
                if self.read_by_backup(m) {
                    if m.ready {
                        plan.waiting.push(format!(
                            "shard {shard}: waiting for backup {} to finish before {} restarts",
                            self.backup(),
                            m.name
                        ));
                    }
                    continue;
                }
                if !m.ready || group.len() == 1 {
                    // Broken, or alone in its shard: nothing to protect or to drain.
                    plan.restart_pods.push(m.name.clone());
                    continue;
                }
                if taken >= max_unavailable.max(1) as usize {
                    plan.waiting.push(format!(
                        "shard {shard}: {} waits its turn to restart ({max_unavailable} at a time)",
                        m.name
                    ));
                    continue;
                }
                if m.serving {
                    // not started yet: the first of the cluster is the canary
                    match &mut canary.restarts {
                        Some(0) => {
                            plan.waiting.push(format!(
                                "shard {shard}: {} waits for the first replica restarted (the canary) to be available",
                                m.name
                            ));
                            continue;
                        }
                        Some(n) => *n -= 1,
                        None => {}
                    }
                }
                taken += 1;
                if !others_available {
                    plan.waiting.push(format!(
                        "shard {shard}: {} waits for another replica to be available before its restart",
                        m.name
                    ));
                } else if m.serving {
                    // Out of traffic first; restarted once the shard fetched its last parts.
                    plan.exclude_pods.push(m.name.clone());
                } else if m.drained {
                    plan.restart_pods.push(m.name.clone());
                } else {
                    plan.waiting.push(format!(
                        "shard {shard}: waiting for the other replicas to fetch the last parts of {} before its restart",
                        m.name
                    ));
                }
            } else if !m.available {
                plan.waiting.push(format!(
                    "shard {shard}: waiting for {} to be {} on its new revision",
                    m.name,
                    if m.ready { "caught up" } else { "Ready" }
                ));
            }
        }
    }

    /// Writes the new template of the healthy outdated replicas within the disruption budget
    /// that the `in_flight` and `repaired` replicas left, once the gates are open.
    fn write_templates(
        &self,
        plan: &mut RolloutPlan,
        in_flight: usize,
        repaired: usize,
        canary: &mut Canary,
    ) {
        let (shard, group, max_unavailable) = (self.shard, self.group, self.max_unavailable);
        let healthy: Vec<&&Member> = group
            .iter()
            .filter(|m| m.template_outdated && m.ready)
            .collect();
        if healthy.is_empty() {
            return;
        }
        if self.smart {
            if let Some(b) = &self.gates.backup_in_flight {
                plan.waiting
                    .push(format!("shard {shard}: waiting for backup {b} to finish"));
                return;
            }
            if !self.gates.client_service_ready {
                plan.waiting
                    .push(format!("shard {shard}: waiting for the client Service"));
                return;
            }
        }
        let unavailable_other = healthy.iter().filter(|m| !m.available).count() as i32;
        let down = (in_flight + repaired) as i32 + unavailable_other;
        let mut budget = max_unavailable - down;
        for m in healthy {
            if budget <= 0 {
                if in_flight == 0 {
                    plan.waiting.push(format!(
                        "shard {shard}: {down} unavailable replica(s) already use the disruption budget of {max_unavailable}"
                    ));
                }
                break;
            }
            match &mut canary.writes {
                Some(0) => {
                    plan.waiting.push(format!(
                        "shard {shard}: waiting for the first replica rolled (the canary) to be available on the new template"
                    ));
                    break;
                }
                Some(n) => *n -= 1,
                None => {}
            }
            plan.write_templates.push(m.name.clone());
            // A Smart Update restarts it next: it leaves traffic with the template write, so
            // the drain starts one pass sooner (the restart still waits for the drain and for
            // the StatefulSet controller to show its pod outdated).
            if self.smart && m.serving && others_available(group, m) {
                plan.exclude_pods.push(m.name.clone());
            }
            budget -= 1;
        }
    }
}

/// The whole rollout over `members`, decided pass after pass by [`plan_rollout`] as if every
/// restarted replica came back available at once: the replicas restarted together, wave by
/// wave (what `clickhouse-operator plan` shows). With `RollingUpdate` a written template is a
/// restart by the StatefulSet controller; with `OnDelete` nothing restarts.
pub fn waves(
    members: &[Member],
    strategy: UpdateStrategy,
    max_unavailable: i32,
) -> Vec<Vec<ReplicaName>> {
    let gates = RolloutGates {
        backup_in_flight: None,
        client_service_ready: true,
    };
    let mut ms = members.to_vec();
    let mut out = Vec::new();
    for _ in 0..(4 * members.len() + 4) {
        let p = plan_rollout(&ms, strategy, max_unavailable, &gates);
        if p.failure.is_some() {
            break;
        }
        let mut progressed = false;
        let mut restarted = p.restart_pods.clone();
        for m in ms.iter_mut() {
            if p.write_templates.contains(&m.name) {
                m.template_outdated = false;
                progressed = true;
                match strategy {
                    UpdateStrategy::SmartUpdate => m.pod_outdated = true,
                    UpdateStrategy::RollingUpdate => restarted.push(m.name.clone()),
                    UpdateStrategy::OnDelete => {}
                }
            }
            if p.exclude_pods.contains(&m.name) {
                m.serving = false;
                m.drained = true;
                progressed = true;
            }
        }
        for m in ms.iter_mut().filter(|m| restarted.contains(&m.name)) {
            m.pod_outdated = false;
            m.available = true;
            m.ready = true;
            m.serving = true;
        }
        if !restarted.is_empty() {
            restarted.sort();
            restarted.dedup();
            out.push(restarted);
            progressed = true;
        }
        if !progressed {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn member(name: &str, shard: i32, index: i64, backup: bool) -> Member {
        Member {
            name: name.into(),
            shard: ShardIndex(shard),
            index,
            is_backup: backup,
            template_outdated: true,
            pod_outdated: false,
            settled: true,
            available: true,
            ready: true,
            serving: true,
            drained: true,
            failing: None,
        }
    }

    fn gates() -> RolloutGates {
        RolloutGates {
            backup_in_flight: None,
            client_service_ready: true,
        }
    }

    /// Decision 5, for a new volume (docs/configuration.md, "Storage"): when every replica of a
    /// shard is on the new template at once (their StatefulSets recreated), one healthy replica at
    /// a time goes out of traffic and restarts, the newest first and the backup replica last: the
    /// others wait their turn in traffic (both were taken out and restarted together before).
    #[test]
    fn replicas_all_on_the_new_template_still_restart_one_at_a_time() {
        let mut ms = vec![member("a0", 0, 0, true), member("a1", 0, 1, false)];
        for m in &mut ms {
            m.template_outdated = false;
            m.pod_outdated = true;
        }
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert_eq!(p.exclude_pods, ["a1"], "{p:?}");
        assert!(p.restart_pods.is_empty(), "{p:?}");
        // a1 out of traffic and drained: restarted; a0 still waits in traffic
        ms[1].serving = false;
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert_eq!(p.restart_pods, ["a1"], "{p:?}");
        assert!(p.exclude_pods.is_empty(), "{p:?}");
        // a1 restarted, not Ready yet: a0 waits
        ms[1].pod_outdated = false;
        ms[1].ready = false;
        ms[1].available = false;
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert!(
            p.restart_pods.is_empty() && p.exclude_pods.is_empty(),
            "{p:?}"
        );
        // a1 back: now a0
        ms[1].ready = true;
        ms[1].available = true;
        ms[1].serving = true;
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert_eq!(p.exclude_pods, ["a0"], "{p:?}");
    }

    /// Decision 5: with every replica of two shards on the new template at once, one replica of
    /// the whole cluster restarts first (the canary); the other shard waits until it is back.
    #[test]
    fn recreated_statefulsets_restart_a_canary_first() {
        let mut ms = vec![
            member("a0", 0, 0, true),
            member("a1", 0, 1, false),
            member("b2", 1, 2, true),
            member("b3", 1, 3, false),
        ];
        for m in &mut ms {
            m.template_outdated = false;
            m.pod_outdated = true;
        }
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert_eq!(p.exclude_pods, ["a1"], "{p:?}");
        ms[1].serving = false;
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert_eq!(p.restart_pods, ["a1"], "{p:?}");
        assert!(
            p.exclude_pods.is_empty(),
            "the other shard waits for the canary: {p:?}"
        );
        ms[1].pod_outdated = false;
        ms[1].serving = true;
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert_eq!(
            p.exclude_pods,
            ["a0", "b3"],
            "then the shards in parallel: {p:?}"
        );
    }

    /// S2-28 / decision 6: newest first, the backup replica last, one at a time (S0-17).
    #[test]
    fn rollout_goes_newest_first_and_backup_last_one_at_a_time() {
        let mut ms = vec![
            member("r0", 0, 0, true),
            member("r1", 0, 1, false),
            member("r2", 0, 2, false),
        ];
        let mut order = Vec::new();
        for _ in 0..10 {
            let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
            assert!(p.write_templates.len() + p.restart_pods.len() <= 1, "{p:?}");
            if let Some(n) = p.write_templates.first() {
                order.push(n.clone());
                let m = ms.iter_mut().find(|m| &m.name == n).unwrap();
                m.template_outdated = false;
                m.pod_outdated = true;
            } else if let Some(n) = p.exclude_pods.first() {
                ms.iter_mut().find(|m| &m.name == n).unwrap().serving = false;
            } else if let Some(n) = p.restart_pods.first() {
                let m = ms.iter_mut().find(|m| &m.name == n).unwrap();
                m.pod_outdated = false;
                m.available = true;
                m.serving = true;
            } else {
                break;
            }
        }
        assert_eq!(order, ["r2", "r1", "r0"]);
        assert!(ms.iter().all(|m| !m.template_outdated && !m.pod_outdated));
    }

    /// S0-18 / decision 5: an already unready replica uses the budget, so no healthy replica
    /// is taken down, and the status says why; the broken replica itself, not on the desired
    /// template, is repaired at once.
    #[test]
    fn broken_replica_uses_the_budget_and_is_repaired_first() {
        let mut ms = vec![member("r0", 0, 0, true), member("r1", 0, 1, false)];
        ms[0].available = false;
        ms[0].ready = false;
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert_eq!(p.write_templates, ["r0"], "{p:?}");
        assert!(p.restart_pods.is_empty());
        assert!(p.waiting[0].contains("disruption budget"), "{p:?}");
        // With maxUnavailable 2 one more may go.
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 2, &gates());
        assert_eq!(p.write_templates, ["r0", "r1"]);
    }

    /// Decision 5, invariant 4: reverting a bad change heals. A replica stuck on the bad
    /// template (not Ready, say unschedulable or crash-looping) gets the desired template at
    /// once and its pod is replaced at once, with maxUnavailable 1 and whatever the canary.
    #[test]
    fn reverting_a_bad_change_repairs_the_broken_replica_at_once() {
        let mut ms = vec![
            member("a0", 0, 0, true),
            member("a1", 0, 1, false),
            member("b0", 1, 2, true),
        ];
        for m in &mut ms {
            m.template_outdated = false;
        }
        // a1 got the bad template and cannot start; the spec is reverted, so its StatefulSet
        // is now the outdated one.
        ms[1].template_outdated = true;
        ms[1].ready = false;
        ms[1].available = false;
        ms[1].failing = Some("pod a1-0: ErrImagePull".into());
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert_eq!(p.write_templates, ["a1"], "{p:?}");
        assert!(
            p.failure.is_none(),
            "the revert is not a failed rollout: {p:?}"
        );
        // Its StatefulSet has the desired template; the broken pod is still the old revision.
        ms[1].template_outdated = false;
        ms[1].pod_outdated = true;
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert_eq!(p.restart_pods, ["a1"], "{p:?}");
    }

    /// S2-27 / S2-30 / S2-33: Smart Update waits for a running backup and for the client Service;
    /// RollingUpdate waits for neither.
    #[test]
    fn smart_update_waits_for_backup_and_client_service() {
        let ms = vec![member("r0", 0, 0, true), member("r1", 0, 1, false)];
        let g = RolloutGates {
            backup_in_flight: Some("b1".into()),
            client_service_ready: true,
        };
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &g);
        assert!(p.write_templates.is_empty());
        assert!(p.waiting[0].contains("backup b1"));
        let g = RolloutGates {
            backup_in_flight: None,
            client_service_ready: false,
        };
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &g);
        assert!(p.waiting[0].contains("client Service"));
        // S2-33: RollingUpdate does not wait for backups.
        let g = RolloutGates {
            backup_in_flight: Some("b1".into()),
            client_service_ready: false,
        };
        let p = plan_rollout(&ms, UpdateStrategy::RollingUpdate, 1, &g);
        assert_eq!(p.write_templates, ["r1"]);
    }

    /// S2-27 with decision 5: while a backup runs, the shard's backup replica (which the backup
    /// reads from) is not restarted even when it is not Ready and outdated, and the status says
    /// why; another replica that is not Ready is still repaired at once; after the backup the
    /// backup replica is repaired.
    #[test]
    fn a_running_backup_keeps_its_replica_even_when_it_is_not_ready() {
        let mut ms = vec![member("r0", 0, 0, true), member("r1", 0, 1, false)];
        ms[0].ready = false;
        ms[0].available = false;
        let g = RolloutGates {
            backup_in_flight: Some("b1".into()),
            client_service_ready: true,
        };
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &g);
        assert!(p.write_templates.is_empty(), "{p:?}");
        assert!(p.restart_pods.is_empty(), "{p:?}");
        assert!(
            p.waiting
                .iter()
                .any(|w| w.contains("r0 is not Ready; backup b1")),
            "{p:?}"
        );
        // on the new template already, its pod still old: not restarted either
        ms[0].template_outdated = false;
        ms[0].pod_outdated = true;
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &g);
        assert!(p.restart_pods.is_empty(), "{p:?}");
        // every replica down (a full crash of the shard): the others are restarted
        ms[1].ready = false;
        ms[1].available = false;
        ms[1].template_outdated = false;
        ms[1].pod_outdated = true;
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &g);
        assert_eq!(p.restart_pods, ["r1"], "{p:?}");
        // the other replica broken, the backup replica healthy: the broken one is repaired
        let mut ms = vec![member("r0", 0, 0, true), member("r1", 0, 1, false)];
        ms[1].ready = false;
        ms[1].available = false;
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &g);
        assert_eq!(p.write_templates, ["r1"], "{p:?}");
        // the backup over: the backup replica is repaired
        let mut ms = vec![member("r0", 0, 0, true), member("r1", 0, 1, false)];
        ms[0].ready = false;
        ms[0].available = false;
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert_eq!(p.write_templates, ["r0"], "{p:?}");
    }

    /// S2-31: a pod on the new template that cannot start stops the rollout.
    #[test]
    fn failing_pod_stops_the_rollout() {
        let mut ms = vec![member("r0", 0, 0, true), member("r1", 0, 1, false)];
        ms[1].template_outdated = false;
        ms[1].available = false;
        ms[1].ready = false;
        ms[1].failing = Some("pod r1-0: ErrImagePull".into());
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert!(p.failure.as_deref().unwrap().contains("ErrImagePull"));
        assert!(p.write_templates.is_empty() && p.restart_pods.is_empty());
    }

    /// S2-34: OnDelete updates every spec and restarts nothing.
    #[test]
    fn on_delete_writes_specs_and_restarts_nothing() {
        let ms = vec![member("r0", 0, 0, true), member("r1", 0, 1, false)];
        let p = plan_rollout(&ms, UpdateStrategy::OnDelete, 1, &gates());
        assert_eq!(p.write_templates.len(), 2);
        assert!(p.restart_pods.is_empty());
    }

    /// S2-12: a shard with no ready replica is brought to the new spec at once.
    #[test]
    fn crashed_shard_recovers_in_parallel() {
        let mut ms = vec![member("r0", 0, 0, true), member("r1", 0, 1, false)];
        for m in &mut ms {
            m.ready = false;
            m.available = false;
        }
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert_eq!(p.write_templates.len(), 2);
    }

    /// Decision 5: a canary goes first; once it is available on the new template, the shards
    /// roll in parallel, one replica of each shard at once.
    #[test]
    fn a_canary_goes_first_then_the_shards_roll_in_parallel() {
        let mut ms = vec![
            member("a0", 0, 0, true),
            member("a1", 0, 1, false),
            member("b0", 1, 2, true),
            member("b1", 1, 3, false),
        ];
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert_eq!(p.write_templates, ["a1"]);
        assert_eq!(p.exclude_pods, ["a1"], "it leaves traffic with its write");
        assert!(p.waiting.iter().any(|w| w.contains("canary")), "{p:?}");
        // The canary restarts once drained: still nothing else moves.
        ms[1].serving = false;
        ms[1].template_outdated = false;
        ms[1].pod_outdated = true;
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert_eq!(p.restart_pods, ["a1"]);
        assert!(p.write_templates.is_empty(), "{p:?}");
        ms[1].pod_outdated = false;
        ms[1].available = false;
        ms[1].ready = false;
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert!(p.write_templates.is_empty(), "{p:?}");
        // Available on the new template: the rest goes, shards in parallel.
        ms[1].available = true;
        ms[1].ready = true;
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert_eq!(p.write_templates, ["a0", "b1"]);
    }

    /// A Smart Update takes a replica out of traffic first and restarts it only once the other
    /// replicas of its shard have fetched its last parts (a peer gone mid-fetch stalls them).
    #[test]
    fn a_replica_restarts_only_once_its_shard_fetched_its_parts() {
        let mut ms = vec![member("r0", 0, 0, true), member("r1", 0, 1, false)];
        ms[1].template_outdated = false;
        ms[1].pod_outdated = true;
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert_eq!(p.exclude_pods, ["r1"]);
        assert!(p.restart_pods.is_empty());
        ms[1].serving = false;
        ms[1].drained = false;
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert!(
            p.restart_pods.is_empty() && p.exclude_pods.is_empty(),
            "{p:?}"
        );
        assert!(p.waiting[0].contains("fetch the last parts of r1"), "{p:?}");
        ms[1].drained = true;
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert_eq!(p.restart_pods, ["r1"]);
    }

    /// Decision 21: a healthy replica leaves traffic in the pass that writes its template, so
    /// its drain starts at once; it restarts only once the StatefulSet controller shows its pod
    /// outdated and the other replicas of its shard fetched its last parts. Alone in its shard,
    /// or with no other replica available, it stays in traffic until its restart.
    #[test]
    fn a_replica_leaves_traffic_with_its_template_write_and_restarts_once_settled() {
        let mut ms = vec![member("r0", 0, 0, true), member("r1", 0, 1, false)];
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert_eq!(p.write_templates, ["r1"], "{p:?}");
        assert_eq!(p.exclude_pods, ["r1"], "{p:?}");
        assert!(p.restart_pods.is_empty(), "{p:?}");
        // written and out of traffic, the StatefulSet controller has not seen the write yet
        ms[1].template_outdated = false;
        ms[1].serving = false;
        ms[1].settled = false;
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert!(
            p.restart_pods.is_empty() && p.write_templates.is_empty() && p.exclude_pods.is_empty(),
            "{p:?}"
        );
        // seen: the pod is outdated, and drained
        ms[1].settled = true;
        ms[1].pod_outdated = true;
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert_eq!(p.restart_pods, ["r1"], "{p:?}");
        // RollingUpdate: the StatefulSet controller restarts it; no exclusion
        let ms = vec![member("r0", 0, 0, true), member("r1", 0, 1, false)];
        let p = plan_rollout(&ms, UpdateStrategy::RollingUpdate, 1, &gates());
        assert_eq!(p.write_templates, ["r1"], "{p:?}");
        assert!(p.exclude_pods.is_empty(), "{p:?}");
        // alone in its shard: nothing to drain
        let ms = vec![member("s0", 0, 0, false)];
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert_eq!(p.write_templates, ["s0"], "{p:?}");
        assert!(p.exclude_pods.is_empty(), "{p:?}");
        // its only peer unavailable (max 2 unavailable): it keeps serving
        let mut ms = vec![member("t0", 0, 0, true), member("t1", 0, 1, false)];
        ms[0].available = false;
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 2, &gates());
        assert_eq!(p.write_templates, ["t1"], "{p:?}");
        assert!(p.exclude_pods.is_empty(), "{p:?}");
    }

    /// Nothing outdated: nothing to do.
    #[test]
    fn nothing_outdated_means_no_work() {
        let mut ms = vec![member("r0", 0, 0, true), member("r1", 0, 1, false)];
        for m in &mut ms {
            m.template_outdated = false;
        }
        let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, 1, &gates());
        assert_eq!(p, RolloutPlan::default());
    }

    proptest! {
        /// S0-18 / invariant 4: simulating a Smart Update with random availability, the rollout
        /// never makes more than maxUnavailable replicas of a shard unavailable.
        #[test]
        fn never_exceeds_max_unavailable(
            n in 1usize..6, max in 1i32..3, seed in proptest::collection::vec(any::<bool>(), 60)
        ) {
            let mut ms: Vec<Member> = (0..n).map(|i| member(&format!("r{i}"), 0, i as i64, i == 0)).collect();
            let mut coin = seed.into_iter().cycle();
            for _ in 0..60 {
                let p = plan_rollout(&ms, UpdateStrategy::SmartUpdate, max, &gates());
                for name in &p.write_templates {
                    let m = ms.iter_mut().find(|m| &m.name == name).unwrap();
                    m.template_outdated = false;
                    m.pod_outdated = true;
                }
                for name in &p.exclude_pods {
                    ms.iter_mut().find(|m| &m.name == name).unwrap().serving = false;
                }
                for name in &p.restart_pods {
                    let m = ms.iter_mut().find(|m| &m.name == name).unwrap();
                    m.pod_outdated = false;
                    m.available = false;
                    m.ready = false;
                    m.serving = true;
                }
                let down = ms.iter().filter(|m| !m.available || m.pod_outdated && !m.template_outdated).count() as i32;
                prop_assert!(down <= max, "{} down with max {}", down, max);
                // Restarted pods come back at random times.
                for m in ms.iter_mut() {
                    if !m.available && coin.next().unwrap() {
                        m.available = true;
                        m.ready = true;
                    }
                }
            }
        }
    }

    /// `plan` shows the rollout the operator runs: the canary alone first, then the shards in
    /// parallel within their budgets, each shard's backup replica last.
    #[test]
    fn waves_show_the_canary_first_then_shards_in_parallel_backup_replicas_last() {
        let members = vec![
            member("c1-0-0", 0, 0, true),
            member("c1-0-1", 0, 1, false),
            member("c1-0-2", 0, 2, false),
            member("c1-1-3", 1, 3, true),
            member("c1-1-4", 1, 4, false),
        ];
        let w = waves(&members, UpdateStrategy::SmartUpdate, 1);
        assert_eq!(
            w,
            vec![
                vec!["c1-0-2".to_string()],
                vec!["c1-0-1".to_string(), "c1-1-4".to_string()],
                vec!["c1-0-0".to_string(), "c1-1-3".to_string()],
            ]
        );
        let all: usize = w.iter().map(Vec::len).sum();
        assert_eq!(all, members.len(), "every replica restarts once");
        assert!(waves(&members, UpdateStrategy::OnDelete, 1).is_empty());
        let rolling = waves(&members, UpdateStrategy::RollingUpdate, 1);
        assert_eq!(rolling.iter().map(Vec::len).sum::<usize>(), members.len());
        let current: Vec<Member> = members
            .iter()
            .cloned()
            .map(|mut m| {
                m.template_outdated = false;
                m
            })
            .collect();
        assert!(waves(&current, UpdateStrategy::SmartUpdate, 1).is_empty());
    }
}
