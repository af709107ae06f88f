//! The backup and restore state machines, simulated pass by pass (decision 26): a
//! simulated namespace (a 2-shard × 2-replica cluster, its pods, agent Jobs, a bucket) answers
//! the steps the plan asks for, the operator may die between any two steps (what it did stays,
//! its status write is lost), and the world changes between passes (agents end, servers
//! restart, replicas leave, the bucket goes away). Every state and every failure is reached;
//! the invariants hold after every pass of random runs (proptest).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;
use serde_json::json;

use super::restore::{self, NamedBackup};
use super::take::{self as backup, Earlier};
use super::*;
use crate::api::{
    BackupState, ClickHouseBackup, ClickHouseCluster, ClickHouseRestore, ReplicaState, RestoreState,
};
use crate::model::manifest::{FORMAT, Manifest};

const SHARDS: [i32; 2] = [0, 1];

fn backup_replica(shard: i32) -> String {
    format!("c1-{shard}-0")
}

fn cluster() -> ClickHouseCluster {
    let mut map = serde_json::Map::new();
    for shard in SHARDS {
        for r in 0..2 {
            map.insert(
                format!("c1-{shard}-{r}"),
                json!({"shard": shard, "state": "Ready", "isBackupPod": r == 0, "index": r}),
            );
        }
    }
    serde_json::from_value(json!({
        "apiVersion": "clickhouse.com/v1alpha1", "kind": "ClickHouseCluster",
        "metadata": {"name": "c1", "namespace": "ns", "uid": "cluster-uid"},
        "spec": {"shards": 2, "replicas": 2,
                 "backup": {"destination": {"endpoint": "https://s3.example.com", "bucket": "backups",
                                            "secretName": "s3-creds"}}},
        "status": {"replicaStateMap": map}
    }))
    .unwrap()
}

fn created(at: Timestamp) -> serde_json::Value {
    json!(at.to_string())
}

fn new_backup(at: Timestamp, incremental: bool) -> ClickHouseBackup {
    serde_json::from_value(json!({
        "apiVersion": "clickhouse.com/v1alpha1", "kind": "ClickHouseBackup",
        "metadata": {"name": "b1", "namespace": "ns", "uid": "b1-uid", "creationTimestamp": created(at)},
        "spec": {"clusterName": "c1", "incremental": incremental}
    }))
    .unwrap()
}

fn new_restore(at: Timestamp) -> ClickHouseRestore {
    serde_json::from_value(json!({
        "apiVersion": "clickhouse.com/v1alpha1", "kind": "ClickHouseRestore",
        "metadata": {"name": "r1", "namespace": "ns", "uid": "r1-uid", "creationTimestamp": created(at)},
        "spec": {"clusterName": "c1", "backupName": "b0"}
    }))
    .unwrap()
}

/// One shard's agent Job in the simulation.
#[derive(Clone, Debug, PartialEq)]
enum SimJob {
    Running,
    Succeeded,
    Failed,
    Stuck,
}

/// A simulated namespace: what the steps change and the passes observe.
struct Sim {
    now: Timestamp,
    cluster: Option<std::sync::Arc<ClickHouseCluster>>,
    ready: BTreeSet<String>,
    /// Replicas whose pod is gone (not yet recreated).
    pod_gone: BTreeSet<String>,
    /// Shards whose server changed under their agent.
    server_changed: BTreeSet<i32>,
    jobs: BTreeMap<i32, SimJob>,
    /// Agents created, per shard (never more than one Job at a time).
    created: BTreeMap<i32, usize>,
    bucket_up: bool,
    manifest_written: bool,
    /// Shards the status records as done: a server that changes after that changes nothing.
    recorded_done: BTreeSet<i32>,
    /// The base candidates' manifests in the bucket.
    in_bucket: BTreeSet<String>,
    others: Vec<Earlier>,
    steps_seen: Vec<String>,
}

impl Sim {
    fn new() -> Sim {
        let cluster = cluster();
        let ready = cluster
            .status
            .as_ref()
            .unwrap()
            .replica_state_map
            .keys()
            .cloned()
            .collect();
        Sim {
            now: Timestamp::from_second(1_800_000_000).unwrap(),
            cluster: Some(std::sync::Arc::new(cluster)),
            ready,
            pod_gone: BTreeSet::new(),
            server_changed: BTreeSet::new(),
            jobs: BTreeMap::new(),
            created: BTreeMap::new(),
            bucket_up: true,
            manifest_written: false,
            recorded_done: BTreeSet::new(),
            in_bucket: BTreeSet::new(),
            others: Vec::new(),
            steps_seen: Vec::new(),
        }
    }

    fn tick(&mut self, secs: i64) {
        self.now += SignedDuration::from_secs(secs);
    }

