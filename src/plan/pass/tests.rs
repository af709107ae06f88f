//! A pass against a simulated API server: applied objects are stored, StatefulSets get a
//! revision per template and one Ready pod, deleted pods come back on the current revision.
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::{Phase, json_of};
use crate::api::{
    ClickHouseCluster, ClickHouseClusterSpec, ClusterState, ReplicaState, ReplicaStatus,
};
use crate::model;
use crate::plan::action::{Action, Outcome};
use crate::plan::facts::{Kind, Observed, serves_tls};
use crate::plan::report::report;
use crate::plan::scale_in::ScaleInAction;
use crate::plan::{Plan, World, decide};
use k8s_openapi::api::apps::v1::StatefulSetStatus;
use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

struct Sim {
    cluster: ClickHouseCluster,
    obs: Observed,
    log: Vec<String>,
    /// Pods that do not come back ready (a broken replica).
    broken: BTreeSet<String>,
    /// Pods of a template with this image cannot pull it (ErrImagePull).
    bad_image: Option<String>,
    /// The Keeper ensemble's committed voting members (raft ids), as every Ready member
    /// reports it: its leader follows the applied member list one change at a time.
    ensemble: Vec<u32>,
    /// The leader applies no membership change (a member list not yet loaded).
    ensemble_frozen: bool,
    /// The version every Ready server reports (`SELECT version()`); `None`: none answers it.
    server_version: Option<String>,
    /// The Keeper pod that leads: it keeps leading while Ready; when it is not, the Ready
    /// member of the highest ordinal is elected. Every change is logged.
    keeper_leader: Option<String>,
}

fn revision(template: &Value) -> String {
    let mut h = DefaultHasher::new();
    template.to_string().hash(&mut h);
    format!("r{:x}", h.finish())
}

/// The StatefulSets a plan applies, in order.
fn statefulsets_applied(p: &Plan) -> Vec<&String> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            Action::Apply {
                kind: Kind::StatefulSet,
                name,
                ..
            } => Some(name),
            _ => None,
        })
        .collect()
}

fn err_image_pull() -> Vec<k8s_openapi::api::core::v1::ContainerStatus> {
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateWaiting, ContainerStatus};
    vec![ContainerStatus {
        state: Some(ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ErrImagePull".into()),
                message: Some("no such image".into()),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }]
}

fn now() -> Timestamp {
    "2026-11-30T00:00:00Z".parse().unwrap()
}

impl Sim {
    fn new(spec: serde_json::Value) -> Sim {
        let spec: ClickHouseClusterSpec = serde_json::from_value(spec).unwrap();
        let mut cluster = ClickHouseCluster::new("c1", spec);
        cluster.metadata.namespace = Some("t1".into());
        cluster.metadata.uid = Some("uid-1".into());
        cluster.metadata.generation = Some(1);
        cluster.metadata.creation_timestamp = Some(Time(now()));
        let mut obs = Observed {
            operator_secret_present: true,
            ..Observed::default()
        };
        obs.inputs.operator_password = model::Password("pw".into());
        obs.inputs.exporter_password = Some(model::Password("exporter-pw".into()));
        Sim {
            cluster,
            obs,
            log: Vec::new(),
            broken: BTreeSet::new(),
            bad_image: None,
            ensemble: Vec::new(),
            ensemble_frozen: false,
            server_version: None,
            keeper_leader: None,
        }
    }

    /// How many members the applied Keeper ConfigMap lists.
    fn keeper_listed(&self) -> Option<u32> {
        let cm = self
            .obs
            .objects
            .get(&(Kind::ConfigMap, "c1-keeper".into()))?;
        let file = cm["data"][model::names::KEEPER_CONFIG_FILE].as_str()?;
        Some(file.matches("<server>").count() as u32)
    }

    /// Keeper's leader: a first start commits the whole list; later, one member added (once
    /// its pod runs) or removed per pass.
    fn keeper_leader(&mut self) {
        let mut ready: Vec<(i32, String)> = self
            .obs
            .pods
            .iter()
            .filter(|(_, p)| crate::plan::facts::pod_ready(p))
            .filter_map(|(n, _)| Some((n.strip_prefix("c1-keeper-")?.parse().ok()?, n.clone())))
            .collect();
        ready.sort();
        let ready: Vec<String> = ready.into_iter().map(|(_, n)| n).collect();
        if self
            .keeper_leader
            .as_ref()
            .is_none_or(|l| !ready.contains(l))
        {
            let elected = ready.last().cloned();
            if elected.is_some() {
                self.log.push(format!("keeper leader {elected:?}"));
            }
            self.keeper_leader = elected;
        }
        let Some(n) = self.keeper_listed() else {
            return;
        };
        let want: Vec<u32> = (1..=n).collect();
        let running = |sim: &Sim, id: u32| {
            sim.obs
                .pods
                .get(&format!("c1-keeper-{}", id - 1))
                .is_some_and(crate::plan::facts::pod_ready)
        };
        if self.ensemble.is_empty() {
            self.ensemble = want;
        } else if !self.ensemble_frozen {
            if let Some(id) = want.iter().find(|id| !self.ensemble.contains(id)) {
                if running(self, *id) {
                    self.ensemble.push(*id);
                    self.ensemble.sort();
                }
            } else if let Some(i) = self.ensemble.iter().position(|id| !want.contains(id)) {
                self.ensemble.remove(i);
            }
        }
    }

    fn plan(&self) -> Plan {
        let world = World {
            clusters_in_namespace: Vec::new(),
            observed: {
                // The other replicas have nothing to fetch from a pod out of traffic.
                let mut obs = self.obs.clone();
                for (pod, p) in &self.obs.pods {
                    let serving = p
                        .metadata
                        .labels
                        .as_ref()
                        .is_some_and(|l| l.contains_key(model::labels::SERVING));
                    if !serving && !pod.contains("keeper") {
                        obs.pending_fetches
                            .insert(pod.strip_suffix("-0").unwrap_or(pod).to_string(), Some(0));
                    }
                    if let Some(v) = &self.server_version
                        && !pod.contains("keeper")
                        && crate::plan::facts::pod_ready(p)
                    {
                        obs.server_versions
                            .insert(pod.strip_suffix("-0").unwrap_or(pod).to_string(), v.clone());
                    }
                    if pod.contains("keeper") && crate::plan::facts::pod_ready(p) {
                        obs.keeper_views.insert(
                            pod.clone(),
                            crate::plan::facts::MemberView::Voters(self.ensemble.clone()),
                        );
                        use crate::plan::facts::KeeperRole;
                        let others = self
                            .obs
                            .pods
                            .iter()
                            .filter(|(o, p)| {
                                o.contains("keeper")
                                    && *o != pod
                                    && crate::plan::facts::pod_ready(p)
                            })
                            .count() as u32;
                        let role = if self.keeper_leader.as_ref() == Some(pod) {
                            KeeperRole::Leader {
                                synced_followers: others,
                            }
                        } else {
                            KeeperRole::Follower
                        };
                        obs.keeper_roles.insert(pod.clone(), role);
                    }
                }
                obs
            },
        };
        decide(&self.cluster, &world, now())
    }

