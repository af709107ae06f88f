//! PURE: one reconcile pass over a valid cluster, as a list of phases in the order of S2-09.
//!
//! [`plan_pass`] reads the observation into [`Facts`] once, then runs each phase in turn. A
//! phase decides first and then emits steps; a phase that must hold back later work sets a
//! gate in [`Gates`] that the later phases read. Nothing is emitted and taken back. The status
//! the pass reports is computed last, by [`report::pass_status`].

mod build;
mod cleanup;
mod configuration;
mod credentials;
mod keeper;
mod pod_security;
mod replica_map;
mod report;
mod rollout;
mod scale_in;
mod schema;
mod servers;
mod services;
mod storage;
mod tls;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::facts::{Facts, Kind, Observed};
use super::rollout::Member;
use super::step::Step;
use super::{EventType, Failure, FailureReason, Plan, PlannedEvent};
use crate::api::{
    ClickHouseCluster, ClickHouseClusterSpec, ClickHouseClusterStatus, ReplicaName, ReplicaState,
    ReplicaStatus,
};
use crate::model::Desired;
use crate::model::changes::pod_template_changed;
use crate::model::diff::{FIELD_MANAGER, foreign_fields, object_covered};

/// Annotation on a ClickHouseCluster that allows removing shards, whose data is then lost.
pub const ALLOW_DATA_LOSS: &str = "clickhouse.com/allow-data-loss";
/// Annotation of a ClickHouseCluster: replicas (names, comma-separated) to give up and replace
/// by new replicas of their shards, say those of a node that will not come back (decision 54).
pub const REPLACE_REPLICAS: &str = "clickhouse.com/replace-replicas";

/// The phases of a pass, in the order [`plan_pass`] runs them (S2-09).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// Referenced Secrets exist; the operator's own credentials exist.
    Credentials,
    /// The Keeper ensemble's size for this pass, and every desired object built for it.
    Build,
    /// The Keeper objects, its pods repaired and rolled.
    Keeper,
    /// The ReplicaStateMap: scale-out, scale-in, pause, the backup replica of each shard.
    ReplicaMap,
    /// Server ConfigMaps and the users Secret (reloaded by ClickHouse, no restart).
    Configuration,
    /// Data volumes that grow in place.
    Storage,
    /// Turning TLS on or off: a full stop before the start.
    Tls,
    /// Server StatefulSets (created in parallel) and the shards' PodDisruptionBudgets.
    Servers,
    /// Existing server StatefulSets: other fields at once, outdated pod templates and pods one
    /// replica of a shard at a time after a canary (Smart Update).
    Rollout,
    /// Headless, client and Keeper client Services.
    Services,
    /// Owned objects no longer wanted.
    Cleanup,
    /// The schema copied onto new replicas.
    Schema,
    /// Removal of condemned replicas, step by step.
    ScaleIn,
}

/// What earlier phases decided that later ones must respect.
#[derive(Clone, Debug, Default)]
pub struct Gates {
    /// Nothing more happens in this pass (a missing Secret, an invalid spec, credentials just
    /// created).
    pub halted: bool,
    /// Servers may start: Keeper serves (every member of its current size is Ready), or the
    /// cluster's own ensemble is starting and the servers' version keeps trying a Keeper that
    /// does not serve yet (decision 58); with an external Keeper, once the cluster's root
    /// exists in it.
    pub servers_may_start: bool,
    /// New or condemned map entries must be persisted before anything acts on them (S0-19,
    /// S0-21): no schema copy and no scale-in step in this pass.
    pub map_first: bool,
    /// Server StatefulSets whose storage is being grown: no rollout while any is (S2-13).
    pub storage_busy: Vec<String>,
    /// A condemnation the map holds back while a backup reads from the replica (decision 77):
    /// the cluster is not ready until it is done.
    pub held_by_backup: bool,
}

/// What a pass reads and never changes: the cluster, the observation, and what is read from
/// them once. The phases hold it by shared reference, so none can change it.
pub struct Input<'a> {
    pub cluster: &'a ClickHouseCluster,
    pub spec: &'a ClickHouseClusterSpec,
    pub name: String,
    pub namespace: String,
    pub now: Timestamp,
    pub obs: &'a Observed,
    pub facts: Facts,
    /// The status the pass started from (the ReplicaStateMap adopted from the servers or the
    /// retained volumes when the status was lost).
    pub old: ClickHouseClusterStatus,
    /// The lowest version the servers report (see [`crate::plan::fleet::recorded_version`]).
    pub recorded_version: Option<crate::version::Version>,
    /// The version the generated configuration may rely on
    /// ([`crate::plan::fleet::usable_version`]).
    pub server_version: Option<crate::version::Version>,
}