    fn shard(&self, shard: i32, replica: &str) -> Shard {
        let report = Report {
            ok: true,
            parts_uploaded: 3,
            bytes_uploaded: 300,
            parts_attached: 3,
            bytes_downloaded: 300,
            ..Report::default()
        };
        let agent = match self.jobs.get(&shard) {
            None => Agent::Missing,
            Some(_) if self.server_changed.contains(&shard) => {
                Agent::ServerChanged("its server restarted (0 → 1 restarts)".into())
            }
            Some(SimJob::Running) => Agent::Running,
            Some(SimJob::Succeeded) => Agent::Done(report),
            Some(SimJob::Failed) => Agent::Failed("freezing db.t: Code: 60".into()),
            Some(SimJob::Stuck) => Agent::Stuck("ErrImagePull: no such image".into()),
        };
        Shard {
            replica: self
                .cluster
                .as_deref()
                .map_or(InMap::Leaving, |c| backup::in_map(c, replica)),
            placement: (!self.pod_gone.contains(replica)).then(|| crate::model::job::Placement {
                node: Some("node-a".into()),
                ..Default::default()
            }),
            agent,
        }
    }

    fn shards(&self, recorded: &[(i32, String)]) -> BTreeMap<i32, Shard> {
        recorded
            .iter()
            .map(|(s, r)| (*s, self.shard(*s, r)))
            .collect()
    }

    /// Runs the steps of `plan` (at most `limit` of them: the operator dies after that, and the
    /// status is not written); returns the outcome, or `None` when a step failed the pass.
    fn act(&mut self, steps: &[Step], limit: usize, bucket_shards: usize) -> Option<Outcome> {
        let mut outcome = Outcome::default();
        for step in steps.iter().take(limit) {
            match step {
                Step::CheckBucket { candidates, .. } => {
                    self.steps_seen.push("CheckBucket".into());
                    if !self.bucket_up {
                        outcome.refused = Some(Failure::new(
                            FailureReason::Bucket,
                            "cannot reach https://s3.example.com",
                        ));
                        return Some(outcome);
                    }
                    outcome.base = candidates
                        .iter()
                        .find(|c| self.in_bucket.contains(*c))
                        .cloned();
                }
                Step::ReadManifest { backup, .. } => {
                    self.steps_seen.push("ReadManifest".into());
                    if !self.bucket_up {
                        outcome.refused = Some(Failure::new(FailureReason::Bucket, "cannot reach"));
                        return Some(outcome);
                    }
                    outcome.manifest = Some(Manifest {
                        format: FORMAT,
                        backup: backup.clone(),
                        namespace: "ns".into(),
                        cluster: "c1".into(),
                        shards: (0..bucket_shards as i32).collect(),
                        base: None,
                        completed: self.now.to_string(),
                    });
                }
                Step::CreateAgent(job) => {
                    self.steps_seen.push(format!("CreateAgent {}", job.shard));
                    assert!(
                        !self.jobs.contains_key(&job.shard),
                        "a second agent for shard {}",
                        job.shard
                    );
                    assert_eq!(
                        job.replica,
                        backup_replica(job.shard),
                        "on the backup replica"
                    );
                    assert!(
                        !self.pod_gone.contains(&job.replica),
                        "beside a pod that exists"
                    );
                    self.jobs.insert(job.shard, SimJob::Running);
                    *self.created.entry(job.shard).or_default() += 1;
                }
                Step::WriteManifest { manifest, .. } => {
                    self.steps_seen.push("WriteManifest".into());
                    assert_eq!(manifest.shards, SHARDS);
                    if !self.bucket_up {
                        return None; // the pass fails and is retried; nothing is written
                    }
                    self.manifest_written = true;
                }
            }
        }
        if limit < steps.len() {
            return None;
        }
        Some(outcome)
    }

    fn backup_world(&self, b: &ClickHouseBackup) -> backup::World {
        let recorded: Vec<(i32, String)> = b
            .status
            .iter()
            .flat_map(|s| s.shards.iter().map(|s| (s.shard, s.replica.clone())))
            .collect();
        backup::World {
            now: self.now,
            cluster: self.cluster.clone(),
            ready: self.ready.clone(),
            shards: self.shards(&recorded),
            others: self.others.clone(),
            image: "operator:1".into(),
        }
    }

    /// One pass of `b`, dying after `limit` steps; the status is written only when the pass
    /// ran to its end.
    fn backup_pass(
        &mut self,
        b: &mut ClickHouseBackup,
        limit: usize,
    ) -> Plan<ClickHouseBackupStatus> {
        let plan = backup::decide(b, &self.backup_world(b));
        let Some(outcome) = self.act(&plan.steps.clone(), limit, 2) else {
            return plan;
        };
        let plan = backup::report(plan, &outcome, self.now);
        b.status = Some(plan.status.clone());
        plan
    }