    fn make_pod(&mut self, sts: &str) {
        let s = &self.obs.statefulsets[sts];
        let rev = s.status.as_ref().unwrap().update_revision.clone().unwrap();
        let name = format!("{sts}-0");
        let bad = self.pulls_bad_image(sts);
        let ready = !self.broken.contains(&name) && !bad;
        // The pod carries its template's labels (in traffic) and its revision.
        let mut labels: BTreeMap<String, String> = s
            .spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        labels.insert("controller-revision-hash".to_string(), rev);
        let pod = Pod {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                labels: Some(labels),
                ..Default::default()
            },
            status: Some(PodStatus {
                pod_ip: Some("198.18.1.1".into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    // Ready for a minute already (past the DNS settling time of a new pod).
                    last_transition_time: Some(Time(
                        now() - k8s_openapi::jiff::SignedDuration::from_secs(60),
                    )),
                    ..Default::default()
                }]),
                container_statuses: bad.then(err_image_pull),
                ..Default::default()
            }),
            ..Default::default()
        };
        self.obs.pods.insert(name, pod);
    }

    fn pulls_bad_image(&self, sts: &str) -> bool {
        let image = json_of(&self.obs.statefulsets[sts].spec)["template"]["spec"]["containers"][0]
            ["image"]
            .as_str()
            .map(str::to_string);
        self.bad_image.is_some() && image == self.bad_image
    }

    /// The StatefulSet controller: pods for StatefulSets that have none; none for those at 0.
    /// Then Keeper's leader.
    fn settle(&mut self) {
        self.settle_pods();
        self.keeper_leader();
    }

    fn settle_pods(&mut self) {
        let names: Vec<String> = self.obs.statefulsets.keys().cloned().collect();
        for n in names {
            let replicas = self.obs.statefulsets[&n].spec.replicas.unwrap_or(1);
            let keeper = n.ends_with("-keeper");
            // The native RollingUpdate replaces one pod of an old revision at a time, highest
            // ordinal first, and only while every pod is Ready (it never replaces a broken one).
            let sts = &self.obs.statefulsets[&n];
            let native = sts
                .spec
                .update_strategy
                .as_ref()
                .and_then(|u| u.type_.as_deref())
                == Some("RollingUpdate");
            let rev = sts.status.as_ref().and_then(|s| s.update_revision.clone());
            let all_ready = (0..replicas).all(|i| {
                self.obs
                    .pods
                    .get(&format!("{n}-{i}"))
                    .is_some_and(crate::plan::facts::pod_ready)
            });
            let oldest = (0..replicas).rev().map(|i| format!("{n}-{i}")).find(|pod| {
                self.obs.pods.get(pod).is_some_and(|p| {
                    p.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("controller-revision-hash"))
                        != rev.as_ref()
                })
            });
            if native
                && all_ready
                && let Some(pod) = oldest
            {
                self.log.push(format!("controller replaces pod {pod}"));
                self.obs.pods.remove(&pod);
            }
            for i in 0..replicas {
                let pod = format!("{n}-{i}");
                if !self.obs.pods.contains_key(&pod) {
                    if keeper {
                        let rev = self.obs.statefulsets[&n]
                            .status
                            .as_ref()
                            .unwrap()
                            .update_revision
                            .clone()
                            .unwrap();
                        let mut p = Pod::default();
                        p.metadata.name = Some(pod.clone());
                        p.metadata.labels = Some(BTreeMap::from([(
                            "controller-revision-hash".to_string(),
                            rev,
                        )]));
                        let bad = self.pulls_bad_image(&n);
                        p.status = Some(PodStatus {
                            conditions: Some(vec![PodCondition {
                                type_: "Ready".into(),
                                status: if bad { "False" } else { "True" }.into(),
                                // the simulation's clock stands: Ready for a minute already
                                last_transition_time: Some(Time(
                                    now() - k8s_openapi::jiff::SignedDuration::from_secs(60),
                                )),
                                ..Default::default()
                            }]),
                            container_statuses: bad.then(err_image_pull),
                            ..Default::default()
                        });
                        self.obs.pods.insert(pod, p);
                    } else {
                        self.make_pod(&n);
                    }
                }
            }
            let prefix = format!("{n}-");
            self.obs.pods.retain(|p, _| {
                p.strip_prefix(&prefix)
                    .and_then(|o| o.parse::<i32>().ok())
                    .is_none_or(|o| o < replicas)
            });
        }
    }

    /// Runs one plan as the executor would, against the simulation.
    fn act(&mut self, plan: &Plan) {
        for a in &plan.actions {
            self.log.push(a.describe());
            match a {
                Action::Apply {
                    kind: Kind::StatefulSet,
                    name,
                    object,
                    ..
                } => {
                    let mut sts: StatefulSet = serde_json::from_value(object.clone()).unwrap();
                    let generation = self
                        .obs
                        .statefulsets
                        .get(name)
                        .and_then(|s| s.metadata.generation)
                        .unwrap_or(0)
                        + 1;
                    sts.metadata.generation = Some(generation);
                    // the StatefulSet controller creates the missing PVCs of its pods
                    for t in sts.spec.volume_claim_templates.iter().flatten() {
                        for i in 0..sts.spec.replicas.unwrap_or(1) {
                            let pvc = format!("{}-{name}-{i}", t.metadata.name.clone().unwrap());
                            self.obs.pvcs.entry(pvc.clone()).or_insert_with(|| {
                                let mut p = PersistentVolumeClaim {
                                    metadata: t.metadata.clone(),
                                    spec: t.spec.clone(),
                                    ..Default::default()
                                };
                                p.metadata.name = Some(pvc);
                                p
                            });
                        }
                    }
                    sts.status = Some(StatefulSetStatus {
                        observed_generation: Some(generation),
                        update_revision: Some(revision(&object["spec"]["template"])),
                        ..Default::default()
                    });
                    self.obs.statefulsets.insert(name.clone(), sts);
                }
                Action::Apply {
                    kind, name, object, ..
                } => {
                    self.obs
                        .objects
                        .insert((*kind, name.clone()), object.clone());
                }
                Action::SetServing { pod, serving, .. } => {
                    if let Some(l) = self
                        .obs
                        .pods
                        .get_mut(pod)
                        .and_then(|p| p.metadata.labels.as_mut())
                    {
                        if *serving {
                            l.insert(model::labels::SERVING.into(), "true".into());
                        } else {
                            l.remove(model::labels::SERVING);
                        }
                    }
                }
                Action::RestartPod { pod, .. } => {
                    self.obs.pods.remove(pod);
                    if self.keeper_leader.as_ref() == Some(pod) {
                        self.keeper_leader = None;
                    }
                }
                Action::MigrateSchema { .. }
                | Action::DropDnsCache { .. }
                | Action::EnsureKeeperRoot { .. } => {}
                Action::ScaleIn(s) => {
                    if let ScaleInAction::DeleteStatefulSet { replica } = s {
                        self.obs.statefulsets.remove(replica);
                        self.obs.pods.remove(&format!("{replica}-0"));
                    }
                }
                Action::OrphanStatefulSet { name } => {
                    self.obs.statefulsets.remove(name);
                }
                Action::LabelPvc {
                    name,
                    labels,
                    annotations,
                } => {
                    let m = &mut self.obs.pvcs.get_mut(name).unwrap().metadata;
                    m.labels.get_or_insert_default().extend(labels.clone());
                    m.annotations
                        .get_or_insert_default()
                        .extend(annotations.clone());
                }
                Action::ResizePvc { name, size } => {
                    let pvc = self.obs.pvcs.get_mut(name).unwrap();
                    pvc.spec
                        .as_mut()
                        .unwrap()
                        .resources
                        .as_mut()
                        .unwrap()
                        .requests = Some(BTreeMap::from([(
                        "storage".to_string(),
                        Quantity(size.clone()),
                    )]));
                }
                Action::Delete {
                    kind: Kind::StatefulSet,
                    name,
                } => {
                    self.obs.statefulsets.remove(name);
                }
                Action::Delete { kind, name } => {
                    self.obs.objects.remove(&(*kind, name.clone()));
                }
                Action::AddExporterPassword => {
                    self.obs.inputs.exporter_password = Some(model::Password("added".into()));
                }
                Action::AdoptOperatorSecret => {
                    self.obs.operator_secret_orphaned = false;
                }
                Action::PublishExporterCredentials => {
                    self.obs.exporter_credentials_published = Some(true);
                }
                other => panic!("unexpected action {other:?}"),
            }
        }
        let outcome = Outcome {
            done: (0..plan.actions.len()).collect(),
            ..Outcome::default()
        };
        let (status, _) = report(plan, &outcome, self.cluster.metadata.generation, now());
        // every status the operator would write keeps the replica state machine (S0-06)
        let old = self
            .cluster
            .status
            .as_ref()
            .map(|s| s.replica_state_map.clone())
            .unwrap_or_default();
        if let Some(why) =
            crate::plan::replicas::map_change_refused(&old, &status.replica_state_map)
        {
            panic!("{why}: {old:?} → {:?}", status.replica_state_map);
        }
        self.cluster.status = Some(status);
        self.settle();
    }

    /// A plan, with the replication lag it asks for read as caught up (as the controller
    /// reads it and decides again).
    fn plan_caught_up(&mut self) -> Plan {
        let p = self.plan();
        if p.lag_checks.is_empty() {
            return p;
        }
        for r in &p.lag_checks {
            self.obs.caught_up.insert(r.clone(), true);
        }
        self.plan()
    }

    /// Passes until nothing is left to do (or `max` passes). Returns the number of passes.
    fn converge(&mut self, max: usize) -> usize {
        for i in 0..max {
            let p = self.plan_caught_up();
            if p.actions.is_empty() && !p.again {
                self.cluster.status = Some(p.status);
                return i;
            }
            self.act(&p);
            self.obs.caught_up.clear();
        }
        panic!(
            "no convergence in {max} passes: {:?} {:?}",
            self.log.iter().rev().take(10).collect::<Vec<_>>(),
            self.cluster.status.as_ref().and_then(|s| s.message.clone())
        );
    }

    fn state(&self) -> ClusterState {
        self.cluster.status.as_ref().unwrap().state
    }

    fn map(&self) -> &BTreeMap<String, ReplicaStatus> {
        &self.cluster.status.as_ref().unwrap().replica_state_map
    }
}

/// A new cluster converges to ready; a pass over the settled cluster does nothing at all.
#[test]
fn new_cluster_converges_and_then_nothing_happens() {
    let mut sim = Sim::new(serde_json::json!({"shards": 2, "replicas": 2}));
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready, "{:?}", sim.cluster.status);
    assert_eq!(sim.map().len(), 4);
    assert!(sim.map().values().all(|r| r.state == ReplicaState::Ready));
    let p = sim.plan();
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert_eq!(p.status, sim.cluster.status.clone().unwrap());
}

/// S0-19 / S0-16: new entries are persisted before their StatefulSets exist, then every new
/// StatefulSet is created in the same pass.
#[test]
fn scale_out_persists_the_map_then_creates_every_statefulset_in_one_pass() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 1}));
    sim.converge(20);
    sim.cluster.spec.replicas = 4;
    let p = sim.plan();
    assert!(p.again);
    assert!(
        !p.actions.iter().any(|a| matches!(
            a,
            Action::Apply {
                kind: Kind::StatefulSet,
                ..
            }
        )),
        "{:?}",
        p.actions
    );
    assert_eq!(
        p.status
            .replica_state_map
            .values()
            .filter(|r| r.state == ReplicaState::Pending)
            .count(),
        3
    );
    sim.act(&p);
    let p = sim.plan();
    let created: Vec<&String> = statefulsets_applied(&p);
    assert_eq!(created.len(), 3, "{:?}", p.actions);
    sim.act(&p);
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready);
    assert_eq!(sim.map().len(), 4);
}

/// S0-21…S0-30: scale-in condemns, then runs the steps in order, and the map ends clean.
#[test]
fn scale_in_runs_the_steps_in_order() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 3}));
    sim.converge(20);
    let backup = sim
        .map()
        .iter()
        .find(|(_, r)| r.is_backup_pod)
        .unwrap()
        .0
        .clone();
    sim.cluster.spec.replicas = 1;
    sim.log.clear();
    sim.converge(20);
    assert_eq!(sim.map().len(), 1);
    assert!(
        sim.map().contains_key(&backup),
        "the backup replica survives (S0-14)"
    );
    let order: Vec<&str> = sim
        .log
        .iter()
        .filter(|l| l.starts_with("scale-in"))
        .map(|l| l.split(['{', ' ']).nth(1).unwrap_or(""))
        .collect();
    let pos = |k: &str| order.iter().position(|s| s.starts_with(k)).unwrap();
    assert!(pos("LeaveTraffic") < pos("SyncShard"));
    assert!(pos("SyncShard") < pos("DropObjects"));
    assert!(pos("DropObjects") < pos("DeleteStatefulSet"));
    assert!(pos("DeleteStatefulSet") < pos("DropKeeperMetadata"));
    assert!(pos("DropKeeperMetadata") < pos("LabelPvcsAndForget"));
    assert_eq!(sim.state(), ClusterState::Ready);
    assert_eq!(
        sim.obs
            .statefulsets
            .keys()
            .filter(|k| !k.ends_with("keeper"))
            .count(),
        1
    );
}

/// S0-17 / S2-28: an image change restarts one replica at a time, newest first, backup last.
#[test]
fn image_change_rolls_one_replica_at_a_time() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 3}));
    sim.converge(20);
    let backup = sim
        .map()
        .iter()
        .find(|(_, r)| r.is_backup_pod)
        .unwrap()
        .0
        .clone();
    sim.cluster.spec.image = "clickhouse/clickhouse-server:25.3".into();
    sim.log.clear();
    sim.converge(40);
    let restarts: Vec<&String> = sim
        .log
        .iter()
        .filter(|l| l.starts_with("restart pod"))
        .collect();
    assert_eq!(restarts.len(), 3, "{:?}", sim.log);
    assert_eq!(restarts[2], &format!("restart pod {backup}-0"));
    assert_eq!(restarts[0], "restart pod c1-0-2-0");
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// A config change that ClickHouse reloads (a profile setting) restarts nothing.
#[test]
fn profile_change_restarts_nothing() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
    sim.converge(20);
    sim.cluster.spec.configuration.profiles.insert(
        "default".into(),
        BTreeMap::from([("max_threads".to_string(), "4".to_string())]),
    );
    sim.log.clear();
    sim.converge(20);
    assert!(
        sim.log
            .iter()
            .any(|l| l == "apply ConfigMap c1-common" || l == "apply Secret c1-users"),
        "{:?}",
        sim.log
    );
    assert!(
        !sim.log
            .iter()
            .any(|l| l.starts_with("restart") || l.starts_with("apply StatefulSet")),
        "{:?}",
        sim.log
    );
}

/// S0-03 / S2-21 / S2-22: pause stops every StatefulSet at once and says stopping, then
/// paused; resume brings the cluster back to ready.
#[test]
fn pause_and_resume() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
    sim.converge(20);
    sim.cluster.spec.pause = true;
    let p = sim.plan();
    let stopped = p
        .actions
        .iter()
        .filter(|a| {
            matches!(
                a,
                Action::Apply {
                    kind: Kind::StatefulSet,
                    ..
                }
            )
        })
        .count();
    assert_eq!(
        stopped, 3,
        "both servers and Keeper in one pass: {:?}",
        p.actions
    );
    assert_eq!(p.status.state, ClusterState::Stopping);
    sim.act(&p);
    sim.converge(10);
    assert_eq!(sim.state(), ClusterState::Paused);
    assert!(sim.map().values().all(|r| r.state == ReplicaState::Stopped));
    sim.cluster.spec.pause = false;
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// S0-24: a broken survivor defers the scale-in; nothing is deleted and the status says why.
#[test]
fn scale_in_waits_for_every_statefulset() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 3}));
    sim.converge(20);
    let backup = sim
        .map()
        .iter()
        .find(|(_, r)| r.is_backup_pod)
        .unwrap()
        .0
        .clone();
    let pod = format!("{backup}-0");
    sim.broken.insert(pod.clone());
    sim.obs.pods.remove(&pod);
    sim.settle();
    sim.cluster.spec.replicas = 2;
    for _ in 0..5 {
        let p = sim.plan();
        assert!(
            !p.actions
                .iter()
                .any(|a| matches!(a, Action::ScaleIn(ScaleInAction::DeleteStatefulSet { .. })))
        );
        sim.act(&p);
    }
    let msg = sim
        .cluster
        .status
        .as_ref()
        .unwrap()
        .message
        .clone()
        .unwrap();
    assert!(msg.contains(&backup), "{msg}");
    sim.broken.clear();
    sim.obs.pods.remove(&pod);
    sim.settle();
    sim.converge(20);
    assert_eq!(sim.map().len(), 2);
}