/// What the Build phase made of the input: fixed for every phase after it, which hold it by
/// shared reference.
pub struct Built {
    /// Keeper members for this pass (one step towards `spec.keeper.replicas`).
    pub keeper_size: i32,
    /// Keeper's members and pods are `spec.keeper.replicas` and every member agrees on them
    /// (decision 25); the cluster is not `ready` before.
    pub keeper_settled: bool,
    /// Every object of the cluster, built for `keeper_size` (Keeper's StatefulSet with the
    /// pods the pass keeps: one more while a leaving member's pod still runs).
    pub desired: Desired,
    /// What `desired` was built from.
    pub inputs: crate::model::Inputs,
    /// Hosts listed in `remote_servers`.
    pub listed: u64,
    /// Per server StatefulSet: its observed pod template covers the desired one.
    pub template_current: BTreeMap<String, bool>,
}

/// A pass being planned: its input, what the Build phase made of it (`B`: nothing before that
/// phase, [`Built`] after it), and what the phases decided and emitted so far.
pub struct Pass<'a, B = &'a Built> {
    pub input: &'a Input<'a>,
    pub built: B,
    /// The ReplicaStateMap as this pass plans it.
    pub map: BTreeMap<ReplicaName, ReplicaStatus>,
    pub next_index: i64,
    /// Server replicas whose StatefulSet exists (set by the Rollout phase).
    pub members: Vec<Member>,
    pub gates: Gates,
    /// Why the pass waits, for the status message.
    pub waits: Vec<String>,
    /// A phase waits on something no watched object announces: the next pass comes soon.
    pub recheck: bool,
    wanted: BTreeSet<(Kind, String)>,
    phase: Phase,
    /// What the phases emitted so far (the plan of the pass).
    out: Plan,
}

/// A pass before the Build phase: the Credentials phase, and the Build phase itself.
pub type Early<'a> = Pass<'a, ()>;

/// Plans one pass over a cluster whose spec is valid.
pub fn plan_pass(cluster: &ClickHouseCluster, obs: &Observed, now: Timestamp) -> Plan {
    let input = Input::read(cluster, obs, now);
    let mut early = Pass::new(&input);
    early.run(Phase::Credentials, credentials::plan);
    early.phase = Phase::Build;
    let built = if early.gates.halted {
        None
    } else {
        build::build(&mut early)
    };
    let Some(built) = built else {
        return early.finish_halted();
    };
    let mut pass = early.with(&built);
    pass.run(Phase::Keeper, pod_security::plan);
    pass.run(Phase::Keeper, keeper::plan);
    pass.run(Phase::ReplicaMap, replica_map::plan);
    pass.run(Phase::Configuration, configuration::plan);
    pass.run(Phase::Storage, storage::plan);
    pass.run(Phase::Tls, tls::plan);
    pass.run(Phase::Servers, servers::plan);
    pass.run(Phase::Rollout, rollout::plan);
    pass.run(Phase::Services, services::plan);
    pass.run(Phase::Cleanup, cleanup::plan);
    pass.run(Phase::Schema, schema::plan);
    pass.run(Phase::ScaleIn, scale_in::plan);
    pass.finish()
}

impl<'a> Input<'a> {
    fn read(cluster: &'a ClickHouseCluster, obs: &'a Observed, now: Timestamp) -> Self {
        let mut old = cluster.status.clone().unwrap_or_default();
        if old.replica_state_map.is_empty() {
            // a lost status: the map is taken back from the servers that exist before anything
            // is built from it (docs/operations.md, "What happens on a bad day")
            let name = cluster.metadata.name.as_deref().unwrap_or_default();
            old.replica_state_map = crate::plan::replicas::adopt_observed(name, &obs.statefulsets);
            if old.replica_state_map.is_empty() {
                // created again on retained volumes: the replicas they hold
                old.replica_state_map = crate::plan::replicas::adopt_retained(name, &obs.pvcs);
            }
            // S0-13: each shard taken back has its backup replica from the first write on
            crate::plan::replicas::assign_backup_replicas(
                &mut old.replica_state_map,
                &|_: &str| crate::plan::replicas::ReplicaFacts::default(),
            );
            let next = old.replica_state_map.values().map(|r| r.index + 1).max();
            old.next_replica_index = old.next_replica_index.max(next.unwrap_or(0));
        }
        let live: Vec<&ReplicaName> = old
            .replica_state_map
            .iter()
            .filter(|(_, r)| r.state != ReplicaState::Condemned)
            .map(|(n, _)| n)
            .collect();
        let recorded_version = crate::plan::fleet::recorded_version(
            old.version.as_deref(),
            &obs.server_versions,
            &live,
        );
        let server_version =
            crate::plan::fleet::usable_version(recorded_version, &cluster.spec.image);
        Input {
            recorded_version,
            server_version,
            cluster,
            spec: &cluster.spec,
            name: cluster.metadata.name.clone().unwrap_or_default(),
            namespace: cluster.metadata.namespace.clone().unwrap_or_default(),
            now,
            obs,
            facts: Facts::read(cluster, obs, now),
            old,
        }
    }
}