    fn restore_world(&self, r: &ClickHouseRestore, backup: Option<NamedBackup>) -> restore::World {
        let recorded: Vec<(i32, String)> = r
            .status
            .iter()
            .flat_map(|s| s.shards.iter().map(|s| (s.shard, s.replica.clone())))
            .collect();
        restore::World {
            now: self.now,
            cluster: self.cluster.clone(),
            backup,
            backup_cluster_destination: None,
            ready: self.ready.clone(),
            shards: self.shards(&recorded),
            image: "operator:1".into(),
        }
    }

    fn restore_pass(
        &mut self,
        r: &mut ClickHouseRestore,
        backup: Option<NamedBackup>,
        bucket_shards: usize,
    ) -> Plan<ClickHouseRestoreStatus> {
        let plan = restore::decide(r, &self.restore_world(r, backup));
        let Some(outcome) = self.act(&plan.steps.clone(), usize::MAX, bucket_shards) else {
            return plan;
        };
        let plan = restore::report(plan, &outcome, 2, self.now);
        r.status = Some(plan.status.clone());
        plan
    }

    fn condemn(&mut self, replica: &str) {
        let c = std::sync::Arc::make_mut(self.cluster.as_mut().unwrap());
        let map = &mut c.status.as_mut().unwrap().replica_state_map;
        map.get_mut(replica).unwrap().state = ReplicaState::Condemned;
    }

    fn finish_jobs(&mut self, to: SimJob) {
        for j in self.jobs.values_mut() {
            *j = to.clone();
        }
    }
}

use crate::api::{ClickHouseBackupStatus, ClickHouseRestoreStatus};

/// A change to the simulated world, and one to it and the backup.
type Change = Box<dyn Fn(&mut Sim)>;
type ChangeBoth = Box<dyn Fn(&mut Sim, &mut ClickHouseBackup)>;

fn state(b: &ClickHouseBackup) -> BackupState {
    b.status.as_ref().map(|s| s.state).unwrap_or_default()
}

fn reason(b: &ClickHouseBackup) -> Option<String> {
    b.status.as_ref().and_then(|s| s.reason.clone())
}

/// S0-04, decision 26: New → Starting (the bucket checked, each shard's backup replica
/// recorded) → Running (one agent per shard, beside its backup replica) → Succeeded only once
/// every shard's agent succeeded, in the pass that writes the backup's manifest, last.
#[test]
fn a_backup_succeeds_only_after_every_shard_and_then_its_manifest() {
    let mut sim = Sim::new();
    let mut b = new_backup(sim.now, false);
    let p = sim.backup_pass(&mut b, usize::MAX);
    assert_eq!(state(&b), BackupState::Starting);
    assert_eq!(p.events[0].reason, "BackupStarted");
    let recorded: Vec<(i32, String)> = b
        .status
        .as_ref()
        .unwrap()
        .shards
        .iter()
        .map(|s| (s.shard, s.replica.clone()))
        .collect();
    assert_eq!(recorded, [(0, backup_replica(0)), (1, backup_replica(1))]);
    sim.backup_pass(&mut b, usize::MAX);
    assert_eq!(state(&b), BackupState::Running);
    assert_eq!(
        sim.created.values().sum::<usize>(),
        2,
        "one agent per shard"
    );
    sim.jobs.insert(0, SimJob::Succeeded);
    for _ in 0..3 {
        let p = sim.backup_pass(&mut b, usize::MAX);
        assert_eq!(state(&b), BackupState::Running, "shard 1 still runs");
        assert!(p.steps.is_empty(), "nothing created again: {:?}", p.steps);
        assert!(!sim.manifest_written);
    }
    assert!(b.status.as_ref().unwrap().shards[0].done);
    sim.jobs.insert(1, SimJob::Succeeded);
    let p = sim.backup_pass(&mut b, usize::MAX);
    assert_eq!(state(&b), BackupState::Succeeded);
    assert!(
        sim.manifest_written,
        "the manifest is written in the pass that succeeds"
    );
    let s = b.status.clone().unwrap();
    assert_eq!(s.bytes_uploaded, 600);
    assert_eq!(
        s.manifest.as_deref(),
        Some("s3://backups/ns/c1/backups/b1/manifest.json")
    );
    assert_eq!(p.events[0].reason, "BackupSucceeded");
    // over: nothing more happens, whatever is observed
    sim.finish_jobs(SimJob::Failed);
    let again = sim.backup_pass(&mut b, usize::MAX);
    assert!(again.steps.is_empty() && again.events.is_empty());
    assert_eq!(b.status.clone().unwrap(), s);
}

/// A manifest write that fails leaves the backup Running (the pass is retried), never
/// Succeeded without its manifest.
#[test]
fn a_backup_whose_manifest_cannot_be_written_is_not_succeeded() {
    let mut sim = Sim::new();
    let mut b = new_backup(sim.now, false);
    sim.backup_pass(&mut b, usize::MAX);
    sim.backup_pass(&mut b, usize::MAX);
    sim.finish_jobs(SimJob::Succeeded);
    sim.bucket_up = false;
    for _ in 0..3 {
        sim.backup_pass(&mut b, usize::MAX);
        assert_eq!(state(&b), BackupState::Running);
        assert!(b.status.as_ref().unwrap().manifest.is_none());
    }
    sim.bucket_up = true;
    sim.backup_pass(&mut b, usize::MAX);
    assert_eq!(state(&b), BackupState::Succeeded);
}