/// S2-23: turning TLS on stops every server, then starts them all on the new template.
#[test]
fn tls_toggle_is_a_full_stop_and_start() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
    sim.converge(20);
    sim.cluster.spec.tls.enabled = true;
    sim.cluster.spec.tls.server_cert_secret = Some("tls".into());
    let p = sim.plan();
    assert_eq!(
        p.status.state,
        ClusterState::Stopping,
        "{:?}",
        p.status.message
    );
    let stops: Vec<&Value> = p
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Apply {
                kind: Kind::StatefulSet,
                object,
                ..
            } if !object["metadata"]["name"]
                .as_str()
                .unwrap()
                .ends_with("keeper") =>
            {
                Some(object)
            }
            _ => None,
        })
        .collect();
    assert_eq!(stops.len(), 2);
    assert!(
        stops
            .iter()
            .all(|o| o["spec"]["replicas"] == 0 && !serves_tls(&o["spec"]["template"]))
    );
    sim.act(&p);
    assert!(
        !sim.obs.pods.keys().any(|p| p.starts_with("c1-0-")),
        "every server stopped"
    );
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready);
    assert!(
        sim.obs
            .statefulsets
            .iter()
            .filter(|(n, _)| !n.ends_with("keeper"))
            .all(|(_, s)| serves_tls(&json_of(&s.spec)["template"]))
    );
}

/// Keeper membership changes one member at a time (1 → 3 goes through 2), each step only
/// once every member is Ready.
#[test]
fn keeper_grows_one_member_at_a_time() {
    let mut sim =
        Sim::new(serde_json::json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 1}}));
    sim.converge(20);
    sim.cluster.spec.keeper.replicas = 3;
    let mut sizes = Vec::new();
    for _ in 0..10 {
        let p = sim.plan();
        for a in &p.actions {
            if let Action::Apply {
                kind: Kind::StatefulSet,
                name,
                object,
                ..
            } = a
                && name == "c1-keeper"
            {
                sizes.push(object["spec"]["replicas"].as_i64().unwrap());
            }
        }
        if p.actions.is_empty() {
            break;
        }
        sim.act(&p);
    }
    assert_eq!(sizes, [2, 3]);
    sim.converge(10);
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// The Keeper StatefulSet's replicas and the members its ConfigMap lists, after each pass
/// that wrote either, until nothing is left to do.
fn keeper_steps(sim: &mut Sim, passes: usize) -> Vec<(u32, i64)> {
    let now = |sim: &Sim| {
        let replicas = sim.obs.statefulsets["c1-keeper"].spec.replicas.unwrap_or(0);
        (sim.keeper_listed().unwrap(), replicas as i64)
    };
    let mut last = now(sim);
    let mut steps = Vec::new();
    for _ in 0..passes {
        let p = sim.plan();
        if p.actions.is_empty() {
            break;
        }
        sim.act(&p);
        if now(sim) != last {
            last = now(sim);
            steps.push(last);
        }
    }
    steps
}

/// Decision 25: shrinking Keeper removes a member from the list first and its pod only once
/// every remaining member lists the smaller ensemble; one member at a time (5 → 3).
#[test]
fn keeper_shrinks_the_member_list_before_the_pod_one_member_at_a_time() {
    let mut sim =
        Sim::new(serde_json::json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 5}}));
    sim.converge(20);
    assert_eq!(sim.ensemble, [1, 2, 3, 4, 5]);
    sim.cluster.spec.keeper.replicas = 3;
    assert_eq!(keeper_steps(&mut sim, 20), [(4, 5), (4, 4), (3, 4), (3, 3)]);
    assert_eq!(sim.ensemble, [1, 2, 3]);
    sim.converge(10);
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// Decision 25: while the remaining members do not list the smaller ensemble (the leader has
/// not applied the change), the leaving member's pod keeps running and the cluster is not
/// `ready`; the status names the member that lags. Once it is applied, the pod goes.
#[test]
fn a_keeper_member_is_not_removed_before_the_others_have_let_it_go() {
    let mut sim =
        Sim::new(serde_json::json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 3}}));
    sim.converge(20);
    sim.ensemble_frozen = true;
    sim.cluster.spec.keeper.replicas = 1;
    for _ in 0..5 {
        let p = sim.plan();
        sim.act(&p);
    }
    assert_eq!(sim.keeper_listed(), Some(2));
    assert_eq!(sim.obs.statefulsets["c1-keeper"].spec.replicas, Some(3));
    assert!(sim.obs.pods.contains_key("c1-keeper-2"));
    let status = sim.cluster.status.clone().unwrap();
    assert_ne!(status.state, ClusterState::Ready);
    let message = status.message.unwrap_or_default();
    assert!(
        message.contains("c1-keeper-0 lists members 1,2,3"),
        "{message}"
    );
    sim.ensemble_frozen = false;
    assert_eq!(keeper_steps(&mut sim, 20), [(2, 2), (1, 2), (1, 1)]);
    sim.converge(10);
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// Decision 25: growing adds the next member only once every member lists the one added
/// before; a member the leader has not added yet holds the growth (and `ready`) back.
#[test]
fn keeper_growth_waits_until_every_member_lists_the_member_added() {
    let mut sim =
        Sim::new(serde_json::json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 1}}));
    sim.converge(20);
    sim.ensemble_frozen = true;
    sim.cluster.spec.keeper.replicas = 3;
    for _ in 0..5 {
        let p = sim.plan();
        sim.act(&p);
    }
    assert_eq!(sim.obs.statefulsets["c1-keeper"].spec.replicas, Some(2));
    assert_eq!(sim.keeper_listed(), Some(2));
    let message = sim
        .cluster
        .status
        .clone()
        .unwrap()
        .message
        .unwrap_or_default();
    assert!(message.contains("lists members 1"), "{message}");
    sim.ensemble_frozen = false;
    assert_eq!(keeper_steps(&mut sim, 20), [(3, 3)]);
    sim.converge(10);
    assert_eq!(sim.ensemble, [1, 2, 3]);
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// S2-09: every pass emits its steps in the order of the phases: a new cluster's first pass
/// applies Keeper, then the server configuration, then the Services; the pass that creates the
/// server StatefulSets writes their ConfigMaps first.
#[test]
fn a_pass_emits_its_steps_in_the_order_of_the_phases() {
    let mut sim = Sim::new(serde_json::json!({"shards": 2, "replicas": 2}));
    let mut passes: Vec<Vec<(Phase, Kind, String)>> = Vec::new();
    for _ in 0..20 {
        let p = sim.plan();
        let mut sorted = p.phases.clone();
        sorted.sort();
        assert_eq!(p.phases, sorted, "{:?}", p.actions);
        assert_eq!(p.phases.len(), p.actions.len());
        passes.push(
            p.phases
                .iter()
                .zip(&p.actions)
                .filter_map(|(phase, a)| match a {
                    Action::Apply { kind, name, .. } => Some((*phase, *kind, name.clone())),
                    _ => None,
                })
                .collect(),
        );
        if p.actions.is_empty() && !p.again {
            sim.cluster.status = Some(p.status);
            break;
        }
        sim.act(&p);
    }
    let at = |pass: &[(Phase, Kind, String)], kind: Kind, name: &str| {
        pass.iter()
            .position(|(_, k, n)| *k == kind && n == name)
            .unwrap_or_else(|| panic!("{kind:?} {name} in {pass:?}"))
    };
    let first = &passes[0];
    assert!(at(first, Kind::StatefulSet, "c1-keeper") < at(first, Kind::ConfigMap, "c1-common"));
    assert!(at(first, Kind::Secret, "c1-users") < at(first, Kind::Service, "c1-headless"));
    let creating = passes
        .iter()
        .find(|p| {
            p.iter()
                .any(|(_, k, n)| *k == Kind::StatefulSet && n == "c1-0-0")
        })
        .expect("a pass creates the server StatefulSets");
    assert!(at(creating, Kind::ConfigMap, "c1-0-0") < at(creating, Kind::StatefulSet, "c1-0-0"));
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// S2-13: a data volume grows in place: the PVC first, then the StatefulSet is deleted with
/// its pod kept and created again once it is gone; no pod restarts, and a PVC still resizing
/// holds the rollout back.
#[test]
fn storage_growth_resizes_the_pvc_and_recreates_the_statefulset_keeping_the_pod() {
    use k8s_openapi::api::core::v1::{
        PersistentVolumeClaim, PersistentVolumeClaimCondition, PersistentVolumeClaimSpec,
        PersistentVolumeClaimStatus, VolumeResourceRequirements,
    };
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 1,
        "storage": {"size": "1Gi"}, "storageScaling": {"enableVolumeScaling": true}}));
    sim.converge(20);
    let replica = sim.map().keys().next().unwrap().clone();
    let pvc = model::names::data_pvc(&replica);
    sim.obs.pvcs.insert(
        pvc.clone(),
        PersistentVolumeClaim {
            spec: Some(PersistentVolumeClaimSpec {
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([(
                        "storage".to_string(),
                        Quantity("1Gi".into()),
                    )])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    let pod_before = sim.obs.pods[&format!("{replica}-0")].clone();
    sim.cluster.spec.storage.data.size = "2Gi".into();
    let p = sim.plan();
    let described: Vec<String> = p.actions.iter().map(Action::describe).collect();
    let resize = described
        .iter()
        .position(|d| d.starts_with("resize PVC"))
        .expect("resize");
    let orphan = described
        .iter()
        .position(|d| d.starts_with(&format!("delete StatefulSet {replica}")))
        .expect("orphan");
    assert!(resize < orphan, "{described:?}");
    assert!(p.again);
    sim.act(&p);
    assert_eq!(
        sim.obs.pods[&format!("{replica}-0")],
        pod_before,
        "the pod is kept"
    );
    // The PVC now reports the volume being expanded: nothing rolls meanwhile.
    sim.obs.pvcs.get_mut(&pvc).unwrap().status = Some(PersistentVolumeClaimStatus {
        conditions: Some(vec![PersistentVolumeClaimCondition {
            type_: "Resizing".into(),
            status: "True".into(),
            ..Default::default()
        }]),
        ..Default::default()
    });
    let p = sim.plan();
    assert!(p.actions.iter().any(|a| matches!(a, Action::Apply { kind: Kind::StatefulSet, name, create: true, .. } if *name == replica)), "{:?}", p.actions);
    sim.act(&p);
    let p = sim.plan();
    assert!(
        p.status
            .message
            .as_deref()
            .unwrap_or("")
            .contains(&format!("PVC {pvc} is being resized")),
        "{:?}",
        p.status.message
    );
    assert_ne!(p.status.state, ClusterState::Ready);
    sim.obs.pvcs.get_mut(&pvc).unwrap().status = None;
    sim.log.clear();
    sim.converge(20);
    assert!(
        !sim.log.iter().any(|l| l.starts_with("restart")),
        "{:?}",
        sim.log
    );
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// A server pod that is still starting while its StatefulSet's status has not caught up (just
/// created or just written: no `observedGeneration` yet) is not known to be on an old revision,
/// and is not restarted on that guess (it was: a cluster whose pods wait longer for their
/// volumes had a server restarted during its creation).
#[test]
fn a_starting_pod_is_not_restarted_while_its_statefulsets_status_lags() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
    sim.converge(20);
    let replica = sim.map().keys().next().unwrap().clone();
    let pod = format!("{replica}-0");
    sim.obs.statefulsets.get_mut(&replica).unwrap().status = Some(StatefulSetStatus::default());
    sim.obs.pods.get_mut(&pod).unwrap().status = Some(PodStatus {
        conditions: Some(vec![PodCondition {
            type_: "Ready".into(),
            status: "False".into(),
            ..Default::default()
        }]),
        ..Default::default()
    });
    let p = sim.plan_caught_up();
    assert!(
        !p.actions
            .iter()
            .any(|a| matches!(a, Action::RestartPod { pod: p, .. } if *p == pod)),
        "{:?}",
        p.actions
    );
}

/// The claim templates of an observed StatefulSet, by name.
fn claim_names(sim: &Sim, sts: &str) -> Vec<String> {
    sim.obs.statefulsets[sts]
        .spec
        .volume_claim_templates
        .iter()
        .flatten()
        .map(|t| t.metadata.name.clone().unwrap())
        .collect()
}

/// docs/configuration.md, "Storage": a disk added to a running cluster recreates each StatefulSet
/// with the new claim template (pods kept), then restarts every server exactly once, one replica of
/// a shard at a time, to mount it; each replica ends with a `disk-<name>` PVC. Removing the disk
/// again is refused with the field named, and nothing is deleted or restarted.
#[test]
fn an_added_disk_recreates_the_statefulsets_and_restarts_each_server_once() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
    sim.converge(20);
    let replicas: Vec<String> = sim.map().keys().cloned().collect();
    sim.log.clear();
    sim.cluster.spec.storage = serde_json::from_value(serde_json::json!({
        "size": "10Gi",
        "disks": [{"name": "cold", "size": "20Gi"}],
        "policies": {"tiered": {"volumes": [
            {"name": "hot", "disks": ["default"]}, {"name": "cold", "disks": ["cold"]}]}}
    }))
    .unwrap();
    let p = sim.plan();
    for r in &replicas {
        assert!(
            p.actions
                .iter()
                .any(|a| matches!(a, Action::OrphanStatefulSet { name } if name == r)),
            "{:?}",
            p.actions
        );
    }
    assert!(
        !p.actions
            .iter()
            .any(|a| matches!(a, Action::RestartPod { .. })),
        "no restart while the StatefulSets are recreated: {:?}",
        p.actions
    );
    sim.converge(40);
    for r in &replicas {
        assert_eq!(claim_names(&sim, r), ["data", "disk-cold"]);
        assert!(sim.obs.pvcs.contains_key(&format!("disk-cold-{r}-0")));
    }
    let restarts = server_restarts(&sim.log);
    assert_eq!(
        restarts.len(),
        2,
        "every server restarts once: {:?}",
        sim.log
    );
    assert_eq!(sim.state(), ClusterState::Ready);

    sim.log.clear();
    sim.cluster.spec.storage.disks.clear();
    sim.cluster.spec.storage.policies.clear();
    let p = sim.plan();
    assert!(
        !p.actions.iter().any(|a| matches!(
            a,
            Action::OrphanStatefulSet { .. } | Action::RestartPod { .. } | Action::Delete { .. }
        )),
        "{:?}",
        p.actions
    );
    let message = p.status.message.clone().unwrap_or_default();
    assert!(
        message.contains("spec.storage.disks[cold]") && message.contains("cannot be removed"),
        "{message}"
    );
}

/// docs/configuration.md, "Storage": PVC labels and annotations from `spec.storage` reach the claim
/// templates (the StatefulSets recreated, no pod restarted) and the existing PVCs (patched); an
/// idle pass after that writes nothing.
#[test]
fn pvc_labels_reach_existing_pvcs_without_a_restart() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 1}));
    sim.converge(20);
    let replica = sim.map().keys().next().unwrap().clone();
    let pvc = model::names::data_pvc(&replica);
    assert!(sim.obs.pvcs.contains_key(&pvc));
    sim.log.clear();
    sim.cluster
        .spec
        .storage
        .data
        .labels
        .insert("team".into(), "analytics".into());
    sim.cluster
        .spec
        .storage
        .data
        .annotations
        .insert("backup.example.com/skip".into(), "true".into());
    sim.converge(20);
    let m = &sim.obs.pvcs[&pvc].metadata;
    assert_eq!(m.labels.as_ref().unwrap()["team"], "analytics");
    assert_eq!(
        m.annotations.as_ref().unwrap()["backup.example.com/skip"],
        "true"
    );
    let template = &sim.obs.statefulsets[&replica]
        .spec
        .volume_claim_templates
        .as_ref()
        .unwrap()[0];
    assert_eq!(
        template.metadata.labels.as_ref().unwrap()["team"],
        "analytics"
    );
    assert!(server_restarts(&sim.log).is_empty(), "{:?}", sim.log);
    assert!(
        sim.log
            .iter()
            .any(|l| l.starts_with(&format!("delete StatefulSet {replica}")))
    );
    let p = sim.plan_caught_up();
    assert!(p.actions.is_empty(), "{:?}", p.actions);
}