impl<'a> Early<'a> {
    fn new(input: &'a Input<'a>) -> Self {
        Pass {
            input,
            built: (),
            map: input.old.replica_state_map.clone(),
            next_index: input.old.next_replica_index,
            members: Vec::new(),
            gates: Gates::default(),
            waits: Vec::new(),
            recheck: false,
            wanted: BTreeSet::new(),
            phase: Phase::Credentials,
            out: Plan {
                manage: true,
                ..Plan::default()
            },
        }
    }

    /// The pass from the Keeper phase on, with what the Build phase built.
    fn with(self, built: &'a Built) -> Pass<'a> {
        Pass {
            input: self.input,
            built,
            map: self.map,
            next_index: self.next_index,
            members: self.members,
            gates: self.gates,
            waits: self.waits,
            recheck: self.recheck,
            wanted: self.wanted,
            phase: self.phase,
            out: self.out,
        }
    }

    /// The plan of a pass halted before anything was built.
    fn finish_halted(mut self) -> Plan {
        self.out.status = report::halted_status(self.input, self.out.failure.as_ref());
        self.out
    }
}

impl<'a> Pass<'a> {
    fn finish(mut self) -> Plan {
        self.out.status = report::pass_status(&self);
        self.out.members = self.members.clone();
        self.out.recheck_soon =
            !self.gates.halted && (self.recheck || report::waits_on_servers(&self));
        self.out.again |= self.gates.map_first && self.out.failure.is_none();
        self.out
    }