/// S0-04: a backup replica removed (condemned by a scale-in, or gone from the map)
/// during the backup always fails it, whatever its agent says; no manifest is written.
#[test]
fn a_removed_backup_replica_always_fails_the_backup() {
    for agent in [SimJob::Running, SimJob::Succeeded, SimJob::Failed] {
        let mut sim = Sim::new();
        let mut b = new_backup(sim.now, false);
        sim.backup_pass(&mut b, usize::MAX);
        sim.backup_pass(&mut b, usize::MAX);
        sim.jobs.insert(1, agent.clone());
        sim.condemn(&backup_replica(1));
        sim.jobs.insert(0, SimJob::Succeeded);
        let p = sim.backup_pass(&mut b, usize::MAX);
        assert_eq!(state(&b), BackupState::Failed, "{agent:?}");
        assert_eq!(reason(&b).as_deref(), Some("ReplicaRemoved"));
        assert!(
            b.status
                .as_ref()
                .unwrap()
                .message
                .as_ref()
                .unwrap()
                .contains("c1-1-0")
        );
        assert_eq!(p.events[0].reason, "BackupFailed");
        assert!(!sim.manifest_written);
    }
}

/// Every way a running shard fails ends the backup Failed with its own reason: its server
/// changed under the agent (even if the agent reports success), its agent cannot start, its
/// agent fails, the pod of its replica is gone before its agent was created, the cluster is
/// deleted.
#[test]
fn every_failure_of_a_running_backup_has_its_reason() {
    let cases: Vec<(&str, Change)> = vec![
        (
            "ServerChanged",
            Box::new(|s: &mut Sim| {
                s.jobs.insert(0, SimJob::Succeeded);
                s.server_changed.insert(0);
            }),
        ),
        (
            "AgentCannotStart",
            Box::new(|s: &mut Sim| {
                s.jobs.insert(0, SimJob::Stuck);
            }),
        ),
        (
            "AgentFailed",
            Box::new(|s: &mut Sim| {
                s.jobs.insert(1, SimJob::Failed);
            }),
        ),
        ("ClusterDeleted", Box::new(|s: &mut Sim| s.cluster = None)),
    ];
    for (expected, change) in cases {
        let mut sim = Sim::new();
        let mut b = new_backup(sim.now, false);
        sim.backup_pass(&mut b, usize::MAX);
        sim.backup_pass(&mut b, usize::MAX);
        change(&mut sim);
        sim.backup_pass(&mut b, usize::MAX);
        assert_eq!(state(&b), BackupState::Failed, "{expected}");
        assert_eq!(reason(&b).as_deref(), Some(expected));
        assert!(!sim.manifest_written);
    }
    // the replica's pod gone before its agent was created
    let mut sim = Sim::new();
    let mut b = new_backup(sim.now, false);
    sim.backup_pass(&mut b, usize::MAX);
    sim.pod_gone.insert(backup_replica(1));
    sim.backup_pass(&mut b, usize::MAX);
    assert_eq!(reason(&b).as_deref(), Some("ServerChanged"));
    assert_eq!(
        sim.created.get(&1),
        None,
        "no agent beside a pod that is gone"
    );
}

/// What refuses a backup before it starts, each with its reason; a missing cluster and
/// missing Ready backup replicas are waited for (the replicas for ten minutes).
#[test]
fn a_backup_is_refused_or_waits_before_it_starts() {
    let refused: Vec<(&str, ChangeBoth)> = vec![
        (
            "Destination",
            Box::new(|_: &mut Sim, b: &mut ClickHouseBackup| {
                b.spec.destination = Some(S3Destination {
                    endpoint: "https://attacker.example".into(),
                    bucket: "loot".into(),
                    secret_name: "c1-operator".into(),
                    access_key_id_key: Some("password".into()),
                    ..S3Destination::default()
                });
            }),
        ),
        (
            "ClusterPaused",
            Box::new(|s: &mut Sim, _: &mut ClickHouseBackup| {
                std::sync::Arc::make_mut(s.cluster.as_mut().unwrap())
                    .spec
                    .pause = true
            }),
        ),
        (
            "Bucket",
            Box::new(|s: &mut Sim, _: &mut ClickHouseBackup| s.bucket_up = false),
        ),
    ];
    for (expected, change) in refused {
        let mut sim = Sim::new();
        let mut b = new_backup(sim.now, false);
        change(&mut sim, &mut b);
        sim.backup_pass(&mut b, usize::MAX);
        assert_eq!(state(&b), BackupState::Failed, "{expected}");
        assert_eq!(reason(&b).as_deref(), Some(expected));
        assert!(sim.created.is_empty());
    }
    let mut sim = Sim::new();
    let mut b = new_backup(sim.now, false);
    let missing = sim.cluster.take();
    let p = sim.backup_pass(&mut b, usize::MAX);
    assert_eq!(
        state(&b),
        BackupState::New,
        "a cluster not found yet is waited for"
    );
    assert!(p.requeue.is_some());
    sim.cluster = missing;
    sim.ready.remove(&backup_replica(1));
    let p = sim.backup_pass(&mut b, usize::MAX);
    assert_eq!(state(&b), BackupState::New);
    assert!(p.status.message.unwrap().contains("shard(s) 1"));
    sim.tick(WAIT_FOR_REPLICAS.as_secs() as i64 + 1);
    sim.backup_pass(&mut b, usize::MAX);
    assert_eq!(reason(&b).as_deref(), Some("NoBackupReplica"));
}