/// docs/configuration.md, "Storage": `spec.keeper.storage.labels` reach every Keeper member's PVC
/// (patched) and the Keeper's claim template (its StatefulSet recreated, no member restarted).
#[test]
fn keeper_pvc_labels_reach_every_member_without_a_restart() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 1}));
    sim.converge(20);
    let keeper = model::names::keeper("c1");
    let pods_before: Vec<_> = (0..3)
        .map(|i| sim.obs.pods[&format!("{keeper}-{i}")].clone())
        .collect();
    sim.cluster
        .spec
        .keeper
        .storage
        .labels
        .insert("team".into(), "coordination".into());
    sim.converge(20);
    for i in 0..3 {
        let m = &sim.obs.pvcs[&format!("data-{keeper}-{i}")].metadata;
        assert_eq!(
            m.labels.as_ref().unwrap()["team"],
            "coordination",
            "member {i}"
        );
    }
    let template = &sim.obs.statefulsets[&keeper]
        .spec
        .volume_claim_templates
        .as_ref()
        .unwrap()[0];
    assert_eq!(
        template.metadata.labels.as_ref().unwrap()["team"],
        "coordination"
    );
    let pods_after: Vec<_> = (0..3)
        .map(|i| sim.obs.pods[&format!("{keeper}-{i}")].clone())
        .collect();
    assert_eq!(pods_before, pods_after, "no member restarts");
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// The Keeper's volumes grow in place as the servers' do: every member's PVC is resized, the
/// Keeper StatefulSet (whose claim template cannot change) is recreated with its pods kept,
/// and no member restarts.
#[test]
fn keeper_storage_growth_resizes_every_member_pvc_without_a_restart() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 1,
        "storageScaling": {"enableVolumeScaling": true}}));
    sim.converge(20);
    let keeper = model::names::keeper("c1");
    let members: Vec<String> = (0..3).map(|i| format!("data-{keeper}-{i}")).collect();
    for m in &members {
        assert!(sim.obs.pvcs.contains_key(m), "{m}");
    }
    let pods_before: Vec<_> = (0..3)
        .map(|i| sim.obs.pods[&format!("{keeper}-{i}")].clone())
        .collect();
    sim.log.clear();
    sim.cluster.spec.keeper.storage.size = "2Gi".into();
    let p = sim.plan();
    assert!(
        !p.actions.iter().any(
            |a| matches!(a, Action::Apply { kind: Kind::StatefulSet, name, .. } if *name == keeper)
        ),
        "the Keeper StatefulSet is not applied with a changed claim template: {:?}",
        p.actions
    );
    sim.converge(20);
    for m in &members {
        let size = &sim.obs.pvcs[m]
            .spec
            .as_ref()
            .unwrap()
            .resources
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap()["storage"];
        assert_eq!(size.0, "2Gi", "{m}");
    }
    assert!(
        sim.log
            .iter()
            .any(|l| l.starts_with(&format!("delete StatefulSet {keeper}"))),
        "{:?}",
        sim.log
    );
    let pods_after: Vec<_> = (0..3)
        .map(|i| sim.obs.pods[&format!("{keeper}-{i}")].clone())
        .collect();
    assert_eq!(pods_before, pods_after, "no member restarts");
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// The pods of the servers, as (name, uid-less revision label) pairs, to count restarts.
fn server_restarts(log: &[String]) -> Vec<&String> {
    log.iter()
        .filter(|l| l.starts_with("restart pod c1-") && !l.contains("keeper"))
        .collect()
}

/// Decision 5: a change first rolls one replica of the whole cluster (the canary); once it is
/// Ready on the new template the shards roll in parallel; every server restarts exactly once.
#[test]
fn a_canary_replica_rolls_before_the_shards_go_in_parallel() {
    let mut sim = Sim::new(serde_json::json!({"shards": 2, "replicas": 2}));
    sim.converge(20);
    sim.cluster.spec.image = "clickhouse/clickhouse-server:25.3".into();
    let p = sim.plan_caught_up();
    let written: Vec<&String> = statefulsets_applied(&p);
    assert_eq!(written.len(), 1, "one canary: {:?}", p.actions);
    sim.log.clear();
    sim.converge(40);
    let restarts = server_restarts(&sim.log);
    let unique: BTreeSet<&&String> = restarts.iter().collect();
    assert_eq!(restarts.len(), 4, "{:?}", sim.log);
    assert_eq!(unique.len(), 4, "each server restarts once: {:?}", sim.log);
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// Decision 5, invariant 4: an image that cannot be pulled stops the rollout at its first
/// replica (the cluster says error, one replica down), and reverting the spec heals it with
/// maxUnavailable 1: the broken replica gets the good template and a new pod at once.
#[test]
fn reverting_a_bad_image_heals_the_broken_replica() {
    let mut sim = Sim::new(serde_json::json!({"shards": 2, "replicas": 2}));
    sim.converge(20);
    let good = sim.cluster.spec.image.clone();
    sim.bad_image = Some("registry.invalid/clickhouse:bad".into());
    sim.cluster.spec.image = "registry.invalid/clickhouse:bad".into();
    let mut failed = false;
    for _ in 0..10 {
        let p = sim.plan_caught_up();
        let down = sim
            .obs
            .pods
            .iter()
            .filter(|(n, pod)| !n.contains("keeper") && !crate::plan::facts::pod_ready(pod))
            .count();
        assert!(down <= 1, "at most the canary is down: {down}");
        failed |= p.status.state == ClusterState::Error;
        sim.act(&p);
        sim.obs.caught_up.clear();
    }
    assert!(failed, "the rollout stops with an error");
    let servers_on_bad = sim
        .obs
        .statefulsets
        .iter()
        .filter(|(n, _)| !n.ends_with("keeper"))
        .filter(|(n, _)| sim.pulls_bad_image(n))
        .count();
    assert_eq!(servers_on_bad, 1, "only the canary got the bad image");
    sim.cluster.spec.image = good;
    sim.converge(40);
    assert_eq!(sim.state(), ClusterState::Ready);
    assert!(!sim.obs.statefulsets.keys().any(|n| sim.pulls_bad_image(n)));
}

/// Decision 5 for Keeper: a member stuck on a bad revision (the StatefulSet's own rolling
/// update never replaces a pod that is not Ready) is replaced once the spec is reverted, and
/// deleted once, not again while it stops.
#[test]
fn reverting_a_bad_keeper_image_replaces_the_stuck_member() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 1}));
    sim.converge(20);
    assert_eq!(sim.keeper_leader.as_deref(), Some("c1-keeper-2"));
    let good = sim.cluster.spec.keeper.image.clone();
    sim.bad_image = Some("registry.invalid/keeper:bad".into());
    sim.cluster.spec.keeper.image = "registry.invalid/keeper:bad".into();
    // the roll restarts a follower first (the highest ordinal that follows); it never becomes
    // Ready, and the roll goes no further
    for _ in 0..4 {
        let p = sim.plan();
        sim.act(&p);
    }
    assert!(!crate::plan::facts::pod_ready(&sim.obs.pods["c1-keeper-1"]));
    assert_eq!(keeper_restarts(&sim.log), ["c1-keeper-1"]);
    assert!(
        sim.cluster
            .status
            .as_ref()
            .unwrap()
            .message
            .as_deref()
            .unwrap_or("")
            .contains("waiting for c1-keeper-1 to serve"),
        "{:?}",
        sim.cluster.status
    );
    sim.cluster.spec.keeper.image = good;
    let p = sim.plan();
    sim.act(&p);
    let p = sim.plan();
    assert!(
        p.actions
            .iter()
            .any(|a| matches!(a, Action::RestartPod { pod, .. } if pod == "c1-keeper-1")),
        "{:?}",
        p.actions
    );
    // while the deleted member still stops, it is not deleted again
    let mut stopping = sim.obs.pods["c1-keeper-1"].clone();
    stopping.metadata.deletion_timestamp = Some(Time(now()));
    sim.obs.pods.insert("c1-keeper-1".into(), stopping);
    let again = sim.plan();
    assert!(
        !again
            .actions
            .iter()
            .any(|a| matches!(a, Action::RestartPod { pod, .. } if pod == "c1-keeper-1")),
        "{:?}",
        again.actions
    );
    sim.act(&p);
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready);
    // the leader was never restarted
    assert_eq!(keeper_restarts(&sim.log), ["c1-keeper-1", "c1-keeper-1"]);
}