    /// The replica's pod is Ready, on its StatefulSet's current revision and template.
    pub fn ready_and_current(&self, replica: &str) -> bool {
        let f = self.input.facts.server(replica);
        f.pod.ready
            && f.pod.current
            && self
                .built
                .template_current
                .get(replica)
                .copied()
                .unwrap_or(false)
    }
}

impl<'a, B> Pass<'a, B> {
    fn run(&mut self, phase: Phase, plan: fn(&mut Pass<'a, B>)) {
        if !self.gates.halted {
            self.phase = phase;
            plan(self);
        }
    }

    /// Emits a step.
    pub fn emit(&mut self, action: Step) {
        self.out.steps.push(action);
        self.out.phases.push(self.phase);
    }

    /// Emits an event.
    pub fn event(&mut self, reason: &'static str, action: &'static str, message: String) {
        self.out.events.push(PlannedEvent {
            kind: EventType::Normal,
            reason,
            action,
            message,
        });
    }

    /// Fails the pass (the first failure is kept); later phases still run unless it halts.
    pub fn fail(&mut self, reason: FailureReason, message: String) {
        if self.out.failure.is_none() {
            self.out.failure = Some(Failure { reason, message });
        }
    }

    /// Fails the pass and stops it.
    pub fn fail_and_halt(&mut self, reason: FailureReason, message: String) {
        self.fail(reason, message);
        self.gates.halted = true;
    }

    pub fn failed(&self) -> bool {
        self.out.failure.is_some()
    }

    pub fn failure(&self) -> Option<&Failure> {
        self.out.failure.as_ref()
    }

    /// Asks for the lag of these replicas to be read before the pass is planned again.
    pub fn check_lag(&mut self, replicas: Vec<ReplicaName>) {
        self.out.lag_checks = replicas;
    }

    /// Asks for another pass right after this one.
    pub fn again(&mut self) {
        self.out.again = true;
    }

    /// Records that an object is wanted (so cleanup keeps it).
    pub fn want(&mut self, kind: Kind, name: &str) {
        self.wanted.insert((kind, name.to_string()));
    }

    pub fn is_wanted(&self, kind: Kind, name: &str) -> bool {
        self.wanted.contains(&(kind, name.to_string()))
    }

    /// Wants an object and applies it unless the observed copy already covers it.
    pub fn apply(&mut self, kind: Kind, object: Value) {
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        self.want(kind, &name);
        let obs = self.input.obs;
        let observed = if kind == Kind::StatefulSet {
            obs.statefulsets.get(&name).map(json_of)
        } else {
            obs.objects.get(&(kind, name.clone())).cloned()
        };
        if !observed
            .as_ref()
            .is_some_and(|o| object_current(o, &object))
        {
            self.emit(Step::Apply {
                kind,
                create: observed.is_none(),
                name,
                object,
            });
        }
    }

    /// The non-condemned replicas of the map.
    pub fn live_replicas(&self) -> impl Iterator<Item = (&ReplicaName, &ReplicaStatus)> {
        self.map
            .iter()
            .filter(|(_, r)| r.state != ReplicaState::Condemned)
    }
}

/// A built object as JSON.
pub fn json_of<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("Kubernetes objects serialise")
}

/// The desired StatefulSet with the pod template it has now (and the hash of that template),
/// for writing its other fields without touching its pods. Its object hash stays the desired
/// one: it does not cover the template ([`crate::model::hash::restamp`]).
pub fn with_template_of(desired: &Value, observed: &Value) -> Value {
    let mut object = desired.clone();
    object["spec"]["template"] = observed["spec"]["template"].clone();
    let key = crate::model::labels::TEMPLATE_HASH;
    let annotations = &mut object["metadata"]["annotations"];
    match observed["metadata"]["annotations"][key].as_str() {
        Some(h) => annotations[key] = Value::String(h.to_string()),
        None => {
            if let Some(map) = annotations.as_object_mut() {
                map.remove(key);
            }
        }
    }
    object
}

/// A StatefulSet (as JSON) with the claim templates the observed one has, which cannot
/// change: taken as the API server returned them, so that no field is lost.
pub fn with_claims_of(mut object: Value, observed: &Value) -> Value {
    object["spec"]["volumeClaimTemplates"] = observed["spec"]["volumeClaimTemplates"].clone();
    object
}

/// Does the observed object hold what the operator wants, and nothing another writer added
/// to what it owns (decision 30: a hand edit is repaired, lists and maps included)?
pub fn object_current(observed: &Value, desired: &Value) -> bool {
    object_covered(observed, desired) && foreign_fields(observed, desired, FIELD_MANAGER).is_empty()
}

/// Does the observed StatefulSet's pod template cover the desired one (no restart needed), with
/// nothing another writer added to it?
fn template_covers(observed: &Value, desired: &Value) -> bool {
    let template = [
        crate::model::diff::Step::Field("spec".into()),
        crate::model::diff::Step::Field("template".into()),
    ];
    !pod_template_changed(observed, desired)
        && !foreign_fields(observed, desired, FIELD_MANAGER)
            .iter()
            .any(|f| f.path.starts_with(&template))
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod with_template_tests {
    use super::*;
    use serde_json::json;

    /// A StatefulSet the operator wrote, as the API server returns it (defaults in its template
    /// and elsewhere, a status), is current for the write of its other fields with its template
    /// left as it is: it is not written again for the defaults. A changed field still is.
    #[test]
    fn a_statefulset_as_written_is_not_written_again_for_its_templates_defaults() {
        let template = json!({"metadata": {"labels": {"a": "b"}},
            "spec": {"containers": [{"name": "clickhouse", "image": "i"}]}});
        let mut desired = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "c1-0-0", "annotations": {
                crate::model::labels::TEMPLATE_HASH: crate::model::hash::json_hash(&template)}},
            "spec": {"replicas": 1, "serviceName": "c1-headless", "template": template}});
        crate::model::hash::restamp(&mut desired);
        let mut observed = desired.clone();
        observed["spec"]["revisionHistoryLimit"] = json!(10);
        observed["spec"]["template"]["spec"]["dnsPolicy"] = json!("ClusterFirst");
        observed["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] =
            json!("IfNotPresent");
        observed["status"] = json!({"replicas": 1});
        assert!(object_current(
            &observed,
            &with_template_of(&desired, &observed)
        ));
        let mut scaled = desired.clone();
        scaled["spec"]["replicas"] = json!(0);
        crate::model::hash::restamp(&mut scaled);
        assert!(!object_current(
            &observed,
            &with_template_of(&scaled, &observed)
        ));
    }
}