/// An incremental backup builds on the newest earlier successful backup of the same cluster in
/// the same place whose manifest is in the bucket, and says so.
#[test]
fn an_incremental_backup_builds_on_the_newest_complete_one_in_its_place() {
    let mut sim = Sim::new();
    let earlier =
        |name: &str, completed: &str, succeeded, destination: Option<S3Destination>| Earlier {
            name: name.into(),
            cluster: "c1".into(),
            destination,
            succeeded,
            completed: Some(completed.into()),
        };
    let elsewhere = S3Destination {
        prefix: Some("other".into()),
        ..cluster().spec.backup.destination.unwrap()
    };
    sim.others = vec![
        earlier("old", "2026-01-01T00:00:00Z", true, None),
        earlier("newer", "2026-02-01T00:00:00Z", true, None),
        earlier("newest-but-failed", "2026-03-01T00:00:00Z", false, None),
        earlier(
            "newest-elsewhere",
            "2026-03-02T00:00:00Z",
            true,
            Some(elsewhere),
        ),
        earlier("not-in-bucket", "2026-02-15T00:00:00Z", true, None),
    ];
    sim.in_bucket = ["old", "newer", "newest-but-failed", "newest-elsewhere"]
        .into_iter()
        .map(String::from)
        .collect();
    let mut b = new_backup(sim.now, true);
    let p = sim.backup_pass(&mut b, usize::MAX);
    assert_eq!(b.status.as_ref().unwrap().base.as_deref(), Some("newer"));
    assert!(
        p.events[0].message.ends_with(", incremental on newer"),
        "{}",
        p.events[0].message
    );
    let mut full = new_backup(sim.now, false);
    sim.backup_pass(&mut full, usize::MAX);
    assert_eq!(full.status.unwrap().base, None, "a full backup has no base");
}

#[derive(Clone, Debug)]
enum Event {
    /// A pass that dies after this many steps (the status not written); `usize::MAX`: a whole pass.
    Pass(usize),
    AgentEnds(i32, bool),
    AgentStuck(i32),
    ServerChanges(i32),
    ReplicaLeaves(i32),
    PodGone(i32),
    PodBack(i32),
    Bucket(bool),
    Minutes(i64),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        6 => prop_oneof![Just(usize::MAX), 0..3usize].prop_map(Event::Pass),
        2 => (0..2i32, any::<bool>()).prop_map(|(s, ok)| Event::AgentEnds(s, ok)),
        1 => (0..2i32).prop_map(Event::AgentStuck),
        1 => (0..2i32).prop_map(Event::ServerChanges),
        1 => (0..2i32).prop_map(Event::ReplicaLeaves),
        1 => (0..2i32).prop_map(Event::PodGone),
        1 => (0..2i32).prop_map(Event::PodBack),
        1 => any::<bool>().prop_map(Event::Bucket),
        1 => (0..15i64).prop_map(Event::Minutes),
    ]
}