fn keeper_restarts(log: &[String]) -> Vec<&str> {
    log.iter()
        .filter_map(|l| l.strip_prefix("restart pod "))
        .filter(|p| p.contains("keeper"))
        .collect()
}

/// Decision 31: five Keeper template changes in a row, one pass apart (faster than a roll
/// goes): the operator restarts one member per pass, followers first (highest ordinal first)
/// and the leader last, coalescing to the newest template: the leader is restarted once, so
/// the ensemble changes leader once; every member ends on the newest revision, and `ready`.
#[test]
fn rapid_keeper_changes_roll_followers_first_and_the_leader_once_at_the_end() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 1}));
    sim.converge(20);
    assert_eq!(sim.keeper_leader.as_deref(), Some("c1-keeper-2"));
    let before = sim.log.len();
    for i in 0..5 {
        sim.cluster.spec.keeper.pod.annotations =
            BTreeMap::from([("example.com/change".to_string(), i.to_string())]);
        let p = sim.plan();
        let restarts = p
            .actions
            .iter()
            .filter(|a| matches!(a, Action::RestartPod { .. }))
            .count();
        assert!(restarts <= 1, "{:?}", p.actions);
        sim.act(&p);
    }
    sim.converge(30);
    assert_eq!(sim.state(), ClusterState::Ready);
    let log = &sim.log[before..];
    let restarts = keeper_restarts(log);
    assert_eq!(
        restarts.iter().filter(|p| **p == "c1-keeper-2").count(),
        1,
        "the leader restarts once: {restarts:?}"
    );
    assert_eq!(restarts.last(), Some(&"c1-keeper-2"), "{restarts:?}");
    let elections: Vec<&String> = log
        .iter()
        .filter(|l| l.starts_with("keeper leader"))
        .collect();
    assert_eq!(elections.len(), 1, "{elections:?}");
    // followers: at most once per change they lag behind
    assert!(restarts.len() <= 1 + 2 * 5, "{restarts:?}");
    let sts = &sim.obs.statefulsets["c1-keeper"];
    let rev = sts.status.as_ref().unwrap().update_revision.clone();
    for i in 0..3 {
        let p = &sim.obs.pods[&format!("c1-keeper-{i}")];
        assert_eq!(
            p.metadata
                .labels
                .as_ref()
                .unwrap()
                .get("controller-revision-hash"),
            rev.as_ref()
        );
    }
}

/// Decision 31, the gate: a member goes only while every member is Ready and not stopping,
/// the leader reports every follower synced and every role is known; followers before the
/// leader; one member alone goes at once.
#[test]
fn a_keeper_member_is_rolled_only_while_the_ensemble_is_whole_and_synced() {
    use crate::plan::facts::{KeeperFacts, KeeperMember, KeeperRole};
    let member = |i: i32, role: KeeperRole, old: bool| KeeperMember {
        pod: format!("c1-keeper-{i}"),
        ready: true,
        ready_since: Some(now() - k8s_openapi::jiff::SignedDuration::from_secs(60)),
        old_revision: old,
        current: !old,
        role,
        ..KeeperMember::default()
    };
    let leader = |n| KeeperRole::Leader {
        synced_followers: n,
    };
    let facts = |ms: Vec<KeeperMember>| KeeperFacts {
        exists: true,
        size: ms.len() as i32,
        members: ms
            .into_iter()
            .enumerate()
            .map(|(i, m)| (i as i32, m))
            .collect(),
        views_read: true,
    };
    let f = KeeperRole::Follower;
    let pick = |k: &KeeperFacts| super::keeper::next_to_roll(k, now()).map(|m| m.pod);
    // followers first, the highest ordinal first
    let k = facts(vec![
        member(0, f, true),
        member(1, leader(2), true),
        member(2, f, true),
    ]);
    assert_eq!(pick(&k).unwrap(), "c1-keeper-2");
    // then the other follower, the leader last
    let k = facts(vec![
        member(0, f, true),
        member(1, leader(2), true),
        member(2, f, false),
    ]);
    assert_eq!(pick(&k).unwrap(), "c1-keeper-0");
    let mut k = facts(vec![
        member(0, f, false),
        member(1, leader(2), true),
        member(2, f, false),
    ]);
    assert_eq!(pick(&k).unwrap(), "c1-keeper-1");
    // the leader only once every follower has run the new template for a while (a change
    // coming faster restarts the followers again, the leader once)
    k.members.get_mut(&0).unwrap().ready_since =
        Some(now() - k8s_openapi::jiff::SignedDuration::from_secs(5));
    assert!(
        pick(&k).unwrap_err().contains("c1-keeper-0 has not"),
        "{:?}",
        pick(&k)
    );
    // the restarted follower has not synced yet
    let k = facts(vec![
        member(0, f, true),
        member(1, leader(1), true),
        member(2, f, false),
    ]);
    assert!(
        pick(&k).unwrap_err().contains("synced (1 of 2"),
        "{:?}",
        pick(&k)
    );
    // a member not Ready, or stopping
    let mut k = facts(vec![
        member(0, f, true),
        member(1, leader(2), true),
        member(2, f, false),
    ]);
    k.members.get_mut(&2).unwrap().ready = false;
    assert!(pick(&k).unwrap_err().contains("c1-keeper-2 to serve"));
    k.members.get_mut(&2).unwrap().ready = true;
    k.members.get_mut(&2).unwrap().terminating = true;
    assert!(pick(&k).unwrap_err().contains("c1-keeper-2 to stop"));
    // a pod missing, no leader known, a role not known
    let mut k = facts(vec![
        member(0, f, true),
        member(1, leader(2), true),
        member(2, f, false),
    ]);
    k.members.remove(&2);
    k.size = 3;
    assert!(pick(&k).is_err());
    let k = facts(vec![
        member(0, f, true),
        member(1, f, true),
        member(2, f, false),
    ]);
    assert!(pick(&k).unwrap_err().contains("leader"));
    let k = facts(vec![
        member(0, KeeperRole::Unknown, true),
        member(1, leader(2), true),
        member(2, f, false),
    ]);
    assert!(
        pick(&k)
            .unwrap_err()
            .contains("c1-keeper-0 to report its role")
    );
    // one member: nobody to wait for
    let k = facts(vec![member(0, KeeperRole::Standalone, true)]);
    assert_eq!(pick(&k).unwrap(), "c1-keeper-0");
}

/// `mntr` answers of ClickHouse Keeper and ZooKeeper read as roles; a member that is not
/// serving answers prose.
#[test]
fn keeper_roles_are_read_from_mntr() {
    use crate::plan::facts::KeeperRole;
    let leader =
        "zk_version\tv24.8\nzk_server_state\tleader\nzk_followers\t2\nzk_synced_followers\t1\n";
    assert_eq!(
        KeeperRole::from_mntr(leader),
        KeeperRole::Leader {
            synced_followers: 1
        }
    );
    assert_eq!(
        KeeperRole::from_mntr("zk_server_state\tfollower\n"),
        KeeperRole::Follower
    );
    assert_eq!(
        KeeperRole::from_mntr("zk_server_state\tstandalone\n"),
        KeeperRole::Standalone
    );
    assert_eq!(
        KeeperRole::from_mntr("This ZooKeeper instance is not currently serving requests\n"),
        KeeperRole::Unknown
    );
}

/// Resuming after a pause starts Keeper first; servers start once it serves.
#[test]
fn resume_starts_keeper_before_the_servers() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
    sim.converge(20);
    sim.cluster.spec.pause = true;
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Paused);
    sim.cluster.spec.pause = false;
    let p = sim.plan();
    let started: Vec<&String> = p
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Apply {
                kind: Kind::StatefulSet,
                name,
                object,
                ..
            } if object["spec"]["replicas"].as_i64() != Some(0) => Some(name),
            _ => None,
        })
        .collect();
    assert_eq!(started, ["c1-keeper"], "{:?}", p.actions);
    sim.act(&p);
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// Invariant 1, against stale observations: a pass planned from a status older than the
/// StatefulSet of a just-added replica (the map in it lacks the replica) deletes nothing of it.
#[test]
fn a_stale_map_never_deletes_a_server_statefulset() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 1}));
    sim.converge(20);
    let stale = sim.cluster.status.clone();
    sim.cluster.spec.replicas = 2;
    sim.converge(20);
    assert_eq!(sim.map().len(), 2);
    let added: Vec<String> = sim
        .map()
        .keys()
        .filter(|n| !stale.as_ref().unwrap().replica_state_map.contains_key(*n))
        .cloned()
        .collect();
    sim.cluster.status = stale;
    let p = sim.plan();
    for a in &p.actions {
        if let Action::Delete { name, .. } = a {
            assert!(
                !added.contains(name),
                "deletes {name} of the new replica: {:?}",
                p.actions
            );
        }
    }
}

/// Decision 17: for a while after a server pod became Ready (say, restarted with a new
/// address), every Ready server drops its DNS cache, even once the cluster is ready again; that
/// is SQL only, no Kubernetes write.
#[test]
fn a_pod_that_just_became_ready_makes_every_server_resolve_again() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
    sim.converge(20);
    assert!(sim.plan().actions.is_empty());
    let pod = sim
        .obs
        .pods
        .keys()
        .find(|p| !p.contains("keeper"))
        .unwrap()
        .clone();
    let conditions = sim
        .obs
        .pods
        .get_mut(&pod)
        .unwrap()
        .status
        .as_mut()
        .unwrap()
        .conditions
        .as_mut()
        .unwrap();
    conditions[0].last_transition_time = Some(Time(now()));
    let p = sim.plan();
    let drops: Vec<&Action> = p
        .actions
        .iter()
        .filter(|a| matches!(a, Action::DropDnsCache { .. }))
        .collect();
    assert_eq!(drops.len(), 2, "{:?}", p.actions);
    assert_eq!(drops.len(), p.actions.len());
    assert!(p.actions.iter().all(|a| !a.writes_kubernetes()));
    assert_eq!(p.status.state, ClusterState::Ready);
}

/// Decision 45: a Ready server whose replicated tables are read-only only because their Keeper
/// session expired (Keeper answers it again) is made to reopen it for those tables, SQL only;
/// a server with no such table is left alone, and a pausing cluster is left alone.
#[test]
fn tables_waiting_only_for_a_new_keeper_session_are_made_to_open_it() {
    let mut sim =
        Sim::new(serde_json::json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1}}));
    sim.converge(20);
    let replica = sim.map().keys().next().unwrap().clone();
    let tables = vec![("db1".to_string(), "events".to_string())];
    sim.obs
        .stalled_tables
        .insert(replica.clone(), tables.clone());
    let p = sim.plan();
    let restarts: Vec<&Action> = p
        .actions
        .iter()
        .filter(|a| matches!(a, Action::RestartReplicatedTables { .. }))
        .collect();
    assert_eq!(
        restarts,
        vec![&Action::RestartReplicatedTables {
            replica: replica.clone(),
            tables
        }],
        "{:?}",
        p.actions
    );
    assert!(restarts.iter().all(|a| !a.writes_kubernetes()));
    sim.cluster.spec.pause = true;
    let p = sim.plan();
    assert!(
        p.actions
            .iter()
            .all(|a| !matches!(a, Action::RestartReplicatedTables { .. })),
        "{:?}",
        p.actions
    );
}

