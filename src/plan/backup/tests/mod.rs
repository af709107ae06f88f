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
use crate::api::{ClickHouseBackupStatus, ClickHouseRestoreStatus};
use crate::model::manifest::{FORMAT, Manifest};

mod backups;
mod invariants;
mod restores;

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
            .map(|k| k.to_string())
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

/// A change to the simulated world, and one to it and the backup.
type Change = Box<dyn Fn(&mut Sim)>;

type ChangeBoth = Box<dyn Fn(&mut Sim, &mut ClickHouseBackup)>;

fn state(b: &ClickHouseBackup) -> BackupState {
    b.status.as_ref().map(|s| s.state).unwrap_or_default()
}

fn reason(b: &ClickHouseBackup) -> Option<String> {
    b.status.as_ref().and_then(|s| s.reason.clone())
}