impl Sim {
    fn apply(&mut self, e: &Event) {
        match e {
            Event::Pass(_) => {}
            Event::AgentEnds(s, ok) => {
                if self.jobs.get(s) == Some(&SimJob::Running) {
                    self.jobs.insert(
                        *s,
                        if *ok {
                            SimJob::Succeeded
                        } else {
                            SimJob::Failed
                        },
                    );
                }
            }
            Event::AgentStuck(s) => {
                if self.jobs.get(s) == Some(&SimJob::Running) {
                    self.jobs.insert(*s, SimJob::Stuck);
                }
            }
            Event::ServerChanges(s) => {
                if self.jobs.contains_key(s) && !self.recorded_done.contains(s) {
                    self.server_changed.insert(*s);
                }
            }
            Event::ReplicaLeaves(s) => self.condemn(&backup_replica(*s)),
            Event::PodGone(s) => {
                self.pod_gone.insert(backup_replica(*s));
                self.ready.remove(&backup_replica(*s));
                if self.jobs.contains_key(s) && !self.recorded_done.contains(s) {
                    self.server_changed.insert(*s);
                }
            }
            Event::PodBack(s) => {
                self.pod_gone.remove(&backup_replica(*s));
                self.ready.insert(backup_replica(*s));
            }
            Event::Bucket(up) => self.bucket_up = *up,
            Event::Minutes(m) => self.tick(m * 60),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Whatever happens, in whatever order, with the operator dying between any two steps:
    /// never a second agent for a shard, never an agent off the recorded backup replica or
    /// beside a pod that is gone, Succeeded only with every shard's agent done on an unchanged
    /// server and the manifest written, Failed always with a reason and no manifest, and an
    /// ended backup never changes again. Once nothing fails any more, it ends.
    #[test]
    fn backups_keep_their_invariants_through_any_run(events in proptest::collection::vec(event(), 1..40)) {
        let mut sim = Sim::new();
        let mut b = new_backup(sim.now, false);
        let mut ended: Option<ClickHouseBackupStatus> = None;
        for e in &events {
            sim.apply(e);
            let Event::Pass(limit) = e else { continue };
            sim.backup_pass(&mut b, *limit);
            let s = b.status.clone().unwrap_or_default();
            sim.recorded_done = s.shards.iter().filter(|sh| sh.done).map(|sh| sh.shard).collect();
            if let Some(done) = &ended {
                prop_assert_eq!(&s, done, "an ended backup never changes");
            }
            prop_assert!(sim.created.values().all(|n| *n <= 1), "{:?}", sim.created);
            match s.state {
                BackupState::Succeeded => {
                    prop_assert!(sim.manifest_written);
                    prop_assert!(SHARDS.iter().all(|sh| sim.jobs.get(sh) == Some(&SimJob::Succeeded)));
                    prop_assert!(sim.server_changed.is_empty());
                    prop_assert!(s.shards.iter().all(|sh| sh.done));
                    ended = Some(s);
                }
                BackupState::Failed => {
                    prop_assert!(s.reason.is_some() && s.message.is_some());
                    prop_assert!(s.manifest.is_none());
                    ended = Some(s);
                }
                _ => prop_assert!(s.reason.is_none()),
            }
        }
        // the world settles: every pod back, the bucket up, agents end well
        sim.bucket_up = true;
        for shard in SHARDS {
            sim.pod_gone.remove(&backup_replica(shard));
            sim.ready.insert(backup_replica(shard));
        }
        for _ in 0..6 {
            // a replica that left is never the backup replica again here: the wait ends
            sim.tick(WAIT_FOR_REPLICAS.as_secs() as i64 + 1);
            sim.backup_pass(&mut b, usize::MAX);
            for j in sim.jobs.values_mut() {
                if *j == SimJob::Running {
                    *j = SimJob::Succeeded;
                }
            }
        }
        let s = b.status.clone().unwrap();
        prop_assert!(matches!(s.state, BackupState::Succeeded | BackupState::Failed), "{:?}", s);
    }
}

fn restore_state(r: &ClickHouseRestore) -> RestoreState {
    r.status.as_ref().map(|s| s.state).unwrap_or_default()
}

fn succeeded_backup() -> Option<NamedBackup> {
    Some(NamedBackup {
        state: BackupState::Succeeded,
        cluster: "c1".into(),
        destination: None,
    })
}

/// Decision 13: a restore waits for its backup to finish, reads and checks the backup's manifest
/// once every shard has a Ready backup replica, runs one agent per shard on it (the schema also
/// goes to the shard's other replica), and succeeds once every agent has.
#[test]
fn a_restore_runs_one_agent_per_shard_once_its_backup_is_complete() {
    let mut sim = Sim::new();
    let mut r = new_restore(sim.now);
    let running = Some(NamedBackup {
        state: BackupState::Running,
        ..succeeded_backup().unwrap()
    });
    sim.restore_pass(&mut r, running, 2);
    assert_eq!(restore_state(&r), RestoreState::New);
    assert!(
        r.status
            .as_ref()
            .unwrap()
            .message
            .as_ref()
            .unwrap()
            .contains("waiting for backup b0")
    );
    let p = sim.restore_pass(&mut r, succeeded_backup(), 2);
    assert_eq!(restore_state(&r), RestoreState::Running);
    assert_eq!(sim.steps_seen, ["ReadManifest"]);
    assert!(
        p.events[0]
            .message
            .starts_with("restoring s3://backups/ns/c1/backups/b0 into c1")
    );
    let p = sim.restore_pass(&mut r, succeeded_backup(), 2);
    let peers: Vec<Vec<String>> = p
        .steps
        .iter()
        .map(|s| match s {
            Step::CreateAgent(j) => j.peers.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        peers,
        [vec!["c1-0-1".to_string()], vec!["c1-1-1".to_string()]]
    );
    sim.finish_jobs(SimJob::Succeeded);
    let p = sim.restore_pass(&mut r, succeeded_backup(), 2);
    assert_eq!(restore_state(&r), RestoreState::Succeeded);
    assert_eq!(p.events[0].reason, "RestoreSucceeded");
    assert_eq!(r.status.unwrap().bytes_downloaded, 600);
}

/// Every way a restore fails has its reason: a failed backup, a backup of another number of
/// shards, a bucket that does not answer, a place the cluster does not name, a replica that
/// leaves, an agent that fails.
#[test]
fn every_failure_of_a_restore_has_its_reason() {
    let failed = Some(NamedBackup {
        state: BackupState::Failed,
        ..succeeded_backup().unwrap()
    });
    let mut sim = Sim::new();
    let mut r = new_restore(sim.now);
    sim.restore_pass(&mut r, failed, 2);
    assert_eq!(
        r.status.as_ref().unwrap().reason.as_deref(),
        Some("BackupNotUsable")
    );

    let mut sim = Sim::new();
    let mut r = new_restore(sim.now);
    sim.restore_pass(&mut r, succeeded_backup(), 3);
    assert_eq!(
        r.status.as_ref().unwrap().reason.as_deref(),
        Some("ShardCount")
    );
    assert!(sim.created.is_empty());

    let mut sim = Sim::new();
    sim.bucket_up = false;
    let mut r = new_restore(sim.now);
    sim.restore_pass(&mut r, succeeded_backup(), 2);
    assert_eq!(r.status.as_ref().unwrap().reason.as_deref(), Some("Bucket"));

    let mut sim = Sim::new();
    let mut r = new_restore(sim.now);
    r.spec.destination = Some(S3Destination {
        endpoint: "https://attacker.example".into(),
        bucket: "crafted".into(),
        secret_name: "s3-creds".into(),
        ..S3Destination::default()
    });
    sim.restore_pass(&mut r, None, 2);
    assert_eq!(
        r.status.as_ref().unwrap().reason.as_deref(),
        Some("Destination")
    );

    for (expected, change) in [
        (
            "ReplicaRemoved",
            Box::new(|s: &mut Sim| s.condemn(&backup_replica(0))) as Box<dyn Fn(&mut Sim)>,
        ),
        (
            "AgentFailed",
            Box::new(|s: &mut Sim| {
                s.jobs.insert(0, SimJob::Failed);
            }),
        ),
        (
            "ServerChanged",
            Box::new(|s: &mut Sim| {
                s.server_changed.insert(1);
            }),
        ),
    ] {
        let mut sim = Sim::new();
        let mut r = new_restore(sim.now);
        sim.restore_pass(&mut r, succeeded_backup(), 2);
        sim.restore_pass(&mut r, succeeded_backup(), 2);
        change(&mut sim);
        sim.restore_pass(&mut r, succeeded_backup(), 2);
        assert_eq!(restore_state(&r), RestoreState::Failed, "{expected}");
        assert_eq!(r.status.as_ref().unwrap().reason.as_deref(), Some(expected));
    }
}

/// Every failure reason has its own label, and the label is what the status says.
#[test]
fn failure_reasons_have_distinct_labels() {
    let labels: BTreeSet<&str> = FailureReason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(labels.len(), FailureReason::ALL.len());
}

/// An agent's pod that cannot pull its image fails its backup once the grace is over, not
/// before; a pod that runs is never called stuck; the report says what failed.
#[test]
fn an_agent_that_cannot_start_is_reported_after_the_grace() {
    let created = Timestamp::now();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "b-backup-0-x", "creationTimestamp": created.to_string()},
        "status": {"containerStatuses": [{"name": "agent", "image": "x", "imageID": "",
            "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ErrImagePull", "message": "no such image"}}}]}
    }))
    .unwrap();
    assert_eq!(stuck(&pod, created), None, "within the grace");
    let later = created + SignedDuration::from_secs(AGENT_START_GRACE);
    assert_eq!(
        stuck(&pod, later).as_deref(),
        Some("ErrImagePull: no such image")
    );
    let mut running = pod.clone();
    running
        .status
        .as_mut()
        .unwrap()
        .container_statuses
        .as_mut()
        .unwrap()[0]
        .state = Some(Default::default());
    assert_eq!(stuck(&running, later), None);

    let ok = serde_json::to_string(&Report {
        ok: true,
        bytes_uploaded: 5,
        ..Report::default()
    })
    .unwrap();
    assert_eq!(outcome(Some(&ok)).unwrap().bytes_uploaded, 5);
    let bad = serde_json::to_string(&Report {
        ok: false,
        error: Some("freezing db.t: Code: 60".into()),
        ..Report::default()
    })
    .unwrap();
    assert_eq!(outcome(Some(&bad)).unwrap_err(), "freezing db.t: Code: 60");
    assert!(outcome(None).is_err());
    assert_eq!(
        outcome(Some("line one\nthread main panicked")).unwrap_err(),
        "thread main panicked"
    );
}