/// S0-20: a new replica's schema is copied only once every Ready replica serves (they are its
/// sources); meanwhile the status says what it waits for.
#[test]
fn schema_copy_waits_until_every_ready_replica_serves() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 1}));
    sim.converge(20);
    let first = sim.map().keys().next().unwrap().clone();
    sim.cluster.spec.replicas = 2;
    for _ in 0..2 {
        let p = sim.plan();
        sim.act(&p);
    }
    // The first replica's pod is gone (restarting) when the new one is ready for its schema.
    sim.broken.insert(format!("{first}-0"));
    sim.obs.pods.remove(&format!("{first}-0"));
    sim.settle();
    let p = sim.plan();
    assert!(
        !p.actions
            .iter()
            .any(|a| matches!(a, Action::MigrateSchema { .. })),
        "{:?}",
        p.actions
    );
    assert!(
        p.status
            .message
            .as_deref()
            .unwrap_or("")
            .contains("copying the schema waits for"),
        "{:?}",
        p.status.message
    );
    sim.broken.clear();
    sim.obs.pods.remove(&format!("{first}-0"));
    sim.settle();
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// S2-33: RollingUpdate restarts one replica of a shard at a time without waiting for the
/// restarted one to catch up with replication; Smart Update waits.
#[test]
fn rolling_update_does_not_wait_for_catch_up_but_smart_update_does() {
    for (strategy, finishes) in [("RollingUpdate", true), ("SmartUpdate", false)] {
        let mut sim =
            Sim::new(serde_json::json!({"shards": 1, "replicas": 3, "updateStrategy": strategy}));
        sim.converge(20);
        sim.cluster.spec.image = "clickhouse/clickhouse-server:25.3".into();
        sim.log.clear();
        for _ in 0..30 {
            // Every replica reports replication lag, always.
            for n in sim.map().keys().cloned().collect::<Vec<_>>() {
                sim.obs.caught_up.insert(n, false);
            }
            let p = sim.plan();
            sim.act(&p);
        }
        let rolled: BTreeSet<&String> = sim
            .log
            .iter()
            .filter(|l| {
                l.starts_with("restart pod c1-") || l.starts_with("controller replaces pod c1-")
            })
            .collect();
        assert_eq!(rolled.len() == 3, finishes, "{strategy}: {:?}", sim.log);
    }
}

/// S2-32: a Smart Update waits for a restarted replica to catch up for `catchUpSeconds`
/// (default 2 hours); past it the rollout stops with a message naming the replica. Here a
/// restarted replica never catches up, and its pod has been Ready for 60 s.
#[test]
fn a_replica_that_does_not_catch_up_stops_the_rollout_after_catch_up_seconds() {
    for (catch_up, fails) in [(None, false), (Some(120), false), (Some(30), true)] {
        let mut spec = serde_json::json!({"shards": 1, "replicas": 3});
        if let Some(s) = catch_up {
            spec["catchUpSeconds"] = s.into();
        }
        let mut sim = Sim::new(spec);
        sim.converge(20);
        sim.cluster.spec.image = "clickhouse/clickhouse-server:25.3".into();
        let mut message = String::new();
        let mut reason = None;
        sim.log.clear();
        for _ in 0..10 {
            // a restarted replica lags, always; the others are synced
            for n in sim.map().keys().cloned().collect::<Vec<_>>() {
                let restarted = sim.log.iter().any(|l| {
                    (l.starts_with("restart pod ") || l.starts_with("controller replaces pod "))
                        && l.contains(&format!("{n}-0"))
                });
                sim.obs.caught_up.insert(n, !restarted);
            }
            let p = sim.plan();
            message = p.status.message.clone().unwrap_or_default();
            reason = p.failure.as_ref().map(|f| f.reason);
            sim.act(&p);
        }
        let stopped = sim.state() == ClusterState::Error;
        if fails {
            // re-checked like a healthy cluster, not backed off: it heals without an event
            assert_eq!(reason, Some(crate::plan::FailureReason::CatchUpTimeout));
        }
        assert_eq!(stopped, fails, "{catch_up:?}: {message}");
        if fails {
            assert!(
                message.contains("did not catch up with replication within 30 s"),
                "{message}"
            );
            assert!(message.contains("replica c1-0-"), "{message}");
            let restarts = sim
                .log
                .iter()
                .filter(|l| {
                    l.starts_with("restart pod ") || l.starts_with("controller replaces pod ")
                })
                .count();
            assert_eq!(restarts, 1, "the rollout stopped at its first replica");
        } else {
            assert!(!message.contains("did not catch up"), "{message}");
        }
    }
    assert_eq!(
        super::rollout::catch_up_deadline(None).as_secs(),
        7200,
        "2 hours by default"
    );
}

/// A pass whose step keeps failing reports the same status every time (no condition flips, so
/// no status write re-triggers the pass at once: it waits for its backoff).
#[test]
fn a_step_failing_the_same_way_reports_the_same_status() {
    use crate::plan::{Failure, FailureReason};
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 1}));
    sim.converge(20);
    sim.cluster.spec.replicas = 2;
    let mut last = None;
    for i in 0..4 {
        let p = sim.plan();
        let outcome = Outcome {
            failure: Some(Failure {
                reason: FailureReason::ClickHouse,
                message: "a step failed: Session expired".into(),
            }),
            ..Outcome::default()
        };
        let later = now() + k8s_openapi::jiff::SignedDuration::from_secs(i);
        let (status, _) = report(&p, &outcome, sim.cluster.metadata.generation, later);
        if i >= 2 {
            assert_eq!(Some(&status), last.as_ref(), "pass {i}");
        }
        last = Some(status.clone());
        sim.cluster.status = Some(status);
    }
}

/// A pod taken out of traffic for a restart goes back in when the change is reverted before
/// its restart.
#[test]
fn a_pod_out_of_traffic_goes_back_when_its_restart_is_not_needed() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
    sim.converge(20);
    let good = sim.cluster.spec.image.clone();
    sim.cluster.spec.image = "clickhouse/clickhouse-server:25.3".into();
    let serving = |sim: &Sim| {
        sim.obs
            .pods
            .iter()
            .filter(|(n, p)| {
                !n.contains("keeper")
                    && p.metadata
                        .labels
                        .as_ref()
                        .is_some_and(|l| l.contains_key(model::labels::SERVING))
            })
            .count()
    };
    for _ in 0..10 {
        let p = sim.plan_caught_up();
        let excluding = p
            .actions
            .iter()
            .any(|a| matches!(a, Action::SetServing { serving: false, .. }));
        sim.act(&p);
        if excluding {
            break;
        }
    }
    assert_eq!(serving(&sim), 1, "one pod out of traffic for its restart");
    sim.cluster.spec.image = good;
    sim.converge(20);
    assert_eq!(serving(&sim), 2, "{:?}", sim.log);
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// Invariant 4: a field the spec no longer sets (a node selector removed, say by a revert)
/// leaves the StatefulSets too, servers (rolled) and Keeper alike.
#[test]
fn a_removed_field_leaves_the_statefulsets() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
    sim.converge(20);
    let selector = BTreeMap::from([("example.com/zone".to_string(), "a".to_string())]);
    sim.cluster.spec.pod.node_selector = selector.clone();
    sim.cluster.spec.keeper.pod.node_selector = selector;
    sim.converge(40);
    let has_selector = |sim: &Sim| {
        sim.obs
            .statefulsets
            .values()
            .filter(|s| json_of(&s.spec)["template"]["spec"]["nodeSelector"].is_object())
            .count()
    };
    assert_eq!(has_selector(&sim), 3);
    sim.cluster.spec.pod.node_selector.clear();
    sim.cluster.spec.keeper.pod.node_selector.clear();
    sim.log.clear();
    sim.converge(40);
    assert_eq!(has_selector(&sim), 0, "{:?}", sim.log);
    assert_eq!(server_restarts(&sim.log).len(), 2, "{:?}", sim.log);
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// Decision 27: the servers' Keeper identity never changes once they have it (their znodes carry
/// an ACL for it). A Keeper password changed or removed in `<cluster>-operator` is refused with
/// the key and the Secret named and nothing is written; the previous value back heals it.
#[test]
fn a_changed_or_removed_keeper_identity_is_refused_and_nothing_is_written() {
    use crate::model::config::server::keeper_identity_text;
    use crate::plan::FailureReason;
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
    let first = model::Password("first".into());
    sim.obs.inputs.keeper_password = Some(first.clone());
    sim.converge(20);
    sim.obs.keeper_identity_in_use = Some(keeper_identity_text(&first));
    assert_eq!(
        sim.converge(5),
        0,
        "the identity in use is the one asked for"
    );
    for changed in [Some(model::Password("second".into())), None] {
        sim.obs.inputs.keeper_password = changed;
        let p = sim.plan_caught_up();
        let f = p.failure.as_ref().expect("refused");
        assert_eq!(f.reason, FailureReason::CredentialChangeRefused);
        assert!(
            f.message.contains("keeper-password") && f.message.contains("c1-operator"),
            "{}",
            f.message
        );
        assert!(p.actions.is_empty(), "nothing written: {:?}", p.actions);
    }
    sim.obs.inputs.keeper_password = Some(first);
    let p = sim.plan_caught_up();
    assert!(
        p.failure.is_none() && p.actions.is_empty(),
        "{:?}",
        p.failure
    );
}

/// Decision 28: with an external Keeper, the first pass creates the cluster's root in it and no
/// server; the servers come once the root is recorded, and the cluster converges with no
/// Keeper of its own.
#[test]
fn an_external_keeper_gets_the_root_before_any_server_starts() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2,
        "keeper": {"replicas": 0, "external": {"nodes": [{"host": "zk-0.zk", "port": 2181}]}}}));
    let p = sim.plan();
    assert!(
        p.actions.contains(&Action::EnsureKeeperRoot {
            root: "/clickhouse-operator/t1/c1".into()
        }),
        "{:?}",
        p.actions
    );
    assert!(
        statefulsets_applied(&p).is_empty(),
        "no server before the root: {:?}",
        p.actions
    );
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready, "{:?}", sim.cluster.status);
    let status = sim.cluster.status.clone().unwrap();
    assert_eq!(
        status.keeper_root.as_deref(),
        Some("/clickhouse-operator/t1/c1")
    );
    assert!(!sim.obs.statefulsets.contains_key("c1-keeper"));
    assert_eq!(sim.obs.statefulsets.len(), 2);
    let p = sim.plan();
    assert!(p.actions.is_empty(), "{:?}", p.actions);
}

/// Decision 28: once the servers keep their data under an external Keeper's root, a spec naming
/// another root is refused with both named, and nothing is written.
#[test]
fn a_changed_external_keeper_root_is_refused_and_nothing_is_written() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2,
        "keeper": {"replicas": 0, "external": {"nodes": [{"host": "zk-0.zk"}], "root": "/a"}}}));
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready, "{:?}", sim.cluster.status);
    sim.cluster.spec.keeper.external.as_mut().unwrap().root = Some("/b".into());
    sim.cluster.metadata.generation = Some(2);
    let p = sim.plan();
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    let f = p.failure.expect("refused");
    assert_eq!(f.reason, crate::plan::FailureReason::InvalidSpec);
    assert!(
        f.message.contains("/a") && f.message.contains("/b"),
        "{}",
        f.message
    );
}

/// Decision 38: a cluster on another namespace's cluster's Keeper proceeds only once that
/// cluster lists its namespace in `spec.keeper.allowedNamespaces`, and a new root must lie in
/// its own namespace's folder of that Keeper; a root made before the rule stays.
#[test]
fn another_namespaces_keeper_is_used_only_with_its_consent_and_in_our_folder() {
    use crate::plan::facts::KeeperOwner;
    let spec = |root: Option<&str>| {
        let mut x = serde_json::json!({"clusterRef": {"name": "shared", "namespace": "infra"}});
        if let Some(r) = root {
            x["root"] = r.into();
        }
        serde_json::json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 0, "external": x}})
    };
    for (owner, says) in [
        (
            KeeperOwner::Refuses,
            "add t1 to its spec.keeper.allowedNamespaces",
        ),
        (KeeperOwner::Missing, "infra/shared does not exist"),
    ] {
        let mut sim = Sim::new(spec(None));
        sim.obs.keeper_owner = Some(owner);
        let p = sim.plan();
        assert!(p.actions.is_empty(), "nothing is created: {:?}", p.actions);
        let f = p.failure.expect("refused");
        assert_eq!(f.reason, crate::plan::FailureReason::Keeper);
        assert!(f.message.contains(says), "{}", f.message);
    }
    for root in [
        "/clickhouse",
        "/clickhouse-operator/other-ns/c1",
        "/clickhouse-operator/t1",
    ] {
        let mut sim = Sim::new(spec(Some(root)));
        sim.obs.keeper_owner = Some(KeeperOwner::Allows);
        let p = sim.plan();
        let f = p.failure.unwrap_or_else(|| panic!("{root} refused"));
        assert!(
            f.message
                .contains("must lie below /clickhouse-operator/t1/"),
            "{}",
            f.message
        );
    }
    let mut sim = Sim::new(spec(Some("/clickhouse-operator/t1/analytics")));
    sim.obs.keeper_owner = Some(KeeperOwner::Allows);
    assert!(sim.plan().actions.contains(&Action::EnsureKeeperRoot {
        root: "/clickhouse-operator/t1/analytics".into()
    }));
    // a root made before the rule stays usable
    let mut old = Sim::new(spec(Some("/legacy/root")));
    old.obs.keeper_owner = Some(KeeperOwner::Allows);
    old.cluster
        .status
        .get_or_insert_with(Default::default)
        .keeper_root = Some("/legacy/root".into());
    assert!(old.plan().failure.is_none());
}