/// S0-04: each shard's backup runs on its backup replica, and only once that replica's pod
/// is Ready; another replica is never used instead.
#[test]
fn each_shard_is_backed_up_on_its_backup_replica_only() {
    let c = cluster();
    let all = backup::backup_replicas(&c, &|_| true);
    assert_eq!(all[&0].as_deref(), Some("c1-0-0"));
    assert_eq!(all[&1].as_deref(), Some("c1-1-0"));
    let one_down = backup::backup_replicas(&c, &|r| r != "c1-1-0");
    assert_eq!(one_down[&1], None, "not the other replica of the shard");
}

#[test]
fn backups_build_on_each_other_only_in_the_same_place() {
    let d = |endpoint: &str, prefix: Option<&str>| S3Destination {
        endpoint: endpoint.into(),
        bucket: "b".into(),
        prefix: prefix.map(str::to_string),
        secret_name: "s".into(),
        ..S3Destination::default()
    };
    assert!(backup::same_place(
        &d("http://s3/", None),
        &d("http://s3", Some("ns/c1")),
        "ns/c1"
    ));
    assert!(!backup::same_place(
        &d("http://s3", None),
        &d("http://s3", Some("x")),
        "ns/c1"
    ));
    assert!(!backup::same_place(
        &d("http://a", None),
        &d("http://b", None),
        "ns/c1"
    ));
}