/// Decision 36: a cluster made before the exporter had an account of its own gets its
/// password added to `<cluster>-operator`, then the account in the users file, which the servers
/// reload: no StatefulSet changes, no pod restarts.
#[test]
fn an_older_cluster_gets_the_exporters_account_without_a_restart() {
    let mut sim =
        Sim::new(serde_json::json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1}}));
    sim.converge(30);
    assert_eq!(sim.state(), ClusterState::Ready);
    sim.obs.inputs.exporter_password = None;
    let pods_before: Vec<String> = sim.obs.pods.keys().cloned().collect();
    let p = sim.plan();
    assert!(
        p.actions.contains(&Action::AddExporterPassword),
        "{:?}",
        p.actions
    );
    sim.act(&p);
    assert!(sim.obs.inputs.exporter_password.is_some());
    let p = sim.plan_caught_up();
    assert!(
        statefulsets_applied(&p).is_empty(),
        "no restart: {:?}",
        p.actions
    );
    assert!(
        !p.actions
            .iter()
            .any(|a| matches!(a, Action::RestartPod { .. })),
        "{:?}",
        p.actions
    );
    sim.converge(10);
    assert!(
        users_secret_file(&sim, crate::model::names::USERS_FILE)
            .contains(crate::model::names::EXPORTER_USER)
    );
    assert_eq!(
        sim.obs.pods.keys().cloned().collect::<Vec<_>>(),
        pods_before
    );
}

/// A file of the applied users Secret `c1-users`.
fn users_secret_file(sim: &Sim, key: &str) -> String {
    let object = sim
        .obs
        .objects
        .get(&(Kind::Secret, "c1-users".into()))
        .expect("the users Secret is applied");
    let secret: k8s_openapi::api::core::v1::Secret =
        serde_json::from_value(object.clone()).unwrap();
    String::from_utf8(secret.data.unwrap()[key].0.clone()).unwrap()
}

/// Decision 33: the cluster `<secret>` and the operator's grants are written only once every
/// server has reported a version that has them (the image tag says 24.8 throughout, as the
/// local kubelet's 18.16 pods do); the version is in the status; a server restarting keeps
/// them; an image whose tag names an older version takes them away in the pass that changes
/// the image, before any pod restarts on it.
#[test]
fn the_cluster_secret_and_grants_follow_the_versions_the_servers_report() {
    use crate::model::names::{REMOTE_SERVERS_FILE, USERS_FILE};
    let mut sim = Sim::new(serde_json::json!({"shards": 2, "replicas": 2,
        "image": "clickhouse/clickhouse-server:24.8"}));
    sim.obs.inputs.cluster_password = Some(model::Password("cluster-pw".into()));
    sim.obs.inputs.cluster_secret = Some(model::Password("the-cluster-secret".into()));
    // servers that do not answer the version: nothing version-dependent
    sim.converge(30);
    let remote = users_secret_file(&sim, REMOTE_SERVERS_FILE);
    assert!(!remote.contains("<secret") && remote.contains("<user>clickhouse_cluster</user>"));
    assert_eq!(sim.cluster.status.as_ref().unwrap().version, None);
    // 18.16 everywhere, whatever the tag says: still nothing
    sim.server_version = Some("18.16.1".into());
    sim.converge(10);
    let remote = users_secret_file(&sim, REMOTE_SERVERS_FILE);
    assert!(!remote.contains("<secret"), "{remote}");
    assert!(!users_secret_file(&sim, USERS_FILE).contains("<grants>"));
    assert_eq!(
        sim.cluster.status.as_ref().unwrap().version.as_deref(),
        Some("18.16.1.0")
    );
    // every server on 24.8: the secret replaces the account, the operator gets its grants
    sim.server_version = Some("24.8.4.13".into());
    let restarts_before = sim.log.iter().filter(|l| l.contains("restart")).count();
    sim.converge(10);
    let remote = users_secret_file(&sim, REMOTE_SERVERS_FILE);
    assert!(
        remote.contains("<secret hide_in_preprocessed=\"true\">the-cluster-secret</secret>"),
        "{remote}"
    );
    assert!(
        !remote.contains("<user>") && !remote.contains("<password"),
        "{remote}"
    );
    assert_eq!(remote.matches("<replica>").count(), 4);
    let users = users_secret_file(&sim, USERS_FILE);
    assert!(
        users.contains("<query>GRANT SELECT, INSERT, SHOW ON *.*</query>"),
        "{users}"
    );
    assert_eq!(
        sim.cluster.status.as_ref().unwrap().version.as_deref(),
        Some("24.8.4.13")
    );
    assert_eq!(
        sim.log.iter().filter(|l| l.contains("restart")).count(),
        restarts_before,
        "a runtime-reloaded file: no server restarts for it"
    );
    // a server not answering (restarting) keeps them
    sim.server_version = None;
    assert!(
        sim.plan_caught_up().actions.is_empty(),
        "nothing is rewritten while a version is unknown"
    );
    sim.server_version = Some("24.8.4.13".into());
    // an older image: gone in the pass that changes the image, before the first restart
    sim.cluster.spec.image = "clickhouse/clickhouse-server:20.3".into();
    sim.cluster.metadata.generation = Some(2);
    let p = sim.plan_caught_up();
    let secret_at = p
        .actions
        .iter()
        .position(
            |a| matches!(a, Action::Apply { kind: Kind::Secret, name, .. } if name == "c1-users"),
        )
        .expect("the users Secret is rewritten");
    assert!(
        p.actions[..secret_at].iter().all(|a| !matches!(
            a,
            Action::RestartPod { .. }
                | Action::Apply {
                    kind: Kind::StatefulSet,
                    ..
                }
        )),
        "{:?}",
        p.actions
    );
    sim.act(&p);
    let remote = users_secret_file(&sim, REMOTE_SERVERS_FILE);
    assert!(!remote.contains("<secret") && remote.contains("<user>clickhouse_cluster</user>"));
    assert!(!users_secret_file(&sim, USERS_FILE).contains("<grants>"));
}

/// A pod a pass deleted for its restart is not deleted again, nor its restart announced
/// again, while it is still stopping (the passes its own deletion triggers came while its
/// server shut down: each deleted it again and published another `RestartPod` event).
#[test]
fn a_pod_deleted_for_its_restart_is_not_deleted_again_while_it_stops() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
    sim.converge(20);
    sim.cluster.spec.image = "clickhouse/clickhouse-server:25.3".into();
    let restarts = |p: &Plan| -> Vec<String> {
        p.actions
            .iter()
            .filter_map(|a| match a {
                Action::RestartPod { pod, .. } => Some(pod.clone()),
                _ => None,
            })
            .collect()
    };
    let mut first = None;
    for _ in 0..10 {
        let p = sim.plan_caught_up();
        if let Some(pod) = restarts(&p).into_iter().next() {
            assert!(
                p.events.iter().any(|e| e.reason == "RestartPod"),
                "{:?}",
                p.events
            );
            first = Some(pod);
            break;
        }
        sim.act(&p);
    }
    let pod = first.expect("a server pod is restarted");
    // deleted, still stopping: no longer Ready, its deletion under way
    let p = sim.obs.pods.get_mut(&pod).unwrap();
    p.metadata.deletion_timestamp = Some(Time(now()));
    p.status = Some(PodStatus::default());
    let again = sim.plan_caught_up();
    assert!(restarts(&again).is_empty(), "{:?}", again.actions);
    assert!(
        !again.events.iter().any(|e| e.reason == "RestartPod"),
        "{:?}",
        again.events
    );
    // once it is gone the rollout goes on to the end
    sim.obs.pods.remove(&pod);
    sim.converge(40);
    assert_eq!(sim.state(), ClusterState::Ready, "{:?}", sim.log);
}

/// Decision 5: the canary is proven only by a replica restarted on the new template. A pass
/// that comes between the canary's template write and the StatefulSet controller's status for
/// it (the replica still Ready on its old pod, its revision not known yet) writes no other
/// replica's template.
#[test]
fn a_canary_whose_statefulset_status_lags_proves_nothing() {
    let mut sim = Sim::new(serde_json::json!({"shards": 2, "replicas": 2}));
    sim.converge(20);
    sim.cluster.spec.image = "clickhouse/clickhouse-server:25.3".into();
    let p = sim.plan_caught_up();
    let written: Vec<String> = statefulsets_applied(&p).into_iter().cloned().collect();
    assert_eq!(written.len(), 1, "one canary: {:?}", p.actions);
    sim.act(&p);
    // the StatefulSet controller has not seen the new template yet
    let canary = &written[0];
    let sts = sim.obs.statefulsets.get_mut(canary).unwrap();
    let status = sts.status.as_mut().unwrap();
    status.observed_generation = sts.metadata.generation.map(|g| g - 1);
    for _ in 0..3 {
        let p = sim.plan_caught_up();
        let others: Vec<&String> = statefulsets_applied(&p)
            .into_iter()
            .filter(|n| *n != canary)
            .collect();
        assert!(others.is_empty(), "{:?}", p.actions);
        sim.act(&p);
        let sts = sim.obs.statefulsets.get_mut(canary).unwrap();
        let status = sts.status.as_mut().unwrap();
        status.observed_generation = sts.metadata.generation.map(|g| g - 1);
    }
    // the controller catches up: the canary restarts, then the shards roll
    let sts = sim.obs.statefulsets.get_mut(canary).unwrap();
    sts.status.as_mut().unwrap().observed_generation = sts.metadata.generation;
    sim.log.clear();
    sim.converge(40);
    let restarts = server_restarts(&sim.log);
    assert_eq!(
        restarts.first(),
        Some(&&format!("restart pod {canary}-0")),
        "{:?}",
        sim.log
    );
    assert_eq!(
        restarts.len(),
        4,
        "each server restarts once: {:?}",
        sim.log
    );
    assert_eq!(sim.state(), ClusterState::Ready, "{:?}", sim.log);
}

/// A server that has not loaded the current remote_servers yet, or a Distributed query that
/// does not reach every shard, is something no Kubernetes event announces: the plan asks to be
/// passed again soon (not at the 5 s re-check), and not once every server has loaded it.
#[test]
fn a_server_loading_the_new_hosts_is_checked_again_soon() {
    let mut sim = Sim::new(serde_json::json!({"shards": 2, "replicas": 2}));
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready, "{:?}", sim.cluster.status);
    let p = sim.plan();
    assert!(!p.recheck_soon, "settled: {:?}", p.status.message);
    // c1-0-0 still lists the hosts of before a scale-in
    sim.obs.cluster_hosts.insert("c1-0-0".into(), Some(6));
    let p = sim.plan();
    assert!(p.recheck_soon);
    assert_ne!(p.status.state, ClusterState::Ready);
    assert!(
        p.status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("c1-0-0 to load")),
        "{:?}",
        p.status.message
    );
    sim.obs.cluster_hosts.insert("c1-0-0".into(), Some(4));
    let p = sim.plan();
    assert!(!p.recheck_soon, "{:?}", p.status.message);
    assert_eq!(p.status.state, ClusterState::Ready);
    // a shard not reached through a Distributed query yet
    sim.obs
        .distributed
        .insert("c1-1-2".into(), Some("shard 0 not reached".into()));
    assert!(sim.plan().recheck_soon);
}