/// Decision 26: a deleted backup with `deletionPolicy: Delete` waits for its agents to stop and
/// for backups in flight that build on it, then removes its data where it recorded it was
/// written; one that never started, or whose policy went back to `Retain`, has nothing removed.
#[test]
fn a_deleted_backup_removes_its_data_only_once_nothing_needs_it() {
    use super::take::{Deleting, Deletion, deletion, wants_finalizer};
    let mut sim = Sim::new();
    let mut b = new_backup(sim.now, false);
    assert!(!wants_finalizer(&b), "Retain by default");
    b.spec.deletion_policy = crate::api::DeletionPolicy::Delete;
    assert!(wants_finalizer(&b));
    let idle = Deleting::default();
    assert_eq!(
        deletion(&b, &idle),
        Deletion::Release(None),
        "never started: nothing to remove"
    );
    sim.backup_pass(&mut b, usize::MAX);
    let recorded = b.status.as_ref().unwrap().destination.clone().unwrap();
    assert_eq!(
        recorded.prefix.as_deref(),
        Some("ns/c1"),
        "the prefix is written out"
    );
    let busy = Deleting {
        agents_left: 2,
        dependents: vec![],
    };
    assert!(matches!(deletion(&b, &busy), Deletion::Wait(w) if w.contains("2 agent pod(s)")));
    let built_on = Deleting {
        agents_left: 0,
        dependents: vec!["b2".into()],
    };
    assert!(matches!(deletion(&b, &built_on), Deletion::Wait(w) if w.contains("b2")));
    assert_eq!(
        deletion(&b, &idle),
        Deletion::RemoveData(Box::new(recorded))
    );
    b.spec.deletion_policy = crate::api::DeletionPolicy::Retain;
    assert_eq!(
        deletion(&b, &idle),
        Deletion::Release(None),
        "switched back: kept"
    );
}

/// Decision 26: a cluster with further disks is backed up: each shard's agent mounts the backup
/// replica's disks where the server has them (a freeze snapshots parts on every disk).
#[test]
fn the_agent_of_a_cluster_with_disks_reads_every_disk() {
    let mut sim = Sim::new();
    std::sync::Arc::make_mut(sim.cluster.as_mut().unwrap())
        .spec
        .storage
        .disks = serde_json::from_value(json!([{"name": "cold", "size": "1Gi"}])).unwrap();
    let mut b = new_backup(sim.now, false);
    sim.backup_pass(&mut b, usize::MAX);
    assert_eq!(state(&b), BackupState::Starting);
    let p = sim.backup_pass(&mut b, usize::MAX);
    let Step::CreateAgent(job) = &p.steps[0] else {
        panic!("{:?}", p.steps)
    };
    assert_eq!(job.disks, ["cold"]);
    let built = job.build();
    let pod = built.spec.unwrap().template.spec.unwrap();
    let claims: Vec<String> = pod
        .volumes
        .unwrap()
        .iter()
        .filter_map(|v| Some(v.persistent_volume_claim.as_ref()?.claim_name.clone()))
        .collect();
    assert_eq!(claims, ["data-c1-0-0-0", "disk-cold-c1-0-0-0"]);
    let mounts: Vec<String> = pod.containers[0]
        .volume_mounts
        .clone()
        .unwrap()
        .into_iter()
        .map(|m| m.mount_path)
        .collect();
    assert_eq!(
        mounts[1],
        crate::model::names::disk_path("cold").trim_end_matches('/')
    );
}