/// Decision 36: where the operator publishes the exporter's credentials, a cluster whose
/// credentials are not (or no longer) the published ones gets them published, without holding
/// anything else up; once current, nothing is published again.
#[test]
fn the_exporters_credentials_are_published_until_current() {
    let mut sim =
        Sim::new(serde_json::json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1}}));
    sim.converge(30);
    assert_eq!(sim.state(), ClusterState::Ready);
    assert!(
        !sim.plan()
            .actions
            .contains(&Action::PublishExporterCredentials),
        "none configured"
    );
    sim.obs.exporter_credentials_published = Some(false);
    let p = sim.plan();
    assert_eq!(p.actions, [Action::PublishExporterCredentials]);
    assert!(p.failure.is_none());
    sim.act(&p);
    let p = sim.plan_caught_up();
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// Decision 34: a Secret key that `secretSettings` or `secretFiles` names and its Secret
/// does not have would keep the pods from starting: the pass says which, writes nothing, and
/// goes on once the key is there.
#[test]
fn a_missing_key_of_a_secret_setting_is_said_and_nothing_is_written() {
    let mut sim = Sim::new(
        serde_json::json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1},
        "configuration": {"secretSettings": {"timezone": {"name": "cfg", "key": "tz"}},
            "secretFiles": {"s3.xml": {"name": "cfg", "key": "s3"}}}}),
    );
    sim.obs.inputs.secrets.insert(
        "cfg".into(),
        BTreeMap::from([("tz".to_string(), b"UTC".to_vec())]),
    );
    let p = sim.plan();
    let f = p.failure.as_ref().expect("refused");
    assert_eq!(f.reason, crate::plan::FailureReason::MissingSecret);
    assert!(
        f.message.contains("Secret cfg")
            && f.message.contains("no key s3")
            && f.message.contains("spec.configuration.secretFiles"),
        "{}",
        f.message
    );
    assert!(p.actions.is_empty(), "nothing written: {:?}", p.actions);
    sim.obs
        .inputs
        .secrets
        .get_mut("cfg")
        .unwrap()
        .insert("s3".into(), b"<clickhouse/>".to_vec());
    sim.converge(30);
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// docs/operations.md, "What happens on a bad day": a status lost or wiped (`status: {}`) on a
/// running cluster (scaled out and in before, so its next index is past its replicas'): the map is
/// taken back from the server StatefulSets before anything is built, so the pass writes no
/// `remote_servers` without the cluster's hosts, adds no replica, deletes none; the cluster
/// converges back to ready with the same replicas and one backup replica per shard.
#[test]
fn a_wiped_status_is_rebuilt_from_the_servers_before_anything_is_written() {
    let mut sim =
        Sim::new(serde_json::json!({"shards": 2, "replicas": 2, "keeper": {"replicas": 1}}));
    sim.converge(30);
    sim.cluster.spec.replicas = 3;
    sim.converge(40);
    sim.cluster.spec.replicas = 2;
    sim.converge(60);
    assert_eq!(sim.state(), ClusterState::Ready);
    let replicas: Vec<String> = sim.map().keys().cloned().collect();
    assert_eq!(replicas.len(), 4, "{replicas:?}");
    let remote = users_secret_file(&sim, crate::model::names::REMOTE_SERVERS_FILE);
    sim.cluster.status = Some(Default::default());
    let p = sim.plan();
    for a in &p.actions {
        match a {
            Action::Apply {
                kind: Kind::Secret, ..
            } => {
                sim.act(&Plan {
                    actions: vec![a.clone()],
                    ..p.clone()
                });
                assert_eq!(
                    users_secret_file(&sim, crate::model::names::REMOTE_SERVERS_FILE),
                    remote,
                    "remote_servers rewritten from a lost map"
                );
            }
            Action::Apply {
                kind: Kind::StatefulSet,
                name,
                ..
            } => {
                assert!(replicas.contains(name), "a new replica {name}")
            }
            Action::Delete { .. } | Action::ScaleIn(_) => panic!("{a:?}"),
            _ => {}
        }
    }
    assert_eq!(
        p.status
            .replica_state_map
            .keys()
            .cloned()
            .collect::<Vec<_>>(),
        replicas
    );
    sim.converge(30);
    assert_eq!(sim.state(), ClusterState::Ready);
    assert_eq!(sim.map().keys().cloned().collect::<Vec<_>>(), replicas);
    for shard in 0..2 {
        assert_eq!(
            sim.map()
                .values()
                .filter(|r| r.shard == shard && r.is_backup_pod)
                .count(),
            1
        );
    }
    assert_eq!(
        users_secret_file(&sim, crate::model::names::REMOTE_SERVERS_FILE),
        remote
    );
}

/// Decision 30: a cluster deleted with `reclaimPolicy: Retain` and created again with the same name
/// (new UID, no status, no StatefulSet) finds its data PVCs and the credentials Secret handed to
/// them. The first pass takes the Secret over and the replicas back from the volumes (their names,
/// shards and indexes, also where a scale-out numbered them otherwise than a new cluster would),
/// before anything is built: no replica beside the data, none removed, and the cluster converges to
/// ready on the same replicas.
#[test]
fn a_cluster_created_again_on_retained_volumes_takes_back_its_replicas_and_credentials() {
    let mut sim =
        Sim::new(serde_json::json!({"shards": 2, "replicas": 2, "keeper": {"replicas": 1}}));
    sim.converge(30);
    sim.cluster.spec.replicas = 3;
    sim.converge(40);
    let replicas: Vec<String> = sim.map().keys().cloned().collect();
    // a scale-out numbers replicas otherwise than a new cluster of 3 replicas would
    assert_eq!(
        replicas,
        ["c1-0-0", "c1-0-1", "c1-0-4", "c1-1-2", "c1-1-3", "c1-1-5"]
    );
    // deleted: everything but the volumes of the remaining replicas (the cleaner took the
    // others) and the Keeper's; the Secret outlives the cluster with them
    sim.obs.statefulsets.clear();
    sim.obs.pods.clear();
    sim.obs.objects.clear();
    sim.obs.pvcs.retain(|name, _| {
        name.contains("keeper") || replicas.iter().any(|r| *name == format!("data-{r}-0"))
    });
    sim.cluster.metadata.uid = Some("uid-2".into());
    sim.cluster.status = None;
    sim.obs.operator_secret_orphaned = true;
    let p = sim.plan();
    assert!(
        p.actions.contains(&Action::AdoptOperatorSecret),
        "{:?}",
        p.actions
    );
    assert!(!p.actions.contains(&Action::CreateOperatorSecret));
    assert_eq!(
        p.status
            .replica_state_map
            .keys()
            .cloned()
            .collect::<Vec<_>>(),
        replicas,
        "the replicas of the retained volumes"
    );
    sim.converge(40);
    assert_eq!(sim.state(), ClusterState::Ready);
    assert_eq!(sim.map().keys().cloned().collect::<Vec<_>>(), replicas);
    assert!(!sim.obs.operator_secret_orphaned);
    let created: Vec<&String> = sim
        .log
        .iter()
        .filter(|l| l.starts_with("apply StatefulSet"))
        .collect();
    assert!(!created.is_empty());
}

/// S2-12, the full-crash check: every server pod of a cluster that was ready going down sets
/// the condition `FullCrash` with what is down and puts it first in the message; it clears
/// once a server serves again. A cluster resuming from a pause, its servers not up yet, is no
/// crash.
#[test]
fn every_server_down_after_ready_is_a_full_crash_until_one_serves() {
    use crate::plan::status::FULL_CRASH;
    let crash = |s: &crate::api::ClickHouseClusterStatus| {
        s.conditions
            .iter()
            .find(|c| c.r#type == FULL_CRASH)
            .map(|c| (c.status.clone(), c.message.clone()))
    };
    let mut sim =
        Sim::new(serde_json::json!({"shards": 2, "replicas": 2, "keeper": {"replicas": 1}}));
    sim.converge(30);
    assert_eq!(sim.state(), ClusterState::Ready);
    assert_eq!(
        crash(sim.cluster.status.as_ref().unwrap()).unwrap().0,
        "False"
    );
    let servers: Vec<String> = sim.map().keys().map(|r| format!("{r}-0")).collect();
    for pod in &servers {
        sim.broken.insert(pod.clone());
        sim.obs.pods.remove(pod);
    }
    sim.settle();
    let p = sim.plan();
    let (status, message) = crash(&p.status).unwrap();
    assert_eq!(status, "True");
    assert_eq!(
        message,
        "full crash: every server is down (0/4 Ready), recovering them all at once"
    );
    assert!(
        p.status
            .message
            .as_deref()
            .unwrap()
            .starts_with("full crash"),
        "{:?}",
        p.status.message
    );
    sim.act(&p);
    assert_eq!(
        crash(sim.cluster.status.as_ref().unwrap()).unwrap().0,
        "True",
        "it stays"
    );
    sim.broken.clear();
    for pod in &servers {
        sim.obs.pods.remove(pod);
    }
    sim.settle();
    sim.converge(30);
    assert_eq!(sim.state(), ClusterState::Ready);
    assert_eq!(
        crash(sim.cluster.status.as_ref().unwrap()).unwrap().0,
        "False"
    );
    // paused and resumed: the servers start after Keeper, and that is no crash
    sim.cluster.spec.pause = true;
    sim.converge(30);
    sim.cluster.spec.pause = false;
    for _ in 0..10 {
        let p = sim.plan_caught_up();
        assert_eq!(
            crash(&p.status).unwrap().0,
            "False",
            "{:?}",
            p.status.message
        );
        if p.actions.is_empty() && !p.again {
            break;
        }
        sim.act(&p);
    }
}

/// Decision 44: a grown volume whose driver grows the file system only when it is mounted again
/// (`FileSystemResizePending`) does not hold the rollout back, since only a restart completes
/// it: Smart Update restarts the pod that was started before the condition appeared, once,
/// drained and out of traffic first as for a new template; a pod started after it (it has been
/// mounted since) is not restarted, and a condition that stays asks for no second restart.
#[test]
fn a_volume_waiting_for_its_pod_to_start_again_gets_one_careful_restart() {
    use k8s_openapi::api::core::v1::{
        PersistentVolumeClaimCondition, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
        VolumeResourceRequirements,
    };
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2,
        "storage": {"size": "2Gi"}, "storageScaling": {"enableVolumeScaling": true}}));
    sim.converge(20);
    let replicas: Vec<String> = sim.map().keys().cloned().collect();
    let started: Timestamp = "2026-11-29T00:00:00Z".parse().unwrap();
    for (replica, since) in [
        (&replicas[0], "2026-11-29T01:00:00Z"),
        (&replicas[1], "2026-11-28T23:00:00Z"),
    ] {
        let pod = sim.obs.pods.get_mut(&format!("{replica}-0")).unwrap();
        pod.status.get_or_insert_with(Default::default).start_time = Some(Time(started));
        sim.obs.pvcs.insert(
            model::names::data_pvc(replica),
            PersistentVolumeClaim {
                metadata: kube::api::ObjectMeta {
                    name: Some(model::names::data_pvc(replica)),
                    ..Default::default()
                },
                spec: Some(PersistentVolumeClaimSpec {
                    resources: Some(VolumeResourceRequirements {
                        requests: Some(BTreeMap::from([(
                            "storage".to_string(),
                            Quantity("2Gi".into()),
                        )])),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                status: Some(PersistentVolumeClaimStatus {
                    conditions: Some(vec![PersistentVolumeClaimCondition {
                        type_: "FileSystemResizePending".into(),
                        status: "True".into(),
                        last_transition_time: Some(Time(since.parse().unwrap())),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
            },
        );
    }
    sim.log.clear();
    sim.converge(30);
    let restarts: Vec<&String> = sim
        .log
        .iter()
        .filter(|l| l.starts_with("restart"))
        .collect();
    assert_eq!(restarts.len(), 1, "{:?}", sim.log);
    assert!(
        restarts[0].contains(&format!("{}-0", replicas[0])),
        "{restarts:?}"
    );
    let excluded = sim
        .log
        .iter()
        .position(|l| l.contains("traffic") && l.contains(&replicas[0]));
    let restarted = sim.log.iter().position(|l| l.starts_with("restart"));
    assert!(
        excluded.is_some() && excluded < restarted,
        "out of traffic before its restart: {:?}",
        sim.log
    );
}
